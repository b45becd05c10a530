"""Sweeps: one built graph replayed over a grid of settings.

An axis is ``key=v1,v2,...`` where a unit written on the last value applies to all that have
none (``inter_node_bw=25,50,100,200,400Gbit/s``); several network axes, GPUs and dp-scales
make a grid (their product).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import numpy as np

from .graph import ReplayGraph
from .model import NetworkNoOp, Scenario, check_scenario, resolve_gpu, source_network
from .network import Network, parse_network
from .run import BREAKDOWN, Replayer

_UNIT = re.compile(r"^[0-9.]+(?:[eE][-+]?[0-9]+)?\s*([a-zA-Zµ/].*)$")


def parse_axis(text: str) -> tuple[str, list[str]]:
    """'inter_node_bw=25,50Gbit/s' -> ('inter_node_bw', ['25Gbit/s', '50Gbit/s'])."""
    key, sep, values = text.partition("=")
    parts = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not parts:
        raise ValueError(f"bad sweep axis {text!r}: use key=v1,v2,... (e.g. "
                         "inter_node_bw=25,50,100Gbit/s)")
    m = _UNIT.match(parts[-1])
    unit = m.group(1) if m else ""
    return key.strip(), [p if _UNIT.match(p) or not unit else p + unit for p in parts]


def sweep(replayer: Replayer, base: Scenario, network_axes: list[str],
          gpus: list[str] | None = None, dp_scales: list[int] | None = None,
          include_incomplete: bool = False) -> list[dict]:
    """One row per grid point: the setting (as a label, and as ``axes``: axis -> value), and
    measured / projected step time, band and breakdown as the mean over the job's complete
    steps."""
    g = replayer.graph
    axes = [parse_axis(a) for a in network_axes]
    src_net = source_network(g, base)
    if axes and src_net is None:
        raise ValueError("the trace names no GPU of the catalog, so its network is unknown: "
                         "give --source-network")
    base_net = base.network or src_net or Network()
    for key, vals in axes:
        _check_axis(g, base, base_net, key, vals)
    rows = []
    grid = itertools.product(*[[(k, v) for v in vals] for k, vals in axes],
                             gpus or [None], dp_scales or [base.dp_scale])
    for point in grid:
        *net_items, gpu, dp = point
        parts = [f"{k}={v}" for k, v in net_items]
        coords = dict(net_items) | ({"gpu": gpu} if gpu is not None else {}) | (
            {"dp_scale": str(dp)} if dp_scales else {})
        sc = replace(base, dp_scale=dp)
        if net_items:
            sc = replace(sc, network=parse_network(",".join(parts), base=base_net))
        if gpu is not None:
            sc = replace(sc, gpu=resolve_gpu(gpu))
            parts.append(f"gpu={gpu}")
        if dp_scales:
            parts.append(f"dp_scale={dp}")
        sc = replace(sc, label=", ".join(parts) or "identity")
        try:
            check_scenario(g, sc)
        except NetworkNoOp:  # its settings price no edge: the source network's numbers
            sc = replace(sc, network=base_net)
        res = replayer.run(sc, critical_path=False, include_incomplete=include_incomplete)
        mean = {k: int(np.mean([getattr(s, k) for s in res.steps]))
                for k in ("measured_ns", "projected_ns", "low_ns", "high_ns")}
        rows.append({
            "setting": sc.label, "axes": coords, "steps": len(res.steps),
            "measured_step_ns": mean["measured_ns"], "projected_step_ns": mean["projected_ns"],
            "low_ns": mean["low_ns"], "high_ns": mean["high_ns"],
            "projected_breakdown_ns": {k: int(np.mean([s.projected[k] for s in res.steps]))
                                       for k in (*BREAKDOWN, "comm_ns")}})
    return rows


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
