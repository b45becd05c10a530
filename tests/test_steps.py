"""One step definition (docs/steps.md) everywhere: every command prints the same step times
for the same steps, and incomplete steps are flagged with their reason and left out."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest
from tracetool.numbers import round_ns

from ._util import (
    REPO,
    SAMPLES,
    SHARED_TRACES,
    independent_steps,
    kineto_text,
    run,
    write,
    x,
)

MULTI_RANK = {
    "dlrm": SHARED_TRACES / "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/"
                            "dlrm_kineto",
    "bert_ddp": SHARED_TRACES / "gaoteng-git__kineto/tb_plugin/test/data/tracing/"
                                "bert_newAPI_fp16_ddp",
    "trace_filter": SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data/"
                                    "trace_filter",
}
LOCAL = {"gloo": SAMPLES, "netlab_1gbit": REPO / "sample_traces" / "netlab" / "bw_1gbit"}
GLOO_NET = "gpus_per_node=1,inter_node_bw=1Gbit/s"
DF_INDEX = (SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data/"
            "df_index_resolver/df_index_resolver.json.gz")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("steps") / "store"
    jobs = dict(LOCAL)
    if SHARED_TRACES.is_dir():
        jobs.update(MULTI_RANK)
    for job, d in jobs.items():
        res = ingest([d], Options(store=s, job=job, workers=2))
        assert len(res) >= 2 and all(r.status == "ingested" for r in res), res
    return s


def _json(*args: object) -> dict:
    code, out, err = run(*args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("job", [*LOCAL, *MULTI_RANK])
def test_every_command_prints_the_same_step_times(store: Path, job: str) -> None:
    if job in MULTI_RANK and not SHARED_TRACES.is_dir():
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
    con = tracetool.connect(store)
    want = dict(con.execute("SELECT step, dur_ns FROM job_steps WHERE job = ? AND complete",
                            [job]).fetchall())
    assert want and con.execute(  # the ranks' steps are not the job's (the ranks differ)
        "SELECT count(DISTINCT rank) FROM steps WHERE job = ?", [job]).fetchone()[0] >= 2
    net = ["--source-network", GLOO_NET] if job in LOCAL else []
    report = _json("report", store, "--job", job, "--out", store.parent / f"rep_{job}")
    assert {r["step"]: r["dur_ns"] for r in report["job_steps"]} == want
    cp = _json("critical-path", store, "--job", job)
    assert {s["step"]: s["dur_ns"] for s in cp["steps"]} == want
    rp = _json("replay", store, "--job", job, *net)
    assert {s["step"]: s["measured_step_ns"] for s in rp["steps"]} == want
    assert {s["step"]: s["projected_step_ns"] for s in rp["steps"]} == want
    diff = _json("diff", store, store, "--job-a", job, "--job-b", job)
    assert {r["step"]: r["dur_ns"] for r in diff["a"]["job_steps"]} == want
    median = sorted(want.values())[(len(want) - 1) // 2: len(want) // 2 + 1]
    step_time = next(m for m in diff["metrics"] if m["metric"] == "step_time")
    assert step_time["a_ns"] == round_ns(sum(median) / len(median))
    # the replay's measured breakdown is step_breakdown's mean over ranks, and the report's
    # per-rank breakdown is step_breakdown's mean over steps
    bd = {r[0]: r[1:] for r in con.execute(
        """SELECT step, round(avg(compute_ns)), round(avg(exposed_comm_ns)),
                  round(avg(idle_ns)), round(avg(dur_ns))
           FROM step_breakdown WHERE job = ? AND complete GROUP BY step""", [job]).fetchall()}
    for s in rp["steps"]:
        m = s["measured_breakdown_ns"]
        assert (m["compute"], m["exposed_comm"], m["idle"], m["dur_ns"]) == bd[s["step"]]
    per_rank = {r[0]: r[1] for r in con.execute(
        """SELECT rank, round(avg(dur_ns)) FROM step_breakdown WHERE job = ? AND complete
           GROUP BY rank""", [job]).fetchall()}
    assert {r["rank"]: r["dur_ns"] for r in report["breakdown"]} == per_rank


def _cut_trace(src: Path, dst: Path) -> int:
    """A copy of ``src`` whose GPU events stop halfway through its last step's GPU work (as
    when the profiler's window closes mid-step); returns the last step's number."""
    doc = json.loads(gzip.open(src).read())
    evs = doc["traceEvents"]
    steps = [(int(m.group(1)), e) for e in evs
             if e.get("ph") == "X" and e.get("cat") == "user_annotation"
             and (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))]
    last, ann = max(steps, key=lambda s: s[0])
    cut = ann["ts"] + ann["dur"] / 4
    doc["traceEvents"] = [e for e in evs if not (
        e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ts", 0) > cut)]
    dst.write_text(json.dumps(doc))
    return last


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="real trace corpus not found")
def test_a_step_cut_by_the_trace_window_is_flagged_and_left_out(tmp_path: Path) -> None:
    trace = tmp_path / "cut.json"
    last = _cut_trace(DF_INDEX, trace)
    s = tmp_path / "store"
    assert ingest([trace], Options(store=s, job="cut", rank=0))[0].status == "ingested"
    con = tracetool.connect(s)
    rows = con.execute("SELECT step, n_gpu_ops, complete, incomplete_reason FROM steps "
                       "ORDER BY step").fetchall()
    assert [r[0] for r in rows][-1] == last
    full = {r[1] for r in rows[:-1]}
    assert len(full) == 1 and rows[-1][1] < 0.5 * full.pop()
    assert [(r[2], r[3]) for r in rows] == [(True, None)] * (len(rows) - 1) + [(False, "cut")]
    assert con.execute("SELECT complete, incomplete_reason FROM job_steps WHERE step = ?",
                       [last]).fetchone() == (False, "cut")
    report = _json("report", s, "--out", tmp_path / "rep")
    assert [r["step"] for r in report["incomplete_steps"]] == [last]
    assert last not in [r["step"] for r in report["job_steps"]]
    assert report["steps"][0]["n_steps"] == len(rows) - 1
    code, text, _ = run("report", s, "--out", tmp_path / "rep")
    assert f"Left out: step {last} (cut," in text
    assert last not in [x["step"] for x in _json("critical-path", s)["steps"]]
    assert last in [x["step"] for x in _json("critical-path", s, "--include-incomplete")
                    ["steps"]]
    assert last not in [x["step"] for x in _json("replay", s)["steps"]]
    steps = _json("replay", s, "--include-incomplete")["steps"]
    assert [(x["step"], x["complete"]) for x in steps][-1] == (last, False)
    report = _json("report", s, "--out", tmp_path / "rep", "--include-incomplete")
    assert report["steps"][0]["n_steps"] == len(rows) and not report["incomplete_steps"]


def test_a_step_missing_on_a_rank_is_flagged(tmp_path: Path) -> None:
    """Rank 1's trace of the gloo sample without its first ProfilerStep: that job step is
    incomplete (not_on_all_ranks) on both ranks, the others are not."""
    d = tmp_path / "job"
    d.mkdir()
    for src in sorted(SAMPLES.glob("*.json.gz")):
        doc = json.loads(gzip.open(src).read())
        if doc["distributedInfo"]["rank"] == 1:
            doc["traceEvents"] = [e for e in doc["traceEvents"]
                                  if e.get("name") != "ProfilerStep#2"]
        (d / src.name.removesuffix(".gz")).write_text(json.dumps(doc))
    s = tmp_path / "store"
    assert all(r.status == "ingested" for r in ingest([d], Options(store=s, job="j")))
    con = tracetool.connect(s)
    assert con.execute("SELECT step, n_ranks, complete, incomplete_reason FROM job_steps "
                       "ORDER BY step").fetchall() == [
        (2, 1, False, "not_on_all_ranks"), (3, 2, True, None), (4, 2, True, None)]
    assert con.execute("SELECT rank, step FROM steps WHERE NOT complete").fetchall() == [
        (0, 2)]


# A GPU that lags its CPU: rank steps are taken on the GPU side, the first step's included
# (docs/steps.md, "The first step too"). In us: per step its CPU annotation and the
# (launch, kernel start, kernel end) of the GPU ops it launched.
LAGGING = {1: ((0, 100), [(10, 210, 300), (50, 300, 380)]),
           2: ((100, 200), [(110, 380, 450), (150, 450, 540)]),
           3: ((200, 300), [(210, 540, 600), (250, 600, 700)])}
# the tiles, from the rules: each step from its first GPU op to the next step's, the last to
# its latest event; the old first tile (CPU start 0 to 380) mixed the CPU's and GPU's clocks
LAGGING_TILES = {1: (210, 380), 2: (380, 540), 3: (540, 700)}


def _lagging_trace(path: Path) -> Path:
    events, corr = [], 0
    for n, ((cs, ce), ops) in LAGGING.items():
        events.append(x(f"ProfilerStep#{n}", cs, ce - cs, cat="user_annotation"))
        for launch, ks, ke in ops:
            corr += 1
            events += [x("cudaLaunchKernel", launch, 5, cat="cuda_runtime", correlation=corr),
                       x("volta_sgemm_128x64_nn", ks, ke - ks, cat="kernel", pid=0, tid=7,
                         device=0, stream=7, correlation=corr)]
    return write(path, kineto_text(events, rank=0))


def test_the_first_step_starts_on_the_same_side_as_the_others(tmp_path: Path) -> None:
    s = tmp_path / "store"
    trace = _lagging_trace(tmp_path / "rank0.json")
    assert ingest([trace], Options(store=s, job="lag"))[0].status == "ingested"
    con = tracetool.connect(s)
    t0 = con.execute("SELECT min(ts_ns) FROM events").fetchone()[0]  # the trace's 0 us
    got = con.execute("SELECT step, side, start_ns - ?, end_ns - ?, complete FROM steps "
                      "ORDER BY step", [t0, t0]).fetchall()
    assert got == [(n, "gpu", a * 1000, b * 1000, True) for n, (a, b) in LAGGING_TILES.items()]
    want = {n: (b - a) * 1000 for n, (a, b) in LAGGING_TILES.items()}
    assert dict(con.execute("SELECT step, dur_ns FROM job_steps WHERE complete").fetchall()) \
        == want
    # every command measures those steps
    assert {r["step"]: r["dur_ns"] for r in _json("report", s, "--out", tmp_path / "r")
            ["job_steps"]} == want
    assert {r["step"]: r["dur_ns"] for r in _json("critical-path", s)["steps"]} == want
    rp = _json("replay", s)["steps"]
    assert {r["step"]: (r["measured_step_ns"], r["projected_step_ns"]) for r in rp} == {
        n: (d, d) for n, d in want.items()}


GPU_CATS = ("Kernel", "Memcpy", "Memset")  # the 2020 traces' GPU op categories
DELAY_US = 500_000


def _raw_tiles(doc: list[dict]) -> dict[int, tuple[int, int]]:
    """One rank's tiles (ns) from its raw JSON and docs/steps.md's rules (tests/_util.py's
    independent_steps): a GPU op is in the step its launch (Runtime call, by correlation)
    started in. The 2020 traces have no GPU-side ProfilerStep annotations."""
    steps = {int(e["name"].split("#")[1]): (e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000)
             for e in doc if e.get("ph") == "X" and e.get("cat") == "Operator"
             and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))}
    launch = {e["args"]["correlation"]: e["ts"] * 1000 for e in doc
              if e.get("ph") == "X" and e.get("cat") == "Runtime"
              and "correlation" in e.get("args", {})}
    gpu = [(e["ts"] * 1000, (e["ts"] + e["dur"]) * 1000, None, e["args"]["correlation"],
            e["pid"]) for e in doc if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    launched = {n: [g for g in gpu if cs <= launch.get(g[3], g[0]) < ce]
                for n, (cs, ce) in steps.items()}
    return independent_steps(steps, launched, {}, gpu)


@pytest.fixture(scope="module")
def delayed_gpu(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The corpus's 2020 BERT DDP pair with rank 0's GPU 0.5 s behind its CPU (its GPU ops
    and their flow ends moved later), as on the issue's 2020 ResNet DDP job: rank 0's steps
    are taken on the GPU side, rank 1's on the CPU side. Returns the store and, per rank, its
    tiles from the raw JSON."""
    src = MULTI_RANK["bert_ddp"]
    if not src.is_dir():
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
    d = tmp_path_factory.mktemp("delayed") / "bert"
    d.mkdir()
    tiles = {}
    for rank in (0, 1):
        doc = json.loads(gzip.open(src / f"worker{rank}_round1.pt.trace.json.gz").read())
        # the CPU ops but the ProfilerSteps play no part in the steps: left out (half the
        # events, half the ingest)
        doc = [e for e in doc if e.get("cat") != "Operator" or e["name"].startswith("Prof")]
        if rank == 0:
            for e in doc:
                if e.get("cat") in GPU_CATS or (e.get("ph") == "f" and e.get("pid") == 0):
                    e["ts"] += DELAY_US
        tiles[rank] = _raw_tiles(doc)
        (d / f"worker{rank}_round1.pt.trace.json").write_text(json.dumps(doc))
    s = d.parent / "store"
    assert all(r.status == "ingested" for r in ingest([d], Options(store=s, job="j",
                                                                    workers=2)))
    return s, tiles


def test_a_lagging_gpu_first_step_is_on_its_own_clock(delayed_gpu) -> None:  # noqa: ANN001
    s, tiles = delayed_gpu
    con = tracetool.connect(s)
    for rank, want in tiles.items():
        got = con.execute("SELECT step, side, start_ns, end_ns FROM steps WHERE rank = ? "
                          "ORDER BY step", [rank]).fetchall()
        assert [(n, a, b) for n, _, a, b in got] == [(n, a, b) for n, (a, b) in want.items()]
        assert {side for _, side, _, _ in got} == {"gpu" if rank == 0 else "cpu"}
    # rank 0's first step starts at its first GPU op, 0.5 s and more after its CPU start
    # (before the fix: at its CPU start, so that step held the GPU's lag and the others not)
    cpu_start = con.execute("SELECT cpu_start_ns FROM steps WHERE rank = 0 ORDER BY step "
                            "LIMIT 1").fetchone()[0]
    first = min(tiles[0])
    assert tiles[0][first][0] - cpu_start > DELAY_US * 1000
    # the job steps: the earliest rank's start, then the latest rank's boundaries
    steps = sorted(tiles[0])
    starts = [min(tiles[r][steps[0]][0] for r in tiles)] + [
        max(tiles[r][n][0] for r in tiles) for n in steps[1:]]
    ends = starts[1:] + [max(tiles[r][steps[-1]][1] for r in tiles)]
    assert con.execute("SELECT step, start_ns, end_ns FROM job_steps ORDER BY step"
                       ).fetchall() == list(zip(steps, starts, ends, strict=True))


# ---------------------------------------------------------------------- clocks days apart

def _step_start_ns(path: Path, step: int) -> int:
    """ProfilerStep#step's CPU start in a generated trace, from the raw JSON (us since
    baseTimeNanoseconds)."""
    doc = json.loads(path.read_text(), parse_float=Decimal)
    (ts,) = [e["ts"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
             and e.get("name") == f"ProfilerStep#{step}"]
    return int(doc["baseTimeNanoseconds"]) + int(ts * 1000)


@pytest.fixture(scope="module")
def days_apart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    """Four generated ranks with different seeds (issue 32, item 7): each its own wall clock,
    days from the others'. Returns the store and each rank's ProfilerStep#2 start."""
    d = tmp_path_factory.mktemp("days") / "tr"
    d.mkdir()
    starts = {}
    for r in range(4):
        out = d / f"rank{r}.json"
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_trace.py"), "--size",
                        "300KB", "--steps", "6", "--rank", str(r), "--world-size", "4",
                        "--seed", str(r), "--out", str(out)], check=True,
                       capture_output=True, timeout=120)
        starts[r] = _step_start_ns(out, 2)
    s = d.parent / "store"
    assert all(x.status == "ingested" for x in ingest([d], Options(store=s, job="tr",
                                                                    workers=2)))
    return s, starts


def _days(ns: int) -> str:
    return f"{ns / 86_400e9:,.1f} days"


def test_clocks_days_apart_flag_the_job_with_one_warning(days_apart, tmp_path: Path) -> None:  # noqa: ANN001
    s, starts = days_apart
    con = tracetool.connect(s)
    # every job step incomplete, with the reason; each rank's own steps stand
    assert con.execute("SELECT step, complete, incomplete_reason FROM job_steps ORDER BY step"
                       ).fetchall() == [(n, False, "clocks_disagree") for n in range(2, 8)]
    assert con.execute("SELECT count(*), bool_and(complete) FROM steps").fetchone() == (24,
                                                                                       True)
    spread = con.execute("SELECT max(start_ns) - min(start_ns) FROM steps WHERE step = 2"
                         ).fetchone()[0]
    assert spread == max(starts.values()) - min(starts.values())  # the raw JSON's
    offsets = ", ".join(f"rank {r} {_days(abs(starts[r] - starts[0]))} "
                        f"{'ahead' if starts[r] > starts[0] else 'behind'}" for r in (1, 2, 3))
    step_ms = con.execute("SELECT median(mean_rank_dur_ns) / 1e6 FROM job_steps").fetchone()[0]
    warning = (f"tracetool: warning: the ranks' clocks disagree by more than a step: they "
               f"started the same step up to {_days(spread)} apart (a step is {step_ms:.1f} "
               f"ms); by the collectives' end times (rank_clock_offsets), against rank 0: "
               f"{offsets}; the 6 job steps are left out as incomplete (clocks_disagree, "
               f"docs/steps.md); each rank's own steps stand\n")
    code, out, err = run("report", s, "--out", tmp_path / "r")
    assert code == 0 and err == warning
    # one line for the six steps left out, not one each
    assert [ln for ln in out.splitlines() if ln.startswith("Left out")] == [
        "Left out: 6 incomplete job steps, steps 2-7 (clocks_disagree); include them with "
        "--include-incomplete."]
    error = (f"tracetool: error: {s}: job tr has no complete step: 6 left out as incomplete "
             "(6 clocks_disagree; docs/steps.md); --include-incomplete takes them\n")
    for args in (["critical-path", s], ["replay", s],
                 ["sweep", s, "--network", "inter_node_bw=1,10Gbit/s", "--out",
                  tmp_path / "sw"]):
        code, out, err = run(*args)
        assert (code, out) == (1, ""), args
        assert err.count("tracetool: warning: ") <= 1 and err.endswith(error), (args, err)
    assert not (tmp_path / "sw").exists()
    # asked for anyway: the identity's band is the measured step, never below zero (no
    # complete step, so no step-to-step variation either; the variation of these six
    # "steps" made it [-198.8, 473.2] ms for a 137.2 ms step on the 15 MB ranks)
    steps = _json("replay", s, "--include-incomplete")["steps"]
    assert len(steps) == 6
    assert all(0 < x["low_ns"] == x["measured_step_ns"] == x["high_ns"] for x in steps)


def test_diff_help_defines_step_time_as_docs_steps_does() -> None:
    """One definition of diff's step_time: the help and docs/steps.md both say what
    analysis/diff.py computes (the help once said "CPU start to the end of its GPU work")."""
    from tracetool.analysis.diff import METRICS

    code, out, _ = run("diff", "--help")
    assert code == 0
    flat = " ".join(out.split())
    for metric, text in METRICS.items():
        assert f"{metric}: {text}." in flat
    docs = " ".join((REPO / "docs" / "steps.md").read_text().split())
    assert f"`tracetool diff`'s `step_time` is the {METRICS['step_time']}" in docs
