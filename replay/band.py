"""The uncertainty band of a projection: per-component error terms, carried through the schedule.

A scenario changes some edges of the graph (GPU op durations under a hardware model, collective
transfers under a network model) and, when it moves the job to another machine (``--gpu``),
the host's CPU time is no longer the one measured. Each such edge gets a relative error ``e``
from the component that priced it and its regime (``ERRORS``): the true weight is taken to lie
in ``[w / (1 + e), w * (1 + e)]``, a ratio error, since models predict ratios. The schedule is a
max-plus system, every point the latest of (source + weight) over its in-edges, so it is
monotone in every weight: scheduling once with every uncertain weight at its low end and once
at its high end bounds every projected time, with no sampling. The band of a step is the span
of those two schedules' step times together with the model's two calibrations
(``model.Weights``), widened by the job's own step-to-step variation (``widen``: a ratio
too, so a band never holds a negative time).

The error terms are what the model missed on the project's own ground truth
(``benchmarks/replay_accuracy.py`` prints them; ``docs/replay_band.md`` says how each was
measured), so the band covers those cases by construction: it is calibrated there, not
validated there. The network terms are the exception: sized from errors out of sample (each
netlab job left out of the fit in turn, ``fit_network_terms``). A term nothing measured is
marked ``measured=False`` and a projection that uses it says so in its notes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .compute import COMPUTE_BOUND
from .graph import COMM_DURATION, OP_DURATION, TRANSFER, ReplayGraph
from .model import (
    Scenario,
    cpu_busy_share,
    cpu_work,
    source_gpu,
    source_network,
    target_network,
    weights,
)
from .network import collective_time
from .transport import host_bound

SMALL_KERNEL_NS = 10_000  # below this a kernel is launch/latency-bound (issue 13, item 5)


@dataclass(frozen=True)
class ErrorTerm:
    e: float  # relative (ratio) error: the truth within [x / (1 + e), x * (1 + e)]
    source: str  # where the value comes from
    measured: bool = True


ERRORS: dict[str, ErrorTerm] = {
    # the GPU terms: sized by benchmarks/gpu_accuracy.py (size_terms) on the three H100 /
    # MI300X pairs, both directions; the same rule on two pairs sizes the band that is
    # checked on the third (leave one pair out); tests/test_gpu_model.py holds the hash of
    # these and the catalog. kernel_small / kernel_large: the hardware model's own error, on
    # the classes whose kernels are the same code on both vendors (MEMORY_BOUND: PyTorch's
    # native elementwise, reduction and norm kernels); kernel_library: the compute-bound
    # classes, whose kernels the target's libraries pick (LIBRARY_CLASSES)
    "kernel_small": ErrorTerm(
        0.29, "the memory-bound classes (elementwise, reduction, norm: PyTorch's own kernels "
        "on both vendors) of the one pair whose kernels are launch-sized (bert-small H100 <-> "
        "MI300X, 2-5 us): -17.6% / +28.1%; benchmarks/gpu_accuracy.py size_terms"),
    "kernel_large": ErrorTerm(
        0.04, "the memory-bound classes of the Qwen1.5-0.5B and TimeSformer H100 <-> MI300X "
        "pairs: -2.9% to +3.0%; benchmarks/gpu_accuracy.py size_terms"),
    "kernel_library": ErrorTerm(
        0.68, "gemm, conv and attention kernels onto another GPU: its libraries pick the "
        "kernels (cuBLAS / cuDNN / FlashAttention-2 on the H100, hipBLASLt / MIOpen / a "
        "Triton attention on the MI300X), an implementation no hardware figure predicts; "
        "the three H100 <-> MI300X pairs' kernel time of these classes: bert-small -36% / "
        "+68% (4 Triton attention kernels at 3x FlashAttention's time), TimeSformer -25% / "
        "+36% (the MI300X's bmm of 37632 8x64 matrices 1.1 ms against 41 us; the H100's "
        "3137-wide bmm in sm75 cutlass kernels at 1.6-2.1x the MI300X's time), Qwen1.5-0.5B "
        "-13% / +15%; benchmarks/gpu_accuracy.py size_terms"),
    # host_cpu: fit_host_cpu over benchmarks/gpu_accuracy.py's projections (fit set
    # HOST_FIT_SET; hashed with the GPU terms there). The net_* terms: fit_network_terms (fit
    # set NETWORK_FIT_SET), validated out of sample and recorded with a hash of their values
    # and data by benchmarks/replay_accuracy.py (benchmarks/accuracy_record.json)
    "host_cpu": ErrorTerm(
        0.15, "the H100 / MI300X pairs of ../shared/traces (HOST_FIT_SET): the CPU work "
        "(model.cpu_work) of the two traces' projected step differs by 14.8% (TimeSformer), "
        "11.3% (Qwen1.5-0.5B), 11.0% (bert-small); fit_host_cpu, the worst, rounded up. The "
        "traces do not name their CPUs: --gpu keeps the source host's CPU time, --cpu-speedup "
        "scales it by one factor (where the bert-small pair's kinds of CPU work differ by "
        "1.05-1.12x)"),
    "net_bandwidth": ErrorTerm(
        0.24, "netlab (sample_traces/netlab, NETWORK_FIT_SET: both captures' settings not held "
        "out in validation.json): DDP collectives projected from every setting onto every "
        "other of the same job, each job family with SHARED_FILL and GLOO_HOST_RATE fitted "
        "without it (leave one family out): worst out-of-sample ratio error of the mean step "
        "23.2% (the one-bucket job, b1_1gbit_5ms onto b1_1gbit: one 16.8 MB message across "
        "+5 ms); the first capture's jobs alone reach 10.8%; fit_network_terms"),
    "net_latency": ErrorTerm(
        0.24, "the same out-of-sample errors, of the pairs whose collectives include "
        "latency-bound ones (1-10 ms one way, and the loss allreduce): the same worst pair"),
    "net_all_to_all": ErrorTerm(
        0.07, "netlab MoE all-to-all job (4 ranks, 4 settings, 1 Gbit/s to 500 Mbit/s and "
        "2-5 ms), projected onto each other: worst error 6.8% (it does not depend on "
        "SHARED_FILL or GLOO_HOST_RATE, so in and out of sample agree); fit_network_terms"),
    "net_host": ErrorTerm(
        0.47, "netlab's gloo collectives the host's CPU paces (transport.host_bound, on the "
        "source or the target: the 10 Gbit/s settings), out of sample as net_bandwidth: "
        "worst ratio error 46.5% (m2_1gbit onto m2_10gbit, GLOO_HOST_RATE fitted without that "
        "job at 300 MB/s; partly steps whose DDP wait the graph does not link to the "
        "transfer, which no network projection moves); fit_network_terms"),
    "net_unknown_size": ErrorTerm(
        1.0, "collectives without a recorded size are sized from their transfer time under the "
        "source network, so their projection rests on that model twice", measured=False),
}
# the kernel classes whose implementation is the vendor's library's (cuBLAS, cuDNN,
# FlashAttention on NVIDIA; hipBLASLt, MIOpen, Triton / CK attention on AMD), not PyTorch's own
LIBRARY_CLASSES = COMPUTE_BOUND


def kernel_terms(graph: ReplayGraph, scenario: Scenario) -> dict[str, np.ndarray]:
    """Per GPU op of ``graph``, the kernel terms that price its projection under ``scenario``
    (a GPU or clock change): kernel_small / kernel_large by its measured duration, and, onto
    another GPU, kernel_library for the LIBRARY_CLASSES: the target runs the kernels its
    libraries pick for its architecture (another vendor's: another implementation), whose
    speed no hardware figure gives. Measured across vendors only (the H100 / MI300X pairs);
    within a vendor the libraries also pick per architecture (the TimeSformer H100 trace
    ran sm75 cutlass kernels), so the term applies to any change of GPU, not of clock. One
    rule for ``edge_errors`` and benchmarks/gpu_accuracy.py's kernel-time band."""
    ops = graph.ops
    small = ops["dur"] < SMALL_KERNEL_NS
    out = {"kernel_small": small, "kernel_large": ~small}
    src = source_gpu(graph, scenario) if scenario.gpu is not None else None
    if src is not None and src.key != scenario.gpu.key:
        out["kernel_library"] = np.isin(ops["category"].astype(str), LIBRARY_CLASSES)
    return out


def op_errors(graph: ReplayGraph, scenario: Scenario,
              terms: Mapping[str, float] | None = None) -> np.ndarray:
    """Per GPU op, its relative error under ``scenario`` (``kernel_terms``; the widest term
    that applies), with the terms' values from ``terms`` where given, else ERRORS."""
    e = np.zeros(len(graph.ops["dur"]))
    for term, mask in kernel_terms(graph, scenario).items():
        v = terms[term] if terms is not None and term in terms else ERRORS[term].e
        e[mask] = np.maximum(e[mask], v)
    return e


LATENCY_BOUND = 0.5  # share of a collective's target time that is latency: then latency-bound


def edge_errors(graph: ReplayGraph, scenario: Scenario, w: np.ndarray
                ) -> tuple[np.ndarray, dict[str, int]]:
    """Per edge, its relative error under ``scenario`` (0 where the edge keeps its measured
    weight, or where the user set it: ``--speedup``), and how many edges each term covers."""
    e = np.zeros(len(w))
    used: dict[str, int] = {}

    def put(mask: np.ndarray, term: str) -> None:
        if mask.any():
            e[mask] = np.maximum(e[mask], ERRORS[term].e)
            used[term] = used.get(term, 0) + int(mask.sum())

    role = graph.role
    changed = w != graph.base_w
    gpu_model = scenario.gpu is not None or scenario.changes_clock
    if gpu_model:
        idx = np.flatnonzero((role == OP_DURATION) & changed)
        for term, of_op in kernel_terms(graph, scenario).items():
            mask = np.zeros(len(w), dtype=bool)
            mask[idx] = of_op[graph.op[idx]]
            put(mask, term)
    if scenario.gpu is not None or scenario.changes_cpu:  # another host, or a faster one:
        put(cpu_work(graph), "host_cpu")  # its CPU time is not measured
    comm = ((role == COMM_DURATION) | (role == TRANSFER)) & changed
    if comm.any():
        regime = _network_regimes(graph, scenario)
        idx = np.flatnonzero(comm)
        of_edge = regime[graph.inst[idx]]
        for term in ("net_bandwidth", "net_latency", "net_all_to_all", "net_host",
                     "net_unknown_size"):
            mask = np.zeros(len(w), dtype=bool)
            mask[idx[of_edge == term]] = True
            put(mask, term)
    return e, used


def _network_regimes(graph: ReplayGraph, scenario: Scenario) -> np.ndarray:
    """Per collective instance, the error term of its projection: unknown size, else host-
    bound (a gloo collective the host's CPU paces on the source or the target network:
    ``transport.host_bound``), else latency- or bandwidth-bound on the target network
    (latency's share of its modelled time)."""
    insts = graph.insts
    out = np.full(len(insts["kind"]), "net_bandwidth", dtype=object)
    dst = target_network(graph, scenario)
    src = source_network(graph, scenario)
    gloo = not len(graph.ops["dur"])  # a CPU job's collectives: gloo (model.py's rule)
    busy = (cpu_busy_share(graph) if gloo and None not in (src, dst)
            and (src.host_cpus, dst.host_cpus) != (None, None) else np.zeros(len(out)))
    flat = None if dst is None else dataclasses.replace(
        dst, intra_node_latency=0.0, inter_node_latency=0.0, dc_latency=0.0)
    latency_bound: dict[tuple, bool] = {}  # by (kind, bytes, ranks): instances repeat
    for i, (kind, nbytes, ranks) in enumerate(zip(insts["kind"], insts["bytes"],
                                                  insts["group_ranks"], strict=True)):
        if kind == "all_to_all":
            out[i] = "net_all_to_all"
        elif not nbytes > 0:
            out[i] = "net_unknown_size"
        elif gloo and dst is not None and src is not None and ranks and len(ranks) > 1 and any(
                host_bound(x, kind, sorted(ranks), float(busy[i])) for x in (src, dst)):
            out[i] = "net_host"
        elif dst is not None and ranks and len(ranks) > 1:
            key = (kind, float(nbytes), tuple(ranks))
            if key not in latency_bound:
                try:
                    t, t_flat = (collective_time(n, kind, float(nbytes), list(ranks))
                                 for n in (dst, flat))
                    latency_bound[key] = t > 0 and 1 - t_flat / t > LATENCY_BOUND
                except ValueError:
                    latency_bound[key] = False
            if latency_bound[key]:
                out[i] = "net_latency"
    return out


def bounds(w: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) weights: each within a ratio of (1 + e) of ``w`` (a negative weight, a
    transfer lag under clock skew, scales the other way so low <= w <= high). Computed on
    the edges with an error only (a few percent of a big graph's); the rest keep ``w``."""
    low, high = w.copy(), w.copy()
    has = np.flatnonzero(e)
    x, f = w[has], 1 + e[has]
    up, down = x * f, x / f
    low[has] = np.where(x >= 0, down, up)
    high[has] = np.where(x >= 0, up, down)
    return low, high


def step_variation(measured: np.ndarray) -> float:
    """The job's own step-to-step variation: the coefficient of variation (sample standard
    deviation / mean) of its measured complete step times (NaN for the others); 0 for fewer
    than two. A projection of one step cannot be surer than the steps repeat."""
    m = measured[np.isfinite(measured) & (measured > 0)]
    return float(np.std(m, ddof=1) / np.mean(m)) if len(m) > 1 else 0.0


def widen(low: np.ndarray, high: np.ndarray, u: float) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) widened by the relative variation ``u`` as a ratio, like every error term:
    ``[low / (1 + u), high * (1 + u)]``. Subtracting ``u x projected`` instead made a band
    that held negative times once the steps varied by more than their mean (u > 1: steps
    of 1, 1, 1 and 10 ms; or one step measured across clocks days apart)."""
    return low / (1 + u), high * (1 + u)


def describe(used: dict[str, int]) -> list[str]:
    """Notes naming the error terms a band rests on, and the ones nothing measured."""
    if not used:
        return []
    parts = [f"{t} x/{1 + ERRORS[t].e:g} ({n} edges)" for t, n in sorted(used.items())]
    notes = ["band: " + ", ".join(parts) + " (replay/band.py ERRORS, docs/replay_band.md)"]
    guessed = [t for t in sorted(used) if not ERRORS[t].measured]
    if guessed:
        notes.append("band: " + ", ".join(guessed) + ": not measured on ground truth, an "
                     "assumed error")
    if "kernel_library" in used:
        classes = ", ".join(LIBRARY_CLASSES)
        notes.append(f"band: kernel_library: on another GPU the {classes} kernels are the "
                     "ones its libraries pick (across vendors another implementation, e.g. a "
                     "Triton attention for FlashAttention); the projection scales the trace's "
                     "kernels, and the band holds the spread the H100 / MI300X pairs showed "
                     f"(x/{1 + ERRORS['kernel_library'].e:g}), not the target's choice; no "
                     "pair of one vendor's GPUs measured it")
    if "host_cpu" in used:
        notes.append(f"band: host_cpu takes the target host's CPU work within "
                     f"x/{1 + ERRORS['host_cpu'].e:g} of the trace's (scaled by --cpu-speedup "
                     "if given), as far as the H100 / MI300X pairs' hosts differed; the traces "
                     "do not name their CPUs: for a host that differs more, give --cpu-speedup")
    return notes


@dataclass
class ClockBand:
    """What a lower SM clock or a power cap adds to the band (``clock_band``)."""

    spans: list[np.ndarray]  # more weights whose schedules the band spans
    floor: np.ndarray | None  # the boost clock's low weights: the band's low end never below
    notes: list[str]


def clock_band(graph: ReplayGraph, scenario: Scenario, w: np.ndarray) -> ClockBand:
    """For a clock or power-cap scenario (projected weights ``w``): a lower clock never makes
    a job faster, so the band's low end is never below the step at the boost clock: the
    measured step on the trace's own GPU; with ``--gpu`` (or other changes), the low end of
    the same scenario's band at the boost clock (``floor``: its low weights, the lower of
    the error terms' and the other calibration's). And the power law is uncertain (cubic in
    the clock for moderate caps, about linear for deep ones: ``clocks.py``), so for a cap
    below the TDP the band spans the linear law's projection and its high end too
    (``spans``)."""
    if not scenario.changes_clock:
        return ClockBand([], None, [])
    spans, notes = [], []
    if scenario.power_cap is not None and scenario.dvfs_exponent != 1:
        linear = dataclasses.replace(scenario, dvfs_exponent=1.0)
        w_lin = weights(graph, linear).w
        if not np.array_equal(w_lin, w):
            e, _ = edge_errors(graph, linear, w_lin)
            spans += [w_lin, bounds(w_lin, e)[1]]
            notes.append("band: spans the power cap's clock by both laws, power cubic and "
                         "linear in the clock (replay/clocks.py)")
    boost = dataclasses.replace(scenario, gpu_clock_mhz=None, power_cap=None)
    if boost.gpu is not None and boost.gpu == source_gpu(graph, boost):
        boost = dataclasses.replace(boost, gpu=None)  # the trace's own GPU: as measured
    at_boost = weights(graph, boost)
    e, _ = edge_errors(graph, boost, at_boost.w)
    floor = np.minimum(bounds(at_boost.w, e)[0], at_boost.w_alt)  # its band's low weights
    what = ("the measured step" if np.array_equal(floor, graph.base_w) else
            "the low end of the same projection's band at the boost clock")
    notes.append(f"band: a lower clock never makes the job faster: its low end is at least "
                 f"{what}")
    return ClockBand(spans, floor, notes)


# The network terms fitted on sample_traces/netlab (fit_network_terms); the rest of ERRORS
# comes from the GPU pairs or is assumed.
NETWORK_TERMS = ("net_bandwidth", "net_latency", "net_all_to_all", "net_host")
NETWORK_FIT_SET = ("sample_traces/netlab: every setting of measured.json not listed in "
                   "validation.json (both captures), all job families; sized from the "
                   "out-of-sample errors of leaving each job family out of the fits of "
                   "SHARED_FILL and GLOO_HOST_RATE in turn")


def ratio_error(projected: float, truth: float) -> float:
    """The error of a projection as a band term measures it: the ratio e with the truth at
    ``projected / (1 + e)`` or ``projected * (1 + e)``."""
    r = projected / truth
    return max(r, 1 / r) - 1


def fit_network_terms(cases: Iterable[tuple[Collection[str], float, float]]
                      ) -> dict[str, float]:
    """The network terms sized from projections the constants were not fitted on: ``cases``
    holds, per projected pair (a trace onto another setting's network), the terms its
    changed collectives used (``edge_errors``), its mean projected step and the step measured
    there. Each term's e is the worst ratio error of the cases that used it, rounded up to a
    whole percent; a term no case used (its kind of job is not in the fit set) takes the
    widest fitted one, and with no case at all every term keeps its ERRORS value."""
    worst: dict[str, float] = {}
    for terms, projected, truth in cases:
        err = ratio_error(projected, truth)
        for t in terms:
            if t in NETWORK_TERMS:
                worst[t] = max(worst.get(t, 0.0), err)
    if not worst:
        return {t: ERRORS[t].e for t in NETWORK_TERMS}
    fitted = {t: math.ceil(round(100 * e, 6)) / 100 for t, e in worst.items()}
    widest = max(fitted.values())
    return {t: fitted.get(t, widest) for t in NETWORK_TERMS}


@contextmanager
def using_terms(values: Mapping[str, float]) -> Iterator[None]:
    """Replay with ERRORS' terms at ``values`` (a fit's rotations); restored on exit."""
    unknown = sorted(set(values) - set(ERRORS))
    if unknown:
        raise ValueError(f"unknown band terms: {', '.join(unknown)}")
    old = dict(ERRORS)
    ERRORS.update({t: dataclasses.replace(ERRORS[t], e=v) for t, v in values.items()})
    try:
        yield
    finally:
        ERRORS.clear()
        ERRORS.update(old)


HOST_FIT_SET = ("../shared/traces, AMD-AGI__TraceLens/tests/traces/{h100,mi300}: the H100 / "
                "MI300X traces of one model on two hosts (bert-small, Qwen1.5-0.5B-Chat, "
                "TimeSformer)")


def fit_host_cpu(pairs: Iterable[tuple[float, float]]) -> float:
    """host_cpu sized on traces of one model on two hosts (HOST_FIT_SET): per pair, the CPU
    work (``model.cpu_work``, ms) of the two traces' projected step, what the term scales and what
    ``--cpu-speedup`` would have to give. e is the worst ratio between them, rounded up to a
    whole percent (no pair: the ERRORS value): the band then covers a host as far from the
    trace's as these hosts were. One rule for benchmarks/gpu_accuracy.py's in-sample and
    leave-one-pair-out sizing."""
    worst = max((ratio_error(a, b) for a, b in pairs), default=None)
    return ERRORS["host_cpu"].e if worst is None else math.ceil(round(100 * worst, 6)) / 100
