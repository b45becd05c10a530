"""--annotation NAME [--instance N] and --window A:B (docs/steps.md): report, critical-path,
replay and sweep work on those windows, agree on their times, and refuse ones that select
nothing."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from ._util import DLRM, SAMPLES, SHARED_TRACES, run

GLOO_NET = ["--source-network", "gpus_per_node=1,inter_node_bw=1Gbit/s"]
FORWARD = "## forward ##"


@pytest.fixture(scope="module")
def store(shared_store: Callable[[str], Path]) -> Path:
    """Job gloo (the sample) and, with the corpus, job dlrm: read-only, shared."""
    return shared_store("gloo_dlrm" if SHARED_TRACES.is_dir() else "gloo")


def _ns(v: object) -> int:
    return int(Decimal(str(v)) * 1000)


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw,
                     parse_float=Decimal)
    return doc["traceEvents"]


def annotation_window(paths: list[Path], name: str, instance: int) -> int:
    """From the raw JSON: the job-wide span of instance ``instance`` of annotation ``name``:
    per rank, its CPU span and the GPU ops launched inside it; over ranks, earliest start
    to latest end."""
    starts, ends = [], []
    for p in paths:
        evs = _events(p)
        ann = sorted((e for e in evs if e.get("name") == name and e.get("ph") == "X"),
                     key=lambda e: Decimal(e["ts"]))[instance]
        a, b = _ns(ann["ts"]), _ns(ann["ts"]) + _ns(ann["dur"])
        launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in evs
                  if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {})}
        gpu = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e.get("dur", 0))) for e in evs
               if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and a <= launch.get((e.get("args") or {}).get("correlation"), _ns(e["ts"])) < b]
        starts.append(min([a] + [s for s, _ in gpu]))
        ends.append(max([b] + [e for _, e in gpu]))
    return max(ends) - min(starts)


def _json(*args: object) -> dict:
    code, out, err = run(*args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="real trace corpus not found")
def test_annotation_window_agrees_everywhere(store: Path, tmp_path: Path) -> None:
    want = annotation_window(sorted(DLRM.glob("*.json")), FORWARD, 0)
    opts = ["--job", "dlrm", "--annotation", FORWARD, "--instance", "0"]
    report = _json("report", store, *opts, "--out", tmp_path / "rep")
    assert [(r["step"], r["dur_ns"]) for r in report["job_steps"]] == [(0, want)]
    assert report["windows"] == f"annotation {FORWARD!r} instance 0"
    assert [(s["step"], s["dur_ns"]) for s in _json("critical-path", store, *opts)["steps"]] \
        == [(0, want)]
    rp = _json("replay", store, *opts)
    assert [(s["step"], s["measured_step_ns"], s["projected_step_ns"])
            for s in rp["steps"]] == [(0, want, want)]
    sw = _json("sweep", store, *opts, "--gpu", "v100,h100", "--out", tmp_path / "sw")
    assert [r["measured_step_ns"] for r in sw["rows"]] == [want, want]
    # an H100 runs the forward's kernels faster; its span is the CPU's, which stays
    v100, h100 = (r["projected_breakdown_ns"] for r in sw["rows"])
    assert h100["compute"] < v100["compute"] and sw["rows"][1]["projected_step_ns"] == want


def test_time_window_agrees_everywhere(store: Path, tmp_path: Path) -> None:
    opts = ["--job", "gloo", "--window", "10ms:50ms"]
    report = _json("report", store, *opts, "--out", tmp_path / "rep")
    assert [(r["step"], r["dur_ns"]) for r in report["job_steps"]] == [(0, 40_000_000)]
    assert [r["dur_ns"] for r in report["breakdown"]] == [40_000_000, 40_000_000]
    cp = _json("critical-path", store, *opts)
    assert [(s["step"], s["dur_ns"]) for s in cp["steps"]] == [(0, 40_000_000)]
    rp = _json("replay", store, *opts, *GLOO_NET)
    (s,) = rp["steps"]
    assert s["measured_step_ns"] == s["projected_step_ns"] == 40_000_000
    assert s["measured_breakdown_ns"]["dur_ns"] == 40_000_000
    slower = _json("replay", store, *opts, *GLOO_NET, "--network", "inter_node_bw=200Mbit/s")
    assert slower["steps"][0]["projected_step_ns"] > 40_000_000


def test_time_window_breakdown_is_the_clipped_union(store: Path) -> None:
    """The window's compute time on rank 0 against an independent union of the rank's CPU
    work (cpu_ops and user annotations off the gloo threads, except gloo spans, the step
    annotations and calls that enclose a gloo span of their thread: docs/steps.md) clipped
    to the window, from the raw JSON (nested work adds nothing to a union)."""
    import tracetool
    from tracetool.analysis.windows import Windows, parse_window, use_windows

    con = tracetool.connect(store)
    use_windows(con, "gloo", Windows(window=parse_window("10ms:50ms")))
    got = con.execute("SELECT compute_ns FROM step_breakdown WHERE job = 'gloo' AND rank = 0"
                      ).fetchone()[0]
    files = sorted(SAMPLES.glob("*.json.gz"))
    path = next(p for p in files
                if json.loads(gzip.open(p).read())["distributedInfo"]["rank"] == 0)
    evs = [e for e in _events(path) if e.get("ph") == "X" and "dur" in e]
    t0 = min(_ns(e["ts"]) for p in files for e in _events(p)  # the job's first event
             if e.get("ph") == "X" and "dur" in e)
    a, b = t0 + 10_000_000, t0 + 50_000_000
    gloo_tids = {e["tid"] for e in _events(path) if e.get("ph") == "M"
                 and e.get("name") == "thread_name" and "gloo" in e["args"]["name"]}
    gloo = [(e["tid"], _ns(e["ts"])) for e in evs if str(e["name"]).startswith("gloo:")]
    ops = []
    for e in evs:
        name = str(e.get("name", ""))
        if e.get("cat") not in ("cpu_op", "user_annotation") or e["tid"] in gloo_tids \
                or name.startswith(("gloo:", "ProfilerStep#")):
            continue
        s, t = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
        if any(tid == e["tid"] and s <= g < t for tid, g in gloo):
            continue
        if s < b and t > a:
            ops.append((max(s, a), min(t, b)))
    total, reach = 0, None
    for s, t in sorted(ops):
        if reach is None or s > reach:
            total, reach = total + t - s, t
        elif t > reach:
            total, reach = total + t - reach, t
    assert got == total


@pytest.mark.parametrize("args,message", [
    (["--annotation", "no such thing"], "job gloo has no annotation 'no such thing' on a CPU "
                                        "thread; its annotations include: "),
    (["--annotation", "ProfilerStep#2", "--instance", "1"],
     "annotation 'ProfilerStep#2' of job gloo has instances 0 to 0 on every rank, not 1"),
    (["--instance", "0"], "--instance needs --annotation"),
    (["--annotation", "ProfilerStep#2", "--window", "0ms:1ms"],
     "give --annotation or --window, not both"),
    (["--window", "10:20"], "bad time '10': use a number and a unit (ns, us, ms, s)"),
    (["--window", "20ms:10ms"], "bad window '20ms:10ms': its end must be after its start"),
    (["--window", "10ms:5s"], "window 10ms:5000ms ends after the trace of job gloo, which "
                              "spans "),
])
@pytest.mark.parametrize("command", ["report", "critical-path", "replay", "sweep"])
def test_windows_that_select_nothing_exit_2(store: Path, tmp_path: Path, command: str,
                                            args: list[str], message: str) -> None:
    extra = {"report": ["--out", str(tmp_path / "r")], "critical-path": [],
             "replay": GLOO_NET, "sweep": [*GLOO_NET, "--network", "inter_node_bw=1,2Gbit/s",
                                           "--out", str(tmp_path / "s")]}[command]
    code, out, err = run(command, store, "--job", "gloo", *args, *extra)
    assert code == 2, err
    assert err.startswith(f"tracetool: error: {message}") and err.count("\n") == 1
    assert "Traceback" not in err
