"""Open a trace store in DuckDB: one view per table over its Parquet partitions."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from tracetool.schema import TABLES


def table_sql(store: Path | str, table: str) -> str:
    """The read_parquet() expression for one table of a store (job and rank from the path)."""
    glob = Path(store) / "data" / "job=*" / "rank=*" / table / "*.parquet"
    return (f"read_parquet('{glob}', hive_partitioning = true, union_by_name = true, "
            "hive_types = {'job': VARCHAR, 'rank': INTEGER})")


def setup_sql(store: Path | str) -> str:
    """SQL that defines a view per table over the store (for the DuckDB CLI too)."""
    store = Path(store).resolve()
    return "\n".join(
        f"CREATE OR REPLACE VIEW {t.name} AS SELECT * FROM {table_sql(store, t.name)};"
        for t in TABLES
    )


# Version of the store's layout and tables; a store of another format is refused (re-ingest)
# rather than read wrongly. Written to STORE/format.json by the first ingest.
# 2: the steps table became profiler_steps (raw annotation facts; steps is an analysis view).
STORE_FORMAT = 2


class StoreFormatError(OSError):
    """The store was written by a tracetool with another store format."""


def check_format(store: Path | str) -> None:
    """Raise StoreFormatError unless ``store`` (which has data) is of STORE_FORMAT."""
    f = Path(store) / "format.json"
    try:
        fmt = json.loads(f.read_text()).get("format")
    except FileNotFoundError:
        fmt = None
    except (OSError, ValueError, AttributeError):
        fmt = "unreadable"
    if fmt != STORE_FORMAT:
        raise StoreFormatError(
            f"{store}: store format {'from before format.json' if fmt is None else fmt}, "
            f"this tracetool reads format {STORE_FORMAT}: ingest the traces again into a new "
            "store")


def connect_store(store: Path | str, con: duckdb.DuckDBPyConnection | None = None
                  ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per store table (events, gpu_ops, ...)."""
    if not (Path(store) / "data").is_dir():
        raise FileNotFoundError(f"{store}: not a tracetool store (no data/ directory)")
    check_format(store)
    con = con or duckdb.connect()
    con.execute(setup_sql(store))
    return con
