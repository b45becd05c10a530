"""``--executor ray``: one Ray task per trace file, on a Ray cluster (issue 14, item 1).

Ray is an optional extra (``pip install 'tracetool[ray]'``). The driver joins the cluster
``ray.init`` finds (``RAY_ADDRESS``, else a local one it starts and stops), submits one task
per file, each building the file's partition as a local ingest does (``build_file``, its
pieces decoded in the task's process), and commits the results in input order, under the
store's lock, exactly as the local executor does: so both write the same tables
(tests/test_ray.py). The work directories live in the store's ``.tmp``, so the store must be
on a file system every node of the cluster mounts (NFS, Lustre, a local disk for a one-node
cluster); object storage is the store's other backend (issue 14, item 2).

Each task asks Ray for one CPU and ``TASK_MEMORY`` bytes: an ingest's peak memory is bounded
whatever the file's size (pieces of 16 MB, DuckDB under ``Options.memory_limit``; 1 GB
files peak below 1 GB of summed RSS, BENCHMARKS.md), so Ray never packs more tasks on a node
than its memory holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from tracetool.errors import InputError
from tracetool.ray_cluster import ray_cluster

from .build import build_file
from .options import FileResult, Options, UsageProblem
from .store import StoredFile
from .workers import Workers

TASK_MEMORY = 2 << 30  # bytes Ray reserves per task (peak ingest RSS < 1 GB, plus headroom)


def _build_task(path: str, opts: Options, workdir: str, stored: list[StoredFile]
                ) -> FileResult:
    """One file's partition, built in a Ray worker process (single-process decoding)."""
    return build_file(Path(path), opts, Path(workdir), stored, Workers(1))


def ray_builds(files: list[Path], opts: Options, stored: list[StoredFile],
               new_workdir: Callable[[], Path]) -> Iterator[tuple[Path, FileResult]]:
    """(work dir, built result) of each file, in input order, built by Ray tasks. Closing
    the iterator early (an error, Ctrl-C) cancels the tasks still running."""
    try:
        with ray_cluster() as ray:
            yield from _builds_on(ray, files, opts, stored, new_workdir)
    except InputError as err:  # Ray is not installed
        raise UsageProblem(str(err)) from None


def _builds_on(ray: ModuleType, files: list[Path], opts: Options, stored: list[StoredFile],
               new_workdir: Callable[[], Path]) -> Iterator[tuple[Path, FileResult]]:
    task = ray.remote(num_cpus=1, memory=TASK_MEMORY, max_retries=0)(_build_task)
    workdirs = [new_workdir() for _ in files]
    refs = [task.remote(str(f), opts, str(wd), stored) for f, wd in zip(files, workdirs,
                                                                          strict=True)]
    done = 0
    try:
        for f, wd, ref in zip(files, workdirs, refs, strict=True):
            try:
                r = ray.get(ref)
            except ray.exceptions.RayError as err:  # the task died (node lost, killed, OOM)
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                r = FileResult(str(f), "error", f"Ray task failed: {first}", job=opts.job,
                               store=str(opts.store))
            done += 1
            yield wd, r
    finally:
        for ref in refs[done:]:
            ray.cancel(ref, force=True)
