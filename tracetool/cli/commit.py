"""``tracetool commit``: publish what the shards of a job staged (``ingest --shard I/N``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tracetool.cli._errors import fail_line
from tracetool.cli._store import store_arg
from tracetool.errors import StoreError
from tracetool.ingest.options import FileResult
from tracetool.ingest.shard import CommitProblem, commit_job
from tracetool.ingest.store import Store
from tracetool.objstore import is_object_store
from tracetool.signals import Interrupted, interruptible


@click.command("commit", short_help="Publish the shards of a job staged by ingest --shard.")
@click.argument("store", type=store_arg())
@click.option("--job", required=True, help="The job whose staged shards to publish.")
@click.option("--force", is_flag=True,
              help="Replace ranks the store already holds with other content.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per file.")
def commit_command(store: Path | str, job: str, force: bool, as_json: bool) -> None:
    """Publish every rank the shards of JOB staged in STORE, once all N shards finished.

    Nothing is published when a shard is missing (not run, still running, or killed), a
    rank is staged by two files, or a rank clashes with what the store holds (unless
    --force). Exit code 0 when every staged rank was published (or skipped: already in the
    store), 1 otherwise (one line on stderr)."""
    if is_object_store(store):
        fail_line(f"{store}: nothing to commit: an object store takes no --shard (each ingest's "
              "rank commits are atomic and concurrent ones merge)")
    s = Store(store)
    if not (s.root / "staging").is_dir():
        fail_line(f"{store}: nothing staged (no staging/ directory): run `tracetool ingest ... "
              f"--store {store} --job {job} --shard I/N` first")
    failed = False

    def report(r: FileResult) -> None:  # as each rank is published (commit_job's tell)
        nonlocal failed
        failed |= r.status == "error"
        if as_json:
            click.echo(json.dumps(r.as_json()))
        elif r.status == "error":
            click.echo(f"tracetool: error: {r.path}: {r.message}", err=True)
        else:
            click.echo(f"{r.status} {r.path} -> job {r.job} rank {r.rank}"
                       + (f": {r.message}" if r.message else ""))

    try:
        with interruptible():
            s.check_format()
            commit_job(s, job, force, tell=report)
    except (CommitProblem, StoreError) as err:
        fail_line(f"{store}: {err}")
    except Interrupted as err:
        fail_line(f"interrupted by {err}; the ranks reported above are in the store, the "
                  "others are still staged: commit again", err.exit_code)
    sys.exit(1 if failed else 0)

