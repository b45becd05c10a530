"""``tracetool sweep``: one built graph replayed over a grid of what-ifs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import click
import duckdb

from tracetool.analysis.collectives import warn_collectives
from tracetool.analysis.connect import open_job
from tracetool.analysis.windows import no_complete_steps, use_windows
from tracetool.cli._errors import fail_for
from tracetool.cli._job import windows_of
from tracetool.cli._store import store_arg
from tracetool.cli.replay import (
    GPU_HELP,
    base_scenario,
    bounds_options,
    parse_bounds,
    parse_whatifs,
    scenario_options,
    start_compiler,
)
from tracetool.outputs import atomic_write, check_output
from tracetool.replay.graph import Bounds
from tracetool.replay.plots import plot_sweep


@click.command("sweep")
@click.argument("store", type=store_arg(file_okay=False))
@scenario_options
@bounds_options
@click.option("--network", "axes", multiple=True,
              help="A network axis key=v1,v2,... (e.g. inter_node_bw=25,50,100Gbit/s); "
                   "repeat for a grid.")
@click.option("--gpu", "gpus", help=f"GPUs to project onto, comma-separated (an axis), each "
                                     f"{GPU_HELP}.")
@click.option("--dp-scale", "dp_scales", help="Data-parallel scales, comma-separated (an axis).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=Path("sweep"),
              show_default=True, help="Directory for sweep.csv and sweep.png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def sweep_command(store: Path, job: str | None, source_gpu: str | None,
                  source_network: str | None, speedups: tuple[str, ...],
                  gpu_clock: str | None, power_cap: str | None, include_incomplete: bool,
                  annotation: str | None, instance: int | None,
                  window: str | None, steps_range: str | None, ranks_spec: str | None,
                  axes: tuple[str, ...], gpus: str | None,
                  dp_scales: str | None, out: Path, as_json: bool) -> None:
    """Evaluate a grid of settings against one built graph: a table (sweep.csv) and a PNG
    (sweep.png: the projected step time and its band; for one axis of up to 12 settings a
    bar per setting, stacked by compute / memcpy / exposed comm / idle; else curves along the
    first axis, a line per value of the second, a facet per value of the third).

    Exit code 0; 2 on a what-if that names or changes nothing: a --gpu entry or --source-gpu
    not in the catalog, a --speedup with an unknown category or one matching no GPU op of
    the job, a --gpu-clock or --power-cap that is bad for any GPU of the sweep (they apply to
    every setting), a bad --steps or --ranks (as for replay); 1 on a bad store, job or
    other setting (one line on stderr)."""
    from tracetool.replay.run import Replayer
    from tracetool.replay.sweep import sweep

    try:
        check_output(out, "--out", [store], directory=True)
        if not axes and not gpus and not dp_scales:
            raise click.ClickException("nothing to sweep: give --network key=v1,v2,..., "
                                       "--gpu or --dp-scale")
        scales = None
        if dp_scales:
            try:
                scales = [int(x) for x in dp_scales.split(",")]
            except ValueError:
                scales = [0]
            if min(scales) < 1:
                raise click.ClickException(f"bad --dp-scale {dp_scales!r}: integers >= 1")
        gpu_list = [g.strip() for g in gpus.split(",")] if gpus else []
        parse_whatifs(source_gpu, speedups, tuple(gpu_list), gpu_clock, power_cap)
        bounds = Bounds(*parse_bounds(steps_range, ranks_spec))
        windows = windows_of(annotation, instance, window)
        start_compiler()
        con, job = open_job(store, job)
        use_windows(con, job, windows)
        if not include_incomplete and (left_out := no_complete_steps(con, job)):
            warn_collectives(con, job)  # why, when it is the clocks
            raise click.ClickException(f"{store}: {left_out}")
        replayer = Replayer.from_store(con, job, bounds)
        base = base_scenario(replayer, source_gpu, source_network, speedups, gpu_clock,
                             power_cap)
        rows = sweep(replayer, base, list(axes), gpu_list or None, scales,
                     include_incomplete=include_incomplete)
        warn_collectives(con, job)  # after the what-ifs were checked: a bad one is one line
        read, notes = replayer.selection(), replayer.graph.notes
        con.close()
        out.mkdir(parents=True, exist_ok=True)
        table, png = out / "sweep.csv", out / "sweep.png"
        _write_csv(rows, table)
        axis = " x ".join([a.split("=")[0] for a in axes] + (["gpu"] if gpus else [])
                          + (["dp_scale"] if dp_scales else []))
        plot_sweep(rows, axis, png)
    except (click.ClickException, duckdb.Error, OSError, ValueError) as err:
        fail_for(store, err)
    if as_json:
        click.echo(json.dumps({"job": job, "bounds": read, "notes": notes, "rows": rows,
                               "csv": str(table), "png": str(png)}))
        return
    click.echo(f"job {job}: {len(rows)} settings, one graph")
    for note in notes:
        click.echo(f"note: {note}")
    click.echo(f"{'setting':40} {'measured ms':>12} {'projected ms':>13} {'band ms':>22}")
    for r in rows:
        band = f"[{r['low_ns'] / 1e6:.3f}, {r['high_ns'] / 1e6:.3f}]"
        click.echo(f"{r['setting']:40} {r['measured_step_ns'] / 1e6:12.3f} "
                   f"{r['projected_step_ns'] / 1e6:13.3f} {band:>22}")
    click.echo(f"wrote {table} and {png}")


def _write_csv(rows: list[dict], path: Path) -> None:
    from tracetool.replay.run import BREAKDOWN

    with atomic_write(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["setting", "steps", "measured_step_ns", "projected_step_ns", "low_ns",
                    "high_ns", *[f"{k}_ns" for k in BREAKDOWN], "comm_ns"])
        for r in rows:
            b = r["projected_breakdown_ns"]
            w.writerow([r["setting"], r["steps"], r["measured_step_ns"], r["projected_step_ns"],
                        r["low_ns"], r["high_ns"], *[b[k] for k in BREAKDOWN], b["comm_ns"]])
