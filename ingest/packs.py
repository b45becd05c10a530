"""Build a job's pack (``tracetool.packs``): its tables compacted into one file each.

Built after an ingest of a job of PACK_MIN_RANKS ranks or more (and by ``tracetool commit``
and ``tracetool pack``), from the partitions as they are at the start. After an ingest only
when the job has no pack yet or at least REBUILD_SHARE of its ranks changed since its pack
was built, so a job ingested a rank at a time is copied O(log n) times, not n times (between
rebuilds its reads use the partitions, and the ingest says so). Published by replacing
``current`` only if the partitions are still exactly those, under the store's lock. A pack
that lost a race, or an ingest killed while building one, leaves a generation directory
nobody names, removed by the next build. Readers check a pack against the partitions anyway,
so nothing here can make a query read a stale copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tracetool.packs import (
    CURRENT,
    PACK_MIN_RANKS,
    SOURCES,
    pack_dir,
    partition_ids,
    published,
)
from tracetool.schema import TABLES
from tracetool.sqltext import literal, path_list
from tracetool.store_views import HIVE

from .derive import connect
from .lock import owner_gone, owner_tag
from .store import Store

REBUILD_SHARE = 0.25  # of a job's ranks changed since its pack, for an ingest to rebuild it


def pack_status(store: Store, job: str, ids: dict[int, list[int]] | None = None
                ) -> tuple[str, int, int]:
    """(status, ranks changed since the pack was built, ranks): status 'small' (fewer than
    PACK_MIN_RANKS ranks), 'current', 'none' (never packed) or 'stale'. ``ids``: the job's
    ``partition_ids``, if already taken."""
    root = store.root.resolve()
    ids = partition_ids(root / "data" / f"job={job}") if ids is None else ids
    if len(ids) < PACK_MIN_RANKS:
        return "small", 0, len(ids)
    cur = published(root, job)
    if cur is None or not cur[1]:
        return "none", len(ids), len(ids)
    built = cur[1]
    changed = sum(1 for r, v in ids.items() if built.get(r) != v) + len(built.keys() - ids)
    return ("current" if changed == 0 else "stale"), changed, len(ids)


def refresh_pack(store: Store, job: str, memory_limit: str = "256MB",
                 threads: int | None = None, force: bool = False) -> tuple[str, int, int]:
    """Build the job's pack when it has none, or when at least REBUILD_SHARE of its ranks
    changed since it was built (any change with ``force``), copying ``threads`` tables at
    once (default: one per core, as the ingest's workers). Returns ``pack_status``'s
    triple, with status 'built' when a new pack was published and 'deferred' when a stale
    one was left (too few ranks changed)."""
    job_dir = store.root.resolve() / "data" / f"job={job}"
    ids = partition_ids(job_dir)
    status, changed, n = pack_status(store, job, ids)
    if status in ("small", "current"):
        return status, changed, n
    if status == "stale" and not force and changed < REBUILD_SHARE * n:
        return "deferred", changed, n
    built = _build(store, job, ids, memory_limit, threads or os.cpu_count() or 1)
    return ("built" if built else "stale"), changed, n


def _build(store: Store, job: str, ids: dict[int, list[int]], memory_limit: str,
           threads: int) -> bool:
    """Copy the job's partitions ``ids`` into a new generation and publish it if they are
    still the same then; True when published."""
    root = store.root.resolve()
    job_dir = root / "data" / f"job={job}"
    d = pack_dir(root, job)
    gen = d / f"{owner_tag()}-{uuid.uuid4().hex}"  # another build can tell it from a dead one's
    gen.mkdir(parents=True)
    try:
        _write(gen, job_dir, sorted(ids), memory_limit, threads)
        with store.lock():
            if partition_ids(job_dir) != ids:  # an ingest replaced a rank meanwhile
                shutil.rmtree(gen, ignore_errors=True)
                return False
            (gen / SOURCES).write_text(json.dumps({"partitions": {str(r): ids[r]
                                                                  for r in ids}}))
            try:
                previous = (d / CURRENT).read_text().strip()
            except FileNotFoundError:
                previous = ""
            tmp = d / f".{CURRENT}-{uuid.uuid4().hex}"
            tmp.write_text(gen.name + "\n")
            os.replace(tmp, d / CURRENT)
            _remove_old(d, keep={gen.name, previous})
    except BaseException:
        shutil.rmtree(gen, ignore_errors=True)
        raise
    return True


def _write(gen: Path, job_dir: Path, ranks: list[int], memory_limit: str, threads: int
           ) -> None:
    """One Parquet file per table: the partitions' rows in rank order (row groups then hold
    few ranks each, so a filter on rank skips the rest), job and rank as columns. DuckDB
    writes an ordered COPY on about one core, so ``threads`` tables are copied at once, the
    largest first (events alone is about half the bytes), each by a connection of one thread
    under ``memory_limit`` (as each ingest worker's is: the workers are done by then)."""
    copies = []
    for t in TABLES:
        files = [f for r in ranks
                 for f in sorted((job_dir / f"rank={r}" / t.name).glob("*.parquet"))]
        if files:
            copies.append((sum(f.stat().st_size for f in files), t.name, files))
    copies.sort(key=lambda c: -c[0])

    def copy(name: str, files: list[Path]) -> None:
        spill = gen / f".work-{name}"  # the connection's spill directory
        spill.mkdir()
        con = connect(spill, 1, memory_limit)
        try:
            con.execute("SET preserve_insertion_order = true")
            con.execute("SET enable_progress_bar = false")
            con.execute(f"COPY (SELECT * FROM read_parquet({path_list(files)}, {HIVE})) "
                        f"TO {literal(gen / f'{name}.parquet')} "
                        "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)")
        finally:
            con.close()
            shutil.rmtree(spill, ignore_errors=True)

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="tracetool-pack") as pool:
        for done in [pool.submit(copy, name, files) for _, name, files in copies]:
            done.result()  # the first failure, once every copy has stopped


def _remove_old(d: Path, keep: set[str]) -> None:
    """Under the lock: the generations published before the one ``keep`` names last (a query
    that listed that one's files just before the swap may still be reading them; it goes at
    the next build), those of builds that died, and temporary pointers (only ever present
    under the lock when their writer died). A live build's generation has no SOURCES yet."""
    for e in os.scandir(d):
        if e.name in keep or e.name == CURRENT:
            continue
        if e.is_dir(follow_symlinks=False):
            if (Path(e.path) / SOURCES).exists() or owner_gone(e.name):
                shutil.rmtree(e.path, ignore_errors=True)
        elif e.name.startswith(f".{CURRENT}-"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
