-- tracetool analysis views over the trace store (DuckDB).
-- Conventions: times are ns since the Unix epoch (*_ns), durations ns; (job, rank) identify a
-- trace file; eid identifies an event within it. Every view documents its columns below.

-- @view kernels: GPU kernels with a coarse category, for breakdowns and projections.
-- job, rank: the trace. eid: the kernel's event id. name: kernel name.
-- category (from the function name, before template or call arguments):
--   comm (collective/communication kernels), gemm (matmul/GEMM/cutlass/cublas/bmm, AMD
--   Tensile/hipBLASLt Cijk_*), conv
--   (convolutions), attention (flash/fmha/sdpa), norm (layer/batch/group/rms norm), reduction
--   (reduce/sum/softmax/argmax), elementwise (vectorized/elementwise/pointwise/triton_poi),
--   other.
-- device, stream: where it ran. ts_ns, end_ns, dur_ns: when, how long. step: ProfilerStep.
-- launch_eid, launch_ts_ns: the runtime call that launched it. op_eid, op_name: the CPU op
--   that issued it. grid_x, grid_y, grid_z, block_x, block_y, block_z, registers_per_thread,
--   shared_memory: launch configuration (see gpu_ops).
CREATE OR REPLACE VIEW kernels WITH (DEFER_BINDING) AS
SELECT job, rank, eid, name,
       CASE
         WHEN is_comm THEN 'comm'
         WHEN regexp_matches(fn, 'gemm|matmul|cutlass|cublas|bmm|nvjet|wgmma|xmma|splitk|'
                                 || '^ampere_.*_(tn|nn|nt|tt)|^cijk_|tensile|hipblaslt|rocblas')
              THEN 'gemm'
         WHEN regexp_matches(fn, 'conv|winograd|dgrad|wgrad') THEN 'conv'
         WHEN regexp_matches(fn, 'flash|fmha|attention|sdpa|attn') THEN 'attention'
         WHEN regexp_matches(fn, 'norm') THEN 'norm'
         WHEN regexp_matches(fn, 'reduce|softmax|sum_|argmax|topk|mean') THEN 'reduction'
         WHEN regexp_matches(fn, 'elementwise|vectorized|pointwise|triton_poi|unrolled|fill|'
                                 || 'copy|cat_|index') THEN 'elementwise'
         ELSE 'other'
       END AS category,
       device, stream, ts_ns, end_ns, dur_ns, step, launch_eid, launch_ts_ns, op_eid, op_name,
       grid_x, grid_y, grid_z, block_x, block_y, block_z, registers_per_thread, shared_memory
FROM (SELECT *,  -- the function name, without template or call arguments
             lower(regexp_extract(replace(name, '(anonymous namespace)', ''), '^([^<(]*)', 1))
                 AS fn
      FROM gpu_ops WHERE kind = 'kernel');

-- @view cpu_ops: CPU operators (cat cpu_op, or Operator before 2022) with their self time.
-- job, rank, eid, name, tid: the op and its thread. ts_ns, end_ns, dur_ns: when, how long.
-- depth, parent_eid: nesting on the thread. self_ns: dur_ns minus the time of its direct
--   children (any kind) on the same thread inside it: a child that starts inside the op
--   but ends after it (events.overlaps_parent, out of spec: e.g. an hccl:all_to_all
--   annotation that outlives its c10d call) counts only up to the op's end, so self time
--   is never negative and a parent never loses more than its own duration. Direct children
--   never overlap one another (a slice that starts inside another is nested in it), so
--   self_ns >= 0 always. external_id, seq_nr: PyTorch ids.
-- step: ProfilerStep whose CPU annotation contains ts_ns (same rank), NULL outside steps.
CREATE OR REPLACE VIEW cpu_ops WITH (DEFER_BINDING) AS
WITH child AS (  -- per parent: its children's time, the overlapping ones clipped to its end
                 -- below (their count and summed starts: no join back to the parent here)
    SELECT job, rank, parent_eid AS eid,
           coalesce(sum(dur_ns) FILTER (WHERE NOT coalesce(overlaps_parent, FALSE)), 0)
               AS inside_ns,
           count(*) FILTER (WHERE overlaps_parent) AS n_over,
           coalesce(sum(ts_ns::HUGEINT) FILTER (WHERE overlaps_parent), 0) AS over_ts
    FROM events WHERE parent_eid IS NOT NULL AND ph = 'X' GROUP BY ALL)
SELECT e.job, e.rank, e.eid, e.name, e.tid, e.ts_ns, e.end_ns, e.dur_ns, e.depth,
       e.parent_eid,
       (e.dur_ns - coalesce(c.inside_ns + (c.n_over * e.end_ns::HUGEINT - c.over_ts), 0))::BIGINT
           AS self_ns,
       e.external_id, e.seq_nr,
       CASE WHEN e.ts_ns < coalesce(s.cpu_end_ns, 9223372036854775807) THEN s.step END AS step
FROM events e
LEFT JOIN child c USING (job, rank, eid)
ASOF LEFT JOIN (SELECT job, rank, step, cpu_start_ns, cpu_end_ns FROM profiler_steps) s
  ON e.job = s.job AND e.rank = s.rank AND e.ts_ns >= s.cpu_start_ns
WHERE e.kind = 'cpu_op';

-- @view launches: each runtime/driver launch joined to the GPU op it started.
-- job, rank: the trace. launch_eid, launch_name, tid: the call and its thread.
-- launch_ts_ns, launch_end_ns: the call's interval on the CPU.
-- gpu_eid, gpu_name, gpu_kind (kernel/memcpy/memset), device, stream, gpu_ts_ns, gpu_end_ns.
-- launch_delay_ns: gpu_ts_ns - launch_ts_ns (call start to GPU start).
-- queue_ns: time the op waited after both its launch returned and the previous op on its
--   stream finished: gpu_ts_ns - greatest(launch_end_ns, previous end on the stream); near 0
--   when the GPU starts it at once, large when something else (a sync, another stream) held
--   it; negative values mean it overlapped its predecessor (PDL) or clocks disagree.
-- step: the GPU op's ProfilerStep.
CREATE OR REPLACE VIEW launches WITH (DEFER_BINDING) AS
SELECT g.job, g.rank, g.launch_eid, g.launch_name, l.tid, g.launch_ts_ns,
       l.end_ns AS launch_end_ns, g.eid AS gpu_eid, g.name AS gpu_name, g.kind AS gpu_kind,
       g.device, g.stream, g.ts_ns AS gpu_ts_ns, g.end_ns AS gpu_end_ns,
       g.ts_ns - g.launch_ts_ns AS launch_delay_ns,
       g.ts_ns - greatest(l.end_ns, coalesce(lag(g.end_ns) OVER (
           PARTITION BY g.job, g.rank, g.device, g.stream ORDER BY g.ts_ns, g.eid), l.end_ns))
           AS queue_ns,
       g.step
FROM gpu_ops g JOIN events l ON l.job = g.job AND l.rank = g.rank AND l.eid = g.launch_eid;
