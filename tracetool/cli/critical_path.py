"""``tracetool critical-path``: the chain of work that set each step's time."""

from __future__ import annotations

import json
from pathlib import Path

import click
import duckdb

from tracetool.analysis.chrome_trace import write_path_trace
from tracetool.analysis.collectives import job_missing_ranks_note, warn_collectives
from tracetool.analysis.connect import open_job
from tracetool.analysis.critical_path import (
    critical_path,
    unexplained_gap_warning,
    unresolved_stream_wait_warning,
)
from tracetool.analysis.windows import use_windows
from tracetool.cli._errors import fail_for
from tracetool.cli._job import window_options, windows_of
from tracetool.cli._numbers import Int
from tracetool.cli._store import store_arg
from tracetool.errors import InputError
from tracetool.outputs import check_output
from tracetool.schema import MAX_STEP


@click.command("critical-path")
@click.argument("store", type=store_arg(file_okay=False))
@click.option("--job", help="Job (needed when the store holds several).")
@click.option("--step", type=Int(0, MAX_STEP),
              help="One ProfilerStep (default: every complete step).")
@click.option("--include-incomplete", is_flag=True,
              help="Also the incomplete steps (cut by the trace window, open, or missing on "
                   "some ranks; docs/steps.md).")
@window_options
@click.option("--chrome-trace", "chrome", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the events and the path as a Chrome trace (open in Perfetto).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--segments", is_flag=True,
              help="With --json: each step's segments too, as 'path' (the view critical_path's "
                   "columns, in path order).")
def critical_path_command(store: Path | str, job: str | None, step: int | None,
                          include_incomplete: bool, annotation: str | None,
                          instance: int | None, window: str | None, chrome: Path | None,
                          as_json: bool, segments: bool) -> None:
    """Compute the critical path of each step across threads, streams and ranks, and
    summarise it by kind (compute, comm, memcpy, launch_overhead, cpu, idle_wait,
    unexplained_gap) and by rank.

    Exit code 0; 1 when the store or job cannot be read; 2 for a --step the job does not
    have, a number outside its range (--help) or an annotation or window that selects
    nothing (one line on stderr)."""
    if segments and not as_json:
        raise click.UsageError("--segments needs --json")
    try:
        if chrome is not None:
            check_output(chrome, "--chrome-trace", [store])
        windows = windows_of(annotation, instance, window)
        con, job = open_job(store, job)
        use_windows(con, job, windows)
        missing = job_missing_ranks_note(con, job)  # one rank of many: said once
        if missing:
            click.echo(f"tracetool: warning: {missing}", err=True)
        warnings = [w for w in [missing] if w] + warn_collectives(con, job)
        if step is not None and not con.execute(
                "SELECT 1 FROM steps WHERE job = ? AND step = ?", [job, step]).fetchone():
            raise InputError(f"{store}: job {job} has no ProfilerStep#{step}")
        rel = critical_path(con, job, step, include_incomplete=include_incomplete,
                            names=chrome is not None or segments)  # only they use names
        report = summarize(job, rel)
        if segments:
            attach_segments(report, rel)
        for note in (unexplained_gap_warning(rel), unresolved_stream_wait_warning(con, job)):
            if note:
                click.echo(f"tracetool: warning: {note}", err=True)
                warnings.append(note)
        written = None
        if chrome:
            written = write_path_trace(con, job, rel.to_arrow_table(), chrome)
        con.close()
    except (click.ClickException, duckdb.Error, OSError, ValueError) as err:
        fail_for(store, err)
    report["warnings"] = warnings
    if chrome:
        report["chrome_trace"] = {"path": str(chrome), "events": written}
    if as_json:
        click.echo(json.dumps(report))
        return
    for s in report["steps"]:
        head = f"step {s['step']}" if s["step"] is not None else "trace"
        click.echo(f"{head}: {s['dur_ns'] / 1e6:.3f} ms on the critical path, "
                   f"{s['segments']} segments, {s['rank_changes']} rank changes")
        for k, v in sorted(s["by_kind"].items(), key=lambda kv: -kv[1]):
            click.echo(f"  {k:16} {v / 1e6:10.3f} ms  {100 * v / s['dur_ns']:5.1f}%")
        ranks = ", ".join(f"{r}: {v / 1e6:.3f} ms" for r, v in sorted(s["by_rank"].items()))
        click.echo(f"  by rank: {ranks}")
    if chrome:
        click.echo(f"wrote {chrome} ({written} events): open it in https://ui.perfetto.dev")


# Per step of a path relation (``critical_path()``'s rows, ordered by step and seq): its
# extent, segments, the times by kind and by rank (each list in order of first appearance on
# the path), and how often consecutive segments change rank (segments with no rank, idle
# filler, are skipped over: the change is counted between the ranks on either side).
_SUMMARY_SQL = """
WITH p AS (
    SELECT step, seq, rank, kind, start_ns, end_ns, dur_ns,
           last_value(rank IGNORE NULLS) OVER (PARTITION BY step ORDER BY seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_rank
    FROM _cp_path),
steps AS (
    SELECT step, min(start_ns) AS start_ns, max(end_ns) AS end_ns, count(*) AS segments,
           count(*) FILTER (WHERE rank <> prev_rank) AS rank_changes
    FROM p GROUP BY step),
by_kind AS (
    SELECT step, list(struct_pack(k := kind, ns := ns) ORDER BY first) AS by_kind
    FROM (SELECT step, kind, min(seq) AS first, sum(dur_ns)::BIGINT AS ns FROM p GROUP BY ALL)
    GROUP BY step),
by_rank AS (
    SELECT step, list(struct_pack(k := coalesce(rank::VARCHAR, 'None'), ns := ns)
                      ORDER BY first) AS by_rank
    FROM (SELECT step, rank, min(seq) AS first, sum(dur_ns)::BIGINT AS ns FROM p GROUP BY ALL)
    GROUP BY step)
SELECT s.step, s.start_ns, s.end_ns, s.segments, s.rank_changes, k.by_kind, r.by_rank
FROM steps s
JOIN by_kind k ON k.step IS NOT DISTINCT FROM s.step
JOIN by_rank r ON r.step IS NOT DISTINCT FROM s.step
ORDER BY s.step NULLS LAST
"""


def attach_segments(report: dict, path: duckdb.DuckDBPyRelation) -> None:
    """Put each step's segments under its step in ``report`` as ``path``: dicts of the view
    critical_path's columns but job and step, in path order (``segments`` is their count)."""
    cols = [c for c in path.columns if c not in ("job", "step")]
    by_step: dict[int | None, list[dict]] = {}
    for row in path.select(", ".join(["step", *cols])).order("step, seq").fetchall():
        by_step.setdefault(row[0], []).append(dict(zip(cols, row[1:], strict=True)))
    for s in report["steps"]:
        s["path"] = by_step.get(s["step"], [])


def summarize(job: str, path: duckdb.DuckDBPyRelation) -> dict:
    """Per step: path extent and length, time by kind and by rank, segments, rank changes;
    one aggregate query over the path relation, not its rows."""
    steps = []
    for step, start, end, n, changes, by_kind, by_rank in path.query(
            "_cp_path", _SUMMARY_SQL).fetchall():
        steps.append({"step": step, "start_ns": start, "end_ns": end, "segments": n,
                      "rank_changes": changes,
                      "by_kind": {d["k"]: d["ns"] for d in by_kind},
                      "by_rank": {d["k"]: d["ns"] for d in by_rank},
                      "dur_ns": end - start})
    return {"job": job, "steps": steps}
