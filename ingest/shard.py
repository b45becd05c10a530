"""Shard ingests and their commit, for clusters without Ray (SLURM array jobs, Kubernetes
indexed jobs).

``tracetool ingest PATHS --shard I/N`` builds only the I-th of N slices of the job's sorted
file list (every N-th file, from the I-th), checks each built rank against the store as an
ingest does, and stages the partitions under ``STORE/staging/job=J/shard-I-of-N/`` instead of
publishing them. The shard directory is assembled in ``.tmp`` and renamed into place with its
``shard.json`` (what each file became, and the count and hash of the whole list it was
given) already in it, so a staged shard is always a finished one; its files are reported
``staged`` by that rename. Running a shard again replaces its staged copy. ``tracetool
commit STORE --job J`` (``commit_job``) then checks that all N shards finished, were given
the same file list (else their slices need not cover it), and that no rank is claimed twice
or clashes with what the store holds, and only then publishes every staged partition, as an
ingest's commit does (each rank atomically, reported as it is published), and removes the
staging (``staging/`` too, once empty).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracetool.signals import deferred

from .lock import owner_tag
from .options import FileResult, UsageProblem
from .store import Store, StoredFile

SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")
MANIFEST = "shard.json"


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` with 0 <= I < N (``UsageProblem`` otherwise)."""
    m = SHARD.match(text)
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise UsageProblem(f"bad --shard {text!r}: give I/N with 0 <= I < N, e.g. 0/8 for the "
                           "first of 8 shards")
    return int(m.group(1)), int(m.group(2))


def _list_key(f: Path) -> bytes:
    """A file's place in a shard's list: its absolute path, symlinks resolved (shards run
    from other directories, or given the files by another route, agree), as bytes (any
    name)."""
    return os.fsencode(f.resolve())


def shard_files(files: list[Path], shard: tuple[int, int]) -> list[Path]:
    """The files shard I of N builds: every N-th of the sorted list, from the I-th (so the
    shards of one job, given the same files, split them without overlap or gap)."""
    i, n = shard
    return sorted(files, key=_list_key)[i::n]


def file_list(files: list[Path]) -> dict[str, Any]:
    """What a shard records of the whole list it was given, for ``commit_job`` to check
    that every shard sliced the same one: its count and the sha256 of its sorted keys."""
    keys = sorted(map(_list_key, files))
    return {"files": len(keys), "sha256": hashlib.sha256(b"\0".join(keys)).hexdigest()}


def staging_dir(store: Store, job: str) -> Path:
    return store.root / "staging" / f"job={job}"


class Stage:
    """The partitions one shard has built, gathered in a work directory until ``publish``."""

    def __init__(self, store: Store, job: str, shard: tuple[int, int], given: list[Path]
                 ) -> None:
        """``given``: the whole file list the shard was given (``file_list``)."""
        self.store, self.job, self.shard = store, job, shard
        self.given = file_list(given)
        self.dir = store.tmp / f"{owner_tag()}-shard-{uuid.uuid4().hex}"
        self.dir.mkdir(parents=True)

    def add(self, rank: int, built: Path) -> None:
        built.rename(self.dir / f"rank={rank}")

    def publish(self, results: list[FileResult],
                tell: Callable[[FileResult], None] | None = None) -> Path:
        """Write shard.json and move the shard into ``staging/`` (under the store lock),
        replacing an earlier run of the same shard; ``tell`` is given each staged result
        then, with signals held from the rename on (so what is reported is staged)."""
        i, n = self.shard
        entries = [{"path": r.path, "status": r.status, "rank": r.rank, "sha256": r.sha256,
                    "message": r.message,
                    "staged": r.status == "staged" and (self.dir / f"rank={r.rank}").is_dir()}
                   for r in results]
        (self.dir / MANIFEST).write_text(json.dumps(
            {"job": self.job, "shard": i, "of": n, "given": self.given, "files": entries},
            indent=1) + "\n")
        target = staging_dir(self.store, self.job) / f"shard-{i}-of-{n}"
        with self.store.lock(), deferred():  # (commit_job removes an empty staging/)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                old = self.store.tmp / f"{owner_tag()}-old-shard-{uuid.uuid4().hex}"
                target.rename(old)
                self.store.retire(old, grace=False)
            self.dir.rename(target)
            for r in results:
                if r.status == "staged" and tell is not None:
                    tell(r)
        self.store.remove_retired(wait=False)
        return target

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class StagedShard:
    index: int
    of: int
    dir: Path
    files: list[dict]
    given: dict[str, Any] | None  # file_list() of what it was given (None: staged before)


def staged_shards(store: Store, job: str) -> list[StagedShard]:
    """The finished shards staged for ``job`` (a directory with its shard.json)."""
    out = []
    d = staging_dir(store, job)
    for entry in sorted(d.iterdir()) if d.is_dir() else []:
        m = SHARD_DIR.match(entry.name)
        if not m or not (entry / MANIFEST).is_file():
            continue
        doc = json.loads((entry / MANIFEST).read_text())
        out.append(StagedShard(int(m.group(1)), int(m.group(2)), entry, doc["files"],
                               doc.get("given")))
    return out


class CommitProblem(ValueError):
    """The staged shards of a job cannot be published as they are (one line)."""


def check_complete(shards: list[StagedShard], job: str) -> None:
    """Every shard of one N present (``CommitProblem`` naming what is missing)."""
    if not shards:
        raise CommitProblem(f"job {job}: nothing staged (run `tracetool ingest ... --job {job} "
                            "--shard I/N` for each shard first)")
    counts = sorted({s.of for s in shards})
    if len(counts) > 1:
        raise CommitProblem(f"job {job}: staged shards disagree on their number ("
                            f"{', '.join(f'of {n}' for n in counts)}): run every shard with "
                            "the same N")
    n = counts[0]
    missing = sorted(set(range(n)) - {s.index for s in shards})
    if missing:
        raise CommitProblem(f"job {job}: shard{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(map(str, missing))} of {n} not staged (not run, "
                            "still running or killed): run them, then commit")


def check_same_files(shards: list[StagedShard], job: str) -> None:
    """Every shard was given the same file list (``CommitProblem`` naming the shards of each
    list): shards of different lists may leave files out, or build some twice."""
    n = shards[0].of
    old = [s.index for s in shards if s.given is None]
    if old:
        raise CommitProblem(f"job {job}: shard {old[0]} of {n} was staged by an older "
                            "tracetool, which did not record its file list: run it again, "
                            "then commit")
    lists: dict[tuple[int, str], list[int]] = {}
    for s in sorted(shards, key=lambda s: s.index):
        lists.setdefault((s.given["files"], s.given["sha256"]), []).append(s.index)
    if len(lists) > 1:
        each = "; ".join(f"shard{'s' if len(ix) > 1 else ''} {', '.join(map(str, ix))} of "
                         f"{n} got {count} file{'s' if count != 1 else ''} (list {sha[:12]})"
                         for (count, sha), ix in lists.items())
        raise CommitProblem(f"job {job}: the shards were given different file lists, so their "
                            f"slices need not cover the job: {each}; run every shard with the "
                            "same paths, then commit")


def commit_job(store: Store, job: str, force: bool = False,
               tell: Callable[[FileResult], None] | None = None) -> list[FileResult]:
    """Publish every partition the shards of ``job`` staged, once every shard finished,
    all were given the same files and nothing clashes; one result per staged file (and the
    files the shards reported as failed or skipped, as they reported them), each given to
    ``tell`` as it is final (a published one by the commit that publishes it, so an
    interrupt leaves no rank published unreported). Raises ``CommitProblem`` before
    publishing anything when the shards are incomplete or of different file lists, a rank
    is staged twice, or a rank clashes with what the store holds (without ``force``)."""
    from .packs import refresh_pack
    from .pipeline import commit_built  # the ingest's commit rules, one home

    with store.lock():
        shards = staged_shards(store, job)
        check_complete(shards, job)
        check_same_files(shards, job)
        staged, reported = [], []
        for s in shards:
            for f in s.files:
                if f["staged"]:
                    staged.append(FileResult(f["path"], "built", job=job, rank=f["rank"],
                                             sha256=f["sha256"],
                                             built=str(s.dir / f"rank={f['rank']}")))
                else:
                    reported.append(FileResult(f["path"], f["status"], f["message"], job=job,
                                               rank=f["rank"]))
        by_rank: dict[int, list[str]] = {}
        for r in staged:
            by_rank.setdefault(r.rank, []).append(Path(r.path).name)
        twice = {k: v for k, v in by_rank.items() if len(v) > 1}
        if twice:
            rank, names = min(twice.items())
            raise CommitProblem(f"job {job}: rank {rank} staged by {' and '.join(names)}"
                                f"{f' (and {len(twice) - 1} more ranks)' if len(twice) > 1 else ''}"
                                ": give those files other --job names or ranks")
        stored = store.stored_files()
        clash = [(r, s) for r in staged for s in stored
                 if s.job == job and s.rank == r.rank and s.sha256 != r.sha256]
        if clash and not force:
            r, s = clash[0]
            raise CommitProblem(f"job {job} rank {r.rank} already holds {s.file_name} "
                                f"(different content from {Path(r.path).name}); use --force "
                                "to replace it")
        earlier = {id(r) for r in _published_earlier(staged, stored, job)}
        committed: dict[int, str] = {}
        results = []
        for r in staged:
            if id(r) in earlier:
                r.status, r.built = "skipped", ""
                r.message = "published by an earlier commit (interrupted before it ended)"
            else:
                commit_built(r, store, stored, committed, force, published=tell)
            results.append(r)
            if r.status != "ingested" and tell is not None:  # else told by its commit
                tell(r)
        with deferred():  # removed whole (a half-removed shard would look unfinished)
            shutil.rmtree(staging_dir(store, job), ignore_errors=True)
            with contextlib.suppress(OSError):  # other jobs' shards are staged
                (store.root / "staging").rmdir()
    for r in reported:
        if tell is not None:
            tell(r)
    with deferred():  # the replaced ranks' grace, then their deletion: none left in .tmp
        store.remove_retired()
    refresh_pack(store, job)
    return results + reported


def _published_earlier(staged: list[FileResult], stored: list[StoredFile], job: str
                       ) -> list[FileResult]:
    """The staged files a commit interrupted after publishing them moved out of staging:
    the store holds them (their rank, their sha256). ``CommitProblem`` when a staged
    partition is missing otherwise (nothing is published then)."""
    held = {(s.rank, s.sha256) for s in stored if s.job == job}
    out = []
    for r in staged:
        if Path(r.built).is_dir():
            continue
        if (r.rank, r.sha256) not in held:
            raise CommitProblem(f"job {job}: the partition staged for {Path(r.path).name} "
                                f"(rank {r.rank}) is missing from {Path(r.built).parent}: "
                                "run its shard again, then commit")
        out.append(r)
    return out
