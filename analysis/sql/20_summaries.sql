-- @view kernel_summary: kernels by name, per rank.
-- job, rank, name, category (see kernels). count: launches. total_ns, mean_ns, p50_ns,
--   p99_ns, min_ns, max_ns: durations (p50/p99 nearest-rank quantiles).
-- share_of_gpu: total_ns / all kernel time of the rank.
CREATE OR REPLACE VIEW kernel_summary WITH (DEFER_BINDING) AS
SELECT job, rank, name, any_value(category) AS category, count(*) AS count,
       sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS mean_ns,
       quantile_disc(dur_ns, 0.5) AS p50_ns, quantile_disc(dur_ns, 0.99) AS p99_ns,
       min(dur_ns) AS min_ns, max(dur_ns) AS max_ns,
       sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY job, rank) AS share_of_gpu
FROM kernels GROUP BY job, rank, name;

-- @view op_summary: CPU operators by name, per rank.
-- job, rank, name. count. total_ns (inclusive), self_ns (exclusive of children), mean_ns,
--   p50_ns, p99_ns, max_ns: inclusive durations.
CREATE OR REPLACE VIEW op_summary WITH (DEFER_BINDING) AS
SELECT job, rank, name, count(*) AS count, sum(dur_ns)::BIGINT AS total_ns,
       sum(self_ns)::BIGINT AS self_ns, avg(dur_ns) AS mean_ns,
       quantile_disc(dur_ns, 0.5) AS p50_ns, quantile_disc(dur_ns, 0.99) AS p99_ns,
       max(dur_ns) AS max_ns
FROM cpu_ops GROUP BY job, rank, name;
