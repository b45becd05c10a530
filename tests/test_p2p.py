"""Point-to-point calls in the replay (docs/collectives.md): collective_ranks matches a
group's send/recv calls by position on every rank of the group, so a send/recv instance of a
group wider than two ranks is a group-wide barrier, not a sender-receiver pair. The identity
replay stays exact; a network what-if on such a job is refused in one line, never priced
wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracetool
from tests._util import REPO, run, write
from tests.test_pipeline import ORDERS, lay_out, write_job

PP = REPO / "sample_traces" / "netlab" / "pp1f1b4_1gbit"
SRC = "gpus_per_node=1,inter_node_bw=1Gbit/s,inter_node_latency=50us"
REFUSAL = ("tracetool: error: network what-if: job {job} has {n} point-to-point calls "
           "(send/recv) that the replay matches as group-wide collectives, not "
           "sender-receiver pairs, so it would price their transfers wrong; it does not "
           "project them onto another network yet (docs/collectives.md)\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic 4-stage 1F1B job of tests/test_pipeline.py, and a 2-rank job whose
    only communication is one send/recv pair per step (a pair: nothing to refuse)."""
    root = tmp_path_factory.mktemp("p2p")
    st = root / "store"
    events, _ = lay_out(ORDERS["1f1b"])
    code, _, err = run("ingest", write_job(root / "f1b", events), "--store", st,
                       "--job", "f1b")
    assert code == 0, err
    pair = root / "pair"
    pair.mkdir()
    for rank in (0, 1):
        evs = []
        for step in (1, 2):
            t0 = step * 10_000
            evs += [_x(f"ProfilerStep#{step}", t0, 10_000, rank, cat="user_annotation"),
                    _x("aten::mm", t0, 2_000, rank)]
            ci = ["", "", str(1 - rank), "0"]
            name = "send" if rank == 0 else "recv_"
            evs += [_x(f"c10d::{name}", t0 + 2_000, 10, rank,
                       **{"Concrete Inputs": ci, "Input Dims": [[[64, 1024]], [], [], []],
                          "Input type": ["TensorList", "", "Scalar", "Scalar"]}),
                    _x(f"gloo:{'send' if rank == 0 else 'recv'}", t0 + 2_005, 3_000, rank,
                       cat="user_annotation", **{"Input Dims": [[64, 1024]],
                                                 "Input type": ["float"]})]
        head = {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {
            "backend": "gloo", "rank": rank, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2,
                           "ranks": [0, 1]}]},
            "traceEvents": sorted(evs, key=lambda e: (e["ts"], -e["dur"]))}
        write(pair / f"rank{rank}.json", json.dumps(head))
    code, _, err = run("ingest", pair, "--store", st, "--job", "pair")
    assert code == 0, err
    return st


def _x(name: str, ts: float, dur: float, rank: int, *, cat: str = "cpu_op",
       **args: object) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": 1, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _p2p_instances(st: Path, job: str) -> int:
    (n,) = tracetool.connect(st).execute(
        "SELECT count(DISTINCT instance) FROM collective_ranks WHERE job = ? "
        "AND kind IN ('send', 'recv') AND instance IS NOT NULL", [job]).fetchone()
    return n


def test_network_whatif_refused_on_group_wide_p2p(store: Path) -> None:
    """The 1F1B job: 4 ranks, 12 sends and 12 receives per step on each of 2 steps; every
    send/recv instance spans the 4 ranks of the default group."""
    n = _p2p_instances(store, "f1b")
    assert n > 0
    rows = tracetool.connect(store).execute(
        "SELECT DISTINCT count(*) OVER (PARTITION BY instance) FROM collective_ranks "
        "WHERE job = 'f1b' AND kind IN ('send', 'recv') AND instance IS NOT NULL").fetchall()
    assert rows == [(4,)]  # a barrier of the group, not a pair: why it is refused
    code, out, err = run("replay", store, "--job", "f1b", "--source-network", SRC,
                         "--network", "inter_node_bw=10Gbit/s")
    assert (code, out, err) == (2, "", REFUSAL.format(job="f1b", n=n))


def test_identity_replay_still_runs(store: Path) -> None:
    code, out, err = run("replay", store, "--job", "f1b", "--json")
    assert code == 0, err
    steps = json.loads(out)["steps"]
    assert steps and all(s["projected_step_ns"] == s["measured_step_ns"]
                         and s["projected_breakdown_ns"] == s["measured_breakdown_ns"]
                         for s in steps)


def test_a_pair_is_not_refused(store: Path) -> None:
    """A send/recv of a 2-rank group is its pair: the network what-if runs."""
    assert _p2p_instances(store, "pair") == 2
    code, _, err = run("replay", store, "--job", "pair", "--source-network", SRC,
                       "--network", "inter_node_bw=10Gbit/s")
    assert code == 0, err


@pytest.mark.skipif(not PP.is_dir(), reason="the rig's pipeline traces "
                    "(sample_traces/netlab/pp1f1b4_1gbit) are not in this checkout yet")
def test_rig_pipeline_refused(tmp_path: Path) -> None:
    """The rig's 4-stage 1F1B gloo job: its 46 send/recv instances (4 ranks each)."""
    code, _, err = run("ingest", PP, "--store", tmp_path / "s", "--job", "pp")
    assert code == 0, err
    code, out, err = run("replay", tmp_path / "s", "--job", "pp", "--source-network", SRC,
                         "--network", "inter_node_bw=10Gbit/s")
    assert (code, err) == (2, REFUSAL.format(job="pp", n=46))
