"""Each rank's dependency graph, built once at ingest: the tables cp_nodes and rank_edges.

The model is HTA's (``hta/analyzers/critical_path_analysis.py``): nodes are the start and end
points of events (CPU ops, annotations and runtime calls on CPU threads; kernels, copies and
memsets on GPU streams), and an edge ``src -> dst`` says "dst could not happen before src"
(the kinds: ``tracetool.graph.EDGE_KINDS``). Every edge but the cross-rank 'collective' one
depends only on the rank's own events, so it is derived here, set-based in DuckDB over the
rank's freshly written tables, and stored; ``critical-path`` and ``replay`` then read it
instead of rebuilding it on every call, and only the collective edges between ranks are
joined at query time (analysis view ``collective_edges``). See docs/critical_path.md.

The order of points on a track (``_CHAIN``) is a DuckDB window, not a numpy sort, so a rank
of any size is built under the ingest's memory limit (DuckDB spills).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from tracetool.graph import (
    EVENT_RECORD_CALLS,
    HOST_POLL_GAP_NS,
    HOST_WAIT_CHANCE,
    HOST_WAIT_MIN_GAP_NS,
    HOST_WAIT_TOL_NS,
    POLL_CALLS,
    STREAM_WAIT_CALLS,
    SYNC_CALLS,
)


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{n}'" for n in names)


_BASE = """
CREATE OR REPLACE TEMP TABLE _g_base AS
WITH gloo AS (SELECT DISTINCT file, gloo_eid AS eid FROM {collectives}
              WHERE gloo_eid IS NOT NULL),
base AS MATERIALIZED (
    SELECT e.file, e.eid, e.track_id, e.name, e.ts_ns, e.end_ns, coalesce(e.depth, 0) AS depth,
           e.parent_eid,
           CASE WHEN g.eid IS NOT NULL THEN
                    CASE WHEN g.is_comm THEN 'comm' WHEN g.kind = 'kernel' THEN 'compute'
                         ELSE 'memcpy' END
                WHEN c.eid IS NOT NULL THEN 'comm' ELSE 'cpu' END AS cls,
           g.eid IS NOT NULL AS is_gpu,
           g.eid IS NULL AND c.eid IS NULL
               AND (e.kind = 'user_annotation' OR e.name LIKE 'ProfilerStep#%'
                    OR (e.kind = 'cpu_op' AND e.name ILIKE '%wait%')) AS waitable
    FROM {events} e
    LEFT JOIN {gpu_ops} g ON g.file = e.file AND g.eid = e.eid
    LEFT JOIN gloo c ON c.file = e.file AND c.eid = e.eid
    WHERE e.ph = 'X' AND e.dur_ns >= 0
      AND (g.eid IS NOT NULL
           OR (e.track_kind = 'cpu_thread' AND e.kind NOT IN ('kernel', 'memcpy', 'memset'))))
SELECT b.*, coalesce(p.waitable, TRUE) AND NOT b.is_gpu AND b.cls = 'cpu' AS wake_start
FROM base b LEFT JOIN base p ON p.file = b.file AND p.eid = b.parent_eid
"""

# Points of every track in time order, as nodes eid * 2 + (0 start | 1 end). At the same
# instant: ends of slices first (half-open intervals; deeper ones first), then starts and
# zero-length events by depth, so an event's start precedes the points nested in it. p_node,
# p_t: the previous point on the track (NULL for the first); wake: wake_start of a start
# point, waitable of an end point.
_CHAIN = """
CREATE OR REPLACE TEMP TABLE _g_chain AS
WITH pts AS (
    SELECT file, track_id, is_gpu, 2 * eid AS node, ts_ns AS t, 4096 + depth AS prio,
           wake_start AS wake FROM _g_nodes
    UNION ALL
    SELECT file, track_id, is_gpu, 2 * eid + 1, end_ns,
           CASE WHEN end_ns > ts_ns THEN 2048 - depth ELSE 4096 + depth END, waitable
    FROM _g_nodes)
SELECT file, track_id, is_gpu, node, t, coalesce(wake, FALSE) AS wake,
       lag(node) OVER w AS p_node, lag(t) OVER w AS p_t
FROM pts WINDOW w AS (PARTITION BY file, track_id ORDER BY t, prio, node)
"""

_SYNC_NAMES = _names(SYNC_CALLS)
_HELPERS = [
    """CREATE OR REPLACE TEMP TABLE _g_gpu AS
       SELECT g.file, g.eid, g.kind, g.device, g.stream, g.ts_ns, g.end_ns, g.launch_eid,
              g.launch_ts_ns, coalesce(g.is_comm, FALSE) AS is_comm
       FROM {gpu_ops} g SEMI JOIN _g_nodes n ON n.file = g.file AND n.eid = g.eid""",
    """CREATE OR REPLACE TEMP TABLE _g_cuda_sync AS
       SELECT file, eid, name, correlation, device, stream,
              TRY_CAST(args->>'wait_on_cuda_event_record_corr_id' AS BIGINT) AS rec_corr,
              TRY_CAST(args->>'wait_on_stream' AS BIGINT) AS wstream
       FROM {events} WHERE kind = 'cuda_sync'""",
    f"""CREATE OR REPLACE TEMP TABLE _g_runtime AS  -- the runtime calls the sync edges read
       WITH corr AS (SELECT file, correlation AS c FROM _g_cuda_sync
                     UNION SELECT file, rec_corr FROM _g_cuda_sync)
       SELECT e.file, e.eid, e.name, e.ts_ns, e.end_ns, e.correlation FROM {{events}} e
       LEFT JOIN corr k ON k.file = e.file AND k.c = e.correlation
       WHERE e.kind IN ('cuda_runtime', 'cuda_driver', 'accelerator_runtime') AND e.ph = 'X'
         AND (e.name IN ({_SYNC_NAMES}) OR k.c IS NOT NULL)""",
    f"""CREATE OR REPLACE TEMP TABLE _g_sync_calls AS
       SELECT r.* FROM _g_runtime r SEMI JOIN _g_nodes n ON n.file = r.file AND n.eid = r.eid
       WHERE r.name IN ({_SYNC_NAMES})""",
]

_PT = "CASE WHEN {} % 2 = 0 THEN 'start' ELSE 'end' END"  # point of a node


def at(t: str, eid: str = "0") -> str:
    """An ASOF JOIN key unique per event: the time, then the eid (< 2**40). Points at the
    same instant are common (us-resolution traces), and an ASOF JOIN picks any one of tied
    rows; with this key it picks the same one on every run (the highest eid among ties for
    >, the lowest for <=), so a re-ingest stores the same edges."""
    return f"({t})::HUGEINT * 1099511627776 + {eid}"  # 2**40: no shift (times may be < 0)


def at_or_after(t: str) -> str:
    """The left key of ``at_or_after(a) >= at(b, eid)``, which holds when a >= b."""
    return at(t, "1099511627775")


_POLL_NAMES = _names(POLL_CALLS)
# Recorded poll loops that are host waits (tracetool.graph.POLL_CALLS): per thread, runs of
# poll calls in start order with no other event starting between them and at most
# HOST_POLL_GAP_NS from one's end to the next's start; a run that lasts HOST_WAIT_MIN_GAP_NS
# and whose last call ends within HOST_WAIT_TOL_NS after a GPU op's end (few enough ops ended
# in it: the host_wait chance test) waited for that op (src, ended at e_t). Only the threads
# that made a poll call are windowed.
_POLLS = f"""
CREATE OR REPLACE TEMP TABLE _g_polls AS
WITH t AS (SELECT DISTINCT file, track_id FROM _g_base WHERE name IN ({_POLL_NAMES})),
seq AS (
    SELECT b.file, b.track_id, b.eid, b.ts_ns, b.end_ns, b.depth,
           b.name IN ({_POLL_NAMES}) AS poll,
           lag(b.end_ns) OVER (PARTITION BY b.file, b.track_id
                               ORDER BY b.ts_ns, b.depth, b.eid) AS p_end
    FROM _g_base b SEMI JOIN t ON t.file = b.file AND t.track_id = b.track_id),
runs AS (  -- any other event starts a new run (which its own row leaves out: not poll)
    SELECT *, sum(CASE WHEN poll AND ts_ns - p_end <= {HOST_POLL_GAP_NS} THEN 0 ELSE 1 END)
                  OVER (PARTITION BY file, track_id ORDER BY ts_ns, depth, eid) AS run
    FROM seq),
r AS (
    SELECT file, track_id, min(ts_ns) AS ts_ns, max(end_ns) AS end_ns, count(*) AS n_calls
    FROM runs WHERE poll GROUP BY file, track_id, run
    HAVING max(end_ns) - min(ts_ns) >= {HOST_WAIT_MIN_GAP_NS}),
ends AS (
    SELECT file, eid, end_ns AS t, row_number() OVER (PARTITION BY file ORDER BY end_ns, eid) AS k
    FROM _g_base WHERE is_gpu AND file IN (SELECT file FROM r)),
hit AS (
    SELECT r.*, e.eid AS src, e.t AS e_t, e.k FROM r
    ASOF JOIN ends e ON e.file = r.file AND {at_or_after('r.end_ns')} >= {at('e.t', 'e.eid')}),
counted AS (
    SELECT h.*, h.k - coalesce(b.k, 0) AS n_in_run FROM hit h
    ASOF LEFT JOIN ends b ON b.file = h.file
                         AND {at_or_after('h.ts_ns')} >= {at('b.t', 'b.eid')})
SELECT file, track_id, ts_ns, end_ns, n_calls, src, e_t FROM counted
WHERE e_t > ts_ns AND end_ns - e_t <= {HOST_WAIT_TOL_NS}
  AND n_in_run * {HOST_WAIT_TOL_NS * HOST_WAIT_CHANCE} <= end_ns - ts_ns
"""

# The graph's nodes: every event of _g_base but the calls of the poll loops of _g_polls (the
# loop is a wait, a gap on its thread, not CPU work; host_wait ends it). No loop's calls
# enclose another event, so no node's parent is left out (wake_start holds). Without such a
# loop (nearly every rank), _g_base is renamed instead: no copy
_NODES = f"""
CREATE OR REPLACE TEMP TABLE _g_nodes AS
SELECT * FROM _g_base b
WHERE NOT EXISTS (SELECT 1 FROM _g_polls r
                  WHERE r.file = b.file AND r.track_id = b.track_id AND b.ts_ns >= r.ts_ns
                    AND b.end_ns <= r.end_ns AND b.name IN ({_POLL_NAMES}))
"""

# Each query gives (file, src_eid, src_point, dst_eid, dst_point, kind, lag_ns); every join
# and ASOF join is within one file (a derivation batch holds several ranks' files).
_EDGES: dict[str, str] = {
    "order": f"""
SELECT file, p_node // 2, {_PT.format('p_node')}, node // 2, {_PT.format('node')},
       CASE WHEN is_gpu THEN 'gpu_order' ELSE 'cpu_order' END, t - p_t
FROM _g_chain WHERE p_node IS NOT NULL""",
    "launch": """
SELECT g.file, g.launch_eid, 'start', g.eid, 'start', 'launch', g.ts_ns - l.ts_ns
FROM _g_gpu g JOIN _g_nodes l ON l.file = g.file AND l.eid = g.launch_eid
WHERE g.ts_ns >= l.ts_ns""",
    # a copy call that returned after its copy ended waited for it
    "sync_memcpy": """
SELECT g.file, g.eid, 'end', c.eid, 'end', 'sync', c.end_ns - g.end_ns
FROM _g_gpu g JOIN _g_nodes c ON c.file = g.file AND c.eid = g.launch_eid
WHERE g.kind IN ('memcpy', 'memset') AND g.end_ns <= c.end_ns
  AND regexp_matches(c.name, '^(cuda|hip|cu)Mem(cpy|set)')""",
    # synchronize calls: the awaited op is the last one to end before the call returned,
    # among the ops of the synchronized stream (Stream Sync), the recorded event's op
    # (Event Sync), or all ops of the rank (device sync, or no cuda_sync events)
    "sync_calls": f"""
WITH s AS (
    SELECT s.file, s.eid, s.ts_ns, s.end_ns, y.name AS sync_kind, y.device, y.stream,
           y.rec_corr, y.wstream
    FROM _g_sync_calls s LEFT JOIN _g_cuda_sync y
      ON y.file = s.file AND y.correlation = s.correlation
     AND y.name IN ('Stream Sync', 'Event Sync', 'Context Sync')),
by_stream AS (
    SELECT s.file, g.eid AS src, s.eid AS dst, s.end_ns - g.end_ns AS lag, g.launch_ts_ns,
           s.ts_ns
    FROM (SELECT * FROM s WHERE sync_kind = 'Stream Sync') s
    ASOF JOIN _g_gpu g ON g.file = s.file AND g.device = s.device AND g.stream = s.stream
                      AND {at_or_after('s.end_ns')} >= {at('g.end_ns', 'g.eid')}),
by_event AS (
    SELECT s.file, g.eid AS src, s.eid AS dst, s.end_ns - g.end_ns AS lag, g.launch_ts_ns,
           s.ts_ns
    FROM (SELECT s.*, r.ts_ns AS rec_ts FROM s
          JOIN _g_runtime r ON r.file = s.file AND r.correlation = s.rec_corr
          WHERE s.sync_kind = 'Event Sync') s
    ASOF JOIN _g_gpu g ON g.file = s.file AND g.device = s.device AND g.stream = s.wstream
                      AND {at_or_after('s.rec_ts')} >= {at('g.launch_ts_ns', 'g.eid')}),
by_rank AS (
    SELECT s.file, g.eid AS src, s.eid AS dst, s.end_ns - g.end_ns AS lag, g.launch_ts_ns,
           s.ts_ns
    FROM (SELECT * FROM s WHERE sync_kind IS NULL OR sync_kind = 'Context Sync'
                            OR (sync_kind = 'Event Sync' AND coalesce(rec_corr, -1) < 0)) s
    ASOF JOIN _g_gpu g ON g.file = s.file
                      AND {at_or_after('s.end_ns')} >= {at('g.end_ns', 'g.eid')}),
a AS (SELECT * FROM by_stream UNION ALL SELECT * FROM by_event UNION ALL SELECT * FROM by_rank)
SELECT file, src, 'end', dst, 'end', 'sync', lag FROM a
WHERE lag >= 0 AND coalesce(launch_ts_ns <= ts_ns, TRUE)""",
    "stream_wait": f"""
WITH w AS (
    SELECT y.file, y.device, y.stream, y.wstream, c.ts_ns AS call_ts, r.ts_ns AS rec_ts
    FROM _g_cuda_sync y
    JOIN _g_runtime c ON c.file = y.file AND c.correlation = y.correlation
    JOIN _g_runtime r ON r.file = y.file AND r.correlation = y.rec_corr
    WHERE y.name = 'Stream Wait Event'),
src AS (
    SELECT w.*, g.eid AS src_eid, g.end_ns AS src_end FROM w
    ASOF JOIN _g_gpu g ON g.file = w.file AND g.device = w.device AND g.stream = w.wstream
                      AND {at_or_after('w.rec_ts')} >= {at('g.launch_ts_ns', 'g.eid')}),
pair AS (
    SELECT s.file, s.src_eid, s.src_end, h.eid AS dst_eid, h.ts_ns AS dst_ts FROM src s
    ASOF JOIN _g_gpu h ON h.file = s.file AND h.device = s.device AND h.stream = s.stream
                      AND {at('s.call_ts')} <= {at('h.launch_ts_ns', 'h.eid')})
SELECT DISTINCT file, src_eid, 'end', dst_eid, 'start', 'stream_wait', dst_ts - src_end
FROM pair WHERE dst_ts >= src_end""",
    # only on a rank whose trace has no cuda_sync stream waits: each cudaStreamWaitEvent
    # waits for the event its thread recorded last before it; the recorded stream is the one
    # the thread launched on last before the record (PyTorch records on the current stream,
    # which the thread just used: c10d's and Stream.wait_stream's pattern), the waiting
    # stream the first other stream the thread launches on after the wait
    "event_wait": f"""
WITH calls AS (
    SELECT n.file, n.track_id, n.eid, n.ts_ns, n.name IN ({_names(STREAM_WAIT_CALLS)}) AS wait
    FROM _g_nodes n
    ANTI JOIN (SELECT DISTINCT file FROM _g_cuda_sync WHERE name = 'Stream Wait Event') y
           ON y.file = n.file
    WHERE n.name IN ({_names(STREAM_WAIT_CALLS + EVENT_RECORD_CALLS)})),
launched AS (  -- the GPU ops each thread launched, in launch order, in runs of one stream
    SELECT *, sum(CASE WHEN prev_dev IS NOT DISTINCT FROM device
                        AND prev_stream IS NOT DISTINCT FROM stream THEN 0 ELSE 1 END)
                  OVER (PARTITION BY file, track_id ORDER BY launch_ts_ns, eid) AS run
    FROM (SELECT g.file, l.track_id, g.eid, g.device, g.stream, g.ts_ns, g.end_ns,
                 g.launch_ts_ns,
                 lag(g.device) OVER w AS prev_dev, lag(g.stream) OVER w AS prev_stream
          FROM _g_gpu g JOIN _g_nodes l ON l.file = g.file AND l.eid = g.launch_eid
          WINDOW w AS (PARTITION BY g.file, l.track_id ORDER BY g.launch_ts_ns, g.eid))),
run_first AS (
    SELECT file, track_id, run, arg_min(eid, (launch_ts_ns, eid)) AS eid,
           arg_min(ts_ns, (launch_ts_ns, eid)) AS ts_ns
    FROM launched GROUP BY ALL),
w AS (
    SELECT w.file, w.track_id, w.ts_ns AS wait_ts, w.eid AS wait_eid, r.ts_ns AS rec_ts,
           r.eid AS rec_eid
    FROM (SELECT * FROM calls WHERE wait) w
    ASOF JOIN (SELECT * FROM calls WHERE NOT wait) r
           ON r.file = w.file AND r.track_id = w.track_id
          AND {at('w.ts_ns', 'w.eid')} > {at('r.ts_ns', 'r.eid')}),
src AS (
    SELECT w.*, g.eid AS src_eid, g.end_ns AS src_end, g.device AS s_dev, g.stream AS s_stream
    FROM w ASOF JOIN launched g
      ON g.file = w.file AND g.track_id = w.track_id
     AND {at('w.rec_ts', 'w.rec_eid')} > {at('g.launch_ts_ns', 'g.eid')}),
nxt AS (
    SELECT s.*, h.eid AS h_eid, h.ts_ns AS h_ts, h.run,
           h.device IS NOT DISTINCT FROM s.s_dev AND h.stream IS NOT DISTINCT FROM s.s_stream
               AS same
    FROM src s ASOF JOIN launched h
      ON h.file = s.file AND h.track_id = s.track_id
     AND {at('s.wait_ts', 's.wait_eid')} < {at('h.launch_ts_ns', 'h.eid')}),
pair AS (
    SELECT n.file, n.src_eid, n.src_end,
           CASE WHEN n.same THEN f.eid ELSE n.h_eid END AS dst_eid,
           CASE WHEN n.same THEN f.ts_ns ELSE n.h_ts END AS dst_ts
    FROM nxt n LEFT JOIN run_first f
      ON f.file = n.file AND f.track_id = n.track_id AND f.run = n.run + 1)
SELECT DISTINCT file, src_eid, 'end', dst_eid, 'start', 'event_wait', dst_ts - src_end
FROM pair WHERE dst_eid IS NOT NULL AND dst_ts >= src_end""",
    # a thread that resumed after a long gap within a tolerance of a GPU op's end waited for
    # it (polling, spinning on pinned memory; a launch call blocked on a full launch queue
    # returns as an op ends and frees a slot), when few enough ops ended in the gap that the
    # coincidence is no chance (tracetool.graph.HOST_WAIT_*); sync calls, and a copy call's
    # wait for its own copy, have their sync edge. The point after a recorded poll loop
    # (_g_polls: its calls are no nodes) waited for the op its last call saw end (tested
    # there; the latest loop, when several end in one hop)
    "host_wait": f"""
WITH ends AS (
    SELECT file, eid, end_ns AS t, launch_eid,
           row_number() OVER (PARTITION BY file ORDER BY end_ns, eid) AS k
    FROM _g_gpu),
polled AS (  -- the point after a poll loop: its hop on the thread spans the loop's end
    SELECT c.file, c.node, c.t, r.src, r.e_t FROM _g_polls r
    JOIN _g_chain c ON c.file = r.file AND c.track_id = r.track_id AND c.t >= r.end_ns
                   AND (c.p_t IS NULL OR c.p_t < r.end_ns)
    ANTI JOIN _g_sync_calls s ON s.file = c.file AND 2 * s.eid + 1 = c.node
    QUALIFY row_number() OVER (PARTITION BY c.file, c.node ORDER BY r.end_ns DESC) = 1),
gaps AS (
    SELECT c.file, c.node, c.t, c.p_t FROM _g_chain c
    ANTI JOIN _g_sync_calls s ON s.file = c.file AND 2 * s.eid + 1 = c.node
    ANTI JOIN polled p ON p.file = c.file AND p.node = c.node
    WHERE NOT c.is_gpu AND c.t - c.p_t >= {HOST_WAIT_MIN_GAP_NS}),
hit AS (
    SELECT g.*, e.eid AS src, e.t AS e_t, e.k, e.launch_eid FROM gaps g
    ASOF JOIN ends e ON e.file = g.file AND {at_or_after('g.t')} >= {at('e.t', 'e.eid')}),
counted AS (
    SELECT h.*, h.k - coalesce(b.k, 0) AS n_in_gap FROM hit h
    ASOF LEFT JOIN ends b ON b.file = h.file AND {at_or_after('h.p_t')} >= {at('b.t', 'b.eid')})
SELECT file, src, 'end', node // 2, {_PT.format('node')}, 'host_wait', t - e_t FROM counted
WHERE e_t > p_t AND t - e_t <= {HOST_WAIT_TOL_NS}
  AND NOT (node % 2 = 1 AND launch_eid IS NOT DISTINCT FROM node // 2)  -- its own copy: sync
  AND n_in_gap * {HOST_WAIT_TOL_NS * HOST_WAIT_CHANCE} <= t - p_t
UNION ALL
SELECT file, src, 'end', node // 2, {_PT.format('node')}, 'host_wait', t - e_t FROM polled""",
    # only on a rank whose trace has no cuda_sync stream waits
    "comm_wait": f"""
WITH k AS (SELECT g.* FROM _g_gpu g
           ANTI JOIN (SELECT DISTINCT file FROM _g_cuda_sync
                      WHERE name = 'Stream Wait Event') w ON w.file = g.file
           WHERE g.is_comm AND g.launch_ts_ns IS NOT NULL),
c AS (SELECT * FROM _g_gpu WHERE NOT is_comm AND launch_ts_ns IS NOT NULL),
pre AS (
    SELECT k.file, c.eid AS src, 'end' AS sp, k.eid AS dst, 'start' AS dp,
           k.ts_ns - c.end_ns AS lag, c.stream <> k.stream AS other
    FROM k ASOF JOIN c ON c.file = k.file AND c.device = k.device
                      AND {at('k.launch_ts_ns')} > {at('c.launch_ts_ns', 'c.eid')}),
post AS (
    SELECT k.file, k.eid, 'end', c.eid, 'start', c.ts_ns - k.end_ns,
           c.stream <> k.stream AND c.launch_ts_ns >= k.launch_ts_ns
    FROM k ASOF JOIN c ON c.file = k.file AND c.device = k.device
                      AND {at('k.end_ns')} <= {at('c.ts_ns', 'c.eid')})
SELECT file, src, sp, dst, dp, 'comm_wait', lag
FROM (SELECT * FROM pre UNION ALL SELECT * FROM post) WHERE other AND lag >= 0""",
    "comm_enqueue": """
SELECT c.file, c.eid, 'start', c.gloo_eid, 'start', 'comm_enqueue', g.ts_ns - s.ts_ns
FROM {collectives} c
JOIN _g_nodes g ON g.file = c.file AND g.eid = c.gloo_eid
JOIN _g_nodes s ON s.file = c.file AND s.eid = c.eid
WHERE g.ts_ns >= s.ts_ns""",
    # a thread that went idle while a gloo span was in flight resumed when it ended; or it
    # waited inside an op (the gap ends at the op's end): a wait op, or the op that had just
    # enqueued that very collective (an autograd function around all_to_all_single, which
    # the span may start after), and the op ended as the transfer did (for its own
    # collective: within a quarter of the gap, a busy core wakes a thread late)
    "transfer_wake": f"""
WITH gaps AS (SELECT * FROM _g_chain WHERE NOT is_gpu AND t > p_t),
spans AS (
    SELECT DISTINCT e.file, e.track_id, e.eid, e.ts_ns, e.end_ns, c.eid AS call_eid,
           greatest(100000, (e.end_ns - e.ts_ns) // 20) AS tol
    FROM _g_nodes e JOIN {{collectives}} c ON c.file = e.file AND c.gloo_eid = e.eid)
SELECT g.file, s.eid, 'end', g.node // 2, {_PT.format('g.node')}, 'transfer_wake',
       g.t - s.end_ns
FROM gaps g JOIN spans s ON s.file = g.file AND s.track_id <> g.track_id
 AND s.end_ns > g.p_t AND s.end_ns <= g.t + s.tol
 AND CASE WHEN g.node % 2 = 0 THEN s.ts_ns <= g.p_t
          WHEN g.p_node = 2 * s.call_eid + 1
              THEN g.t - s.end_ns <= greatest(s.tol, (g.t - g.p_t) // 4)
          ELSE g.wake AND s.ts_ns <= g.p_t AND g.t - s.end_ns <= s.tol END
QUALIFY row_number() OVER (PARTITION BY g.file, g.node
                           ORDER BY abs(g.t - s.end_ns), s.eid) = 1""",
    # a thread that resumed after an idle or waiting gap resumed because of the latest end
    # of an event on another thread of the rank inside that gap (if there was one)
    "thread_wake": f"""
WITH gaps AS (
    SELECT file, track_id, node, t, p_t FROM _g_chain
    WHERE NOT is_gpu AND wake AND (p_t IS NULL OR t > p_t)),
ends AS (SELECT file, track_id, eid, end_ns AS t FROM _g_nodes WHERE NOT is_gpu)
SELECT g.file, e.eid, 'end', g.node // 2, {_PT.format('g.node')}, 'thread_wake', g.t - e.t
FROM gaps g ASOF JOIN ends e ON e.file = g.file AND {at('g.t')} > {at('e.t', 'e.eid')}
WHERE e.track_id <> g.track_id AND (g.p_t IS NULL OR e.t > g.p_t)""",
}

_TEMP = ("_g_base", "_g_polls", "_g_nodes", "_g_chain", "_g_gpu", "_g_cuda_sync", "_g_runtime",
         "_g_sync_calls")


@contextmanager
def rank_graph(con: duckdb.DuckDBPyConnection, tables: dict[str, str]
               ) -> Iterator[dict[str, str]]:
    """The queries of the ranks' cp_nodes and rank_edges (tracetool.schema, plus each row's
    ``file`` in the derivation batch), by table name, valid inside the ``with``: they read
    temp tables built here and dropped on exit. ``tables``: SQL reading the batch's written
    events, gpu_ops and collectives (with ``file``)."""
    try:
        con.execute(_BASE.format(**tables))
        con.execute(_POLLS)
        if con.execute("SELECT count(*) FROM _g_polls").fetchone() != (0,):
            con.execute(_NODES)
            con.execute("DROP TABLE _g_base")
        else:
            con.execute("ALTER TABLE _g_base RENAME TO _g_nodes")
        con.execute(_CHAIN)
        for sql in _HELPERS:
            con.execute(sql.format(**tables))
        edges = "\nUNION ALL\n".join(f"({sql.format(**tables)})" for sql in _EDGES.values())
        yield {"cp_nodes": "SELECT * FROM _g_nodes",
               "rank_edges": f"""SELECT c0 AS file, c1 AS src_eid, c2 AS src_point,
                                        c3 AS dst_eid, c4 AS dst_point, c5 AS kind,
                                        c6 AS lag_ns
                                 FROM ({edges}) AS e(c0, c1, c2, c3, c4, c5, c6)"""}
    finally:
        for t in _TEMP:
            con.execute(f"DROP TABLE IF EXISTS {t}")
