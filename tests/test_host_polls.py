"""Recorded poll loops are host waits; stream waits no recorded event names are counted
(issue 26, item 2; docs/critical_path.md, "Host waits" and "Stream waits").

* A run of cudaEventQuery calls lasting 1 ms or more whose last call returns within 20 us of
  a GPU op's end waited for that op: its calls are no nodes, the gap they leave is ended by
  a host_wait edge, the critical path calls it idle_wait and replay moves it with the op.
* hipStreamWaitEvent on ROCm records neither the event nor a stream (Kineto's roctracer
  logger drops hipEventRecord): no edge, one warning counting them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import msgspec
import pytest

import tracetool
from tracetool.analysis.critical_path import critical_path, unresolved_stream_wait_warning
from tracetool.graph import HOST_POLL_GAP_NS, HOST_WAIT_MIN_GAP_NS, HOST_WAIT_TOL_NS
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay.compute import parse_speedup
from tracetool.replay.model import Scenario
from tracetool.replay.run import Replayer

from ._util import SHARED_TRACES, kineto_text, run, write, x

corpus = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="no trace corpus")


def _ingest(tmp: Path, name: str, events: list[dict]) -> duckdb.DuckDBPyConnection:
    path = write(tmp / f"{name}.json", kineto_text(events, rank=0))
    res = ingest([path], Options(store=tmp / name, job="j", rank=0, workers=1))
    assert res[0].status == "ingested", res[0].message
    return tracetool.connect(tmp / name)


def _poll_trace(*, period_us: float = 10, last_end_after_us: float = 4,
                extra: list[dict] | None = None) -> list[dict]:
    """A step whose thread launches a 10 ms kernel (300 -> 10,300 us), then, inside
    dispatch(F), polls its event with cudaEventQuery (2 us calls every ``period_us`` from
    400 us) until a call that ends ``last_end_after_us`` after the kernel's end; aten::add
    starts 6 us after that call."""
    rt = dict(cat="cuda_runtime")
    last_end = 10_300 + last_end_after_us
    ev = [x("ProfilerStep#1", 0, 20_000, cat="user_annotation"),
          x("dispatch(F)", 100, 15_000, cat="user_annotation"),
          x("cudaLaunchKernel", 200, 5, correlation=1, **rt),
          x("gemm_kernel", 300, 10_000, cat="kernel", pid=0, tid=7, correlation=1, device=0,
            stream=7),
          x("aten::add", last_end + 6, 90)]
    t, c = 400.0, 100
    while t + 2 < last_end:
        ev.append(x("cudaEventQuery", t, 2, correlation=c, **rt))
        t, c = t + period_us, c + 1
    ev.append(x("cudaEventQuery", last_end - 2, 2, correlation=c, **rt))
    return ev + (extra or [])


def _host_waits(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute("""
        SELECT s.name, d.name, e.dst_point, e.lag_ns FROM rank_edges e
        JOIN events s ON s.eid = e.src_eid JOIN events d ON d.eid = e.dst_eid
        WHERE e.kind = 'host_wait'""").fetchall()


def _polls_in_graph(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """(cudaEventQuery events, those that are nodes of the graph)."""
    return con.execute("""SELECT (SELECT count(*) FROM events WHERE name = 'cudaEventQuery'),
                                 (SELECT count(*) FROM cp_nodes WHERE name = 'cudaEventQuery')
                       """).fetchone()


def test_a_poll_loop_ending_as_a_kernel_ends_is_a_wait_on_it(tmp_path: Path) -> None:
    con = _ingest(tmp_path, "poll", _poll_trace())
    # 991 calls: 400, 410, ... 10,300 us, then the last one ending at 10,304 us
    assert _polls_in_graph(con) == (992, 0)
    # the gap the loop leaves ends at aten::add's start, 10 us after the kernel's end
    assert _host_waits(con) == [("gemm_kernel", "aten::add", "start", 10_000)]
    rows = critical_path(con, "j", 1).query(
        "p", "SELECT name, kind, edge_kind, start_ns, end_ns FROM p").fetchall()
    us = [(n, k, e, round(a / 1e3), round(b / 1e3)) for n, k, e, a, b in rows]
    assert us[2:6] == [("gemm_kernel", "launch_overhead", "launch", 200, 300),
                       ("gemm_kernel", "compute", "gpu_order", 300, 10_300),
                       ("aten::add", "idle_wait", "host_wait", 10_300, 10_310),
                       ("aten::add", "cpu", "cpu_order", 10_310, 10_400)]
    # replay: the loop is no fixed CPU work, a kernel twice as fast ends it 5 ms earlier,
    # one twice as slow 10 ms later
    r = Replayer.from_store(con, "j")
    (same,) = r.run(Scenario()).steps
    (fast,) = r.run(Scenario(speedups=(parse_speedup("name~gemm_kernel=2"),))).steps
    (slow,) = r.run(Scenario(speedups=(parse_speedup("name~gemm_kernel=0.5"),))).steps
    assert same.projected_ns == same.measured_ns == 20_000_000
    assert (fast.projected_ns, slow.projected_ns) == (15_000_000, 30_000_000)


def test_a_poll_loop_that_saw_no_op_end_is_cpu_work(tmp_path: Path) -> None:
    """The same loop returning 25 us after the kernel's end (past the tolerance): nothing
    says it waited for that kernel, so its calls stay nodes, no host_wait, and the path
    keeps the loop's calls as CPU time."""
    con = _ingest(tmp_path, "late", _poll_trace(last_end_after_us=HOST_WAIT_TOL_NS / 1e3 + 5))
    assert _polls_in_graph(con) == (994, 994)
    assert _host_waits(con) == []
    (polled,), = critical_path(con, "j", 1).query(
        "p", "SELECT sum(dur_ns) FROM p WHERE name = 'cudaEventQuery' AND kind = 'cpu'"
    ).fetchall()
    assert polled > 1_000_000


def test_polls_far_apart_or_split_by_other_work_are_no_run(tmp_path: Path) -> None:
    """Calls 30 us apart (28 us between them, over HOST_POLL_GAP_NS) make runs of one call,
    none lasting 1 ms: no wait. A cpu_op recorded inside the loop at 5 ms splits it: the
    part before it (461 calls, 4.6 ms) saw no op end and stays; the part after it ends as
    the kernel ends and is the wait."""
    assert 28_000 > HOST_POLL_GAP_NS and 4_600_000 > HOST_WAIT_MIN_GAP_NS
    con = _ingest(tmp_path, "sparse", _poll_trace(period_us=30))
    assert _polls_in_graph(con) == (332, 332)
    assert _host_waits(con) == []
    split = _poll_trace(extra=[x("aten::empty", 5_003, 3)])
    before = [e for e in split if e["name"] == "cudaEventQuery" and e["ts"] < 5_003]
    assert len(before) == 461
    con = _ingest(tmp_path, "split", split)
    assert _polls_in_graph(con) == (992, len(before))
    assert _host_waits(con) == [("gemm_kernel", "aten::add", "start", 10_000)]


def test_rocm_stream_waits_give_no_edge_and_one_warning(tmp_path: Path) -> None:
    """hipStreamWaitEvent as ROCm's Kineto writes it (no hipEventRecord, args: correlation
    only) between a kernel on stream 0 and one on stream 4: no edge, one warning; with a
    hipEventRecord before it (CUDA's pattern), event_wait and no warning."""
    rt = dict(cat="cuda_runtime")

    def trace(record: bool) -> list[dict]:
        ev = [x("ProfilerStep#1", 0, 1_000, cat="user_annotation"),
              x("hipLaunchKernel", 10, 5, correlation=1, **rt),
              x("gemm", 20, 100, cat="kernel", pid=0, tid=0, correlation=1, device=0,
                stream=0),
              x("hipStreamWaitEvent", 40, 3, correlation=2, **rt),
              x("hipLaunchKernel", 50, 5, correlation=3, **rt),
              x("reduce", 130, 50, cat="kernel", pid=0, tid=4, correlation=3, device=0,
                stream=4)]
        return ev + [x("hipEventRecord", 30, 2, correlation=4, **rt)] if record else ev

    con = _ingest(tmp_path, "rocm", trace(False))
    assert con.execute("SELECT count(*) FROM rank_edges WHERE kind IN ('event_wait', "
                       "'stream_wait')").fetchone() == (0,)
    con.close()
    code, out, err = run("critical-path", tmp_path / "rocm", "--json")
    assert code == 0
    (w,) = [w for w in json.loads(out)["warnings"] if "stream wait" in w]
    assert w.startswith("1 stream wait(s) (hipStreamWaitEvent) on 1 rank(s) name no "
                        "recorded event")
    assert err.count("stream wait(s)") == 1 and f"tracetool: warning: {w}" in err
    con = _ingest(tmp_path, "cuda", trace(True))
    assert unresolved_stream_wait_warning(con, "j") is None
    assert con.execute("""SELECT s.name, d.name, e.lag_ns FROM rank_edges e
                          JOIN events s ON s.eid = e.src_eid JOIN events d ON d.eid = e.dst_eid
                          WHERE e.kind = 'event_wait'""").fetchall() == [("gemm", "reduce", 10_000)]


@corpus
def test_rocm_sglang_stream_wait_is_counted(tmp_path: Path) -> None:
    """TraceLens' SGLang decode trace (MI300X; its Python frames dropped at test time): its
    hipStreamWaitEvent call carries only a correlation id and the trace has no
    hipEventRecord: it is counted in the warning and gives no stream edge. (The MI300
    resnet_act_checkpoint trace has 24 such calls: the same, counted in the corpus run of
    docs/critical_path.md; it is 8x larger.)"""
    src = SHARED_TRACES / ("AMD-AGI__TraceLens/tests/traces/inference/sglang_decode/"
                           "sglang_Qwen3-8B_decode.json.gz")
    trace = json.loads(gzip.decompress(src.read_bytes()))
    ev = trace["traceEvents"] = [e for e in trace["traceEvents"]
                                 if e.get("cat") != "python_function"]
    waits = [e for e in ev if e.get("name") == "hipStreamWaitEvent" and e.get("ph") == "X"]
    assert not [e for e in ev if str(e.get("name", "")).startswith("hipEventRecord")]
    assert {k for e in waits for k in e["args"]} == {"cid", "correlation"}
    assert len(waits) == 1
    path = write(tmp_path / "sglang.json", json.dumps(trace))
    assert ingest([path], Options(store=tmp_path / "s", job="j", workers=1))[0].status \
        == "ingested"
    con = tracetool.connect(tmp_path / "s")
    w = unresolved_stream_wait_warning(con, "j")
    assert w is not None and w.startswith(
        f"{len(waits)} stream wait(s) (hipStreamWaitEvent) on 1 rank(s) name no recorded event")
    assert con.execute("SELECT count(*) FROM rank_edges WHERE kind IN ('event_wait', "
                       "'stream_wait')").fetchone() == (0,)


@corpus
def test_the_allocators_event_sweeps_are_cpu_work(tmp_path: Path) -> None:
    """HTA's df_index_resolver trace, cropped at test time to 5 ms around its first run of
    cudaEventQuery calls: the caching allocator sweeps its pending events inside
    aten::empty_strided (796 calls over 2.1 ms); no GPU op ended during the sweep, so it is
    CPU work: every call stays a node and nothing waits on an op there."""
    src = SHARED_TRACES / ("facebookresearch__HolisticTraceAnalysis/tests/data/"
                           "df_index_resolver/df_index_resolver.json.gz")
    trace = msgspec.json.decode(gzip.decompress(src.read_bytes()))  # 54 MB: 4x json's speed
    ev = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    # independently: the first row of calls with at most 20 us between them, on one thread
    first = next(e for e in ev if e["name"] == "cudaEventQuery")
    thread = [e for e in ev if e["tid"] == first["tid"] and e.get("cat") != "kernel"
              and first["ts"] <= e["ts"] <= first["ts"] + 5_000]
    run_ = [first]
    for e in thread[thread.index(first) + 1:]:
        if e["name"] != "cudaEventQuery" or e["ts"] - run_[-1]["ts"] - run_[-1]["dur"] > 20:
            break
        run_.append(e)
    start, end = first["ts"], run_[-1]["ts"] + run_[-1]["dur"]
    assert (len(run_), end - start) == (796, 2_084)
    gpu_ends = [e["ts"] + e["dur"] for e in ev
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert not [t for t in gpu_ends if start < t <= end]
    lo, hi = start - 5_000, end + 1_000
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ph") == "M" or (
        e.get("ph") == "X" and e["ts"] <= hi and e["ts"] + e.get("dur", 0) >= lo)]
    n_polls = sum(e["name"] == "cudaEventQuery" for e in trace["traceEvents"])
    path = write(tmp_path / "crop.json", msgspec.json.encode(trace))
    assert ingest([path], Options(store=tmp_path / "s", job="j", rank=0, workers=1)
                  )[0].status == "ingested"
    con = tracetool.connect(tmp_path / "s")
    assert _polls_in_graph(con) == (n_polls, n_polls)
    assert con.execute("""SELECT count(*) FROM rank_edges e JOIN events d ON d.eid = e.dst_eid
                          WHERE e.kind = 'host_wait' AND d.ts_ns BETWEEN ? AND ?""",
                       [start * 1000, hi * 1000]).fetchone() == (0,)
