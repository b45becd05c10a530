"""Open a trace store in DuckDB: one view per table over its Parquet partitions, on a
connection whose queries can read the store's files and nothing else, and write no file.

DuckDB cannot tell a read from a write in its allow-lists (a directory allowed for reading
is writable too, ``COPY ... TO`` included), so the store is opened file by file: the views
read an explicit list of the store's Parquet files (listed here, in Python), exactly those
files are allowed (``allowed_paths``), external access is then switched off and the
configuration locked, so no later ``SET``/``RESET`` can undo it. What that leaves a query:
in-memory and temporary tables, and writes under the directories the caller allows; and,
since the store's files are on the allow-list, a COPY aimed at one of them that skips
DuckDB's temporary file (USE_TMP_FILE false) or deletes its target first (OVERWRITE), which
``tracetool sql`` refuses before running the query.

A store on object storage (``s3://bucket/prefix``) is opened the same way: ``store_files`` is
the one place that knows where a store's files are (a local directory listed, or an object
store's manifests read and their files fetched into the local cache, ``tracetool.objstore``),
and the views are the same ``read_parquet`` over the same kind of explicit local list.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import duckdb

from tracetool import objstore, packs
from tracetool.errors import StoreError
from tracetool.schema import TABLES, TABLES_BY_NAME
from tracetool.sqltext import exact_path, list_literal, literal, path_list

# No union_by_name: every part of a table has the schema's exact columns and types (ingest
# casts to them; a test checks it on every real trace), and union_by_name reads every file's
# footer whenever a view is bound, which dominated connect() on stores of many ranks.
HIVE = ("hive_partitioning = true, "
        "hive_types = {'job': VARCHAR, 'rank': INTEGER}")


def store_files(store: Path | str) -> dict[str, list[Path]]:
    """Every table's Parquet files over all jobs and ranks, as local files in ``job=J/rank=R``
    directories (hive partitions), sorted: the one place that knows where a store keeps them.

    A local store's ``data/job=*/rank=*/TABLE/*.parquet`` is listed (in Python, so a store
    path is never a DuckDB glob). An object store is never listed: its pointer and job
    manifests are read (one GET each) and the files they name are fetched into the local
    cache once (``objstore.local_copies``); FileNotFoundError when it holds no pointer,
    StoreFormatError for another format."""
    if not objstore.is_object_store(store):
        return _local_files(Path(store).resolve(), [t.name for t in TABLES])
    loc = objstore.parse_location(store)
    files = objstore.current_files(objstore.ObjectStore(loc),
                                   lambda snap: _check_format_value(snap.format, loc))
    if files is None:
        raise FileNotFoundError(f"{loc}: not a tracetool store (no {objstore.POINTER})")
    return {t.name: files.get(t.name, []) for t in TABLES}


def table_files(store: Path | str, table: str) -> list[Path]:
    """Every Parquet part of one table over all jobs and ranks, sorted: where a local store's
    layout is known (an object store's files are ``store_files``')."""
    loc = objstore.parse_location(store)
    if isinstance(loc, Path):
        return _local_files(loc.resolve(), [table])[table]
    return store_files(store)[table]


def _local_files(root: Path, tables: list[str]) -> dict[str, list[Path]]:
    """A local store's files of ``tables``: per job, its pack's when the pack is current
    (``tracetool.packs``), else every rank partition's."""
    out: dict[str, list[Path]] = {t: [] for t in tables}
    for job_dir in sorted((root / "data").glob("job=*")):
        gen = packs.current_pack(root, job_dir.name[4:])
        for t in tables:
            if gen is not None:
                out[t] += [f for f in [gen / f"{t}.parquet"] if f.exists()]
            else:
                out[t] += sorted(job_dir.glob(f"rank=*/{t}/*.parquet"))
    return out


def local_root(store: Path | str) -> Path:
    """The local directory that holds the store's files DuckDB reads: a local store's own,
    or the cache an object store's files are fetched into."""
    loc = objstore.parse_location(store)
    return loc.resolve() if isinstance(loc, Path) else objstore.cache_root().resolve()


def table_sql(store: Path | str, table: str, files: Sequence[Path] | None = None) -> str:
    """The relation of one table of a store (job and rank from the path): read_parquet over
    its files, or an empty relation of the table's columns when the store has none."""
    files = table_files(store, table) if files is None else files
    root = local_root(store)
    packed = [f for f in files if packs.is_pack_file(root, f)]
    parts = [f for f in files if not packs.is_pack_file(root, f)]
    if parts and not packed:
        return f"read_parquet({path_list(parts)}, {HIVE})"
    reads = ([f"SELECT * FROM read_parquet({path_list(parts)}, {HIVE})"] if parts else []) + (
        [f"SELECT * FROM read_parquet({path_list(packed)})"] if packed else [])
    if reads:  # packs hold job and rank as columns, in the partitions' order of columns
        return "(" + " UNION ALL ".join(reads) + ")"
    cols = ", ".join(f"CAST(NULL AS {c.sql_type}) AS {c.name}"
                     for c in TABLES_BY_NAME[table].columns)
    return f"(SELECT {cols}, NULL::VARCHAR AS job, NULL::INTEGER AS rank WHERE false)"


def writable_dirs(store: Path | str, allow_writes: Iterable[Path | str]) -> list[str]:
    """The spellings DuckDB must allow for writes under ``allow_writes`` (each as written,
    absolute, and with symlinks resolved); ValueError for a directory that holds the store
    or lies inside it, since writes there could change the store (for an object store: the
    cache of its local copies)."""
    root = local_root(store)
    out: list[str] = []
    for d in allow_writes:
        real = Path(d).resolve()
        if real == root or root in real.parents or real in root.parents:
            raise ValueError(f"{d}: writes are not allowed in a directory that holds the store "
                             f"or is inside it ({store})")
        for spelling in (os.path.abspath(d), str(real)):
            if spelling not in out:
                out.append(spelling)
    return out


def lockdown_sql(files: Iterable[Path], write_dirs: Sequence[str] = ()) -> str:
    """The settings that make a connection read only ``files`` and write only under
    ``write_dirs``: no extension installed or loaded, no persistent secret, spills in a
    private temporary directory (DuckDB allows writes in its temp directory, and its default
    is ``.tmp`` in the working directory, which could be the store's), then external access
    off and the configuration locked (``SET enable_external_access = true`` or ``RESET``
    afterwards is an error)."""
    allowed: list[str] = []
    for f in files:
        allowed += dict.fromkeys([str(f), exact_path(f)])  # as listed, and as read_parquet opens it
    spill = Path(tempfile.gettempdir()) / f"tracetool-duckdb-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    lines = ["SET autoinstall_known_extensions = false;",
             "SET autoload_known_extensions = false;",
             "SET allow_community_extensions = false;",
             "SET allow_persistent_secrets = false;",
             # created by DuckDB only if a query spills, and removed when the connection closes
             f"SET temp_directory = {literal(spill)};"]
    if write_dirs:
        lines.append(f"SET allowed_directories = {list_literal(write_dirs)};")
    if allowed:
        lines.append(f"SET allowed_paths = {list_literal(allowed)};")
    lines += ["SET enable_external_access = false;", "SET lock_configuration = true;"]
    return "\n".join(lines)


def setup_sql(store: Path | str, allow_writes: Iterable[Path | str] = (),
              dependent_views: str = "") -> str:
    """SQL that opens the store read-only and defines a view per table (what
    ``connect_store`` runs; for the DuckDB CLI too), then ``dependent_views`` (SQL creating
    views over the tables: the analysis views).

    Every view is created ``WITH (DEFER_BINDING)`` (the analysis views' SQL says so too):
    DuckDB binds a view again in every query that uses it, so binding it at creation as well
    only cost time: binding ``read_parquet`` over a list of files stats every file, twice
    (~24 ms per reference to a table of 1,024 ranks), and binding the analysis views at
    creation cost every command ~0.45 s (3.6-4.4 s at 1,024 ranks when they were bound
    against the real tables). A query binds only what it uses."""
    files = store_files(store)
    guard = lockdown_sql((f for fs in files.values() for f in fs),
                         writable_dirs(store, allow_writes))
    views = "\n".join(f"CREATE OR REPLACE VIEW {t.name} WITH (DEFER_BINDING) AS SELECT * FROM "
                      f"{table_sql(store, t.name, files[t.name])};" for t in TABLES)
    return "\n".join(p for p in (guard, views, dependent_views) if p)


# Version of the store's layout and tables; a store of another format is refused (re-ingest)
# rather than read wrongly. Written to STORE/format.json by the first ingest.
# 2: the steps table became profiler_steps (raw annotation facts; steps is an analysis view).
# 3: each rank's dependency graph is stored (cp_nodes, rank_edges), built at ingest.
# 4: rank_edges also binds an op that waited inside itself for its own gloo collective
#    (transfer_wake into the op's end), so replays of such jobs change.
STORE_FORMAT = 4


class StoreFormatError(StoreError):
    """The store was written by a tracetool with another store format."""


def check_format(store: Path | str) -> None:
    """Raise StoreFormatError unless ``store`` (which has data) is of STORE_FORMAT."""
    loc = objstore.parse_location(store)
    if not isinstance(loc, Path):  # an object store's format is its pointer's
        snap = objstore.ObjectStore(loc).snapshot()
        _check_format_value(snap.format if snap else STORE_FORMAT, loc)
        return
    f = loc / "format.json"
    try:
        fmt = json.loads(f.read_text()).get("format")
    except FileNotFoundError:
        fmt = None
    except (OSError, ValueError, AttributeError):
        fmt = "unreadable"
    _check_format_value(fmt, store)


def _check_format_value(fmt: object, store: object) -> None:
    if fmt != STORE_FORMAT:
        raise StoreFormatError(
            f"{store}: store format {'from before format.json' if fmt is None else fmt}, "
            f"this tracetool reads format {STORE_FORMAT}: ingest the traces again into a new "
            "store")


def connect_store(store: Path | str, con: duckdb.DuckDBPyConnection | None = None, *,
                  allow_writes: Iterable[Path | str] = (), dependent_views: str = ""
                  ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per store table (events, gpu_ops, ...) whose
    queries read only the store's files (as they were when it was opened: connect again to
    see a later ingest) and write files only under ``allow_writes`` (none by default), and
    the ``dependent_views`` (``setup_sql``).

    The settings are the database's: a ``con`` passed in is locked down too, so open one
    store per connection."""
    if not objstore.is_object_store(store):  # an object store's checks are store_files'
        if not (Path(store) / "data").is_dir():
            raise FileNotFoundError(f"{store}: not a tracetool store (no data/ directory)")
        check_format(store)
    setup = setup_sql(store, allow_writes, dependent_views)
    con = con or duckdb.connect()
    if con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]:
        raise ValueError(f"{store}: this DuckDB connection is already locked down (a store is "
                         "open on it): open each store on its own connection")
    con.execute(setup)
    return con
