"""``tracetool report`` and ``tracetool diff`` on real stores, through the real CLI.

The report is rendered from the bundled 2-rank gloo sample; the diff runs on HTA's trace_diff
pair (an A100 rank of an 8-rank job as the control, a V100 rank of a 2-rank job as the test),
whose per-name totals and step medians are checked against a computation from the raw JSON.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
import subprocess
import sys
import types
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import duckdb
import numpy as np
import pytest
from matplotlib import image as mpimg

from ._util import SAMPLES, SHARED_TRACES, independent_steps, run

TRACE_DIFF = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data/trace_diff"
CONTROL = TRACE_DIFF / "control" / "control.json.gz"
TEST = TRACE_DIFF / "test" / "test.json.gz"
CP_MODULE = "tracetool.analysis.critical_path"

needs_traces = pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                                  reason=f"real trace corpus not found at {SHARED_TRACES}")


def tracetool(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracetool", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("sample") / "store"
    code, _, err = run("ingest", SAMPLES, "--store", store, "--workers", "2")
    assert code == 0, err
    return store


@pytest.fixture(scope="module")
def hta_stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """control and test, each in its own store (jobs 'control' and 'test')."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
    base = tmp_path_factory.mktemp("trace_diff")
    for name, path in (("a", CONTROL), ("b", TEST)):
        code, _, err = run("ingest", path, "--store", base / name, "--workers", "2")
        assert code == 0, err
    return base / "a", base / "b"


# ------------------------------------------------------------------------------------ report

def assert_png(path: Path) -> None:
    """A real chart: more than 5 KB, a sane size, and not a blank canvas."""
    assert path.stat().st_size > 5_000, path
    img = mpimg.imread(path)
    h, w = img.shape[:2]
    assert 200 <= h <= 4000 and 300 <= w <= 4000, (path, img.shape)
    assert float(np.std(img[..., :3])) > 0.01, f"{path} is blank"


def raw_step_medians(path: Path) -> tuple[int, float]:
    """rank and median step duration of a CPU-only trace, from the raw JSON: its steps tile
    the timeline from one ProfilerStep start to the next, the last one to its end."""
    doc = json.loads(gzip.open(path).read(), parse_float=Decimal)
    steps = {int(e["name"].split("#")[1]): (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
             for e in doc["traceEvents"]
             if e.get("ph") == "X" and re.fullmatch(r"ProfilerStep#\d+", e.get("name", ""))}
    windows = independent_steps(steps, {n: [] for n in steps}, {}, [])
    return doc["distributedInfo"]["rank"], statistics.median(b - a for a, b in windows.values())


def test_report_on_the_sample_store(sample_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    code, stdout, stderr = run("report", sample_store, "--out", out, "--json")
    assert code == 0, stderr
    s = json.loads(stdout)
    assert (s["job"], s["ranks"], s["backend"], s["world_size"]) == (
        "ddp_gloo_2rank", [0, 1], "gloo", 2)
    # step statistics agree with the raw traces
    want = dict(raw_step_medians(p) for p in sorted(SAMPLES.glob("*.json.gz")))
    assert {r["rank"]: r["n_steps"] for r in s["steps"]} == {0: 3, 1: 3}
    for r in s["steps"]:
        assert abs(r["median_ns"] - want[r["rank"]]) <= 1
    # the stacked parts of the breakdown add up to the mean step
    for r in s["breakdown"]:
        parts = r["compute_ns"] + r["exposed_comm_ns"] + r["exposed_memcpy_ns"] + r["idle_ns"]
        assert abs(parts - r["dur_ns"]) <= 4 and min(r["compute_ns"], r["comm_ns"]) > 0
    # a CPU-only job: the top list is CPU ops (the matmuls lead: 15 aten::mm per rank)
    assert s["top"]["what"] == "cpu_ops"
    assert (s["top"]["rows"][0]["name"], s["top"]["rows"][0]["count"]) == ("aten::mm", 30)
    c = s["collectives"]
    assert c["instances"] == 9 and [t["collective"] for t in c["by_type"]] == ["allreduce"]
    assert [r["calls"] for r in c["by_rank"]] == [9, 9]

    files = {k: Path(v) for k, v in s["files"].items()}
    assert {"breakdown", "top", "collective_skew", "markdown", "html"} <= set(files)
    pngs = sorted(out.glob("*.png"))
    assert sorted(v for v in files.values() if v.suffix == ".png") == pngs
    for p in pngs:
        assert_png(p)
    md = (out / "report.md").read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    for p in pngs:
        assert f"]({p.name})" in md and f'src="{p.name}"' in page
    assert page.startswith("<!DOCTYPE html>") and "aten::mm" in page
    if s["critical_path"]["available"]:
        assert "critical_path" in files
    else:
        assert "Critical path chart unavailable" in md


def test_report_without_critical_path_module(sample_store: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The critical path module missing: the report still renders and says why."""
    monkeypatch.setitem(sys.modules, CP_MODULE, None)  # makes the import fail
    code, stdout, stderr = run("report", sample_store, "--out", tmp_path)
    assert code == 0, stderr
    assert "Critical path chart unavailable: tracetool.analysis.critical_path is not " \
           "available" in stdout
    assert not (tmp_path / "critical_path.png").exists()
    for page in ("report.md", "report.html"):
        assert "Critical path chart unavailable" in (tmp_path / page).read_text(encoding="utf-8")


def test_report_when_critical_path_fails(sample_store: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(con: object, job: str, step: int | None = None, **kw: object) -> None:
        raise RuntimeError("no edges for this job\nsecond line")

    monkeypatch.setitem(sys.modules, CP_MODULE, types.SimpleNamespace(critical_path=broken))
    code, stdout, stderr = run("report", sample_store, "--out", tmp_path, "--json")
    assert code == 0, stderr
    cp = json.loads(stdout)["critical_path"]
    assert cp == {"available": False, "reason": "critical_path() failed on this store: "
                                                "RuntimeError: no edges for this job"}


def test_report_draws_a_critical_path(sample_store: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeline from segments in the agreed shape (a DuckDB relation ordered by step
    and seq), here one segment per rank and step so the chart does not depend on the
    critical path module's progress."""
    def critical_path(con: duckdb.DuckDBPyConnection, job: str, step: int | None = None,
                      **kw: object) -> duckdb.DuckDBPyRelation:
        return con.sql("""
            SELECT job, step, rank AS seq, rank, 0 AS track_id, 'cpu_thread' AS track_kind,
                   eid, 'ProfilerStep#' || step AS name, CASE WHEN rank = 0 THEN 'cpu'
                   ELSE 'comm' END AS kind, start_ns, end_ns, dur_ns
            FROM steps WHERE job = ? ORDER BY step, rank""", params=[job])

    monkeypatch.setitem(sys.modules, CP_MODULE,
                        types.SimpleNamespace(critical_path=critical_path,
                                              unexplained_gap_warning=lambda path: None))
    code, stdout, stderr = run("report", sample_store, "--out", tmp_path, "--json")
    assert code == 0, stderr
    s = json.loads(stdout)
    assert s["critical_path"]["available"] and s["critical_path"]["segments"] == 6
    assert {k["kind"] for k in s["critical_path"]["by_kind"]} == {"cpu", "comm"}
    assert s["critical_path"]["steps"] == [2, 3, 4]
    assert_png(Path(s["files"]["critical_path"]))
    assert "](critical_path.png)" in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_report_subprocess_terminal_summary(sample_store: Path, tmp_path: Path) -> None:
    r = tracetool("report", sample_store, "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    for heading in ("Job steps (complete ProfilerSteps, ms)",
                    "Steps per rank (complete ProfilerSteps, ms)", "Step breakdown",
                    "Top 15 CPU ops", "Collectives", "Critical path"):
        assert heading in r.stdout
    assert f"written: {tmp_path / 'r' / 'breakdown.png'}" in r.stdout
    assert (tmp_path / "r" / "report.html").is_file()


@needs_traces
def test_report_on_a_gpu_trace_lists_kernels(hta_stores: tuple[Path, Path],
                                             raw_pair: tuple[dict, dict],
                                             tmp_path: Path) -> None:
    code, stdout, stderr = run("report", hta_stores[0], "--out", tmp_path, "--json")
    assert code == 0, stderr
    s = json.loads(stdout)
    raw = raw_pair[0]
    kernels = {n: v for n, v in raw["gpu"].items() if raw["gpu_kind"][n] == "kernel"}
    want = sorted(kernels.items(), key=lambda kv: (-kv[1][1], kv[0]))[:15]
    assert s["top"]["what"] == "kernels"
    assert [(r["name"], r["count"], r["total_ns"]) for r in s["top"]["rows"]] == [
        (n, c, t) for n, (c, t) in want]
    assert s["top"]["rows"][0]["name"].startswith("ncclKernel_SendRecv")
    assert_png(tmp_path / "top_kernels.png")
    assert_png(tmp_path / "breakdown.png")


# ------------------------------------------------------------------------------------- diff

def _ns(v: object) -> int:
    return int(Decimal(str(v)) * 1000)


def raw_totals(path: Path) -> dict:
    """From the raw JSON alone: per name (count, total ns) of CPU ops and of GPU ops, and
    per ProfilerStep its duration (the tiling of docs/steps.md; one rank, so the job step)
    and its compute-kernel time (non-NCCL kernels launched in it)."""
    doc = json.loads(gzip.open(path).read(), parse_float=Decimal)
    ops: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    gpu: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    gpu_kind, launch_ts, steps, gpu_evs, marks = {}, {}, {}, [], {}
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        cat, name, args = e.get("cat"), e.get("name", ""), e.get("args") or {}
        ts, dur = _ns(e["ts"]), _ns(e.get("dur", 0))
        if cat == "cpu_op":
            ops[name][0] += 1
            ops[name][1] += dur
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu[name][0] += 1
            gpu[name][1] += dur
            gpu_kind[name] = cat
            compute = cat == "kernel" and not name.startswith("nccl")
            gpu_evs.append((args.get("correlation"), ts, ts + dur, dur if compute else 0,
                            e.get("pid")))
        elif cat == "cuda_runtime" and "correlation" in args:
            launch_ts.setdefault(args["correlation"], ts)
        elif cat == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", name):
            steps.setdefault(int(name.split("#")[1]), (ts, ts + dur))
        elif cat == "gpu_user_annotation" and re.fullmatch(r"ProfilerStep#\d+", name):
            marks.setdefault(int(name.split("#")[1]), (ts, e.get("pid")))
    launched, kernel_ns = {}, []
    for n, (cs, ce) in steps.items():
        # a GPU op belongs to the step its launch call started in (its own start when the
        # trace has no launch call for it)
        inside = [g for g in gpu_evs if cs <= launch_ts.get(g[0], g[1]) < ce]
        launched[n] = [(ts, end, None, None, pid) for _, ts, end, _, pid in inside]
        kernel_ns.append(sum(g[3] for g in inside))
    gpu_ops = [(ts, end, None, None, pid) for _, ts, end, _, pid in gpu_evs]
    windows = independent_steps(steps, launched, marks, gpu_ops)
    step_dur = [b - a for a, b in windows.values()]
    return {"ops": {n: tuple(v) for n, v in ops.items()},
            "gpu": {n: tuple(v) for n, v in gpu.items()}, "gpu_kind": gpu_kind,
            "step_time": statistics.median(step_dur),
            "kernel_time": statistics.median(kernel_ns)}


@pytest.fixture(scope="module")
def raw_pair() -> tuple[dict, dict]:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
    return raw_totals(CONTROL), raw_totals(TEST)


def expected_rows(a: dict, b: dict) -> list[tuple[str, int, int, int, int]]:
    """(name, count A, count B, total A, total B), largest |total change| first."""
    out = []
    for n in a.keys() | b.keys():
        (ca, ta), (cb, tb) = a.get(n, (0, 0)), b.get(n, (0, 0))
        out.append((n, ca, cb, ta, tb))
    return sorted(out, key=lambda r: (-abs(r[4] - r[3]), r[0]))


@needs_traces
def test_diff_matches_the_raw_traces(hta_stores: tuple[Path, Path],
                                     raw_pair: tuple[dict, dict]) -> None:
    code, stdout, stderr = run("diff", *hta_stores, "--json", "--top", "0")
    assert code == 0, stderr
    d = json.loads(stdout)
    assert (d["a"]["job"], d["a"]["ranks"], d["b"]["job"], d["b"]["ranks"]) == (
        "control", [3], "test", [1])
    ra, rb = raw_pair
    for what, key in (("cpu_ops", "ops"), ("gpu_ops", "gpu")):
        got = [(r["name"], r["count_a"], r["count_b"], r["total_a_ns"], r["total_b_ns"])
               for r in d[what]["rows"]]
        assert got == expected_rows(ra[key], rb[key]), what
    for r in d["cpu_ops"]["rows"] + d["gpu_ops"]["rows"]:
        assert r["total_delta_ns"] == r["total_b_ns"] - r["total_a_ns"]
        if r["count_a"] and r["count_b"]:
            assert r["mean_a_ns"] == round(r["total_a_ns"] / r["count_a"])
            assert r["total_rel"] == pytest.approx((r["total_b_ns"] - r["total_a_ns"])
                                                   / r["total_a_ns"])
    # the known large changes of this pair: the test run copies device to device 258x as
    # often (aten::copy_ 12x), and aten::item (a GPU->CPU sync) takes 5.6x as long
    top_gpu, top_cpu = d["gpu_ops"]["rows"][0], d["cpu_ops"]["rows"][0]
    assert (top_gpu["name"], top_gpu["kind"], top_gpu["count_a"], top_gpu["count_b"]) == (
        "Memcpy DtoD (Device -> Device)", "memcpy", 18, 4645)
    assert top_gpu["total_delta_ns"] > 90e6
    assert top_cpu["name"] == "aten::item" and top_cpu["total_rel"] > 4.5
    copy = next(r for r in d["cpu_ops"]["rows"] if r["name"] == "aten::copy_")
    assert (copy["count_a"], copy["count_b"]) == (444, 5232)
    # per-step metrics: medians of the six steps of each side
    m = {x["metric"]: x for x in d["metrics"]}
    for metric in ("step_time", "kernel_time"):
        assert abs(m[metric]["a_ns"] - ra[metric]) <= 1, metric
        assert abs(m[metric]["b_ns"] - rb[metric]) <= 1, metric
    assert m["step_time"]["rel"] == pytest.approx(rb["step_time"] / ra["step_time"] - 1,
                                                  rel=1e-6)
    assert d["a"]["rank_steps"] == d["b"]["rank_steps"] == 6


@needs_traces
@pytest.mark.parametrize(("order", "gates", "code", "crossed"), [
    ("ab", ["step_time>+5%"], 1, ["step_time>+5%"]),          # +49.2%
    ("ab", ["step_time>+60%"], 0, []),
    ("ab", ["step_time>+2ms"], 1, ["step_time>+2ms"]),        # +37.8 ms
    ("ab", ["step_time>+100ms"], 0, []),
    ("ab", ["kernel_time>+100%", "comm_time>+5%"], 1, ["comm_time>+5%"]),  # +82%, +102%
    ("ba", ["step_time>+5%", "kernel_time>+10%", "comm_time>+5%"], 0, []),  # all faster
    ("ba", ["step_time<-30%"], 1, ["step_time<-30%"]),        # -33.0%
])
def test_diff_fail_if(hta_stores: tuple[Path, Path], order: str, gates: list[str], code: int,
                      crossed: list[str]) -> None:
    a, b = hta_stores if order == "ab" else hta_stores[::-1]
    args = [x for g in gates for x in ("--fail-if", g)]
    got, stdout, stderr = run("diff", a, b, *args, "--json")
    assert got == code, stderr
    assert [c["expr"] for c in json.loads(stdout)["checks"] if c["crossed"]] == crossed
    lines = stderr.splitlines()
    assert len(lines) == len(crossed)
    for line, expr in zip(lines, crossed, strict=True):
        assert line.startswith(f"tracetool: fail-if crossed: {expr}: ")


@needs_traces
def test_diff_subprocess_text_and_exit_code(hta_stores: tuple[Path, Path]) -> None:
    r = tracetool("diff", *hta_stores, "--fail-if", "step_time>+5%", "--top", "3")
    assert r.returncode == 1
    assert r.stderr.startswith("tracetool: fail-if crossed: step_time>+5%: step_time "
                               "76.888 ms -> 114.716 ms (+49.2%)")
    assert "Memcpy DtoD (Device -> Device)" in r.stdout and "aten::item" in r.stdout
    assert "fail-if step_time>+5%: CROSSED" in r.stdout
    r = tracetool("diff", *hta_stores, "--fail-if", "step_time>+200%")
    assert (r.returncode, r.stderr) == (0, "")


def test_diff_of_a_store_with_itself(sample_store: Path) -> None:
    code, stdout, stderr = run("diff", sample_store, sample_store, "--json",
                               "--fail-if", "step_time>+0%", "--fail-if", "kernel_time>+0%")
    assert (code, stderr) == (0, "")
    d = json.loads(stdout)
    assert all(r["total_delta_ns"] == 0 and r["status"] == "both"
               for r in d["cpu_ops"]["rows"])
    assert len(d["cpu_ops"]["rows"]) == 20 and d["gpu_ops"]["rows"] == []
    assert [c["crossed"] for c in d["checks"]] == [False, False]


# -------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("expr", ["step_time>>5%", "step_time>5", "steptime>+5%",
                                  "step_time=+5%", "step_time>+5 parsecs", ""])
def test_diff_bad_fail_if_is_a_usage_error(sample_store: Path, expr: str) -> None:
    code, stdout, stderr = run("diff", sample_store, sample_store, "--fail-if", expr)
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("tracetool: error: --fail-if")


def test_bad_stores_are_one_line_errors(sample_store: Path, tmp_path: Path) -> None:
    (tmp_path / "empty" / "data").mkdir(parents=True)
    cases = [
        (["report", tmp_path / "missing"], "no such file or directory"),
        (["report", tmp_path], "not a tracetool store"),
        (["report", tmp_path / "empty"], "holds no ingested traces"),
        (["report", sample_store, "--job", "nope"], "no job 'nope'"),
        (["diff", sample_store, tmp_path / "missing"], "no such file or directory"),
        (["diff", tmp_path, sample_store], "not a tracetool store"),
        (["diff", sample_store, sample_store, "--job-b", "nope"], "no job 'nope'"),
    ]
    for args, message in cases:
        code, stdout, stderr = run(*args, "--out", tmp_path / "o") if args[0] == "report" \
            else run(*args)
        assert code == 1, args
        assert stderr.count("\n") == 1 and message in stderr, (args, stderr)
        assert stderr.startswith("tracetool: error: ") and stdout == ""


def test_bad_store_subprocess_has_no_traceback(tmp_path: Path) -> None:
    for args in (["report", tmp_path / "nowhere"], ["diff", tmp_path, tmp_path]):
        r = tracetool(*args)
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert r.stderr.count("\n") == 1 and r.stdout == ""


def test_store_with_two_jobs_needs_a_job(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for job in ("one", "two"):
        code, _, err = run("ingest", SAMPLES, "--store", store, "--job", job, "--workers", "2")
        assert code == 0, err
    line = f"tracetool: error: {store}: the store holds jobs one, two: choose one with --job\n"
    for args in (["report", store, "--out", tmp_path / "o"], ["critical-path", store],
                 ["replay", store], ["sweep", store, "--network", "inter_node_bw=1,2Gbit/s",
                                     "--source-network", "inter_node_bw=1Gbit/s"],
                 ["diff", store, store]):
        code, _, stderr = run(*args)
        assert (code, stderr) == (1, line), args  # one text for every command
    code, stdout, stderr = run("diff", store, store, "--job-a", "one", "--job-b", "two",
                               "--json", "--fail-if", "step_time>+0%")
    assert code == 0, stderr
    d = json.loads(stdout)
    assert (d["a"]["job"], d["b"]["job"]) == ("one", "two")
    assert d["metrics"][0]["delta_ns"] == 0


@needs_traces
def test_unnamed_devices_are_said_not_blank(tmp_path: Path) -> None:
    """vLLM's ROCm trace lists 8 devices with empty names: the report says so (it printed a
    blank 'Devices:')."""
    src = SHARED_TRACES / ("AMD-AGI__TraceLens/tests/traces/inference/vllm_decode_full/"
                           "graph_execution.json.gz")
    names = json.loads(gzip.decompress(src.read_bytes()))["deviceProperties"]
    assert [d["name"] for d in names] == [""] * 8
    store = tmp_path / "s"
    assert run("ingest", src, "--store", store)[0] == 0
    code, out, err = run("report", store, "--out", tmp_path / "r")
    assert code == 0, err
    assert "\nDevices: 8 per rank with no name in the trace's deviceProperties\n" in out
    code, out, _ = run("report", store, "--out", tmp_path / "r", "--json")
    got = json.loads(out)
    assert (got["devices"], got["unnamed_devices"]) == ([], 8)


def test_main_summary_shows_every_column(sample_store: Path) -> None:
    """scripts/summary.py (run by scripts/main.sh) prints every column on a narrow terminal
    (DuckDB's show() dropped one: '9 columns (8 shown)')."""
    r = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts/summary.py"),
                        str(sample_store)], capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "60", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    for col in ("job", "events_read", "events_stored", "events_quarantined", "steps",
                "median_step_ms", "collectives", "collective_ms", "transfer_ms"):
        assert f" {col} " in r.stdout, col
    assert " shown)" not in r.stdout
