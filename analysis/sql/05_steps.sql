-- Steps: the one definition every command uses (docs/steps.md has the rules and a worked
-- example). Two objects: `steps`, per rank, and `job_steps`, the synchronised iteration across
-- the ranks of a job. Both tile the timeline: no overlap, and the durations add up to the span
-- from the first step's start to the last step's end.

-- @view step_marks: what the steps are made of. By default the store's ProfilerStep#N
--   annotations: All columns of profiler_steps, plus tiled = TRUE, window_start_ns and
--   window_end_ns NULL. `--annotation NAME [--instance N]` and `--window A:B`
--   (tracetool.analysis.windows) redefine it on a connection: the instances of a user
--   annotation (step = 0, 1, ... per rank in time order), or one time window on every rank
--   (step 0, window_start_ns/window_end_ns its bounds), as steps that are not tiled
--   (tiled = FALSE): each spans its own events.
CREATE OR REPLACE VIEW step_marks WITH (DEFER_BINDING) AS
SELECT *, TRUE AS tiled, NULL::BIGINT AS window_start_ns, NULL::BIGINT AS window_end_ns
FROM profiler_steps;

-- @view step_gpu_ops: the GPU ops each step_marks row launched.
-- job, rank, step, eid (gpu_ops.eid). By default gpu_ops.step, the ProfilerStep the op's
--   launch lies in; for annotation windows, the instance its launch lies in.
CREATE OR REPLACE VIEW step_gpu_ops WITH (DEFER_BINDING) AS
SELECT job, rank, step, eid FROM gpu_ops WHERE step IS NOT NULL;

-- @view steps: each rank's ProfilerStep#N as a tile of its timeline (per rank), from
--   step_marks.
-- job, rank, step: the step (N of ProfilerStep#N). eid, tid: its CPU annotation and thread.
-- side: which starts the boundaries between this rank's steps are taken at: 'gpu' when the
--   GPU lags the CPU on this rank (some step's GPU work ends after the next step's CPU
--   start), so each step's GPU work lies in that step; else 'cpu'. For windows that are
--   not tiled: 'span' (an annotation instance: its CPU start or first GPU op, whichever is
--   first, to its latest end, CPU or GPU) or 'window' (the time window itself).
-- tiled: step_marks.tiled (FALSE for --annotation / --window windows).
-- start_ns, end_ns, dur_ns: the tile. Every step, the first included, starts at its start
--   on `side`: 'gpu', its first GPU op (profiler_steps.gpu_first_ns, or cpu_start_ns when
--   the step has no GPU op); 'cpu', its CPU annotation's start (cpu_start_ns). So all of a
--   rank's boundaries are on one clock (a first step from its CPU start to the next step's
--   first GPU op would add the CPU's lead over the GPU to it). Never before the previous
--   step's start; each step ends where the next one starts, the last at its latest event,
--   CPU or GPU.
--   dur_ns is the iteration period: what a wall clock around the training loop measures.
-- start_eid: the event whose start is start_ns before the never-before-the-previous clamp
--   (the CPU annotation or the GPU op); the replay projects the same point.
-- cpu_start_ns, cpu_end_ns, gpu_start_ns, gpu_end_ns, gpu_first_ns, n_gpu_ops: the raw
--   facts (profiler_steps).
-- complete, incomplete_reason: FALSE with a reason for a step that does not show a whole
--   iteration: 'open' (its annotation never ended), 'cut' (the rank's last step, with fewer
--   than half the GPU ops of the rank's other steps: the trace window stopped mid-step),
--   'not_on_all_ranks' (some rank of the job has no such step). Means, medians, the report
--   and the critical-path summary leave incomplete steps out.
CREATE OR REPLACE VIEW steps WITH (DEFER_BINDING) AS
WITH sm AS MATERIALIZED (SELECT * FROM step_marks),  -- read once: a Parquet file per rank
p AS (
    SELECT *,
           lead(cpu_start_ns) OVER w AS next_cpu_start_ns,
           row_number() OVER w AS i, count(*) OVER (PARTITION BY job, rank) AS n
    FROM sm WINDOW w AS (PARTITION BY job, rank ORDER BY step)),
side AS (
    SELECT job, rank, coalesce(bool_or(gpu_end_ns > next_cpu_start_ns), FALSE) AS gpu_lags
    FROM p GROUP BY job, rank),
raw AS (
    SELECT p.*, CASE WHEN p.window_start_ns IS NOT NULL THEN 'window'
                     WHEN NOT p.tiled THEN 'span'
                     WHEN s.gpu_lags THEN 'gpu' ELSE 'cpu' END AS side,
           CASE WHEN p.window_start_ns IS NOT NULL THEN p.window_start_ns
                WHEN NOT p.tiled AND p.gpu_first_ns < p.cpu_start_ns THEN p.gpu_first_ns
                WHEN NOT p.tiled THEN p.cpu_start_ns
                WHEN s.gpu_lags THEN coalesce(p.gpu_first_ns, p.cpu_start_ns)
                ELSE p.cpu_start_ns END AS raw_start_ns,
           CASE WHEN p.window_start_ns IS NOT NULL THEN NULL
                WHEN NOT p.tiled AND p.gpu_first_ns < p.cpu_start_ns THEN p.gpu_first_eid
                WHEN NOT p.tiled THEN p.eid
                WHEN s.gpu_lags THEN coalesce(p.gpu_first_eid, p.eid)
                ELSE p.eid END AS start_eid
    FROM p JOIN side s USING (job, rank)),
clamped AS (
    SELECT *, CASE WHEN tiled THEN max(raw_start_ns) OVER (
                  PARTITION BY job, rank ORDER BY step ROWS UNBOUNDED PRECEDING)
              ELSE raw_start_ns END AS start_ns
    FROM raw),
ended AS (
    SELECT *, CASE WHEN window_end_ns IS NOT NULL THEN window_end_ns
                   WHEN tiled THEN coalesce(
                       lead(start_ns) OVER (PARTITION BY job, rank ORDER BY step),
                       greatest(start_ns, cpu_end_ns, gpu_end_ns, cpu_start_ns))
                   ELSE greatest(start_ns, cpu_end_ns, gpu_end_ns, cpu_start_ns) END AS end_ns
    FROM clamped),
job_ranks AS (SELECT job, count(DISTINCT rank) AS n_ranks FROM trace_files GROUP BY job),
step_ranks AS (SELECT job, step, count(*) AS n_ranks FROM sm GROUP BY job, step)
SELECT e.job, e.rank, e.step, e.eid, e.tid, e.side, e.tiled, e.start_ns, e.end_ns,
       e.end_ns - e.start_ns AS dur_ns, e.start_eid, e.cpu_start_ns, e.cpu_end_ns,
       e.gpu_start_ns, e.gpu_end_ns, e.gpu_first_ns, e.n_gpu_ops,
       r.reason IS NULL AS complete, r.reason AS incomplete_reason
FROM ended e
JOIN job_ranks j USING (job)
JOIN step_ranks sr USING (job, step)
CROSS JOIN LATERAL (SELECT CASE
    WHEN NOT e.finished THEN 'open'
    WHEN e.tiled AND e.i = e.n AND e.n > 1 AND e.n_gpu_ops < 0.5 * (
             SELECT median(q.n_gpu_ops) FROM sm q
             WHERE q.job = e.job AND q.rank = e.rank AND q.step <> e.step)
         THEN 'cut'
    WHEN sr.n_ranks < j.n_ranks THEN 'not_on_all_ranks' END AS reason) r;

-- @view job_steps: the job-wide step: iteration N as the whole job ran it (one row per job
--   and step). Times on the ranks' recorded clocks (ranks of one host share one; across
--   hosts NTP keeps them within tens of microseconds). When some ProfilerStep's ranks
--   started it more than a step apart (the job's median of mean_rank_dur_ns: ranks that
--   synchronise every step start it within one), the ranks' clocks
--   disagree (hosts without NTP, or traces of different runs put together: days apart on
--   generated ones), the latest-rank boundaries mix clocks, and every step of the job is
--   incomplete, 'clocks_disagree' (tracetool.analysis.collectives warns, with the offsets
--   of rank_clock_offsets). Each rank's own steps (steps) stand: one clock each.
-- job, step. n_ranks: ranks that have the step. tiled: the ranks' steps are (steps.tiled).
-- start_ns, end_ns, dur_ns: the tile. Iteration N is done when the last rank has started
--   iteration N + 1, so the boundary between two job steps is the latest of the ranks'
--   boundaries (steps.start_ns); the first step starts at the earliest rank's start and the
--   last ends at the latest rank's end. Job steps tile the job's span like steps tile a
--   rank's. This is what `tracetool replay` calls the measured step.
-- mean_rank_dur_ns: mean over the ranks of steps.dur_ns (what step_breakdown splits).
-- complete, incomplete_reason: FALSE when the job's clocks disagree ('clocks_disagree',
--   above) or any rank's step is incomplete (its reason; 'open' before 'cut' before
--   'not_on_all_ranks').
-- start_spread_ns: the latest rank's start of the step minus the earliest's.
-- Windows that are not tiled (steps.tiled FALSE) are not tiled here either: each spans the
--   earliest rank's start to the latest rank's end.
CREATE OR REPLACE VIEW job_steps WITH (DEFER_BINDING) AS
WITH s AS MATERIALIZED (  -- read by the tiling and the clock check: steps computed once
    SELECT job, step, count(*) AS n_ranks, min(start_ns) AS first_start_ns,
           max(start_ns) AS last_start_ns, max(end_ns) AS last_end_ns,
           avg(dur_ns) AS mean_rank_dur_ns, bool_and(complete) AS complete,
           bool_and(tiled) AS tiled,
           min(CASE incomplete_reason WHEN 'open' THEN 1 WHEN 'cut' THEN 2
                                      WHEN 'not_on_all_ranks' THEN 3 END) AS reason_code
    FROM steps GROUP BY job, step),
raw AS (
    SELECT *, CASE WHEN row_number() OVER (PARTITION BY job ORDER BY step) = 1 OR NOT tiled
                   THEN first_start_ns ELSE last_start_ns END AS raw_start_ns
    FROM s),
clamped AS (
    SELECT *, CASE WHEN tiled THEN max(raw_start_ns) OVER (
                  PARTITION BY job ORDER BY step ROWS UNBOUNDED PRECEDING)
              ELSE raw_start_ns END AS start_ns
    FROM raw),
ended AS (
    SELECT *, CASE WHEN tiled THEN coalesce(lead(start_ns) OVER (PARTITION BY job ORDER BY step),
                                            greatest(start_ns, last_end_ns))
                   ELSE greatest(start_ns, last_end_ns) END AS end_ns
    FROM clamped),
clocks AS (  -- a job whose ranks started some ProfilerStep more than a step apart
    SELECT job, coalesce(bool_or(tiled AND last_start_ns - first_start_ns > m), FALSE) AS apart
    FROM (SELECT job, tiled, first_start_ns, last_start_ns,
                 median(mean_rank_dur_ns) OVER (PARTITION BY job) AS m FROM s)
    GROUP BY job)
SELECT job, step, n_ranks, tiled, start_ns, end_ns, end_ns - start_ns AS dur_ns,
       mean_rank_dur_ns, complete AND NOT c.apart AS complete,
       CASE WHEN c.apart THEN 'clocks_disagree'
            ELSE ['open', 'cut', 'not_on_all_ranks'][reason_code] END AS incomplete_reason,
       last_start_ns - first_start_ns AS start_spread_ns
FROM ended JOIN clocks c USING (job)
ORDER BY job, step;
