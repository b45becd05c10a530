"""``tracetool pack``: rebuild the packs of a store's jobs now (``tracetool/packs.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tracetool.cli._errors import fail_line
from tracetool.cli._store import store_arg
from tracetool.errors import StoreError, job_problem
from tracetool.ingest.packs import refresh_pack
from tracetool.ingest.store import Store
from tracetool.objstore import is_object_store
from tracetool.packs import PACK_MIN_RANKS
from tracetool.signals import Interrupted, interruptible


@click.command("pack", short_help="Compact a job's tables into its pack now.")
@click.argument("store", type=store_arg())
@click.option("--job", "jobs", multiple=True,
              help="The job to pack (repeatable; default: every job of the store).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per job.")
def pack_command(store: Path | str, jobs: tuple[str, ...], as_json: bool) -> None:
    """Rebuild the pack of each job of STORE whose pack is missing or stale.

    Ingest builds a job's pack itself (jobs of 32 ranks or more) unless only a few of its
    ranks changed since the last one; this builds it whatever changed, e.g. after a job was
    ingested a rank at a time. Exit code 0; 1 on a path that is not a store, a store that is
    not a local directory store or a job it does not hold (one line on stderr)."""
    if is_object_store(store):
        fail_line(f"{store}: object stores are not packed")
    s = Store(store)
    if not s.data.is_dir():  # as every reader says it
        fail_line(f"{store}: not a tracetool store (no data/ directory)")
    have = sorted(p.name[4:] for p in s.data.glob("job=*"))
    for job in jobs:
        if problem := job_problem(store, have, job):
            fail_line(problem)
    try:
        with interruptible():
            s.check_format()
            for job in jobs or have:
                status, changed, n = refresh_pack(s, job, force=True)
                if as_json:
                    click.echo(json.dumps({"job": job, "status": status, "ranks": n}))
                else:
                    click.echo(f"job {job}: {_say(status, n)}")
    except StoreError as err:
        fail_line(f"{store}: {err}")
    except Interrupted as err:
        fail_line(f"interrupted by {err}; the packs built so far are in place", err.exit_code)


def _say(status: str, n: int) -> str:
    return {"built": f"packed ({n} ranks)", "current": f"pack up to date ({n} ranks)",
            "small": f"{n} ranks: not packed (fewer than {PACK_MIN_RANKS})",
            "stale": "not packed: its ranks changed while it was built; run again"}[status]

