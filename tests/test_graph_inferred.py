"""Edges the trace does not record, and gaps that are not launches (issue 26, items 2-3).

* ``event_wait``: cudaEventRecord -> cudaStreamWaitEvent pairs on a rank without cuda_sync
  events. Ground truth: HTA's critical-path fixtures, which do record cuda_sync "Stream
  Wait Event"; the cuda_sync events are dropped at test time and the inferred edges are
  compared with the ones the recorded events give.
* ``host_wait``: a long CPU gap that ends just after a GPU op's end waited for it.
* ``unexplained_gap``: the GPU idle with work launched, far longer than a launch.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pytest

import tracetool
from tracetool.analysis.critical_path import critical_path
from tracetool.graph import HOST_WAIT_TOL_NS
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay.compute import parse_speedup
from tracetool.replay.model import Scenario
from tracetool.replay.run import Replayer

from ._util import SHARED_TRACES, kineto_text, run, write, x

HTA_CP = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data/critical_path"
VLLM = SHARED_TRACES / ("AMD-AGI__TraceLens/tests/traces/inference/vllm_decode_full/"
                        "graph_execution.json.gz")
SGLANG = SHARED_TRACES / ("AMD-AGI__TraceLens/tests/traces/inference/sglang_decode/"
                          "sglang_Qwen3-8B_decode.json.gz")
corpus = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="no trace corpus")


def _ingest(tmp: Path, name: str, events: list[dict] | None = None, path: Path | None = None
            ) -> duckdb.DuckDBPyConnection:
    if path is None:
        path = write(tmp / f"{name}.json", kineto_text(events, rank=0))
    res = ingest([path], Options(store=tmp / name, job="j", rank=0, workers=1))
    assert res[0].status == "ingested", res[0].message
    return tracetool.connect(tmp / name)


_OP_EDGES = """
SELECT s.ts_ns, s.stream, s.name, d.ts_ns, d.stream, d.name, e.lag_ns FROM rank_edges e
JOIN gpu_ops s ON s.rank = e.rank AND s.eid = e.src_eid
JOIN gpu_ops d ON d.rank = e.rank AND d.eid = e.dst_eid
WHERE e.job = ? AND e.rank = ? AND e.kind = ? ORDER BY ALL"""


@pytest.fixture(scope="module")
def sync_cases(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    """HTA's alexnet and cuda_event_sync_multi_stream fixtures, one job each: rank 0 the
    trace as recorded, rank 1 the same trace without its cuda_sync events."""
    tmp = tmp_path_factory.mktemp("sync")
    for case in ("alexnet", "cuda_event_sync_multi_stream"):
        src = next((HTA_CP / case).glob("*.json.gz"))
        trace = json.loads(gzip.decompress(src.read_bytes()))
        n = len(trace["traceEvents"])
        trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "cuda_sync"]
        assert len(trace["traceEvents"]) < n
        trace["distributedInfo"] = {"rank": 1, "world_size": 2}
        d = tmp / case
        d.mkdir()
        write(d / "rank0.json.gz", src.read_bytes())
        write(d / "rank1.json", json.dumps(trace))
        res = ingest([d], Options(store=tmp / "store", job=case, workers=1))
        assert sorted(r.rank for r in res if r.status == "ingested") == [0, 1], res
    return tracetool.connect(tmp / "store")


def _without_cuda_sync(con: duckdb.DuckDBPyConnection, case: str) -> tuple[list, list]:
    """(stream_wait edges of the fixture as recorded, event_wait edges of the same fixture
    without its cuda_sync events), each edge as its two GPU ops (time, stream, name)."""
    assert con.execute("SELECT count(*) FROM rank_edges WHERE job = ? AND rank = 1 AND "
                       "kind = 'stream_wait'", [case]).fetchone() == (0,)
    return (con.execute(_OP_EDGES, [case, 0, "stream_wait"]).fetchall(),
            con.execute(_OP_EDGES, [case, 1, "event_wait"]).fetchall())


@corpus
def test_event_waits_inferred_without_cuda_sync_equal_the_recorded_ones(sync_cases) -> None:
    """alexnet: cuDNN's FFT convolution hands work between streams 7 and 20 with
    event record / stream wait pairs (34 waits, 20 recorded by cuda_sync); the 6 edges
    between GPU ops they give are found again from the runtime calls alone."""
    truth, got = _without_cuda_sync(sync_cases, "alexnet")
    assert len(truth) == 6
    assert got == truth
    assert {(r[1], r[4]) for r in truth} == {(7, 20), (20, 7)}
    # and no event_wait where the trace records its stream waits
    assert sync_cases.execute("SELECT count(*) FROM rank_edges WHERE job = 'alexnet' AND "
                              "rank = 0 AND kind = 'event_wait'").fetchone() == (0,)


@corpus
def test_event_wait_takes_the_stream_the_thread_launched_on_last(sync_cases) -> None:
    """cuda_event_sync_multi_stream records an event on stream 20 after launching on 28:
    nothing in the runtime calls says which stream a cudaEventRecord recorded on, so the
    inferred edge starts at stream 28's kernel (the documented limit); its waiting op is
    the recorded one."""
    truth, got = _without_cuda_sync(sync_cases, "cuda_event_sync_multi_stream")
    assert len(truth) == len(got) == 1
    (t,), (g,) = truth, got
    assert t[1] == 20 and g[1] == 28 and t[2] == g[2]  # the same kernel, on another stream
    assert t[3:6] == g[3:6]  # the same waiting op (the memset on stream 24)


def _host_wait_trace(*, resume_after_us: float, busy_kernels: int = 0) -> list[dict]:
    """A step whose thread launches a 10 ms kernel, then (inside dispatch(F), nothing
    recorded) waits for it and resumes ``resume_after_us`` after it ends; ``busy_kernels``
    short kernels on another stream end during the gap."""
    rt = dict(cat="cuda_runtime")
    ev = [x("ProfilerStep#1", 0, 20_000, cat="user_annotation"),
          x("dispatch(F)", 100, 15_000, cat="user_annotation"),
          x("cudaLaunchKernel", 200, 5, correlation=1, **rt),
          x("gemm_kernel", 300, 10_000, cat="kernel", pid=0, tid=7, correlation=1, device=0,
            stream=7),
          x("aten::add", 10_300 + resume_after_us, 90)]
    for i in range(busy_kernels):
        ev.append(x("cudaLaunchKernel", 210 + i, 0.5, correlation=10 + i, **rt))
        ev.append(x("small_kernel", 400 + 300 * i, 100, cat="kernel", pid=0, tid=8,
                    correlation=10 + i, device=0, stream=8))
    return ev


def _host_waits(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute("""
        SELECT s.name, d.name, e.dst_point, e.lag_ns FROM rank_edges e
        JOIN events s ON s.eid = e.src_eid JOIN events d ON d.eid = e.dst_eid
        WHERE e.kind = 'host_wait'""").fetchall()


def test_a_cpu_gap_ending_as_a_kernel_ends_is_a_wait_on_it(tmp_path: Path) -> None:
    con = _ingest(tmp_path, "wait", _host_wait_trace(resume_after_us=8))
    assert _host_waits(con) == [("gemm_kernel", "aten::add", "start", 8_000)]
    rows = critical_path(con, "j", 1).query(
        "p", "SELECT name, kind, edge_kind, start_ns, end_ns FROM p").fetchall()
    us = [(n, k, e, round(a / 1e3), round(b / 1e3)) for n, k, e, a, b in rows]
    # the path runs through the kernel and the wait, not 10 ms of dispatch(F) self time
    assert us[2:6] == [("gemm_kernel", "launch_overhead", "launch", 200, 300),
                       ("gemm_kernel", "compute", "gpu_order", 300, 10_300),
                       ("aten::add", "idle_wait", "host_wait", 10_300, 10_308),
                       ("aten::add", "cpu", "cpu_order", 10_308, 10_398)]
    # replay: a kernel twice as fast resumes the thread 5 ms earlier, so the step's own
    # CPU time after it (dispatch(F) to 15,100 us, the step to 20,000 us) moves up by 5 ms
    r = Replayer.from_store(con, "j")
    (same,) = r.run(Scenario()).steps
    (fast,) = r.run(Scenario(speedups=(parse_speedup("name~gemm_kernel=2"),))).steps
    assert same.projected_ns == same.measured_ns == 20_000_000
    assert fast.projected_ns == 15_000_000


def test_no_host_wait_without_the_coincidence(tmp_path: Path) -> None:
    """Rank 0 resumes just after the tolerance; on rank 1, 30 short ops end during the gap,
    so a resume near one of them is no evidence: no host wait, and the gap stays CPU time of
    dispatch(F)."""
    d = tmp_path / "nowait"
    d.mkdir()
    for rank, resume, busy in ((0, HOST_WAIT_TOL_NS / 1e3 + 5, 0), (1, 8, 30)):
        write(d / f"rank{rank}.json", kineto_text(
            _host_wait_trace(resume_after_us=resume, busy_kernels=busy), rank=rank))
    assert len(ingest([d], Options(store=tmp_path / "s", job="j", workers=1))) == 2
    con = tracetool.connect(tmp_path / "s")
    assert con.execute("SELECT count(*) FROM rank_edges WHERE kind = 'host_wait'"
                       ).fetchone() == (0,)
    # the path stays on dispatch(F) over the gap: no kernel time on it
    kinds = dict(critical_path(con, "j", 1).query(
        "p", "SELECT rank, list(DISTINCT kind) FROM p GROUP BY 1").fetchall())
    assert all("compute" not in k for k in kinds.values())
    assert con.execute("""SELECT count(*) FROM critical_path WHERE name = 'dispatch(F)'
                          AND kind = 'cpu' AND dur_ns > 9_000_000""").fetchone() == (1,)


def _queued_gap_trace() -> list[dict]:
    """Kernel A runs at once; kernel B, launched 50 us later on the same stream, starts
    120 ms after A ended with nothing on the GPU: a queued gap. Step 2 repeats the pattern
    with a second, 2 ms gap, so the path has two; six ordinary kernels follow in each."""
    rt = dict(cat="cuda_runtime")
    k = dict(cat="kernel", pid=0, tid=7, device=0, stream=7)
    ev = []
    for step, base, gap in ((1, 0, 120_000), (2, 200_000, 2_000)):
        c = 100 * step
        ev += [x(f"ProfilerStep#{step}", base, 190_000, cat="user_annotation"),
               x("cudaLaunchKernel", base + 10, 5, correlation=c, **rt),
               x("kernel_a", base + 20, 100, correlation=c, **k),
               x("cudaLaunchKernel", base + 60, 5, correlation=c + 1, **rt),
               x("kernel_b", base + 120 + gap, 100, correlation=c + 1, **k),
               x("cudaDeviceSynchronize", base + 70, gap + 160, correlation=c + 2, **rt)]
        for i in range(6):  # ordinary launches after it: 10 us from launch to start
            t = base + gap + 300 + 100 * i
            ev += [x("cudaLaunchKernel", t, 5, correlation=c + 3 + i, **rt),
                   x("kernel_c", t + 10, 50, correlation=c + 3 + i, **k)]
    return ev


def test_a_queued_gpu_gap_is_an_unexplained_gap_with_one_warning(tmp_path: Path) -> None:
    path = write(tmp_path / "gap.json", kineto_text(_queued_gap_trace(), rank=0))
    store = tmp_path / "store"
    assert run("ingest", "--store", store, "--job", "j", path)[0] == 0
    code, out, err = run("critical-path", store, "--json")
    assert code == 0
    report = json.loads(out)
    by_step = {s["step"]: s["by_kind"] for s in report["steps"]}
    # kernel_a ends at 120 us (step 2: 200,120 us), kernel_b starts 120 ms (2 ms) later
    assert by_step[1]["unexplained_gap"] == 120_000_000
    assert by_step[2]["unexplained_gap"] == 2_000_000
    assert all("launch_overhead" not in k or k["launch_overhead"] < 100_000
               for k in by_step.values())
    lines = [ln for ln in err.splitlines() if "unexplained_gap" in ln]
    (gap_warning,) = [w for w in report["warnings"] if "unexplained_gap" in w]
    assert lines == [f"tracetool: warning: {gap_warning}"]
    total = sum(s["dur_ns"] for s in report["steps"])
    assert gap_warning.startswith(
        f"122.000 ms of the critical path ({100 * 122e6 / total:.1f}%) is unexplained_gap: "
        "2 GPU idle gap(s) with work already launched")
    assert "the longest, 120.000 ms on rank 0" in lines[0] and "clock jump" in lines[0]
    # the report warns once too (in its summary and on stderr)
    code, out, err = run("report", store, "--out", tmp_path / "report", "--json")
    assert code == 0
    assert [w for w in json.loads(out)["warnings"] if "unexplained_gap" in w] == [gap_warning]
    assert [ln for ln in err.splitlines() if "unexplained_gap" in ln] == lines
    # the breakdown splits the same time out of idle_ns
    con = tracetool.connect(store)
    got = con.execute("""SELECT step, unexplained_gap_ns, idle_ns >= unexplained_gap_ns
                         FROM step_breakdown ORDER BY step""").fetchall()
    assert got == [(1, 120_000_000, True), (2, 2_000_000, True)]
    assert con.execute("SELECT wait_ns, idle_ns, threshold_ns FROM gpu_wait_gaps ORDER BY 1"
                       ).fetchall() == [(2_000_000, 2_000_000, 1_000_000),
                                        (120_000_000, 120_000_000, 1_000_000)]


def test_a_gap_under_a_millisecond_stays_launch_and_stream_order(tmp_path: Path) -> None:
    ev = [e for e in _queued_gap_trace() if e["ts"] < 200_000]
    for e in ev:  # step 1's 120 ms gap down to 0.9 ms
        if e["name"] in ("kernel_b", "kernel_c", "cudaLaunchKernel") and e["ts"] > 1_000:
            e["ts"] -= 119_100
        if e["name"] == "cudaDeviceSynchronize":
            e["dur"] -= 119_100
    con = _ingest(tmp_path, "short", ev)
    kinds = dict(critical_path(con, "j", 1).query(
        "p", "SELECT kind, sum(dur_ns) FROM p GROUP BY 1").fetchall())
    assert "unexplained_gap" not in kinds and kinds["idle_wait"] >= 900_000
    assert con.execute("SELECT sum(unexplained_gap_ns) FROM step_breakdown").fetchone() == (0,)


def test_a_gap_while_another_stream_runs_is_not_unexplained(tmp_path: Path) -> None:
    """The same queued gap with a kernel running on another stream through it: the GPU was
    not idle (contention, not missing work), so no unexplained gap and no warning."""
    ev = _queued_gap_trace()[:6] + [
        x("cudaLaunchKernel", 15, 2, cat="cuda_runtime", correlation=99),
        x("long_kernel", 30, 119_900, cat="kernel", pid=0, tid=9, device=0, stream=9,
          correlation=99)]
    ev[0]["dur"] = 400_000
    con = _ingest(tmp_path, "busy", ev)
    kinds = dict(critical_path(con, "j", 1).query(
        "p", "SELECT kind, sum(dur_ns) FROM p GROUP BY 1").fetchall())
    assert "unexplained_gap" not in kinds
    assert con.execute("SELECT count(*) FROM gpu_wait_gaps").fetchone() == (0,)
    assert con.execute("SELECT sum(unexplained_gap_ns) FROM step_breakdown").fetchone() == (0,)


@corpus
def test_vllm_decode_gap_before_its_first_gpu_op(tmp_path: Path) -> None:
    """vLLM's decode graph_execution trace (MI300X): the first GPU op, a DtoD copy launched
    534 us into the trace, starts 7.8 ms later and every later op queues behind it; the
    GPU had nothing else recorded before it, so the path's 7.8 ms from that launch to the
    copy's start is an unexplained gap (GPU work outside the trace), not launch overhead."""
    con = _ingest(tmp_path, "vllm", path=VLLM)
    (first_delay, n_ops), = con.execute("""
        SELECT arg_min(ts_ns - launch_ts_ns, ts_ns), count(*) FROM gpu_ops""").fetchall()
    assert n_ops == 434 and first_delay == 7_836_601
    kinds = dict(critical_path(con, "j").query(
        "p", "SELECT kind, sum(dur_ns) FROM p GROUP BY 1").fetchall())
    assert kinds["unexplained_gap"] == first_delay
    # the view's wait starts when the launch call returned (the work queued by then)
    (queued,), = con.execute("""
        SELECT g.ts_ns - l.end_ns FROM gpu_ops g JOIN events l ON l.eid = g.launch_eid
        ORDER BY g.ts_ns LIMIT 1""").fetchall()
    assert con.execute("SELECT wait_ns, idle_ns FROM gpu_wait_gaps").fetchall() == [
        (queued, queued)]
    assert queued == 7_826_151  # the hipMemcpyAsync took 10.45 us
    assert "launch_overhead" not in kinds
    span, = con.execute("SELECT max(end_ns) - min(ts_ns) FROM cp_nodes").fetchone()
    assert sum(kinds.values()) == span == 19_114_059


@corpus
def test_sglang_decode_gap_is_its_longest_gpu_idle_time(tmp_path: Path) -> None:
    """SGLang's Qwen3-8B decode trace (MI300X): the GPU goes idle for 463 ms with nothing
    recorded, and the op after that idle time was launched 38 us into it: the path's hop
    from that launch to the op's start is an unexplained gap, nearly all of the path."""
    con = _ingest(tmp_path, "sglang", path=SGLANG)
    ops = con.execute("SELECT eid, ts_ns, end_ns, launch_ts_ns FROM gpu_ops "
                      "ORDER BY ts_ns, eid").fetchall()
    idle, after, busy_until = 0, None, None  # the longest time with no GPU op running
    for eid, ts, end, launch in ops:
        if busy_until is not None and ts - busy_until > idle:
            idle, after = ts - busy_until, (eid, ts, launch, busy_until)
        busy_until = end if busy_until is None else max(busy_until, end)
    eid, ts, launch, idle_from = after
    assert idle == 463_295_405 and idle_from < launch < ts
    kinds = dict(critical_path(con, "j").query(
        "p", "SELECT kind, sum(dur_ns) FROM p GROUP BY 1").fetchall())
    assert kinds["unexplained_gap"] == ts - launch == 463_257_096
    assert kinds.get("launch_overhead", 0) < 100_000
    assert con.execute("SELECT eid FROM gpu_wait_gaps").fetchall() == [(eid,)]


@corpus
def test_a_launch_blocked_on_a_full_queue_waits_for_the_op_that_frees_a_slot(
        tmp_path: Path) -> None:
    """HTA's negative_queue_length_values_check rank (A100, 1 of 16), cropped at test time to
    1 ms around its first 6.4 ms cudaLaunchKernel: the launch queue is full, and the call
    returns 7 us after a GPU op ends (the op that freed a slot): a host wait, so a faster
    GPU would return it earlier."""
    src = SHARED_TRACES / ("facebookresearch__HolisticTraceAnalysis/tests/data/"
                           "negative_queue_length_values_check/rank0.json.gz")
    trace = json.loads(gzip.decompress(src.read_bytes()))
    ev = trace["traceEvents"]
    call = min((e for e in ev if e.get("name") == "cudaLaunchKernel" and e["dur"] > 6_000),
               key=lambda e: e["ts"])
    lo, hi = call["ts"] - 1_000, call["ts"] + call["dur"] + 1_000
    trace["traceEvents"] = [e for e in ev if e.get("ph") == "M" or (
        e.get("ph") == "X" and e["ts"] <= hi and e["ts"] + e.get("dur", 0) >= lo)]
    # independently: the GPU op that ended last before the call returned
    gpu = [e for e in trace["traceEvents"]
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and call["ts"] < e["ts"] + e["dur"] <= call["ts"] + call["dur"]]
    last = max(gpu, key=lambda e: e["ts"] + e["dur"])
    lag_us = call["ts"] + call["dur"] - (last["ts"] + last["dur"])
    assert (call["dur"], lag_us) == (6_367, 7)
    con = _ingest(tmp_path, "queue", path=write(tmp_path / "crop.json", json.dumps(trace)))
    got = con.execute("""
        SELECT s.name, d.ts_ns, e.lag_ns FROM rank_edges e
        JOIN events d ON d.eid = e.dst_eid AND e.dst_point = 'end'
        JOIN events s ON s.eid = e.src_eid WHERE e.kind = 'host_wait'
        ORDER BY d.ts_ns LIMIT 1""").fetchall()
    assert got == [(last["name"], call["ts"] * 1000, lag_us * 1000)]
