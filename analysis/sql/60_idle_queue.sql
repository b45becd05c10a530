-- Two of HTA's (Holistic Trace Analysis) per-stream analyses, in our own SQL over gpu_ops and
-- steps: idle time per GPU stream split into host wait / kernel wait / other
-- (HTA TraceAnalysis.get_idle_time_breakdown, hta/analyzers/breakdown_analysis.py
-- _analyze_idle_time_for_stream), and the launch-queue length per stream
-- (get_queue_length_time_series / get_queue_length_summary /
-- get_time_spent_blocked_on_full_queue, hta/analyzers/trace_counters.py). Times are exact ns
-- (HTA works in the trace's integer us, rounding fractional ts up and ends down). These views
-- count every GPU op of the store; HTA, on a trace with more than one ProfilerStep, first
-- drops the ops of the last step and those without a CPU launch call
-- (Trace._filter_irrelevant_gpu_kernels, include_last_profiler_step=False): filter on steps
-- (stream_idle_breakdown.complete, gpu_ops.step) for the same window. tests/test_hta_idle_queue.py
-- compares them with HTA 0.5.0 on the DLRM 8 ranks (one step: nothing dropped).

-- @view stream_idle: the idle gaps of each GPU stream, one row per gap, classified as HTA's
--   idle time breakdown does.
-- A gap is the time between an op's start and the latest end of the ops before it on the
--   same stream (gpu_ops: kernels, memcpy and memset, ordered by ts_ns, eid); only gaps longer
--   than 0 are rows, so ops that overlap their predecessor (PDL, clock jitter) leave no gap and
--   the gaps of a stream add up to its span (first start to last end) minus the union of its
--   ops. The first op of a stream ends no gap. HTA takes the previous op's end instead of the
--   latest and sums negative gaps too; on a serialised stream the two are the same.
-- job, rank, device, stream: the stream. prev_eid: the op whose end starts the gap (the
--   latest-ending earlier op). eid: the op whose start ends it.
-- start_ns, end_ns, gap_ns: the gap (start_ns = that end, end_ns = the op's start).
-- launch_ts_ns: start of the runtime call that launched eid (gpu_ops.launch_ts_ns), NULL for
--   an op without one.
-- category, HTA's rules in HTA's order:
--   'host_wait': launch_ts_ns > start_ns: eid was launched only after the stream had gone
--     idle, so the GPU waited for the CPU to enqueue work;
--   'kernel_wait': else a gap shorter than 30 us (30000 ns), the overhead between
--     back-to-back kernels. HTA's threshold is get_idle_time_breakdown's
--     consecutive_kernel_delay = 30, documented as ns but compared with HTA's trace times,
--     which are us: 30 us;
--   'other': the rest (e.g. the stream waiting on an event from another stream, a collective
--     waiting for its peers).
--   An op without a launch call is never host wait here; HTA joins such an op (correlation 0)
--   to trace event 0 and so calls the gap before it host wait.
CREATE OR REPLACE VIEW stream_idle WITH (DEFER_BINDING) AS
WITH o AS (
    SELECT job, rank, device, stream, eid, ts_ns, launch_ts_ns,
           max(end_ns) OVER w AS prev_end_ns, arg_max(eid, end_ns) OVER w AS prev_eid
    FROM gpu_ops
    WINDOW w AS (PARTITION BY job, rank, device, stream ORDER BY ts_ns, eid
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))
SELECT job, rank, device, stream, prev_eid, eid, prev_end_ns AS start_ns, ts_ns AS end_ns,
       ts_ns - prev_end_ns AS gap_ns, launch_ts_ns,
       CASE WHEN launch_ts_ns > prev_end_ns THEN 'host_wait'
            WHEN ts_ns - prev_end_ns < 30000 THEN 'kernel_wait'
            ELSE 'other' END AS category
FROM o WHERE ts_ns > prev_end_ns;

-- @view stream_idle_breakdown: idle time per rank, GPU stream and step, by category
--   (stream_idle clipped to the rank's steps: a gap across a step boundary is split there and
--   each piece keeps the gap's category). One row per stream and step with idle time in it.
-- job, rank, device, stream, step: the stream and the step (steps).
-- step_dur_ns, complete: steps.dur_ns and steps.complete.
-- idle_ns: the stream's idle time in the step; = host_wait_ns + kernel_wait_ns + other_ns.
-- host_wait_ns, kernel_wait_ns, other_ns: by stream_idle.category.
-- n_gaps: gaps (pieces) in the step; n_host_wait, n_kernel_wait, n_other by category.
-- host_wait_ratio, kernel_wait_ratio, other_ratio: each category's share of idle_ns (HTA's
--   idle_time_ratio).
CREATE OR REPLACE VIEW stream_idle_breakdown WITH (DEFER_BINDING) AS
WITH p AS (
    SELECT g.job, g.rank, g.device, g.stream, s.step, s.dur_ns AS step_dur_ns, s.complete,
           g.category, least(g.end_ns, s.end_ns) - greatest(g.start_ns, s.start_ns) AS ns
    FROM stream_idle g
    JOIN (SELECT job, rank, step, start_ns, end_ns, dur_ns, complete FROM steps) s
      ON g.job = s.job AND g.rank = s.rank AND g.start_ns < s.end_ns AND g.end_ns > s.start_ns),
a AS (
    SELECT job, rank, device, stream, step, any_value(step_dur_ns) AS step_dur_ns,
           any_value(complete) AS complete, sum(ns)::BIGINT AS idle_ns,
           coalesce(sum(ns) FILTER (WHERE category = 'host_wait'), 0)::BIGINT AS host_wait_ns,
           coalesce(sum(ns) FILTER (WHERE category = 'kernel_wait'), 0)::BIGINT
               AS kernel_wait_ns,
           coalesce(sum(ns) FILTER (WHERE category = 'other'), 0)::BIGINT AS other_ns,
           count(*) AS n_gaps, count(*) FILTER (WHERE category = 'host_wait') AS n_host_wait,
           count(*) FILTER (WHERE category = 'kernel_wait') AS n_kernel_wait,
           count(*) FILTER (WHERE category = 'other') AS n_other
    FROM p GROUP BY job, rank, device, stream, step)
SELECT *, host_wait_ns / idle_ns AS host_wait_ratio, kernel_wait_ns / idle_ns AS kernel_wait_ratio,
       other_ns / idle_ns AS other_ratio
FROM a;

-- @view stream_idle_rank: idle time per rank and GPU stream over the whole trace, by category:
--   HTA's get_idle_time_breakdown table (rank, stream, idle_category, idle_time,
--   idle_time_ratio), one row per stream with the categories as columns. Counts every gap of
--   stream_idle, inside steps or not.
-- job, rank, device, stream: the stream. n_ops: its GPU ops (gpu_ops).
-- span_ns: first op start to last op end on the stream; busy_ns = span_ns - idle_ns.
-- idle_ns, host_wait_ns, kernel_wait_ns, other_ns, n_gaps, n_host_wait, n_kernel_wait,
--   n_other, host_wait_ratio, kernel_wait_ratio, other_ratio: as in stream_idle_breakdown,
--   over the whole trace (0 and NULL ratios for a stream without gaps).
CREATE OR REPLACE VIEW stream_idle_rank WITH (DEFER_BINDING) AS
WITH o AS (
    SELECT job, rank, device, stream, count(*) AS n_ops,
           max(end_ns) - min(ts_ns) AS span_ns
    FROM gpu_ops GROUP BY job, rank, device, stream),
g AS (
    SELECT job, rank, device, stream, sum(gap_ns)::BIGINT AS idle_ns,
           coalesce(sum(gap_ns) FILTER (WHERE category = 'host_wait'), 0)::BIGINT
               AS host_wait_ns,
           coalesce(sum(gap_ns) FILTER (WHERE category = 'kernel_wait'), 0)::BIGINT
               AS kernel_wait_ns,
           coalesce(sum(gap_ns) FILTER (WHERE category = 'other'), 0)::BIGINT AS other_ns,
           count(*) AS n_gaps, count(*) FILTER (WHERE category = 'host_wait') AS n_host_wait,
           count(*) FILTER (WHERE category = 'kernel_wait') AS n_kernel_wait,
           count(*) FILTER (WHERE category = 'other') AS n_other
    FROM stream_idle GROUP BY job, rank, device, stream)
SELECT o.job, o.rank, o.device, o.stream, o.n_ops, o.span_ns,
       o.span_ns - coalesce(g.idle_ns, 0) AS busy_ns, coalesce(g.idle_ns, 0) AS idle_ns,
       coalesce(g.host_wait_ns, 0) AS host_wait_ns,
       coalesce(g.kernel_wait_ns, 0) AS kernel_wait_ns, coalesce(g.other_ns, 0) AS other_ns,
       coalesce(g.n_gaps, 0) AS n_gaps, coalesce(g.n_host_wait, 0) AS n_host_wait,
       coalesce(g.n_kernel_wait, 0) AS n_kernel_wait, coalesce(g.n_other, 0) AS n_other,
       g.host_wait_ns / g.idle_ns AS host_wait_ratio,
       g.kernel_wait_ns / g.idle_ns AS kernel_wait_ratio, g.other_ns / g.idle_ns AS other_ratio
FROM o LEFT JOIN g USING (job, rank, device, stream);

-- @view stream_queue_length: the launch queue of each GPU stream over time (HTA's
--   get_queue_length_time_series), one row per event that changes it: each GPU op with a
--   launch call (gpu_ops.launch_eid; ops without one, e.g. some NCCL kernels, are not
--   counted) has a 'launch' row at launch_ts_ns, a 'start' row at its GPU start and an 'end'
--   row at its GPU end. Every launch call counts, cudaGraphLaunch and synchronous cudaMemcpy
--   included (HTA counts only the calls its symbol table names as launches:
--   cuda/cuLaunchKernel(Ex[C]), cudaMemcpyAsync, cudaMemsetAsync and the hip equivalents).
--   At equal times launches come first, then starts, then ends (then eid), so an op is
--   never counted as started before it was launched.
-- job, rank, device, stream: the stream. ts_ns: the event's time. event: 'launch', 'start'
--   or 'end'. eid: the GPU op (gpu_ops.eid).
-- queue_length: ops on the stream launched and not yet started after this event (HTA's queue
--   length: +1 at a launch, -1 at a start; an 'end' row repeats the value). Never negative.
-- in_flight: ops launched and not yet finished (queue_length plus the op running, if any).
-- The value holds until the stream's next row: a step function.
CREATE OR REPLACE VIEW stream_queue_length WITH (DEFER_BINDING) AS
WITH ops AS (
    SELECT job, rank, device, stream, eid, launch_ts_ns, ts_ns, end_ns
    FROM gpu_ops WHERE launch_eid IS NOT NULL),
pts AS (
    SELECT job, rank, device, stream, eid, launch_ts_ns AS ts_ns, 'launch' AS event,
           0 AS o, 1 AS dq, 1 AS df FROM ops
    UNION ALL SELECT job, rank, device, stream, eid, ts_ns, 'start', 1, -1, 0 FROM ops
    UNION ALL SELECT job, rank, device, stream, eid, end_ns, 'end', 2, 0, -1 FROM ops)
SELECT job, rank, device, stream, ts_ns, event, eid,
       sum(dq) OVER w::BIGINT AS queue_length, sum(df) OVER w::BIGINT AS in_flight
FROM pts
WINDOW w AS (PARTITION BY job, rank, device, stream ORDER BY ts_ns, o, eid
             ROWS UNBOUNDED PRECEDING);

-- @view stream_queue_summary: launch-queue statistics per rank and GPU stream (HTA's
--   get_queue_length_summary: pandas describe() of the time series).
-- job, rank, device, stream: the stream. n_ops: GPU ops counted (with a launch call).
-- n_points: HTA's count: the 'launch' and 'start' rows of stream_queue_length (2 * n_ops);
--   min_length, max_length, mean_length, std_length (sample standard deviation), p25_length,
--   p50_length, p75_length (linear interpolation, as pandas): of queue_length over those
--   rows, as HTA computes them (each change counts once, however long it holds). HTA orders
--   a launch and a start at the same us arbitrarily (an unstable sort on us), this view
--   launch first, so mean and std can differ from HTA's in the second decimal.
-- time_weighted_mean: mean queue length over time, from the first launch to the last start
--   (each value weighted by how long it held; not in HTA).
-- max_in_flight: the largest stream_queue_length.in_flight.
-- first_ns, last_ns: the first launch and the last start of the stream.
CREATE OR REPLACE VIEW stream_queue_summary WITH (DEFER_BINDING) AS
WITH q AS (
    SELECT *, lead(ts_ns) OVER (PARTITION BY job, rank, device, stream
                                ORDER BY ts_ns, event = 'start', eid) - ts_ns AS hold_ns
    FROM stream_queue_length WHERE event IN ('launch', 'start')),
m AS (SELECT job, rank, device, stream, max(in_flight) AS max_in_flight
      FROM stream_queue_length GROUP BY ALL)
SELECT job, rank, device, stream, count(*) FILTER (WHERE event = 'launch') AS n_ops,
       count(*) AS n_points, min(queue_length) AS min_length, max(queue_length) AS max_length,
       avg(queue_length) AS mean_length, stddev_samp(queue_length) AS std_length,
       quantile_cont(queue_length, 0.25) AS p25_length,
       quantile_cont(queue_length, 0.5) AS p50_length,
       quantile_cont(queue_length, 0.75) AS p75_length,
       sum(queue_length * hold_ns) / nullif(sum(hold_ns), 0) AS time_weighted_mean,
       any_value(m.max_in_flight) AS max_in_flight, min(ts_ns) AS first_ns,
       max(ts_ns) AS last_ns
FROM q JOIN m USING (job, rank, device, stream)
GROUP BY job, rank, device, stream;

-- @macro stream_queue_full_at(max_queue_length): stream_queue_full with another limit.
CREATE OR REPLACE MACRO stream_queue_full_at(max_queue_length) AS TABLE
WITH q AS (
    SELECT job, rank, device, stream, queue_length, queue_length >= max_queue_length AS full,
           max_queue_length::BIGINT AS lim,
           lead(ts_ns) OVER (PARTITION BY job, rank, device, stream
                             ORDER BY ts_ns, event = 'start', eid) - ts_ns AS hold_ns
    FROM stream_queue_length WHERE event IN ('launch', 'start')),
span AS (SELECT job, rank, max(ts_ns) - min(ts_ns) AS trace_span_ns FROM events GROUP BY ALL)
SELECT q.job, q.rank, q.device, q.stream, any_value(q.lim) AS max_queue_length,
       coalesce(sum(q.hold_ns) FILTER (WHERE q.full), 0)::BIGINT AS full_ns,
       count(*) FILTER (WHERE q.full) AS n_full, any_value(s.trace_span_ns) AS trace_span_ns,
       coalesce(sum(q.hold_ns) FILTER (WHERE q.full), 0)
           / nullif(any_value(s.trace_span_ns), 0) AS full_ratio
FROM q JOIN span s USING (job, rank)
GROUP BY q.job, q.rank, q.device, q.stream;

-- @view stream_queue_full: time each GPU stream's launch queue was full (HTA's
--   get_time_spent_blocked_on_full_queue): the CUDA launch queue holds 1024 ops per stream
--   (HTA's CUDA_MAX_LAUNCH_QUEUE_PER_STREAM, hta/common/constants.py); while it is full the
--   next launch call blocks the CPU. One row per stream with counted ops (HTA keeps only
--   streams that were full, and one per rank); stream_queue_full_at(N) takes another limit.
-- job, rank, device, stream: the stream. max_queue_length: the limit (1024).
-- full_ns: total time stream_queue_summary's series (launch and start rows) held a
--   queue_length >= max_queue_length, each row until the stream's next one (HTA's
--   duration_at_max_queue_length). n_full: such rows.
-- trace_span_ns: the rank's trace span, first to last event start (events.ts_ns; HTA's
--   get_trace_duration). full_ratio: full_ns / trace_span_ns (HTA's
--   relative_duration_at_max_queue_length).
CREATE OR REPLACE VIEW stream_queue_full WITH (DEFER_BINDING) AS
SELECT * FROM stream_queue_full_at(1024);
