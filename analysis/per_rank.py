"""Per-rank analyses as tasks (``tracetool report --executor ray``).

The views that read a rank's big tables (events, kernels, GPU ops) and give a small result
per rank (``PER_RANK_VIEWS``) are computed one task per rank, on a Ray cluster, each task
opening the store itself and keeping only its rank's rows; the driver gathers the small
results and puts them in place of the views on its connection (a temporary table of the
same name hides a view), so everything built on them (the report's breakdown, its top
kernels) reads the gathered rows. The driver never scans the ranks' events for them, and
no task holds more than one rank. The rows are the views' own: a task asks its full-store
connection for ``WHERE job = J AND rank = R``, so a per-rank row that depends on other
ranks (a step's ``complete`` needs the step on every rank) is the same as the driver's.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from tracetool.ray_cluster import ray_cluster

from .connect import connect
from .windows import Windows, use_windows

# views whose rows are per rank, each read from that rank's big tables
PER_RANK_VIEWS = ("step_breakdown", "kernel_summary", "op_summary")
TASK_MEMORY = 2 << 30  # bytes Ray reserves per task (one rank's views, DuckDB's working set)


class RankTaskError(RuntimeError):
    """A per-rank task failed (the message is one line)."""


def rank_views(store: str, job: str, rank: int, windows: Windows) -> dict[str, pa.Table]:
    """One rank's rows of every PER_RANK_VIEWS view (what a task returns)."""
    with duckdb.connect() as con:
        connect(store, con)
        use_windows(con, job, windows)
        return {v: con.sql(f"SELECT * FROM {v} WHERE job = $job AND rank = $rank",
                           params={"job": job, "rank": rank}).to_arrow_table()
                for v in PER_RANK_VIEWS}


def gather_on_ray(con: duckdb.DuckDBPyConnection, store: Path | str, job: str,
                  windows: Windows) -> int:
    """Compute ``job``'s PER_RANK_VIEWS as one Ray task per rank and put the gathered rows in
    place of the views on ``con``; returns the number of tasks."""
    ranks = [r for (r,) in con.execute(
        "SELECT DISTINCT rank FROM trace_files WHERE job = ? ORDER BY rank", [job]).fetchall()]
    with ray_cluster() as ray:
        task = ray.remote(num_cpus=1, memory=TASK_MEMORY, max_retries=1)(rank_views)
        try:
            parts = ray.get([task.remote(str(store), job, r, windows) for r in ranks])
        except ray.exceptions.RayError as err:  # a task failed, or its worker died
            lines = str(err).strip().splitlines()
            raise RankTaskError(f"a per-rank task failed: {lines[-1] if lines else err!r}"
                                ) from None
    for v in PER_RANK_VIEWS:
        # the view's own column types even when no rank has rows
        empty = con.sql(f"SELECT * FROM {v} LIMIT 0").to_arrow_table()
        con.register("_per_rank_rows", pa.concat_tables([empty, *(p[v] for p in parts)]))
        con.execute(f"CREATE OR REPLACE TEMP TABLE {v} AS SELECT * FROM _per_rank_rows")
        con.unregister("_per_rank_rows")
    return len(ranks)
