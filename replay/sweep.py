"""Sweeps: one built graph replayed over a grid of settings.

An axis is ``key=v1,v2,...`` where a unit written on the last value applies to all that have
none (``inter_node_bw=25,50,100,200,400Gbit/s``); several network axes, GPUs, dp-scales, GPU
clocks, power caps and CPU speedups make a grid (their product).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import numpy as np

from tracetool.errors import InputError

from .alltoall import ExpertSkew
from .clocks import PowerCap
from .graph import ReplayGraph
from .model import (
    GpuNoOp,
    NetworkNoOp,
    Scenario,
    check_scenario,
    resolve_gpu,
    scenario_power,
    source_network,
)
from .network import COUNT_KEYS, Network, parse_network, parse_setting
from .run import BREAKDOWN, Replayer

_UNIT = re.compile(r"^[0-9.]+(?:[eE][-+]?[0-9]+)?\s*([a-zA-Zµ/].*)$")


def parse_axis(text: str) -> tuple[str, list[str]]:
    """'inter_node_bw=25,50Gbit/s' -> ('inter_node_bw', ['25Gbit/s', '50Gbit/s']), each
    value checked as its key's setting (``network.parse_setting``: within its range), none
    twice; InputError otherwise. One key per axis: 'a=1,b=2,3' is refused, not read as a
    fixed a and an axis b (give ``--network a=1 --network b=2,3``)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    parts = [v.strip() for v in values.split(",")]
    if not sep or not key or not all(parts):
        raise InputError(f"bad sweep axis {text!r}: use key=v1,v2,... (e.g. "
                         "inter_node_bw=25,50,100Gbit/s)")
    if any("=" in p for p in parts):
        groups = [f"{key}={parts[0]}"]
        for p in parts[1:]:
            if "=" in p:
                groups.append(p)
            else:
                groups[-1] += f",{p}"
        raise InputError(f"bad sweep axis {text!r}: one key per --network; give "
                         + " ".join(f"--network {g}" for g in groups))
    m = _UNIT.match(parts[-1])
    unit = m.group(1) if m and key not in COUNT_KEYS else ""  # a count has none to share
    values_ = [p if _UNIT.match(p) or not unit else p + unit for p in parts]
    for v in values_:
        parse_setting(key, v)
    if len(set(values_)) < len(values_):
        raise InputError(f"bad sweep axis {text!r}: a value is given twice")
    return key, values_


def parse_axes(texts: list[str]) -> list[tuple[str, list[str]]]:
    """Every ``--network`` axis (``parse_axis``), no key swept twice (InputError)."""
    axes = [parse_axis(t) for t in texts]
    keys = [k for k, _ in axes]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise InputError(f"sweep axis {twice[0]!r} given twice: give its values in one "
                         f"--network {twice[0]}=v1,v2,...")
    return axes


def sweep(replayer: Replayer, base: Scenario, network_axes: list[str],
          gpus: list[str] | None = None, dp_scales: list[int] | None = None,
          include_incomplete: bool = False, *, gpu_clocks: list[float] | None = None,
          power_caps: list[PowerCap] | None = None,
          cpu_speedups: list[float] | None = None,
          expert_skews: list[ExpertSkew] | None = None) -> list[dict]:
    """One row per grid point: the setting (as a label, and as ``axes``: axis -> value), and
    measured / projected step time, band and breakdown as the mean over the job's complete
    steps, and the power model's GPU clock, power and energy per step (``GpuPower``; None
    for a CPU job). Every grid point's scenario is checked before the first is replayed."""
    g = replayer.graph
    axes = parse_axes(network_axes)
    src_net = source_network(g, base)
    base_net = base.network or src_net or Network()
    for key, vals in axes:  # an axis that changes nothing first: then no network is asked
        _check_axis(g, base, base_net, key, vals)
    if axes and src_net is None:
        raise ValueError("the trace names no GPU of the catalog, so its network is unknown: "
                         "give --source-network")
    points = []
    grid = itertools.product(*[[(k, v) for v in vals] for k, vals in axes],
                             gpus or [None], dp_scales or [base.dp_scale],
                             gpu_clocks or [base.gpu_clock_mhz], power_caps or [base.power_cap],
                             cpu_speedups or [base.cpu_speedup],
                             expert_skews or [base.expert_skew])
    for point in grid:
        *net_items, gpu, dp, clock, cap, cpu, skew = point
        parts = [f"{k}={v}" for k, v in net_items]
        coords = dict(net_items)
        sc = replace(base, dp_scale=dp, gpu_clock_mhz=clock, power_cap=cap, cpu_speedup=cpu,
                     expert_skew=skew)
        if net_items:
            sc = replace(sc, network=parse_network(",".join(parts), base=base_net))
        if gpu is not None:
            sc = replace(sc, gpu=resolve_gpu(gpu))
        for key, on, value in (("gpu", gpu is not None, gpu), ("dp_scale", dp_scales, dp),
                               ("gpu_clock", on_axis(gpu_clocks), clock),
                               ("power_cap", on_axis(power_caps), cap),
                               ("cpu_speedup", on_axis(cpu_speedups), cpu),
                               ("expert_skew", on_axis(expert_skews), skew)):
            if on:  # the axes' values, in the label and the plot's coordinates
                text = f"{value:g}MHz" if key == "gpu_clock" else (
                    f"{value:g}" if key == "cpu_speedup" else
                    f"{value.zipf:g}" if key == "expert_skew" else str(value))
                parts.append(f"{key}={text}")
                coords[key] = text
        sc = replace(sc, label=", ".join(parts) or "identity")
        for _ in range(3):  # a part that changes nothing falls back to the source's own
            try:
                check_scenario(g, sc)
                break
            except NetworkNoOp:  # its settings price no edge: the source network's numbers
                sc = replace(sc, network=base.network)
            except GpuNoOp:  # the trace's own GPU: its measured kernel times
                sc = replace(sc, gpu=None)
        points.append((sc, coords))
    rows = []
    for sc, coords in points:
        res = replayer.run(sc, critical_path=False, include_incomplete=include_incomplete)
        mean = {k: int(np.mean([getattr(s, k) for s in res.steps]))
                for k in ("measured_ns", "projected_ns", "low_ns", "high_ns")}
        power = scenario_power(g, sc)
        rows.append({
            "setting": sc.label, "axes": coords, "steps": len(res.steps),
            "measured_step_ns": mean["measured_ns"], "projected_step_ns": mean["projected_ns"],
            "low_ns": mean["low_ns"], "high_ns": mean["high_ns"],
            "projected_breakdown_ns": {k: int(np.mean([s.projected[k] for s in res.steps]))
                                       for k in (*BREAKDOWN, "comm_ns",
                                                 "unexplained_gap_ns")},
            "gpu_clock_mhz": None if power is None else power.mhz,
            "gpu_power_w": None if power is None else power.watts,
            "energy_j": None if power is None else float(np.mean(
                [power.energy_j(s.projected_ns) for s in res.steps]))})
    return rows


def on_axis(values: list | None) -> bool:
    """Is a list of values given to ``sweep`` an axis (several values), not a fixed one."""
    return values is not None and len(values) > 1


def _check_axis(graph: ReplayGraph, base: Scenario, base_net: Network, key: str,
                values: list[str]) -> None:
    """``NetworkNoOp`` for a network axis none of whose values changes a priced edge
    (each alone, on the base scenario): every value is the base's own, or one that
    ``check_scenario`` refuses as pricing nothing. A grid point may still change nothing
    through one axis while another changes it; the sweep replays such points as they are."""
    first = None
    for v in values:
        net = parse_network(f"{key}={v}", base=base_net)
        try:
            check_scenario(graph, replace(base, network=net))
        except NetworkNoOp as err:
            first = first or err
            continue
        if net != base_net:
            return
    if first is not None:
        raise NetworkNoOp(f"sweep axis {key}: {first}")
    raise NetworkNoOp(f"sweep axis {key}: the network changes nothing for job {graph.job}: "
                      "every value of it is the source network's")
