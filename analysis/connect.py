"""``tracetool.connect(store)``: DuckDB with the store's tables and the analysis views.

The views live in ``analysis/sql/*.sql``, applied in file-name order; each view is documented
where it is defined (purpose, every column, units), as Perfetto's SQL standard library does.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import duckdb

from tracetool.store_views import connect_store
from tracetool.store_views import setup_sql as table_setup_sql


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
    return connect_store(store, con, allow_writes=allow_writes, dependent_views=views_sql())
