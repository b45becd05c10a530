"""``tracetool replay``: the step time on other hardware or another network."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click
import duckdb

from tracetool.analysis.collectives import warn_collectives
from tracetool.analysis.connect import open_job
from tracetool.analysis.windows import no_complete_steps, use_windows
from tracetool.cli._errors import fail_for
from tracetool.cli._job import window_options, windows_of
from tracetool.cli._numbers import Int
from tracetool.cli._store import store_arg
from tracetool.errors import InputError
from tracetool.hardware import Gpu, catalog_help
from tracetool.outputs import check_output
from tracetool.replay import model
from tracetool.replay.alltoall import MAX_ZIPF, parse_expert_skew
from tracetool.replay.clocks import GpuPower, parse_gpu_clock, parse_power_cap
from tracetool.replay.compute import CATEGORIES, SPEEDUP_RANGE, WhatIfError, parse_speedup
from tracetool.replay.graph import (
    Bounds,
    NoSuchSteps,
    RankRanges,
    job_ranks,
    parse_ranks,
    parse_steps,
)
from tracetool.replay.model import (
    CPU_SPEEDUP_RANGE,
    MAX_GLOO_WORLD,
    Scenario,
    check_dp_scale,
    check_speedups,
    parse_cpu_speedup,
    resolve_gpu,
)
from tracetool.replay.network import (
    MAX_WORLD,
    Network,
    check_placement_spec,
    parse_network,
    parse_spec,
)
from tracetool.replay.pipeline import MAX_MICROBATCHES, SCHEDULES, render, run_pipeline
from tracetool.replay.placement import Placement, read_placement
from tracetool.schema import MAX_STEP

if TYPE_CHECKING:
    from tracetool.replay.run import Replayer


def _spec(text: str) -> str:
    """A network spec given inline or as a TOML file."""
    path = Path(text)
    if path.suffix == ".toml" or (path.is_file() and "=" not in text):
        try:
            return path.read_text()
        except OSError as err:
            raise ValueError(f"cannot read network file {text}: {err.strerror}") from None
    return text


GPU_HELP = catalog_help()  # built from tracetool/gpus/*.toml

PLACEMENT_HELP = ("Place the ranks for the projection: a CSV file with the header "
                  "rank,node,datacenter (one line per rank) or a TOML file ([nodes] name = "
                  "[ranks], [datacenters] name = [nodes]); each rank of the job once, a node "
                  "in one datacenter. Instead of --network's gpus_per_node / ranks_per_dc "
                  "(contiguous blocks).")

SOURCE_NETWORK_HELP = ("Network the trace ran on: key=value,... or a TOML file, values as for "
                       "replay --network (default: the source GPU's usual cluster; required "
                       "for CPU traces).")
NETWORK_HELP = ("Project onto this network: key=value,... (gpus_per_node, intra_node_bw, "
                "inter_node_bw, ..._latency, ranks_per_dc, dc_bw, dc_latency; units like "
                "400Gbit/s, 5us) or a TOML file. Bandwidths 1Mbit/s to 1Pbit/s or inf, "
                f"latencies 0 to 10s, counts 1 to {MAX_WORLD}; each key once.")


def placement_of(path: str | None, keys: list[str]) -> Placement | None:
    """--placement's file, read and checked once before the store is opened (InputError),
    and refused with a network spec or axis that sets (``keys``) gpus_per_node or
    ranks_per_dc."""
    if path is None:
        return None
    placed = read_placement(path)
    check_placement_spec(placed, keys)
    return placed


def scenario_options(fn: Callable) -> Callable:
    """The what-if options shared by replay and sweep."""
    for opt in reversed([
        click.option("--job", help="Job (needed when the store holds several)."),
        click.option("--source-gpu", help=f"GPU the trace ran on: {GPU_HELP} (default: "
                                          "deviceProperties)."),
        click.option("--source-network", help=SOURCE_NETWORK_HELP),
        click.option("--speedup", "speedups", multiple=True,
                     help="Divide matching GPU op times: CATEGORY=F (one of "
                          f"{', '.join(CATEGORIES)}; case-insensitive) or name~REGEX=F, "
                          f"F from {SPEEDUP_RANGE[0]:g} to {SPEEDUP_RANGE[1]:g} (repeatable; "
                          "e.g. gemm=1.5, name~flash=2). One matching no GPU op of the job "
                          "is an error."),
        click.option("--gpu-clock", help="Run the GPU (the --gpu target, else the trace's) at "
                     "this SM clock, MHz, within its catalog range; the trace is assumed to "
                     "have run at max boost. Compute-bound kernels scale with it; memory-bound "
                     "ones, communication and CPU work do not. (sweep: several, "
                     "comma-separated, are an axis.)"),
        click.option("--power-cap", help="Cap the GPU's board power (the --gpu target, else "
                     "the trace's): watts (300, 300W) or a fraction of its TDP (0.7, 70%), "
                     "at least its minimum power limit; "
                     "the clock it sustains comes from P = P_static + k f^3 (replay/clocks.py). "
                     "(sweep: several, comma-separated, are an axis: 50%,70%,90%.)"),
        click.option("--cpu-speedup", help="Divide the host's CPU work (op self time, Python "
                     "functions, runtime calls; not its waits) by this factor, "
                     f"{CPU_SPEEDUP_RANGE[0]:g} to {CPU_SPEEDUP_RANGE[1]:g}, not 1 (sweep: "
                     "several, comma-separated, are an axis, 1 the baseline)."),
        click.option("--expert-skew", help="Route the all-to-alls' tokens Zipf(S) over the "
                     "experts (one per rank of the group; S from 0, uniform, to "
                     f"{MAX_ZIPF:g}): bytes per pair and each expert's compute follow "
                     "(docs/moe.md). (sweep: several, comma-separated, are an axis.)"),
        click.option("--expert-order", help="With --expert-skew: the ranks whose experts are "
                     "hottest first, comma-separated (default: the trace's, by the tokens "
                     "each received)."),
        click.option("--include-incomplete", is_flag=True,
                     help="Also the incomplete steps (cut by the trace window, open, or "
                          "missing on some ranks; docs/steps.md)."),
    ]):
        fn = opt(fn)
    return window_options(fn)


def bounds_options(fn: Callable) -> Callable:
    """--steps / --ranks: the part of the job replay and sweep read (docs/steps.md)."""
    for opt in reversed([
        click.option("--steps", "steps_range", help="Replay only ProfilerSteps A to B "
                     "(A:B, inclusive, 0 <= A <= B < 2^63; or N): only their events are read, "
                     "the events just before kept at their measured times."),
        click.option("--ranks", "ranks_spec", help="Replay only these ranks: a list with "
                     "ranges (0,2-5; ranks 0 to 2^31-1, each one the job has), or 'replica' "
                     "for one data-parallel replica. Collectives "
                     "waiting on other ranks keep their measured wait (a note says how "
                     "many); --dp-scale still projects the whole job's groups."),
    ]):
        fn = opt(fn)
    return fn


def parse_bounds(steps_range: str | None, ranks_spec: str | None,
                 step: int | None = None) -> tuple[tuple[int, int] | None,
                                                    RankRanges | str | None]:
    """The --steps / --step and --ranks values, checked before the store is opened
    (InputError: exit 2); the ranks stay ranges until checked against the job's."""
    if step is not None and steps_range is not None:
        raise InputError("give --step or --steps, not both")
    steps = parse_steps(steps_range) if steps_range is not None else (
        (step, step) if step is not None else None)
    return steps, parse_ranks(ranks_spec) if ranks_spec is not None else None


def start_compiler() -> threading.Thread:
    """Load the simulator's compiled code on a thread, while the main one opens the store
    and reads the graph (DuckDB releases the GIL): numba's start-up is a third of a
    replay's time on a 1M-event rank otherwise."""
    def load() -> None:
        from tracetool.replay.simulate import warm_up

        warm_up()

    t = threading.Thread(target=load, name="numba-warm-up", daemon=True)
    t.start()
    return t


def gpu_option(option: str, text: str) -> Gpu:
    """The catalog GPU ``option`` names (``WhatIfError`` naming the option otherwise)."""
    try:
        return resolve_gpu(text)
    except WhatIfError as err:
        raise WhatIfError(f"{option}: {err}") from None


def parse_whatifs(source_gpu: str | None, speedups: tuple[str, ...],
                  gpus: tuple[str, ...] = (), gpu_clock: str | None = None,
                  power_cap: str | None = None, networks: tuple[str | None, ...] = (),
                  cpu_speedup: str | None = None, expert_skew: str | None = None,
                  expert_order: str | None = None) -> None:
    """Check the what-if values that need no store, before the graph is built: --source-gpu,
    each --gpu, each --speedup, --gpu-clock, --power-cap and --cpu-speedup as numbers
    (``WhatIfError``), and the network specs' values (``parse_spec``: InputError)."""
    for spec in networks:
        if spec is not None:
            parse_spec(_spec(spec))
    if source_gpu is not None:
        gpu_option("--source-gpu", source_gpu)
    for g in gpus:
        gpu_option("--gpu", g)
    for s in speedups:
        parse_speedup(s)
    if gpu_clock is not None:
        parse_gpu_clock(gpu_clock)
    if power_cap is not None:
        parse_power_cap(power_cap)
    if cpu_speedup is not None:
        parse_cpu_speedup(cpu_speedup)
    if expert_order is not None and expert_skew is None:
        raise InputError("--expert-order goes with --expert-skew")
    if expert_skew is not None:
        parse_expert_skew(expert_skew, expert_order)


def add_energy(report: dict, power: GpuPower | None) -> dict:
    """``report`` (``ReplayResult.to_dict``) with the power model's draw (``power``: None
    for a CPU job or a GPU without catalog power data) and each step's energy at it, J
    (P(f) x the projected step x the GPUs; None without a draw)."""
    report["power"] = power.to_dict() if power is not None else None
    for s in report["steps"]:
        s["energy_j"] = power.energy_j(s["projected_step_ns"]) if power is not None else None
    return report


def base_scenario(replayer: Replayer, source_gpu: str | None, source_net: str | None,
                  speedups: tuple[str, ...], gpu_clock: str | None = None,
                  power_cap: str | None = None, cpu_speedup: str | None = None,
                  expert_skew: str | None = None, expert_order: str | None = None
                  ) -> Scenario:
    """The scenario the what-ifs start from: source overrides, speedups (each checked to
    change some GPU op of the replayer's job), the GPU clock and power cap, the CPU
    speedup, the experts' routing skew."""
    parsed = tuple(parse_speedup(s) for s in speedups)
    check_speedups(replayer.graph, parsed)  # before any setting runs (weights checks again)
    return Scenario(
        source_gpu=gpu_option("--source-gpu", source_gpu) if source_gpu is not None else None,
        source_network=parse_network(_spec(source_net)) if source_net is not None else None,
        speedups=parsed,
        gpu_clock_mhz=parse_gpu_clock(gpu_clock) if gpu_clock is not None else None,
        power_cap=parse_power_cap(power_cap) if power_cap is not None else None,
        cpu_speedup=parse_cpu_speedup(cpu_speedup) if cpu_speedup is not None else 1.0,
        expert_skew=parse_expert_skew(expert_skew, expert_order) if expert_skew is not None
        else None)


def placed_scenario(replayer: Replayer, sc: Scenario, placed: Placement) -> Scenario:
    """``sc`` projected onto ``placed``: the source network with the ranks placed there (a
    sweep's settings start from it)."""
    base = replace(model.source_network(replayer.graph, sc) or Network(), placement=placed)
    return replace(sc, network=base)


def network_scenario(replayer: Replayer, sc: Scenario, network: str | None,
                     placed: Placement | None) -> Scenario:
    """``sc`` with --network (its keys over the source network's, the ranks placed by
    ``placed`` when given) or, without one, the source network with the ranks placed by
    ``placed``; ``sc`` itself with neither."""
    if network is not None:
        base = replace(model.source_network(replayer.graph, sc) or Network(), placement=placed)
        return replace(sc, network=parse_network(_spec(network), base=base))
    return placed_scenario(replayer, sc, placed) if placed is not None else sc


def network_label(network: str | None, placement: str | None) -> list[str]:
    """The scenario label's parts for --network and --placement."""
    return ([f"network={network}"] if network is not None else []) + (
        [f"placement={placement}"] if placement is not None else [])


def listing_where(replayer: Replayer, sc: Scenario) -> str:
    """What the collective listing's links are read on: the placement (its file, or the
    gpus_per_node / ranks_per_dc shorthand), or that the network is unknown."""
    from tracetool.replay.run import listing_network

    net = listing_network(replayer.graph, sc)
    return (f"placement {net.layout.source}" if net is not None
            else "network unknown: give --source-network")


@click.command("replay")
@click.argument("store", type=store_arg(file_okay=False))
@scenario_options
@bounds_options
@click.option("--step", type=Int(0, MAX_STEP), help="One ProfilerStep (default: every "
              "complete step); as --steps N:N.")
@click.option("--gpu", help=f"Project onto this GPU: {GPU_HELP}.")
@click.option("--network", help=NETWORK_HELP)
@click.option("--placement", type=click.Path(dir_okay=False), help=PLACEMENT_HELP)
@click.option("--dp-scale", type=Int(1, MAX_WORLD), default=1, show_default=True,
              help="Data-parallel groups K times larger (comm re-costed, compute unchanged); "
                   f"the projected job has at most {MAX_WORLD} ranks ({MAX_GLOO_WORLD} for a "
                   "CPU job's gloo collectives).")
@click.option("--microbatches", type=Int(1, MAX_MICROBATCHES), help="Pipeline what-if: "
              "this many microbatches per step, the global batch kept (docs/pipeline.md).")
@click.option("--keep-microbatch-size", is_flag=True, help="With --microbatches: N "
              "microbatches of the traced size (the global batch grows), not the traced "
              "batch split into N.")
@click.option("--pipeline-schedule", help="Pipeline what-if: run the pipeline's chunks "
              f"under this schedule: {', '.join(SCHEDULES)} (docs/pipeline.md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--chrome-trace", "chrome", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the projected timeline as a Chrome trace (open in Perfetto).")
@click.option("--plot", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a PNG: measured vs projected step time by breakdown.")
def replay_command(store: Path, job: str | None, source_gpu: str | None,
                   source_network: str | None, speedups: tuple[str, ...],
                   gpu_clock: str | None, power_cap: str | None, cpu_speedup: str | None,
                   expert_skew: str | None, expert_order: str | None,
                   include_incomplete: bool, annotation: str | None, instance: int | None,
                   window: str | None, steps_range: str | None, ranks_spec: str | None,
                   step: int | None, gpu: str | None,
                   network: str | None, placement: str | None, dp_scale: int,
                   microbatches: int | None, keep_microbatch_size: bool,
                   pipeline_schedule: str | None, as_json: bool,
                   chrome: Path | None, plot: Path | None) -> None:
    """Replay a job's dependency graph with new kernel and collective durations and print
    measured vs projected step time per step, the projected breakdown, the projected
    critical path and an uncertainty band. With no what-if it replays the trace as measured
    (identity).

    Exit code 0; 2 on a what-if that names or changes nothing: a --gpu / --source-gpu not in
    the catalog, a --speedup with an unknown category or one matching no GPU op of the job,
    a --gpu-clock outside the GPU's range, a --power-cap below its minimum limit, either of
    them unparsable or on a CPU job, a --cpu-speedup of 1, out of range or on a job with no
    CPU work to scale, an --expert-skew out of range, on a job with no all-to-all, whose
    all-to-alls are not (dispatch, combine) pairs or that is the trace's routing, an
    --expert-order that misses a rank of the group, a bad --steps (A > B, or no step of
    the job in it), --step (not a complete step of the job) or --ranks (a rank the job does
    not have, a replica that cannot be told), any number outside its range (--help shows them), a
    --dp-scale projecting more ranks than the model prices, or a --placement file that is
    bad, does not place the job's ranks or changes nothing; 1 on a bad store, job or other
    setting (one line on stderr). The output ends with the collectives by the links they
    cross (--json: "collectives"). The numbers are checked before the graph is built, those
    that need the job right after the store is opened."""
    from tracetool.analysis.report import collective_links_section, text_table
    from tracetool.replay.run import BREAKDOWN, Replayer, collective_listing

    try:
        for option, path in (("--chrome-trace", chrome), ("--plot", plot)):
            if path is not None:
                check_output(path, option, [store])
        parse_whatifs(source_gpu, speedups, (gpu,) if gpu is not None else (), gpu_clock,
                      power_cap, (source_network, network), cpu_speedup, expert_skew,
                      expert_order)
        placed = placement_of(placement, list(parse_spec(_spec(network))) if network else [])
        steps, ranks = parse_bounds(steps_range, ranks_spec, step)
        windows = windows_of(annotation, instance, window)
        if keep_microbatch_size and microbatches is None:
            raise InputError("--keep-microbatch-size goes with --microbatches")
        if pipeline_schedule is not None and pipeline_schedule not in SCHEDULES:
            raise WhatIfError(f"--pipeline-schedule {pipeline_schedule!r}: give one of "
                              f"{', '.join(SCHEDULES)}")
        start_compiler()
        con, job = open_job(store, job)
        if dp_scale != 1:
            check_dp_scale(len(job_ranks(con, job)), dp_scale)
        use_windows(con, job, windows)
        if microbatches is not None or pipeline_schedule is not None:
            if chrome or plot or steps or ranks or annotation or window or cpu_speedup \
                    or expert_skew:
                raise InputError("a pipeline what-if (--microbatches, --pipeline-schedule) "
                                 "takes no --chrome-trace, --plot, --steps, --step, --ranks, "
                                 "--annotation, --window, --cpu-speedup or "
                                 "--expert-skew")
            sc = Scenario(
                gpu=gpu_option("--gpu", gpu) if gpu is not None else None,
                source_network=parse_network(_spec(source_network)) if source_network
                else None, speedups=tuple(parse_speedup(x) for x in speedups),
                gpu_clock_mhz=parse_gpu_clock(gpu_clock) if gpu_clock else None,
                power_cap=parse_power_cap(power_cap) if power_cap else None,
                dp_scale=dp_scale, microbatches=microbatches,
                keep_microbatch_size=keep_microbatch_size,
                pipeline_schedule=pipeline_schedule, label=", ".join(
                    ([f"microbatches={microbatches}"] if microbatches else [])
                    + ([f"pipeline_schedule={pipeline_schedule}"] if pipeline_schedule
                       else []) + ([f"network={network}"] if network else [])))
            if network is not None:
                sc = replace(sc, network=parse_network(_spec(network),
                                                       base=sc.source_network or Network()))
            if placed is not None:  # the stages' ranks placed there: each link priced so
                sc = replace(sc, network=replace(
                    sc.network or sc.source_network or Network(), placement=placed))
            presult = run_pipeline(con, job, sc, include_incomplete)
            con.close()
            click.echo(json.dumps(presult.to_dict()) if as_json
                       else "\n".join(render(presult)))
            return
        if not include_incomplete and (left_out := no_complete_steps(con, job)):
            warn_collectives(con, job)  # why, when it is the clocks
            raise click.ClickException(f"{store}: {left_out}")
        try:
            replayer = Replayer.from_store(con, job, Bounds(steps, ranks))
        except NoSuchSteps:
            if step is None:
                raise
            raise InputError(f"{store}: job {job} has no complete "
                             f"ProfilerStep#{step}") from None
        sc = base_scenario(replayer, source_gpu, source_network, speedups, gpu_clock,
                           power_cap, cpu_speedup, expert_skew, expert_order)
        label = []
        if gpu is not None:
            sc = replace(sc, gpu=gpu_option("--gpu", gpu))
            label.append(f"gpu={sc.gpu.key}")
        if sc.gpu_clock_mhz is not None:
            label.append(f"gpu_clock={sc.gpu_clock_mhz:g}MHz")
        if sc.power_cap is not None:
            label.append(f"power_cap={sc.power_cap}")
        sc = network_scenario(replayer, sc, network, placed)
        label += network_label(network, placement)
        if dp_scale != 1:
            sc = replace(sc, dp_scale=dp_scale)
            label.append(f"dp_scale={dp_scale}")
        label += [f"speedup {s}" for s in speedups]
        if sc.changes_cpu:
            label.append(f"cpu_speedup={sc.cpu_speedup:g}")
        if sc.expert_skew is not None:
            label.append(f"expert_skew={sc.expert_skew}")
        sc = replace(sc, label=", ".join(label) or "identity")
        model.check_scenario(replayer.graph, sc)  # a bad what-if: one line, before warnings
        model.check_network_changes(replayer.graph, sc)
        model.check_expert_skew_changes(replayer.graph, sc)
        warn_collectives(con, job)  # how well the collectives matched: the replay rests on it
        result = replayer.run(sc, include_incomplete=include_incomplete)
        power = model.scenario_power(replayer.graph, sc)
        if step is not None:
            result.steps = [s for s in result.steps if s.step == step]
            if not result.steps:
                raise InputError(f"{store}: job {job} has no complete ProfilerStep#{step}")
        listing = collective_listing(replayer, sc, result)
        written = None
        if chrome:
            from tracetool.replay.timeline import write_projected_trace

            written = write_projected_trace(con, replayer.graph, result, chrome)
        if plot:
            from tracetool.replay.plots import plot_replay

            plot_replay(result, plot)
        con.close()
    except (click.ClickException, duckdb.Error, OSError, ValueError) as err:
        fail_for(store, err)
    report = add_energy(result.to_dict(), power)
    report["collectives"] = listing
    if chrome:
        report["chrome_trace"] = {"path": str(chrome), "events": written}
    if as_json:
        click.echo(json.dumps(report))
        return
    read = result.bounds
    where = "".join([f", steps {read['steps'][0]}:{read['steps'][1]}" if read["steps"] else "",
                     f", ranks {ranks_spec}" if read["ranks"] else ""])
    click.echo(f"job {job}, scenario: {result.scenario}{where}")
    for note in result.notes:
        click.echo(f"note: {note}")
    click.echo(f"{'step':>6} {'measured ms':>12} {'projected ms':>13} {'band ms':>22} "
               f"{'change':>8}")
    for s in result.steps:
        band = f"[{s.low_ns / 1e6:.3f}, {s.high_ns / 1e6:.3f}]"
        name = "trace" if s.step is None else str(s.step)
        click.echo(f"{name:>6} {s.measured_ns / 1e6:12.3f} {s.projected_ns / 1e6:13.3f} "
                   f"{band:>22} {100 * s.error:+7.1f}%")
    n = len(result.steps)
    for title, key in (("measured", "measured"), ("projected", "projected")):
        parts = {k: sum(getattr(s, key)[k] for s in result.steps) / n for k in BREAKDOWN}
        total = sum(parts.values()) or 1
        gap = sum(getattr(s, key).get("unexplained_gap_ns", 0) for s in result.steps) / n
        click.echo(f"{title} breakdown (mean step, mean over ranks): " + ", ".join(
            f"{k.replace('_', ' ')} {v / 1e6:.3f} ms ({100 * v / total:.0f}%)"
            for k, v in parts.items()) + (f", of which unexplained gap {gap / 1e6:.3f} ms"
                                          if gap else ""))
    path: dict[str, int] = {}
    for s in result.steps:
        for k, v in s.critical_path.items():
            path[k] = path.get(k, 0) + v
    total = sum(path.values()) or 1
    click.echo("projected critical path: " + ", ".join(
        f"{k} {100 * v / total:.0f}%" for k, v in sorted(path.items(), key=lambda kv: -kv[1])))
    if power is not None and result.steps:
        mean = sum(s["energy_j"] for s in report["steps"]) / len(result.steps)
        click.echo(f"energy (power model): {mean:.4g} J per step (mean), {power.gpus} x "
                   f"{power.gpu} at {power.mhz:.0f} MHz, {power.watts:.0f} W each at full "
                   "load (replay/clocks.py)")
    if listing:
        where = listing_where(replayer, sc)
        sec = collective_links_section(listing, where, top=5)
        click.echo(f"collectives by link ({where}; top {min(5, len(listing))} of "
                   f"{len(listing)} by projected exposed, summed over the steps):")
        for line in text_table(*sec.tables[0]):
            click.echo(f"  {line}")
    if chrome:
        click.echo(f"wrote {chrome} ({written} events): open it in https://ui.perfetto.dev")
    if plot:
        click.echo(f"wrote {plot}")
