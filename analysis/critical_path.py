"""Critical path of a training step across threads, streams and ranks (issue 3).

The question it answers: which chain of work decided when the step ended? The model is HTA's
(``hta/analyzers/critical_path_analysis.py``): nodes are the start and end points of events
(CPU ops, annotations and runtime calls on CPU threads; kernels, copies and memsets on GPU
streams), and an edge ``src -> dst`` says "dst could not happen before src". Each rank's
graph is built once at ingest (store tables cp_nodes and rank_edges, ``tracetool.ingest.graph``);
the view ``edges`` adds the collective edges between ranks (analysis/sql/50_graph.sql), and
``critical_path`` walks them backwards from the step's end.

Why a backward walk over "binding" edges rather than HTA's longest path: every edge's
``lag_ns`` is the time between its two points, so every path between two nodes has the same
length and a longest path is not informative. What matters is, at each node, which of its
dependencies was satisfied last: that one held the node back (the "last-arriving" edge, as
in Perfetto's scheduler critical path and in Lumos). Choosing it is one minimum of lag per
node over all edges (vectorised); the walk then follows one pointer per node, so the chain
of segments is contiguous by construction and covers the step from its start to its end:
``seg[i].end_ns == seg[i+1].start_ns``, first start = step start, last end = step end.

Cross-rank: a collective's transfer ends on every rank only after the last rank arrived
(view collective_edges), so the path crosses to the last-arriving rank there. See
docs/critical_path.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from tracetool.analysis.windows import no_complete_steps
from tracetool.graph import (
    CLASSES,
    EDGE_KINDS,
    EVENT_RECORD_CALLS,
    KIND_NAMES,
    REPLAY_ONLY_KINDS,
    STREAM_WAIT_CALLS,
)

__all__ = ["CLASSES", "EDGE_KINDS", "SEGMENT_KINDS", "critical_path", "critical_path_summary",
           "unexplained_gap_warning", "unresolved_stream_wait_warning"]

# Segment kinds of the path.
SEGMENT_KINDS = ("compute", "comm", "memcpy", "launch_overhead", "cpu", "idle_wait",
                 "unexplained_gap")

# Unexplained gaps are the waits of view gpu_wait_gaps (analysis/sql/62_unexplained_gaps.sql:
# the GPU idle while an op was launched and free to run, longer than max(1 ms, 20 x the
# rank's median start delay)); a path with no hop into a GPU op longer than that floor needs
# no look at the view.
GAP_FLOOR_NS = 1_000_000

CRITICAL_PATH_DDL = """
-- @view critical_path: the critical path of each computed (job, step), one row per segment.
-- job, step: the step (NULL for an explicit window, or a job without ProfilerStep).
-- seq: 0-based position of the segment in time order.
-- rank, track_id, track_kind: where the segment ran (a CPU thread or a GPU stream).
-- eid, name: the event the time is attributed to (NULL for idle time on the track).
-- kind: compute (GPU kernel), comm (NCCL kernel, gloo span, or a collective's transfer
--   after the last rank arrived), memcpy (copy/memset), launch_overhead (from a launch
--   call to its GPU op's start), cpu (CPU event self time), idle_wait (waiting on a
--   dependency: sync return, stream and host waits, thread hand-offs, a gloo call's hand-off
--   to its worker thread, gaps), unexplained_gap (the GPU idle while the op that ends the
--   segment was launched and its stream free, longer than max(1 ms, 20 x the rank's median
--   such delay): a clock jump, GPU work outside the trace, a GPU op the profiler missed).
-- edge_kind: the edges.kind that ends the segment ('none' for filler at the window's ends).
-- start_ns, end_ns, dur_ns: the segment; consecutive segments touch, and they cover the
--   job step [job_steps.start_ns, job_steps.end_ns] (or the window), so a step's segments
--   add up to job_steps.dur_ns.
-- @table critical_path_segments: what critical_path() stores: critical_path's columns but name,
--   which the view reads from cp_nodes when it is asked for (a join that costs more than the
--   walk on a large rank: a summary by kind or rank needs no names).
CREATE TABLE IF NOT EXISTS critical_path_segments (
    job VARCHAR, step INTEGER, seq BIGINT, rank INTEGER, track_id INTEGER,
    track_kind VARCHAR, eid BIGINT, kind VARCHAR, edge_kind VARCHAR,
    start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT);
CREATE VIEW IF NOT EXISTS critical_path AS
SELECT p.job, p.step, p.seq, p.rank, p.track_id, p.track_kind, p.eid, a.name, p.kind,
       p.edge_kind, p.start_ns, p.end_ns, p.dur_ns
FROM critical_path_segments p
LEFT JOIN cp_nodes a ON a.job = p.job AND a.rank = p.rank AND a.eid = p.eid;
"""


def _fetch_nodes(con: duckdb.DuckDBPyConnection, job: str) -> dict[str, np.ndarray]:
    """The columns of ``job``'s cp_nodes that the walk reads (cls as its index in CLASSES,
    parent_eid -1 when NULL)."""
    return con.execute(
        """SELECT rank, eid, ts_ns, end_ns, track_id, coalesce(parent_eid, -1) AS parent_eid,
                  is_gpu, list_position(?, cls) - 1 AS cls
           FROM cp_nodes WHERE job = ?""", [list(CLASSES), job]).fetchnumpy()


# the edges the walk follows, as node numbers' parts and kind codes (index in KIND_NAMES),
# from ``edges``, or ``intra_rank_edges`` for a job of one rank (the only edges it has)
_EDGES_SQL = """
SELECT rank_src, src_eid, (src_point = 'end')::TINYINT AS sp, rank_dst, dst_eid,
       (dst_point = 'end')::TINYINT AS dp, (list_position($kinds, kind) - 1)::TINYINT AS kind,
       lag_ns
FROM {edges} WHERE job = $job AND NOT list_contains($skip, kind)"""


@dataclass
class PathGraph:
    """A job's graph as flat arrays. Each node event gets a slot = base[rank] + eid (eids are
    dense per rank), and its points are nodes 2 * slot (start) and 2 * slot + 1 (end), so the
    walk needs no lookups, only array indexing."""

    t: np.ndarray  # per node: time, ns
    pred: np.ndarray  # per node: binding predecessor node, -1 when none
    pred_kind: np.ndarray  # per node: index into KIND_NAMES of the binding edge
    ends: np.ndarray  # end nodes by (time, CPU < GPU, rank, eid): the last one <= a window end
                      # is where its walk starts (at equal times, a GPU op)
    rank: np.ndarray  # per slot
    eid: np.ndarray  # per slot
    track: np.ndarray  # per slot
    cls: np.ndarray  # per slot: index into CLASSES
    parent: np.ndarray  # per slot: slot of the enclosing node event, -1 when none
    # per slot: True for a GPU op whose wait before its start is an unexplained gap (view
    # gpu_wait_gaps); None: none is
    waited: np.ndarray | None = None


@dataclass
class Slots:
    """A dense numbering of a job's events across its ranks: slot = base[rank] + eid (eids
    are dense within a rank), so per-event arrays are indexed without lookups."""

    ranks: np.ndarray  # sorted
    sizes: np.ndarray  # per rank: max eid + 1
    base: np.ndarray  # per rank: first slot
    # rank -> its index in ``ranks`` by direct indexing when the rank numbers are compact
    # (a binary search per row cost 0.25 s per 7M edges at 1,024 ranks), else None
    lut: np.ndarray | None = None

    LUT_MOST = 1 << 22  # the largest rank number looked up through a table

    @classmethod
    def of(cls, rank: np.ndarray, eid: np.ndarray) -> Slots:
        ranks = np.unique(rank)
        lut = None
        if len(ranks) and 0 <= ranks[0] and ranks[-1] < cls.LUT_MOST:
            lut = np.zeros(int(ranks[-1]) + 1, dtype=np.int64)
            lut[ranks] = np.arange(len(ranks))
        sizes = np.zeros(len(ranks), dtype=np.int64)
        np.maximum.at(sizes, cls._index(ranks, lut, rank), np.asarray(eid) + 1)
        return cls(ranks, sizes, np.concatenate([[0], np.cumsum(sizes)[:-1]]), lut)

    @staticmethod
    def _index(ranks: np.ndarray, lut: np.ndarray | None, rank: np.ndarray) -> np.ndarray:
        """Each of ``rank`` (ranks of the job) as its index in ``ranks``."""
        return lut[rank] if lut is not None else np.searchsorted(ranks, rank)

    @property
    def n(self) -> int:
        return int(self.sizes.sum())

    def rank_index(self, rank: np.ndarray) -> np.ndarray:
        return self._index(self.ranks, self.lut, rank)

    def __call__(self, rank: np.ndarray, eid: np.ndarray) -> np.ndarray:
        return self.base[self.rank_index(rank)] + np.asarray(eid, dtype=np.int64)


def _load_graph(con: duckdb.DuckDBPyConnection, job: str) -> PathGraph:
    """The nodes of ``job`` (cp_nodes) and, for each node, its binding predecessor: the edge
    into it with the smallest lag; ties go to the earlier kind in EDGE_KINDS, then to the
    lower source node, so the choice is deterministic. The order edges (most of the graph: a
    point has at most one, its predecessor on its track) are assigned directly; the few
    others go through ``np.minimum.at``. No sort."""
    ev = _fetch_nodes(con, job)
    slot_of = Slots.of(ev["rank"], ev["eid"])
    ranks, sizes, n_slots = slot_of.ranks, slot_of.sizes, slot_of.n
    slot = slot_of(ev["rank"], ev["eid"])

    def per_slot(values: np.ndarray | int, fill: int, dtype: type = np.int64) -> np.ndarray:
        out = np.full(n_slots, fill, dtype=dtype)
        out[slot] = values
        return out

    t = np.zeros(2 * n_slots, dtype=np.int64)
    t[2 * slot], t[2 * slot + 1] = ev["ts_ns"], ev["end_ns"]
    is_node = per_slot(True, False, bool)
    pe = ev["parent_eid"]
    parent = np.where((pe >= 0) & (pe < sizes[slot_of.rank_index(ev["rank"])]),
                      slot_of(ev["rank"], pe), -1)
    parent = np.where(is_node[np.maximum(parent, 0)], parent, -1)  # the parent is a node
    order = np.lexsort((ev["eid"], ev["rank"], ev["is_gpu"], ev["end_ns"]))

    edges = "edges" if len(ranks) > 1 else "intra_rank_edges"
    e = con.execute(_EDGES_SQL.format(edges=edges),
                    {"job": job, "kinds": KIND_NAMES, "skip": list(REPLAY_ONLY_KINDS)}
                    ).fetchnumpy()
    src = 2 * slot_of(e["rank_src"], e["src_eid"]) + e["sp"]
    dst = 2 * slot_of(e["rank_dst"], e["dst_eid"]) + e["dp"]
    key = e["lag_ns"] * 16 + e["kind"]
    o = _ORDER_KINDS[e["kind"]]
    o_src, o_dst, o_key = src[o], dst[o], key[o]
    src, dst, key = src[~o], dst[~o], key[~o]
    never = np.iinfo(np.int64).max
    best = np.full(2 * n_slots, never)
    best[o_dst] = o_key
    if not np.array_equal(best[o_dst], o_key):  # a point with two: the minimum after all
        np.minimum.at(best, o_dst, o_key)
    np.minimum.at(best, dst, key)
    pred = np.full(2 * n_slots, never)
    tie = o_key == best[o_dst]
    pred[o_dst[tie]] = o_src[tie]
    if not np.array_equal(pred[o_dst[tie]], o_src[tie]):
        np.minimum.at(pred, o_dst[tie], o_src[tie])
    tie = key == best[dst]
    np.minimum.at(pred, dst[tie], src[tie])
    has = best != never
    pred = np.where(has, pred, -1)
    return PathGraph(t=t, pred=pred, pred_kind=np.where(has, best & 15, -1).astype(np.int8),
                     ends=(2 * slot + 1)[order], rank=per_slot(ev["rank"], -1, np.int32),
                     eid=per_slot(ev["eid"], -1),
                     track=per_slot(ev["track_id"], -1, np.int32),
                     cls=per_slot(ev["cls"], CLASSES.index("cpu"), np.int8),
                     parent=per_slot(parent, -1),
                     waited=_waited(con, job, t, pred, slot[ev["is_gpu"].astype(bool)],
                                    slot_of))


def _waited(con: duckdb.DuckDBPyConnection, job: str, t: np.ndarray, pred: np.ndarray,
            gpu_slot: np.ndarray, slot_of: Slots) -> np.ndarray | None:
    """Per slot: is it a GPU op of view gpu_wait_gaps (None when none is). The view is read
    only when some GPU op's start waited on its binding dependency longer than its floor,
    GAP_FLOOR_NS (rarely, on most traces)."""
    start = 2 * gpu_slot
    src = pred[start]
    long = src >= 0
    long[long] = t[start[long]] - t[src[long]] > GAP_FLOOR_NS
    if not long.any():
        return None
    w = con.execute("SELECT rank, eid FROM gpu_wait_gaps WHERE job = ?", [job]).fetchnumpy()
    if not len(w["eid"]):
        return None
    out = np.zeros(slot_of.n, dtype=bool)
    out[slot_of(w["rank"], w["eid"])] = True
    return out


_ORDER_KINDS = np.array([k in ("cpu_order", "gpu_order") for k in KIND_NAMES])
_LAUNCH, _GPU_ORDER = KIND_NAMES.index("launch"), KIND_NAMES.index("gpu_order")
# segment kind of a non-order edge; order edges take the class of the attributed event. A
# gloo call's hand-off to its worker thread (comm_enqueue) is a wait, not a launch: a
# CPU-only job has no launch overhead
_EDGE_SEGMENT = np.array([
    SEGMENT_KINDS.index({"launch": "launch_overhead", "collective": "comm"}.get(k, "idle_wait"))
    for k in KIND_NAMES])
_UNEXPLAINED = SEGMENT_KINDS.index("unexplained_gap")
_CLASS_SEGMENT = np.array([SEGMENT_KINDS.index(c) for c in CLASSES])
_IDLE = SEGMENT_KINDS.index("idle_wait")
_NONE_EDGE = len(KIND_NAMES)  # edge_kind 'none': idle filler at a window's ends
# the names of segment and edge kind codes, as SQL list literals (indexed 1-based)
_SEGMENT_KIND_SQL = "[" + ", ".join(f"'{k}'" for k in SEGMENT_KINDS) + "]"
_EDGE_KIND_SQL = "[" + ", ".join(f"'{k}'" for k in [*KIND_NAMES, "none"]) + "]"


class PathWalker:
    """Backward walks over one loaded graph, for any number of windows."""

    def __init__(self, g: PathGraph) -> None:
        self.g = g
        self.end_times = g.t[g.ends]
        # the walk reads one node at a time: memoryviews give Python ints without converting
        # the whole arrays
        self.t_view, self.pred_view = memoryview(g.t), memoryview(g.pred)

    def walk(self, start: int, end: int) -> dict[str, np.ndarray]:
        """Segments covering [start, end] in time order: from the last event end at or
        before `end`, follow binding predecessors back to a node at or before `start`."""
        t, pred = self.t_view, self.pred_view
        i = int(np.searchsorted(self.end_times, end, side="right")) - 1
        if i < 0 or end <= start:
            return _segments(self.g, np.zeros(0, dtype=np.int64), start, end)
        n = int(self.g.ends[i])
        path = [n]
        for _ in range(len(pred)):
            if t[n] <= start or pred[n] < 0:
                break
            n = pred[n]
            path.append(n)
        else:
            raise RuntimeError("critical path walk did not terminate (cycle in edges)")
        return _segments(self.g, np.asarray(path[::-1], dtype=np.int64), start, end)


def _segments(g: PathGraph, path: np.ndarray, start: int, end: int) -> dict[str, np.ndarray]:
    """Segment arrays for a path of nodes in time order, clipped to [start, end], with idle
    filler before its first node (when that node has no predecessor) and after its last
    (when it ends before `end`), so the segments always cover the window exactly."""
    src, dst = path[:-1], path[1:]
    k = g.pred_kind[dst].astype(np.int64)
    order = _ORDER_KINDS[k]
    # on one track, the interval after a start is inside that event, the interval before an
    # end too, and the gap between an end and the next start is inside their parent
    attr = np.where(order, np.where(src & 1 == 0, src >> 1,
                                    np.where(dst & 1 == 1, dst >> 1, g.parent[dst >> 1])),
                    dst >> 1)
    kind = np.where(order, np.where(attr >= 0, _CLASS_SEGMENT[g.cls[np.maximum(attr, 0)]],
                                    _IDLE), _EDGE_SEGMENT[k])
    if g.waited is not None and len(dst):
        kind = _mark_unexplained(g, src, dst, k, kind)
    seg = {"loc": dst >> 1, "attr": attr, "kind": kind, "edge": k,
           "start": np.maximum(g.t[src], start), "end": g.t[dst]}
    first = last = None  # (track slot, start, end) of idle filler
    if len(path) == 0:
        first = (-1, start, end)
    else:
        if g.t[path[0]] > start:
            first = (path[0] >> 1, start, g.t[path[0]])
        if g.t[path[-1]] < end:
            last = (path[-1] >> 1, max(start, g.t[path[-1]]), end)
    pieces = [{"loc": [f[0]], "attr": [-1], "kind": [_IDLE], "edge": [_NONE_EDGE],
               "start": [f[1]], "end": [f[2]]} if f is not seg else f
              for f in (first, seg, last) if f is not None]
    out = {c: np.concatenate([np.asarray(p[c], dtype=np.int64) for p in pieces]) for c in seg}
    keep = out["end"] > out["start"]
    return {c: v[keep] for c, v in out.items()}


def _mark_unexplained(g: PathGraph, src: np.ndarray, dst: np.ndarray, k: np.ndarray,
                      kind: np.ndarray) -> np.ndarray:
    """``kind`` with the unexplained gaps marked: the hop into the start of a GPU op of
    gpu_wait_gaps (``waited``), from its binding dependency (its launch call's start, the
    previous op's end on its stream, or an op it waited for on another stream): the op's
    wait of the view (from its launch call's start rather than its end when the launch
    binds)."""
    hit = ((dst & 1) == 0) & g.waited[dst >> 1]
    hit &= ~((k == _GPU_ORDER) & ((src & 1) == 0))  # not from inside an overlapping op
    return np.where(hit, _UNEXPLAINED, kind)


def _windows(con: duckdb.DuckDBPyConnection, job: str, step: int | None,
             window: tuple[int, int] | None, include_incomplete: bool = False
             ) -> list[tuple[int | None, int, int]]:
    """(step, start_ns, end_ns) to compute: the explicit window, the job step (job_steps:
    the synchronised iteration across ranks), every complete job step (every one with
    ``include_incomplete``), or the whole job when it has none."""
    if window is not None:
        if step is not None:
            raise ValueError("give a step or a window, not both")
        return [(None, int(window[0]), int(window[1]))]
    rows = con.execute(
        """SELECT step, start_ns, end_ns FROM job_steps
           WHERE job = $job AND ($step IS NULL AND (complete OR $all) OR step = $step)
           ORDER BY step""", {"job": job, "step": step, "all": include_incomplete}).fetchall()
    if not rows:
        _check_job(con, job)
    if step is not None and not rows:
        raise ValueError(f"job {job!r} has no step {step}")
    if rows:
        return [(s, int(a), int(b)) for s, a, b in rows]
    if step is None and (left_out := no_complete_steps(con, job)):
        raise ValueError(left_out)  # steps there are, none complete: not the whole trace
    ((lo, hi),) = con.execute("SELECT min(ts_ns), max(end_ns) FROM cp_nodes WHERE job = ?",
                              [job]).fetchall()
    if lo is None:
        raise ValueError(f"job {job!r} has no events on CPU threads or GPU streams")
    return [(None, int(lo), int(hi))]


def _check_job(con: duckdb.DuckDBPyConnection, job: str) -> None:
    """ValueError naming the store's jobs when it has no ``job`` (a typo is not 'no events')."""
    jobs = [j for (j,) in con.execute(
        "SELECT DISTINCT job FROM trace_files ORDER BY job").fetchall()]
    if job not in jobs:
        raise ValueError(f"no job {job!r} in the store (it holds "
                         f"{', '.join(map(repr, jobs)) or 'no job'})")


def critical_path(con: duckdb.DuckDBPyConnection, job: str, step: int | None = None, *,
                  window: tuple[int, int] | None = None, include_incomplete: bool = False,
                  names: bool = True) -> duckdb.DuckDBPyRelation:
    """The critical path of ``job``'s step ``step`` (a job_steps row; every complete one when
    None, every one with ``include_incomplete``; the whole job when it has no ProfilerStep),
    or of an explicit ``window=(start_ns, end_ns)``.

    Walks the stored graph (views cp_nodes and edges). The segments are stored in the table
    ``critical_path_segments`` (see CRITICAL_PATH_DDL; earlier rows of the same job and steps
    are replaced) and returned as a relation over the view ``critical_path`` ordered by step
    and seq; ``names=False``: over the table, without the column ``name``."""
    wins = _windows(con, job, step, window, include_incomplete)
    walker = PathWalker(_load_graph(con, job))
    g = walker.g
    parts = []
    for s, a, b in wins:
        seg = walker.walk(a, b)
        seg["step"] = np.full(len(seg["start"]), -1 if s is None else s, dtype=np.int64)
        seg["seq"] = np.arange(len(seg["start"]), dtype=np.int64)
        parts.append(seg)
    seg = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    loc, attr = seg["loc"], seg["attr"]
    no_loc, no_attr = loc < 0, attr < 0
    table = pa.table({
        "step": pa.array(seg["step"], mask=seg["step"] < 0, type=pa.int32()),
        "seq": seg["seq"],
        "rank": pa.array(g.rank[np.maximum(loc, 0)], mask=no_loc, type=pa.int32()),
        "track_id": pa.array(g.track[np.maximum(loc, 0)], mask=no_loc, type=pa.int32()),
        "eid": pa.array(g.eid[np.maximum(attr, 0)], mask=no_attr),
        "kind": seg["kind"].astype(np.int8), "edge_kind": seg["edge"].astype(np.int8),
        "start_ns": seg["start"], "end_ns": seg["end"],
    })
    con.execute(CRITICAL_PATH_DDL)
    steps = sorted({s for s, _, _ in wins if s is not None})
    where = "step IS NULL" if not steps else f"step IN ({', '.join(map(str, steps))})"
    con.execute(f"DELETE FROM critical_path_segments WHERE job = ? AND {where}", [job])
    con.register("_cp_seg", table)
    try:
        con.execute(f"""
            INSERT INTO critical_path_segments
            SELECT $job, s.step, s.seq, s.rank, s.track_id, tr.track_kind, s.eid,
                   {_SEGMENT_KIND_SQL}[s.kind + 1], {_EDGE_KIND_SQL}[s.edge_kind + 1],
                   s.start_ns, s.end_ns, s.end_ns - s.start_ns
            FROM _cp_seg s
            LEFT JOIN tracks tr ON tr.job = $job AND tr.rank = s.rank
                               AND tr.track_id = s.track_id""", {"job": job})
    finally:
        con.unregister("_cp_seg")
    source = "critical_path" if names else "critical_path_segments"
    return con.sql(f"SELECT * FROM {source} WHERE job = ? AND {where} ORDER BY step, seq",
                   params=[job])


_SUMMARY_BY = {"kind": "kind", "rank": "rank", "rank,kind": "rank, kind"}


def critical_path_summary(con: duckdb.DuckDBPyConnection, job: str, step: int | None = None,
                          *, window: tuple[int, int] | None = None, by: str = "kind"
                          ) -> duckdb.DuckDBPyRelation:
    """Time on the critical path per ``by`` ('kind', 'rank' or 'rank,kind') and step:
    segments, dur_ns, and share of the step's path (shares of a step sum to 1).

    Computes the path as ``critical_path`` does (same arguments)."""
    if by not in _SUMMARY_BY:
        raise ValueError(f"by must be one of {sorted(_SUMMARY_BY)}")
    path = critical_path(con, job, step, window=window, names=False)
    cols = _SUMMARY_BY[by]
    return path.query("_cp_path", f"""
        SELECT job, step, {cols}, count(*) AS segments, sum(dur_ns)::BIGINT AS dur_ns,
               sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY job, step) AS share
        FROM _cp_path GROUP BY job, step, {cols} ORDER BY step, dur_ns DESC""")


def critical_path_all_jobs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Fill ``critical_path_segments`` (and so the view ``critical_path``) with the complete
    steps of every job of the store, for a query that reads them (``tracetool sql``): the
    path is computed, not stored, so a plain connection has it only after this. Returns one
    line per job that has no path (no events on CPU threads or GPU streams)."""
    con.execute(CRITICAL_PATH_DDL)
    missing = []
    for (job,) in con.execute("SELECT DISTINCT job FROM trace_files ORDER BY 1").fetchall():
        try:
            critical_path(con, job, names=False)
        except ValueError as err:
            missing.append(f"job {job!r} has no critical path: {err}")
    return missing


def unexplained_gap_warning(path: duckdb.DuckDBPyRelation) -> str | None:
    """One line naming the unexplained gaps of a path (``critical_path()``'s relation, with
    or without names): their time, share and the longest, and what usually causes them;
    None when it has none. A gap this long with work queued is no launch latency: the
    command that shows the path says so once, whatever the number of gaps."""
    (n, gap, total, longest, rank, at), = path.query("_cp_gap", """
        SELECT count(*) FILTER (WHERE kind = 'unexplained_gap'),
               coalesce(sum(dur_ns) FILTER (WHERE kind = 'unexplained_gap'), 0),
               sum(dur_ns), max(dur_ns) FILTER (WHERE kind = 'unexplained_gap'),
               arg_max(rank, dur_ns) FILTER (WHERE kind = 'unexplained_gap'),
               arg_max(start_ns, dur_ns) FILTER (WHERE kind = 'unexplained_gap')
                   - min(start_ns)
        FROM _cp_gap""").fetchall()
    if not n:
        return None
    return (f"{gap / 1e6:.3f} ms of the critical path ({100 * gap / total:.1f}%) is "
            f"unexplained_gap: {n} GPU idle gap(s) with work already launched, longer than "
            "max(1 ms, 20 x the rank's median launch delay) (view gpu_wait_gaps); "
            f"the longest, {longest / 1e6:.3f} ms on rank {rank}, starts {at / 1e6:.3f} ms "
            "into the path. Likely causes: a clock jump, GPU work outside the trace (queued "
            "before the profiler started, or another process), or a GPU op the profiler "
            "missed")


def _sql_names(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{n}'" for n in names)


# A stream wait call gives an edge when its rank records cuda_sync 'Stream Wait Event's
# (stream_wait) or an event record call precedes it on its thread (event_wait;
# tracetool.ingest.graph): the others name no recorded event
_UNRESOLVED_WAITS = f"""
WITH w AS (
    SELECT rank, track_id, eid, ts_ns, name FROM events
    WHERE job = $job AND name IN ({_sql_names(STREAM_WAIT_CALLS)}) AND ph = 'X'),
rec AS (
    SELECT rank, track_id, min((ts_ns, eid)) AS first FROM events
    WHERE job = $job AND name IN ({_sql_names(EVENT_RECORD_CALLS)}) AND ph = 'X'
    GROUP BY ALL),
synced AS (SELECT DISTINCT rank FROM events
           WHERE job = $job AND kind = 'cuda_sync' AND name = 'Stream Wait Event')
SELECT count(*), count(DISTINCT w.rank), list(DISTINCT w.name ORDER BY w.name)
FROM w LEFT JOIN rec r ON r.rank = w.rank AND r.track_id = w.track_id
WHERE w.rank NOT IN (SELECT rank FROM synced) AND (r.first IS NULL OR (w.ts_ns, w.eid) <= r.first)
"""


def unresolved_stream_wait_warning(con: duckdb.DuckDBPyConnection, job: str) -> str | None:
    """One line counting ``job``'s stream waits that give no cross-stream edge: no cuda_sync
    event says what they waited for and no event record call precedes them on their thread
    (ROCm's Kineto never records hipEventRecord; CUDA traces of 2022-02 to 2023-09 lack
    cudaEventRecord), so which op they waited on is unknown; None when every one has its
    edge. Said once, so that a path through two streams is not taken as independent work
    without a word (docs/critical_path.md, "Stream waits")."""
    (n, ranks, names), = con.execute(_UNRESOLVED_WAITS, {"job": job}).fetchall()
    if not n:
        return None
    return (f"{n} stream wait(s) ({', '.join(names)}) on {ranks} rank(s) name no recorded "
            "event (no cuda_sync events, no event record call before them on their thread; "
            "ROCm's Kineto never records hipEventRecord): they give the graph no edge, so "
            "the critical path and replay may treat work they ordered across streams as "
            "independent (waits of a stream on an NCCL/RCCL kernel are inferred: comm_wait)")
