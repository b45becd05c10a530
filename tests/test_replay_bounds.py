"""Bounded replay (``--steps A:B``, ``--ranks``) on real traces, through the real CLI.

A bounded replay reads only part of the stored graph, so it must still give the measured
times of what it replays: the steps of a range exactly as the per-step replays and the
analysis views give them (``job_steps``, ``step_breakdown``), a subset of ranks exactly as
those ranks' own steps; collectives waiting on ranks outside keep their measured wait (and
say so). Bad bounds are usage errors: one line, exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay.graph import Bounds
from tracetool.replay.run import Replayer

from ._util import SAMPLES, SHARED_TRACES, run
from .test_critical_path import MULTI_RANK

JOBS = {"gloo": SAMPLES, "bert_ddp": MULTI_RANK["bert_ddp"], "dlrm": MULTI_RANK["dlrm"]}
GLOO_NET = "gpus_per_node=1,inter_node_bw=1Gbit/s"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-rank gloo sample always; the BERT DDP pair and the 8-rank DLRM job from the
    shared corpus when present."""
    path = tmp_path_factory.mktemp("bounds") / "store"
    for job, d in JOBS.items():
        if d.is_dir():
            res = ingest([d], Options(store=path, job=job))
            assert all(r.status == "ingested" for r in res), res
    return path


@pytest.fixture(scope="module")
def con(store: Path) -> duckdb.DuckDBPyConnection:
    return tracetool.connect(store)


def _need(job: str) -> None:
    if not JOBS[job].is_dir():
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")


def _replay(store: Path, job: str, *args: str) -> dict:
    code, out, err = run("replay", store, "--job", job, "--json", *args)
    assert code == 0, err
    return json.loads(out)


def _by_step(doc: dict, key: str) -> dict:
    return {s["step"]: s[key] for s in doc["steps"]}


def _breakdown(con: duckdb.DuckDBPyConnection, job: str, ranks: list[int] | None = None
               ) -> dict[int, tuple]:
    """step_breakdown's mean over ``ranks`` (all by default), per step: what the replay's
    measured breakdown must be."""
    where = "" if ranks is None else f" AND rank IN ({', '.join(map(str, ranks))})"
    return {r[0]: r[1:] for r in con.execute(
        f"""SELECT step, round(avg(compute_ns)), round(avg(exposed_comm_ns)),
                   round(avg(exposed_memcpy_ns)), round(avg(idle_ns)), round(avg(dur_ns))
            FROM step_breakdown WHERE job = ? AND complete{where} GROUP BY step""",
        [job]).fetchall()}


def _parts(s: dict) -> tuple:
    m = s["measured_breakdown_ns"]
    return m["compute"], m["exposed_comm"], m["exposed_memcpy"], m["idle"], m["dur_ns"]


@pytest.mark.parametrize("job", ["gloo", "bert_ddp"])
def test_a_step_range_is_the_per_step_replays_combined(store: Path,
                                                       con: duckdb.DuckDBPyConnection,
                                                       job: str) -> None:
    _need(job)
    steps = [s for (s,) in con.execute(
        "SELECT step FROM job_steps WHERE job = ? AND complete ORDER BY step", [job]).fetchall()]
    want = dict(con.execute("SELECT step, dur_ns FROM job_steps WHERE job = ? AND complete",
                            [job]).fetchall())
    bd = _breakdown(con, job)
    ranged = _replay(store, job, "--steps", f"{steps[0]}:{steps[-1]}")
    assert ranged["bounds"]["steps"] == [steps[0], steps[-1]]
    single = {}
    for n in steps:
        doc = _replay(store, job, "--steps", f"{n}:{n}")
        assert [s["step"] for s in doc["steps"]] == [n]
        single[n] = doc["steps"][0]
    for doc_steps in (ranged["steps"], list(single.values())):
        got = {s["step"]: s for s in doc_steps}
        assert {n: s["measured_step_ns"] for n, s in got.items()} == want
        assert {n: s["projected_step_ns"] for n, s in got.items()} == want  # identity: exact
        assert {n: _parts(s) for n, s in got.items()} == bd
        for s in doc_steps:  # the projected critical path covers the step
            assert sum(s["critical_path_ns"].values()) == s["measured_step_ns"]
    # the inner steps of a range alone: the same
    if len(steps) > 2:
        inner = _replay(store, job, "--steps", f"{steps[1]}:{steps[-2]}")
        assert _by_step(inner, "measured_step_ns") == {n: want[n] for n in steps[1:-1]}


def test_a_step_range_reads_a_smaller_graph(con: duckdb.DuckDBPyConnection) -> None:
    whole = Replayer.from_store(con, "gloo").graph
    one = Replayer.from_store(con, "gloo", Bounds(steps=(3, 3))).graph
    assert one.n_nodes < 0.6 * whole.n_nodes and one.n_edges < 0.6 * whole.n_edges
    assert one.frontier > 0  # the points just before step 3 it waited on, kept fixed
    assert one.step_reported.tolist() == [s == 3 for s in one.steps.tolist()]
    half = Replayer.from_store(con, "gloo", Bounds(ranks=(1,))).graph
    assert half.replayed_ranks.tolist() == [1] and half.ranks.tolist() == [0, 1]
    assert half.n_event_slots < 0.6 * whole.n_event_slots


@pytest.mark.parametrize("job,ranks", [("gloo", [1]), ("bert_ddp", [0]), ("dlrm", [0, 2, 3])])
def test_a_rank_subset_reproduces_those_ranks(store: Path, con: duckdb.DuckDBPyConnection,
                                              job: str, ranks: list[int]) -> None:
    _need(job)
    spec = ",".join(map(str, ranks))
    doc = _replay(store, job, "--ranks", spec if job != "dlrm" else "0,2-3")
    # the measured job step over those ranks: the steps view's tiles of those ranks, from
    # the earliest rank's start (the first step) or the latest rank's start, to the next
    rows = con.execute(
        f"""SELECT step, min(start_ns), max(start_ns), max(end_ns) FROM steps
            WHERE job = ? AND rank IN ({spec}) AND complete GROUP BY step ORDER BY step""",
        [job]).fetchall()
    starts = [lo if i == 0 else hi for i, (_, lo, hi, _) in enumerate(rows)]
    ends = starts[1:] + [rows[-1][3]]
    want = {r[0]: e - s for r, s, e in zip(rows, starts, ends, strict=True)}
    assert _by_step(doc, "measured_step_ns") == want
    assert _by_step(doc, "projected_step_ns") == want
    assert {s["step"]: _parts(s) for s in doc["steps"]} == _breakdown(con, job, ranks)
    b = doc["bounds"]
    assert b["replayed_ranks"] == ranks and b["ranks"] == ranks
    assert b["partial_collectives"] > 0  # every collective here spans the whole job
    assert any("kept as a fixed delay" in n for n in doc["notes"])
    assert any(f"of {len(b['job_ranks'])}" in n for n in doc["notes"])
    if len(ranks) == 1:  # one rank: its own steps, as the steps view has them
        own = dict(con.execute("SELECT step, dur_ns FROM steps WHERE job = ? AND rank = ? "
                               "AND complete", [job, ranks[0]]).fetchall())
        assert want == own


def test_ranks_and_steps_together(store: Path, con: duckdb.DuckDBPyConnection) -> None:
    doc = _replay(store, "gloo", "--ranks", "0", "--steps", "3:4")
    own = dict(con.execute("SELECT step, dur_ns FROM steps WHERE job = 'gloo' AND rank = 0 "
                           "AND step BETWEEN 3 AND 4").fetchall())
    assert _by_step(doc, "measured_step_ns") == own == _by_step(doc, "projected_step_ns")
    # a slower network slows the replayed rank's steps, the measured ones stay
    slow = _replay(store, "gloo", "--ranks", "0", "--steps", "3:4", "--source-network",
                   GLOO_NET, "--network", "inter_node_bw=250Mbit/s")
    assert _by_step(slow, "measured_step_ns") == own
    assert all(s["projected_step_ns"] > s["measured_step_ns"] for s in slow["steps"])


def test_replica_is_one_rank_of_a_data_parallel_job(store: Path) -> None:
    doc = _replay(store, "gloo", "--ranks", "replica")
    assert doc["bounds"]["replayed_ranks"] == [0]
    if JOBS["dlrm"].is_dir():  # embeddings exchanged by all-to-all: no replica to tell
        code, _, err = run("replay", store, "--job", "dlrm", "--ranks", "replica")
        assert code == 2 and "cannot tell job dlrm's data-parallel replica" in err
        assert err.count("\n") == 1


def test_sweep_reads_the_bounds(store: Path, tmp_path: Path) -> None:
    code, out, err = run("sweep", store, "--job", "gloo", "--source-network", GLOO_NET,
                         "--network", "inter_node_bw=0.5,1Gbit/s", "--steps", "3:4",
                         "--ranks", "1", "--out", tmp_path, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bounds"]["steps"] == [3, 4] and doc["bounds"]["replayed_ranks"] == [1]
    assert all(r["steps"] == 2 for r in doc["rows"])
    assert doc["rows"][1]["projected_step_ns"] == doc["rows"][1]["measured_step_ns"]
    assert doc["rows"][0]["projected_step_ns"] > doc["rows"][0]["measured_step_ns"]


@pytest.mark.parametrize("command", ["replay", "sweep"])
@pytest.mark.parametrize("args,message", [
    (["--steps", "5:2"], "bad --steps '5:2': the first step 5 is after the last 2"),
    (["--steps", "3-4"], "bad --steps '3-4'"),
    (["--steps", "50:60"], "job gloo has no ProfilerStep in steps 50:60 (steps 2-4)"),
    (["--ranks", "7"], "--ranks: job gloo has no rank 7 (ranks: 0-1)"),
    (["--ranks", "0,x"], "bad --ranks '0,x'"),
    (["--ranks", "3-1"], "range '3-1' is empty"),
])
def test_bad_bounds_are_usage_errors(store: Path, tmp_path: Path, command: str,
                                     args: list[str], message: str) -> None:
    extra = ["--dp-scale", "1,2", "--out", str(tmp_path)] if command == "sweep" else []
    code, _, err = run(command, store, "--job", "gloo", *args, *extra)
    assert code == 2, err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_subprocess(store: Path) -> None:
    """The real process: a bounded replay, and a bad bound's exit code and one line."""
    base = [sys.executable, "-m", "tracetool", "replay", str(store), "--job", "gloo"]
    p = subprocess.run([*base, "--steps", "2:3", "--ranks", "0-1", "--json"],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [s["step"] for s in doc["steps"]] == [2, 3]
    assert all(s["projected_step_ns"] == s["measured_step_ns"] for s in doc["steps"])
    assert doc["bounds"]["partial_collectives"] == 0  # both ranks: nothing outside
    p = subprocess.run([*base, "--steps", "4:3"], capture_output=True, text=True, check=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("tracetool: error: bad --steps")
