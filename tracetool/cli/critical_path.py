"""``tracetool critical-path``: the chain of work that set each step's time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import duckdb

from tracetool.analysis.chrome_trace import write_path_trace
from tracetool.analysis.critical_path import critical_path
from tracetool.cli._job import open_job


@click.command("critical-path")
@click.argument("store", type=click.Path(path_type=Path, file_okay=False))
@click.option("--job", help="Job (needed when the store holds several).")
@click.option("--step", type=int, help="One ProfilerStep (default: every complete step).")
@click.option("--include-incomplete", is_flag=True,
              help="Also the incomplete steps (cut by the trace window, open, or missing on "
                   "some ranks; docs/steps.md).")
@click.option("--chrome-trace", "chrome", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the events and the path as a Chrome trace (open in Perfetto).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def critical_path_command(store: Path, job: str | None, step: int | None,
                          include_incomplete: bool, chrome: Path | None, as_json: bool) -> None:
    """Compute the critical path of each step across threads, streams and ranks, and
    summarise it by kind (compute, comm, memcpy, launch_overhead, cpu, idle_wait) and by rank.

    Exit code 0, or 1 when the store, job or step cannot be read (one line on stderr)."""
    try:
        con, job = open_job(store, job)
        if step is not None and not con.execute(
                "SELECT 1 FROM steps WHERE job = ? AND step = ?", [job, step]).fetchone():
            raise click.ClickException(f"{store}: job {job} has no ProfilerStep#{step}")
        rel = critical_path(con, job, step, include_incomplete=include_incomplete)
        cols = rel.columns
        segs = [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]
        written = write_path_trace(con, job, segs, chrome) if chrome else None
        con.close()
    except click.ClickException as err:
        click.echo(f"tracetool: error: {err.message}", err=True)
        sys.exit(1)
    except (duckdb.Error, FileNotFoundError, OSError, ValueError) as err:
        click.echo(f"tracetool: error: {store}: {str(err).strip().splitlines()[0]}", err=True)
        sys.exit(1)
    report = summarize(job, segs)
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


def summarize(job: str, segs: list[dict]) -> dict:
    """Per step: path length, time by kind and by rank, segments, rank changes."""
    steps: dict = {}
    for s in segs:
        st = steps.setdefault(s["step"], {"step": s["step"], "start_ns": s["start_ns"],
                                          "end_ns": s["end_ns"], "segments": 0,
                                          "rank_changes": 0, "by_kind": {}, "by_rank": {},
                                          "_last": s["rank"]})
        st["start_ns"] = min(st["start_ns"], s["start_ns"])
        st["end_ns"] = max(st["end_ns"], s["end_ns"])
        st["segments"] += 1
        st["by_kind"][s["kind"]] = st["by_kind"].get(s["kind"], 0) + s["dur_ns"]
        key = str(s["rank"])
        st["by_rank"][key] = st["by_rank"].get(key, 0) + s["dur_ns"]
        if s["rank"] is not None and st["_last"] is not None and s["rank"] != st["_last"]:
            st["rank_changes"] += 1
        st["_last"] = s["rank"] if s["rank"] is not None else st["_last"]
    out = []
    for st in steps.values():
        st.pop("_last")
        st["dur_ns"] = st["end_ns"] - st["start_ns"]
        out.append(st)
    return {"job": job, "steps": out}
