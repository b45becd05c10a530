"""What-if scenarios, and the edge weights they give a replay graph.

A scenario changes three kinds of edges of a ``ReplayGraph`` and nothing else (CPU work, launch
latencies and the program's structure stay as measured):

- GPU op durations: ``--gpu`` (roofline from op shapes, else class ratio; ``compute.py``) and
  ``--speedup`` overrides;
- collective transfers: ``--network`` / ``--dp-scale`` re-cost each collective instance with the
  NCCL-style model (``network.py``) and scale its measured transfer by
  ``cost(target) / cost(source)``, so the source's measured efficiency is kept and the identity
  projection is exact. The source network is ``--source-network``, else the default of the
  source GPU (8 per node on its scale-up links, one NIC per GPU); CPU (gloo) traces must give
  it. A collective whose size the trace does not say (2021 traces) gets the size at which the
  source model reproduces its measured transfer;
- ``--dp-scale K``: data-parallel groups (the group spans the whole job, or its description
  says dp / data / default_pg) have K times the ranks, placed like the traced ones; per-rank
  compute is unchanged;
- ``--gpu-clock`` / ``--power-cap``: the GPU (the ``--gpu`` target, else the trace's) at
  another SM clock, given or sustained under a power cap: GPU op durations as for ``--gpu``,
  onto the same GPU with its peak FLOPS scaled by the clock (``clocks.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .clocks import PowerCap, at_clock, scenario_clock
from .compute import COMPUTE_BOUND, DTYPE_OF, Speedup, WhatIfError, op_work, roofline_s
from .graph import COMM_DURATION, OP_DURATION, TRANSFER, ReplayGraph, parse_shapes
from .hardware import Gpu, catalog, describe_catalog, find_gpu, lookup_gpu
from .network import Network, collective_time, default_network

_DP_DESC = re.compile(r"(^|[^a-z])dp([^a-z]|$)|data|default_pg", re.IGNORECASE)


@dataclass(frozen=True)
class Scenario:
    """One what-if. None / 1 / () mean "as traced"."""

    gpu: Gpu | None = None
    network: Network | None = None
    dp_scale: int = 1
    speedups: tuple[Speedup, ...] = ()
    source_gpu: Gpu | None = None  # override of the trace's deviceProperties
    source_network: Network | None = None
    label: str = "identity"
    # SM clock (MHz) / power cap of the GPU the ops run on: the target, else the source
    gpu_clock_mhz: float | None = None
    power_cap: PowerCap | None = None

    @property
    def changes_network(self) -> bool:
        return self.network is not None or self.dp_scale != 1

    @property
    def changes_clock(self) -> bool:
        return self.gpu_clock_mhz is not None or self.power_cap is not None


@dataclass
class Weights:
    """Edge weights for one scenario, two ways. ``w`` scales each measured duration by the
    model's target/source ratio (the measured efficiency carries over); ``w_alt`` scales only
    the part of it the source model explains and keeps the rest (the residual: launch and
    protocol overheads, stalls) as measured. They differ by residual x change, so the pair
    brackets the calibration uncertainty; both are exact for the identity."""

    w: np.ndarray
    w_alt: np.ndarray
    notes: list[str] = field(default_factory=list)


def resolve_gpu(text: str) -> Gpu:
    """The catalog GPU a user names: its key (h100), its catalog name (H100 SXM) or a match
    name (MI250), exactly, case-insensitive (``lookup_gpu``). Anything else raises
    ``WhatIfError`` listing the catalog: a near miss (h100x, a100-40gb) is not silently the
    nearest GPU."""
    gpus = catalog()
    gpu = lookup_gpu(text, gpus)
    if gpu is None:
        raise WhatIfError(f"unknown GPU {text!r}; give a catalog key or name "
                          f"(case-insensitive): {describe_catalog(gpus)}")
    return gpu


def check_speedups(graph: ReplayGraph, speedups: tuple[Speedup, ...] | list[Speedup]) -> None:
    """Raise ``WhatIfError`` for the first speedup that would change no duration of
    ``graph``: its category or pattern matches no GPU op of the job, or only collective
    transfers (priced by the network model, not by speedups)."""
    ops = graph.ops
    n = len(ops["dur"])
    scaled = np.zeros(n, dtype=bool)  # ops whose duration edge the GPU model sets
    scaled[graph.op[graph.role == OP_DURATION]] = True
    for s in speedups:
        hit = _speedup_hits(ops, s)
        if hit[scaled].any():
            continue
        given = str(s)
        if hit.any():
            raise WhatIfError(f"speedup {given!r}: every GPU op of job {graph.job} it matches "
                              "is a collective transfer, which the network model prices "
                              "(use --network)")
        if s.pattern is not None:
            raise WhatIfError(f"speedup {given!r}: the pattern {s.pattern.pattern!r} matches "
                              f"no GPU op of job {graph.job}")
        raise WhatIfError(f"speedup {given!r}: job {graph.job} has no GPU op of category "
                          f"{s.category!r}" + ("" if n else " (it has no GPU ops)"))


def check_scenario(graph: ReplayGraph, scenario: Scenario) -> None:
    """``WhatIfError`` for a what-if that would change nothing the job ran, whoever asks
    (CLI or Python): a speedup matching no GPU op, a GPU, clock or power cap on a job with no
    GPU op; and for a clock outside the GPU's documented range or a power cap below its
    minimum limit."""
    check_speedups(graph, scenario.speedups)
    if scenario.gpu is not None and not len(graph.ops["dur"]):
        raise WhatIfError(f"GPU {scenario.gpu.name!r}: job {graph.job} has no GPU ops (a "
                          "CPU job), so a GPU changes nothing; change its network instead")
    if scenario.changes_clock:
        if not len(graph.ops["dur"]):
            what = (f"GPU clock {scenario.gpu_clock_mhz:g} MHz"
                    if scenario.gpu_clock_mhz is not None
                    else f"power cap {str(scenario.power_cap)!r}")
            raise WhatIfError(f"{what}: job {graph.job} has no GPU ops (a CPU job), so a GPU "
                              "clock or power cap changes nothing")
        clocked_gpu(graph, scenario)  # a clock outside the GPU's range, a cap below its minimum


def _speedup_hits(ops: dict, s: Speedup) -> np.ndarray:
    """Per GPU op of the graph: does ``s`` apply to it."""
    if s.pattern is not None:
        names, inv = np.unique(ops["name"].astype(str), return_inverse=True)
        return np.array([bool(s.pattern.search(x)) for x in names], dtype=bool)[inv]
    return ops["category"].astype(str) == s.category


def source_gpu(graph: ReplayGraph, scenario: Scenario) -> Gpu | None:
    """The GPU the trace ran on: the override, else its deviceProperties (None if unknown)."""
    if scenario.source_gpu is not None:
        return scenario.source_gpu
    for d in graph.devices:
        gpu = find_gpu(d)
        if gpu is not None:
            return gpu
    return None


def source_network(graph: ReplayGraph, scenario: Scenario) -> Network | None:
    if scenario.source_network is not None:
        return scenario.source_network
    gpu = source_gpu(graph, scenario)
    return default_network(gpu) if gpu is not None else None


def target_network(graph: ReplayGraph, scenario: Scenario) -> Network | None:
    """The network projected onto: --network (over the source's unset keys), else the source
    network, on the target GPU's scale-up links when --gpu changes and the source network
    was a default."""
    src = source_network(graph, scenario)
    if scenario.network is not None:
        return scenario.network
    if scenario.gpu is not None and scenario.source_network is None:
        return default_network(scenario.gpu)
    return src


def clocked_gpu(graph: ReplayGraph, scenario: Scenario) -> tuple[Gpu | None, list[str]]:
    """The GPU the ops are projected onto, at the scenario's SM clock (``--gpu``, else the
    source GPU; None when the scenario changes neither), and the clock model's notes."""
    if not scenario.changes_clock:
        return scenario.gpu, []
    gpu = scenario.gpu or source_gpu(graph, scenario)
    if gpu is None:
        raise ValueError("the trace names no GPU of the catalog (deviceProperties), so its "
                         "clock range is unknown: give --source-gpu")
    mhz, notes = scenario_clock(gpu, scenario.gpu_clock_mhz, scenario.power_cap)
    if scenario.gpu is None and mhz == gpu.clocks.boost_mhz:
        return None, notes  # the trace's own GPU at its reference clock: the identity
    return at_clock(gpu, mhz), notes


def op_factors(graph: ReplayGraph, scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU op of the graph: projected duration / measured duration, and the op's model
    time on the source GPU in ns (NaN where no model prices it: the part of the measured
    time the model explains, for the band)."""
    ops = graph.ops
    n = len(ops["dur"])
    factor, model_ns = np.ones(n), np.full(n, np.nan)
    dst, _ = clocked_gpu(graph, scenario)
    if dst is not None:
        src = source_gpu(graph, scenario)
        if src is None:
            raise ValueError("the trace names no GPU of the catalog (deviceProperties): "
                             "give --source-gpu")
        factor, model_ns = _gpu_factors(graph, src, dst)
    for s in scenario.speedups:
        factor = np.where(_speedup_hits(ops, s), factor / s.factor, factor)
    return factor, model_ns


def _gpu_factors(graph: ReplayGraph, src: Gpu, dst: Gpu) -> tuple[np.ndarray, np.ndarray]:
    ops = graph.ops
    cat = ops["category"].astype(str)
    kind = ops["kind"].astype(str)
    names = ops["name"].astype(str)
    factor = np.full(len(cat), src.hbm_gbps / dst.hbm_gbps)  # memory-bound by default
    model_ns = np.full(len(cat), np.nan)
    factor[cat == "comm"] = 1.0  # the network model prices these
    copies = kind == "memcpy"
    factor[copies & (np.char.find(names, "DtoD") < 0)] = 1.0  # PCIe copies: as measured
    # compute-bound kernels: roofline from the launching op's shapes, else the peak ratio
    cache: dict[tuple, tuple[float, float]] = {}
    for i in np.flatnonzero(np.isin(cat, COMPUTE_BOUND)):
        key = (ops["op_name"][i], ops["dims"][i], ops["types"][i])
        if key not in cache:
            cache[key] = _compute_ratio(key, src, dst)
        factor[i], model_ns[i] = cache[key]
    return factor, model_ns


def _compute_ratio(key: tuple, src: Gpu, dst: Gpu) -> tuple[float, float]:
    """(target / source time, source model ns or NaN) of a compute-bound op."""
    op_name, dims, types = key
    shapes = parse_shapes(dims, types)
    work = op_work(op_name or "", *shapes) if shapes else None
    if work is not None and work.flops > 0:
        r_src = roofline_s(src, work)
        return roofline_s(dst, work) / r_src, r_src * 1e9
    dtype = "bf16"
    if shapes and shapes[1]:
        dtype = DTYPE_OF.get(str(shapes[1][0]).lower(), "bf16")
    return src.peak_tflops(dtype) / dst.peak_tflops(dtype), math.nan


def _latency_note(graph: ReplayGraph, factor: np.ndarray, model_ns: np.ndarray) -> list[str]:
    """Under an SM-clock change alone: the compute-class kernels the roofline calls
    memory-bound (kept as measured), and how far below their roofline they ran. Far below, a
    kernel is latency-bound, and latency in SM cycles grows with a lower clock too."""
    ops = graph.ops
    kept = (np.isin(ops["category"].astype(str), COMPUTE_BOUND) & ~np.isnan(model_ns)
            & (factor == 1))
    if not kept.any():
        return []
    dur = ops["dur"]
    share = dur[kept].sum() / max(dur.sum(), 1)
    speed = model_ns[kept].sum() / max(dur[kept].sum(), 1)
    return [f"{int(kept.sum())} {'/'.join(COMPUTE_BOUND)} kernels ({100 * share:.0f}% of GPU op "
            f"time) are memory-bound by their roofline and stay as measured; they ran at "
            f"{100 * speed:.0f}% of it, and kernels far below their roofline are "
            "latency-bound, which a lower SM clock slows too (not modelled)"]


def _dp_groups(graph: ReplayGraph) -> np.ndarray:
    world = len(graph.ranks)
    out = []
    for g, desc in zip(graph.insts["group_ranks"], graph.insts["pg_desc"], strict=True):
        out.append(len(g) >= max(world, 2) or bool(desc and _DP_DESC.search(str(desc))))
    return np.array(out, dtype=bool)


def _scaled(ranks: list[int], k: int, world: int) -> list[int]:
    return [r + world * j for j in range(k) for r in ranks]


def effective_bytes(net: Network, kind: str, ranks: list[int], seconds: float) -> float:
    """The message size at which ``net`` prices a collective at ``seconds`` (bisection on a
    log scale; the model is monotonic in size)."""
    lo, hi = 1.0, 1e13
    if collective_time(net, kind, lo, ranks) >= seconds:
        return lo
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if collective_time(net, kind, mid, ranks) < seconds:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def collective_factors(graph: ReplayGraph, scenario: Scenario
                       ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per collective instance: projected transfer / measured transfer, and its model time on
    the source network in ns (NaN where unpriced)."""
    insts = graph.insts
    n = len(insts["transfer_ns"])
    k, model_ns = np.ones(n), np.full(n, np.nan)
    notes: list[str] = []
    if not scenario.changes_network and scenario.gpu is None:
        return k, model_ns, notes
    src = source_network(graph, scenario)
    dst = target_network(graph, scenario)
    if src is None or dst is None:
        if scenario.changes_network:
            raise ValueError("the trace names no GPU of the catalog, so its network is "
                             "unknown: give --source-network (e.g. gpus_per_node=1,"
                             "inter_node_bw=1Gbit/s)")
        return k, model_ns, notes
    dp = _dp_groups(graph) if scenario.dp_scale != 1 else np.zeros(n, dtype=bool)
    world = max([len(graph.ranks)] + [max(g) + 1 for g in insts["group_ranks"] if g])
    cache: dict[tuple, float] = {}
    guessed = 0
    for i in range(n):
        ranks = insts["group_ranks"][i]
        if len(ranks) < 2:
            continue
        kind = insts["kind"][i]
        measured_s = insts["transfer_ns"][i] * 1e-9
        nbytes = insts["bytes"][i]
        if not nbytes > 0:
            nbytes = effective_bytes(src, kind, ranks, measured_s)
            guessed += 1
        key = (kind, float(nbytes), tuple(ranks), bool(dp[i]))
        if key not in cache:
            try:
                c_src = collective_time(src, kind, nbytes, ranks)
                dst_ranks = _scaled(ranks, scenario.dp_scale, world) if dp[i] else ranks
                c_dst = collective_time(dst, kind, nbytes, dst_ranks)
            except ValueError:
                c_src = c_dst = 0.0
            cache[key] = (c_dst / c_src, c_src * 1e9) if c_src > 0 else (1.0, math.nan)
        k[i], model_ns[i] = cache[key]
    if guessed:
        notes.append(f"{guessed} collectives without a recorded size: sized from their "
                     "measured transfer under the source network")
    return k, model_ns, notes


def _scaled_both(measured: np.ndarray, factor: np.ndarray, model_ns: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(measured x factor, measured - m + m x factor) with m the modelled part of it."""
    m = np.where(np.isnan(model_ns), measured, np.minimum(measured, model_ns))
    return measured * factor, measured - m + m * factor


def weights(graph: ReplayGraph, scenario: Scenario) -> Weights:
    """Edge weights of ``graph`` under ``scenario`` (the identity weights when it changes
    nothing)."""
    check_scenario(graph, scenario)
    w = graph.base_w.copy()
    out = Weights(w, w.copy())
    dst, clock_notes = clocked_gpu(graph, scenario)
    if dst is not None or scenario.speedups:
        f, model_ns = op_factors(graph, scenario)
        sel = graph.role == OP_DURATION
        op = graph.op[sel]
        w[sel], out.w_alt[sel] = _scaled_both(graph.ops["dur"][op], f[op], model_ns[op])
        if dst is not None and scenario.gpu is None:  # the trace's GPU at another clock
            clock_notes += _latency_note(graph, f, model_ns)
    k, model_ns, notes = collective_factors(graph, scenario)
    out.notes = clock_notes + notes
    if (k != 1).any():
        t = graph.insts["transfer_ns"]
        new, alt = _scaled_both(t, k, model_ns)
        own = graph.role == COMM_DURATION
        w[own], out.w_alt[own] = new[graph.inst[own]], alt[graph.inst[own]]
        xfer = graph.role == TRANSFER
        i = graph.inst[xfer]
        lag = graph.base_w[xfer]  # this rank's end - the last arrival (< 0 only from skew)
        w[xfer] = np.where(lag > 0, lag * k[i], lag)
        out.w_alt[xfer] = lag + (alt - t)[i]
    return out


