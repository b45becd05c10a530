"""Print a short summary of a trace store (used by scripts/main.sh)."""

import sys

import tracetool

# every column, however narrow the terminal (DuckDB drops the middle ones to fit it)
WIDTH = 10_000
con = tracetool.connect(sys.argv[1])
print("\nPer rank: events, steps and collectives")
con.sql("""
    SELECT f.job, f.rank, f.events_read, f.events_stored, f.events_quarantined,
           (SELECT count(*) FROM steps s WHERE s.job = f.job AND s.rank = f.rank) AS steps,
           (SELECT round(median(dur_ns) / 1e6, 2) FROM steps s
             WHERE s.job = f.job AND s.rank = f.rank AND s.complete) AS median_step_ms,
           (SELECT count(*) FROM collectives c WHERE c.job = f.job AND c.rank = f.rank)
             AS collectives,
           (SELECT round(sum(dur_ns) / 1e6, 2) FROM collectives c
             WHERE c.job = f.job AND c.rank = f.rank) AS collective_ms
    FROM trace_files f ORDER BY f.job, f.rank""").show(max_width=WIDTH)
print("Collectives of rank 0 of each job")
con.sql("""
    SELECT job, step, collective, backend, group_ranks, dtype, in_nelems, in_bytes,
           round(dur_ns / 1e6, 3) AS transfer_ms
    FROM collectives WHERE rank = 0 ORDER BY job, cpu_ts_ns""").show(max_rows=40, max_width=WIDTH)
