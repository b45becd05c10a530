"""tracetool: ingest, analyse and replay PyTorch profiler (Kineto) traces."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

__version__ = "0.1.0"


def connect(store: Path | str, con: duckdb.DuckDBPyConnection | None = None, *,
            allow_writes: Iterable[Path | str] = ()) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection over a trace store with every table and analysis view, whose
    queries cannot change the store: they read only its files and write files only under
    ``allow_writes`` (imported lazily so that ``import tracetool`` stays light)."""
    from tracetool.analysis.connect import connect as _connect

    return _connect(store, con, allow_writes=allow_writes)
