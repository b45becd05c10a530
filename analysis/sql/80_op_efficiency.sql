-- @view op_efficiency: per op and shape, its kernels' time against the roofline of the GPU it
--   ran on (TraceLens' performance model; docs/op_efficiency.md). One row per job, CPU op
--   name and recorded shapes, over every rank; the ops that launched non-comm kernels, with
--   or without recorded shapes (record_shapes), most kernel time first. FLOPs and bytes come
--   from tracetool/opwork.py (the replay's roofline uses the same counts) through the
--   function tracetool_op_work, the GPU's peaks from the catalog (tracetool/gpus/*.toml)
--   through tracetool_roofline: both registered by tracetool.connect (analysis/efficiency.py).
-- job: the trace. op: the CPU op that launched the kernels (kernels.op_name).
-- input_dims, input_types, concrete_inputs: its args 'Input Dims', 'Input type' and
--   'Concrete Inputs' (JSON text, NULL when not recorded): the shape the row groups by.
-- category: the op class: gemm, attention or conv for an op with a FLOP formula (by the op,
--   so a convolution cuDNN runs as a GEMM kernel is conv), else the kernel category
--   (kernels.category: elementwise, norm, reduction, ...) with the most of the row's time.
-- count: op calls. kernels: the kernels they launched. ranks: ranks it ran on.
-- total_ns: the kernels' summed duration (the op's GPU time). mean_ns: total_ns / count.
-- dtype: fp32/fp16/bf16/fp8 from the first tensor input ('' when not a floating type).
-- flops, bytes: per call. A matmul (mm, addmm, matmul, bmm, baddbmm, linear) 2mnk, attention
--   (scaled_dot_product_*, flash/efficient attention forward) 4 b h s_q s_k d, a forward
--   convolution 2 x output positions x weight elements (stride, padding and dilation from
--   Concrete Inputs), each reading its inputs and writing its output; any other op reads
--   its tensor inputs and writes one the size of the largest (none for a reduction), with
--   one FLOP per element of its largest input (0 for ops that only move data: copy, cat,
--   index, fill, ...). NULL without shapes.
-- intensity: flops / bytes (FLOPs per byte, the roofline's x axis).
-- achieved_tflops, achieved_tbps: flops and bytes per call over mean_ns (TFLOP/s, TB/s).
-- gpu: the catalog key of the job's GPU (from trace_files.device_names, as replay finds it).
-- runs_at: the precision its peak is taken at (dtype, or the next wider one the GPU has).
-- peak_tflops: the GPU's dense peak for runs_at. peak_tbps: its HBM bandwidth.
-- pct_peak_flops, pct_peak_hbm: achieved_tflops / peak_tflops and achieved_tbps / peak_tbps,
--   in % (an FP32 matmul run as TF32 can pass 100% of the FP32 peak).
-- ridge: FLOPs per byte where the roofline turns, at the GPU's achievable fractions.
-- bound: 'compute' when intensity >= ridge, else 'memory' (the larger roofline term).
-- pct_peak: pct_peak_flops for a compute-bound row, pct_peak_hbm for a memory-bound one.
-- roofline_ns: the model time of one call, max(flops / (peak x achievable compute), bytes /
--   (hbm x achievable memory)): the time replay's roofline gives the op on this GPU.
-- pct_roofline: roofline_ns / mean_ns in %: how close the op came to its roofline.
-- note: why a column is NULL: no shapes, GPU not in the catalog (no peak), no floating
--   dtype, or the peak taken at a wider precision.
CREATE OR REPLACE VIEW op_efficiency WITH (DEFER_BINDING) AS
WITH per_call AS (  -- each op call: its kernels' time and the category with most of it
    SELECT job, rank, op_eid, count(*) AS kernels, sum(dur_ns) AS kernel_ns,
           arg_max(category, dur_ns) AS category
    FROM kernels WHERE category <> 'comm' AND op_eid IS NOT NULL
    GROUP BY job, rank, op_eid),
calls AS (
    SELECT c.job, c.rank, e.name AS op, e.args->>'Input Dims' AS input_dims,
           e.args->>'Input type' AS input_types, e.args->>'Concrete Inputs' AS concrete_inputs,
           c.kernels, c.kernel_ns, c.category
    FROM per_call c JOIN events e ON e.job = c.job AND e.rank = c.rank AND e.eid = c.op_eid),
by_class AS (
    SELECT job, op, input_dims, input_types, concrete_inputs, category, sum(kernel_ns) AS ns
    FROM calls GROUP BY ALL),
grouped AS (
    SELECT job, op, input_dims, input_types, concrete_inputs, count(*) AS count,
           sum(kernels) AS kernels, count(DISTINCT rank) AS ranks,
           sum(kernel_ns) AS total_ns
    FROM calls GROUP BY job, op, input_dims, input_types, concrete_inputs),
devices AS (
    SELECT job, list(DISTINCT d ORDER BY d) AS names
    FROM (SELECT job, unnest(device_names) AS d FROM trace_files) GROUP BY job),
worked AS (
    SELECT g.*, b.category,
           tracetool_op_work(g.op, g.input_dims, g.input_types, g.concrete_inputs) AS w,
           d.names
    FROM grouped g
    JOIN (SELECT job, op, input_dims, input_types, concrete_inputs,
                 arg_max(category, ns) AS category
          FROM by_class GROUP BY ALL) b
      ON b.job = g.job AND b.op = g.op
     AND b.input_dims IS NOT DISTINCT FROM g.input_dims
     AND b.input_types IS NOT DISTINCT FROM g.input_types
     AND b.concrete_inputs IS NOT DISTINCT FROM g.concrete_inputs
    LEFT JOIN devices d ON d.job = g.job),
rooflined AS (
    SELECT *, tracetool_roofline(names, w.dtype, w.flops, w.bytes) AS r,
           total_ns / count AS mean_ns
    FROM worked)
SELECT job, op, input_dims, input_types, concrete_inputs,
       coalesce(w.op_class, category) AS category, count, kernels, ranks,
       total_ns, mean_ns, w.dtype AS dtype, w.flops AS flops, w.bytes AS bytes,
       w.flops / nullif(w.bytes, 0) AS intensity,
       w.flops / nullif(mean_ns, 0) / 1e3 AS achieved_tflops,
       w.bytes / nullif(mean_ns, 0) / 1e3 AS achieved_tbps,
       r.gpu AS gpu, r.runs_at AS runs_at, r.peak_tflops AS peak_tflops,
       r.peak_tbps AS peak_tbps,
       100 * w.flops / nullif(mean_ns, 0) / 1e3 / r.peak_tflops AS pct_peak_flops,
       100 * w.bytes / nullif(mean_ns, 0) / 1e3 / r.peak_tbps AS pct_peak_hbm,
       r.ridge AS ridge, r.bound AS bound,
       CASE r.bound WHEN 'compute' THEN 100 * w.flops / nullif(mean_ns, 0) / 1e3 / r.peak_tflops
                    WHEN 'memory' THEN 100 * w.bytes / nullif(mean_ns, 0) / 1e3 / r.peak_tbps
       END AS pct_peak,
       r.roofline_ns AS roofline_ns,
       100 * r.roofline_ns / nullif(mean_ns, 0) AS pct_roofline,
       CASE WHEN w IS NULL THEN CASE WHEN input_dims IS NULL
                                     THEN 'no shapes recorded (record_shapes)'
                                     ELSE 'no tensor of a known size and dtype in the shapes' END
            ELSE r.note END AS note
FROM rooflined
ORDER BY total_ns DESC, job, op, input_dims;
