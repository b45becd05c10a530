"""``tracetool.connect(store)``: DuckDB with the store's tables and the analysis views.

The views live in ``analysis/sql/*.sql``, applied in file-name order; each view is documented
where it is defined (purpose, every column, units), as Perfetto's SQL standard library does.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import duckdb

from tracetool.errors import StoreError, job_problem, one_line
from tracetool.objstore import is_object_store
from tracetool.store_views import connect_store, table_files
from tracetool.store_views import setup_sql as table_setup_sql

from . import efficiency


def view_files() -> list[tuple[str, str]]:
    """(file name, SQL text) of the analysis views, in the order they must be created."""
    sql_dir = resources.files("tracetool.analysis").joinpath("sql")
    files = sorted((f for f in sql_dir.iterdir() if f.name.endswith(".sql")),
                   key=lambda f: f.name)
    return [(f.name, f.read_text()) for f in files]


def sql_file(name: str) -> str:
    """The text of one file of analysis/sql (e.g. the interval union the replay shares)."""
    return resources.files("tracetool.analysis").joinpath("sql", name).read_text()


def setup_sql(store: Path | str, allow_writes: Iterable[Path | str] = ()) -> str:
    """All the SQL that opens ``store`` read-only and defines the tables' views and the
    analysis views (paste into the DuckDB CLI: the session is then as safe as ``connect``)."""
    return table_setup_sql(store, allow_writes, views_sql())


def views_sql() -> str:
    """The SQL of every analysis view, in order."""
    return "\n\n".join(sql for _, sql in view_files())


def connect(store: Path | str, con: duckdb.DuckDBPyConnection | None = None, *,
            allow_writes: Iterable[Path | str] = ()) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per store table and every analysis view.

    Use ``.sql(...)`` for a relation, ``.pl()`` on it for a polars frame. Queries read only
    the store's files and write files only under the ``allow_writes`` directories (none by
    default); in-memory and temporary tables work, and Python frames are queried after
    ``con.register(name, frame)``. (A COPY aimed at one of the store's own files with
    USE_TMP_FILE false or OVERWRITE is the one write DuckDB's settings cannot stop.)"""
    con = connect_store(store, con, allow_writes=allow_writes, dependent_views=views_sql())
    efficiency.register(con)  # the functions op_efficiency calls (analysis/efficiency.py)
    return con


def open_job(store: Path | str, job: str | None = None
             ) -> tuple[duckdb.DuckDBPyConnection, str]:
    """A connection to ``store`` (a directory or an object store's URL) with every view, and
    the job to look at: ``job`` if given, else the store's only job (a store of several jobs
    is ambiguous, so that is an error)."""
    if not is_object_store(store):
        if not Path(store).exists():
            raise StoreError(f"{store}: no such file or directory")
        if not (Path(store) / "data").is_dir():
            raise StoreError(f"{store}: not a tracetool store (no data/ directory)")
        if not table_files(store, "trace_files"):  # before its format.json is asked for
            raise StoreError(f"{store}: the store holds no ingested traces")
    con = duckdb.connect()
    try:
        connect(store, con)
        jobs = [r[0] for r in con.execute(
            "SELECT DISTINCT job FROM trace_files ORDER BY job").fetchall()]
    except (duckdb.Error, OSError) as err:
        con.close()  # now, not when a reference cycle is collected (see tracetool.cli.report)
        message = str(err) if isinstance(err, StoreError | FileNotFoundError) else \
            f"{store}: cannot read the store: {one_line(err)}"
        raise StoreError(message) from None
    problem = job_problem(store, jobs, job)
    if problem:
        con.close()
        raise StoreError(problem)
    return con, job or jobs[0]
