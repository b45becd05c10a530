"""``tracetool ingest``: trace files -> the Parquet trace store."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import click

from tracetool.cli._errors import fail_line
from tracetool.cli._numbers import Int, OneLine
from tracetool.cli._store import store_arg
from tracetool.comm_kernels import parse_user_entry
from tracetool.errors import InputError, StoreError, one_line
from tracetool.ingest.budget import parse_size
from tracetool.ingest.pipeline import FileResult, Options, UsageProblem, ingest
from tracetool.ingest.shard import parse_shard
from tracetool.ingest.workers import WORKERS_PER_CORE
from tracetool.schema import MAX_RANK
from tracetool.signals import Interrupted, interruptible
from tracetool.text import path_text, printable


class Size(OneLine):
    """A byte count with an optional unit: 64MB, 2GiB, 500k."""

    name = "size"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a size (e.g. 512MB, 4GiB)", param, ctx)


@click.command("ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--store", type=store_arg(), default=Path("tracetool-store"),
              show_default=True,
              help="Store directory (created if missing), or s3://bucket/prefix.")
@click.option("--job", help="Job name for these ranks (default: the directory's name).")
@click.option("--rank", type=Int(0, MAX_RANK),
              help="Rank of a single file (overrides distributedInfo and the file name).")
@click.option("--force", is_flag=True, help="Re-ingest and replace what the store holds.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per file.")
@click.option("--strict", is_flag=True, help="Treat a truncated (salvaged) file as an error.")
@click.option("--workers", type=Int(1, None),
              help=f"Decoding processes (default: all cores); more than {WORKERS_PER_CORE} "
                   "per core is capped there, with a warning.")
@click.option("--tmp-budget", type=Size(),
              help="Disk the work files of one trace file may use in STORE/.tmp (e.g. 8GB; "
              "default: 4x its JSON text, at least 1 GiB). A file that needs more fails.")
@click.option("--max-event-bytes", type=Size(), default="64MiB", show_default=True,
              help="An event larger than this is quarantined unread (bounds memory).")
@click.option("--shard", metavar="I/N",
              help="Build only the I-th of N slices of the files (every N-th, from the I-th) "
                   "and stage it; `tracetool commit` publishes the job once all N are staged "
                   "(SLURM array jobs, Kubernetes indexed jobs).")
@click.option("--job-per-file", is_flag=True,
              help="Ingest each file as a job of its own, named after the file (unrelated "
                   "single-rank traces in one folder; a file with no rank is rank 0).")
@click.option("--recursive", "-r", is_flag=True,
              help="A directory's subfolders too: every trace file below it (symlinked "
                   "folders are not followed).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="local: this machine's worker pool; ray: one Ray task per file on the "
                   "cluster RAY_ADDRESS names, else a local one (pip install 'tracetool[ray]').")
@click.option("--comm-kernel", "comm_kernels", multiple=True, metavar="REGEX=KIND",
              help="Kernels whose name matches REGEX (case-insensitive) are communication "
                   "of collective KIND (allreduce, allgather, reduce_scatter, all_to_all, "
                   "broadcast, reduce, send, recv, barrier, other), besides the registry's "
                   "(docs/collectives.md); repeatable.")
def ingest_command(paths: tuple[Path, ...], store: Path | str, job: str | None, rank: int | None,
                   force: bool, as_json: bool, strict: bool, workers: int | None,
                   tmp_budget: int | None, max_event_bytes: int, shard: str | None,
                   executor: str, job_per_file: bool, recursive: bool,
                   comm_kernels: tuple[str, ...]) -> None:
    """Ingest Kineto trace files (.json, .json.gz) or directories of them into STORE.

    All PATHS are ranks of one job. Each file's rank comes from --rank, else its
    distributedInfo, else a rank/worker number in its file name. Exit code 0 when every
    file was ingested, staged (--shard) or skipped (already in the store), 1 when any failed.
    """
    try:
        shard_of = parse_shard(shard) if shard is not None else None
    except UsageProblem as err:
        raise click.UsageError(str(err)) from None
    try:
        user = [parse_user_entry(t) for t in comm_kernels]
    except InputError as err:
        fail_line(one_line(err), code=2)
    opts = Options(store=store, job=job, rank=rank, force=force, strict=strict,
                   workers=workers or 0, tmp_budget=tmp_budget, max_event_bytes=max_event_bytes,
                   shard=shard_of, executor=executor, job_per_file=job_per_file,
                   recursive=recursive, comm_kernels=comm_kernels)
    failed = False
    done: list[FileResult] = []

    def report(r: FileResult) -> None:
        nonlocal failed
        if bars is not None:
            bars.stop()  # a bar left by a file that failed early
        if r.status == "error":
            failed = True
        done.append(r)
        if as_json:
            click.echo(json.dumps(r.as_json()))
        shown = printable(path_text(r.path))  # a file's name is hostile text too
        for w in r.warnings:
            click.echo(f"tracetool: warning: {shown}: {w}", err=True)
        if r.status == "error":
            click.echo(f"tracetool: error: {shown}: {r.message}", err=True)
        elif not as_json:
            where = f"job {r.job} rank {r.rank}" if r.rank is not None else ""
            verb = r.status if r.status in ("ingested", "staged") else "skipped"
            click.echo(f"{verb} {shown} -> {where}: {r.message}")

    bars = ProgressBars() if sys.stderr.isatty() and not as_json else None
    try:
        with interruptible():
            ingest(list(paths), opts, on_result=report, progress_factory=bars,
                   on_note=lambda note: click.echo(f"tracetool: warning: {note}", err=True))
    except UsageProblem as err:
        raise click.UsageError(str(err)) from None
    except StoreError as err:  # another format, locked, not writable
        click.echo(f"tracetool: error: {err}", err=True)
        sys.exit(1)
    except Interrupted as err:
        if bars is not None:
            bars.stop()
        held = ("reported staged above are staged" if shard is not None
                else "reported above are in the store")  # each told by the step that did it
        click.echo(f"tracetool: error: interrupted by {err}; the files {held}, the others "
                   "are not", err=True)
        sys.exit(err.exit_code)
    if user:
        _check_comm_kernels(store, comm_kernels, user, done)
    sys.exit(1 if failed else 0)


def _check_comm_kernels(store: Path | str, texts: tuple[str, ...], user: list,
                        results: list[FileResult]) -> None:
    """Exit 2 when a --comm-kernel classified nothing: every file was already in the store
    (skipped, so not classified again), or its pattern matches no kernel of the files this
    command ingested (they stay ingested)."""
    from tracetool.store_views import connect_store

    ingested = [r for r in results if r.status == "ingested" and r.rank is not None]
    if not ingested:
        if any(r.status == "skipped" for r in results):
            fail_line("--comm-kernel: every file was already in the store, so none was "
                      "classified by it; add --force to ingest them again", code=2)
        return
    con = connect_store(store)
    try:
        keys = sorted({f"{r.job}/{r.rank}" for r in ingested})
        for text, e in zip(texts, user, strict=True):
            n = con.execute(
                "SELECT count(*) FROM gpu_ops WHERE kind = 'kernel' AND "
                "list_contains(?, job || '/' || rank) AND regexp_matches(name, ?, 'i')",
                [keys, e.pattern]).fetchone()[0]
            if not n:
                fail_line(f"--comm-kernel {text!r}: matches no kernel of the {len(ingested)} "
                          "trace file(s) ingested (they are in the store; it classified "
                          "nothing)", code=2)
    finally:
        con.close()


class ProgressBars:
    """Transient rich bars of bytes read, one file at a time, on stderr (a terminal only)."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.active = None

    def __call__(self, path: Path, size: int) -> Callable[[int], None]:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TransferSpeedColumn,
        )

        self.stop()
        prog = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), transient=True, console=self.console)
        self.active = prog
        task = prog.add_task(printable(path_text(path.name)), total=size or None)
        prog.start()

        def update(done: int) -> None:
            prog.update(task, completed=done)
            if size and done >= size:
                self.stop()

        return update

    def stop(self) -> None:
        if self.active is not None:
            self.active.stop()
            self.active = None
