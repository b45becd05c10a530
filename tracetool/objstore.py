"""The store on object storage (``s3://bucket/prefix``): its layout, its manifests, and the
conditional writes that publish them. Both the writer (``tracetool.ingest.store``) and the
reader (``tracetool.store_views``) go through this module.

Object storage has no rename and no directory, so a local store's ``rename`` into place
becomes a manifest. Under the prefix (keys relative to it):

- ``_tracetool/current.json``: the pointer, ``{"format", "jobs": {job: manifest key}}``;
- ``_tracetool/manifests/job=J/<id>.json``: one job's manifest, per rank its trace files and
  its Parquet files (key, table, rows, bytes, sha256), never changed once written;
- ``data/job=J/rank=R/<table>/<id>-part-N.parquet``: the ranks' files, never overwritten;
- ``_tracetool/writers/<owner>-<uuid>.json``: one per commit under way, naming what a kill
  would leave (``collect``).

A commit uploads the rank's files under fresh names, writes a new manifest of the job
(create-if-absent, ``If-None-Match: *``), then swaps the pointer to it with ``If-Match`` on
the ETag it read (``If-None-Match: *`` for the first commit of a store). A writer killed
before the swap leaves only unreferenced objects and its record, which the next writer
collects once the record's owner is dead; one that loses the swap to another reads
the pointer again and retries when the change was another rank's (``commit_job``). Readers
never list: one GET of the pointer, one per job manifest, then the files the manifests name.

How DuckDB reads them (``local_copies``): the files are fetched once into a local cache,
content-addressed by sha256 (verified), and the views read the local copies. DuckDB's
httpfs cannot be installed offline (and extensions are off in a locked-down connection);
``register_filesystem`` with s3fs does work under the lockdown, but every query then goes
back to the server through Python (on moto, 4 ranks of an 80 MB trace: 7 s to open instead
of 0.3-0.8 s, ``step_breakdown`` 5.6 s instead of 0.2 s), and a ``COPY ... TO`` one of the
store's allowed ``s3://`` paths overwrote the published object in place, which a local
store's files are safe from. The local copies keep the local store's guarantees exactly (a
query reads only those files, writes none) and query at local speed; the cost is the first
open's download of the store (docs/object_store.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracetool.errors import StoreError
from tracetool.text import path_text

SCHEMES = ("s3",)
URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
POINTER = "_tracetool/current.json"
MANIFESTS = "_tracetool/manifests"
WRITERS = "_tracetool/writers"  # one record per commit under way: what it may leave behind
COMMIT_ATTEMPTS = 30  # pointer swaps lost in a row before a commit gives up
RETRY_SLEEP_S = 0.05  # times the attempt number, jittered
FETCH_THREADS = 8
SAFE_JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # ingest's job names
CACHE_BYTES = 20 << 30  # default bound of the local cache (TRACETOOL_CACHE_BYTES)
CACHE_KEEP_S = 600.0  # a cached file used this recently is never evicted (readers may hold it)


@dataclass(frozen=True)
class ObjectLocation:
    """Where an object store lives: a bucket and a key prefix (no slashes at either end)."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def key(self, rel: str) -> str:
        """The object key of ``rel`` (a key relative to the store's prefix)."""
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def __str__(self) -> str:
        return self.url


NOT_UTF8 = ("the store's path is not valid UTF-8 (DuckDB opens files by UTF-8 names): "
            "give a store path whose names are UTF-8")


def parse_location(store: Path | str | ObjectLocation) -> Path | ObjectLocation:
    """A local store's path, or the location of an ``s3://bucket/prefix`` store.

    A ``Path`` whose first part is ``s3:`` is read as the URL it was spelled as: pathlib
    (and so ``click.Path``) turns ``s3://b/p`` into ``s3:/b/p``. Another scheme is a
    StoreError naming what works."""
    if isinstance(store, ObjectLocation):
        return store
    text = str(store)
    if isinstance(store, Path) and store.parts and store.parts[0] == "s3:":
        text = "s3://" + "/".join(store.parts[1:])
    m = URL.match(text)
    if not m:
        if path_text(text) != text:
            raise StoreError(f"{path_text(text)}: {NOT_UTF8}")
        return Path(store)
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme not in SCHEMES:
        raise StoreError(f"{text}: {scheme}:// stores are not supported: give a directory or "
                         "s3://bucket/prefix (any S3-compatible server, via AWS_ENDPOINT_URL)")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not bucket or any(p in ("", ".", "..") for p in prefix.split("/") if prefix):
        raise StoreError(f"{text}: not a store URL: give s3://bucket or s3://bucket/prefix")
    return ObjectLocation(scheme, bucket, prefix)


def is_object_store(store: Path | str | ObjectLocation) -> bool:
    """Whether ``store`` names an object store (else it is a local directory)."""
    return isinstance(parse_location(store), ObjectLocation)


class PreconditionFailed(Exception):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match)."""


class CommitConflict(StoreError):
    """The commit cannot be published as asked (another writer committed the same rank)."""


class Missing(Exception):
    """An object a manifest names is gone: superseded and deleted (read the pointer again),
    or, when the pointer has not changed since, deleted outside tracetool (``check_gone``).
    ``args[0]`` is its key relative to the prefix."""


_CLIENTS: dict[tuple[str | None, ...], Any] = {}
_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")


def s3_client() -> Any:
    """A boto3 S3 client configured from the standard AWS environment (AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, profiles...), one per
    process and settings (making one costs ~0.3 s; they are thread-safe). Path-style
    addressing when an endpoint is set: what MinIO, Ceph and moto serve."""
    env = tuple(os.environ.get(v) for v in _ENV)
    if env not in _CLIENTS:
        _CLIENTS[env] = _new_client()
    return _CLIENTS[env]


def _new_client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise StoreError("s3:// stores need boto3: pip install 'tracetool[s3]'") from None
    style = "path" if os.environ.get("AWS_ENDPOINT_URL") else "auto"
    cfg = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3,
                                                              "mode": "standard"},
                 s3={"addressing_style": style})
    return boto3.session.Session().client("s3", config=cfg)


@dataclass
class Snapshot:
    """What a store holds at one version of its pointer: the manifest of every job."""

    etag: str | None  # of the pointer; None when the store has no pointer yet
    pointer: dict[str, Any]
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def format(self) -> Any:
        return self.pointer.get("format")

    def rank(self, job: str, rank: int) -> dict[str, Any] | None:
        """The manifest entry of one rank, None when the store does not hold it."""
        return self.manifests.get(job, {}).get("ranks", {}).get(str(rank))


class ObjectStore:
    """One store on object storage: conditional reads and writes of its objects, with every
    client error turned into a one-line StoreError naming the store."""

    def __init__(self, location: ObjectLocation, client: Any = None) -> None:
        self.loc = location
        self.client = client if client is not None else s3_client()
        self._manifests: dict[str, dict[str, Any]] = {}  # immutable: cached by key

    # --- objects -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, what: str, key: str | None = None) -> Iterator[None]:
        """Client errors as one-line StoreErrors saying ``what`` failed; an object that is
        not there as ``Missing(key)``."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        url = self.loc.url
        try:
            yield
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412:
                raise PreconditionFailed(code) from None
            if code in ("NoSuchKey", "404"):
                raise Missing(key or what) from None
            if code == "NoSuchBucket":
                raise StoreError(f"{url}: bucket {self.loc.bucket!r} does not exist (create "
                                 "it first)") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
                raise StoreError(f"{url}: access denied ({code}) when {what}: check the "
                                 "credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)") from None
            msg = str(err.response.get("Error", {}).get("Message", "")).strip()
            raise StoreError(f"{url}: {what} failed: {code or status}"
                             + (f": {msg.splitlines()[0]}" if msg else "")) from None
        except (NoCredentialsError, PartialCredentialsError):
            raise StoreError(f"{url}: no AWS credentials: set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY (or another standard AWS credential "
                             "source)") from None
        except EndpointConnectionError as err:
            raise StoreError(f"{url}: cannot reach the object store "
                             f"({getattr(err, 'kwargs', {}).get('endpoint_url', err)}): is it "
                             "running, and AWS_ENDPOINT_URL right?") from None
        except BotoCoreError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise StoreError(f"{url}: {what} failed: {first}") from None

    def get(self, rel: str) -> tuple[bytes, str] | None:
        """(body, ETag) of an object, None when there is none."""
        try:
            with self._errors(f"reading {rel}", rel):
                r = self.client.get_object(Bucket=self.loc.bucket, Key=self.loc.key(rel))
                return r["Body"].read(), r["ETag"]
        except Missing:
            return None

    def put(self, rel: str, body: bytes | Any, *, if_match: str | None = None) -> str:
        """Write an object only if it does not exist (``If-None-Match: *``), or, with
        ``if_match``, only if its ETag is still that one; PreconditionFailed when the
        condition does not hold. Returns the new ETag."""
        cond = {"IfMatch": if_match} if if_match else {"IfNoneMatch": "*"}
        with self._errors(f"writing {rel}"):
            return self.client.put_object(Bucket=self.loc.bucket, Key=self.loc.key(rel),
                                          Body=body, **cond)["ETag"]

    def upload(self, path: Path, rel: str) -> None:
        """Upload a file as a new object (never over an existing one)."""
        with path.open("rb") as f:
            self.put(rel, f)

    def download(self, rel: str, dest: Path) -> None:
        """Stream an object into ``dest`` (Missing when it is gone)."""
        with self._errors(f"reading {rel}", rel):
            r = self.client.get_object(Bucket=self.loc.bucket, Key=self.loc.key(rel))
            with dest.open("wb") as out:
                for chunk in r["Body"].iter_chunks(1 << 20):
                    out.write(chunk)

    def delete(self, rels: Sequence[str]) -> None:
        """Delete objects, best effort (what is left is an unreferenced orphan, harmless)."""
        for i in range(0, len(rels), 1000):
            with contextlib.suppress(StoreError, Missing):
                with self._errors("deleting superseded objects"):
                    self.client.delete_objects(Bucket=self.loc.bucket, Delete={
                        "Objects": [{"Key": self.loc.key(r)} for r in rels[i:i + 1000]],
                        "Quiet": True})

    def list(self, rel_prefix: str) -> list[tuple[str, float]]:
        """(relative key, last-modified epoch seconds) of every object under a prefix (only
        ``orphans`` lists: readers and commits never do)."""
        out = []
        with self._errors(f"listing {rel_prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.loc.bucket, Prefix=self.loc.key(rel_prefix))
            for page in pages:
                for o in page.get("Contents", []):
                    key = o["Key"][len(self.loc.key("")):]
                    out.append((key, o["LastModified"].timestamp()))
        return out

    # --- the pointer and the manifests ----------------------------------------------------

    def manifest(self, rel: str) -> dict[str, Any]:
        """A job manifest (Missing when it is gone)."""
        if rel not in self._manifests:
            got = self.get(rel)
            if got is None:
                raise Missing(rel)
            try:
                doc = json.loads(got[0])
                if not isinstance(doc.get("ranks"), dict):
                    raise ValueError(rel)
            except (ValueError, AttributeError):
                raise StoreError(f"{self.loc.url}: {rel} is not a job manifest: a damaged "
                                 "store") from None
            self._manifests[rel] = doc
        return self._manifests[rel]

    def snapshot(self) -> Snapshot | None:
        """The pointer and every job's manifest (one GET each, manifests cached: they never
        change); None when the store has no pointer (nothing committed yet)."""
        for _ in range(5):  # a manifest superseded and deleted between the two reads
            got = self.get(POINTER)
            if got is None:
                return None
            try:
                pointer = json.loads(got[0])
                if not isinstance(pointer.get("jobs", {}), dict):
                    raise ValueError(POINTER)
            except (ValueError, AttributeError):
                raise StoreError(f"{self.loc.url}: {POINTER} is not JSON: not a tracetool "
                                 "store, or a damaged one") from None
            try:
                manifests = {job: self.manifest(rel)
                             for job, rel in sorted(pointer.get("jobs", {}).items())}
            except Missing as err:
                job = next(j for j, r in pointer["jobs"].items() if r == err.args[0])
                self.check_gone(got[1], f"{err.args[0]}, the manifest of job {job} that "
                                f"{POINTER} names, is missing (deleted outside tracetool?): "
                                f"restore it, or remove job {job} from {POINTER}")
                continue
            return Snapshot(got[1], pointer, manifests)
        raise StoreError(f"{self.loc.url}: the store keeps changing under this reader: try "
                         "again")

    def check_gone(self, etag: str | None, problem: str) -> None:
        """After an object the pointer (of ETag ``etag``) led to turned out missing: when the
        pointer is still that one, no commit superseded the object, so it was deleted outside
        tracetool and reading again cannot help: a StoreError saying ``problem``. When the
        pointer changed, the object was superseded: the caller reads again."""
        now = self.get(POINTER)
        if now is not None and now[1] == etag:
            raise StoreError(f"{self.loc.url}: {problem}")

    def commit_job(self, job: str, fmt: int, change: Callable[[Snapshot], dict[str, Any]],
                   start: Snapshot | None = None, name: str | None = None
                   ) -> tuple[Snapshot, str]:
        """Publish a new manifest of ``job``: ``change(snapshot)`` gives the job's ranks from
        the store as it is now (raising CommitConflict when it must not go ahead); the
        manifest is written create-if-absent, then the pointer swapped with If-Match. A
        lost swap (another writer committed meanwhile) reads the store again and asks
        ``change`` again. ``start``: a snapshot just read, for the first attempt (the swap
        checks it is still current). ``name``: the manifests are ``manifest_prefix(job,
        name)`` + the attempt (what a writer's record names), else a fresh name each.
        Returns the snapshot the commit was based on and the new manifest's key."""
        for attempt in range(COMMIT_ATTEMPTS):
            snap = (start if attempt == 0 and start is not None else self.snapshot()
                    or Snapshot(None, {"format": fmt, "jobs": {}}))
            ranks = change(snap)
            rel = (f"{manifest_prefix(job, name)}{attempt:02d}.json" if name else
                   f"{MANIFESTS}/job={job}/{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex}.json")
            body = json.dumps({"format": fmt, "job": job, "ranks": ranks},
                              separators=(",", ":"), sort_keys=True).encode()
            self.put(rel, body)
            pointer = {**snap.pointer, "format": fmt,
                       "jobs": {**snap.pointer.get("jobs", {}), job: rel}}
            try:
                self.put(POINTER, json.dumps(pointer, indent=1, sort_keys=True).encode(),
                         if_match=snap.etag)
            except PreconditionFailed:
                self.delete([rel])
                time.sleep(RETRY_SLEEP_S * (attempt + 1) * random.uniform(0.5, 1.5))
                continue
            self._manifests[rel] = json.loads(body)
            return snap, rel
        raise StoreError(f"{self.loc.url}: could not commit job {job}: the store changed "
                         f"under {COMMIT_ATTEMPTS} attempts in a row (too many writers at "
                         "once?): ingest again")

    def records(self) -> list[tuple[str, float]]:
        """(key, last-modified) of every writer's record (``WRITERS``): the commits under
        way, and those of writers killed before they finished (one LIST)."""
        return self.list(f"{WRITERS}/")

    def collect(self, records: Sequence[str]) -> list[str]:
        """Remove what the writers of ``records`` (dead: the caller knows) left: of the
        objects a record names (its uploads, the manifests under its prefix, what its
        commit would supersede), those the current pointer does not reference, then the
        record. Referenced ones stay (a writer killed after its swap committed them), and
        none can become referenced later: their names were the dead writer's alone.
        Returns the keys deleted, records included."""
        if not records:
            return []
        snap = self.snapshot()
        live = _referenced(snap)
        gone: list[str] = []  # the objects, then the records
        for rel in records:
            got = self.get(rel)
            try:
                doc = json.loads(got[0]) if got else {}
                named = [str(k) for k in doc.get("keys", [])]
                prefix = doc.get("manifests")
            except (ValueError, AttributeError):
                named, prefix = [], None  # a damaged record: only itself goes
            if isinstance(prefix, str) and prefix.startswith(f"{MANIFESTS}/"):
                named += [k for k, _ in self.list(prefix)]
            gone += sorted({k for k in named if k not in live and not k.startswith(
                f"{WRITERS}/")})
        self.delete(gone)  # then the records: a collection cut short is done again
        self.delete(list(records))
        return gone + list(records)

    def orphans(self, min_age_s: float = 3600.0) -> list[str]:
        """Objects no manifest of the current pointer references (left by killed writers, or
        superseded and not yet deleted), older than ``min_age_s`` so that a commit under way
        is never among them."""
        live = _referenced(self.snapshot())
        now = time.time()
        return sorted(k for prefix in ("data/", f"{MANIFESTS}/")
                      for k, modified in self.list(prefix)
                      if k not in live and now - modified >= min_age_s)


def _referenced(snap: Snapshot | None) -> set[str]:
    """The keys ``snap`` uses: the pointer, every job's manifest and every file they name."""
    live = {POINTER}
    if snap is not None:
        live |= set(snap.pointer.get("jobs", {}).values())
        live |= {f["key"] for m in snap.manifests.values()
                 for r in m.get("ranks", {}).values() for f in r["files"]}
    return live


def manifest_prefix(job: str, name: str) -> str:
    """Where the manifests of the commit named ``name`` go (``<prefix>NN.json``)."""
    return f"{MANIFESTS}/job={job}/{name}-"


def rank_entry(job: str, rank: int, built: Path, commit: str,
               trace_files: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Path]]:
    """The manifest entry of a rank built in ``built`` (``<table>/part-N.parquet``), and the
    local files in the order of its ``files``: each gets a key of its own under ``commit``."""
    import pyarrow.parquet as pq

    files, paths = [], []
    for p in sorted(built.glob("*/*.parquet")):
        table = p.parent.name
        files.append({"table": table, "part": p.name,
                      "key": f"data/job={job}/rank={rank}/{table}/{commit}-{p.name}",
                      "rows": pq.read_metadata(p).num_rows, "bytes": p.stat().st_size,
                      "sha256": sha256_file(p)})
        paths.append(p)
    return {"commit": commit, "trace_files": trace_files, "files": files}, paths


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- the reader's local copies ---------------------------------------------------------------


def cache_root() -> Path:
    """Where fetched store files are kept: $TRACETOOL_CACHE_DIR, else
    $XDG_CACHE_HOME/tracetool, else ~/.cache/tracetool."""
    if os.environ.get("TRACETOOL_CACHE_DIR"):
        return Path(os.environ["TRACETOOL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracetool"


def local_path(root: Path, job: str, rank: str, f: dict[str, Any]) -> Path:
    """The cached copy of one file: content-addressed by its sha256, under the
    ``job=J/rank=R`` directories DuckDB's hive partitioning reads job and rank from."""
    sha, table = str(f.get("sha256")), str(f.get("table"))
    if not (re.fullmatch(r"[0-9a-f]{64}", sha) and re.fullmatch(r"[a-z0-9_]+", table)
            and SAFE_JOB.fullmatch(job) and str(rank).isdigit()):  # names become paths
        raise StoreError(f"bad manifest entry for job {job!r} rank {rank!r}: {f.get('key')}")
    return (root / "objects" / sha[:2] / sha / f"job={job}" / f"rank={int(rank)}"
            / f"{table}.parquet")


def current_files(store: ObjectStore, check: Callable[[Snapshot], None]
                  ) -> dict[str, list[Path]] | None:
    """Each table's files of the store as it is now, as local copies (``local_copies``);
    None when it has no pointer. ``check`` vets the snapshot first (its format). A file
    deleted while it was fetched (its rank replaced) means reading the pointer again."""
    for _ in range(5):
        snap = store.snapshot()
        if snap is None:
            return None
        check(snap)
        try:
            return local_copies(store, snap)
        except Missing as err:
            store.check_gone(snap.etag, f"{err.args[0]}, {_owner(snap, err.args[0])}, is "
                             "missing (deleted outside tracetool?): ingest that rank again "
                             "with --force")
            continue
    raise StoreError(f"{store.loc.url}: the store keeps changing under this reader: try "
                     "again")


def _owner(snap: Snapshot, key: str) -> str:
    """Whose file ``key`` is in ``snap``: "job J rank R's <table> file"."""
    for job, man in snap.manifests.items():
        for rank, entry in man.get("ranks", {}).items():
            for f in entry["files"]:
                if f["key"] == key:
                    return f"job {job} rank {rank}'s {f['table']} file"
    return "a file of the store"


def local_copies(store: ObjectStore, snap: Snapshot) -> dict[str, list[Path]]:
    """Each table's files of ``snap`` as local copies, fetched into the cache when missing
    or not verified (``_verified``; in parallel, sha256 checked; Missing when one is gone),
    ordered as a local store lists them; the cache is then trimmed to TRACETOOL_CACHE_BYTES,
    least recently used first."""
    root = cache_root()
    want: list[tuple[str, Path, dict[str, Any]]] = []  # (sort key, copy, entry)
    for job, man in snap.manifests.items():
        for rank, entry in man.get("ranks", {}).items():
            for f in entry["files"]:
                order = f"job={job}/rank={rank}/{f['table']}/{f.get('part', '')}"
                want.append((order, local_path(root, job, rank, f), f))
    want.sort(key=lambda w: w[0])
    marks = {p: _verified(p, f) for _, p, f in want}
    unsure = [(p, f) for _, p, f in want if marks[p] is None]
    if unsure:
        (root / "tmp").mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(min(FETCH_THREADS, len(unsure))) as pool:
            for (p, _), mark in zip(unsure, pool.map(
                    lambda pf: _check_or_fetch(store, *pf, root / "tmp"), unsure), strict=True):
                marks[p] = mark
    now = time.time()
    out: dict[str, list[Path]] = {}
    for _, p, f in want:
        with contextlib.suppress(OSError):
            os.utime(marks[p], (now, now))  # recently used: not evicted (the copy's own
            # times are left alone: they are part of its signature)
        out.setdefault(f["table"], []).append(p)
    trim_cache(root, {p for _, p, _ in want})
    return out


VERIFIED = ".verified-"  # <copy name>.verified-<signature>: the copy's mark


def _signature(st: os.stat_result) -> str:
    """What changes whenever a file's bytes can have: its inode, size, mtime and ctime (a
    write in place sets the ctime to now, which no user can set back)."""
    return f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}-{st.st_ctime_ns}"


def _verified(p: Path, f: dict[str, Any]) -> Path | None:
    """The mark of a cached copy whose sha256 was checked and which has not changed since
    (an empty file named after the copy's signature, one ``stat`` to look up), else None:
    the copy must be hashed, or fetched."""
    try:
        st = p.stat()
    except OSError:
        return None
    mark = p.with_name(f"{p.name}{VERIFIED}{_signature(st)}")
    return mark if st.st_size == f["bytes"] and mark.exists() else None


def _mark(p: Path) -> Path:
    """Record that ``p`` (just checked against its sha256) is good as it is now (best
    effort: a cache this user cannot write is only hashed again next time)."""
    mark = p.with_name(f"{p.name}{VERIFIED}{_signature(p.stat())}")
    with contextlib.suppress(OSError):
        for old in p.parent.glob(f"{p.name}{VERIFIED}*"):
            if old != mark:
                old.unlink(missing_ok=True)
        mark.touch()
    return mark


def _check_or_fetch(store: ObjectStore, dest: Path, f: dict[str, Any], tmpdir: Path) -> Path:
    """A copy not marked verified: hashed when it is there with the right size (marked
    if it matches: a copy touched but not changed, or one cached before marks), else (or
    when it does not match: damaged in place) fetched again. Returns its mark."""
    if _size(dest) == f["bytes"] and sha256_file(dest) == f["sha256"]:
        return _mark(dest)
    _fetch(store, dest, f, tmpdir)
    return _mark(dest)


def _size(p: Path) -> int | None:
    try:
        return p.stat().st_size
    except OSError:
        return None


def _fetch(store: ObjectStore, dest: Path, f: dict[str, Any], tmpdir: Path) -> None:
    tmp = tmpdir / f"{os.getpid()}-{uuid.uuid4().hex}"
    try:
        store.download(f["key"], tmp)
        if tmp.stat().st_size != f["bytes"] or sha256_file(tmp) != f["sha256"]:
            raise StoreError(f"{store.loc.url}: {f['key']} does not match its manifest (size "
                             "or sha256): the object was changed after it was published")
        tmp.chmod(0o444)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def trim_cache(root: Path, keep: set[Path], limit: int | None = None) -> None:
    """Evict cached copies, least recently used first, until the cache is under ``limit``
    (TRACETOOL_CACHE_BYTES, default 20 GiB); never one in ``keep`` or used in the last
    CACHE_KEEP_S seconds (another reader may have views over it)."""
    limit = limit if limit is not None else int(os.environ.get("TRACETOOL_CACHE_BYTES",
                                                               CACHE_BYTES))
    used: dict[Path, float] = {}  # a copy's last use: its mark's mtime, else its own
    sizes: dict[Path, int] = {}
    marks: dict[Path, list[Path]] = {}
    for p in (root / "objects").glob("*/*/job=*/rank=*/*"):
        with contextlib.suppress(OSError):
            st = p.stat()
            copy = p.with_name(p.name.split(VERIFIED, 1)[0])
            if copy != p:
                marks.setdefault(copy, []).append(p)
            elif p.suffix == ".parquet":
                sizes[p] = st.st_size
            used[copy] = max(used.get(copy, 0.0), st.st_mtime)
    total = sum(sizes.values())
    cutoff = time.time() - CACHE_KEEP_S
    for p in sorted(sizes, key=lambda p: used[p]):
        if total <= limit:
            break
        if p in keep or used[p] > cutoff:
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            total -= sizes[p]
            for mark in marks.get(p, []):
                mark.unlink(missing_ok=True)
            if not any(p.parents[2].rglob("*.parquet")):  # the sha256's directory
                shutil.rmtree(p.parents[2], ignore_errors=True)
