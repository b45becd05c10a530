-- @view breakdown_events: the events a step breakdown is made of, whole (not clipped).
-- job, rank, eid: the event. ts_ns, end_ns: its interval.
-- what: compute (non-communication kernels), comm (communication kernels), memcpy (memcpy
--   and memset), cpu (top-level work on the thread that runs the step annotation, except
--   device/stream/event synchronize calls, which wait for the GPU rather than feed it).
--   On a rank without GPU ops (CPU-only, e.g. gloo) comm is the gloo:* spans (any thread)
--   and compute is the outermost work on the non-gloo threads: cpu_ops and user
--   annotations (a record_function such as fwd_mb0, DistributedDataParallel.forward,
--   Optimizer.step) whose parent is not itself counted, each instant once (step_breakdown
--   takes the interval union); work that encloses the start of a gloo span of its thread
--   (c10d::send around its gloo:send, an annotation around a blocking receive) is not
--   counted itself, its other children are: the wait inside it is comm, not compute. `tracetool replay` reads this view for its breakdown, so the
--   measured and projected breakdowns are made of the same events.
CREATE OR REPLACE VIEW breakdown_events WITH (DEFER_BINDING) AS
WITH ps AS MATERIALIZED (  -- each small table read once (a Parquet file per rank each)
    SELECT job, rank, eid, tid FROM profiler_steps),
gpu AS MATERIALIZED (
    SELECT job, rank, eid, ts_ns, end_ns,
           CASE WHEN kind IN ('memcpy', 'memset') THEN 'memcpy'
                WHEN is_comm THEN 'comm' ELSE 'compute' END AS what
    FROM gpu_ops),
cpu_only_ranks AS (SELECT job, rank FROM trace_files
                   EXCEPT SELECT DISTINCT job, rank FROM gpu),
step_tid AS (SELECT DISTINCT job, rank, tid FROM ps),
cpu AS (  -- top-level work on the step's thread (depth 0, or just under the step annotation)
    SELECT e.job, e.rank, e.eid, e.ts_ns, e.end_ns, 'cpu' AS what
    FROM events e JOIN step_tid t ON e.job = t.job AND e.rank = t.rank AND e.tid = t.tid
    LEFT JOIN ps p ON p.job = e.job AND p.rank = e.rank AND p.eid = e.parent_eid
    WHERE e.depth <= 1 AND (e.depth = 0 OR p.eid IS NOT NULL) AND e.ph = 'X'
      AND e.kind IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver',
                     'python_function')
      AND NOT starts_with(e.name, 'ProfilerStep#')
      AND e.name NOT ILIKE '%synchronize%' AND e.name NOT IN ('cudaMemcpy', 'hipMemcpy')),
cpu_only_ev AS MATERIALIZED (  -- ranks without GPU ops: their events on CPU threads
    SELECT e.job, e.rank, e.eid, e.parent_eid, e.track_id, e.ts_ns, e.end_ns,
           starts_with(e.name, 'gloo:') AS gloo,
           e.kind IN ('cpu_op', 'user_annotation') AND NOT starts_with(e.name, 'gloo:')
           AND NOT starts_with(e.name, 'ProfilerStep#')
           AND NOT coalesce(t.thread_name, '') LIKE '%gloo%' AS work
    FROM events e
    SEMI JOIN cpu_only_ranks c ON c.job = e.job AND c.rank = e.rank
    JOIN tracks t ON t.job = e.job AND t.rank = e.rank AND t.track_id = e.track_id
    WHERE e.ph = 'X' AND t.track_kind = 'cpu_thread'),
cpu_wrappers AS (  -- work that encloses a gloo span of its thread (c10d::send around its
                   -- gloo:send, an annotation around a blocking call): the wait is comm
    SELECT DISTINCT w.job, w.rank, w.eid
    FROM cpu_only_ev w JOIN cpu_only_ev g
      ON g.job = w.job AND g.rank = w.rank AND g.track_id = w.track_id
     AND g.ts_ns >= w.ts_ns AND g.ts_ns < w.end_ns
    WHERE w.work AND g.gloo),
cpu_work AS (
    SELECT v.*, v.work AND x.eid IS NULL AS counted
    FROM cpu_only_ev v
    LEFT JOIN cpu_wrappers x ON x.job = v.job AND x.rank = v.rank AND x.eid = v.eid),
cpu_only AS (  -- CPU compute: the outermost work (its parent is not counted work) that
               -- encloses no gloo span; comm: the gloo:* spans
    SELECT v.job, v.rank, v.eid, v.ts_ns, v.end_ns,
           CASE WHEN v.gloo THEN 'comm' ELSE 'compute' END AS what
    FROM cpu_work v
    LEFT JOIN cpu_work p ON p.job = v.job AND p.rank = v.rank AND p.eid = v.parent_eid
    WHERE v.gloo OR (v.counted AND NOT coalesce(p.counted, FALSE)))
SELECT * FROM gpu UNION ALL SELECT * FROM cpu UNION ALL SELECT * FROM cpu_only;

-- @view step_intervals: the busy intervals of each step's breakdown: breakdown_events
--   clipped to the rank's step (steps).
-- job, rank, step: the step. s_ns, e_ns: a busy interval inside [start_ns, end_ns) of the
--   step. what: as in breakdown_events.
CREATE OR REPLACE VIEW step_intervals WITH (DEFER_BINDING) AS
SELECT st.job, st.rank, st.step, greatest(a.ts_ns, st.start_ns) AS s_ns,
       least(a.end_ns, st.end_ns) AS e_ns, a.what
FROM breakdown_events a
JOIN (SELECT job, rank, step, start_ns, end_ns FROM steps) st
  ON a.job = st.job AND a.rank = st.rank AND a.ts_ns < st.end_ns AND a.end_ns > st.start_ns;

-- @view step_breakdown: where each step's time went on each rank.
-- job, rank, step; dur_ns: the rank's step (steps.dur_ns, a tile of the rank's timeline).
-- complete: steps.complete (means over steps leave incomplete ones out).
-- compute_ns, comm_ns, memcpy_ns: time with at least one such op running (union of
--   intervals: ops overlapping on several streams count once).
-- overlap_ns: time with compute and comm running together.
-- exposed_comm_ns: comm_ns - overlap_ns, communication not hidden behind compute.
-- exposed_memcpy_ns: copy time not hidden behind compute or communication. compute_ns +
--   exposed_comm_ns + exposed_memcpy_ns + idle_ns = dur_ns: where the step went.
-- idle_ns: dur_ns - time with any GPU op running (on CPU-only ranks: any compute or comm).
-- cpu_bound_ns: idle time during which the step's CPU thread was busy (not synchronizing):
--   the GPU waited for the CPU. NULL on CPU-only ranks.
-- unexplained_gap_ns: idle time during which a GPU op had been launched and was free to run
--   but waited far longer than a launch (gpu_wait_gaps, 62_unexplained_gaps.sql: a clock
--   jump, GPU work outside the trace, a GPU op the profiler missed); part of idle_ns, 0
--   on CPU-only ranks.
CREATE OR REPLACE VIEW step_breakdown WITH (DEFER_BINDING) AS
WITH unions AS (SELECT * FROM interval_unions('step_intervals')),
gaps AS (SELECT jh, rank, step, compute AS ns
         FROM interval_unions('unexplained_gap_intervals')),
gpu_ranks AS (SELECT DISTINCT job, rank FROM gpu_ops)
SELECT s.job, s.rank, s.step, s.dur_ns, s.complete,
       coalesce(u.compute, 0)::BIGINT AS compute_ns, coalesce(u.comm, 0)::BIGINT AS comm_ns,
       coalesce(u.memcpy, 0)::BIGINT AS memcpy_ns, coalesce(u.both_, 0)::BIGINT AS overlap_ns,
       (coalesce(u.comm, 0) - coalesce(u.both_, 0))::BIGINT AS exposed_comm_ns,
       (coalesce(u.busy, 0) - coalesce(u.compute_or_comm, 0))::BIGINT AS exposed_memcpy_ns,
       (s.dur_ns - coalesce(u.busy, 0))::BIGINT AS idle_ns,
       CASE WHEN g.rank IS NOT NULL
            THEN (coalesce(u.busy_cpu, 0) - coalesce(u.busy, 0))::BIGINT END AS cpu_bound_ns,
       coalesce(x.ns, 0)::BIGINT AS unexplained_gap_ns
FROM steps s
LEFT JOIN unions u ON u.jh = hash(s.job) AND u.rank = s.rank AND u.step = s.step
LEFT JOIN gaps x ON x.jh = hash(s.job) AND x.rank = s.rank AND x.step = s.step
LEFT JOIN gpu_ranks g ON g.job = s.job AND g.rank = s.rank;
