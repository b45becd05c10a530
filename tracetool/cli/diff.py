"""``tracetool diff``: what changed between two stores, and regression gates on it."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click
import duckdb

from tracetool.analysis.connect import open_job
from tracetool.analysis.diff import (
    METRICS,
    MetricUnavailable,
    Threshold,
    check,
    diff_jobs,
    render_text,
)
from tracetool.analysis.report import first_line
from tracetool.cli._errors import fail_line
from tracetool.cli._numbers import Int
from tracetool.cli._store import store_arg
from tracetool.errors import StoreError

_HELP = """Compare job A (STORE_A, the baseline) with job B (STORE_B): per CPU op and per GPU
kernel/copy, the change of count, total and mean time (largest change of total time first),
and three per-step metrics over the complete steps (docs/steps.md):

{metrics}

Exit code 0, or 1 when a --fail-if threshold is crossed (each printed on stderr) or a store
cannot be read; 2 for a malformed --fail-if expression."""


@click.command("diff", short_help="Compare two stores: per-op and per-kernel changes, "
                                       "regression gates.",
               # the metrics as analysis.diff defines them: one text, not a second copy
               help=_HELP.format(metrics="\n\n".join(f"{k}: {v}." for k, v in METRICS.items())))
@click.argument("store_a", type=store_arg())
@click.argument("store_b", type=store_arg())
@click.option("--job-a", help="Job of STORE_A (needed when it holds several).")
@click.option("--job-b", help="Job of STORE_B (needed when it holds several).")
@click.option("--fail-if", "fail_if", multiple=True, metavar="EXPR",
              help="Exit 1 when B's metric moved past a threshold from A's: step_time, "
                   "kernel_time or comm_time, then > or <, then a change like +5% or an "
                   "absolute one like +2ms. Repeat for several.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--top", type=Int(0, None), default=20, show_default=True,
              help="Rows of each per-name table (0: all).")
def diff_command(store_a: Path | str, store_b: Path | str, job_a: str | None, job_b: str | None,
                 fail_if: tuple[str, ...], as_json: bool, top: int) -> None:
    """The diff command (its help is _HELP, with analysis.diff.METRICS)."""
    try:
        thresholds = [Threshold.parse(t) for t in fail_if]
    except ValueError as err:
        click.echo(f"tracetool: error: {err}", err=True)
        sys.exit(2)
    # Connections are closed here rather than left to garbage collection: one that lingers
    # in a reference cycle crashes forked processes (ingest's workers) that collect it.
    with contextlib.ExitStack() as stack:
        try:
            con_a, job_a = open_job(store_a, job_a)
            stack.callback(con_a.close)
            con_b, job_b = open_job(store_b, job_b)
            stack.callback(con_b.close)
            result = diff_jobs(con_a, job_a, con_b, job_b, top=top or None)
            result["a"]["store"], result["b"]["store"] = str(store_a), str(store_b)
            checks = check(result, thresholds)
        except (StoreError, MetricUnavailable) as err:
            fail_line(str(err))
        except duckdb.Error as err:
            fail_line(first_line(err))
    result["checks"] = checks
    click.echo(json.dumps(result) if as_json else render_text(result, checks), nl=as_json)
    crossed = [c for c in checks if c["crossed"]]
    for c in crossed:
        click.echo(f"tracetool: fail-if crossed: {c['expr']}: {c['message']}", err=True)
    sys.exit(1 if crossed else 0)


