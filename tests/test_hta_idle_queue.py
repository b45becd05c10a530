"""HTA's idle time breakdown and launch-queue analyses (analysis/sql/60_idle_queue.sql), on
real traces, checked against an independent computation from the raw trace JSON."""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import SHARED_TRACES, independent_steps

DLRM = "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
# HTA's own queue-length fixture: 5 steps, cudaGraphLaunch, GPU ops without a launch call,
# and a stream whose queue reaches 994
NQ = ("facebookresearch__HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/"
      "rank0.json.gz")
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
LAUNCH_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}
KERNEL_WAIT_NS = 30_000  # HTA's consecutive_kernel_delay = 30 (trace us)
STORED_PH = {"X", "i", "I", "R", "b", "n", "e"}

pytestmark = pytest.mark.skipif(not (SHARED_TRACES / DLRM).is_dir()
                                or not (SHARED_TRACES / NQ).is_file(),
                                reason=f"real trace corpus not found at {SHARED_TRACES}")


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    s = tmp_path_factory.mktemp("idle_queue") / "store"
    r = ingest([SHARED_TRACES / DLRM], Options(store=s, job="dlrm", workers=2))
    assert [x.status for x in r] == ["ingested"] * 8
    r = ingest([SHARED_TRACES / NQ], Options(store=s, job="nq", rank=0, workers=2))
    assert r[0].status == "ingested", r[0].message
    return tracetool.connect(s)


def _us(v: object) -> int:
    return int(Decimal(str(v)) * 1000)


class Raw:
    """What the analyses need from one trace file, read from its JSON alone."""

    def __init__(self, path: Path) -> None:
        text = (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")).read()
        doc = json.loads(text, strict=False, parse_float=Decimal)
        evs = doc["traceEvents"] if isinstance(doc, dict) else doc
        base = int(doc.get("baseTimeNanoseconds", 0)) if isinstance(doc, dict) else 0
        self.rank = int(doc.get("distributedInfo", {}).get("rank", 0))
        launches: dict[int, int] = {}
        self.ops: list[dict] = []  # GPU ops: ts, end, device, stream, eid, corr, pid
        self.steps: dict[int, tuple[int, int]] = {}
        self.marks: dict[int, tuple[int, object]] = {}
        starts = []
        for i, e in enumerate(evs):
            if e.get("ph") in STORED_PH and "ts" in e:
                starts.append(base + _us(e["ts"]))
            if e.get("ph") != "X" or "ts" not in e:
                continue
            cat, name, args = e.get("cat"), e.get("name") or "", e.get("args") or {}
            ts = base + _us(e["ts"])
            end = ts + _us(e.get("dur", 0))
            m = re.fullmatch(r"ProfilerStep#(\d+)", name)
            if m and cat in ("user_annotation", "Operator", "cpu_op"):
                self.steps.setdefault(int(m.group(1)), (ts, end))
            if m and cat == "gpu_user_annotation":
                self.marks.setdefault(int(m.group(1)), (ts, e.get("pid")))
            if cat in LAUNCH_CATS and "correlation" in args:
                launches.setdefault(args["correlation"], ts)
            if cat in GPU_CATS:
                self.ops.append({"ts": ts, "end": end, "eid": i,
                                 "device": int(args.get("device", e.get("pid"))),
                                 "stream": int(args.get("stream", e.get("tid"))),
                                 "corr": args.get("correlation"), "pid": e.get("pid")})
        for o in self.ops:
            o["launch"] = launches.get(o["corr"])
        self.span = max(starts) - min(starts)

    def streams(self) -> dict[tuple[int, int], list[dict]]:
        out: dict[tuple[int, int], list[dict]] = defaultdict(list)
        for o in sorted(self.ops, key=lambda o: (o["ts"], o["eid"])):
            out[(o["device"], o["stream"])].append(o)
        return out

    def gaps(self) -> list[tuple]:
        """(device, stream, start, end, category, eid) per idle gap, by HTA's rules."""
        out = []
        for key, ops in self.streams().items():
            prev_end = None
            for o in ops:
                if prev_end is not None and o["ts"] > prev_end:
                    if o["launch"] is not None and o["launch"] > prev_end:
                        cat = "host_wait"
                    elif o["ts"] - prev_end < KERNEL_WAIT_NS:
                        cat = "kernel_wait"
                    else:
                        cat = "other"
                    out.append((*key, prev_end, o["ts"], cat, o["eid"]))
                prev_end = o["end"] if prev_end is None else max(prev_end, o["end"])
        return out

    def tiles(self) -> dict[int, tuple[int, int]]:
        gpu = [(o["ts"], o["end"], None, o["corr"], o["pid"]) for o in self.ops]
        launched = {n: [g for g, o in zip(gpu, self.ops, strict=True)
                        if cs <= (o["launch"] if o["launch"] is not None else o["ts"]) < ce]
                    for n, (cs, ce) in self.steps.items()}
        return independent_steps(self.steps, launched, self.marks, gpu)

    def queue(self) -> dict[tuple[int, int], list[tuple]]:
        """Per stream: (ts, event, eid, queue_length, in_flight) in order."""
        out = {}
        for key, ops in self.streams().items():
            pts = []
            for o in ops:
                if o["launch"] is None:
                    continue
                pts += [(o["launch"], 0, o["eid"], 1, 1), (o["ts"], 1, o["eid"], -1, 0),
                        (o["end"], 2, o["eid"], 0, -1)]
            q = f = 0
            rows = []
            for ts, k, eid, dq, df in sorted(pts):
                q, f = q + dq, f + df
                rows.append((ts, ("launch", "start", "end")[k], eid, q, f))
            if rows:
                out[key] = rows
        return out


@pytest.fixture(scope="module")
def raws() -> dict[str, list[Raw]]:
    return {"dlrm": [Raw(p) for p in sorted((SHARED_TRACES / DLRM).glob("*.json"))],
            "nq": [Raw(SHARED_TRACES / NQ)]}


def _each(raws: dict[str, list[Raw]]):
    for job, rs in raws.items():
        for r in rs:
            yield job, r


def test_raw_reading_sees_the_stores_gpu_ops(con, raws) -> None:
    for job, r in _each(raws):
        got = con.execute("SELECT count(*), count(launch_eid) FROM gpu_ops "
                          "WHERE job = ? AND rank = ?", [job, r.rank]).fetchone()
        assert got == (len(r.ops), sum(o["launch"] is not None for o in r.ops))


def test_stream_idle_matches_the_raw_trace(con, raws) -> None:
    n = defaultdict(int)
    for job, r in _each(raws):
        want = sorted((d, s, a, b, c, e) for d, s, a, b, c, e in r.gaps())
        got = con.execute("SELECT device, stream, start_ns, end_ns, category, eid "
                          "FROM stream_idle WHERE job = ? AND rank = ? ORDER BY ALL",
                          [job, r.rank]).fetchall()
        assert got == want, (job, r.rank)
        for g in want:
            n[g[4]] += 1
    # all three categories occur on these traces
    assert min(n.values()) > 10 and len(n) == 3, n
    assert con.execute("SELECT count(*) FROM stream_idle WHERE gap_ns <= 0 "
                       "OR gap_ns <> end_ns - start_ns").fetchone() == (0,)


def test_stream_idle_rank_matches_the_raw_trace(con, raws) -> None:
    for job, r in _each(raws):
        want = {}
        streams = r.streams()
        for key, ops in streams.items():
            span = max(o["end"] for o in ops) - min(o["ts"] for o in ops)
            want[key] = {"n_ops": len(ops), "span_ns": span, "idle_ns": 0, "n_gaps": 0,
                         **{f"{c}_ns": 0 for c in ("host_wait", "kernel_wait", "other")},
                         **{f"n_{c}": 0 for c in ("host_wait", "kernel_wait", "other")}}
        for d, s, a, b, c, _ in r.gaps():
            w = want[(d, s)]
            w["idle_ns"] += b - a
            w[f"{c}_ns"] += b - a
            w["n_gaps"] += 1
            w[f"n_{c}"] += 1
        cols = ["n_ops", "span_ns", "idle_ns", "n_gaps", "host_wait_ns", "kernel_wait_ns",
                "other_ns", "n_host_wait", "n_kernel_wait", "n_other"]
        rows = con.execute(f"SELECT device, stream, {', '.join(cols)}, busy_ns, "
                           "host_wait_ratio, kernel_wait_ratio, other_ratio FROM "
                           "stream_idle_rank WHERE job = ? AND rank = ?",
                           [job, r.rank]).fetchall()
        assert {(x[0], x[1]) for x in rows} == set(want)
        for x in rows:
            w = want[(x[0], x[1])]
            assert dict(zip(cols, x[2:12], strict=True)) == {c: w[c] for c in cols}
            # invariants: the categories add up; idle = span - union of the stream's ops
            assert x[6] + x[7] + x[8] == x[4]
            ops = streams[(x[0], x[1])]
            union, cur_s, cur_e = 0, None, None
            for o in ops:
                if cur_e is None or o["ts"] > cur_e:
                    union += 0 if cur_e is None else cur_e - cur_s
                    cur_s, cur_e = o["ts"], o["end"]
                else:
                    cur_e = max(cur_e, o["end"])
            union += cur_e - cur_s
            assert x[12] == union == w["span_ns"] - w["idle_ns"]
            if w["idle_ns"]:
                assert math.isclose(x[13] + x[14] + x[15], 1.0)


def test_stream_idle_breakdown_per_step_matches_the_raw_trace(con, raws) -> None:
    n_steps = 0
    for job, r in _each(raws):
        tiles = r.tiles()
        got_tiles = dict((s, (a, b)) for s, a, b in con.execute(
            "SELECT step, start_ns, end_ns FROM steps WHERE job = ? AND rank = ?",
            [job, r.rank]).fetchall())
        assert got_tiles == tiles
        want: dict[tuple, dict[str, int]] = {}
        for d, s, a, b, c, _ in r.gaps():
            for step, (ts, te) in tiles.items():
                if a < te and b > ts:
                    w = want.setdefault((d, s, step), defaultdict(int))
                    ns = min(b, te) - max(a, ts)
                    w["idle_ns"] += ns
                    w[f"{c}_ns"] += ns
                    w["n_gaps"] += 1
                    w[f"n_{c}"] += 1
        cols = ["idle_ns", "host_wait_ns", "kernel_wait_ns", "other_ns", "n_gaps",
                "n_host_wait", "n_kernel_wait", "n_other"]
        rows = con.execute(f"SELECT device, stream, step, {', '.join(cols)}, step_dur_ns "
                           "FROM stream_idle_breakdown WHERE job = ? AND rank = ?",
                           [job, r.rank]).fetchall()
        assert {x[:3] for x in rows} == set(want)
        for x in rows:
            w = want[x[:3]]
            assert dict(zip(cols, x[3:11], strict=True)) == {c: w[c] for c in cols}
            assert x[4] + x[5] + x[6] == x[3] <= x[11]  # the categories add up, within the step
        n_steps += len(tiles)
    assert n_steps == 8 + 5
    # summed over the steps, no more than the whole trace's idle time per stream
    bad = con.execute("""
        SELECT count(*) FROM (SELECT job, rank, device, stream, sum(idle_ns) AS s
                              FROM stream_idle_breakdown GROUP BY ALL) b
        JOIN stream_idle_rank r USING (job, rank, device, stream) WHERE b.s > r.idle_ns
    """).fetchone()
    assert bad == (0,)


def test_stream_queue_length_matches_the_raw_trace(con, raws) -> None:
    for job, r in _each(raws):
        want = r.queue()
        got = defaultdict(list)
        for d, s, *row in con.execute(
                "SELECT device, stream, ts_ns, event, eid, queue_length, in_flight "
                "FROM stream_queue_length WHERE job = ? AND rank = ? "
                "ORDER BY device, stream, ts_ns, CASE event WHEN 'launch' THEN 0 "
                "WHEN 'start' THEN 1 ELSE 2 END, eid", [job, r.rank]).fetchall():
            got[(d, s)].append(tuple(row))
        assert dict(got) == want, (job, r.rank)
    # never negative (HTA's test on this fixture), in_flight >= queue_length, all drained
    assert con.execute("SELECT count(*) FROM stream_queue_length WHERE queue_length < 0 "
                       "OR in_flight < queue_length").fetchone() == (0,)
    assert con.execute("SELECT max(queue_length) FROM stream_queue_length "
                       "WHERE job = 'nq'").fetchone() == (994,)


def _quantile(xs: list[int], p: float) -> float:  # pandas' linear interpolation
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def test_stream_queue_summary_matches_the_raw_trace(con, raws) -> None:
    for job, r in _each(raws):
        for (d, s), rows in r.queue().items():
            pts = [x for x in rows if x[1] != "end"]
            qs = [x[3] for x in pts]
            holds = [(b[0] - a[0]) * a[3] for a, b in zip(pts, pts[1:], strict=False)]
            span = pts[-1][0] - pts[0][0]
            got = con.execute(
                "SELECT n_ops, n_points, min_length, max_length, mean_length, std_length, "
                "p25_length, p50_length, p75_length, time_weighted_mean, max_in_flight, "
                "first_ns, last_ns FROM stream_queue_summary "
                "WHERE job = ? AND rank = ? AND device = ? AND stream = ?",
                [job, r.rank, d, s]).fetchone()
            assert got[:4] == (len(pts) // 2, len(pts), min(qs), max(qs))
            assert got[10:] == (max(x[4] for x in rows), pts[0][0], pts[-1][0])
            assert math.isclose(got[4], statistics.mean(qs))
            if len(qs) > 1:
                assert math.isclose(got[5], statistics.stdev(qs))
            for v, p in zip(got[6:9], (0.25, 0.5, 0.75), strict=True):
                assert math.isclose(v, _quantile(qs, p))
            if span:
                assert math.isclose(got[9], sum(holds) / span)
    n = con.execute("SELECT count(*) FROM stream_queue_summary").fetchone()[0]
    assert n == sum(len(r.queue()) for _, r in _each(raws))


def _full(rows: list[tuple], limit: int) -> tuple[int, int]:
    pts = [x for x in rows if x[1] != "end"]
    full = [(b[0] - a[0], 1) for a, b in zip(pts, pts[1:], strict=False) if a[3] >= limit]
    if pts[-1][3] >= limit:  # the last point holds no time (it is the last start: 0)
        full.append((0, 1))
    return sum(x for x, _ in full), len(full)


def test_stream_queue_full_matches_the_raw_trace(con, raws) -> None:
    for limit in (1024, 900, 10):
        for job, r in _each(raws):
            for (d, s), rows in r.queue().items():
                sql = ("SELECT full_ns, n_full, trace_span_ns, full_ratio, max_queue_length "
                       + ("FROM stream_queue_full " if limit == 1024 else
                          f"FROM stream_queue_full_at({limit}) ")
                       + "WHERE job = ? AND rank = ? AND device = ? AND stream = ?")
                got = con.execute(sql, [job, r.rank, d, s]).fetchone()
                full_ns, n_full = _full(rows, limit)
                assert got[:3] == (full_ns, n_full, r.span) and got[4] == limit
                assert math.isclose(got[3], full_ns / r.span)
    # the real CUDA limit is never reached here; 900 on the fixture's busiest stream is
    assert con.execute("SELECT sum(full_ns) FROM stream_queue_full").fetchone() == (0,)
    assert con.execute("SELECT stream, full_ns FROM stream_queue_full_at(900) "
                       "WHERE full_ns > 0").fetchall() == [(7, 112_492_000)]


# HTA 0.5.0 (pip holistictraceanalysis) run on the DLRM 8 ranks: get_idle_time_breakdown(ranks=
# range(8)) idle_time (us) per (rank, stream): host_wait, kernel_wait, other. HTA's own tests
# assert numbers only for its vision_transformer traces, which the corpus does not hold (LFS).
HTA_DLRM_IDLE_US = {
    (0, 7): (11448, 123, 0), (0, 22): (145, 0, 0), (0, 24): (5906, 18, 0), (0, 84): (4740, 3, 0),
    (1, 7): (17449, 115, 0), (1, 22): (154, 0, 0), (1, 24): (11382, 12, 0),
    (1, 84): (4688, 3, 0), (2, 7): (9777, 105, 0), (2, 22): (142, 0, 0), (2, 24): (4270, 23, 0),
    (2, 84): (5423, 1, 0), (3, 7): (17548, 109, 0), (3, 22): (187, 0, 0),
    (3, 24): (10146, 5, 0), (3, 84): (4746, 3, 0), (4, 7): (14956, 113, 0), (4, 22): (151, 0, 0),
    (4, 24): (8613, 18, 0), (4, 84): (6691, 2, 0), (5, 7): (14874, 76, 0), (5, 22): (148, 0, 0),
    (5, 24): (8419, 13, 0), (5, 84): (6821, 1, 0), (6, 7): (9850, 100, 0), (6, 22): (140, 0, 0),
    (6, 24): (4261, 16, 0), (6, 84): (5346, 9, 0), (7, 7): (9405, 98, 0), (7, 22): (141, 0, 0),
    (7, 24): (3936, 12, 0), (7, 84): (6658, 0, 0)}
# get_queue_length_summary: count and max on stream 7 per rank; streams 22, 24, 84 have count
# 10, 46, 16 on every rank and min/25%/50%/75%/max 0/0/0.5/1/1; stream 7: 0/0/1/1/max.
HTA_DLRM_QUEUE_7 = {0: (450, 25), 1: (452, 26), 2: (452, 25), 3: (474, 20), 4: (474, 6),
                    5: (450, 6), 6: (452, 24), 7: (452, 19)}


def test_agrees_with_hta_on_dlrm(con) -> None:
    rows = con.execute("SELECT rank, stream, host_wait_ns, kernel_wait_ns, other_ns "
                       "FROM stream_idle_rank WHERE job = 'dlrm'").fetchall()
    assert {(r, s) for r, s, *_ in rows} == set(HTA_DLRM_IDLE_US)
    # HTA joins a GPU op without a launch call (correlation 0) to trace event 0, whose ts
    # lies after it, and so calls the gap before it host wait; we call it kernel wait or
    # other (no launch, so no host wait). Move those gaps back and the numbers are HTA's.
    moved = dict(((r, s, c), ns) for r, s, c, ns in con.execute("""
        SELECT i.rank, i.stream, i.category, sum(i.gap_ns)::BIGINT FROM stream_idle i
        JOIN gpu_ops g ON g.job = i.job AND g.rank = i.rank AND g.eid = i.eid
        WHERE i.job = 'dlrm' AND g.launch_eid IS NULL GROUP BY ALL""").fetchall())
    n_moved = 0
    for r, s, hw, kw, ot in rows:
        mk, mo = moved.get((r, s, "kernel_wait"), 0), moved.get((r, s, "other"), 0)
        n_moved += mk + mo > 0
        assert ((hw + mk + mo) // 1000, (kw - mk) // 1000, (ot - mo) // 1000) \
            == HTA_DLRM_IDLE_US[(r, s)], (r, s)
        assert (hw + mk + mo) % 1000 == 0  # integer-us trace: exact
    assert n_moved == 2  # ranks 1 and 3, stream 7; the other 30 streams agree as they are
    for (r, s, *v) in con.execute(
            "SELECT rank, stream, n_points, min_length, p25_length, p50_length, p75_length, "
            "max_length FROM stream_queue_summary WHERE job = 'dlrm'").fetchall():
        if s == 7:
            n, top = HTA_DLRM_QUEUE_7[r]
            assert tuple(v) == (n, 0, 0, 1, 1, top)
        else:
            assert tuple(v) == ({22: 10, 24: 46, 84: 16}[s], 0, 0, 0.5, 1, 1)
