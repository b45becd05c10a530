"""``tracetool report``: a job's summary in the terminal, plus Markdown and HTML with charts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import duckdb

from tracetool.analysis.charts import ChartError
from tracetool.analysis.connect import open_job
from tracetool.analysis.per_rank import RankTaskError, gather_on_ray
from tracetool.analysis.report import first_line, links_summary, make_report, to_json
from tracetool.analysis.windows import no_complete_steps, use_windows
from tracetool.analysis.workbook import write_workbook
from tracetool.cli._errors import fail_for, fail_line
from tracetool.cli._job import window_options, windows_of
from tracetool.cli._store import store_arg
from tracetool.cli.replay import (
    NETWORK_HELP,
    PLACEMENT_HELP,
    SOURCE_NETWORK_HELP,
    _spec,
    base_scenario,
    listing_where,
    network_scenario,
    parse_whatifs,
    placement_of,
)
from tracetool.errors import InputError, StoreError, one_line
from tracetool.outputs import OutputError, check_output
from tracetool.replay import model
from tracetool.replay.network import parse_spec
from tracetool.replay.placement import Placement


def has_collectives(con: duckdb.DuckDBPyConnection, job: str) -> bool:
    return bool(con.execute("SELECT EXISTS (SELECT 1 FROM collective_ranks WHERE job = ?)",
                            [job]).fetchone()[0])


def collective_links(con: duckdb.DuckDBPyConnection, store: Path | str, job: str,
                     source_network: str | None, network: str | None,
                     placed: Placement | None, include_incomplete: bool) -> dict[str, Any] | None:
    """The report's collectives by link: replay's listing (``collective_listing``, the one
    home of it, so the report and ``replay --json`` agree) on the job's placement, as
    measured, or projected under --network / --placement (checked as replay checks them:
    InputError, or ClickException for a job replay cannot step). None for a job without
    collectives and no what-if."""
    from tracetool.replay.run import Replayer, collective_listing

    whatif = network is not None or placed is not None
    if not whatif and not has_collectives(con, job):
        return None
    if not include_incomplete and (left_out := no_complete_steps(con, job)):
        if whatif:
            raise click.ClickException(f"{store}: {left_out}")
        return links_summary(None, "", reason=left_out)
    replayer = Replayer.from_store(con, job)
    sc = network_scenario(replayer, base_scenario(replayer, None, source_network, ()),
                          network, placed)
    result = None  # as measured: the listing of the measured timeline, nothing simulated
    if whatif:
        model.check_scenario(replayer.graph, sc)  # a what-if that changes nothing: exit 2
        model.check_network_changes(replayer.graph, sc)
        result = replayer.run(sc, critical_path=False, include_incomplete=include_incomplete)
    return links_summary(collective_listing(replayer, sc, result, include_incomplete),
                         listing_where(replayer, sc), whatif, network)


def measured_links(con: duckdb.DuckDBPyConnection, store: Path | str, job: str,
                   source_network: str | None, include_incomplete: bool
                   ) -> dict[str, Any] | None:
    """``collective_links`` as measured, on its own cursor (run on a thread beside the
    report's queries). A job replay cannot read leaves the section unavailable, saying
    why, rather than failing the report (as the critical path's chart does)."""
    with con.cursor() as cur:
        try:
            return collective_links(cur, store, job, source_network, None, None,
                                    include_incomplete)
        except Exception as err:  # the report stands without this section
            return links_summary(None, "", reason=f"replay cannot read the job: "
                                                  f"{one_line(err)}")


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
@click.option("--source-network", help=SOURCE_NETWORK_HELP + " The collectives by link "
              "section reads the links on its placement.")
@click.option("--network", help=NETWORK_HELP + " The collectives by link section then "
              "shows each one's projected transfer and exposed time (as replay --json).")
@click.option("--placement", type=click.Path(dir_okay=False), help=PLACEMENT_HELP)
def report_command(store: Path | str, out: Path, job: str | None, as_json: bool,
                   annotation: str | None, instance: int | None, window: str | None,
                   include_incomplete: bool, xlsx: bool, executor: str,
                   source_network: str | None, network: str | None,
                   placement: str | None) -> None:
    """Summarise one job of STORE: step times per rank, where a step goes (compute, exposed
    communication, memcpy, idle), the top kernels (top CPU ops for a CPU-only job), the
    collectives and how long ranks waited at them, which collectives cross which links
    (replay's listing: per kind and group, its links, bytes, transfer and exposed time;
    projected under --network / --placement, as replay takes them), and the critical path
    when tracetool.analysis.critical_path can compute it.

    Exit code 0 on success, 1 when the store or job cannot be read, 2 for an annotation or
    window that selects nothing, or a --network / --placement replay would refuse (one line
    on stderr)."""
    try:
        check_output(out, "--out", [store], directory=True)
        windows = windows_of(annotation, instance, window)
        parse_whatifs(None, (), networks=(source_network, network))
        placed = placement_of(placement, list(parse_spec(_spec(network))) if network else [])
        con, job = open_job(store, job)
    except (StoreError, OutputError) as err:
        fail_line(str(err))
    except InputError as err:
        fail_line(str(err), code=2)
    except ValueError as err:  # a network file that cannot be read
        fail_for(store, err)
    # Closed here rather than left to garbage collection: a DuckDB connection that lingers
    # in a reference cycle crashes forked processes (ingest's workers) that collect it.
    with con, ThreadPoolExecutor(1) as pool:
        try:
            use_windows(con, job, windows)
            if network is not None or placed is not None:  # checked before anything is drawn
                links = collective_links(con, store, job, source_network, network, placed,
                                         include_incomplete)
                get_links = lambda: links  # noqa: E731
            elif source_network is not None and not has_collectives(con, job):
                raise InputError(f"--source-network: job {job} has no collective whose "
                                 "links it would place: it changes nothing")
            else:  # as measured: replayed on a thread while the report's queries run
                get_links = pool.submit(measured_links, con, store, job, source_network,
                                        include_incomplete).result
            tasks = gather_on_ray(con, store, job, windows) if executor == "ray" else None
            report = make_report(con, job, out, store=store,
                                 include_incomplete=include_incomplete, windows=windows.label,
                                 collective_links=get_links)
            report.summary["per_rank_tasks"] = tasks  # Ray tasks of the per-rank analyses
            if xlsx:
                write_workbook(report.summary, out / "report.xlsx")
                report.summary["files"]["xlsx"] = str(out / "report.xlsx")
        except InputError as err:
            fail_line(str(err), code=2)
        except click.ClickException as err:
            fail_line(err.message)
        except (duckdb.Error, OSError, ValueError) as err:
            fail_line(f"{store}: {first_line(err)}")
        except RankTaskError as err:
            fail_line(f"{store}: {err}")
        except ChartError as err:
            fail_line(f"{out}: a chart could not be drawn: {first_line(err)}")
    click.echo(to_json(report.summary) if as_json else report.text(), nl=as_json)
    for warning in report.summary.get("warnings", []):  # also in the report and its JSON
        click.echo(f"tracetool: warning: {warning}", err=True)

