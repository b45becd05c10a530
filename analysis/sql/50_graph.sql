-- The dependency graph across ranks: the critical path walks it and the replay schedules it
-- (docs/critical_path.md). Needs: cp_nodes, rank_edges (each rank's graph, built at ingest),
-- gpu_ops (store tables), collective_ranks (40_collectives.sql).
--
-- Every edge kind but one depends on one rank's events only and is stored per rank
-- (rank_edges). The one between ranks is added here: a collective's transfer ends on every
-- rank only after the last rank arrived, so the end of each rank's collective kernel (or
-- gloo span) depends on the start of the last-arriving rank's one. Rank clocks are used as
-- recorded (ranks of one host share a clock; across hosts NTP keeps them within tens of
-- microseconds, below a collective's duration); such an edge is drawn only when it is causal
-- in recorded times (the last arrival started before this rank's transfer ended), so skew
-- can at worst drop an edge, never break the critical path's contiguity.

-- @view collective_edges: the 'collective' edges, one per instance and rank that did not
--   arrive last. All columns of edges (the view below), kind = 'collective'.
-- One instance = one collective call on every rank (collective_ranks.instance, the one key of
-- 40_collectives.sql). A job whose collectives table has no transfer events (no kernel or
-- gloo span found) matches its communication kernels by their order on each rank
-- (instance 'kernel:<n>').
CREATE OR REPLACE VIEW collective_edges WITH (DEFER_BINDING) AS
WITH calls AS (
    SELECT job, rank, instance, coalesce(kernel_eid, gloo_eid) AS x_eid
    FROM collective_ranks
    WHERE instance IS NOT NULL AND coalesce(kernel_eid, gloo_eid) IS NOT NULL),
comm AS MATERIALIZED (  -- (jobs without matched calls first: usually none, and then the
                         -- scan of cp_nodes below has nothing to look up)
    SELECT g.job, g.rank, g.eid, g.ts_ns FROM gpu_ops g
    WHERE coalesce(g.is_comm, FALSE) AND g.job NOT IN (SELECT job FROM calls)),
inst AS (
    SELECT * FROM calls
    UNION ALL
    SELECT g.job, g.rank,
           'kernel:' || row_number() OVER (PARTITION BY g.job, g.rank ORDER BY g.ts_ns, g.eid),
           g.eid
    FROM comm g SEMI JOIN cp_nodes n ON n.job = g.job AND n.rank = g.rank AND n.eid = g.eid),
x AS (
    SELECT i.job, i.rank, i.instance, i.x_eid, n.ts_ns, n.end_ns FROM inst i
    JOIN cp_nodes n ON n.job = i.job AND n.rank = i.rank AND n.eid = i.x_eid),
last AS (
    SELECT job, instance, rank AS l_rank, x_eid AS l_eid, ts_ns AS l_ts FROM x
    QUALIFY row_number() OVER (PARTITION BY job, instance ORDER BY ts_ns DESC, rank) = 1)
SELECT x.job, l.l_rank AS rank_src, l.l_eid AS src_eid, 'start' AS src_point,
       x.rank AS rank_dst, x.x_eid AS dst_eid, 'end' AS dst_point, 'collective' AS kind,
       x.end_ns - l.l_ts AS lag_ns
FROM x JOIN last l USING (job, instance)
WHERE x.rank <> l.l_rank AND l.l_ts <= x.end_ns;

-- @view intra_rank_edges: the edges within one rank (every kind but 'collective': the
--   store's rank_edges). All columns of edges (the view below), rank_src = rank_dst. A job
--   of one rank has no other edges (critical-path reads only these then: collective_edges
--   costs a matching of the job's collectives).
CREATE OR REPLACE VIEW intra_rank_edges WITH (DEFER_BINDING) AS
SELECT job, rank AS rank_src, src_eid, src_point, rank AS rank_dst, dst_eid, dst_point, kind,
       lag_ns
FROM rank_edges;

-- @view edges: the job's whole dependency graph, one row per edge: the point (dst) could not
--   happen before the point (src).
-- job: job of both ends (edges never cross jobs).
-- rank_src, src_eid, src_point: the point the edge starts from: the start ('start') or the
--   end ('end') of event src_eid (cp_nodes.eid) of rank rank_src.
-- rank_dst, dst_eid, dst_point: the point that depends on it (same encoding).
-- kind: cpu_order, gpu_order, launch, sync, host_wait, collective, stream_wait,
--   event_wait, comm_wait, comm_enqueue, thread_wake, transfer_wake
--   (tracetool.graph.EDGE_KINDS: what each one
--   means and where it comes from). Only 'collective' joins two ranks.
-- lag_ns: time of the dst point minus time of the src point, >= 0 (on the two ranks'
--   recorded clocks for 'collective', and transfer_wake may be slightly negative). The src
--   with the smallest lag into a point is the dependency that was satisfied last: the one
--   the critical path follows (it does not walk transfer_wake edges: the replay's only).
CREATE OR REPLACE VIEW edges WITH (DEFER_BINDING) AS
SELECT * FROM intra_rank_edges
UNION ALL
SELECT * FROM collective_edges;
