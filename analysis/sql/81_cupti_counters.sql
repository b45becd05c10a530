-- Hardware counters from CUPTI's range profiler (Kineto's CUPTI_PROFILER mode, e.g.
-- experimental_config=_ExperimentalConfig(profiler_metrics=[...])): the trace then holds one
-- slice per kernel, cat cuda_profiler_range, its args the metric values, and no kernel events
-- or correlation ids. HTA's get_cupti_counter_data_with_operators reads the same events.

-- @view cupti_counters: one row per counter value of each profiled kernel range.
-- job, rank, eid: the range (events.eid, cat cuda_profiler_range). kernel_name: its name as
--   written ('__missing__' where CUPTI did not name it). ts_ns, dur_ns: the range as written
--   (the profiler replays the kernel to count; not the kernel's own run time).
-- metric: the counter (args key, e.g. smsp__sass_thread_inst_executed_op_ffma_pred_on.sum);
--   value: its value (DOUBLE; NULL if not a number).
-- launch_eid, op_name, top_op_name: the kernel launch the range belongs to and the CPU ops
--   around it: the k-th range of the rank (in time order) goes with its k-th kernel launch
--   call (a cuda_runtime / cuda_driver call named *Launch*Kernel*), the pairing HTA uses
--   (the ranges carry no correlation id). Only when the rank has as many launch calls as
--   ranges (matched TRUE); else NULL and matched FALSE. op_name is the slice around the launch
--   call (events.parent_eid), top_op_name the outermost CPU operator on its thread that
--   contains it (ProfilerStep#N left out).
CREATE OR REPLACE VIEW cupti_counters WITH (DEFER_BINDING) AS
WITH r AS MATERIALIZED (
    SELECT job, rank, eid, name AS kernel_name, ts_ns, dur_ns, args::JSON AS a,
           row_number() OVER (PARTITION BY job, rank ORDER BY ts_ns, eid) AS k
    FROM events WHERE cat = 'cuda_profiler_range'),
ranked AS (SELECT DISTINCT job, rank FROM r),
l AS (
    SELECT e.job, e.rank, e.eid AS launch_eid, e.tid, e.ts_ns, e.parent_eid,
           row_number() OVER (PARTITION BY e.job, e.rank ORDER BY e.ts_ns, e.eid) AS k
    FROM events e JOIN ranked USING (job, rank)
    WHERE e.kind IN ('cuda_runtime', 'cuda_driver')
      AND regexp_matches(e.name, 'Launch(Cooperative)?Kernel')),
n AS (
    SELECT job, rank, (SELECT count(*) FROM r WHERE r.job = x.job AND r.rank = x.rank)
               = (SELECT count(*) FROM l WHERE l.job = x.job AND l.rank = x.rank) AS matched
    FROM ranked x),
top AS (
    SELECT l.job, l.rank, l.launch_eid, arg_min(o.name, o.depth) AS top_op_name
    FROM l JOIN cpu_ops o
      ON o.job = l.job AND o.rank = l.rank AND o.tid = l.tid
     AND o.ts_ns <= l.ts_ns AND l.ts_ns < o.end_ns
    WHERE NOT starts_with(o.name, 'ProfilerStep#')
    GROUP BY ALL),
kv AS (
    SELECT r.*, unnest(json_keys(r.a)) AS metric FROM r)
SELECT kv.job, kv.rank, kv.eid, kv.kernel_name, kv.ts_ns, kv.dur_ns, kv.metric,
       TRY_CAST(json_extract_string(kv.a, '$."' || replace(kv.metric, '"', '\"') || '"')
                AS DOUBLE) AS value,
       CASE WHEN n.matched THEN l.launch_eid END AS launch_eid,
       CASE WHEN n.matched THEN p.name END AS op_name,
       CASE WHEN n.matched THEN t.top_op_name END AS top_op_name,
       n.matched
FROM kv JOIN n USING (job, rank)
LEFT JOIN l ON l.job = kv.job AND l.rank = kv.rank AND l.k = kv.k
LEFT JOIN events p ON p.job = l.job AND p.rank = l.rank AND p.eid = l.parent_eid
LEFT JOIN top t ON t.job = l.job AND t.rank = l.rank AND t.launch_eid = l.launch_eid;
