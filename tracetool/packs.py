"""Packs: a job's tables compacted into one Parquet file each, so a query over a job of many
ranks opens a dozen files instead of a dozen per rank.

A local store keeps each rank in its own partition (``data/job=J/rank=R/<table>/*.parquet``:
the unit an ingest replaces atomically). Opening a file costs DuckDB about as much as reading
a small one, so at 1,024 ranks every scan of a table paid for 1,024 opens and every command
for binding 12,288 files. A pack (``packs/job=J/<generation>/<table>.parquet``, rows in rank
order, with ``job`` and ``rank`` as columns) is a copy of the job's partitions built after an
ingest (``tracetool.ingest.packs``); the partitions stay the truth. ``sources.json`` records
the identity of every partition it was built from (its directory's inode and ctime: a
partition is only ever put in place by a rename or replaced by an exchange, which give the
name a new directory), and ``packs/job=J/current`` names the generation in use. A reader
uses a job's pack only while the job's partitions are exactly those (``current_pack``);
otherwise it reads the partitions, so a stale or half-built pack is never read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PACKS = "packs"
CURRENT = "current"  # file naming the generation directory in use
SOURCES = "sources.json"
PACK_MIN_RANKS = 32  # jobs with fewer ranks are read from their partitions


def partition_ids(job_dir: Path) -> dict[int, list[int]]:
    """Rank -> [inode, ctime ns] of each partition directory of a job (``data/job=J``)."""
    out: dict[int, list[int]] = {}
    try:
        entries = list(os.scandir(job_dir))
    except FileNotFoundError:
        return out
    for e in entries:
        if not e.name.startswith("rank=") or not e.is_dir(follow_symlinks=False):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            out[int(e.name[5:])] = [st.st_ino, st.st_ctime_ns]
        except (FileNotFoundError, ValueError):
            continue
    return out


def pack_dir(root: Path, job: str) -> Path:
    return root / PACKS / f"job={job}"


def published(root: Path, job: str) -> tuple[Path, dict[int, list[int]]] | None:
    """The job's published pack generation and the partitions (rank -> identity) it was
    built from; None when it has none."""
    d = pack_dir(root, job)
    try:
        gen = d / (d / CURRENT).read_text().strip()
        sources = json.loads((gen / SOURCES).read_text())
        return gen, {int(r): v for r, v in sources.get("partitions", {}).items()}
    except (OSError, ValueError, AttributeError):
        return None


def current_pack(root: Path, job: str, ids: dict[int, list[int]] | None = None
                 ) -> Path | None:
    """The generation directory of the job's pack when it was built from exactly the job's
    partitions as they are now (``ids``: ``partition_ids``, if already taken), else None."""
    cur = published(root, job)
    if cur is None:
        return None
    ids = partition_ids(root / "data" / f"job={job}") if ids is None else ids
    return cur[0] if cur[1] and cur[1] == ids else None


def is_pack_file(root: Path, f: Path) -> bool:
    """True for a file of a pack (read without hive partitioning: job and rank are columns)."""
    return (root / PACKS) in f.parents
