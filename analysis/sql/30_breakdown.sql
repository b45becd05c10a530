-- @view step_intervals: the busy intervals a step breakdown is made of, clipped to the step.
-- job, rank, step: the step. s_ns, e_ns: a busy interval inside [start_ns, end_ns) of the step.
-- what: compute (non-communication kernels), comm (communication kernels), memcpy (memcpy
--   and memset), cpu (top-level work on the thread that runs the step annotation, except
--   device/stream/event synchronize calls, which wait for the GPU rather than feed it).
--   On a rank without GPU ops (CPU-only, e.g. gloo) compute is top-level CPU ops on
--   non-gloo threads and comm is the gloo:* spans on the gloo threads.
CREATE OR REPLACE VIEW step_intervals AS
WITH st AS (SELECT job, rank, step, start_ns, end_ns FROM steps),
has_gpu AS (SELECT DISTINCT job, rank FROM gpu_ops),
step_tid AS (SELECT s.job, s.rank, s.step, e.tid FROM steps s
             JOIN events e ON e.job = s.job AND e.rank = s.rank AND e.eid = s.eid),
gpu AS (
    SELECT job, rank, ts_ns, end_ns,
           CASE WHEN kind IN ('memcpy', 'memset') THEN 'memcpy'
                WHEN is_comm THEN 'comm' ELSE 'compute' END AS what
    FROM gpu_ops),
cpu AS (  -- top-level work on the step's thread, sync waits excluded
    SELECT e.job, e.rank, e.ts_ns, e.end_ns, 'cpu' AS what
    FROM events e JOIN (SELECT DISTINCT job, rank, tid FROM step_tid) t
      ON e.job = t.job AND e.rank = t.rank AND e.tid = t.tid
    WHERE e.ph = 'X' AND e.kind IN ('cpu_op', 'user_annotation', 'cuda_runtime',
                                      'cuda_driver', 'python_function')
      AND NOT regexp_matches(e.name, 'Synchronize|^cudaMemcpy$|^hipMemcpy$')
      AND NOT starts_with(e.name, 'ProfilerStep#')
      AND (e.depth = 0 OR e.parent_eid IN (
            SELECT eid FROM events p WHERE p.job = e.job AND p.rank = e.rank
              AND starts_with(p.name, 'ProfilerStep#')))),
cpu_only AS (  -- ranks without GPU ops: CPU compute vs gloo transfer
    SELECT e.job, e.rank, e.ts_ns, e.end_ns,
           CASE WHEN starts_with(e.name, 'gloo:') THEN 'comm' ELSE 'compute' END AS what
    FROM events e JOIN tracks t ON t.job = e.job AND t.rank = e.rank
                                AND t.track_id = e.track_id
    WHERE e.ph = 'X' AND t.track_kind = 'cpu_thread'
      AND NOT EXISTS (SELECT 1 FROM has_gpu h WHERE h.job = e.job AND h.rank = e.rank)
      AND ((starts_with(e.name, 'gloo:'))
           OR (e.kind = 'cpu_op' AND NOT coalesce(t.thread_name, '') LIKE '%gloo%'
               AND (e.depth = 0 OR e.parent_eid IN (
                    SELECT eid FROM events p WHERE p.job = e.job AND p.rank = e.rank
                      AND starts_with(p.name, 'ProfilerStep#')))))),
all_iv AS (SELECT * FROM gpu UNION ALL SELECT * FROM cpu UNION ALL SELECT * FROM cpu_only)
SELECT st.job, st.rank, st.step, greatest(a.ts_ns, st.start_ns) AS s_ns,
       least(a.end_ns, st.end_ns) AS e_ns, a.what
FROM all_iv a JOIN st ON a.job = st.job AND a.rank = st.rank
 AND a.ts_ns < st.end_ns AND a.end_ns > st.start_ns;

-- @view step_breakdown: where each step's time went on each rank.
-- job, rank, step; dur_ns: the step (steps.dur_ns: CPU start to the end of its GPU work).
-- compute_ns, comm_ns, memcpy_ns: time with at least one such op running (union of
--   intervals: ops overlapping on several streams count once).
-- overlap_ns: time with compute and comm running together.
-- exposed_comm_ns: comm_ns - overlap_ns, communication not hidden behind compute.
-- idle_ns: dur_ns - time with any GPU op running (on CPU-only ranks: any compute or comm).
-- cpu_bound_ns: idle time during which the step's CPU thread was busy (not synchronizing):
--   the GPU waited for the CPU. NULL on CPU-only ranks.
CREATE OR REPLACE VIEW step_breakdown AS
WITH tagged AS (  -- each interval into every set it belongs to
    SELECT job, rank, step, s_ns, e_ns, what AS tag FROM step_intervals
    UNION ALL SELECT job, rank, step, s_ns, e_ns, 'busy' FROM step_intervals
      WHERE what IN ('compute', 'comm', 'memcpy')
    UNION ALL SELECT job, rank, step, s_ns, e_ns, 'compute_comm' FROM step_intervals
      WHERE what IN ('compute', 'comm')
    UNION ALL SELECT job, rank, step, s_ns, e_ns, 'busy_cpu' FROM step_intervals),
ordered AS (
    SELECT *, max(e_ns) OVER (PARTITION BY job, rank, step, tag ORDER BY s_ns, e_ns
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM tagged),
islands AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s_ns > prev_end THEN 1 ELSE 0 END)
                  OVER (PARTITION BY job, rank, step, tag ORDER BY s_ns, e_ns
                        ROWS UNBOUNDED PRECEDING) AS island
    FROM ordered),
unions AS (
    SELECT job, rank, step, tag, sum(e - s)::BIGINT AS len FROM (
        SELECT job, rank, step, tag, island, min(s_ns) AS s, max(e_ns) AS e
        FROM islands GROUP BY ALL) GROUP BY ALL),
u AS (PIVOT unions ON tag IN ('compute', 'comm', 'memcpy', 'busy', 'compute_comm', 'cpu',
                              'busy_cpu') USING first(len) GROUP BY job, rank, step),
gpu_ranks AS (SELECT DISTINCT job, rank FROM gpu_ops)
SELECT s.job, s.rank, s.step, s.dur_ns,
       coalesce(u.compute, 0) AS compute_ns, coalesce(u.comm, 0) AS comm_ns,
       coalesce(u.memcpy, 0) AS memcpy_ns,
       (coalesce(u.compute, 0) + coalesce(u.comm, 0) - coalesce(u.compute_comm, 0))::BIGINT
           AS overlap_ns,
       (coalesce(u.compute_comm, 0) - coalesce(u.compute, 0))::BIGINT AS exposed_comm_ns,
       s.dur_ns - coalesce(u.busy, 0) AS idle_ns,
       CASE WHEN g.rank IS NOT NULL THEN coalesce(u.busy_cpu, 0) - coalesce(u.busy, 0) END
           AS cpu_bound_ns
FROM steps s LEFT JOIN u USING (job, rank, step)
LEFT JOIN gpu_ranks g ON g.job = s.job AND g.rank = s.rank;
