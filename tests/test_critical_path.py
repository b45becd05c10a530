"""Critical path (tracetool.analysis.critical_path) on real traces and one exact fixture.

Every multi-rank set of ../shared/traces (and the gloo sample of this repo) is ingested once per
session into a temporary store; the path of every step must be contiguous and cover the step
exactly. The HTA critical-path fixtures are compared with the numbers HTA 0.5.0 itself gives
(recorded below, see HTA_CASES), and the 8-rank DLRM job must cross ranks at a collective.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import duckdb
import numpy as np
import pytest

import tracetool
from tracetool.analysis.critical_path import (
    EDGE_KINDS,
    SEGMENT_KINDS,
    Slots,
    critical_path,
    critical_path_summary,
)
from tracetool.ingest.pipeline import Options, ingest

from ._util import SAMPLES, SHARED_TRACES, kineto_text, write

HTA_DATA = "facebookresearch__HolisticTraceAnalysis/tests/data"
HTA_CP = f"{HTA_DATA}/critical_path"
MULTI_RANK = {  # job -> directory holding one trace file per rank
    "dlrm": SHARED_TRACES / "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/"
                            "dlrm_kineto",
    "bert_ddp": SHARED_TRACES / "gaoteng-git__kineto/tb_plugin/test/data/tracing/"
                                "bert_newAPI_fp16_ddp",
    "trace_filter": SHARED_TRACES / HTA_DATA / "trace_filter",
    "gloo": SAMPLES,
}

# HTA 0.5.0's critical path of its own fixtures, recorded offline (the tests do not need HTA):
# in the venv benchmarks/hta_baseline.py makes (HolisticTraceAnalysis==0.5.0, pandas<3),
# `python benchmarks/critical_path.py --hta-reference` runs, for each case,
# TraceAnalysis(trace_dir).critical_path_analysis(rank=0, annotation, instance_id) with the
# annotation and instance HTA's tests/test_critical_path_analysis.py use, and prints: the
# first and last node of the path (eid, point), its time extent (last - first), the sum of its
# edge weights (HTA's total), the time its zero-weight edges span, the per-bound_by sums of
# get_critical_path_breakdown() and the events of its gpu_compute_bound edges. All in us.
HTA_CASES = {
    "simple_add": dict(
        dir="end_to_end/simple_add/input", first=(977, "start"), last=(1275, "end"),
        extent_us=242625, total_us=241724, zero_weight_us=901,
        bound_by_us={"cpu_bound": 241190, "gpu_compute_bound": 508,
                     "gpu_kernel_kernel_overhead": 9, "gpu_kernel_launch_overhead": 17},
        gpu_events=[1253, 1257, 1261, 1267, 1271, 1275]),
    "alexnet": dict(
        dir="alexnet", first=(1007, "start"), last=(1335, "end"),
        extent_us=36025, total_us=35834, zero_weight_us=191,
        bound_by_us={"cpu_bound": 32042, "gpu_compute_bound": 3712,
                     "gpu_kernel_kernel_overhead": 50, "gpu_kernel_launch_overhead": 30},
        gpu_events=[1089, 1105, 1109, 1161, 1165, 1169, 1181, 1185, 1193, 1197, 1201, 1213,
                    1217, 1225, 1229, 1233, 1245, 1249, 1257, 1261, 1265, 1269, 1273, 1279,
                    1291, 1295, 1299, 1305, 1313, 1317, 1321, 1327, 1331, 1335]),
    "cuda_event_sync": dict(
        dir="cuda_event_sync", first=(1, "start"), last=(47, "end"),
        extent_us=2523, total_us=2401, zero_weight_us=122,
        bound_by_us={"cpu_bound": 2335, "gpu_compute_bound": 38,
                     "gpu_kernel_launch_overhead": 28},
        gpu_events=[23, 33]),
    "cuda_event_sync_multi_stream": dict(
        dir="cuda_event_sync_multi_stream", first=(0, "start"), last=(90, "end"),
        extent_us=19917, total_us=1178, zero_weight_us=18739,
        bound_by_us={"cpu_bound": 1025, "gpu_compute_bound": 124,
                     "gpu_kernel_kernel_overhead": 15, "gpu_kernel_launch_overhead": 14},
        gpu_events=[84, 90]),
}
# Edges HTA's test asserts in its graph (its "SYNC_DEPENDENCY" edges), as (src, dst) points.
HTA_EDGES = {
    "simple_add": [((1275, "end"), (1281, "end"), "sync")],  # kernel -> cudaDeviceSynchronize
    "alexnet": [((1109, "end"), (1161, "start"), "stream_wait")],  # stream 20 -> stream 7
    "cuda_event_sync": [((33, "end"), (41, "end"), "sync"),  # -> cudaEventSynchronize
                        ((33, "end"), (51, "end"), "sync")],  # -> cudaDeviceSynchronize
    "cuda_event_sync_multi_stream": [((24, "end"), (84, "start"), "stream_wait")],
}

pytestmark = pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                                reason=f"real trace corpus not found at {SHARED_TRACES}")


@pytest.fixture(scope="session")
def con(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    """One store with every multi-rank set (one job each) and the HTA fixtures (rank 0)."""
    store = tmp_path_factory.mktemp("critical_path") / "store"
    for job, d in MULTI_RANK.items():
        res = ingest([d], Options(store=store, job=job, workers=2))
        assert len(res) >= 2 and all(r.status == "ingested" for r in res), res
    for job, case in HTA_CASES.items():
        path = next((SHARED_TRACES / HTA_CP / case["dir"]).glob("*.json.gz"))
        res = ingest([path], Options(store=store, job=job, rank=0, workers=2))
        assert res[0].status == "ingested", res[0].message
    return tracetool.connect(store)


@pytest.fixture(scope="session")
def paths(con: duckdb.DuckDBPyConnection) -> dict[str, list[dict]]:
    """The critical path of every complete step of each multi-rank job, as dict rows."""
    out = {}
    for job in MULTI_RANK:
        rel = critical_path(con, job)
        cols = [d[0] for d in rel.description]
        out[job] = [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]
    return out


def by_step(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(r["step"], []).append(r)
    return out


@pytest.mark.parametrize("job", list(MULTI_RANK))
def test_path_is_contiguous_and_covers_each_step(con, paths, job: str) -> None:
    steps = con.execute(
        """SELECT step, start_ns, end_ns, n_ranks FROM job_steps
           WHERE job = ? AND complete ORDER BY step""", [job]).fetchall()
    n_ranks = con.execute("SELECT count(DISTINCT rank) FROM trace_files WHERE job = ?",
                          [job]).fetchone()[0]
    assert n_ranks >= 2 and steps
    segs = by_step(paths[job])
    assert sorted(segs) == [s for s, *_ in steps]
    for step, start, end, _ in steps:
        s = segs[step]
        assert [r["seq"] for r in s] == list(range(len(s)))
        assert s[0]["start_ns"] == start and s[-1]["end_ns"] == end
        assert all(a["end_ns"] == b["start_ns"] for a, b in zip(s, s[1:], strict=False))
        assert all(r["dur_ns"] == r["end_ns"] - r["start_ns"] > 0 for r in s)
        assert sum(r["dur_ns"] for r in s) == end - start
        assert {r["kind"] for r in s} <= set(SEGMENT_KINDS)
        assert {r["edge_kind"] for r in s} <= set(EDGE_KINDS) | {"none"}
        assert all(r["rank"] is not None and r["track_kind"] in ("cpu_thread", "gpu_stream")
                   for r in s)
    # a segment attributed to an event lies inside it (waits may end it, e.g. a sync call)
    outside = con.execute(
        """SELECT count(*) FROM critical_path p JOIN events e
           ON e.job = p.job AND e.rank = p.rank AND e.eid = p.eid
           WHERE p.job = ? AND p.kind IN ('cpu', 'compute', 'memcpy', 'comm')
             AND NOT (e.ts_ns <= p.start_ns AND p.end_ns <= e.end_ns)""", [job]).fetchone()[0]
    assert outside == 0


@pytest.mark.parametrize("job", list(MULTI_RANK))
def test_rows_without_names_are_the_named_rows_less_name(con, job: str) -> None:
    """names=False (what the CLI's summary reads) gives the stored segments; the view adds
    each attributed event's name, the one ``events`` has, and nothing else."""
    bare = critical_path(con, job, names=False)
    named = critical_path(con, job)
    assert "name" not in bare.columns
    assert named.columns == [*bare.columns[:7], "name", *bare.columns[7:]]
    rows = named.fetchall()
    assert [r[:7] + r[8:] for r in rows] == bare.fetchall()
    assert sum(r[6] is not None for r in rows) > 0
    wrong = con.execute(
        """SELECT count(*) FROM critical_path p LEFT JOIN events e
           ON e.job = p.job AND e.rank = p.rank AND e.eid = p.eid
           WHERE p.job = ? AND p.name IS DISTINCT FROM e.name""", [job]).fetchone()[0]
    assert wrong == 0


@pytest.mark.parametrize("job", list(MULTI_RANK))
def test_summary_adds_up_to_the_step(con, job: str) -> None:
    steps = dict(con.execute("SELECT step, dur_ns FROM job_steps WHERE job = ? AND complete",
                             [job]).fetchall())
    for by in ("kind", "rank", "rank,kind"):
        rows = critical_path_summary(con, job, by=by).fetchall()
        total: dict[int, int] = {}
        share: dict[int, float] = {}
        for r in rows:
            total[r[1]] = total.get(r[1], 0) + r[-2]
            share[r[1]] = share.get(r[1], 0) + r[-1]
        assert total == steps
        assert all(abs(v - 1) < 1e-9 for v in share.values())


def test_dlrm_path_crosses_ranks_at_collectives(con, paths) -> None:
    """At a collective the path leaves the waiting rank for the rank that arrived last: the
    segment before the transfer is on that rank and ends when its kernel started."""
    segs = paths["dlrm"]
    assert len({r["rank"] for r in segs}) > 1
    last = {}  # call_index -> (last rank, its kernel start); DLRM records no seq
    for call, rank, ts in con.execute(
            """SELECT call_index, arg_max(rank, ts_ns), max(ts_ns) FROM collectives
               WHERE job = 'dlrm' AND kernel_eid IS NOT NULL GROUP BY call_index""").fetchall():
        last[call] = (rank, ts)
    kernel_call = {(r, k): c for r, k, c in con.execute(
        "SELECT rank, kernel_eid, call_index FROM collectives WHERE job = 'dlrm'").fetchall()}
    crossings = 0
    for before, seg in zip(segs, segs[1:], strict=False):
        if seg["edge_kind"] != "collective":
            continue
        assert seg["kind"] == "comm"
        l_rank, l_ts = last[kernel_call[(seg["rank"], seg["eid"])]]
        assert before["rank"] == l_rank != seg["rank"]
        assert seg["start_ns"] == before["end_ns"] == l_ts
        crossings += 1
    assert crossings >= 1


def test_gloo_path_runs_over_threads_and_gloo_spans(con, paths) -> None:
    gloo = {(r, e) for r, e in con.execute(
        "SELECT rank, gloo_eid FROM collectives WHERE job = 'gloo' AND gloo_eid IS NOT NULL"
    ).fetchall()}
    segs = paths["gloo"]
    comm = [r for r in segs if r["kind"] == "comm"]
    assert comm and all((r["rank"], r["eid"]) in gloo for r in comm)
    assert {r["track_kind"] for r in segs} == {"cpu_thread"}
    assert len({(r["rank"], r["track_id"]) for r in segs}) > 2  # main and gloo threads
    assert {"thread_wake", "comm_enqueue"} & {r["edge_kind"] for r in segs}


def test_a_cpu_only_job_has_no_launch_overhead(con, paths) -> None:
    """gloo hands a collective to its worker thread (comm_enqueue): a wait, not a launch
    (it was 4% launch_overhead of the sample's path)."""
    segs = paths["gloo"]
    assert not con.execute("SELECT count(*) FROM gpu_ops WHERE job = 'gloo'").fetchone()[0]
    assert "launch_overhead" not in {r["kind"] for r in segs}
    enqueue = [r for r in segs if r["edge_kind"] == "comm_enqueue"]
    assert enqueue and {r["kind"] for r in enqueue} == {"idle_wait"}


def test_event_waits_agree_with_the_inferred_nccl_waits(con) -> None:
    """bert_ddp (2021, no cuda_sync): each rank's 35 event record -> stream wait pairs give
    edges between the compute stream 7 and the NCCL stream 15 (32 into all-reduces, 3 out of
    them); 34 of them are exactly the edges comm_wait infers from c10d's pattern without
    reading the calls (the other: an all-reduce -> the first op launched after its wait,
    where comm_wait takes the first op to start after it)."""
    for rank in (0, 1):
        def edges(kind: str, rank: int = rank) -> set:
            return set(con.execute("""SELECT src_eid, dst_eid, lag_ns FROM rank_edges
                                      WHERE job = 'bert_ddp' AND rank = ? AND kind = ?""",
                                   [rank, kind]).fetchall())
        event, comm = edges("event_wait"), edges("comm_wait")
        assert (len(event), len(event & comm)) == (35, 34)
        assert con.execute("""
            SELECT s.stream, d.stream, count(*) FROM rank_edges e
            JOIN gpu_ops s ON s.job = e.job AND s.rank = e.rank AND s.eid = e.src_eid
            JOIN gpu_ops d ON d.job = e.job AND d.rank = e.rank AND d.eid = e.dst_eid
            WHERE e.job = 'bert_ddp' AND e.rank = ? AND e.kind = 'event_wait'
            GROUP BY ALL ORDER BY ALL""", [rank]).fetchall() == [(7, 15, 32), (15, 7, 3)]


@pytest.mark.parametrize("job", ["dlrm", "bert_ddp"])
def test_edges_are_causal(con, job: str) -> None:
    bad, n, kinds = con.execute(
        """SELECT count(*) FILTER (WHERE lag_ns < 0 OR lag_ns IS NULL), count(*),
                  list(DISTINCT kind::VARCHAR) FROM edges WHERE job = ?""", [job]).fetchone()
    assert n > 0 and bad == 0
    assert {"cpu_order", "gpu_order", "launch", "collective"} <= set(kinds)
    # lag_ns is the time between the two points (one join at a time: DuckDB estimates a
    # Parquet view's rows from its first file, and would join the two events sides first)
    con.execute("""CREATE OR REPLACE TEMP TABLE _e AS
        SELECT e.*, CASE WHEN e.src_point = 'start' THEN s.ts_ns ELSE s.end_ns END AS src_t
        FROM edges e JOIN events s ON s.job = e.job AND s.rank = e.rank_src
                                  AND s.eid = e.src_eid
        WHERE e.job = ?""", [job])
    assert con.execute("SELECT count(*) FROM _e").fetchone()[0] == n
    wrong = con.execute(
        """SELECT count(*) FROM _e e
           JOIN events d ON d.job = e.job AND d.rank = e.rank_dst AND d.eid = e.dst_eid
           WHERE e.lag_ns <> (CASE WHEN e.dst_point = 'start' THEN d.ts_ns ELSE d.end_ns END)
                             - e.src_t""").fetchone()[0]
    assert wrong == 0


def test_the_graph_is_stored_per_rank_at_ingest(con, tmp_path: Path) -> None:
    """Ingest stores each rank's graph (cp_nodes, rank_edges: every kind but the cross-rank
    'collective'); the view edges adds the collective edges; a second ingest of the same
    files stores the same graph, row for row (ties between points at one instant are broken
    by eid, not by DuckDB's whim)."""
    job = "dlrm"
    per_rank = dict(con.execute(
        """SELECT rank, count(*) FROM rank_edges WHERE job = ? GROUP BY rank""",
        [job]).fetchall())
    ranks = [r for (r,) in con.execute(
        "SELECT rank FROM trace_files WHERE job = ? ORDER BY rank", [job]).fetchall()]
    assert sorted(per_rank) == ranks == list(range(8)) and min(per_rank.values()) > 1000
    stored_kinds = {k for (k,) in con.execute(
        "SELECT DISTINCT kind FROM rank_edges WHERE job = ?", [job]).fetchall()}
    assert "collective" not in stored_kinds and {"cpu_order", "gpu_order"} <= stored_kinds
    n_edges, n_coll, n_cross = con.execute(
        """SELECT count(*), count(*) FILTER (WHERE kind = 'collective'),
                  count(*) FILTER (WHERE rank_src <> rank_dst)
           FROM edges WHERE job = ?""", [job]).fetchone()
    assert n_edges == sum(per_rank.values()) + n_coll and n_coll == n_cross > 0
    # the same files again, into another store: the same tables
    again = tmp_path / "store"
    assert all(r.status == "ingested"
               for r in ingest([MULTI_RANK[job]], Options(store=again, job=job, workers=1)))
    con2 = tracetool.connect(again)
    for table in ("cp_nodes", "rank_edges"):
        q = f"SELECT * FROM {table} WHERE job = ? ORDER BY ALL"
        assert con.execute(q, [job]).fetchall() == con2.execute(q, [job]).fetchall()


def test_recomputing_gives_the_same_path(con, paths) -> None:
    again = critical_path(con, "bert_ddp").fetchall()
    assert [tuple(r.values()) for r in paths["bert_ddp"]] == again


# --------------------------------------------------------------------------- HTA fixtures


def _point_ns(con: duckdb.DuckDBPyConnection, job: str, eid: int, point: str) -> int:
    col = "ts_ns" if point == "start" else "end_ns"
    return con.execute(f"SELECT {col} FROM events WHERE job = ? AND eid = ?",
                       [job, eid]).fetchone()[0]


@pytest.mark.parametrize("job", list(HTA_CASES))
def test_hta_case_same_total_and_split(con, job: str) -> None:
    """Over the span of HTA's path, our path has HTA's total plus the time HTA's zero-weight
    edges skip, the same GPU compute, launch and kernel-kernel time, and the same kernels."""
    c = HTA_CASES[job]
    start, end = _point_ns(con, job, *c["first"]), _point_ns(con, job, *c["last"])
    assert end - start == c["extent_us"] * 1000 == (c["total_us"] + c["zero_weight_us"]) * 1000
    rows = critical_path(con, job, window=(start, end)).fetchall()
    cols = [d[0] for d in con.sql("SELECT * FROM critical_path LIMIT 0").description]
    segs = [dict(zip(cols, r, strict=True)) for r in rows]
    assert segs[0]["start_ns"] == start and segs[-1]["end_ns"] == end
    assert all(a["end_ns"] == b["start_ns"] for a, b in zip(segs, segs[1:], strict=False))

    def us(pred) -> int:  # noqa: ANN001
        ns = sum(r["dur_ns"] for r in segs if pred(r))
        assert ns % 1000 == 0  # these traces have us resolution
        return ns // 1000

    hta = c["bound_by_us"]
    gpu_kk = us(lambda r: r["kind"] == "idle_wait" and r["edge_kind"] == "gpu_order")
    assert us(lambda r: r["kind"] in ("compute", "memcpy")) == hta["gpu_compute_bound"]
    assert us(lambda r: r["kind"] == "launch_overhead") == hta["gpu_kernel_launch_overhead"]
    assert gpu_kk == hta.get("gpu_kernel_kernel_overhead", 0)
    # the rest is HTA's cpu_bound plus what its zero-weight edges (waits, gaps between
    # top-level ops) leave out of its total
    assert us(lambda r: r["kind"] in ("cpu", "idle_wait")) - gpu_kk \
        == hta["cpu_bound"] + c["zero_weight_us"]
    assert sorted({r["eid"] for r in segs if r["kind"] in ("compute", "memcpy")}) \
        == c["gpu_events"]


@pytest.mark.parametrize("job", list(HTA_EDGES))
def test_hta_case_sync_edges(con, job: str) -> None:
    have = set(con.execute(
        """SELECT src_eid, src_point::VARCHAR, dst_eid, dst_point::VARCHAR, kind::VARCHAR
           FROM edges WHERE job = ?""", [job]).fetchall())
    for (se, sp), (de, dp), kind in HTA_EDGES[job]:
        assert (se, sp, de, dp, kind) in have


# --------------------------------------------------------------------------- exact fixture


def _x(name: str, ts: int, dur: int, cat: str, pid: int, tid: int, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def test_two_rank_fixture_exact_segments(tmp_path: Path) -> None:
    """Rank 1 arrives late at an all-reduce that rank 0 waits for with cudaDeviceSynchronize:
    the path runs rank 1's CPU op and launch, then the transfer and the sync on rank 0."""
    ranks = {
        0: [_x("ProfilerStep#1", 0, 200, "user_annotation", 1, 1),
            _x("cudaLaunchKernel", 10, 2, "cuda_runtime", 1, 1, correlation=1),
            _x("ncclKernel_AllReduce_RING_LL_Sum_float", 20, 130, "kernel", 0, 20,
               correlation=1, device=0, stream=20),
            _x("cudaDeviceSynchronize", 30, 130, "cuda_runtime", 1, 1, correlation=2)],
        1: [_x("ProfilerStep#1", 0, 199, "user_annotation", 1, 1),
            _x("aten::mm", 5, 83, "cpu_op", 1, 1),
            _x("cudaLaunchKernel", 90, 2, "cuda_runtime", 1, 1, correlation=1),
            _x("ncclKernel_AllReduce_RING_LL_Sum_float", 100, 50, "kernel", 0, 20,
               correlation=1, device=0, stream=20),
            _x("cudaDeviceSynchronize", 95, 60, "cuda_runtime", 1, 1, correlation=2)],
    }
    d = tmp_path / "job"
    d.mkdir()
    for r, evs in ranks.items():
        write(d / f"rank{r}.json", kineto_text(evs, rank=r))
    store = tmp_path / "store"
    assert all(x.status == "ingested" for x in ingest([d], Options(store=store, job="j")))
    con = tracetool.connect(store)
    got = [r[:4] for r in critical_path(con, "j", 1).query(
        "p", "SELECT rank, name, kind, edge_kind, start_ns, end_ns FROM p").fetchall()]
    us = [(r, s // 1000, e // 1000) for r, *_, s, e in critical_path(con, "j", 1).query(
        "p", "SELECT rank, start_ns, end_ns FROM p").fetchall()]
    assert got == [
        (1, "ProfilerStep#1", "cpu", "cpu_order"),
        (1, "aten::mm", "cpu", "cpu_order"),
        (1, "ProfilerStep#1", "cpu", "cpu_order"),
        (1, "ncclKernel_AllReduce_RING_LL_Sum_float", "launch_overhead", "launch"),
        (0, "ncclKernel_AllReduce_RING_LL_Sum_float", "comm", "collective"),
        (0, "cudaDeviceSynchronize", "idle_wait", "sync"),
        (0, "ProfilerStep#1", "cpu", "cpu_order"),
    ]
    assert us == [(1, 0, 5), (1, 5, 88), (1, 88, 90), (1, 90, 100), (0, 100, 150),
                  (0, 150, 160), (0, 160, 200)]
    by_rank = dict(critical_path_summary(con, "j", 1, by="rank").query(
        "s", "SELECT rank, dur_ns FROM s").fetchall())
    assert by_rank == {0: 100_000, 1: 100_000}


def test_critical_path_cli_json_and_chrome_trace(tmp_path: Path) -> None:
    """The CLI on the sample gloo job: per-step summary adding up to the step window, and a
    Chrome trace that is valid JSON with every segment and a flow arrow between each pair."""
    import json
    import subprocess
    import sys

    from tests._util import SAMPLES

    store = tmp_path / "store"
    r = subprocess.run([sys.executable, "-m", "tracetool", "ingest", str(SAMPLES), "--store",
                        str(store)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "path.json"
    r = subprocess.run([sys.executable, "-m", "tracetool", "critical-path", str(store),
                        "--json", "--chrome-trace", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [s["step"] for s in rep["steps"]] == [2, 3, 4]
    for s in rep["steps"]:
        assert sum(s["by_kind"].values()) == s["dur_ns"] == sum(s["by_rank"].values())
    doc = json.loads(out.read_text())
    evs = doc["traceEvents"]
    segs = [e for e in evs if e.get("cat") == "critical_path" and e["ph"] == "X"]
    assert len(segs) == sum(s["segments"] for s in rep["steps"])
    starts = [e for e in evs if e["ph"] == "s"]
    assert len(starts) == len(segs) - len(rep["steps"])  # one arrow between neighbours
    assert {e["pid"] for e in segs} <= {0, 1}
    assert rep["chrome_trace"]["events"] == len(evs)
    # every slice and arrow against the path computed here, row by row (times: us from the
    # path's start, exact to the ns)
    con = tracetool.connect(store)
    rel = critical_path(con, rep["job"])
    rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    t0 = min(r["start_ns"] for r in rows)
    assert [(e["name"], e["pid"], round(e["ts"] * 1000), round(e["dur"] * 1000),
             e["args"]) for e in segs] == [
        (f"{r['kind']}: {r['name']}" if r["name"] else r["kind"], r["rank"],
         r["start_ns"] - t0, r["dur_ns"],
         {k: r[k] for k in ("step", "seq", "eid", "track_id", "edge_kind")}) for r in rows]
    pairs = [(i, a, b) for i, (a, b) in enumerate(itertools.pairwise(rows))
             if a["step"] == b["step"]]
    ends = [e for e in evs if e["ph"] == "f"]
    assert [(e["id"], e["pid"], round(e["ts"] * 1000)) for e in starts] == [
        (i, a["rank"], a["start_ns"] - t0) for i, a, _ in pairs]
    assert [(e["id"], e["pid"], round(e["ts"] * 1000)) for e in ends] == [
        (i, b["rank"], b["start_ns"] - t0) for i, _, b in pairs]
    con.close()
    # a step the job does not have: one line, exit 2
    r = subprocess.run([sys.executable, "-m", "tracetool", "critical-path", str(store),
                        "--step", "99"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "ProfilerStep#99" in r.stderr


def test_a_one_rank_job_reads_only_its_intra_rank_edges(tmp_path: Path) -> None:
    """critical-path on a job of one rank reads ``intra_rank_edges``, and skips the matching
    of collectives behind ``collective_edges`` and the warnings: with one rank there is no
    edge between ranks to find, and no group of two ranks to disagree."""
    from tracetool.analysis.collectives import collective_warnings

    one = next(MULTI_RANK["dlrm"].glob("worker3_*.json"))
    store = tmp_path / "store"
    assert ingest([one], Options(store=store, job="r3"))[0].status == "ingested"
    c = tracetool.connect(store)
    n = {v: c.execute(f"SELECT count(*) FROM {v} WHERE job = 'r3'").fetchone()[0]
         for v in ("edges", "intra_rank_edges", "collective_edges", "collective_matching",
                   "collective_instances")}
    assert n["edges"] == n["intra_rank_edges"] > 5000 and n["collective_edges"] == 0
    assert n["collective_instances"] == 8  # it has collectives: only no second rank
    assert collective_warnings(c, "r3") == []
    segs = critical_path(c, "r3").fetchall()
    assert len(segs) > 100 and {s[3] for s in segs} == {3}  # rank 3 only


@pytest.mark.parametrize("ranks", [[0, 1, 5, 1023], [7], [3, 2**30]])
def test_slots_number_events_densely_by_rank_then_eid(ranks: list[int]) -> None:
    """slot = (events of the ranks before) + eid, whether ranks are looked up in a table
    (compact rank numbers) or by binary search (a rank number too large for a table)."""
    rng = np.random.default_rng(7)
    rank = rng.choice(ranks, 5000)
    eid = rng.integers(0, 300, 5000)
    slots = Slots.of(rank, eid)
    assert (slots.lut is not None) == (max(ranks) < Slots.LUT_MOST)
    size = {r: int(eid[rank == r].max()) + 1 for r in sorted(set(rank.tolist()))}
    before = {r: sum(n for q, n in size.items() if q < r) for r in size}
    assert slots(rank, eid).tolist() == [before[r] + e for r, e in zip(rank.tolist(),
                                                                        eid.tolist(), strict=True)]
    assert slots.n == sum(size.values())
