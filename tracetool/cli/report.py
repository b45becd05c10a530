"""``tracetool report``: a job's summary in the terminal, plus Markdown and HTML with charts."""

from __future__ import annotations

from pathlib import Path

import click
import duckdb

from tracetool.analysis.charts import ChartError
from tracetool.analysis.connect import open_job
from tracetool.analysis.per_rank import RankTaskError, gather_on_ray
from tracetool.analysis.report import first_line, make_report, to_json
from tracetool.analysis.windows import use_windows
from tracetool.analysis.workbook import write_workbook
from tracetool.cli._errors import fail_line
from tracetool.cli._job import window_options, windows_of
from tracetool.cli._store import store_arg
from tracetool.errors import InputError, StoreError
from tracetool.outputs import OutputError, check_output


@click.command("report", short_help="Summarise a job: text or JSON, plus Markdown and "
                                           "HTML with charts.")
@click.argument("store", type=store_arg())
@click.option("--out", type=click.Path(path_type=Path, file_okay=False),
              default=Path("tracetool-report"), show_default=True,
              help="Directory for report.md, report.html and the PNG charts (created).")
@click.option("--job", help="Job to report on (needed when the store holds several).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as one JSON object instead of text.")
@window_options
@click.option("--include-incomplete", is_flag=True,
              help="Also the incomplete steps (cut by the trace window, open, or missing on "
                   "some ranks; docs/steps.md) in the statistics and the critical path.")
@click.option("--xlsx", is_flag=True,
              help="Also write report.xlsx: a sheet per table of the summary (the records "
                   "--json prints), numbers as numbers, times in ms, units in the headers.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="ray: the per-rank analyses (step breakdown, kernel and op summaries) as "
                   "one Ray task per rank on the cluster RAY_ADDRESS names (else a local one).")
def report_command(store: Path | str, out: Path, job: str | None, as_json: bool,
                   annotation: str | None, instance: int | None, window: str | None,
                   include_incomplete: bool, xlsx: bool, executor: str) -> None:
    """Summarise one job of STORE: step times per rank, where a step goes (compute, exposed
    communication, memcpy, idle), the top kernels (top CPU ops for a CPU-only job), the
    collectives and how long ranks waited at them, and the critical path when
    tracetool.analysis.critical_path can compute it.

    Exit code 0 on success, 1 when the store or job cannot be read, 2 for an annotation or
    window that selects nothing (one line on stderr)."""
    try:
        check_output(out, "--out", [store], directory=True)
        windows = windows_of(annotation, instance, window)
        con, job = open_job(store, job)
    except (StoreError, OutputError) as err:
        fail_line(str(err))
    except InputError as err:
        fail_line(str(err), code=2)
    # Closed here rather than left to garbage collection: a DuckDB connection that lingers
    # in a reference cycle crashes forked processes (ingest's workers) that collect it.
    with con:
        try:
            use_windows(con, job, windows)
            tasks = gather_on_ray(con, store, job, windows) if executor == "ray" else None
            report = make_report(con, job, out, store=store,
                                 include_incomplete=include_incomplete, windows=windows.label)
            report.summary["per_rank_tasks"] = tasks  # Ray tasks of the per-rank analyses
            if xlsx:
                write_workbook(report.summary, out / "report.xlsx")
                report.summary["files"]["xlsx"] = str(out / "report.xlsx")
        except InputError as err:
            fail_line(str(err), code=2)
        except (duckdb.Error, OSError) as err:
            fail_line(f"{store}: {first_line(err)}")
        except RankTaskError as err:
            fail_line(f"{store}: {err}")
        except ChartError as err:
            fail_line(f"{out}: a chart could not be drawn: {first_line(err)}")
    click.echo(to_json(report.summary) if as_json else report.text(), nl=as_json)
    for warning in report.summary.get("warnings", []):  # also in the report and its JSON
        click.echo(f"tracetool: warning: {warning}", err=True)

