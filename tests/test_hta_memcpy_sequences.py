"""HTA's memory-bandwidth, frequent-kernel-sequence and user-annotation analyses
(analysis/sql/61_memcpy_sequences_annotations.sql) on real traces, checked against
computations from the raw trace JSON written here from HTA's definitions (not from the SQL),
and against the values HTA's own tests assert on the same files."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import SHARED_TRACES

HTA = "facebookresearch__HolisticTraceAnalysis/tests/data"
TRACES = {
    # HTA's test_generate_trace_with_counters: 4 kinds of memcpy/memset on rank 0
    "negq": f"{HTA}/negative_queue_length_values_check/rank0.json.gz",
    # HTA's gpu/cpu user annotation breakdown tests; DtoD copies and memsets
    "nsres": f"{HTA}/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    # HTA's test_no_frequent_cuda_kernel_sequences_found (aten::clone); aten::addmm sequences
    "dfidx": f"{HTA}/df_index_resolver/df_index_resolver.json.gz",
    # integer-us trace with 0-duration copies, GPU annotations
    "gpuanno": f"{HTA}/with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    # ROCm traces: copies with args.kind, and copies without a size
    "sglang": "AMD-AGI__TraceLens/tests/traces/inference/sglang_decode/"
              "sglang_Qwen3-8B_decode.json.gz",
    "mi250": f"{HTA}/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
}
COPY_CATS = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
GPU_CATS = COPY_CATS | {"kernel", "Kernel"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
SLICE_CATS = {"cpu_op", "Operator", "user_annotation", "python_function"}

pytestmark = pytest.mark.skipif(not all((SHARED_TRACES / p).is_file() for p in TRACES.values()),
                                reason=f"real trace corpus not found at {SHARED_TRACES}")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("hta_views") / "store"
    for job, rel in TRACES.items():
        r = ingest([SHARED_TRACES / rel], Options(store=s, job=job, rank=0, workers=2))
        assert r[0].status == "ingested", r[0].message
    return s


@pytest.fixture(scope="module")
def con(store: Path):
    return tracetool.connect(store)


def _us(v: object) -> int:
    return int(Decimal(str(v)) * 1000)


_RAW: dict[str, list[dict]] = {}


def raw(job: str) -> list[dict]:
    """The trace's complete events (ph X) with ts_ns/end_ns added, in file order."""
    if job not in _RAW:
        path = SHARED_TRACES / TRACES[job]
        text = (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")).read()
        doc = json.loads(text, strict=False, parse_float=Decimal)
        evs = doc["traceEvents"] if isinstance(doc, dict) else doc
        base = int(doc.get("baseTimeNanoseconds", 0)) if isinstance(doc, dict) else 0
        out = []
        for i, e in enumerate(evs):
            if e.get("ph") != "X" or "ts" not in e:
                continue
            e = dict(e, i=i, ts_ns=base + _us(e["ts"]))
            e["dur_ns"] = _us(e.get("dur", 0))
            e["end_ns"] = e["ts_ns"] + e["dur_ns"]
            out.append(e)
        _RAW[job] = out
    return _RAW[job]


def _direction(e: dict) -> str:  # HTA's get_memory_kernel_type, with Kineto's short codes
    name = e["name"]
    if name.startswith("Memset"):
        return "Memset"
    if name.startswith("Memcpy ") and "to" in name.split()[1]:
        return name.split()[1]
    return (e.get("args") or {}).get("kind", "unknown")


def _bw(e: dict) -> float | None:
    a = e.get("args") or {}
    if "memory bandwidth (GB/s)" in a:
        return float(a["memory bandwidth (GB/s)"])
    if a.get("bytes") is not None and e["dur_ns"] > 0:
        return a["bytes"] / e["dur_ns"]
    return None


def _copies(job: str) -> list[dict]:
    return [e for e in raw(job) if e.get("cat") in COPY_CATS]


# --- 1. memory bandwidth -------------------------------------------------------------------


@pytest.mark.parametrize("job", list(TRACES))
def test_memory_copies_and_summary_match_the_raw_trace(con, job: str) -> None:
    by_dir: dict[str, list[dict]] = defaultdict(list)
    for e in _copies(job):
        by_dir[_direction(e)].append(e)
    got = {r[0]: r[1:] for r in con.execute(
        "SELECT direction, count, bytes, total_ns, min_gbps, max_gbps, mean_gbps, p50_gbps, "
        "first_ns, last_ns FROM memory_bw_summary WHERE job = ?", [job]).fetchall()}
    assert sorted(got) == sorted(by_dir)
    for d, evs in by_dir.items():
        n, nbytes, total, lo, hi, mean, p50, first, last = got[d]
        sizes = [(e.get("args") or {}).get("bytes") for e in evs]
        assert n == len(evs)
        assert nbytes == (sum(s for s in sizes if s is not None)
                          if any(s is not None for s in sizes) else None)
        assert total == sum(e["dur_ns"] for e in evs)
        assert first == min(e["ts_ns"] for e in evs)
        assert last == max(e["end_ns"] for e in evs)
        bws = sorted(b for b in map(_bw, evs) if b is not None)
        if not bws:
            assert lo is None and hi is None
            continue
        assert lo == pytest.approx(bws[0], rel=1e-12)
        assert hi == pytest.approx(bws[-1], rel=1e-12)
        assert mean == pytest.approx(sum(bws) / len(bws), rel=1e-9)
        m = len(bws) // 2
        want_p50 = bws[m] if len(bws) % 2 else (bws[m - 1] + bws[m]) / 2
        assert p50 == pytest.approx(want_p50, rel=1e-9)
    # per copy: the direction, the size and both bandwidths
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT eid, direction, bytes, gbps, kineto_gbps FROM memory_copies WHERE job = ?",
        [job]).fetchall()}
    assert sorted(rows) == sorted(e["i"] for e in _copies(job))
    for e in _copies(job):
        d, nbytes, gbps, kineto = rows[e["i"]]
        a = e.get("args") or {}
        assert d == _direction(e) and nbytes == a.get("bytes")
        if a.get("bytes") is None or e["dur_ns"] == 0:
            assert gbps is None
        else:
            assert gbps == pytest.approx(a["bytes"] / e["dur_ns"], rel=1e-12)
        k = a.get("memory bandwidth (GB/s)")
        assert kineto == (float(k) if k is not None else None)


def _segments(evs: list[dict]) -> list[tuple[int, int, int, float]]:
    """HTA's time series as segments: every copy adds its bandwidth over [ts, ts + dur)
    (a 0 duration counts as 1 us), written out by brute force over the boundaries."""
    iv = [(e["ts_ns"], e["end_ns"] if e["dur_ns"] > 0 else e["ts_ns"] + 1000, _bw(e) or 0.0)
          for e in evs]
    pts = sorted({t for s, x, _ in iv for t in (s, x)})
    out = []
    starts = sorted(iv)
    for a, b in zip(pts, pts[1:], strict=False):
        act = [w for s, x, w in starts if s <= a and x >= b]
        out.append((a, b, len(act), sum(act)))
    return out


@pytest.mark.parametrize("job", ["negq", "nsres", "gpuanno", "sglang", "mi250"])
def test_memory_bw_time_series_matches_a_sweep_of_the_raw_trace(con, job: str) -> None:
    by_dir: dict[str, list[dict]] = defaultdict(list)
    for e in _copies(job):
        by_dir[_direction(e)].append(e)
    for d, evs in by_dir.items():
        got = con.execute(
            "SELECT start_ns, end_ns, n_copies, bw_gbps FROM memory_bw_time_series "
            "WHERE job = ? AND direction = ? ORDER BY start_ns", [job, d]).fetchall()
        want = _segments(evs)
        assert [g[:3] for g in got] == [w[:3] for w in want], (job, d)
        for g, w in zip(got, want, strict=True):
            assert g[3] == pytest.approx(w[3], rel=1e-9, abs=1e-12)
        busy, peak = con.execute(
            "SELECT busy_ns, peak_gbps FROM memory_bw_summary WHERE job = ? AND direction = ?",
            [job, d]).fetchall()[0]
        assert busy == sum(b - a for a, b, n, _ in want if n > 0)
        assert peak == pytest.approx(max(w[3] for w in want), rel=1e-9)


def _hta_memory_bw_summary(evs: list[dict]) -> dict[str, dict[str, float]]:
    """HTA's get_memory_bw_summary on one rank (hta/analyzers/trace_counters.py): per name
    prefix ("Memcpy DtoH", "Memset"), +bw at each copy's start and -bw at its end (dur 0 ->
    1 us), sorted by time, cumulated; the positive points are described."""
    pts = defaultdict(list)
    for e in evs:
        name = "Memset" if e["name"].startswith("Memset") else e["name"][:11]
        bw = float((e.get("args") or {}).get("memory bandwidth (GB/s)", 0.0))
        dur = e["dur_ns"] or 1000
        pts[name] += [(e["ts_ns"], bw), (e["ts_ns"] + dur, -bw)]
    out = {}
    for name, p in pts.items():
        acc, vals = 0.0, []
        for _, v in sorted(p, key=lambda x: x[0]):
            acc += v
            vals.append(acc)
        pos = [v for v in vals if v > 0]
        out[name] = {"count": len(pos), "max": max(pos), "min": min(pos)}
    return out


def test_memory_bw_summary_agrees_with_hta(con) -> None:
    # HTA's test_generate_trace_with_counters: "1 ranks x 4 types of memcpy/memset", and no
    # negative bandwidth in the time series
    rows = con.execute("SELECT direction, count, max_gbps, peak_gbps FROM memory_bw_summary "
                       "WHERE job = 'negq' ORDER BY direction").fetchall()
    assert [r[0] for r in rows] == ["DtoD", "DtoH", "HtoD", "Memset"]
    assert con.execute("SELECT count(*) FROM memory_bw_time_series "
                       "WHERE job = 'negq' AND bw_gbps < 0").fetchall() == [(0,)]
    hta = _hta_memory_bw_summary(_copies("negq"))
    assert sorted(hta) == ["Memcpy DtoD", "Memcpy DtoH", "Memcpy HtoD", "Memset"]
    for d, n, hi, peak in rows:
        h = hta["Memset" if d == "Memset" else f"Memcpy {d}"]
        assert peak == pytest.approx(h["max"], rel=1e-9)  # HTA's max is the series' max
        assert hi <= peak + 1e-9
        # HTA counts one positive point per copy start (plus float residues at ends)
        assert n <= h["count"]


# --- 2. frequent kernel sequences ----------------------------------------------------------


def _independent_patterns(job: str, op: str, min_len: int = 3) -> dict[str, tuple]:
    """HTA's get_frequent_cuda_kernel_sequences from the raw JSON: the CPU slices whose name
    contains op, at the least depth among them, with at least min_len GPU ops launched from
    inside them (launch call within the slice on the same thread); pattern = name + the GPU
    op names in GPU start order; per pattern: count, GPU ops' total ns, slices' total ns."""
    evs = raw(job)
    tracks: dict[tuple, list[dict]] = defaultdict(list)
    for e in evs:
        if e.get("cat") not in GPU_CATS:
            tracks[(str(e.get("pid")), str(e.get("tid")))].append(e)
    depth = {}
    for t in tracks.values():  # nesting: sort by start, longer first, file order; half-open
        stack: list[int] = []
        for e in sorted(t, key=lambda e: (e["ts_ns"], -e["dur_ns"], e["i"])):
            while stack and stack[-1] <= e["ts_ns"]:
                stack.pop()
            depth[e["i"]] = len(stack)
            stack.append(e["end_ns"])
    gpu_by_corr = defaultdict(list)
    for e in evs:
        if e.get("cat") in GPU_CATS and "correlation" in (e.get("args") or {}):
            gpu_by_corr[e["args"]["correlation"]].append(e)
    launches: dict[tuple, list[tuple]] = defaultdict(list)
    for e in evs:
        c = (e.get("args") or {}).get("correlation")
        if e.get("cat") in LAUNCH_CATS and c in gpu_by_corr:
            key = (str(e.get("pid")), str(e.get("tid")))
            launches[key] += [(e["ts_ns"], e["end_ns"], g) for g in gpu_by_corr[c]]
    cand = [e for e in evs if e.get("cat") in SLICE_CATS and op in e["name"]]
    if not cand:
        return {}
    min_depth = min(depth[e["i"]] for e in cand)
    out: dict[str, list] = {}
    for e in cand:
        if depth[e["i"]] != min_depth:
            continue
        key = (str(e.get("pid")), str(e.get("tid")))
        under = [g for s, x, g in launches[key] if s >= e["ts_ns"] and x <= e["end_ns"]]
        if len(under) < min_len:
            continue
        under.sort(key=lambda g: (g["ts_ns"], g["i"]))
        pattern = "|".join([e["name"]] + [g["name"] for g in under])
        c = out.setdefault(pattern, [0, 0, 0])
        c[0] += 1
        c[1] += sum(g["dur_ns"] for g in under)
        c[2] += e["dur_ns"]
    return {p: tuple(v) for p, v in out.items()}


@pytest.mark.parametrize(("job", "op"), [("dfidx", "aten::addmm"), ("nsres", "aten::conv2d"),
                                         ("nsres", "ConvolutionBackward0"),
                                         ("negq", "Backward"), ("negq", "fbgemm::")])
def test_frequent_kernel_sequences_match_the_raw_trace(con, job: str, op: str) -> None:
    want = _independent_patterns(job, op)
    assert want
    got = con.execute(
        "SELECT pattern_rank, pattern, count, gpu_ns, cpu_ns, n_gpu_ops, op_name, eids "
        "FROM frequent_kernel_sequences(?, top_k := NULL) WHERE job = ? ORDER BY pattern_rank",
        [op, job]).fetchall()
    assert {g[1]: g[2:5] for g in got} == want
    assert [g[0] for g in got] == list(range(1, len(got) + 1))
    order = sorted(want, key=lambda p: (-want[p][0], p))  # HTA: count desc, then pattern
    assert [g[1] for g in got] == order
    for g in got:
        assert g[5] == g[1].count("|") and g[1].startswith(g[6] + "|") and len(g[7]) == g[2]
    # top_k keeps the first k, min_pattern_len drops the short ones
    top2 = con.execute("SELECT pattern FROM frequent_kernel_sequences(?, top_k := 2) "
                       "WHERE job = ? ORDER BY pattern_rank", [op, job]).fetchall()
    assert [r[0] for r in top2] == order[:2]
    want4 = _independent_patterns(job, op, min_len=4)
    got4 = con.execute("SELECT pattern, count FROM frequent_kernel_sequences(?, "
                       "min_pattern_len := 4, top_k := NULL) WHERE job = ?", [op, job]).fetchall()
    assert dict(got4) == {p: v[0] for p, v in want4.items()}


def test_frequent_kernel_sequences_agree_with_hta(con) -> None:
    # HTA's test_no_frequent_cuda_kernel_sequences_found: aten::clone on df_index_resolver
    assert con.execute("SELECT count(*) FROM frequent_kernel_sequences('aten::clone') "
                       "WHERE job = 'dfidx'").fetchall() == [(0,)]
    # HTA's vision-transformer case (aten::linear|Memset (Device)|gemm|elementwise) has the
    # same shape here: addmm's memset, sgemm and cuBLASLt epilogue, 215 times
    first = con.execute("SELECT pattern, count FROM frequent_kernel_sequences('aten::addmm') "
                        "WHERE job = 'dfidx' AND pattern_rank = 1").fetchall()[0]
    assert first[0].startswith("aten::addmm|Memset (Device)|volta_sgemm_32x128_tn|")
    assert first[1] == 215


def test_op_kernel_sequences_cover_every_launched_gpu_op(con) -> None:
    # the outermost slices on the launching threads hold every GPU op with a CPU anchor
    for job in ("nsres", "dfidx"):
        n_root, n_anchored = con.execute(
            "SELECT (SELECT sum(n_gpu_ops) FROM op_kernel_sequences s "
            "        JOIN events e USING (job, rank, eid) "
            "        WHERE s.job = ? AND e.parent_eid IS NULL),"
            "       (SELECT count(*) FROM gpu_ops g JOIN events a ON a.job = g.job "
            "        AND a.rank = g.rank AND a.eid = coalesce(g.launch_eid, g.op_eid) "
            "        WHERE g.job = ? AND a.parent_eid IS NOT NULL)", [job, job]).fetchall()[0]
        assert n_root == n_anchored


# --- 3. user annotations -------------------------------------------------------------------


@pytest.mark.parametrize("job", ["nsres", "gpuanno", "mi250", "negq"])
def test_user_annotation_breakdown_matches_the_raw_trace(con, job: str) -> None:
    want: dict[tuple, list[int]] = defaultdict(list)
    for e in raw(job):
        if e.get("cat") in ("gpu_user_annotation", "user_annotation"):
            side = "gpu" if e["cat"] == "gpu_user_annotation" else "cpu"
            want[(side, e["name"])].append(e["dur_ns"])
    got = {(r[0], r[1]): r[2:] for r in con.execute(
        "SELECT side, name, count, total_ns, min_ns, max_ns, mean_ns, std_ns, share, "
        "total_rank, cum_share FROM user_annotation_breakdown WHERE job = ?", [job]).fetchall()}
    assert sorted(got) == sorted(want)
    for side in ("gpu", "cpu"):
        keys = sorted((k for k in want if k[0] == side), key=lambda k: (-sum(want[k]), k[1]))
        side_total = sum(sum(want[k]) for k in keys)
        cum = 0
        for i, k in enumerate(keys, 1):
            d = want[k]
            n, total, lo, hi, mean, std, share, rank_, cum_share = got[k]
            cum += sum(d)
            assert (n, total, lo, hi) == (len(d), sum(d), min(d), max(d))
            assert mean == pytest.approx(sum(d) / len(d))
            m = sum(d) / len(d)
            want_std = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else 0
            assert std == pytest.approx(want_std, rel=1e-9, abs=1e-9)
            assert share == pytest.approx(sum(d) / side_total)
            assert rank_ == i and cum_share == pytest.approx(cum / side_total)


def test_user_annotation_breakdown_agrees_with_hta(con) -> None:
    # HTA's test_gpu_user_annotation_breakdown: 3 GPU annotations on ns_resolution_trace
    gpu = con.execute("SELECT name FROM user_annotation_breakdown "
                      "WHERE job = 'nsres' AND side = 'gpu'").fetchall()
    assert len(gpu) == 3
    # test_cpu_user_annotation_breakdown: 12 CPU annotations, on the trace HTA keeps by
    # default: its last ProfilerStep dropped (CPU events starting before that step)
    cpu = {r[0] for r in con.execute("SELECT name FROM user_annotation_breakdown "
                                     "WHERE job = 'nsres' AND side = 'cpu'").fetchall()}
    ua = [e for e in raw("nsres") if e.get("cat") == "user_annotation"]
    last = max(e["ts_ns"] for e in ua if e["name"].startswith("ProfilerStep#"))
    kept = {e["name"] for e in ua if e["ts_ns"] < last}
    assert len(kept) == 12 and kept < cpu and cpu - kept == {"ProfilerStep#105"}


# --- HTA 0.5.0 (PyPI HolisticTraceAnalysis) run on the same files --------------------------
# HTA drops the trace's last ProfilerStep by default (Trace._filter_irrelevant_gpu_kernels,
# include_last_profiler_step=False: CPU events starting at or after the last ProfilerStep's
# start, and GPU events only they launched); restricted to the events that start before it,
# the views give HTA's numbers.

# get_frequent_cuda_kernel_sequences("aten::addmm", rank=1) on df_index_resolver.json.gz:
# count, "GPU kernel duration (us)", "CPU op duration (us)", in HTA's order
HTA_ADDMM = [(172, 31264, 18854), (72, 8967, 6928), (32, 2669, 3192), (20, 22848, 1928),
             (12, 6164, 1164)]
HTA_ADDMM_KERNELS = ["volta_sgemm_32x128_tn", "volta_sgemm_128x32_tn",
                     "volta_sgemm_128x32_sliced1x4_tn", "volta_sgemm_128x128_tn",
                     "volta_sgemm_128x64_tn"]
# get_gpu_user_annotation_breakdown(num_kernels=1000) on ns_resolution_trace:
# name -> (sum (us), count = sum / mean), use_gpu_annotation True and False
HTA_GPU_ANNOTATIONS = {"## backward ##": (81, 3), "DistributedDataParallel.forward": (123880, 4),
                       "Optimizer.step#SGD.step": (3334, 3)}
HTA_CPU_ANNOTATIONS = {
    "## backward ##": (184802, 4), "## forward ##": (107489, 4), "## optimizer ##": (3790, 4),
    "DistributedDataParallel.forward": (107037, 4), "Optimizer.step#SGD.step": (3668, 4),
    "Optimizer.zero_grad#SGD.zero_grad": (838, 4), "ProfilerStep#101": (35115, 1),
    "ProfilerStep#102": (72076, 1), "ProfilerStep#103": (95697, 1),
    "ProfilerStep#104": (95550, 1), "nccl:all_reduce": (446, 20), "nccl:broadcast": (148, 8)}


def test_frequent_kernel_sequences_reproduce_hta_on_its_window(con) -> None:
    got = con.execute("""
        WITH last AS (SELECT job, rank, max(cpu_start_ns) AS t FROM profiler_steps
                      GROUP BY job, rank),
        f AS (SELECT job, rank, pattern_rank, pattern, unnest(eids) AS eid
              FROM frequent_kernel_sequences('aten::addmm') WHERE job = 'dfidx')
        SELECT f.pattern_rank, any_value(f.pattern), count(*), sum(s.gpu_ns), sum(s.dur_ns)
        FROM f JOIN op_kernel_sequences s USING (job, rank, eid) JOIN last l USING (job, rank)
        WHERE s.ts_ns < l.t GROUP BY f.pattern_rank ORDER BY f.pattern_rank""").fetchall()
    assert [(n, gpu / 1000, cpu / 1000) for _, _, n, gpu, cpu in got] == HTA_ADDMM
    for (_, pattern, *_), k in zip(got, HTA_ADDMM_KERNELS, strict=True):
        assert pattern.startswith(f"aten::addmm|Memset (Device)|{k}|void epilogue::impl::")


def test_user_annotation_breakdown_reproduces_hta_on_its_window(con) -> None:
    ua = [e for e in raw("nsres") if e.get("cat") in ("gpu_user_annotation", "user_annotation")]
    last = max(e["ts_ns"] for e in ua if e["name"].startswith("ProfilerStep#"))
    for side, hta in (("gpu", HTA_GPU_ANNOTATIONS), ("cpu", HTA_CPU_ANNOTATIONS)):
        cat = "gpu_user_annotation" if side == "gpu" else "user_annotation"
        rows = {r[0]: r[1:] for r in con.execute(
            "SELECT name, count, total_ns FROM user_annotation_breakdown "
            "WHERE job = 'nsres' AND side = ?", [side]).fetchall()}
        for name, (sum_us, n) in hta.items():
            dropped = [e["dur_ns"] for e in ua
                       if e["cat"] == cat and e["name"] == name and e["ts_ns"] >= last]
            count, total = rows[name]
            assert count - len(dropped) == n, (side, name)
            # HTA reads ns traces rounded to us (PyTorch PR 122425): within 2 us per instance
            assert abs((total - sum(dropped)) / 1000 - sum_us) <= 2 * n, (side, name)


# get_memory_bw_summary(ranks=[0]) on negative_queue_length_values_check/rank0.json.gz:
# count, mean, std, min, 25%, 50%, 75%, max of memory_bw_gbps (as HTA prints them)
HTA_MEMORY_BW = {
    "DtoD": (912, 146.868819, 269.532964, 0.000641, 0.236601, 3.683453, 95.100990, 865.161716),
    "DtoH": (24, 0.124136, 0.122813, 0.001798, 0.008286, 0.080758, 0.259122, 0.333333),
    "HtoD": (64, 4.892028, 6.231704, 0.006309, 0.065309, 0.130279, 11.382923, 21.165501),
    "Memset": (200, 0.410212, 0.649649, 0.002688, 0.065599, 0.110392, 0.640026, 2.909091)}


def test_memory_bw_statistics_reproduce_hta_on_its_window(con) -> None:
    # memory_bw_summary's statistics, over the copies HTA keeps (launched before the last
    # ProfilerStep): HTA's table to the printed digits
    got = con.execute("""
        WITH last AS (SELECT job, rank, max(cpu_start_ns) AS t FROM profiler_steps
                      GROUP BY job, rank)
        SELECT c.direction, count(*), avg(c.bw_gbps), stddev_samp(c.bw_gbps), min(c.bw_gbps),
               quantile_cont(c.bw_gbps, 0.25), quantile_cont(c.bw_gbps, 0.5),
               quantile_cont(c.bw_gbps, 0.75), max(c.bw_gbps)
        FROM memory_copies c JOIN gpu_ops g USING (job, rank, eid) JOIN last l USING (job, rank)
        WHERE c.job = 'negq' AND g.launch_ts_ns < l.t
        GROUP BY c.direction""").fetchall()
    assert {r[0] for r in got} == set(HTA_MEMORY_BW)
    for d, n, *stats in got:
        assert n == HTA_MEMORY_BW[d][0]
        assert stats == pytest.approx(list(HTA_MEMORY_BW[d][1:]), rel=1e-6, abs=1e-6), d
    # and the view computes the same statistics over all the copies
    view = {r[0]: r[1:] for r in con.execute(
        "SELECT direction, count, mean_gbps, std_gbps, min_gbps, p25_gbps, p50_gbps, "
        "p75_gbps, max_gbps FROM memory_bw_summary WHERE job = 'negq'").fetchall()}
    full = {r[0]: r[1:] for r in con.execute(
        "SELECT direction, count(*), avg(bw_gbps), stddev_samp(bw_gbps), min(bw_gbps), "
        "quantile_cont(bw_gbps, 0.25), quantile_cont(bw_gbps, 0.5), "
        "quantile_cont(bw_gbps, 0.75), max(bw_gbps) FROM memory_copies WHERE job = 'negq' "
        "GROUP BY direction").fetchall()}
    assert sorted(view) == sorted(full)
    for d, row in view.items():
        assert row[0] == full[d][0] and row[1:] == pytest.approx(full[d][1:], rel=1e-12), d
