"""``tracetool sweep``: one built graph replayed over a grid of what-ifs."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

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
    PLACEMENT_HELP,
    base_scenario,
    bounds_options,
    parse_bounds,
    parse_whatifs,
    placed_scenario,
    placement_of,
    scenario_options,
    start_compiler,
)
from tracetool.errors import InputError
from tracetool.outputs import atomic_write, check_output
from tracetool.replay.alltoall import parse_expert_skew
from tracetool.replay.clocks import PowerCap, parse_gpu_clock, parse_power_cap
from tracetool.replay.graph import Bounds, job_ranks
from tracetool.replay.model import (
    check_dp_scale,
    check_expert_skew_changes,
    check_scenario,
    parse_cpu_speedup,
)
from tracetool.replay.network import MAX_WORLD
from tracetool.replay.plots import plot_sweep

T = TypeVar("T")


@click.command("sweep")
@click.argument("store", type=store_arg(file_okay=False))
@scenario_options
@bounds_options
@click.option("--network", "axes", multiple=True,
              help="A network axis key=v1,v2,... (e.g. inter_node_bw=25,50,100Gbit/s; one "
                   "key per --network, each value in its range as for replay --network); "
                   "repeat for a grid.")
@click.option("--placement", type=click.Path(dir_okay=False), help=PLACEMENT_HELP)
@click.option("--gpu", "gpus", help=f"GPUs to project onto, comma-separated (an axis), each "
                                     f"{GPU_HELP}.")
@click.option("--dp-scale", "dp_scales", help="Data-parallel scales, comma-separated (an axis), "
              f"each 1 to {MAX_WORLD} and projecting at most as many ranks as for replay.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=Path("sweep"),
              show_default=True, help="Directory for sweep.csv and sweep.png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def sweep_command(store: Path, job: str | None, source_gpu: str | None,
                  source_network: str | None, speedups: tuple[str, ...],
                  gpu_clock: str | None, power_cap: str | None, cpu_speedup: str | None,
                  expert_skew: str | None, expert_order: str | None,
                  include_incomplete: bool,
                  annotation: str | None, instance: int | None,
                  window: str | None, steps_range: str | None, ranks_spec: str | None,
                  axes: tuple[str, ...], placement: str | None, gpus: str | None,
                  dp_scales: str | None, out: Path, as_json: bool) -> None:
    """Evaluate a grid of settings against one built graph: a table (sweep.csv) and a PNG
    (sweep.png: the projected step time and its band; for one axis of up to 12 settings a
    bar per setting, stacked by compute / memcpy / exposed comm / idle; else curves along the
    first axis, a line per value of the second, a facet per value of the third; one axis's
    curve over the breakdown stacked as areas). The axes: --network (repeatable), --gpu,
    --dp-scale, --gpu-clock, --power-cap, --cpu-speedup and --expert-skew (several values,
    comma-separated; one value of the last four applies to every setting). The table has
    the power model's energy per step (J) beside the step times. --placement places the
    ranks for every setting (as for replay; not an axis).

    Exit code 0; 2 on a what-if that names or changes nothing: a --gpu entry or --source-gpu
    not in the catalog, a --speedup with an unknown category or one matching no GPU op of
    the job, a --gpu-clock or --power-cap that is bad for any GPU of the sweep, a
    --cpu-speedup out of range (or 1 alone) or on a job with no CPU work, an --expert-skew
    out of range or on a job with no all-to-all (as for replay), a bad --steps or
    --ranks (as for replay), a network axis value or --dp-scale outside its range (as for
    replay), an axis given twice, a value given twice in one; 1 on a bad store, job or
    other setting (one line on stderr)."""
    from tracetool.replay.run import Replayer
    from tracetool.replay.sweep import on_axis, parse_axes, sweep

    try:
        check_output(out, "--out", [store], directory=True)
        clocks = _values("--gpu-clock", gpu_clock, parse_gpu_clock)
        caps = _values("--power-cap", power_cap, parse_power_cap)
        cpus = _values("--cpu-speedup", cpu_speedup,
                       lambda v: parse_cpu_speedup(v, one_ok=len(cpu_speedup.split(",")) > 1))
        if expert_order is not None and expert_skew is None:
            raise InputError("--expert-order goes with --expert-skew")
        skews = _values("--expert-skew", expert_skew,
                        lambda v: parse_expert_skew(v, expert_order))
        fixed = {k: t for k, t, v in (("clock", gpu_clock, clocks), ("cap", power_cap, caps),
                                      ("cpu", cpu_speedup, cpus), ("skew", expert_skew, skews))
                 if not on_axis(v)}
        if not axes and gpus is None and dp_scales is None and len(fixed) == 4:
            raise InputError("nothing to sweep: give --network key=v1,v2,..., --gpu, "
                             "--dp-scale, or several --gpu-clock, --power-cap, --cpu-speedup "
                             "or --expert-skew values (--placement is not an axis)")
        scales = _dp_scales(dp_scales) if dp_scales is not None else None
        gpu_list = [g.strip() for g in gpus.split(",")] if gpus is not None else []
        parse_whatifs(source_gpu, speedups, tuple(gpu_list), fixed.get("clock"),
                      fixed.get("cap"), (source_network,), fixed.get("cpu"))
        placed = placement_of(placement, [k for k, _ in parse_axes(list(axes))])
        bounds = Bounds(*parse_bounds(steps_range, ranks_spec))
        windows = windows_of(annotation, instance, window)
        start_compiler()
        con, job = open_job(store, job)
        if scales:
            check_dp_scale(len(job_ranks(con, job)), max(scales))
        use_windows(con, job, windows)
        if not include_incomplete and (left_out := no_complete_steps(con, job)):
            warn_collectives(con, job)  # why, when it is the clocks
            raise click.ClickException(f"{store}: {left_out}")
        replayer = Replayer.from_store(con, job, bounds)
        base = base_scenario(replayer, source_gpu, source_network, speedups,
                             fixed.get("clock"), fixed.get("cap"), fixed.get("cpu"),
                             fixed.get("skew"), expert_order if "skew" in fixed else None)
        if base.expert_skew is not None:  # one skew for every setting: it must change one
            check_scenario(replayer.graph, base)
            check_expert_skew_changes(replayer.graph, base)
        if placed is not None:  # every setting on it (checked to change a priced edge)
            base = placed_scenario(replayer, base, placed)
            check_scenario(replayer.graph, base)  # a placement that changes nothing
        rows = sweep(replayer, base, list(axes), gpu_list or None, scales,
                     include_incomplete=include_incomplete,
                     gpu_clocks=clocks if on_axis(clocks) else None,
                     power_caps=caps if on_axis(caps) else None,
                     cpu_speedups=cpus if on_axis(cpus) else None,
                     expert_skews=skews if on_axis(skews) else None)
        warn_collectives(con, job)  # after the what-ifs were checked: a bad one is one line
        read, notes = replayer.selection(), replayer.graph.notes
        con.close()
        out.mkdir(parents=True, exist_ok=True)
        table, png = out / "sweep.csv", out / "sweep.png"
        _write_csv(rows, table)
        axis = " x ".join([a.split("=")[0] for a in axes] + (["gpu"] if gpu_list else [])
                          + (["dp_scale"] if scales else []) + [
                              k for k, v in (("gpu_clock", clocks), ("power_cap", caps),
                                             ("cpu_speedup", cpus),
                                             ("expert_skew", skews)) if on_axis(v)])
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
    click.echo(f"{'setting':40} {'measured ms':>12} {'projected ms':>13} {'band ms':>22} "
               f"{'energy J':>9}")
    for r in rows:
        band = f"[{r['low_ns'] / 1e6:.3f}, {r['high_ns'] / 1e6:.3f}]"
        energy = "" if r["energy_j"] is None else f"{r['energy_j']:.4g}"
        click.echo(f"{r['setting']:40} {r['measured_step_ns'] / 1e6:12.3f} "
                   f"{r['projected_step_ns'] / 1e6:13.3f} {band:>22} {energy:>9}")
    click.echo(f"wrote {table} and {png}")


# the power model's columns of sweep.csv (empty for a CPU job): the GPUs' SM clock, the
# power per GPU P(f), the energy of a (mean) step over the replayed GPUs (replay/clocks.py)
POWER_COLUMNS = ("gpu_clock_mhz", "gpu_power_w", "energy_j")


def _values(option: str, text: str | None, parse: Callable[[str], T]) -> list[T] | None:
    """A comma-separated option's values, each parsed by ``parse`` (its one-line errors),
    none twice (InputError); None when the option is not given."""
    if text is None:
        return None
    values = [parse(p.strip()) for p in text.split(",")]
    same = [(v.watts, v.tdp_fraction) if isinstance(v, PowerCap) else v for v in values]
    if len(set(same)) < len(same):  # 70% and 0.7 are one cap
        raise InputError(f"bad {option} {text!r}: a value is given twice")
    return values


def _dp_scales(text: str) -> list[int]:
    """--dp-scale's values: whole numbers 1 to MAX_WORLD, none twice (InputError)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and len(p) <= 12 and 1 <= int(p) <= MAX_WORLD
               for p in parts):
        raise InputError(f"bad --dp-scale {text!r}: whole numbers 1 to {MAX_WORLD}, "
                         "comma-separated")
    scales = [int(p) for p in parts]
    if len(set(scales)) < len(scales):
        raise InputError(f"bad --dp-scale {text!r}: a value is given twice")
    return scales


def _write_csv(rows: list[dict], path: Path) -> None:
    from tracetool.replay.run import BREAKDOWN

    with atomic_write(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["setting", "steps", "measured_step_ns", "projected_step_ns", "low_ns",
                    "high_ns", *[f"{k}_ns" for k in BREAKDOWN], "comm_ns", *POWER_COLUMNS])
        for r in rows:
            b = r["projected_breakdown_ns"]
            w.writerow([r["setting"], r["steps"], r["measured_step_ns"], r["projected_step_ns"],
                        r["low_ns"], r["high_ns"], *[b[k] for k in BREAKDOWN], b["comm_ns"],
                        *["" if r[k] is None else f"{r[k]:.6g}" for k in POWER_COLUMNS]])
