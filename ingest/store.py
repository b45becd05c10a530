"""The trace store on disk: where each (job, rank) lives and how it is replaced atomically.

Layout: ``STORE/data/job=J/rank=R/<table>/part-N.parquet``. An ingest builds the whole ``rank=R``
directory under ``STORE/.tmp/`` (same file system) and moves it into place under the store's
lock (``lock.py``): a new rank by one rename, a replaced one by one atomic exchange of the two
directories (``renameat2(RENAME_EXCHANGE)``), so a reader sees the old partition or the new
one, never neither and never a mix, and a crash at any point leaves one of them in place.

A store on object storage (``s3://bucket/prefix``, ``ObjectStoreWriter``) has no rename: each
rank is built in a local work directory, uploaded under fresh object names, and published by
a new job manifest and a conditional swap of the store's pointer (``tracetool.objstore``).
``open_store`` gives the one or the other; the ingest pipeline uses both alike.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow.parquet as pq

from tracetool import objstore
from tracetool.errors import StoreError
from tracetool.signals import deferred
from tracetool.store_views import STORE_FORMAT, StoreFormatError, check_format

from .lock import StoreLock, owner_elsewhere, owner_gone, owner_tag
from .options import UsageProblem

RETIRE_GRACE_S = 2.0  # a replaced partition stays readable this long for queries under way
# an object store writer's record from another host this old is a dead writer's (on this
# host its process is looked up): no rank's upload and commit take that long
WRITER_STALE_S = 24 * 3600.0
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
MAX_JOB_NAME = 200  # the job=<name> directory must fit a file name (255 bytes)


@dataclass(frozen=True)
class StoredFile:
    job: str
    rank: int
    path: str
    file_name: str
    sha256: str
    bytes: int


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.tmp = self.root / ".tmp"
        # partition (path, inode, ctime) -> its trace_files rows: re-read only what changed
        self._stored: dict[tuple[str, int, int], list[StoredFile]] = {}
        self._retired: list[tuple[float, Path]] = []  # (when, replaced partition in .tmp)

    def create(self) -> None:
        """Make the store's directory (UsageProblem when the path cannot be one, StoreError
        when it cannot be written)."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageProblem(f"--store {self.root} is not a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.tmp.mkdir(exist_ok=True)
            if not os.access(self.tmp, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        except OSError as err:
            raise StoreError(f"{self.root}: cannot write to the store: "
                             f"{err.strerror or err}") from None

    def check_format(self) -> None:
        """A store with data must be of this tracetool's format (StoreFormatError)."""
        if self.data.is_dir():
            check_format(self.root)

    def lock(self) -> StoreLock:
        """The store's commit lock (``with store.lock(): ...``)."""
        return StoreLock(self.root)

    def _write_format(self) -> None:
        f = self.root / "format.json"
        if not f.exists():
            tmp = self.tmp / f"{owner_tag()}-format-{uuid.uuid4().hex}"
            tmp.write_text(json.dumps({"format": STORE_FORMAT}) + "\n")
            os.replace(tmp, f)

    def partition(self, job: str, rank: int) -> Path:
        return self.data / f"job={job}" / f"rank={rank}"

    def new_workdir(self) -> Path:
        """A work directory named after this process, so that a later ingest can tell when
        it is left over from a dead one (``reclaim``)."""
        d = self.tmp / f"{owner_tag()}-{uuid.uuid4().hex}"
        d.mkdir(parents=True)
        return d

    def reclaim(self) -> list[str]:
        """Under the lock: remove the .tmp entries of dead ingests on this host (work
        directories, old partitions not yet deleted), first putting back an old partition
        whose replacement never arrived. Returns the names removed."""
        removed = []
        for entry in sorted(self.tmp.iterdir()) if self.tmp.is_dir() else []:
            if not owner_gone(entry.name) or entry.name.endswith(".origin"):
                continue
            origin = entry.with_name(entry.name + ".origin")
            if origin.exists():
                target = Path(origin.read_text())
                if not target.exists():  # a crash between the two renames of _replace
                    entry.rename(target)
                origin.unlink()
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.exists():
                entry.unlink()
            removed.append(entry.name)
        for origin in self.tmp.glob("*.origin") if self.tmp.is_dir() else []:
            if owner_gone(origin.name) and not origin.with_suffix("").exists():
                origin.unlink()
        return removed

    def stored_files(self) -> list[StoredFile]:
        """What the store holds, one row per trace file. Cached per partition directory by
        its inode and ctime: a partition is only ever put in place by a rename (new) or an
        exchange (replaced), both of which give its name another directory, never changed
        in place; so a commit lists each job's directory (no glob, no per-file stat) and
        reads only the partitions new since the last call (a glob of every rank's files on
        every commit made an ingest of 1,024 files quadratic: half its main process)."""
        out: list[StoredFile] = []
        seen: dict[tuple[str, int, int], list[StoredFile]] = {}
        for job_dir in _subdirs(self.data, "job="):
            for part in _subdirs(job_dir, "rank="):
                try:
                    st = part.stat(follow_symlinks=False)
                except FileNotFoundError:  # replaced while we listed: its successor is listed
                    continue
                key = (part.path, st.st_ino, st.st_ctime_ns)
                rows = self._stored.get(key)
                if rows is None:
                    rows = [row for f in sorted((Path(part.path) / "trace_files").glob(
                        "*.parquet")) for row in self._read_stored(f)]
                seen[key] = rows
                out += rows
        self._stored = seen
        return out

    @staticmethod
    def _read_stored(f: Path) -> list[StoredFile]:
        part = f.parent.parent
        job = part.parent.name.split("=", 1)[1]
        rank = int(part.name.split("=", 1)[1])
        # (ParquetFile: pq.read_table's dataset layer costs ~8 ms a file, read per commit)
        t = pq.ParquetFile(f).read(columns=["path", "file_name", "sha256", "bytes"]).to_pylist()
        return [StoredFile(job, rank, r["path"], r["file_name"], r["sha256"], r["bytes"])
                for r in t]

    def commit(self, job: str, rank: int, built: Path,
               recheck: Callable[[list[StoredFile]], bool] | None = None,
               published: Callable[[], None] | None = None) -> bool:
        """Move a fully written partition into place, replacing any old one atomically.
        The caller holds the lock (so what it checked is what the store holds: ``recheck``
        is for stores without one). ``published`` is called once the partition is visible,
        with SIGINT and SIGTERM held from before the rename until it returns: the commit's
        report is never lost to an interrupt, nor its replaced partition left behind.
        Returns True: committed."""
        with deferred():
            self._write_format()
            target = self.partition(job, rank)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                built.rename(target)
            else:
                try:
                    exchange(built, target)  # built now holds the old partition
                    old = built.rename(self.tmp / f"{owner_tag()}-old-{uuid.uuid4().hex}")
                except OSError as err:
                    if err.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
                        raise
                    old = self._replace(built, target)
                self.retire(old)
            if published is not None:
                published()
        self.remove_retired(wait=False)
        return True

    def retire(self, old: Path, grace: bool = True) -> None:
        """Have a replaced directory (moved into .tmp) deleted by ``remove_retired``, after
        the grace unless ``grace`` is False (nothing reads it: a staged shard's)."""
        self._retired.append((time.monotonic() if grace else float("-inf"), old))

    def remove_retired(self, wait: bool = True) -> None:
        """Delete replaced partitions once RETIRE_GRACE_S old (a query that listed their
        files just before the replace can still read them); ``wait``: all of them, sleeping
        out the grace (the end of an ingest). An interrupt waits for the deletions (a
        partition half deleted, or one forgotten, would be left in .tmp)."""
        due, keep = past_grace(self._retired, wait)
        with deferred():
            for old in due:
                shutil.rmtree(old, ignore_errors=True)
            self._retired = keep

    def _replace(self, built: Path, target: Path) -> Path:
        """Replace without an exchange (a file system or OS without RENAME_EXCHANGE): two
        renames, with the old partition's place recorded first, so that a crash between them
        is repaired by the next ingest's ``reclaim`` (readers may see the rank missing for
        that instant)."""
        old = self.tmp / f"{owner_tag()}-old-{uuid.uuid4().hex}"
        origin = old.with_name(old.name + ".origin")
        origin.write_text(str(target))
        target.rename(old)
        built.rename(target)
        origin.unlink()
        return old

    def cleanup(self, workdir: Path) -> None:
        shutil.rmtree(workdir, ignore_errors=True)


def open_store(location: Path | str) -> Store | ObjectStoreWriter:
    """The store a ``--store`` names: a directory, or ``s3://bucket/prefix``."""
    loc = objstore.parse_location(location)
    return Store(loc) if isinstance(loc, Path) else ObjectStoreWriter(loc)


class ObjectStoreWriter:
    """A store on object storage, as the ingest pipeline uses a ``Store``: ranks are built in
    a local temporary directory, uploaded under fresh names (``If-None-Match: *``: a
    published object is never overwritten) and published by a new job manifest and a
    conditional pointer swap (``ObjectStore.commit_job``). No lock: two writers are
    serialised by the swap, and a loser retries when the winner changed other ranks or
    other jobs, and fails (``CommitConflict``) when it committed the same rank."""

    def __init__(self, location: objstore.ObjectLocation) -> None:
        self.location = location
        self.root = location.url  # what messages name
        self.remote = objstore.ObjectStore(location)
        # this host's work directories, one folder per user
        self.tmp = Path(tempfile.gettempdir()) / f"tracetool-work-{os.getuid()}"
        self._seen: objstore.Snapshot | None = None  # what the last stored_files() read
        self._read = False  # whether _seen was read
        self._retired: list[tuple[float, list[str]]] = []  # (when, superseded keys)

    def create(self) -> None:
        """Check the bucket can be reached and read (a one-line StoreError otherwise)."""
        self._seen, self._read = self.remote.snapshot(), True
        try:
            self.tmp.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(f"{self.tmp}: cannot write the work directory of an ingest: "
                             f"{err.strerror or err}") from None

    def check_format(self) -> None:
        snap = self._seen if self._read else self.remote.snapshot()
        if snap is not None and snap.format != STORE_FORMAT:
            raise StoreFormatError(f"{self.root}: store format {snap.format}, this tracetool "
                                   f"writes format {STORE_FORMAT}: ingest into a new store")

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """No lock: the pointer's conditional swap serialises commits."""
        return contextlib.nullcontext()

    def new_workdir(self) -> Path:
        d = self.tmp / f"{owner_tag()}-{uuid.uuid4().hex}"
        d.mkdir(parents=True)
        return d

    def reclaim(self) -> list[str]:
        """Remove the work directories of dead ingests on this host, and what dead writers
        left in the store (``ObjectStore.collect``): the objects named by a writer's record
        (``commit``) whose process on this host is gone, or, from another host, that is
        over WRITER_STALE_S old, and that the pointer does not reference. One LIST of the
        records per ingest. Returns the names removed (directories, then keys)."""
        removed = []
        for entry in sorted(self.tmp.iterdir()) if self.tmp.is_dir() else []:
            if owner_gone(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        now = time.time()
        dead = [k for k, modified in self.remote.records()
                if writer_dead(k.rsplit("/", 1)[-1], now - modified)]
        return removed + self.remote.collect(dead)

    def stored_files(self) -> list[StoredFile]:
        """What the store holds, from its manifests (one GET of the pointer, and one per job
        manifest not read before); remembered as the state a commit is checked against."""
        self._seen, self._read = self.remote.snapshot(), True
        return _stored_of(self._seen)

    def commit(self, job: str, rank: int, built: Path,
               recheck: Callable[[list[StoredFile]], bool] | None = None,
               published: Callable[[], None] | None = None) -> bool:
        """Upload a built partition and publish it in a new manifest of ``job``.
        ``recheck`` (the caller's rules, on the store as it is at each attempt) decides
        first: False abandons the commit (returned; an identical ingest that committed
        meanwhile makes this one a skip, as in a local store). Then the rank must still be
        as the last ``stored_files()`` saw it (else CommitConflict: another writer committed
        it meanwhile and ``recheck`` let this one replace it: --force). The uploaded files
        are deleted when nothing is published. ``published``: as ``Store.commit``'s, signals
        held from the pointer swap on."""
        base = self._seen.rank(job, rank) if self._seen else None
        one_part_per_table(built)
        commit = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:16]}"
        entry, paths = objstore.rank_entry(job, rank, built, commit, _trace_files(built))
        uploaded: list[str] = []
        abandoned = False
        # what a kill from now on may leave, for the next writer to collect (``reclaim``):
        # the uploads and manifests of this commit, and what it supersedes if it lands
        seen_manifest = (self._seen.pointer.get("jobs", {}).get(job) if self._seen else None)
        record = f"{objstore.WRITERS}/{owner_tag()}-{uuid.uuid4().hex}.json"
        self.remote.put(record, json.dumps({
            "started": time.time(), "job": job, "rank": rank,
            "keys": [f["key"] for f in entry["files"]]
                    + [f["key"] for f in (base or {}).get("files", [])]
                    + ([seen_manifest] if seen_manifest else []),
            "manifests": objstore.manifest_prefix(job, commit)}).encode())

        def change(now: objstore.Snapshot) -> dict[str, Any]:
            nonlocal abandoned
            # the caller's rules first, as a local store applies them under its lock: the
            # same bytes committed meanwhile by another writer (in this rank or another)
            # make this one a skip, another file in this rank an error without --force
            if recheck is not None and not recheck(_stored_of(now)):
                abandoned = True
                raise objstore.CommitConflict("abandoned")
            current = now.rank(job, rank)
            if (current or {}).get("commit") != (base or {}).get("commit"):
                raise objstore.CommitConflict(
                    f"job {job} rank {rank} was committed by another writer while this one "
                    "uploaded it (nothing of this file was published): ingest it again, "
                    "with --force to replace that rank")
            ranks = dict(now.manifests.get(job, {}).get("ranks", {}))
            ranks[str(rank)] = entry
            return ranks

        hold = contextlib.ExitStack()  # signals held from the pointer swap to ``published``
        with hold:
            try:
                for p, f in zip(paths, entry["files"], strict=True):
                    self.remote.upload(p, f["key"])
                    uploaded.append(f["key"])
                empty = objstore.Snapshot(None, {"format": STORE_FORMAT, "jobs": {}})
                hold.enter_context(deferred())
                before, _ = self.remote.commit_job(  # first against what stored_files() read
                    job, STORE_FORMAT, change,
                    start=(self._seen or empty) if self._read else None, name=commit)
            except BaseException as err:
                if isinstance(err, Exception):  # (an interrupt leaves them to the next writer)
                    self.remote.delete(uploaded + [record])
                if abandoned:
                    return False
                raise
            superseded = [before.pointer["jobs"][job]] if job in before.pointer.get(
                "jobs", {}) else []  # deleted now: a reader that misses it reads again
            old = before.rank(job, rank)
            if old:  # replaced (--force): readers fetching it get a grace; the record last
                self.remote.delete(superseded)
                self._retired.append((time.monotonic(), [f["key"] for f in old["files"]]
                                      + [record]))
            else:
                self.remote.delete(superseded + [record])
            if published is not None:
                published()
        self.remove_retired(wait=False)
        return True

    def remove_retired(self, wait: bool = True) -> None:
        """Delete replaced ranks' files once RETIRE_GRACE_S old (a reader that read the old
        manifest can still fetch them)."""
        due, self._retired = past_grace(self._retired, wait)
        for keys in due:
            self.remote.delete(keys)

    def cleanup(self, workdir: Path) -> None:
        shutil.rmtree(workdir, ignore_errors=True)


def writer_dead(name: str, age_s: float) -> bool:
    """Whether the object store writer whose record is ``name`` (``<owner tag>-<uuid>.json``),
    last written ``age_s`` ago, is dead: on this host, its process is gone; on another,
    the record is over WRITER_STALE_S old. Not an owner tag: never (left alone)."""
    return owner_gone(name) or (owner_elsewhere(name) and age_s > WRITER_STALE_S)


def one_part_per_table(built: Path) -> None:
    """Merge each table's parts (events and flows have one per decoded piece: ~130 for a
    1 GB trace) into one file, row group by row group in order (bounded memory, the rows'
    order kept), written as ingest writes them: a rank is then one object per table."""
    from .finish import DICTIONARY_COLUMNS

    for table in sorted(d for d in built.iterdir() if d.is_dir()):
        parts = sorted(table.glob("*.parquet"))
        if len(parts) < 2:
            continue
        merged = table / ".merged.parquet"
        schema = pq.read_schema(parts[0])
        dictionary = [c for c in DICTIONARY_COLUMNS if c in schema.names]
        with pq.ParquetWriter(merged, schema, compression="zstd",
                              use_dictionary=dictionary) as w:
            for p in parts:
                f = pq.ParquetFile(p)
                for i in range(f.num_row_groups):
                    w.write_table(f.read_row_group(i))
        for p in parts:
            p.unlink()
        merged.rename(table / "part-0.parquet")


def _trace_files(built: Path) -> list[dict[str, Any]]:
    """The trace_files rows of a built partition, as a manifest keeps them."""
    rows = []
    for f in sorted(built.glob("trace_files/*.parquet")):
        rows += pq.read_table(f, columns=["path", "file_name", "sha256", "bytes"]).to_pylist()
    return rows


def _stored_of(snap: objstore.Snapshot | None) -> list[StoredFile]:
    if snap is None:
        return []
    return [StoredFile(job, int(rank), t["path"], t["file_name"], t["sha256"], t["bytes"])
            for job, man in sorted(snap.manifests.items())
            for rank, entry in sorted(man.get("ranks", {}).items(), key=lambda kv: int(kv[0]))
            for t in entry.get("trace_files", [])]


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


T = TypeVar("T")


def past_grace(retired: list[tuple[float, T]], wait: bool
               ) -> tuple[list[T], list[tuple[float, T]]]:
    """(what is RETIRE_GRACE_S old, what is not yet) of ``retired`` (when, what) pairs;
    ``wait``: sleep out the grace, so that everything is due."""
    due, keep = [], []
    for when, what in retired:
        left = when + RETIRE_GRACE_S - time.monotonic()
        if left > 0 and wait:
            time.sleep(left)
        elif left > 0:
            keep.append((when, what))
            continue
        due.append(what)
    return due, keep


def _subdirs(d: Path, prefix: str) -> list[os.DirEntry[str]]:
    """The directories in ``d`` whose names start with ``prefix``, by name (none when ``d``
    does not exist)."""
    try:
        with os.scandir(d) as it:
            found = [e for e in it if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda e: e.name)


def exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); OSError(ENOSYS)
    where the C library has no renameat2."""
    fn = getattr(_libc(), "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(a))


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC
