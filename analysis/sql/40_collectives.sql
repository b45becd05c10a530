-- @view collective_ranks: collectives with the key that matches one call across ranks.
-- All columns of collectives, plus instance: 'pg:<pg_name>:seq:<seq>' when the trace
--   recorded the group's sequence number, else 'pg:<pg_name>:call:<call_index>' (the
--   n-th call of that group on each rank; exact when every rank issues the same calls).
CREATE OR REPLACE VIEW collective_ranks AS
SELECT *, 'pg:' || coalesce(pg_name, '?') || CASE WHEN seq IS NOT NULL
       THEN ':seq:' || seq ELSE ':call:' || call_index END AS instance
FROM collectives;

-- @view rank_clock_offsets: per-rank clock offset against the job's lowest rank.
-- job, rank. offset_ns: median over matched collectives of (this rank's end - the reference
--   rank's end): all ranks of a collective finish together, within its transfer jitter, so
--   the median difference estimates how far this rank's clock runs ahead. Subtract it to
--   align (events_aligned does). n_samples: collectives used. 0 for the reference rank.
CREATE OR REPLACE VIEW rank_clock_offsets AS
WITH ref AS (SELECT job, min(rank) AS ref_rank FROM collective_ranks GROUP BY job),
d AS (
    SELECT c.job, c.rank, c.end_ns - r.end_ns AS diff
    FROM collective_ranks c JOIN ref USING (job)
    JOIN collective_ranks r ON r.job = c.job AND r.rank = ref.ref_rank
                           AND r.instance = c.instance
    WHERE c.end_ns IS NOT NULL AND r.end_ns IS NOT NULL)
SELECT f.job, f.rank, coalesce(quantile_disc(d.diff, 0.5), 0)::BIGINT AS offset_ns,
       count(d.diff) AS n_samples
FROM trace_files f LEFT JOIN d ON d.job = f.job AND d.rank = f.rank
GROUP BY f.job, f.rank;

-- @view events_aligned: events with times moved onto the reference rank's clock.
-- All columns of events; ts_ns and end_ns minus the rank's offset_ns (rank_clock_offsets).
CREATE OR REPLACE VIEW events_aligned AS
SELECT e.* REPLACE (e.ts_ns - coalesce(o.offset_ns, 0) AS ts_ns,
                    e.end_ns - coalesce(o.offset_ns, 0) AS end_ns)
FROM events e LEFT JOIN rank_clock_offsets o USING (job, rank);

-- @view collective_instances: each collective call matched across the ranks of its group;
--   one row per (instance, rank), times on the aligned clock.
-- job, instance (see collective_ranks), pg_name, collective, rank, step.
-- arrival_ns, end_ns: when this rank's transfer started (kernel or gloo span) and ended.
-- dur_ns: end_ns - arrival_ns on this rank.
-- n_ranks: ranks of the job seen in this instance; group_size: ranks the group has.
-- first_arrival_ns, last_arrival_ns: over the ranks; skew_ns = last - first arrival.
-- last_rank: the rank that arrived last. wait_ns: last_arrival_ns - arrival_ns, the time this
--   rank waited for the last one.
-- transfer_ns: the shortest per-rank duration, i.e. the last arrival's: the transfer itself.
-- bytes: the message size nccl-tests calls S (allgather: the gathered output; others: the
--   input). algbw_gbps = bytes / transfer_ns (GB/s); busbw_gbps = algbw * factor, factor
--   2(n-1)/n for allreduce, (n-1)/n for allgather / reduce_scatter / alltoall, 1 otherwise.
CREATE OR REPLACE VIEW collective_instances AS
WITH c AS (
    SELECT c.*, c.ts_ns - coalesce(o.offset_ns, 0) AS arrival_ns,
           c.end_ns - coalesce(o.offset_ns, 0) AS aligned_end_ns
    FROM collective_ranks c LEFT JOIN rank_clock_offsets o USING (job, rank)),
i AS (
    SELECT *,
           count(*) OVER w AS n_ranks,
           min(arrival_ns) OVER w AS first_arrival_ns,
           max(arrival_ns) OVER w AS last_arrival_ns,
           arg_max(rank, arrival_ns) OVER w AS last_rank,
           min(aligned_end_ns - arrival_ns) OVER w AS transfer_ns,
           lower(collective) AS coll
    FROM c WINDOW w AS (PARTITION BY job, instance))
SELECT job, instance, pg_name, collective, rank, step, arrival_ns,
       aligned_end_ns AS end_ns, aligned_end_ns - arrival_ns AS dur_ns, n_ranks,
       coalesce(group_size, n_ranks) AS group_size, first_arrival_ns, last_arrival_ns,
       last_arrival_ns - first_arrival_ns AS skew_ns, last_rank,
       last_arrival_ns - arrival_ns AS wait_ns, transfer_ns,
       CASE WHEN coll LIKE '%allgather%' OR coll LIKE '%all_gather%'
            THEN coalesce(out_bytes, in_bytes * coalesce(group_size, n_ranks))
            ELSE coalesce(in_bytes, out_bytes) END AS bytes,
       bytes / nullif(transfer_ns, 0) AS algbw_gbps,
       bytes / nullif(transfer_ns, 0) * (
           CASE WHEN coll LIKE '%allreduce%' OR coll LIKE '%all_reduce%'
                THEN 2.0 * (coalesce(group_size, n_ranks) - 1) / coalesce(group_size, n_ranks)
                WHEN coll LIKE '%allgather%' OR coll LIKE '%all_gather%'
                  OR coll LIKE '%reduce_scatter%' OR coll LIKE '%reducescatter%'
                  OR coll LIKE '%all_to_all%' OR coll LIKE '%alltoall%'
                THEN 1.0 * (coalesce(group_size, n_ranks) - 1) / coalesce(group_size, n_ranks)
                ELSE 1.0 END) AS busbw_gbps
FROM i;

-- @view stragglers: which ranks make the others wait at collectives, and what they were
--   doing just before.
-- job, rank. instances: matched collectives (with at least 2 ranks) this rank took part in.
-- times_last: how often it arrived last; share_last = times_last / instances.
-- caused_wait_ns: when it was last, the summed wait of the other ranks.
-- mean_lateness_ns: when last, mean of (its arrival - the second-to-last arrival).
-- top_op_before: the GPU kernel (CPU op on CPU-only ranks) with the most time in the
--   windows before its late arrivals (from its previous collective's end to the arrival).
CREATE OR REPLACE VIEW stragglers AS
WITH ci AS (SELECT * FROM collective_instances WHERE n_ranks > 1),
late AS (
    SELECT a.job, a.rank, a.instance, a.arrival_ns,
           (SELECT sum(b.wait_ns) FROM ci b WHERE b.job = a.job AND b.instance = a.instance)
               AS caused,
           a.arrival_ns - (SELECT max(b.arrival_ns) FROM ci b WHERE b.job = a.job
                           AND b.instance = a.instance AND b.rank <> a.rank) AS lateness
    FROM ci a WHERE a.rank = a.last_rank),
prev AS (  -- this rank's previous collective end, on its own clock
    SELECT c.job, c.rank, c.instance, c.ts_ns AS arrival_raw,
           lag(c.end_ns) OVER (PARTITION BY c.job, c.rank ORDER BY c.ts_ns) AS prev_end
    FROM collective_ranks c),
windows AS (
    SELECT l.job, l.rank, coalesce(p.prev_end, p.arrival_raw) AS w0, p.arrival_raw AS w1
    FROM late l JOIN prev p USING (job, rank, instance)),
busy AS (
    SELECT w.job, w.rank, e.name,
           sum(least(e.end_ns, w.w1) - greatest(e.ts_ns, w.w0)) AS ns
    FROM windows w JOIN events e ON e.job = w.job AND e.rank = w.rank
     AND e.ts_ns < w.w1 AND e.end_ns > w.w0
    LEFT JOIN events pe ON pe.job = e.job AND pe.rank = e.rank AND pe.eid = e.parent_eid
    WHERE e.ph = 'X' AND (e.kind = 'kernel' OR (e.kind = 'cpu_op'
                                                 AND coalesce(pe.kind, '') <> 'cpu_op'))
    GROUP BY ALL),
top AS (SELECT job, rank, arg_max(name, ns) AS top_op_before FROM busy GROUP BY ALL),
per_rank AS (SELECT job, rank, count(*) AS instances FROM ci GROUP BY ALL),
late_rank AS (SELECT job, rank, count(*) AS times_last, sum(caused) AS caused_wait_ns,
                     avg(lateness) AS mean_lateness_ns FROM late GROUP BY ALL)
SELECT p.job, p.rank, p.instances, coalesce(l.times_last, 0) AS times_last,
       coalesce(l.times_last, 0) / p.instances AS share_last,
       coalesce(l.caused_wait_ns, 0)::BIGINT AS caused_wait_ns,
       l.mean_lateness_ns::BIGINT AS mean_lateness_ns, t.top_op_before
FROM per_rank p LEFT JOIN late_rank l USING (job, rank) LEFT JOIN top t USING (job, rank);
