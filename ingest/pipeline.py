"""Ingest trace files into the store: build each file's partition, then commit it.

Small files (one piece) are built whole on the worker pool, in batches derived together
(``build.build_files``), several batches at once; a large file is built in this process with
its pieces decoded on the pool. Commits happen here, in
input order, so two inputs can never silently claim the same (job, rank). With
``Options.shard`` only one slice of the files is built, and staged instead of committed
(``shard.py``: ``tracetool commit`` publishes the shards).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from tracetool.errors import StoreError
from tracetool.objstore import CommitConflict
from tracetool.signals import deferred

from . import decode
from .build import build_file, build_files
from .options import TRACE_SUFFIXES, FileResult, Options, UsageProblem
from .packs import refresh_pack
from .shard import Stage, shard_files
from .source import is_gzip
from .store import JOB_NAME, MAX_JOB_NAME, ObjectStoreWriter, Store, StoredFile, open_store
from .workers import Workers, capped_workers

__all__ = ["FileResult", "Options", "UsageProblem", "ingest"]


def expand_inputs(paths: Iterable[Path], recursive: bool = False
                  ) -> tuple[list[Path], list[FileResult]]:
    """Files named directly, plus every trace file inside named directories (and, with
    ``recursive``, in their subfolders; symlinked folders are not followed), sorted; a file
    named twice (say, alone and inside its directory) is ingested once."""
    files: list[Path] = []
    errors: list[FileResult] = []
    for p in paths:
        problem = _unreadable(p)
        if problem:
            errors.append(FileResult(str(p), "error", problem))
        elif p.is_dir():
            try:
                found = _trace_files(p, recursive)
            except OSError as err:
                errors.append(FileResult(str(p), "error", f"cannot list the directory: "
                                         f"{err.strerror or err}"))
                continue
            if not found:
                below = "" if recursive else _hint_below(p)
                errors.append(FileResult(str(p), "error", "directory holds no .json or "
                                         f".json.gz trace files{below}"))
            files += found
        else:
            files.append(p)
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, errors


def _trace_files(d: Path, recursive: bool) -> list[Path]:
    """The trace files in ``d`` (and below it when ``recursive``), sorted by path."""
    if not recursive:
        return sorted(f for f in d.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))

    def fail(err: OSError) -> None:
        raise err

    found = []
    for top, _, names in os.walk(d, onerror=fail):
        found += [Path(top, n) for n in names if n.endswith(TRACE_SUFFIXES)]
    return sorted(f for f in found if f.is_file())


def _hint_below(d: Path) -> str:
    """' (N in its subfolders: add --recursive)' when subfolders of ``d`` hold trace files."""
    try:
        n = len(_trace_files(d, recursive=True))
    except OSError:
        return ""
    return f" ({n} in its subfolders: add --recursive)" if n else ""


def _unreadable(p: Path) -> str | None:
    """Why ``p`` cannot be an input, or None: a symlink loop, a path that cannot be looked
    up, something other than a regular file or a directory (a FIFO would block the read
    forever). A path that does not exist is left to the file's own error."""
    try:
        p.resolve(strict=False)
        st = p.stat()
    except RuntimeError:
        return "symlink loop"
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "symlink loop"
        return f"cannot be looked up: {err.strerror or err}"
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return None
    return "not a regular file (a FIFO, socket or device): give a trace file"


def default_job(paths: list[Path], files: list[Path]) -> str:
    """--job default: the directory named on the command line, else the files' folder."""
    dirs = [p for p in paths if _is_dir(p)]
    base = dirs[0] if dirs else (files[0].resolve().parent if files else Path.cwd())
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", base.resolve().name) or "job"
    return name if JOB_NAME.match(name) else "job_" + name


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except OSError:  # e.g. inside a directory we may not search (reported per file)
        return False


def _size(f: Path) -> int:
    try:
        return f.stat().st_size if f.is_file() else 0
    except OSError:
        return 0


def _json_size(f: Path) -> int:
    """About how much JSON text a file holds (gzip'd traces inflate ~10x)."""
    return _size(f) * (10 if is_gzip(f) else 1)


def _load_scanner() -> None:
    """Load the compiled scanner; if this machine cannot (numba missing or broken), every
    piece goes to the msgspec decoder instead."""
    try:
        from .fastpath import warm

        warm()
    except Exception:  # noqa: BLE001  # any failure only means the slower decoder
        decode.FAST_MIN_BYTES = 1 << 62


def ingest(
    paths: list[Path],
    opts: Options,
    on_result: Callable[[FileResult], None] | None = None,
    progress_factory: Callable[[Path, int], Callable[[int], None]] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> list[FileResult]:
    """Ingest files and directories as the ranks of one job; one result per file.
    ``on_note``: told what concerns the job rather than a file (a pack left stale, --workers
    capped: ``capped_workers``)."""
    files, results = expand_inputs(paths, opts.recursive)
    for r in results:
        if on_result:
            on_result(r)
    if opts.job_per_file:
        return _job_per_file(files, results, opts, on_result, progress_factory)
    job = opts.job or default_job(paths, files)
    if not JOB_NAME.match(job):
        raise UsageProblem(f"invalid job name {job!r}: use letters, digits, '.', '_', '+', '-'")
    if len(job) > MAX_JOB_NAME:  # it names a directory: file systems take 255 bytes
        raise UsageProblem(f"invalid job name {job[:40]!r}...: {len(job)} characters, at most "
                           f"{MAX_JOB_NAME}")
    if opts.rank is not None and len(files) > 1:
        raise UsageProblem("--rank applies to a single trace file, but several were given")
    given = files  # a shard's: every shard of a job must be given the same (shard.py)
    if opts.shard is not None:
        if opts.rank is not None:
            raise UsageProblem("--rank and --shard do not go together: a shard's ranks come "
                               "from its files")
        files = shard_files(files, opts.shard)
    opts = replace(opts, job=job, single_file=len(files) == 1 and opts.shard is None)
    store = open_store(opts.store)
    if opts.shard is not None and isinstance(store, ObjectStoreWriter):
        raise StoreError(f"{store.root}: --shard (and tracetool commit) need a directory "
                         "store; on an object store run each task's ingest without --shard: "
                         "every rank's commit is atomic and concurrent commits merge")
    store.create()
    store.check_format()
    with store.lock():
        store.reclaim()  # work files of dead ingests on this host
    stored = store.stored_files()
    n_workers, capped = capped_workers(opts.workers or os.cpu_count() or 1)
    if capped and opts.executor != "ray" and on_note:
        on_note(capped)
    workers = Workers(1 if opts.executor == "ray" else n_workers)
    committed: dict[int, str] = {}
    workdirs: list[Path] = []  # removed at the end whatever happens (an error, Ctrl-C)
    stage: Stage | None = None

    def new_workdir() -> Path:
        with deferred():  # made and listed for removal as one step
            workdirs.append(store.new_workdir())
        return workdirs[-1]

    def tell(r: FileResult) -> None:
        results.append(r)
        if on_result:
            on_result(r)

    builds: Iterator[tuple[Path, list[FileResult]]] | None = None
    try:
        if opts.shard is not None:
            with deferred():
                stage = Stage(store, job, opts.shard, given)
        if opts.executor == "ray":
            from .ray_executor import ray_builds

            builds = ((wd, [r]) for wd, r in ray_builds(files, opts, stored, new_workdir))
        else:
            builds = _local_builds(files, opts, stored, workers, new_workdir,
                                   progress_factory)
        for wd, built in builds:
            try:
                for r in built:
                    if r.status == "built":
                        with store.lock():  # what other ingests committed meanwhile counts
                            r = commit_built(r, store, store.stored_files(), committed,
                                             opts.force, stage, published=tell)
                    if r.status == "staged":  # told when the shard is (Stage.publish)
                        results.append(r)
                    elif r.status != "ingested":  # told by the commit that published it
                        tell(r)
            finally:
                with deferred():
                    store.cleanup(wd)
                    workdirs.remove(wd)
        if stage is not None:
            stage.publish(results, on_result)
        elif isinstance(store, Store):  # a job of many ranks: its tables compacted
            status, changed, n = refresh_pack(store, job, opts.memory_limit, workers.workers)
            if status == "deferred" and on_note:
                on_note(f"job {job}: its pack predates {changed} of its {n} ranks, so its "
                        "queries read the ranks' partitions (slower) until a quarter of them "
                        f"changed; `tracetool pack {opts.store} --job {job}` rebuilds it now")
    except BaseException as err:
        # an interrupt: stop the workers now, not after their tasks
        workers.close(kill=not isinstance(err, Exception))
        raise
    finally:
        with deferred():  # done whole, an interrupt during it raised after: no work file left
            if builds is not None:
                builds.close()  # the Ray executor cancels the tasks still running
            workers.close()  # first: no worker may still write into a work dir
            for wd in workdirs:
                store.cleanup(wd)
            if stage is not None:
                stage.discard()  # gone already when it was published
            store.remove_retired()  # sleeps out the grace (2 s at most)
    return results


def file_job(f: Path) -> str:
    """--job-per-file: a file's job, its name without the trace suffixes (.pt.trace.json.gz)."""
    name = f.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        name = name.removesuffix(suffix)
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", name)[:MAX_JOB_NAME] or "job"
    return name if JOB_NAME.match(name) else "job_" + name[:MAX_JOB_NAME - 4]


def per_file_jobs(files: list[Path]) -> dict[str, Path]:
    """--job-per-file: job -> file. Each job is named after its file (``file_job``); files
    of the same name in different folders are told apart by their folder relative to the
    files' common one (``a/trace.json``, ``b/trace.json`` -> jobs ``a_trace``, ``b_trace``).
    A clash left after that is a UsageProblem naming both files."""
    counts: dict[str, int] = {}
    for f in files:
        counts[file_job(f)] = counts.get(file_job(f), 0) + 1
    common = Path(os.path.commonpath([f.resolve().parent for f in files])) if files else None
    jobs: dict[str, Path] = {}
    for f in files:
        job = file_job(f)
        if counts[job] > 1 and common is not None:
            folder = f.resolve().parent.relative_to(common)
            job = file_job(Path("_".join([*folder.parts, f.name])))
        if job in jobs:
            raise UsageProblem(f"--job-per-file: {jobs[job]} and {f} would both be job "
                               f"{job!r}: rename one, or ingest them apart")
        jobs[job] = f
    return jobs


def _job_per_file(files: list[Path], results: list[FileResult], opts: Options,
                  on_result: Callable[[FileResult], None] | None,
                  progress_factory: Callable[[Path, int], Callable[[int], None]] | None
                  ) -> list[FileResult]:
    """Ingest each file as a job of its own (unrelated single-rank traces in one folder)."""
    if opts.job is not None or opts.rank is not None or opts.shard is not None:
        raise UsageProblem("--job-per-file names each job after its file: it does not go "
                           "with --job, --rank or --shard")
    jobs = per_file_jobs(files)
    for job, f in jobs.items():
        results += ingest([f], replace(opts, job=job, job_per_file=False), on_result,
                          progress_factory)
    return results


def _local_builds(files: list[Path], opts: Options, stored: list[StoredFile], workers: Workers,
                  new_workdir: Callable[[], Path],
                  progress_factory: Callable[[Path, int], Callable[[int], None]] | None
                  ) -> Iterator[tuple[Path, list[FileResult]]]:
    """(work dir, built results) of the files, in input order, on this machine: small files
    (one piece) in batches derived together (``batches``), several batches at once on the
    worker pool; a large one alone here, its pieces decoded on the pool."""
    small = [f for f in files if _size(f) <= opts.piece_bytes]
    parallel = workers.workers > 1 and len(files) > 1
    if any(_json_size(f) >= decode.FAST_MIN_BYTES for f in files):
        _load_scanner()  # before the fork: the workers inherit the loaded scanner
    if workers.workers > 1 and (parallel or len(small) < len(files)):
        workers.pool()  # fork the workers before this process starts DuckDB threads
    groups = batches(files, set(small), opts.batch_files, opts.batch_bytes,
                     workers.workers if parallel else 1)
    batch_of = {f: b for b in groups for f in b}
    pending: dict[Path, tuple[Path, Future]] = {}
    if parallel:
        for b in groups:
            wd = new_workdir()
            pending[b[0]] = (wd, workers.submit(build_files, b, opts, wd, stored))
    for f in files:
        b = batch_of.get(f, [f])
        if f != b[0]:
            continue  # built with the first file of its batch
        if f in pending:
            wd, fut = pending.pop(f)
            yield wd, fut.result()
        elif len(b) > 1:
            wd = new_workdir()
            yield wd, build_files(b, opts, wd, stored)
        else:
            wd = new_workdir()
            prog = progress_factory(f, _size(f)) if progress_factory else None
            yield wd, [build_file(f, opts, wd, stored, workers, prog)]


def batches(files: list[Path], small: set[Path], max_files: int, max_bytes: int,
            workers: int) -> list[list[Path]]:
    """The ``small`` files in derivation batches of files consecutive in ``files`` (so commits
    stay in input order): at most ``max_files`` and ``max_bytes`` of JSON each, and enough
    batches to keep ``workers`` busy (at least two per worker, so one slow batch does not
    leave a core idle at the end)."""
    n = max(1, min(max_files, -(-len(small) // (2 * workers))))
    out: list[list[Path]] = []
    cur: list[Path] = []
    size = 0
    for f in files:
        if cur and (f not in small or len(cur) >= n or size + _json_size(f) > max_bytes):
            out.append(cur)
            cur, size = [], 0
        if f in small:
            cur.append(f)
            size += _json_size(f)
    return out + [cur] if cur else out


def commit_built(r: FileResult, store: Store | ObjectStoreWriter, stored: list[StoredFile],
                 committed: dict[int, str], force: bool, stage: Stage | None = None,
                 published: Callable[[FileResult], None] | None = None) -> FileResult:
    """Move a built partition into the store unless its (job, rank) is taken (the caller
    holds the lock); with ``stage``, check the same and stage it for ``tracetool commit``.
    An object store has no lock: its commit checks again on the store as it is then.
    ``published``: told of ``r``, ingested, by the commit itself the moment it is visible
    (before an interrupt can stop it), so that what is reported is what the store holds."""
    if r.status != "built" or r.rank is None or r.job is None:
        return r
    if r.rank in committed:
        r.status = "error"
        r.message = (f"job {r.job} rank {r.rank} is also claimed by {committed[r.rank]} in "
                     "this ingest; pass the files separately with --rank or --job, or, for "
                     "unrelated single-rank traces, --job-per-file")
        return r
    if not _may_commit(r, stored, force):
        return r
    rank = r.rank
    committed[rank] = Path(r.path).name
    if stage is not None:
        stage.add(r.rank, Path(r.built))
        r.status, r.built = "staged", ""
        i, n = stage.shard
        r.message = f"shard {i} of {n}: publish with `tracetool commit STORE --job {r.job}`"
        return r

    def visible() -> None:
        r.status, r.built = "ingested", ""
        if published is not None:
            published(r)

    try:
        done = store.commit(r.job, r.rank, Path(r.built),
                            recheck=lambda now: _may_commit(r, now, force), published=visible)
    except CommitConflict as err:  # lost a race for this rank to another writer
        done, r.status, r.message = False, "error", str(err)
    if not done:
        del committed[rank]
    return r


def _may_commit(r: FileResult, stored: list[StoredFile], force: bool) -> bool:
    """Whether the store as ``stored`` says lets ``r`` be committed; if not, ``r`` is made
    the skip (same bytes already stored) or the error (the rank holds another file)."""
    same = [s for s in stored if s.job == r.job and s.sha256 == r.sha256]
    if same and not force:  # committed by another ingest since this one began
        s = same[0]
        r.status, r.rank, r.built = "skipped", s.rank, ""
        r.message = (f"already ingested as job {s.job} rank {s.rank} (same sha256, by "
                     "another ingest); use --force to re-ingest")
        return False
    clash = [s for s in stored if s.job == r.job and s.rank == r.rank]
    if clash and not force:
        r.status = "error"
        r.message = (f"job {r.job} rank {r.rank} already holds {clash[0].file_name} "
                     "(different content); use --force to replace it, or --job")
        return False
    return True
