"""What-if scenarios, and the edge weights they give a replay graph.

A scenario changes four kinds of edges of a ``ReplayGraph`` and nothing else (launch latencies,
waits and the program's structure stay as measured):

- GPU op durations: ``--gpu`` (roofline from op shapes, else class ratio; ``compute.py``) and
  ``--speedup`` overrides;
- collective transfers: ``--network`` / ``--dp-scale`` re-cost each collective instance with the
  network model (``network.py``: NCCL's steps for a GPU job, gloo over TCP for a CPU job) and
  scale the bandwidth-bound part of its measured transfer by the model's ratio, replacing the
  latency part (``transfer_factor``), so the source's measured efficiency is kept and the
  identity projection is exact. The source network is ``--source-network``, else the default of the
  source GPU (8 per node on its scale-up links, one NIC per GPU); CPU (gloo) traces must give
  it. A collective whose size the trace does not say (2021 traces) gets the size at which the
  source model reproduces its transfer time, the source's bandwidth calibrated on the
  gradients' bytes where the trace shows them (``unknown_size_networks``);
- ``--dp-scale K``: data-parallel groups (the group spans the whole job, or its description
  says dp / data / default_pg) have K times the ranks, placed like the traced ones; per-rank
  compute is unchanged;
- ``--gpu-clock`` / ``--power-cap``: the GPU (the ``--gpu`` target, else the trace's) at
  another SM clock, given or sustained under a power cap: GPU op durations as for ``--gpu``,
  onto the same GPU with its peak FLOPS scaled by the clock (``clocks.py``);
- ``--expert-skew S``: the all-to-alls' bytes redistributed over the ranks by a Zipf(S)
  routing, priced per pair (``alltoall.py``), and the expert compute between each dispatch and
  combine scaled by the tokens its expert receives;
- ``--cpu-speedup F``: the host's CPU work divided by F (``cpu_work``: the time between two
  points of a CPU thread where it bound the later one: op self time, Python functions,
  runtime and driver calls); host waits, syncs, launch latencies and GPU idle are edges of
  their own and follow their dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

import numpy as np
from numpy.typing import ArrayLike

from tracetool.graph import KIND_NAMES
from tracetool.hardware import Gpu, catalog, describe_catalog, lookup_gpu, trace_gpu
from tracetool.opwork import (
    DTYPE_OF,
    memory_bytes,
    parse_json_list,
    parse_shapes,
    roofline_s,
    work_of,
)
from tracetool.text import number_ranges

from . import alltoall, transport
from .alltoall import ExpertSkew, SkewPlan, skew_plan
from .clocks import DVFS_EXPONENT, GpuPower, PowerCap, at_clock, gpu_power, scenario_clock
from .compute import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    SPEEDUP_RANGE,
    Speedup,
    WhatIfError,
    memory_ratio,
    project_kernel_ns,
)
from .graph import (
    COMM_DURATION,
    DP_GROUP_DESC,
    FIXED,
    OP_DURATION,
    TRANSFER,
    ReplayGraph,
    unpaired_p2p,
)
from .network import (
    KINDS,
    MAX_WORLD,
    Network,
    added_latency,
    collective_time,
    default_network,
    link_classes,
    priced_shape,
)
from .transport import host_bound

# gloo's ring allreduce is simulated segment by segment (transport.py), quadratic in its
# ranks: --dp-scale projects a CPU (gloo) job onto at most this many
MAX_GLOO_WORLD = 1024


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
    # the power law a cap's clock is solved by (clocks.py): 3 the model, 1 the linear law
    # (voltage at its floor) whose projection the band spans too
    dvfs_exponent: float = DVFS_EXPONENT
    cpu_speedup: float = 1.0  # the host's CPU work divided by this (cpu_work)
    # pipeline what-ifs (docs/pipeline.md): microbatches per step and the schedule (gpipe,
    # 1f1b); they re-compose the pipeline's chunks (replay/pipeline.py run_pipeline), not
    # the graph
    microbatches: int | None = None
    pipeline_schedule: str | None = None
    keep_microbatch_size: bool = False  # N microbatches of the traced size, not M / N of it
    # --expert-skew: the all-to-alls' routing redistributed over the experts (alltoall.py)
    expert_skew: ExpertSkew | None = None

    @property
    def changes_network(self) -> bool:
        return self.network is not None or self.dp_scale != 1

    @property
    def changes_pipeline(self) -> bool:
        return self.microbatches is not None or self.pipeline_schedule is not None

    @property
    def changes_clock(self) -> bool:
        return self.gpu_clock_mhz is not None or self.power_cap is not None

    @property
    def changes_cpu(self) -> bool:
        return self.cpu_speedup != 1


# --cpu-speedup's factors: as --speedup's (compute.SPEEDUP_RANGE)
CPU_SPEEDUP_RANGE = SPEEDUP_RANGE
_CPU_ORDER = KIND_NAMES.index("cpu_order")


def cpu_work(graph: ReplayGraph) -> np.ndarray:
    """Per edge: is it CPU work, which ``--cpu-speedup`` scales. The graph keeps the time
    between two consecutive points of a CPU thread as work where it bound the later point
    (the identity weight is its lag, > 0): an op's or a Python function's self time, a
    runtime or driver call (a launch, a copy's or a sync's own overhead), and time between
    recorded events (the interpreter, or a wait the trace does not show). Where something
    else bound the point (a sync's GPU op, a host wait, a hand-off from another thread) the
    thread's edge weighs 0 and that dependency's edge carries the time: it is not scaled."""
    return (graph.role == FIXED) & (graph.kind == _CPU_ORDER) & (graph.base_w > 0)


def parse_cpu_speedup(text: str, one_ok: bool = False) -> float:
    """``--cpu-speedup``'s factor: a number in CPU_SPEEDUP_RANGE, and not 1 (a factor that
    changes nothing) unless ``one_ok`` (a sweep's baseline). ``WhatIfError`` otherwise."""
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    lo, hi = CPU_SPEEDUP_RANGE
    if not lo <= factor <= hi:
        raise WhatIfError(f"bad --cpu-speedup {text!r}: give a factor from {lo:g} to {hi:g} "
                          "(e.g. 1.5: the CPU work takes 1/1.5 of its time)")
    if factor == 1 and not one_ok:
        raise WhatIfError(f"bad --cpu-speedup {text!r}: a factor of 1 changes nothing")
    return factor


def check_cpu_speedup(graph: ReplayGraph, scenario: Scenario) -> None:
    """``WhatIfError`` for a CPU speedup outside its range, or on a job with no CPU work
    (``cpu_work``) it could scale."""
    f = scenario.cpu_speedup
    if not scenario.changes_cpu:
        return
    lo, hi = CPU_SPEEDUP_RANGE
    if not lo <= f <= hi:
        raise WhatIfError(f"bad --cpu-speedup {f!r}: give a factor from {lo:g} to {hi:g}")
    if not cpu_work(graph).any():
        raise WhatIfError(f"--cpu-speedup {f:g}: job {graph.job} has no CPU work the replay "
                          "could scale (no time on a CPU thread that bound the next point: "
                          "its events are GPU ops, waits and hand-offs only)")


def _scale_cpu(graph: ReplayGraph, scenario: Scenario, out: Weights) -> None:
    """``out``'s CPU work edges (``cpu_work``) divided by the scenario's CPU speedup, and a
    note saying how much work that is."""
    sel = cpu_work(graph)
    f = scenario.cpu_speedup
    out.w[sel] = graph.base_w[sel] / f
    out.w_alt[sel] = out.w[sel]
    ms = float(graph.base_w[sel].sum()) / 1e6
    out.notes.append(f"CPU work divided by {f:g}: {int(sel.sum())} edges, {ms:.3f} ms of the "
                     "replayed events' CPU time (op self time, Python functions, runtime "
                     "calls, and time between recorded events on a thread); host waits, "
                     "syncs, launch latencies and GPU idle follow their dependencies")


def scenario_power(graph: ReplayGraph, scenario: Scenario) -> GpuPower | None:
    """The power model's draw of the GPUs the scenario runs the job's ops on (the --gpu
    target, else the trace's GPU, at the scenario's clock): one per replayed rank with GPU
    ops. None for a CPU job or a GPU without catalog power data."""
    ops = graph.ops
    if not len(ops["dur"]):
        return None
    gpu = scenario.gpu or source_gpu(graph, scenario)
    if gpu is None:
        return None
    return gpu_power(gpu, scenario.gpu_clock_mhz, scenario.power_cap,
                     len(np.unique(np.asarray(ops["rank"]))))


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


def check_dp_scale(world: int, k: int, gloo: bool = False) -> None:
    """``WhatIfError`` unless ``--dp-scale k`` projects a job of ``world`` ranks onto at
    most MAX_WORLD ranks (MAX_GLOO_WORLD for a CPU job's gloo collectives): the collectives
    are priced over every projected rank, so a larger k would only exhaust memory or time."""
    cap = MAX_GLOO_WORLD if gloo else MAX_WORLD
    if k < 1 or world * k > cap:
        what = "a CPU (gloo) job" if gloo else "a job"
        raise WhatIfError(f"--dp-scale {k}: give 1 to {max(1, cap // max(world, 1))}: {what} "
                          f"of {world} ranks is projected onto at most {cap} ranks")


def world_size(graph: ReplayGraph) -> int:
    """The ranks the job's collectives span: its ranks, or more when a group names ranks
    the trace does not have."""
    return max([len(graph.ranks)] + [max(g) + 1 for g in graph.insts["group_ranks"] if g])


def check_scenario(graph: ReplayGraph, scenario: Scenario) -> None:
    """``WhatIfError`` for a what-if that would change nothing the job ran, whoever asks
    (CLI or Python): a speedup matching no GPU op, a GPU, clock or power cap on a job with no
    GPU op, a network or dp-scale that prices no edge (``_refuse_network_noop``); and for a
    clock outside the GPU's documented range, a power cap below its minimum limit or a
    --dp-scale past the ranks the model prices (``check_dp_scale``)."""
    check_speedups(graph, scenario.speedups)
    check_cpu_speedup(graph, scenario)
    if scenario.changes_pipeline:
        raise WhatIfError("a pipeline what-if (microbatches, schedule) re-composes the "
                          "pipeline's chunks, not the graph: tracetool.replay.pipeline."
                          "run_pipeline(con, job, scenario) runs it")
    if scenario.dp_scale != 1:
        check_dp_scale(world_size(graph), scenario.dp_scale, gloo=not len(graph.ops["dur"]))
    if scenario.gpu is not None and not len(graph.ops["dur"]):
        raise WhatIfError(f"GPU {scenario.gpu.name!r}: job {graph.job} has no GPU ops (a "
                          "CPU job), so a GPU changes nothing; change its network instead")
    if scenario.gpu is not None and source_gpu(graph, scenario) is None:
        # an accelerator that is not a catalog GPU (MTIA's ARTEMIS, an unlisted GPU): its
        # ops' speeds are unknown, so no ratio to the target exists
        what = (f"ran on {', '.join(sorted(set(graph.devices)))}, which has no entry in "
                "the GPU catalog" if graph.devices else "names no device (deviceProperties)")
        hint = ("take it as one of the catalog's" if graph.devices
                else "name the one it ran on")
        raise WhatIfError(f"GPU {scenario.gpu.name!r}: job {graph.job} {what}, so its ops "
                          f"cannot be projected onto another GPU (give --source-gpu to {hint})")
    if scenario.changes_clock:
        if not len(graph.ops["dur"]):
            what = (f"GPU clock {scenario.gpu_clock_mhz:g} MHz"
                    if scenario.gpu_clock_mhz is not None
                    else f"power cap {str(scenario.power_cap)!r}")
            raise WhatIfError(f"{what}: job {graph.job} has no GPU ops (a CPU job), so a GPU "
                              "clock or power cap changes nothing")
        clocked_gpu(graph, scenario)  # a clock outside the GPU's range, a cap below its minimum
    _refuse_comm_only(graph, scenario)
    if scenario.expert_skew is not None:
        expert_plan(graph, scenario)  # no all-to-all, unpaired ones, an order missing ranks
    if scenario.gpu is not None and not scenario.changes_clock \
            and source_gpu(graph, scenario) == scenario.gpu:
        raise GpuNoOp(f"GPU {scenario.gpu.name!r}: job {graph.job} ran on it already, so "
                      "--gpu changes nothing: give another GPU, or --gpu-clock / --power-cap "
                      "for this one")
    if scenario.changes_network:
        n_p2p = unpaired_p2p(graph)
        if n_p2p:
            raise WhatIfError(f"network what-if: job {graph.job} has {n_p2p} point-to-point "
                              "calls (send/recv) that the replay matches as group-wide "
                              "collectives, not sender-receiver pairs, so it would price "
                              "their transfers wrong; it does not project them onto another "
                              "network yet (docs/collectives.md)")
        src, dst = source_network(graph, scenario), target_network(graph, scenario)
        if dst is not None and dst.placement is not None:
            dst.placement.check_covers(world_size(graph), graph.job)
        priced = _priced(graph)
        # a job with nothing priced is refused as such, whatever the networks: asking for a
        # --source-network (collective_factors, when it is unknown) would change nothing
        if not priced.any() or (src is not None and dst is not None):
            _refuse_network_noop(graph, scenario, priced, unpriced_comm_note(graph, priced),
                                 src, dst)


def _refuse_comm_only(graph: ReplayGraph, scenario: Scenario) -> None:
    """``WhatIfError`` for a GPU, clock or power cap on a job whose every GPU op is a
    communication kernel: the network model prices those (or keeps them as measured), the
    GPU model never scales them, so the what-if would move nothing."""
    cats = graph.ops["category"].astype(str)
    if not (scenario.gpu is not None or scenario.changes_clock) or not len(cats) \
            or not (cats == "comm").all():
        return
    what = (f"GPU {scenario.gpu.name!r}" if scenario.gpu is not None else "GPU clock"
            if scenario.gpu_clock_mhz is not None else f"power cap {str(scenario.power_cap)!r}")
    raise WhatIfError(f"{what}: every GPU op of job {graph.job} ({len(cats)}) is a "
                      "communication kernel, which the network model prices, not the GPU "
                      "model, so a GPU changes nothing; change its network instead")


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
    return trace_gpu(graph.devices)


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
    mhz, notes = scenario_clock(gpu, scenario.gpu_clock_mhz, scenario.power_cap,
                                scenario.dvfs_exponent)
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
        key = (ops["op_name"][i], ops["dims"][i], ops["types"][i], ops["concrete"][i])
        if key not in cache:
            cache[key] = _compute_ratio(key, src, dst)
        factor[i], model_ns[i] = cache[key]
    if src.key != dst.key:  # another GPU: its floor, and HBM-bound classes by their bytes
        k = np.flatnonzero((kind == "kernel") & (cat != "comm") & (ops["dur"] > 0))
        dur = ops["dur"][k].astype(float)
        above = np.maximum(dur - src.kernel_floor_ns, 0.0)
        nbytes: dict[tuple, float | None] = {}
        for j, i in enumerate(k):
            if cat[i] in MEMORY_BOUND:
                key = (ops["op_name"][i], ops["dims"][i], ops["types"][i],
                       ops["concrete"][i])
                if key not in nbytes:
                    shapes = parse_shapes(key[1], key[2])
                    nbytes[key] = (memory_bytes(key[0] or "", *shapes, parse_json_list(key[3]))
                                   if shapes else None)
                factor[i] = memory_ratio(above[j], nbytes[key], src, dst)
        factor[k] = project_kernel_ns(dur, factor[k], src, dst) / dur
    return factor, model_ns


def op_dtype(dims: str | None, types: str | None) -> str | None:
    """The compute dtype of an op from its recorded input types (its first tensor's), or
    None when not recorded or not a floating type."""
    shapes = parse_shapes(dims, types)
    if not shapes or not shapes[1]:
        return None
    return DTYPE_OF.get(str(shapes[1][0]).lower())


def dtype_notes(graph: ReplayGraph, dst: Gpu) -> list[str]:
    """A note per dtype of the compute-bound kernels that ``dst`` has no units for (FP8 on
    an A100): they are projected at the next wider precision it has (``Gpu.runs_at``)."""
    ops = graph.ops
    sel = np.flatnonzero(np.isin(ops["category"].astype(str), COMPUTE_BOUND))
    by: dict[str, list[int]] = {}
    for i in sel:
        d = op_dtype(ops["dims"][i], ops["types"][i])
        if d is not None and dst.runs_at(d) != d:
            by.setdefault(d, []).append(i)
    total = max(float(ops["dur"].sum()), 1.0)
    return [f"{len(ix)} {d.upper()} compute kernels ({100 * ops['dur'][ix].sum() / total:.0f}% "
            f"of GPU op time): the {dst.name} has no {d.upper()} units, so they are projected "
            f"at its {dst.runs_at(d).upper()} peak, the next wider precision it has (as a "
            f"framework falls back); the model it ran may not run that way"
            for d, ix in sorted(by.items())]


def _compute_ratio(key: tuple, src: Gpu, dst: Gpu) -> tuple[float, float]:
    """(target / source time, source model ns or NaN) of a compute-bound op; ``key`` is
    (op name, Input Dims, Input type[, Concrete Inputs]) as the store keeps them."""
    op_name, dims, types = key[:3]
    work = work_of(op_name, dims, types, key[3] if len(key) > 3 else None)
    if work is not None and work.flops > 0:
        r_src = roofline_s(src, work)
        return roofline_s(dst, work) / r_src, r_src * 1e9
    dtype = op_dtype(dims, types) or "bf16"
    return (src.peak_tflops(dtype) * src.achievable["compute"]
            / (dst.peak_tflops(dtype) * dst.achievable["compute"])), math.nan


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
        out.append(len(g) >= max(world, 2) or bool(desc and DP_GROUP_DESC.search(str(desc))))
    return np.array(out, dtype=bool)


def _scaled(ranks: list[int], k: int, world: int) -> list[int]:
    return [r + world * j for j in range(k) for r in ranks]


def effective_bytes(net: Network, kind: str, ranks: list[int], seconds: float,
                    backend: str = "nccl", sharing: float = 1.0) -> float:
    """The message size at which ``net`` prices a collective at ``seconds``, its transfer
    time without the waiting (``graph._transfer_ns``), priced the way the projection prices
    it (``backend``, ``sharing``): bisection on a log scale, the model being monotonic in
    size. It is proportional to the bandwidth ``net`` assumes (``unknown_size_networks``)."""
    def t(nbytes: float) -> float:
        return collective_time(net, kind, nbytes, ranks, backend, sharing=sharing)

    lo, hi = 1.0, 1e13
    if t(lo) >= seconds:
        return lo
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if t(mid) < seconds:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def _unsized(graph: ReplayGraph) -> np.ndarray:
    """Per instance: a priced collective across ranks whose size the trace does not say."""
    insts = graph.insts
    return np.array([len(g) >= 2 and not b > 0 and kind in KINDS for g, b, kind in zip(
        insts["group_ranks"], insts["bytes"], insts["kind"], strict=True)], dtype=bool)


def _bandwidth_scaled(net: Network, lam: float) -> Network:
    return replace(net, intra_node_bw=net.intra_node_bw * lam,
                   inter_node_bw=net.inter_node_bw * lam,
                   dc_bw=None if net.dc_bw is None else net.dc_bw * lam)


def gradient_bandwidth_scale(graph: ReplayGraph, net: Network
                             ) -> tuple[float, int, float] | None:
    """(lam, steps, bytes): the factor on ``net``'s bandwidths at which the unsized
    allreduces of the steps whose gradients the trace shows (``ReplayGraph.grad_numel``)
    solve to those gradients' bytes; None if there are none.

    Why: a size solved from a transfer time is proportional to the bandwidth assumed (on
    the bandwidth-bound part of the curve), so a source network faster than the one the trace
    ran on gives sizes, and projections, too large by that factor (the 2021 BERT DDP pair ran
    its allreduces at ~0.5 GB/s, and a V100's default NVLink node solves 6 GB per 25 MB
    bucket). DDP allreduces every gradient once per backward pass, so a step's gradient
    allreduces carry its parameters' bytes: that fixes the one unknown, the bandwidth."""
    insts = graph.insts
    steps = graph.grad_numel
    sel = [i for i in np.flatnonzero(_unsized(graph))
           if insts["kind"][i] == "allreduce" and int(insts["step"][i]) in steps]
    if not sel:
        return None
    used = {int(insts["step"][i]) for i in sel}
    longest = max(sel, key=lambda i: insts["transfer_ns"][i])
    elem = insts["elem_bytes"][longest]
    target = sum(steps[s] for s in used) * (elem if elem > 0 else 4.0)
    lam = 1.0
    for _ in range(30):  # fixed point: bandwidth-bound sizes scale with lam
        got = sum(effective_bytes(_bandwidth_scaled(net, lam), "allreduce",
                                  insts["group_ranks"][i], insts["transfer_ns"][i] * 1e-9)
                  for i in sel)
        if abs(got / target - 1) < 1e-3:
            return lam, len(used), target
        lam *= target / got
        if not 1e-6 <= lam <= 1e6:
            return None
    return None


def unknown_size_networks(graph: ReplayGraph, scenario: Scenario, src: Network,
                          dst: Network) -> tuple[Network, Network, list[str]]:
    """The (source, target) networks that price a job none of whose collectives records
    its size (traces before ~2022), and what a projection then rests on, as notes.

    When the trace shows its gradients' shapes, a default source network's bandwidths are
    scaled so that the solved sizes carry them (``gradient_bandwidth_scale``), and so is a
    target that is a default too (``--gpu`` without ``--network``: the trace's network, on
    the target GPU's links); a ``--network`` is taken as given. A given ``--source-network``
    is kept, with a note when the gradients disagree with it."""
    unsized = _unsized(graph)
    if not unsized.any() or (graph.insts["bytes"] > 0).any():
        return src, dst, []
    # NCCL jobs only: a CPU job's (gloo) source network is given, not a default
    fit = gradient_bandwidth_scale(graph, src) if len(graph.ops["dur"]) else None
    if fit is None:
        hint = ("" if scenario.source_network is not None else " (give --source-network; "
                "with record_shapes the gradients' shapes calibrate it)")
        return src, dst, ["these sizes assume the collectives ran at the source network's "
                          "full speed: on a slower network the sizes, and the projection, "
                          f"come out too large{hint}"]
    lam, n_steps, nbytes = fit
    what = (f"the unsized allreduces of {n_steps} step(s) carry their gradients' "
            f"{nbytes / n_steps / 1e6:.1f} MB per step (AccumulateGrad shapes) at {lam:.3g}x "
            "the source network's bandwidth")
    if scenario.source_network is not None:
        return src, dst, ([f"{what}: the sizes and projection rest on the given source "
                           "network instead"] if not 0.5 <= lam <= 2 else [])
    scaled = _bandwidth_scaled(src, lam)
    if scenario.network is None:
        dst = _bandwidth_scaled(dst, lam)
    else:  # a --network's keys left at the source's (or set to them) follow its scaling
        dst = replace(dst, **{f.name: getattr(scaled, f.name) for f in fields(Network)
                              if getattr(dst, f.name) == getattr(src, f.name)})
    return scaled, dst, [
        f"{what}: the default source network was scaled by that"
        + (", and so were the --network bandwidths left at the source's"
           if scenario.network is not None else ", and so was the target's")]


def collective_factors(graph: ReplayGraph, scenario: Scenario
                       ) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Per collective instance: projected transfer / measured transfer, its model time on
    the source network in ns (NaN where unpriced), notes, and its model costs (n x 4: time
    and added latency on the source, then on the target, s; zeros where unpriced) for
    ``transfer_factor``."""
    insts = graph.insts
    n = len(insts["transfer_ns"])
    k, model_ns, costs = np.ones(n), np.full(n, np.nan), np.zeros((n, 4))
    notes: list[str] = []
    if not scenario.changes_network and scenario.gpu is None and scenario.expert_skew is None:
        return k, model_ns, notes, costs
    src = source_network(graph, scenario)
    dst = target_network(graph, scenario)
    if src is None or dst is None:
        if scenario.changes_network or scenario.expert_skew is not None:
            raise ValueError("the trace names no GPU of the catalog, so its network is "
                             "unknown: give --source-network (e.g. gpus_per_node=1,"
                             "inter_node_bw=1Gbit/s)")
        return k, model_ns, notes, costs
    dp = _dp_groups(graph) if scenario.dp_scale != 1 else np.zeros(n, dtype=bool)
    world = world_size(graph)
    backend = "nccl" if len(graph.ops["dur"]) else "gloo"  # a CPU job's collectives: gloo
    if scenario.dp_scale != 1:  # before the projected groups are built: they are world x k
        check_dp_scale(world, scenario.dp_scale, gloo=backend == "gloo")
    src, dst, size_notes = unknown_size_networks(graph, scenario, src, dst)
    cache: dict[tuple, tuple[float, float, float, float]] = {}
    bound: dict[tuple, tuple[float, float] | None] = {}  # per key: host-bound on the target
    sharing = 1 + overlap_share(graph)
    idle = idle_before(graph) if backend == "gloo" else np.zeros(n)
    shares_host = backend == "gloo" and (src.host_cpus, dst.host_cpus) != (None, None)
    busy_src = cpu_busy_share(graph) if shares_host else np.zeros(n)
    per_pair = priced_per_pair(graph, scenario, dp)
    plan = expert_plan(graph, scenario)
    guessed = int(sum(1 for i in range(n) if len(insts["group_ranks"][i]) >= 2
                      and not insts["bytes"][i] > 0 and insts["kind"][i] in KINDS))

    def price(busy_dst: np.ndarray) -> dict[tuple, tuple[float, float] | None]:
        """Fill ``costs``; per distinct collective, its host-bound rates on the target."""
        used: set[tuple] = set()
        for i in range(n):
            ranks = insts["group_ranks"][i]
            if len(ranks) < 2:
                continue
            if per_pair[i]:
                m = alltoall.source_matrix(insts, i)  # priced per pair (alltoall.py)
                costs[i] = alltoall.costs(src, dst, m, plan.target.get(i, m), ranks, backend,
                                          round(idle[i], 3))
                continue
            kind = insts["kind"][i]
            nbytes = insts["bytes"][i]
            if not nbytes > 0:
                if kind not in KINDS:
                    continue  # not priced: keeps its measured transfer
                nbytes = effective_bytes(src, kind, ranks, insts["transfer_ns"][i] * 1e-9,
                                         backend, round(sharing[i], 2))
            key = (kind, float(nbytes), tuple(ranks), bool(dp[i]), round(sharing[i], 2),
                   round(idle[i], 3), round(busy_src[i], 2), round(busy_dst[i], 2))
            if key not in cache:
                dst_ranks = _scaled(ranks, scenario.dp_scale, world) if dp[i] else ranks
                cache[key] = _costs(src, dst, kind, nbytes, ranks, dst_ranks, backend,
                                    *key[-4:])
                bound[key] = (host_bound(dst, kind, dst_ranks, key[-1])
                              if backend == "gloo" else None)
            costs[i] = cache[key]
            used.add(key)
        return {key: bound[key] for key in used}

    host_bound_on = price(busy_src)
    if shares_host:  # the CPU work beside each collective over its projected span
        k = transfer_factor(insts["transfer_ns"] * 1e-9, *costs.T)
        host_bound_on = price(cpu_busy_share(graph, k))
    k = transfer_factor(insts["transfer_ns"] * 1e-9, *costs.T)
    model_ns = np.where(costs[:, 0] > 0, costs[:, 0] * 1e9, np.nan)
    unpriced = unpriced_comm_note(graph, costs[:, 0] > 0)
    notes += [unpriced] if unpriced else []
    notes += host_bound_note(host_bound_on, dst)
    if guessed:
        notes.append(f"{guessed} collectives without a recorded size: sized from their "
                     "transfer time (the last arrival's time in them, without the waiting) "
                     "under the source network")
        notes += size_notes
    return k, model_ns, notes, costs


def host_bound_note(bound: Mapping[tuple, tuple[float, float] | None], dst: Network
                    ) -> list[str]:
    """The note for a gloo projection whose collectives the host's CPU, not the link, paces
    on the target network (``transport.host_bound``, per distinct collective): so a
    projection onto a fast link is not read as the network's."""
    hit = [v for v in bound.values() if v is not None]
    if not hit:
        return []
    host, link = min(h for h, _ in hit), min(lk for _, lk in hit)
    cores = (f"{dst.host_cpus} cores shared by the ranks" if dst.host_cpus is not None else
             "a core per rank")
    return [f"gloo is host-bound at this bandwidth: {len(hit)} of the {len(bound)} "
            f"collectives priced (by kind, size and group) move their bytes at the host's "
            f"rate (down to {host / 1e6:.0f} MB/s per "
            f"rank: transport.GLOO_HOST_RATE {transport.GLOO_HOST_RATE / 1e6:.0f} MB/s a "
            f"core, {cores}), below the link's TCP rate ({link / 1e6:.0f} MB/s): their "
            "projected time is the CPU's, not the network's (the rate is fitted on the "
            "netlab rig's 2-core VM; another host's CPU may move more or less)"]


def _priced(graph: ReplayGraph) -> np.ndarray:
    """Per instance: does the network model price it (``collective_factors``: peers in the
    trace, a kind it knows; an unsized one is sized from its transfer time)."""
    insts = graph.insts
    return np.array([len(g) >= 2 and kind in KINDS for g, kind in zip(
        insts["group_ranks"], insts["kind"], strict=True)], dtype=bool)


def unpriced_comm_note(graph: ReplayGraph, priced: np.ndarray) -> str | None:
    """The note on the communication kernels no network model prices (they keep their
    measured times): how many, how much time, and why. ``priced``: per instance."""
    ops = graph.ops
    is_comm = np.asarray(ops["is_comm"], dtype=bool)
    if not is_comm.any():
        return None
    inst_of = np.full(len(is_comm), -1, dtype=np.int64)
    sel = (graph.role == COMM_DURATION) & (graph.op >= 0)
    inst_of[graph.op[sel]] = graph.inst[sel]
    insts = graph.insts
    why: dict[str, int] = {}
    for i in np.flatnonzero(is_comm & ((inst_of < 0) | ~priced[np.maximum(inst_of, 0)])):
        j = inst_of[i]
        if j < 0:
            reason = "not matched to a call on the other ranks"
        elif len(insts["group_ranks"][j]) < 2:
            reason = "with no peer rank in the trace (its group is unknown or one rank)"
        elif insts["kind"][j] not in KINDS:
            reason = f"of a kind the model does not price ({insts['kind'][j]})"
        else:
            reason = "the model could not price"
        why[reason] = why.get(reason, 0) + 1
    if not why:
        return None
    n = sum(why.values())
    unpriced = is_comm & ((inst_of < 0) | ~priced[np.maximum(inst_of, 0)])
    ms = float(np.asarray(ops["dur"], dtype=float)[unpriced].sum()) / 1e6
    parts = "; ".join(f"{c} {r}" for r, c in sorted(why.items(), key=lambda x: -x[1]))
    return (f"{n} communication kernels ({ms:.3f} ms over the replayed ranks) are not priced "
            f"by the network model and stay as measured: {parts}")


# the links each network setting prices (Network.link): intra-node, inter-node, datacenter
_LINK_OF = {"intra_node_bw": {"intra"}, "intra_node_latency": {"intra"},
            "inter_node_bw": {"inter", "dc"}, "inter_node_latency": {"inter", "dc"},
            "dc_bw": {"dc"}, "dc_latency": {"dc"},
            "host_cpus": {"intra", "inter", "dc"}}  # a gloo job's every link (its host)


class GpuNoOp(WhatIfError):
    """A --gpu that is the GPU the trace ran on (and no clock or power cap): it changes
    nothing. A sweep replays such a grid point on the trace's own GPU (the same numbers)."""


class NetworkNoOp(WhatIfError):
    """A network / dp-scale what-if that prices no edge (``_refuse_network_noop``). A sweep
    refuses an axis none of whose values changes one, and replays a grid point that changes
    none on the source network (the same numbers)."""


def _refuse_network_noop(graph: ReplayGraph, scenario: Scenario, priced: np.ndarray,
                         unpriced: str | None, src: Network | None, dst: Network | None
                         ) -> None:
    """``WhatIfError`` for a --network / --dp-scale that changes no priced edge: nothing is
    priced, or every setting it changes is of a link no priced collective crosses (a 2-rank
    job on one 8-GPU node crosses no inter-node link, so inter_node_bw changes nothing).
    A setting equal to the source's is no change, and is not refused here (a sweep may
    hold the traced value, a Python caller replay the source network as an identity check);
    the command line refuses a network that is all the source's (``check_network_changes``)."""
    job = graph.job
    if not priced.any():
        why = f"; {unpriced}" if unpriced else ""
        raise NetworkNoOp(f"the network changes nothing: job {job} has no collective across "
                          f"ranks that the network model prices{why}")
    if scenario.network is None or scenario.dp_scale != 1 or src is None or dst is None:
        return
    changed = [f.name for f in fields(Network) if getattr(src, f.name) != getattr(dst, f.name)]
    if not changed:
        return
    groups = {tuple(sorted(g)) for g, ok in zip(graph.insts["group_ranks"], priced,
                                                 strict=True) if ok}
    topology = {"gpus_per_node", "ranks_per_dc", "placement"} & set(changed)
    backend = "nccl" if len(graph.ops["dur"]) else "gloo"  # as collective_factors
    crossed: set[str] = set()
    for g in groups:
        if topology and (priced_shape(src, list(g), backend)
                         != priced_shape(dst, list(g), backend)):
            return  # the placement changes the links a collective crosses, or how
        crossed |= link_classes(src, list(g)) | link_classes(dst, list(g))
    if any(_LINK_OF.get(c, set()) & crossed for c in changed):
        return
    n = max(max(g) + 1 for g in groups)
    links = [_LINK_OF[c] for c in changed if c in _LINK_OF]  # not the placement keys
    if "placement" in changed:
        changed[changed.index("placement")] = f"--placement {dst.layout.source}"
        why = ("every collective crosses the same links, the same way, as on the source "
               f"network's placement ({src.layout.source})")
    elif "ranks_per_dc" in changed and dst.dc_bw is None and dst.dc_latency == 0:
        why = ("with no dc_bw or dc_latency a link across datacenters is a node's link, so "
               "the datacenters move no collective onto another link")
    elif links and all(x == {"dc"} for x in links):
        why = ("no collective of this job crosses datacenters" + (
            "" if dst.ranks_per_dc else " (one datacenter: set ranks_per_dc)"))
    elif crossed <= {"intra"}:
        why = (f"every collective of this job is intra-node: gpus_per_node="
               f"{dst.gpus_per_node} >= {n} ranks")
    else:
        why = "no collective of this job crosses a link they set"
    raise NetworkNoOp(f"network setting(s) {', '.join(changed)} change nothing for job {job}: "
                      f"{why}")


def check_network_changes(graph: ReplayGraph, scenario: Scenario) -> None:
    """``NetworkNoOp`` for a --network whose every setting is the source network's (no
    --gpu beside it, which would keep the old network on the new GPU; no --dp-scale): the
    command line's what-if changes nothing. Not part of ``check_scenario``: from Python,
    replaying the source network is an identity check."""
    if scenario.network is None or scenario.gpu is not None or scenario.dp_scale != 1:
        return
    if source_network(graph, scenario) == scenario.network:
        raise NetworkNoOp(f"the network changes nothing for job {graph.job}: every setting "
                          "of it is the source network's")


def priced_per_pair(graph: ReplayGraph, scenario: Scenario, dp: np.ndarray | None = None
                    ) -> np.ndarray:
    """Per instance: an all-to-all priced per pair of ranks (``alltoall.py``: its split sizes
    are recorded, or ``--expert-skew`` redistributes it), not as uniform; never one that
    --dp-scale widens (its pairs are unknown)."""
    insts = graph.insts
    n = len(insts["transfer_ns"])
    pairs = insts.get("pair_bytes") or [None] * n
    target = expert_plan(graph, scenario).target
    dp = _dp_groups(graph) if dp is None and scenario.dp_scale != 1 else dp
    return np.array([k == "all_to_all" and len(g) >= 2 and (m is not None or i in target)
                     and not (dp is not None and dp[i])
                     for i, (k, g, m) in enumerate(zip(insts["kind"], insts["group_ranks"],
                                                       pairs, strict=True))], dtype=bool)


def expert_plan(graph: ReplayGraph, scenario: Scenario) -> SkewPlan:
    """The scenario's ``--expert-skew`` plan (``alltoall.skew_plan``; empty without one),
    computed once per graph and skew."""
    if scenario.expert_skew is None:
        return SkewPlan()
    key = ("expert_plan", scenario.expert_skew)
    if key not in graph.memo:
        graph.memo[key] = skew_plan(graph.insts, _comm_spans(graph), scenario.expert_skew,
                                    graph.job)
    return graph.memo[key][0]


def check_expert_skew_changes(graph: ReplayGraph, scenario: Scenario) -> None:
    """``WhatIfError`` for an ``--expert-skew`` that moves no byte and no expert's work (the
    routing the trace already has). Not part of ``check_scenario``: from Python, replaying
    the trace's own routing is an identity check."""
    if scenario.expert_skew is None:
        return
    plan, source = graph.memo.get(("expert_plan", scenario.expert_skew)) or skew_plan(
        graph.insts, _comm_spans(graph), scenario.expert_skew, graph.job)
    if not plan.changes(source):
        raise ExpertSkewNoOp(f"--expert-skew {scenario.expert_skew} changes nothing for job "
                             f"{graph.job}: it is the routing the trace has")


def _scale_experts(graph: ReplayGraph, scenario: Scenario, out: Weights) -> None:
    """The expert compute (``alltoall.skew_plan``'s windows: the work on a rank between its
    dispatch and its combine: CPU work, and GPU ops other than communication) scaled by the
    tokens its expert gets, target over traced; a note with the tokens."""
    plan = expert_plan(graph, scenario)
    if not plan.windows:
        return
    t_src, t_dst = graph.t0[graph.src], graph.t0[graph.dst]
    edge_rank = graph.rank[graph.dst >> 1]
    work = cpu_work(graph)
    gpu = graph.role == OP_DURATION
    if gpu.any():
        gpu[gpu] = ~graph.ops["is_comm"][graph.op[gpu]].astype(bool)
    work |= gpu
    factor = np.ones(len(t_src))
    mine = {}  # per rank: its work edges by start time (windows x edges would not scale)
    for r in {w[0] for w in plan.windows}:
        e = np.flatnonzero(work & (edge_rank == r))
        mine[r] = e[np.argsort(t_src[e], kind="stable")]
    for r, a, b, f in plan.windows:
        e = mine[r]
        e = e[np.searchsorted(t_src[e], a, "left"):np.searchsorted(t_src[e], b, "right")]
        factor[e[t_dst[e] <= b]] = f
    hit = factor != 1
    out.w[hit] *= factor[hit]
    out.w_alt[hit] *= factor[hit]
    for g, (traced, target) in plan.tokens.items():
        out.notes.append(
            f"--expert-skew {scenario.expert_skew}: the all-to-alls of ranks "
            f"{number_ranges(list(g))} routed Zipf({scenario.expert_skew.zipf:g}): the experts "
            "get " + ", ".join(f"rank {r} {100 * x / target.sum():.1f}%"
                               for r, x in zip(g, target, strict=True))
            + " of the tokens (traced: " + ", ".join(f"{100 * x / traced.sum():.1f}%"
                                                     for x in traced)
            + "); the work between each rank's dispatch and combine is scaled by its tokens")
    if not len(graph.ops["dur"]):  # a CPU job: the experts ran on host cores
        out.notes.append("--expert-skew on a CPU job: each expert's time per token is the "
                         "traced one; where ranks share cores it changes with the "
                         "neighbours' load, which the replay does not model (the rig's uniform "
                         "job ran its experts 2x slower per token than its skewed ones: "
                         "docs/moe.md)")


class ExpertSkewNoOp(WhatIfError):
    """An --expert-skew that is the routing the trace has (``check_expert_skew_changes``)."""


def _comm_spans(graph: ReplayGraph) -> tuple[np.ndarray, ...]:
    """(rank, instance, start, end) of every rank's part in every collective instance."""
    own = np.flatnonzero(graph.role == COMM_DURATION)
    end = graph.dst[own]
    return graph.rank[end >> 1], graph.inst[own], graph.t0[graph.src[own]], graph.t0[end]


def overlap_share(graph: ReplayGraph) -> np.ndarray:
    """Per collective instance: the share of its span (mean over its ranks) during which
    another collective of the same rank was in flight: gloo runs two at once (two runloop
    threads), and they share the connections. Computed once per graph."""
    if "overlap_share" not in graph.memo:
        graph.memo["overlap_share"] = _overlap_share(graph)
    return graph.memo["overlap_share"]


def _overlap_share(graph: ReplayGraph) -> np.ndarray:
    n = len(graph.insts["transfer_ns"])
    rank, inst, t0, t1 = _comm_spans(graph)
    share, count = np.zeros(n), np.zeros(n)
    for sel in _by_rank(rank):
        a, b = t0[sel], t1[sel]
        for lo in range(0, len(sel), 512):  # rows of the rank's span x span overlaps
            rows = slice(lo, lo + 512)
            cover = np.clip(np.minimum(b[rows, None], b[None, :])
                            - np.maximum(a[rows, None], a[None, :]), 0, None)
            cover[np.arange(cover.shape[0]), np.arange(lo, lo + cover.shape[0])] = 0
            span = b[rows] - a[rows]
            ok = span > 0
            frac = np.minimum(cover.sum(axis=1)[ok] / span[ok], 1.0)
            np.add.at(share, inst[sel][rows][ok], frac)
            np.add.at(count, inst[sel][rows][ok], 1)
    return np.divide(share, count, out=np.zeros(n), where=count > 0)


def _by_rank(rank: np.ndarray) -> list[np.ndarray]:
    """Indices of ``rank``'s entries per rank, each in their original order."""
    order = np.argsort(rank, kind="stable")
    cuts = np.flatnonzero(np.diff(rank[order])) + 1
    return np.split(order, cuts) if len(order) else []


def cpu_busy_share(graph: ReplayGraph, scale: np.ndarray | None = None) -> np.ndarray:
    """Per collective instance: the share of its span (mean over its ranks) during which the
    rank's own CPU work (``cpu_work``) ran on its other threads: a gloo collective's bytes
    are moved by a CPU that this work competes for when the ranks share a host's cores
    (``transport.host_share``). ``scale``: per instance, the span's projected / measured
    length (a collective projected shorter overlaps the backward pass it was launched in
    more densely); None: as measured, computed once per graph."""
    if scale is not None:
        return _cpu_busy_share(graph, scale)
    if "cpu_busy_share" not in graph.memo:
        graph.memo["cpu_busy_share"] = _cpu_busy_share(graph)
    return graph.memo["cpu_busy_share"]


def _cpu_busy_share(graph: ReplayGraph, scale: np.ndarray | None = None) -> np.ndarray:
    n = len(graph.insts["transfer_ns"])
    rank, inst, t0, t1 = _comm_spans(graph)
    if scale is not None:
        t1 = t0 + (t1 - t0) * scale[inst]
    own = np.flatnonzero(graph.role == COMM_DURATION)
    track = graph.track[graph.dst[own] >> 1]
    work = np.flatnonzero(cpu_work(graph))
    w_slot = graph.dst[work] >> 1
    w_rank, w_track = graph.rank[w_slot], graph.track[w_slot]
    w0, w1 = graph.t0[graph.src[work]], graph.t0[graph.dst[work]]
    share, count = np.zeros(n), np.zeros(n)
    for r in np.unique(rank):
        sel = np.flatnonzero(rank == r)
        mine = w_rank == r
        a, b, tr = w0[mine], w1[mine], w_track[mine]
        for lo in range(0, len(sel), 64):  # rows of the rank's spans x its CPU work
            rows = sel[lo:lo + 64]
            cover = np.clip(np.minimum(t1[rows, None], b[None, :])
                            - np.maximum(t0[rows, None], a[None, :]), 0, None)
            cover[track[rows, None] == tr[None, :]] = 0  # the collective's own thread
            span = t1[rows] - t0[rows]
            ok = span > 0
            frac = np.minimum(cover.sum(axis=1)[ok] / span[ok], 1.0)
            np.add.at(share, inst[rows][ok], frac)
            np.add.at(count, inst[rows][ok], 1)
    return np.divide(share, count, out=np.zeros(n), where=count > 0)


def idle_before(graph: ReplayGraph) -> np.ndarray:
    """Per collective instance: seconds since its ranks' previous collective ended (the
    shortest over its ranks; 0 for a rank's first one in the trace, whose past is unknown),
    for TCP's slow start after idle. Computed once per graph."""
    if "idle_before" in graph.memo:
        return graph.memo["idle_before"]
    n = len(graph.insts["transfer_ns"])
    rank, inst, t0, t1 = _comm_spans(graph)
    idle = np.full(n, np.inf)
    for sel in _by_rank(rank):
        sel = sel[np.argsort(t0[sel], kind="stable")]
        last = np.maximum.accumulate(t1[sel])
        gap = np.concatenate([[0.0], np.maximum(t0[sel][1:] - last[:-1], 0.0)])
        np.minimum.at(idle, inst[sel], gap * 1e-9)
    graph.memo["idle_before"] = np.where(np.isfinite(idle), idle, 0.0)
    return graph.memo["idle_before"]


def _costs(src: Network, dst: Network, kind: str, nbytes: float, ranks: list[int],
           dst_ranks: list[int], backend: str, sharing: float, idle_s: float,
           busy_src: float = 0.0, busy_dst: float = 0.0
           ) -> tuple[float, float, float, float]:
    """(time, added latency) of a collective on the source, then on the target network
    (``busy_*``: the share of its span its ranks' CPU work ran beside it on each)."""
    a, b = (src, kind, nbytes, ranks, backend, idle_s, sharing, busy_src), (
        dst, kind, nbytes, dst_ranks, backend, idle_s, sharing, busy_dst)
    try:
        return collective_time(*a), added_latency(*a), collective_time(*b), added_latency(*b)
    except ValueError:
        return 0.0, 0.0, 0.0, 0.0


def transfer_factor(measured_s: ArrayLike, c_src: ArrayLike, lat_src: ArrayLike,
                    c_dst: ArrayLike, lat_dst: ArrayLike) -> np.ndarray:
    """Projected / measured transfer of a collective whose model time is ``c_src`` (of which
    ``lat_src`` is added latency) on the source network and ``c_dst`` (``lat_dst``) on the
    target (scalars or arrays). The measured time beyond the source's latency is the
    bandwidth-bound part: it scales by the model's bandwidth-bound ratio, so the measured
    efficiency (link shared with other collectives, protocol overheads) carries over; the
    latency part is replaced by the target's, since a propagation delay is not slowed by a
    busy link. Exact for the identity; with no added latency on either side, the plain ratio
    ``c_dst / c_src``; 1 where unpriced (``c_src`` = 0)."""
    m, cs, ls, cd, ld = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (
        measured_s, c_src, lat_src, c_dst, lat_dst)))
    lat_part = np.minimum(m, ls)
    bw_src, bw_dst = cs - ls, cd - ld
    ratio = np.divide(bw_dst, bw_src, out=np.ones_like(m), where=bw_src > 0)
    lat = np.where(ls > 0, lat_part * np.divide(ld, ls, out=np.zeros_like(m), where=ls > 0),
                   ld)
    out = np.divide((m - lat_part) * ratio + lat, m, out=np.ones_like(m), where=m > 0)
    plain = np.divide(cd, cs, out=np.ones_like(m), where=cs > 0)
    return np.where(cs > 0, np.where(m > 0, out, plain), 1.0)


def _scaled_both(measured: np.ndarray, factor: np.ndarray, model_ns: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(measured x factor, measured - m + m x factor) with m the modelled part of it."""
    m = np.where(np.isnan(model_ns), measured, np.minimum(measured, model_ns))
    return measured * factor, measured - m + m * factor


FLOOR_NOTE_SHARE = 0.25  # the share of the projected kernel time set by floors that is said


def _floor_note(graph: ReplayGraph, factor: np.ndarray, src: Gpu | None, dst: Gpu
                ) -> list[str]:
    """On another GPU, when the target's kernel floor (``project_kernel_ns``) is at least
    FLOOR_NOTE_SHARE of the projected kernel time: how much, so a large change that comes
    from short kernels taking the floor (a 20 ns kernel projected to 2.1 us) is not read as
    the GPU being slower."""
    ops = graph.ops
    cat = ops["category"].astype(str)
    k = (ops["kind"].astype(str) == "kernel") & (cat != "comm") & (ops["dur"] > 0)
    if src is None or src.key == dst.key or not k.any() or dst.kernel_floor_ns <= 0:
        return []
    projected = float((ops["dur"][k] * factor[k]).sum())
    floors = dst.kernel_floor_ns * int(k.sum())
    if projected <= 0 or floors < FLOOR_NOTE_SHARE * projected:
        return []
    under = int((ops["dur"][k] <= src.kernel_floor_ns).sum())
    return [f"the {dst.key} kernel floor ({dst.kernel_floor_ns / 1e3:g} us per kernel, "
            f"tracetool/gpus/{dst.key}.toml) sets {100 * min(floors / projected, 1):.0f}% of the "
            f"projected kernel time ({_time(floors)} of {_time(projected)}, "
            f"{int(k.sum())} kernel{'s' if k.sum() != 1 else ''}; {under} ran at or under "
            f"the {src.key} floor of "
            f"{src.kernel_floor_ns / 1e3:g} us): short kernels take the floor, not their "
            "measured time scaled, so that share of the projection rests on the floor's value"]


def _time(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms" if ns >= 1e6 else f"{ns / 1e3:,.3f} us"


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
        elif dst is not None:
            clock_notes += _floor_note(graph, f, source_gpu(graph, scenario), dst)
        if scenario.gpu is not None:
            clock_notes += dtype_notes(graph, scenario.gpu)
    k, model_ns, notes, costs = collective_factors(graph, scenario)
    shared = overlap_share(graph) if (k != 1).any() else None
    out.notes = clock_notes + notes
    if (k != 1).any():
        t = graph.insts["transfer_ns"]
        new, alt = _scaled_both(t, k, model_ns)
        own = graph.role == COMM_DURATION
        w[own], out.w_alt[own] = new[graph.inst[own]], alt[graph.inst[own]]
        xfer = graph.role == TRANSFER
        i = graph.inst[xfer]
        lag = graph.base_w[xfer]  # this rank's end - the last arrival (< 0 only from skew)
        # each rank's own time after the last arrival: the job's projected transfer, plus
        # this rank's excess over the measured one, scaled with the transfer only for the
        # share of the span it shared the link with another collective (its bytes went
        # slower) and kept otherwise (its CPU was late: two ranks on a core, a busy thread)
        excess = lag - t[i]
        c = costs[i]
        bw_src, bw_dst = c[:, 0] - c[:, 1], c[:, 2] - c[:, 3]
        ratio = np.divide(bw_dst, bw_src, out=np.ones(len(i)), where=bw_src > 0)
        # an all-to-all priced per pair: ranks end when their own pairs are done, so a rank's
        # time beyond the shortest is its link's extra bytes, and scales like them
        scale = np.where(priced_per_pair(graph, scenario)[i], ratio,
                         1 + shared[i] * (ratio - 1))
        w[xfer] = np.where(lag > 0, np.maximum(new[i] + excess * scale, 0.0), lag)
        out.w_alt[xfer] = lag + (alt - t)[i]
    if scenario.changes_cpu:
        _scale_cpu(graph, scenario, out)
    if scenario.expert_skew is not None:
        _scale_experts(graph, scenario, out)
    return out


