-- Unexplained GPU gaps: the GPU idle while work was already launched, far longer than a
-- launch. The one definition the critical path (its unexplained_gap segments,
-- tracetool.analysis.critical_path) and step_breakdown (unexplained_gap_ns) both read;
-- docs/critical_path.md "Gaps told apart".

-- @view gpu_wait_gaps: GPU ops that waited, launched and free to run, for no recorded reason.
--   One row per GPU op (gpu_ops) with a recorded launch whose wait qualifies.
-- An op is ready at ready_ns, the latest of: its launch call's end (the work is queued by
--   then; a launch call that itself takes long, e.g. loading a module, is launch overhead),
--   the latest end of the earlier ops on its stream, and the end of every GPU op its start
--   waits for across streams (rank_edges of kind stream_wait, event_wait, comm_wait).
-- threshold_ns: per rank, max(1 ms, 20 x the median start delay of its GPU ops), the start
--   delay of an op being ts_ns minus the later of its launch call's start and the latest end
--   of the earlier ops on its stream (launch latency on an idle stream, the gap between
--   back-to-back ops on a busy one): far above the rank's usual launch latency (1 ms on
--   every trace of ../shared/traces with more than 20 GPU ops).
-- The op's wait qualifies when ts_ns - ready_ns > threshold_ns and no GPU op of the rank ran
--   for more than threshold_ns of it (a kernel on another stream running through the wait
--   is contention, not missing work).
-- job, rank, device, stream, eid: the op. start_ns, end_ns: its wait (ready_ns, ts_ns).
-- wait_ns: end_ns - start_ns. idle_ns: the part of it with no GPU op of the rank running.
-- Likely causes: a clock jump, GPU work outside the trace (queued before the profiler
--   started, another process), a GPU op the profiler missed.
CREATE OR REPLACE VIEW gpu_wait_gaps WITH (DEFER_BINDING) AS
WITH o AS MATERIALIZED (
    SELECT job, rank, device, stream, eid, ts_ns, end_ns, launch_eid,
           CASE WHEN launch_ts_ns <= ts_ns THEN launch_ts_ns END AS launch_ns,
           max(end_ns) OVER (PARTITION BY job, rank, device, stream ORDER BY ts_ns, eid
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
    FROM gpu_ops),
d AS (SELECT *, greatest(launch_ns, prev_end_ns) AS early_ns FROM o),  -- NULLs ignored
thr AS (
    SELECT job, rank, greatest(1000000, 20 * median(ts_ns - early_ns))::BIGINT AS threshold_ns
    FROM d WHERE early_ns <= ts_ns GROUP BY job, rank),
pre AS (  -- long enough even from the launch call's start: the few worth a closer look
    SELECT d.*, t.threshold_ns FROM d JOIN thr t USING (job, rank)
    WHERE d.launch_ns IS NOT NULL AND d.ts_ns - d.early_ns > t.threshold_ns),
deps AS (  -- the latest end of the ops each one waits for across streams
    SELECT e.job, e.rank, e.dst_eid AS eid, max(g.end_ns) AS dep_end_ns
    FROM rank_edges e
    SEMI JOIN pre p ON p.job = e.job AND p.rank = e.rank AND p.eid = e.dst_eid
    JOIN gpu_ops g ON g.job = e.job AND g.rank = e.rank AND g.eid = e.src_eid
    WHERE e.kind IN ('stream_wait', 'event_wait', 'comm_wait') AND e.dst_point = 'start'
    GROUP BY ALL),
cand AS (
    SELECT p.*, greatest(p.prev_end_ns, l.end_ns, x.dep_end_ns) AS ready_ns FROM pre p
    JOIN events l ON l.job = p.job AND l.rank = p.rank AND l.eid = p.launch_eid
    LEFT JOIN deps x ON x.job = p.job AND x.rank = p.rank AND x.eid = p.eid
    WHERE p.ts_ns - greatest(p.prev_end_ns, l.end_ns, x.dep_end_ns) > p.threshold_ns),
ops AS (  -- the GPU ops of ranks with a candidate, and the latest end before each
    SELECT job, rank, eid, ts_ns, end_ns,
           max(end_ns) OVER (PARTITION BY job, rank ORDER BY ts_ns, eid
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_ns
    FROM gpu_ops SEMI JOIN (SELECT DISTINCT job, rank FROM cand) c USING (job, rank)),
islands AS (  -- the rank's GPU busy time as disjoint intervals
    SELECT job, rank, min(ts_ns) AS lo, max(end_ns) AS hi
    FROM (SELECT *, sum(CASE WHEN coalesce(ts_ns <= before_ns, FALSE) THEN 0 ELSE 1 END)
                        OVER (PARTITION BY job, rank ORDER BY ts_ns, eid) AS island
          FROM ops)
    GROUP BY job, rank, island),
busy AS (
    SELECT c.job, c.rank, c.eid,
           sum(least(i.hi, c.ts_ns) - greatest(i.lo, c.ready_ns)) AS busy_ns
    FROM cand c JOIN islands i
      ON i.job = c.job AND i.rank = c.rank AND i.lo < c.ts_ns AND i.hi > c.ready_ns
    GROUP BY ALL)
SELECT c.job, c.rank, c.device, c.stream, c.eid, c.ready_ns AS start_ns, c.ts_ns AS end_ns,
       c.ts_ns - c.ready_ns AS wait_ns, c.ts_ns - c.ready_ns - coalesce(b.busy_ns, 0) AS idle_ns,
       c.threshold_ns
FROM cand c LEFT JOIN busy b USING (job, rank, eid)
WHERE c.ts_ns - c.ready_ns - coalesce(b.busy_ns, 0) > c.threshold_ns;

-- @view unexplained_gap_intervals: the GPU-idle parts of gpu_wait_gaps, clipped to the
--   rank's steps (steps): the time step_breakdown counts as unexplained_gap_ns.
-- job, rank, step: the step. s_ns, e_ns: a piece of a wait with no GPU op of the rank
--   running. what: 'compute' (so interval_unions counts the union of the pieces: two
--   streams waiting at once count once). eid: the waiting op.
CREATE OR REPLACE VIEW unexplained_gap_intervals WITH (DEFER_BINDING) AS
WITH g AS MATERIALIZED (SELECT * FROM gpu_wait_gaps),
cuts AS (  -- the busy parts of each wait (GPU ops of the rank overlapping it, clipped), and
           -- a zero-length one at its end
    SELECT g.job, g.rank, g.eid, g.start_ns, greatest(b.ts_ns, g.start_ns) AS a,
           least(b.end_ns, g.end_ns) AS z
    FROM g JOIN gpu_ops b
      ON b.job = g.job AND b.rank = g.rank AND b.ts_ns < g.end_ns AND b.end_ns > g.start_ns
    UNION ALL SELECT job, rank, eid, start_ns, end_ns, end_ns FROM g),
free AS (  -- before each cut: from the latest end of the cuts before it (or the wait's start)
    SELECT job, rank, eid,
           greatest(start_ns, max(z) OVER (PARTITION BY job, rank, eid ORDER BY a, z
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
               AS s_ns,
           a AS e_ns
    FROM cuts)
SELECT f.job, f.rank, s.step, greatest(f.s_ns, s.start_ns) AS s_ns,
       least(f.e_ns, s.end_ns) AS e_ns, 'compute' AS what, f.eid
FROM free f JOIN (SELECT job, rank, step, start_ns, end_ns FROM steps) s
  ON s.job = f.job AND s.rank = f.rank AND f.s_ns < s.end_ns AND f.e_ns > s.start_ns
WHERE f.e_ns > f.s_ns;
