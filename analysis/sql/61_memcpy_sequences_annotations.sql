-- Three of HTA's analyses (Holistic Trace Analysis, hta/trace_analysis.py): memory-copy
-- bandwidth by direction (get_memory_bw_time_series, get_memory_bw_summary), frequent GPU op
-- sequences under a CPU op (get_frequent_cuda_kernel_sequences) and time per user annotation
-- (get_gpu_user_annotation_breakdown). Definitions follow HTA's (cited at each view); times are
-- exact ns from the store, bandwidths GB/s (1 GB/s = 1 byte/ns).

-- @view memory_copies: each memcpy and memset on the GPU, with its direction and bandwidth.
-- job, rank, eid: the copy (gpu_ops.eid). kind: memcpy or memset. name: as Kineto writes it
--   ("Memcpy HtoD (Pageable -> Device)", "Memset (Device)", ...).
-- direction: the copy's kind from its name: HtoD, DtoH, DtoD, PtoP (peer to peer), HtoH or
--   another CUPTI code as written after "Memcpy " (AtoD, ...); 'Memset' for memsets; else
--   args.kind (roctracer writes it), else args.direction as MTIA's DMA transfers write it
--   (HOST_TO_DEVICE -> HtoD, DEVICE_TO_HOST -> DtoH, DEVICE_TO_DEVICE -> DtoD), else
--   'unknown'. HTA's get_memory_kernel_type keeps the
--   same labels as the name prefix ("Memcpy DtoH", "Memset", "Memcpy Unknown").
-- memory: the source -> destination memory kinds in the name's parentheses ("Pageable ->
--   Device", "Device -> Pinned"; for a memset its destination), NULL when absent.
-- device, stream, ts_ns, end_ns, dur_ns: where and when it ran. bytes: gpu_ops.bytes.
-- gbps: bytes / dur_ns (GB/s), NULL when the size is unknown or dur_ns is 0.
-- kineto_gbps: args "memory bandwidth (GB/s)", which Kineto computes from the copy's exact
--   CUPTI duration (so it is right where the trace rounds ts/dur to microseconds); NULL
--   when absent. bw_gbps: kineto_gbps, else gbps: the value HTA's memory_bw_gbps reads.
-- step, launch_eid, op_eid, op_name: as in gpu_ops.
CREATE OR REPLACE VIEW memory_copies WITH (DEFER_BINDING) AS
SELECT g.job, g.rank, g.eid, g.kind, g.name,
       CASE WHEN g.kind = 'memset' OR starts_with(g.name, 'Memset') THEN 'Memset'
            WHEN regexp_matches(g.name, '^Memcpy [A-Za-z]+to[A-Za-z]+')
                THEN regexp_extract(g.name, '^Memcpy ([A-Za-z]+to[A-Za-z]+)', 1)
            ELSE coalesce(json_extract_string(e.args, '$.kind'),
                          CASE json_extract_string(e.args, '$.direction')
                               WHEN 'HOST_TO_DEVICE' THEN 'HtoD' WHEN 'DEVICE_TO_HOST' THEN 'DtoH'
                               WHEN 'DEVICE_TO_DEVICE' THEN 'DtoD' END,
                          'unknown') END AS direction,
       nullif(regexp_extract(g.name, '\(([^()]*)\)\s*$', 1), '') AS memory,
       g.device, g.stream, g.ts_ns, g.end_ns, g.dur_ns, g.bytes,
       g.bytes / nullif(g.dur_ns, 0) AS gbps,
       TRY_CAST(json_extract_string(e.args, '$."memory bandwidth (GB/s)"') AS DOUBLE)
           AS kineto_gbps,
       coalesce(kineto_gbps, gbps) AS bw_gbps,
       g.step, g.launch_eid, g.op_eid, g.op_name
FROM gpu_ops g
JOIN events e ON e.job = g.job AND e.rank = g.rank AND e.eid = g.eid
WHERE g.kind IN ('memcpy', 'memset');

-- @view memory_bw_time_series: memory bandwidth in use over time, per rank and direction
--   (HTA's get_memory_bw_time_series: each copy adds its bandwidth from its start to its end,
--   and the copies of one direction add up; HTA writes the change points, this view the
--   segments between them). The segments tile the time from the direction's first copy
--   start to its last copy end, gaps included (n_copies 0, bw_gbps 0). A copy with dur_ns 0
--   counts over [ts_ns, ts_ns + 1000) as HTA rounds a 0 duration up to 1 us (HTA issue 20).
-- job, rank, direction: as in memory_copies (copies on all devices of the rank add up, as in
--   HTA). start_ns, end_ns, dur_ns: the segment.
-- n_copies: copies running during the segment. bw_gbps: the sum of their
--   memory_copies.bw_gbps, to 1e-12 GB/s (each is rounded to that unit so the series adds
--   exactly and is 0 where no copy runs); copies of unknown size count in n_copies and add
--   nothing.
CREATE OR REPLACE VIEW memory_bw_time_series WITH (DEFER_BINDING) AS
WITH c AS (  -- bandwidth in integer units of 1e-12 GB/s, so the running sum is exact
    SELECT job, rank, direction, ts_ns AS s_ns,
           CASE WHEN dur_ns > 0 THEN end_ns ELSE ts_ns + 1000 END AS e_ns,
           coalesce(round(bw_gbps * 1e12), 0)::HUGEINT AS w
    FROM memory_copies),
pts AS (  -- a sweep line: +1 and +w where a copy starts, -1 and -w where it ends
    SELECT job, rank, direction, t, sum(dn) AS dn, sum(dw) AS dw
    FROM (SELECT job, rank, direction, s_ns AS t, 1 AS dn, w AS dw FROM c
          UNION ALL SELECT job, rank, direction, e_ns, -1, -w FROM c)
    GROUP BY job, rank, direction, t),
run AS (
    SELECT job, rank, direction, t AS start_ns,
           lead(t) OVER (PARTITION BY job, rank, direction ORDER BY t) AS end_ns,
           sum(dn) OVER win AS n_copies, sum(dw) OVER win AS w
    FROM pts WINDOW win AS (PARTITION BY job, rank, direction ORDER BY t
                            ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
SELECT job, rank, direction, start_ns, end_ns, end_ns - start_ns AS dur_ns,
       n_copies::BIGINT AS n_copies, (w / 1e12)::DOUBLE AS bw_gbps
FROM run WHERE end_ns IS NOT NULL;

-- @view memory_bw_summary: memory copies per rank and direction, with their bandwidth
--   (HTA's get_memory_bw_summary, one row per rank and HtoD / DtoH / DtoD / Memset / ...).
--   HTA describes the positive points of its time series (count, mean, std, min, 25%, 50%,
--   75%, max); where the copies of a direction do not overlap those points are the copies'
--   own bandwidths, which the *_gbps statistics here are; peak_gbps is the time series'
--   maximum, where overlapping copies add. HTA also drops the trace's last ProfilerStep by
--   default (include_last_profiler_step=False); over the copies launched before it, these
--   statistics are HTA's table (tests/test_hta_memcpy_sequences.py). This view keeps all.
-- job, rank, direction: as in memory_copies. count: copies. bytes: their total size (NULL
--   when no copy has one). total_ns: sum of their durations.
-- busy_ns: time with at least one copy of the direction running (memory_bw_time_series).
-- throughput_gbps: bytes / busy_ns: what the direction moved per unit of time it was busy.
-- mean_gbps, std_gbps, min_gbps, p25_gbps, p50_gbps, p75_gbps, max_gbps: statistics of
--   memory_copies.bw_gbps over the copies (sample std; linearly interpolated quantiles, as
--   pandas' describe). peak_gbps: max of memory_bw_time_series.bw_gbps.
-- first_ns, last_ns: first copy start, last copy end.
CREATE OR REPLACE VIEW memory_bw_summary WITH (DEFER_BINDING) AS
WITH ts AS (
    SELECT job, rank, direction, sum(dur_ns) FILTER (WHERE n_copies > 0) AS busy_ns,
           max(bw_gbps) AS peak_gbps
    FROM memory_bw_time_series GROUP BY job, rank, direction)
SELECT c.job, c.rank, c.direction, count(*) AS count, sum(c.bytes)::BIGINT AS bytes,
       sum(c.dur_ns)::BIGINT AS total_ns, any_value(t.busy_ns)::BIGINT AS busy_ns,
       sum(c.bytes) / nullif(any_value(t.busy_ns), 0) AS throughput_gbps,
       avg(c.bw_gbps) AS mean_gbps, stddev_samp(c.bw_gbps) AS std_gbps,
       min(c.bw_gbps) AS min_gbps, quantile_cont(c.bw_gbps, 0.25) AS p25_gbps,
       quantile_cont(c.bw_gbps, 0.5) AS p50_gbps, quantile_cont(c.bw_gbps, 0.75) AS p75_gbps,
       max(c.bw_gbps) AS max_gbps, any_value(t.peak_gbps) AS peak_gbps,
       min(c.ts_ns) AS first_ns, max(c.end_ns) AS last_ns
FROM memory_copies c JOIN ts t USING (job, rank, direction)
GROUP BY c.job, c.rank, c.direction;

-- @view op_kernel_sequences: for each CPU slice under which GPU ops were launched, those GPU ops
--   (kernels, memcpy, memset) in the order they ran: what HTA's
--   get_frequent_cuda_kernel_sequences collects per operator instance (the GPU ops in the
--   op's call-stack subtree, sorted by their start). A GPU op is under a slice when the
--   slice encloses the runtime call that launched it (gpu_ops.launch_eid; else the slice is
--   gpu_ops.op_eid or encloses it) on its CPU thread (events.parent_eid, followed up to the
--   root), so every enclosing slice of the launch counts it.
-- job, rank, eid: the slice (a cpu_op, user_annotation or python_function on a CPU thread).
--   name, kind, tid, depth (events.depth on the thread), ts_ns, dur_ns: as in events.
-- n_gpu_ops: GPU ops under it. gpu_ns: the sum of their durations (HTA's kernel_dur_sum).
-- sequence: their names joined with '|', ordered by GPU start (then eid).
-- gpu_names: the same names as a list. gpu_eids: their eids, same order.
CREATE OR REPLACE VIEW op_kernel_sequences WITH (DEFER_BINDING) AS
WITH RECURSIVE par AS MATERIALIZED (  -- the nesting of the CPU threads
    SELECT job, rank, eid, parent_eid FROM events
    WHERE parent_eid IS NOT NULL AND track_kind = 'cpu_thread'),
up(job, rank, gpu_eid, eid) AS (  -- each GPU op with every slice enclosing its launch call
    SELECT job, rank, eid, coalesce(launch_eid, op_eid) FROM gpu_ops
    WHERE coalesce(launch_eid, op_eid) IS NOT NULL
    UNION ALL
    SELECT u.job, u.rank, u.gpu_eid, p.parent_eid
    FROM up u JOIN par p ON p.job = u.job AND p.rank = u.rank AND p.eid = u.eid)
SELECT o.job, o.rank, o.eid, any_value(o.name) AS name, any_value(o.kind) AS kind,
       any_value(o.tid) AS tid, any_value(o.depth) AS depth, any_value(o.ts_ns) AS ts_ns,
       any_value(o.dur_ns) AS dur_ns, count(*) AS n_gpu_ops,
       sum(g.dur_ns)::BIGINT AS gpu_ns,
       string_agg(g.name, '|' ORDER BY g.ts_ns, g.eid) AS sequence,
       list(g.name ORDER BY g.ts_ns, g.eid) AS gpu_names,
       list(g.eid ORDER BY g.ts_ns, g.eid) AS gpu_eids
FROM up u
JOIN events o ON o.job = u.job AND o.rank = u.rank AND o.eid = u.eid
JOIN gpu_ops g ON g.job = u.job AND g.rank = u.rank AND g.eid = u.gpu_eid
WHERE o.kind IN ('cpu_op', 'user_annotation', 'python_function') AND o.ph = 'X'
  AND o.track_kind = 'cpu_thread'
GROUP BY o.job, o.rank, o.eid;

-- @macro frequent_kernel_sequences(operator_name, min_pattern_len := 3, top_k := 5): the most
--   frequent GPU op sequences under the CPU slices whose name contains operator_name (HTA's
--   get_frequent_cuda_kernel_sequences(operator_name, output_dir, min_pattern_len, rank,
--   top_k), hta/analyzers/cuda_kernel_analysis.py). As in HTA, only the shallowest matches
--   count (the least events.depth among all slices of the rank whose name contains
--   operator_name, so an op nested in another match is not counted twice), and only those
--   with at least min_pattern_len GPU ops under them; each instance's pattern is its name
--   followed by its op_kernel_sequences.sequence, and identical patterns are counted.
--   top_k: patterns kept per rank (NULL: all; HTA returns all and overlays the top_k).
--   HTA leaves out the last ProfilerStep by default; this counts every instance (eids lists
--   them, so a window is a join with op_kernel_sequences away).
-- Returns, per job and rank, one row per pattern ordered by count (descending), then pattern:
--   job, rank, pattern_rank (1 = most frequent), pattern ('op|gpu op|gpu op|...', HTA's
--   pattern), op_name, n_gpu_ops (GPU ops per instance), count (instances), gpu_ns (their
--   GPU ops' total duration, HTA's "GPU kernel duration"), cpu_ns (the instances' total
--   duration, HTA's "CPU op duration"), eids (the instances, in time order).
CREATE OR REPLACE MACRO frequent_kernel_sequences(operator_name, min_pattern_len := 3,
                                                  top_k := 5) AS TABLE
WITH depth AS (
    SELECT job, rank, min(depth) AS min_depth FROM events
    WHERE contains(name, operator_name) AND track_kind = 'cpu_thread'
      AND kind IN ('cpu_op', 'user_annotation', 'python_function') AND ph = 'X'
    GROUP BY job, rank),
inst AS (
    SELECT s.* FROM op_kernel_sequences s JOIN depth d USING (job, rank)
    WHERE contains(s.name, operator_name) AND s.depth = d.min_depth
      AND s.n_gpu_ops >= min_pattern_len),
pat AS (
    SELECT job, rank, name || '|' || sequence AS pattern, any_value(name) AS op_name,
           any_value(n_gpu_ops) AS n_gpu_ops, count(*) AS count, sum(gpu_ns)::BIGINT AS gpu_ns,
           sum(dur_ns)::BIGINT AS cpu_ns, list(eid ORDER BY ts_ns, eid) AS eids
    FROM inst GROUP BY job, rank, name || '|' || sequence),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY job, rank ORDER BY count DESC, pattern)
                  AS pattern_rank
    FROM pat)
SELECT job, rank, pattern_rank, pattern, op_name, n_gpu_ops, count, gpu_ns, cpu_ns, eids
FROM ranked WHERE top_k IS NULL OR pattern_rank <= top_k
ORDER BY job, rank, pattern_rank;

-- @view user_annotation_breakdown: time per user annotation (record_function ranges, e.g.
--   per layer or module), per rank (HTA's get_gpu_user_annotation_breakdown,
--   hta/analyzers/breakdown_analysis.py). side 'gpu' is the annotation's span on the GPU
--   (gpu_user_annotation events, which Kineto draws on the GPU streams from the GPU ops the
--   range launched: HTA's default, use_gpu_annotation=True); side 'cpu' is the range on the
--   CPU thread (user_annotation, use_gpu_annotation=False). Like HTA this counts every
--   annotation, ProfilerStep#N included; HTA drops the trace's last ProfilerStep by default
--   (include_last_profiler_step=False), this view does not.
-- job, rank, side ('gpu' or 'cpu'), name: the annotation.
-- count: instances. total_ns, mean_ns, min_ns, max_ns, std_ns: their durations (HTA's sum,
--   mean, min, max and std; std_ns sample std, 0 for a single instance as in HTA).
-- share: total_ns / the total of all annotations of the side on the rank (HTA's pie; nested
--   annotations each count their own time).
-- total_rank: 1 for the annotation with the most time on the side and rank, 2, ... after it.
-- cum_share: share of this annotation and all ranked before it. HTA's num_kernels and
--   duration_ratio fold annotations past those limits into 'others': filter on total_rank
--   and cum_share for the same cut.
CREATE OR REPLACE VIEW user_annotation_breakdown WITH (DEFER_BINDING) AS
WITH a AS (
    SELECT job, rank, CASE kind WHEN 'gpu_user_annotation' THEN 'gpu' ELSE 'cpu' END AS side,
           name, dur_ns
    FROM events
    WHERE kind IN ('gpu_user_annotation', 'user_annotation') AND ph = 'X'
      AND dur_ns IS NOT NULL),
g AS (
    SELECT job, rank, side, name, count(*) AS count, sum(dur_ns)::BIGINT AS total_ns,
           avg(dur_ns) AS mean_ns, min(dur_ns) AS min_ns, max(dur_ns) AS max_ns,
           coalesce(stddev_samp(dur_ns), 0) AS std_ns
    FROM a GROUP BY job, rank, side, name)
SELECT *, total_ns / sum(total_ns) OVER w AS share,
       row_number() OVER (w ORDER BY total_ns DESC, name) AS total_rank,
       sum(total_ns) OVER (w ORDER BY total_ns DESC, name ROWS UNBOUNDED PRECEDING)
           / sum(total_ns) OVER w AS cum_share
FROM g WINDOW w AS (PARTITION BY job, rank, side);
