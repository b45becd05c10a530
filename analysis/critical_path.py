"""Critical path of a training step across threads, streams and ranks (issue 3).

The question it answers: which chain of work decided when the step ended? The model is HTA's
(``hta/analyzers/critical_path_analysis.py``): nodes are the start and end points of events
(CPU ops, annotations and runtime calls on CPU threads; kernels, copies and memsets on GPU
streams), and an edge ``src -> dst`` says "dst could not happen before src". ``build_edges``
derives the edges set-based in DuckDB and stores them in the table ``edges`` (columns
documented in ``EDGES_DDL``); ``critical_path`` walks them backwards from the step's end.

Why a backward walk over "binding" edges rather than HTA's longest path: every edge's
``lag_ns`` is the time between its two points, so every path between two nodes has the same
length and a longest path is not informative. What matters is, at each node, which of its
dependencies was satisfied last: that one held the node back (the "last-arriving" edge, as
in Perfetto's scheduler critical path and in Lumos). Choosing it is one minimum of lag per
node over all edges (vectorised); the walk then follows one pointer per node, so the chain
of segments is contiguous by construction and covers the step from its start to its end:
``seg[i].end_ns == seg[i+1].start_ns``, first start = step start, last end = step end.

Cross-rank: a collective's transfer ends on every rank only after the last rank arrived, so
the end of each rank's collective kernel (or gloo span) depends on the start of the
last-arriving rank's one. Rank clocks are used as recorded (ranks of one host share a
clock; across hosts NTP keeps them within tens of microseconds, below a collective's
duration); such an edge is only drawn when it is causal in recorded times (the last
arrival started before this rank's transfer ended), so skew can at worst drop an edge,
never break contiguity. See docs/critical_path.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

# Edge kinds, in tie-break order: when two dependencies of a node were satisfied at the same
# instant, the earlier kind in this list is taken as the binding one (the local, recorded
# order first, inferred hand-offs last).
EDGE_KINDS: dict[str, str] = {
    "cpu_order": "consecutive points on a CPU thread (program order and nesting): the "
                 "previous start or end on the same thread",
    "gpu_order": "consecutive points on a GPU stream (stream order)",
    "launch": "runtime/driver call start -> the GPU op it launched (correlation id)",
    "sync": "GPU op end -> end of the CPU call that waited for it: device/stream/event "
            "synchronize (awaited op from cuda_sync events when recorded), blocking memcpy "
            "(its own copy, when it ended before the call returned)",
    "collective": "start of the last-arriving rank's collective kernel or gloo span -> end "
                  "of every other rank's one (instances: collective_ranks.instance; "
                  "docs/collectives.md)",
    "stream_wait": "GPU op end -> first GPU op launched on the waiting stream after a "
                   "cudaStreamWaitEvent (cuda_sync 'Stream Wait Event'; the awaited op is the "
                   "last one launched on the recorded stream before cudaEventRecord)",
    "comm_wait": "inferred NCCL stream waits (ranks without cuda_sync): last compute op "
                 "launched before a comm kernel -> its start, and comm kernel end -> first "
                 "compute op on another stream to start after it",
    "comm_enqueue": "CPU call of a gloo collective start -> start of its gloo span on the "
                    "gloo worker thread",
    "thread_wake": "inferred CPU hand-off: end of an event on another thread of the rank -> "
                   "the point where a thread resumed after an idle or waiting gap",
    "transfer_wake": "inferred wait for a CPU-side transfer (replay only, not walked by the "
                     "critical path): end of a gloo span -> the start where another thread "
                     "of the rank resumed after going idle while it was in flight (DDP waits "
                     "on the bucket futures unrecorded); the resume may precede the span's "
                     "recorded end a little (tolerance 5% of the span, at least 100 us), so "
                     "its lag can be negative",
}
# edges the backward walk does not follow (their lag may be negative)
REPLAY_ONLY_KINDS = ("transfer_wake",)
KIND_NAMES = list(EDGE_KINDS)

# Segment kinds of the path.
SEGMENT_KINDS = ("compute", "comm", "memcpy", "launch_overhead", "cpu", "idle_wait")
CLASSES = ("compute", "comm", "memcpy", "cpu")  # classes of events (cp_nodes.cls)

SYNC_CALLS = (
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
)

EDGES_DDL = """
-- @table edges: the dependency graph the critical path walks, one row per edge.
-- job: job of both ends (edges never cross jobs).
-- rank_src, src_eid, src_point: the point the edge starts from: the start ('start') or the
--   end ('end') of event src_eid (events.eid) of rank rank_src.
-- rank_dst, dst_eid, dst_point: the point that depends on it (same encoding).
-- kind: cpu_order, gpu_order, launch, sync, collective, stream_wait, comm_wait,
--   comm_enqueue, thread_wake, transfer_wake (tracetool.analysis.critical_path.EDGE_KINDS:
--   what each one means and where it comes from).
-- lag_ns: time of the dst point minus time of the src point, >= 0 (on the two ranks'
--   recorded clocks for 'collective', and transfer_wake may be slightly negative). The src
--   with the smallest lag into a point is the dependency that was satisfied last: the one
--   the critical path follows (it does not walk transfer_wake edges: the replay's only).
CREATE TABLE IF NOT EXISTS edges (
    job VARCHAR, rank_src INTEGER, src_eid BIGINT, src_point {point},
    rank_dst INTEGER, dst_eid BIGINT, dst_point {point}, kind {kind}, lag_ns BIGINT);
""".format(point="ENUM('start', 'end')",
           kind="ENUM(" + ", ".join(f"'{k}'" for k in EDGE_KINDS) + ")")

CRITICAL_PATH_DDL = """
-- @table critical_path: the critical path of each computed (job, step), one row per segment.
-- job, step: the step (NULL for an explicit window, or a job without ProfilerStep).
-- seq: 0-based position of the segment in time order.
-- rank, track_id, track_kind: where the segment ran (a CPU thread or a GPU stream).
-- eid, name: the event the time is attributed to (NULL for idle time on the track).
-- kind: compute (GPU kernel), comm (NCCL kernel, gloo span, or a collective's transfer
--   after the last rank arrived), memcpy (copy/memset), launch_overhead (from a launch
--   call to its GPU op's start, or from a gloo call to its span), cpu (CPU event self time),
--   idle_wait (waiting on a dependency: sync return, stream waits, thread hand-offs, gaps).
-- edge_kind: the edges.kind that ends the segment ('none' for filler at the window's ends).
-- start_ns, end_ns, dur_ns: the segment; consecutive segments touch, and they cover the
--   job step [job_steps.start_ns, job_steps.end_ns] (or the window), so a step's segments
--   add up to job_steps.dur_ns.
CREATE TABLE IF NOT EXISTS critical_path (
    job VARCHAR, step INTEGER, seq BIGINT, rank INTEGER, track_id INTEGER,
    track_kind VARCHAR, eid BIGINT, name VARCHAR, kind VARCHAR, edge_kind VARCHAR,
    start_ns BIGINT, end_ns BIGINT, dur_ns BIGINT);
"""

# Nodes: the events whose start and end points are graph nodes (the table cp_nodes).
NODES_DDL = """
-- @table cp_nodes: the events whose start and end points are the nodes of the dependency
--   graph (edges), one row per event, built with edges by build_edges, per job.
-- job, rank, eid: the event (events.eid). track_id: its track (tracks).
-- name, ts_ns, end_ns, depth, parent_eid: as in events (depth 0 when NULL).
-- cls: what time inside it is: compute (GPU kernel), comm (communication kernel, or a
--   gloo:* span that does a collective's transfer), memcpy (copy/memset), cpu (CPU event).
-- is_gpu: a GPU op (on a GPU stream). waitable: a CPU event whose self time can be waiting
--   on another thread (user annotations, ProfilerStep, *wait* ops).
-- wake_start: a gap before its start is idle or waiting (its parent is absent or
--   waitable), so a thread_wake edge may end there.
CREATE TABLE IF NOT EXISTS cp_nodes (
    job VARCHAR, rank INTEGER, eid BIGINT, track_id INTEGER, name VARCHAR, ts_ns BIGINT,
    end_ns BIGINT, depth INTEGER, parent_eid BIGINT, cls VARCHAR, is_gpu BOOLEAN,
    waitable BOOLEAN, wake_start BOOLEAN);
"""
_EVENTS_SQL = """
DELETE FROM cp_nodes WHERE job = $job;
INSERT INTO cp_nodes
WITH gloo AS (
    SELECT DISTINCT rank, gloo_eid AS eid FROM collectives
    WHERE job = $job AND gloo_eid IS NOT NULL),
base AS MATERIALIZED (
    SELECT e.rank, e.eid, e.track_id, e.name, e.ts_ns, e.end_ns,
           coalesce(e.depth, 0) AS depth, e.parent_eid,
           CASE WHEN g.eid IS NOT NULL THEN
                    CASE WHEN g.is_comm THEN 'comm' WHEN g.kind = 'kernel' THEN 'compute'
                         ELSE 'memcpy' END
                WHEN c.eid IS NOT NULL THEN 'comm' ELSE 'cpu' END AS cls,
           g.eid IS NOT NULL AS is_gpu,
           g.eid IS NULL AND c.eid IS NULL
               AND (e.kind = 'user_annotation' OR e.name LIKE 'ProfilerStep#%'
                    OR (e.kind = 'cpu_op' AND e.name ILIKE '%wait%')) AS waitable
    FROM events e
    LEFT JOIN gpu_ops g ON g.job = e.job AND g.rank = e.rank AND g.eid = e.eid
    LEFT JOIN gloo c ON c.rank = e.rank AND c.eid = e.eid
    WHERE e.job = $job AND e.ph = 'X' AND e.dur_ns >= 0
      AND (g.eid IS NOT NULL
           OR (e.track_kind = 'cpu_thread' AND e.kind NOT IN ('kernel', 'memcpy', 'memset'))))
SELECT $job, b.*, coalesce(p.waitable, TRUE) AND NOT b.is_gpu AND b.cls = 'cpu' AS wake_start
FROM base b LEFT JOIN base p ON p.rank = b.rank AND p.eid = b.parent_eid
"""


def _fetch_nodes(con: duckdb.DuckDBPyConnection, job: str) -> dict[str, np.ndarray]:
    """The columns of ``job``'s cp_nodes that the chain and the graph load read (cls as its
    index in CLASSES, parent_eid -1 when NULL)."""
    return con.execute(
        """SELECT rank, eid, ts_ns, end_ns, track_id, coalesce(parent_eid, -1) AS parent_eid,
                  is_gpu, list_position(?, cls) - 1 AS cls, depth, wake_start, waitable
           FROM cp_nodes WHERE job = ?""", [list(CLASSES), job]).fetchnumpy()


def _chain(n: dict[str, np.ndarray]) -> tuple[pa.Table, dict[str, np.ndarray]]:
    """Points of every track in time order (the table ``_cp_chain`` the order, thread_wake
    and transfer_wake edges read), as nodes eid * 2 + (0 start | 1 end). At the same instant:
    ends of slices first (half-open intervals; deeper ones first), then starts and
    zero-length events by depth, so an event's start precedes the points nested in it. That
    order is packed into one int64 ``ord`` ((rank of the instant << 40) + node). p_node, p_t:
    the previous point on the track (null for the first); wake: wake_start of a start point,
    waitable of an end point (NULL read as false, as the edges' WHERE does).

    Sorted in numpy rather than by a DuckDB window: a trace's points are nearly in time order
    already, which numpy's stable sort (timsort) exploits (on 1.76M points, 0.13-0.24 s
    against the window's 0.25-0.31 s, and less contention for DuckDB's threads).
    ``n``: the job's cp_nodes columns (``_fetch_nodes``). Returns the table and its
    consecutive pairs on each track, the order edges, as arrays: rank, p_node, node, lag,
    is_gpu."""
    col = {c: np.ma.getdata(n[c]) for c in ("rank", "track_id", "is_gpu", "eid", "ts_ns",
                                             "end_ns", "depth")}  # never NULL
    eid, ts, end, depth = (col[c].astype(np.int64) for c in ("eid", "ts_ns", "end_ns",
                                                               "depth"))
    track = (col["rank"].astype(np.int64) << 32) | col["track_id"].astype(np.uint32)
    o = np.lexsort((
        np.concatenate([((4096 + depth) << 40) + 2 * eid,
                        (np.where(end > ts, 2048 - depth, 4096 + depth) << 40) | (2 * eid + 1)]),
        np.concatenate([ts, end]),
        np.concatenate([track, track])))
    both = {c: np.concatenate([v, v])[o] for c, v in col.items()
            if c in ("rank", "track_id", "is_gpu")}
    node = np.concatenate([2 * eid, 2 * eid + 1])[o]
    t = np.concatenate([ts, end])[o]
    tracks = np.concatenate([track, track])[o]
    first = np.ones(len(o), dtype=bool)
    first[1:] = tracks[1:] != tracks[:-1]
    prev = np.maximum(np.arange(len(o)) - 1, 0)
    wake = np.concatenate([np.ma.filled(n["wake_start"], False),
                           np.ma.filled(n["waitable"], False)])[o]
    table = pa.table({**both, "node": node, "t": t, "wake": wake,
                      "p_node": pa.array(node[prev], mask=first),
                      "p_t": pa.array(t[prev], mask=first)})
    has = ~first
    return table, {"rank": both["rank"][has], "p_node": node[prev][has], "node": node[has],
                   "lag": (t - t[prev])[has], "is_gpu": both["is_gpu"][has]}


_PT = "CASE WHEN {} % 2 = 0 THEN 'start' ELSE 'end' END"  # point of a node

_EDGE_SQL: dict[str, str] = {
    "order": f"""
SELECT $job, rank, p_node // 2, {_PT.format('p_node')}, rank, node // 2, {_PT.format('node')},
       CASE WHEN is_gpu THEN 'gpu_order' ELSE 'cpu_order' END, t - p_t
FROM _cp_chain WHERE p_node IS NOT NULL""",
    "launch": """
SELECT $job, g.rank, g.launch_eid, 'start', g.rank, g.eid, 'start', 'launch', g.ts_ns - l.ts_ns
FROM _cp_gpu g JOIN cp_nodes l ON l.job = $job AND l.rank = g.rank AND l.eid = g.launch_eid
WHERE g.ts_ns >= l.ts_ns""",
    # a copy call that returned after its copy ended waited for it
    "sync_memcpy": """
SELECT $job, g.rank, g.eid, 'end', g.rank, c.eid, 'end', 'sync', c.end_ns - g.end_ns
FROM _cp_gpu g JOIN cp_nodes c ON c.job = $job AND c.rank = g.rank AND c.eid = g.launch_eid
WHERE g.kind IN ('memcpy', 'memset') AND g.end_ns <= c.end_ns
  AND regexp_matches(c.name, '^(cuda|hip|cu)Mem(cpy|set)')""",
    # synchronize calls: the awaited op is the last one to end before the call returned,
    # among the ops of the synchronized stream (Stream Sync), the recorded event's op
    # (Event Sync), or all ops of the rank (device sync, or no cuda_sync events)
    "sync_calls": """
WITH s AS (
    SELECT s.rank, s.eid, s.ts_ns, s.end_ns, y.name AS sync_kind, y.device, y.stream,
           y.rec_corr, y.wstream
    FROM _cp_sync_calls s LEFT JOIN _cp_cuda_sync y
      ON y.rank = s.rank AND y.correlation = s.correlation
     AND y.name IN ('Stream Sync', 'Event Sync', 'Context Sync')),
by_stream AS (
    SELECT s.rank, g.eid AS src, s.eid AS dst, s.end_ns - g.end_ns AS lag, g.launch_ts_ns,
           s.ts_ns
    FROM (SELECT * FROM s WHERE sync_kind = 'Stream Sync') s
    ASOF JOIN _cp_gpu g ON g.rank = s.rank AND g.device = s.device AND g.stream = s.stream
                       AND s.end_ns >= g.end_ns),
by_event AS (
    SELECT s.rank, g.eid AS src, s.eid AS dst, s.end_ns - g.end_ns AS lag, g.launch_ts_ns,
           s.ts_ns
    FROM (SELECT s.*, r.ts_ns AS rec_ts FROM s JOIN _cp_runtime r
            ON r.rank = s.rank AND r.correlation = s.rec_corr
          WHERE s.sync_kind = 'Event Sync') s
    ASOF JOIN _cp_gpu g ON g.rank = s.rank AND g.device = s.device AND g.stream = s.wstream
                       AND s.rec_ts >= g.launch_ts_ns),
by_rank AS (
    SELECT s.rank, g.eid AS src, s.eid AS dst, s.end_ns - g.end_ns AS lag, g.launch_ts_ns,
           s.ts_ns
    FROM (SELECT * FROM s WHERE sync_kind IS NULL OR sync_kind = 'Context Sync'
                            OR (sync_kind = 'Event Sync' AND coalesce(rec_corr, -1) < 0)) s
    ASOF JOIN _cp_gpu g ON g.rank = s.rank AND s.end_ns >= g.end_ns),
a AS (SELECT * FROM by_stream UNION ALL SELECT * FROM by_event UNION ALL SELECT * FROM by_rank)
SELECT $job, rank, src, 'end', rank, dst, 'end', 'sync', lag FROM a
WHERE lag >= 0 AND coalesce(launch_ts_ns <= ts_ns, TRUE)""",
    "stream_wait": """
WITH w AS (
    SELECT y.rank, y.device, y.stream, y.wstream, c.ts_ns AS call_ts, r.ts_ns AS rec_ts
    FROM _cp_cuda_sync y
    JOIN _cp_runtime c ON c.rank = y.rank AND c.correlation = y.correlation
    JOIN _cp_runtime r ON r.rank = y.rank AND r.correlation = y.rec_corr
    WHERE y.name = 'Stream Wait Event'),
src AS (
    SELECT w.*, g.eid AS src_eid, g.end_ns AS src_end FROM w
    ASOF JOIN _cp_gpu g ON g.rank = w.rank AND g.device = w.device AND g.stream = w.wstream
                       AND w.rec_ts >= g.launch_ts_ns),
pair AS (
    SELECT s.rank, s.src_eid, s.src_end, h.eid AS dst_eid, h.ts_ns AS dst_ts FROM src s
    ASOF JOIN _cp_gpu h ON h.rank = s.rank AND h.device = s.device AND h.stream = s.stream
                       AND s.call_ts <= h.launch_ts_ns)
SELECT DISTINCT $job, rank, src_eid, 'end', rank, dst_eid, 'start', 'stream_wait',
       dst_ts - src_end
FROM pair WHERE dst_ts >= src_end""",
    "comm_wait": """
WITH ranks AS (
    SELECT DISTINCT rank FROM _cp_gpu
    EXCEPT SELECT rank FROM _cp_cuda_sync WHERE name = 'Stream Wait Event'),
k AS (SELECT * FROM _cp_gpu WHERE is_comm AND launch_ts_ns IS NOT NULL
                              AND rank IN (SELECT rank FROM ranks)),
c AS (SELECT * FROM _cp_gpu WHERE NOT is_comm AND launch_ts_ns IS NOT NULL),
pre AS (
    SELECT k.rank, c.eid AS src, 'end' AS sp, k.eid AS dst, 'start' AS dp,
           k.ts_ns - c.end_ns AS lag, c.stream <> k.stream AS other
    FROM k ASOF JOIN c ON c.rank = k.rank AND c.device = k.device
                      AND k.launch_ts_ns > c.launch_ts_ns),
post AS (
    SELECT k.rank, k.eid, 'end', c.eid, 'start', c.ts_ns - k.end_ns,
           c.stream <> k.stream AND c.launch_ts_ns >= k.launch_ts_ns
    FROM k ASOF JOIN c ON c.rank = k.rank AND c.device = k.device AND k.end_ns <= c.ts_ns)
SELECT $job, rank, src, sp, rank, dst, dp, 'comm_wait', lag
FROM (SELECT * FROM pre UNION ALL SELECT * FROM post) WHERE other AND lag >= 0""",
    "comm_enqueue": """
SELECT $job, c.rank, c.eid, 'start', c.rank, c.gloo_eid, 'start', 'comm_enqueue',
       g.ts_ns - s.ts_ns
FROM collectives c
JOIN cp_nodes g ON g.job = $job AND g.rank = c.rank AND g.eid = c.gloo_eid
JOIN cp_nodes s ON s.job = $job AND s.rank = c.rank AND s.eid = c.eid
WHERE c.job = $job AND g.ts_ns >= s.ts_ns""",
    # one instance = one collective call on every rank (collective_ranks.instance, the one
    # key of analysis/sql/40_collectives.sql); the transfer ends after the last arrival.
    # Traces whose collectives table has no transfer events match comm kernels by their
    # order on each rank.
    "collective": """
WITH calls AS (
    SELECT rank, instance, coalesce(kernel_eid, gloo_eid) AS x_eid
    FROM collective_ranks
    WHERE job = $job AND instance IS NOT NULL AND coalesce(kernel_eid, gloo_eid) IS NOT NULL),
inst AS (
    SELECT * FROM calls
    UNION ALL
    SELECT rank, 'kernel:' || row_number() OVER (PARTITION BY rank ORDER BY ts_ns, eid), eid
    FROM _cp_gpu WHERE is_comm AND NOT EXISTS (SELECT 1 FROM calls)),
x AS (
    SELECT i.rank, i.instance, i.x_eid, n.ts_ns, n.end_ns FROM inst i
    JOIN cp_nodes n ON n.job = $job AND n.rank = i.rank AND n.eid = i.x_eid),
last AS (
    SELECT instance, rank AS l_rank, x_eid AS l_eid, ts_ns AS l_ts FROM x
    QUALIFY row_number() OVER (PARTITION BY instance ORDER BY ts_ns DESC, rank) = 1)
SELECT $job, l.l_rank, l.l_eid, 'start', x.rank, x.x_eid, 'end', 'collective',
       x.end_ns - l.l_ts
FROM x JOIN last l USING (instance)
WHERE x.rank <> l.l_rank AND l.l_ts <= x.end_ns""",
    # a thread that resumed after an idle or waiting gap resumed because of the latest end
    # of an event on another thread of the rank inside that gap (if there was one)
    "transfer_wake": """
WITH gaps AS (SELECT * FROM _cp_chain WHERE NOT is_gpu AND node % 2 = 0 AND t > p_t),
spans AS (
    SELECT e.rank, e.track_id, e.eid, e.ts_ns, e.end_ns FROM cp_nodes e
    JOIN collectives c ON c.job = $job AND c.rank = e.rank AND c.gloo_eid = e.eid
    WHERE e.job = $job)
SELECT $job, s.rank, s.eid, 'end', g.rank, g.node // 2, 'start', 'transfer_wake',
       g.t - s.end_ns
FROM gaps g JOIN spans s ON s.rank = g.rank AND s.track_id <> g.track_id
 AND s.ts_ns <= g.p_t AND s.end_ns > g.p_t
 AND s.end_ns <= g.t + greatest(100000, (s.end_ns - s.ts_ns) // 20)
QUALIFY row_number() OVER (PARTITION BY g.rank, g.node ORDER BY abs(g.t - s.end_ns)) = 1""",
    "thread_wake": f"""
WITH gaps AS (
    SELECT rank, track_id, node, t, p_t FROM _cp_chain
    WHERE NOT is_gpu AND wake AND (p_t IS NULL OR t > p_t)),
ends AS (
    SELECT rank, track_id, eid, end_ns AS t FROM cp_nodes WHERE job = $job AND NOT is_gpu)
SELECT $job, e.rank, e.eid, 'end', g.rank, g.node // 2, {_PT.format('g.node')},
       'thread_wake', g.t - e.t
FROM gaps g ASOF JOIN ends e ON e.rank = g.rank AND g.t > e.t
WHERE e.track_id <> g.track_id AND (g.p_t IS NULL OR e.t > g.p_t)""",
}

_HELPERS_SQL = f"""
CREATE OR REPLACE TEMP TABLE _cp_gpu AS
SELECT g.rank, g.eid, g.kind, g.device, g.stream, g.ts_ns, g.end_ns, g.launch_eid,
       g.launch_ts_ns, coalesce(g.is_comm, FALSE) AS is_comm
FROM gpu_ops g JOIN cp_nodes n ON n.job = $job AND n.rank = g.rank AND n.eid = g.eid
WHERE g.job = $job;
CREATE OR REPLACE TEMP TABLE _cp_cuda_sync AS
SELECT rank, eid, name, correlation, device, stream,
       TRY_CAST(args->>'wait_on_cuda_event_record_corr_id' AS BIGINT) AS rec_corr,
       TRY_CAST(args->>'wait_on_stream' AS BIGINT) AS wstream
FROM events WHERE job = $job AND kind = 'cuda_sync';
CREATE OR REPLACE TEMP TABLE _cp_runtime AS  -- the runtime calls the sync edges look up
SELECT rank, eid, name, ts_ns, end_ns, correlation FROM events
WHERE job = $job AND kind IN ('cuda_runtime', 'cuda_driver', 'accelerator_runtime')
  AND ph = 'X' AND (name IN ({", ".join(f"'{n}'" for n in SYNC_CALLS)})
                    OR correlation IN (SELECT correlation FROM _cp_cuda_sync
                                       UNION ALL SELECT rec_corr FROM _cp_cuda_sync));
CREATE OR REPLACE TEMP TABLE _cp_sync_calls AS
SELECT r.* FROM _cp_runtime r JOIN cp_nodes n ON n.job = $job AND n.rank = r.rank
  AND n.eid = r.eid
WHERE r.name IN ({", ".join(f"'{n}'" for n in SYNC_CALLS)});
"""


def _run(con: duckdb.DuckDBPyConnection, sql: str, job: str) -> None:
    """Execute ;-separated statements, binding $job in those that use it."""
    for stmt in (s.strip() for s in sql.split(";")):
        if stmt:
            con.execute(stmt, {"job": job} if "$job" in stmt else None)


def build_edges(con: duckdb.DuckDBPyConnection, job: str) -> None:
    """(Re)build the dependency graph of ``job``: its nodes into the table ``cp_nodes``
    (NODES_DDL) and its edges into ``edges`` (EDGES_DDL), the graph the critical path walks
    and the replay schedules.

    ``con`` needs the analysis views (``tracetool.connect``). Rows of other jobs already in
    the two tables are kept, so several jobs can share one connection; the helper tables it
    builds on the way are dropped."""
    _build(con, job)


def _build(con: duckdb.DuckDBPyConnection, job: str
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """build_edges, returning what it read on the way: the node columns (``_fetch_nodes``)
    and the cpu_order / gpu_order edges (``_chain``; most of the graph), so a critical path
    computed right after reads back only the other edges (``_load_graph``)."""
    _run(con, EDGES_DDL + NODES_DDL + _EVENTS_SQL, job)
    nodes = _fetch_nodes(con, job)
    chain, order = _chain(nodes)
    con.register("_cp_chain", chain)
    try:
        _run(con, _HELPERS_SQL, job)
        con.execute("DELETE FROM edges WHERE job = $job", {"job": job})
        for sql in _EDGE_SQL.values():
            con.execute("INSERT INTO edges " + sql, {"job": job})
    finally:
        con.unregister("_cp_chain")
        for t in ("_cp_gpu", "_cp_runtime", "_cp_sync_calls", "_cp_cuda_sync"):
            con.execute(f"DROP TABLE IF EXISTS {t}")
    return nodes, order


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


@dataclass
class Slots:
    """A dense numbering of a job's events across its ranks: slot = base[rank] + eid (eids
    are dense within a rank), so per-event arrays are indexed without lookups."""

    ranks: np.ndarray  # sorted
    sizes: np.ndarray  # per rank: max eid + 1
    base: np.ndarray  # per rank: first slot

    @classmethod
    def of(cls, rank: np.ndarray, eid: np.ndarray) -> Slots:
        ranks = np.unique(rank)
        sizes = np.zeros(len(ranks), dtype=np.int64)
        np.maximum.at(sizes, np.searchsorted(ranks, rank), np.asarray(eid) + 1)
        return cls(ranks, sizes, np.concatenate([[0], np.cumsum(sizes)[:-1]]))

    @property
    def n(self) -> int:
        return int(self.sizes.sum())

    def __call__(self, rank: np.ndarray, eid: np.ndarray) -> np.ndarray:
        return self.base[np.searchsorted(self.ranks, rank)] + np.asarray(eid, dtype=np.int64)


def _order_edges(order: dict[str, np.ndarray], slot_of: Slots
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, key) of the cpu_order / gpu_order edges from ``_chain``'s arrays (the rows
    ``_EDGE_SQL['order']`` inserts), as PathGraph node numbers; key = lag * 16 + kind."""
    rank, p_node, node = order["rank"], order["p_node"], order["node"]
    kind = np.where(order["is_gpu"], KIND_NAMES.index("gpu_order"),
                    KIND_NAMES.index("cpu_order"))
    return (2 * slot_of(rank, p_node >> 1) + (p_node & 1),
            2 * slot_of(rank, node >> 1) + (node & 1), order["lag"] * 16 + kind)


def _load_graph(con: duckdb.DuckDBPyConnection, job: str,
                built: tuple[dict[str, np.ndarray], pa.Table] | None = None) -> PathGraph:
    """The nodes of ``job`` (from cp_nodes) and, for each node, its binding predecessor:
    the edge into it with the smallest lag; ties go to the earlier kind in EDGE_KINDS, then
    to the lower source node, so the choice is deterministic. Two ``np.minimum.at`` passes
    over the edges, no sort. ``built``: what ``_build`` just returned for this job; then the
    nodes and the order edges come from it and only the other edges are read."""
    ev = _fetch_nodes(con, job) if built is None else built[0]
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
    parent = np.where((pe >= 0) & (pe < sizes[np.searchsorted(ranks, ev["rank"])]),
                      slot_of(ev["rank"], pe), -1)
    parent = np.where(is_node[np.maximum(parent, 0)], parent, -1)  # the parent is a node
    order = np.lexsort((ev["eid"], ev["rank"], ev["is_gpu"], ev["end_ns"]))

    skip = list(REPLAY_ONLY_KINDS) + ([] if built is None else ["cpu_order", "gpu_order"])
    e = con.execute(
        """SELECT rank_src, src_eid, enum_code(src_point) AS sp, rank_dst, dst_eid,
                  enum_code(dst_point) AS dp, enum_code(kind) AS kind, lag_ns
           FROM edges WHERE job = ? AND NOT list_contains(?, kind::VARCHAR)""",
        [job, skip]).fetchnumpy()
    src = 2 * slot_of(e["rank_src"], e["src_eid"]) + e["sp"]
    dst = 2 * slot_of(e["rank_dst"], e["dst_eid"]) + e["dp"]
    key = e["lag_ns"] * 16 + e["kind"]
    # the order edges apart: a point has at most one (its predecessor on its track), so
    # they are assigned directly and only the few others go through np.minimum.at
    if built is not None:
        o_src, o_dst, o_key = _order_edges(built[1], slot_of)
    else:
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
    return PathGraph(t=t, pred=np.where(has, pred, -1),
                  pred_kind=np.where(has, best & 15, -1).astype(np.int8),
                  ends=(2 * slot + 1)[order], rank=per_slot(ev["rank"], -1, np.int32),
                  eid=per_slot(ev["eid"], -1), track=per_slot(ev["track_id"], -1, np.int32),
                  cls=per_slot(ev["cls"], CLASSES.index("cpu"), np.int8),
                  parent=per_slot(parent, -1))


_ORDER_KINDS = np.array([k in ("cpu_order", "gpu_order") for k in KIND_NAMES])
# segment kind of a non-order edge; order edges take the class of the attributed event
_EDGE_SEGMENT = np.array([
    SEGMENT_KINDS.index({"launch": "launch_overhead", "comm_enqueue": "launch_overhead",
                         "collective": "comm"}.get(k, "idle_wait")) for k in KIND_NAMES])
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
    if step is not None and not rows:
        raise ValueError(f"job {job!r} has no step {step}")
    if rows:
        return [(s, int(a), int(b)) for s, a, b in rows]
    lo, hi = con.execute("SELECT min(ts_ns), max(end_ns) FROM cp_nodes WHERE job = ?",
                         [job]).fetchone()
    if lo is None:
        raise ValueError(f"job {job!r} has no events on CPU threads or GPU streams")
    return [(None, int(lo), int(hi))]


def has_graph(con: duckdb.DuckDBPyConnection, job: str) -> bool:
    """Whether ``con`` holds ``job``'s graph (cp_nodes and edges, from build_edges)."""
    try:
        return con.execute("SELECT count(*) > 0 FROM cp_nodes WHERE job = ?",
                           [job]).fetchone()[0]
    except duckdb.CatalogException:
        return False


def critical_path(con: duckdb.DuckDBPyConnection, job: str, step: int | None = None, *,
                  window: tuple[int, int] | None = None, include_incomplete: bool = False
                  ) -> duckdb.DuckDBPyRelation:
    """The critical path of ``job``'s step ``step`` (a job_steps row; every complete one when
    None, every one with ``include_incomplete``; the whole job when it has no ProfilerStep),
    or of an explicit ``window=(start_ns, end_ns)``.

    Builds the edges first if this connection has none for the job. The segments are stored
    in the table ``critical_path`` (see CRITICAL_PATH_DDL; earlier rows of the same job and
    steps are replaced) and returned as a relation ordered by step and seq."""
    built = None if has_graph(con, job) else _build(con, job)
    wins = _windows(con, job, step, window, include_incomplete)
    walker = PathWalker(_load_graph(con, job, built))
    del built
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
    con.execute(f"DELETE FROM critical_path WHERE job = ? AND {where}", [job])
    con.register("_cp_seg", table)
    try:
        con.execute(f"""
            INSERT INTO critical_path
            SELECT $job, s.step, s.seq, s.rank, s.track_id, tr.track_kind, s.eid, a.name,
                   {_SEGMENT_KIND_SQL}[s.kind + 1], {_EDGE_KIND_SQL}[s.edge_kind + 1],
                   s.start_ns, s.end_ns, s.end_ns - s.start_ns
            FROM _cp_seg s
            LEFT JOIN cp_nodes a ON a.job = $job AND a.rank = s.rank AND a.eid = s.eid
            LEFT JOIN tracks tr ON tr.job = $job AND tr.rank = s.rank
                               AND tr.track_id = s.track_id""", {"job": job})
    finally:
        con.unregister("_cp_seg")
    return con.sql(f"SELECT * FROM critical_path WHERE job = ? AND {where} ORDER BY step, seq",
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
    path = critical_path(con, job, step, window=window)
    cols = _SUMMARY_BY[by]
    return path.query("_cp_path", f"""
        SELECT job, step, {cols}, count(*) AS segments, sum(dur_ns)::BIGINT AS dur_ns,
               sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY job, step) AS share
        FROM _cp_path GROUP BY job, step, {cols} ORDER BY step, dur_ns DESC""")
