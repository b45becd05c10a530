"""Opening a store and choosing its job: shared by the commands that work on one job."""

from __future__ import annotations

from pathlib import Path

import click
import duckdb

from tracetool.analysis.connect import connect


def open_job(store: Path, job: str | None) -> tuple[duckdb.DuckDBPyConnection, str]:
    """A connection with every view, and the job (the only one when ``job`` is None)."""
    con = connect(store)
    jobs = [j for (j,) in con.execute("SELECT DISTINCT job FROM trace_files ORDER BY 1")
            .fetchall()]
    if job is None:
        if len(jobs) != 1:
            raise click.ClickException(f"{store}: holds jobs {jobs}; pick one with --job")
        return con, jobs[0]
    if job not in jobs:
        raise click.ClickException(f"{store}: no job {job!r} (jobs: {jobs})")
    return con, job
