"""The memory views (analysis/sql/80_memory.sql), CUPTI counters (81_cupti_counters.sql) and
the counter tracks of the Chrome-trace export, each against an independent computation from
the raw JSON of a corpus trace."""

from __future__ import annotations

import functools
import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

import tracetool
from tests._util import SHARED_TRACES, TRACELENS, run

BERT = TRACELENS / "h100/gaunernst_bert-small-uncased__1016001.json.gz"
RESNET_2021 = (SHARED_TRACES / "pytorch__kineto/tb_plugin/samples/resnet50_num_workers_0/"
               "worker0.1623143089861.pt.trace.json.gz")
CUPTI = (SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data/cupti_profiler/"
         "benchmark_result_924719_1679055439_trace.json.gz")
TYPES = {0: "cpu", 1: "cuda"}

pytestmark = pytest.mark.skipif(not BERT.exists(), reason="no ../shared/traces corpus")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("mem") / "store"
    for path, job in ((BERT, "bert"), (RESNET_2021, "resnet"), (CUPTI, "cupti")):
        code, _, err = run("ingest", path, "--store", s, "--job", job)
        assert code == 0, err
    return s


@functools.cache
def raw(path: Path) -> list[dict]:
    return json.loads(gzip.open(path).read(), strict=False)["traceEvents"]


def memory_events(path: Path) -> list[tuple[int, dict]]:
    """(eid, event) of the allocator instants, in (ts, eid) order."""
    evs = [(i, e) for i, e in enumerate(raw(path)) if e.get("name") == "[memory]"]
    return sorted(evs, key=lambda p: (float(p[1]["ts"]), p[0]))


def device(e: dict) -> tuple[str, int]:
    return TYPES[e["args"]["Device Type"]], e["args"]["Device Id"]


def test_levels_peak_and_live_memory_match_the_allocator(store: Path) -> None:
    mem = memory_events(BERT)
    c = tracetool.connect(store)
    got = {eid: (dt, dev, b, a, r, rel) for eid, dt, dev, b, a, r, rel in c.execute(
        "SELECT eid, device_type, device, bytes, allocated_bytes, reserved_bytes, relative "
        "FROM memory_timeline WHERE job = 'bert'").fetchall()}
    assert got == {i: (*device(e), e["args"]["Bytes"], e["args"]["Total Allocated"],
                       e["args"]["Total Reserved"], False) for i, e in mem}
    # the peak per device (the trace has one ProfilerStep, #6, holding every event)
    by_dev: dict[tuple, list] = defaultdict(list)
    for i, e in mem:
        by_dev[device(e)].append((i, e))
    want = {}
    for dev, evs in by_dev.items():
        peak = max(e["args"]["Total Allocated"] for _, e in evs)
        p_eid, p_ev = next((i, e) for i, e in evs if e["args"]["Total Allocated"] == peak)
        live = 0
        by_addr: dict[int, list] = defaultdict(list)
        for _, e in evs:
            by_addr[e["args"]["Addr"]].append(e)
        for seq in by_addr.values():
            for k, e in enumerate(seq):
                nxt = seq[k + 1] if k + 1 < len(seq) else None
                freed = nxt["ts"] if nxt is not None and nxt["args"]["Bytes"] < 0 else None
                if (e["args"]["Bytes"] > 0 and e["ts"] <= p_ev["ts"]
                        and (freed is None or freed > p_ev["ts"])):
                    live += e["args"]["Bytes"]
        want[dev] = (6, len(evs), peak, p_eid,
                     evs[0][1]["args"]["Total Allocated"] - evs[0][1]["args"]["Bytes"],
                     evs[-1][1]["args"]["Total Allocated"],
                     max(e["args"]["Total Reserved"] for _, e in evs), False, live)
    peaks = {(dt, dev): rest for dt, dev, *rest in c.execute(
        "SELECT device_type, device, step, n_events, peak_allocated_bytes, peak_eid, "
        "start_allocated_bytes, end_allocated_bytes, peak_reserved_bytes, relative, "
        "live_at_peak_bytes FROM memory_peaks WHERE job = 'bert'").fetchall()}
    assert {k: tuple(v) for k, v in peaks.items()} == want
    assert want[("cuda", 0)][2] == 101_305_344 and want[("cuda", 0)][-1] == 9_944_576
    # what held it, by op: adds up to live_at_peak_bytes, and the peak's own op
    held = dict(c.execute("SELECT device_type, sum(bytes) FROM memory_live_at_peak "
                          "WHERE job = 'bert' GROUP BY ALL").fetchall())
    assert held == {dt: v[-1] for (dt, _), v in want.items()}
    top = c.execute("SELECT peak_op_name, peak_top_op_name FROM memory_peaks "
                    "WHERE job = 'bert' AND device_type = 'cuda'").fetchone()
    assert top == enclosing_ops(BERT, want[("cuda", 0)][3])


def enclosing_ops(path: Path, eid: int) -> tuple[str, str]:
    """The innermost slice and the outermost cpu_op (not ProfilerStep#) around event eid on
    its thread, from the raw JSON."""
    evs = raw(path)
    e = evs[eid]
    t = float(e["ts"])
    around = [x for x in evs if x is not e and x.get("ph") == "X" and x.get("pid") == e["pid"]
              and x.get("tid") == e["tid"]
              and float(x["ts"]) <= t < float(x["ts"]) + float(x["dur"])]
    inner = max(around, key=lambda x: float(x["ts"]))
    ops = [x for x in around if x.get("cat") == "cpu_op"
           and not x["name"].startswith("ProfilerStep#")]
    outer = min(ops, key=lambda x: float(x["ts"]))
    return inner["name"], outer["name"]


def test_traces_without_totals_get_running_sums(store: Path) -> None:
    """A 2021 trace records Bytes only: the level is the running sum per device, flagged
    relative, and no address, so nothing is said of what was live at the peak."""
    mem = memory_events(RESNET_2021)
    level: dict[tuple, int] = defaultdict(int)
    want = {}
    for i, e in mem:
        level[device(e)] += e["args"]["Bytes"]
        want[i] = level[device(e)]
    c = tracetool.connect(store)
    got = dict(c.execute("SELECT eid, allocated_bytes FROM memory_timeline "
                         "WHERE job = 'resnet'").fetchall())
    assert got == want and len(got) == 12_838
    # each step's peak: the highest running sum among the events inside its tile
    ts = dict(c.execute("SELECT eid, ts_ns FROM events WHERE job = 'resnet' "
                        "AND name = '[memory]'").fetchall())
    tiles = c.execute("SELECT step, start_ns, end_ns FROM steps WHERE job = 'resnet'").fetchall()
    got_peaks = {s: rest for s, *rest in c.execute(
        "SELECT step, peak_allocated_bytes, relative, live_at_peak_bytes FROM memory_peaks "
        "WHERE job = 'resnet' AND device_type = 'cuda' AND step IS NOT NULL").fetchall()}
    want_peaks = {}
    for step, s, e in tiles:
        inside = [want[i] for i, ev in mem if s <= ts[i] < e and device(ev) == ("cuda", 0)]
        if inside:
            want_peaks[step] = [max(inside), True, None]
    assert got_peaks == want_peaks and len(want_peaks) == 6
    assert c.execute("SELECT count(*) FROM memory_allocations WHERE job = 'resnet'"
                     ).fetchone() == (0,)


def test_cupti_counters_pair_ranges_with_launches(store: Path) -> None:
    evs = raw(CUPTI)
    ranges = sorted(((i, e) for i, e in enumerate(evs) if e.get("cat") == "cuda_profiler_range"),
                    key=lambda p: (float(p[1]["ts"]), p[0]))
    launches = sorted(((i, e) for i, e in enumerate(evs) if e.get("cat") == "cuda_runtime"
                       and "LaunchKernel" in e["name"]), key=lambda p: (float(p[1]["ts"]), p[0]))
    assert len(ranges) == len(launches) == 77
    want = {(i, k): (float(v), launches[n][0], *enclosing_ops(CUPTI, launches[n][0]))
            for n, (i, e) in enumerate(ranges) for k, v in e["args"].items()}
    got = {(eid, m): rest for eid, m, *rest in tracetool.connect(store).execute(
        "SELECT eid, metric, value, launch_eid, op_name, top_op_name FROM cupti_counters "
        "WHERE job = 'cupti' AND matched").fetchall()}
    assert {k: tuple(v) for k, v in got.items()} == want and len(want) == 693


def test_chrome_trace_carries_counter_tracks(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "path.json"
    code, _, err = run("critical-path", store, "--job", "bert", "--chrome-trace", out)
    assert code == 0, err
    counters = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "C"]
    tracks: dict[str, list] = defaultdict(list)
    for e in counters:
        tracks[e["name"]].append(e)
    c = tracetool.connect(store)
    streams = c.execute("SELECT DISTINCT device, stream FROM stream_queue_length "
                        "WHERE job = 'bert'").fetchall()
    directions = [d for (d,) in c.execute("SELECT DISTINCT direction FROM memory_bw_time_series "
                                          "WHERE job = 'bert'").fetchall()]
    assert sorted(tracks) == sorted(
        ["memory (cpu:-1)", "memory (cuda:0)"]
        + [f"queue length (device {d} stream {s})" for d, s in streams]
        + [f"memory bandwidth {d}" for d in directions])
    # the memory track is the allocator's own totals, in time order
    mem = [e for _, e in memory_events(BERT) if device(e) == ("cuda", 0)]
    assert [e["args"] for e in tracks["memory (cuda:0)"]] == [
        {"allocated bytes": e["args"]["Total Allocated"],
         "reserved bytes": e["args"]["Total Reserved"]} for e in mem]
    # a launch and a start per GPU op with a launch call: the queue rises and falls back
    (d, s), = streams
    q = [e["args"]["ops"] for e in tracks[f"queue length (device {d} stream {s})"]]
    n_ops = c.execute("SELECT count(*) FROM gpu_ops WHERE job = 'bert' AND launch_eid IS NOT "
                      "NULL AND device = ? AND stream = ?", [d, s]).fetchone()[0]
    assert len(q) == 2 * n_ops and q[-1] == 0 and min(q) == 0


def test_report_shows_the_highest_peak_and_charts_the_step(store: Path, tmp_path: Path) -> None:
    code, stdout, err = run("report", store, "--job", "bert", "--out", tmp_path / "rep", "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    want = {(dt, dev): v for (dt, dev), v in peaks_by_device(BERT).items()}
    got = {(r["device_type"], r["device"]): (r["step"], r["peak_allocated_bytes"],
                                             r["peak_top_op_name"])
           for r in summary["memory_peaks"]}
    assert got == {k: (6, v, enclosing_ops(BERT, eid)[1]) for k, (v, eid) in want.items()}
    assert summary["files"]["memory"] == str(tmp_path / "rep" / "memory.png")
    assert (tmp_path / "rep" / "memory.png").stat().st_size > 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Memory (allocator events)" in md and "101.3" in md


def peaks_by_device(path: Path) -> dict[tuple, tuple[int, int]]:
    """(device type, id) -> (peak Total Allocated, eid of the first event reaching it)."""
    out: dict[tuple, tuple[int, int]] = {}
    for i, e in memory_events(path):
        v = e["args"]["Total Allocated"]
        if device(e) not in out or v > out[device(e)][0]:
            out[device(e)] = (v, i)
    return out


def test_report_sums_each_cupti_metric(store: Path, tmp_path: Path) -> None:
    code, stdout, err = run("report", store, "--job", "cupti", "--out", tmp_path / "r", "--json")
    assert code == 0, err
    evs = raw(CUPTI)
    ranges = sorted(((i, e) for i, e in enumerate(evs) if e.get("cat") == "cuda_profiler_range"),
                    key=lambda p: (float(p[1]["ts"]), p[0]))
    launches = sorted(((i, e) for i, e in enumerate(evs) if e.get("cat") == "cuda_runtime"
                       and "LaunchKernel" in e["name"]), key=lambda p: (float(p[1]["ts"]), p[0]))
    total: dict[str, float] = defaultdict(float)
    by_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (_, r), (li, _) in zip(ranges, launches, strict=True):
        top = enclosing_ops(CUPTI, li)[1]
        for k, v in r["args"].items():
            total[k] += v
            by_op[k][top] += v
    got = {r["metric"]: r for r in json.loads(stdout)["cupti_counters"]}
    assert {k: r["total"] for k, r in got.items()} == total
    for k, ops in by_op.items():
        if total[k]:
            assert (got[k]["top_op_name"], got[k]["top_op_total"]) == max(
                ops.items(), key=lambda p: p[1])
    assert "## Hardware counters (CUPTI range profiler)" in (tmp_path / "r" / "report.md"
                                                           ).read_text()
