-- The interval union: the one computation of "time with at least one X running" that
-- step_breakdown and `tracetool replay`'s breakdown share (the replay runs this file on its
-- own connection, over the projected intervals). Needs no store table.

-- @macro interval_unions(intervals): union lengths of busy intervals per (job, rank, step).
-- intervals: the name of a table or view with columns job, rank, step, s_ns, e_ns, what
--   (compute, comm, memcpy or cpu); the intervals of a (job, rank, step) are clipped to its
--   window (as step_intervals does to the steps); windows may overlap.
-- Returns jh (hash(job): join on it), rank, step, and in ns: compute, comm, memcpy (time with
--   at least one such interval), both_ (compute and comm at once), compute_or_comm, busy
--   (compute, comm or memcpy), busy_cpu (any of the four). NULL where a kind has no time.
CREATE OR REPLACE MACRO interval_unions(intervals) AS TABLE
WITH si AS MATERIALIZED (  -- integer keys and weights: the window below sorts on them
    SELECT hash(job) AS jh, rank, step, s_ns, e_ns,
           CASE what WHEN 'compute' THEN 1 WHEN 'comm' THEN 65536
                     WHEN 'memcpy' THEN 4294967296 ELSE 281474976710656 END AS w
    FROM query_table(intervals)),
points AS (  -- a sweep line: +w where an interval starts, -w where it ends; w puts each kind
             -- in its own 16-bit counter, so one running sum tracks all four
    SELECT jh, rank, step, s_ns AS t, 1 AS d, w FROM si
    UNION ALL SELECT jh, rank, step, e_ns AS t, -1 AS d, w FROM si),
running AS (  -- one running sum over all steps in order: each step's +w and -w cancel,
              -- so the counters are back at 0 where the next step begins (and the last
              -- point of a step, whose seg would reach into the next one, counts nothing)
    SELECT jh, rank, step, sum(d * w) OVER win AS packed,
           coalesce(lead(t) OVER win, t) - t AS seg  -- until the next point
    FROM points WINDOW win AS (ORDER BY jh, rank, step, t, d
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)),
sweep AS (
    SELECT jh, rank, step, seg, packed & 65535 AS n_compute,
           (packed >> 16) & 65535 AS n_comm, (packed >> 32) & 65535 AS n_memcpy,
           packed >> 48 AS n_cpu
    FROM running)
SELECT jh, rank, step,
       sum(seg) FILTER (WHERE n_compute > 0) AS compute,
       sum(seg) FILTER (WHERE n_comm > 0) AS comm,
       sum(seg) FILTER (WHERE n_memcpy > 0) AS memcpy,
       sum(seg) FILTER (WHERE n_compute > 0 AND n_comm > 0) AS both_,
       sum(seg) FILTER (WHERE n_compute + n_comm > 0) AS compute_or_comm,
       sum(seg) FILTER (WHERE n_compute + n_comm + n_memcpy > 0) AS busy,
       sum(seg) FILTER (WHERE n_compute + n_comm + n_memcpy + n_cpu > 0) AS busy_cpu
FROM sweep GROUP BY jh, rank, step;
