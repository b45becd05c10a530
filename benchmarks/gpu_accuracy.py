"""Cross-GPU accuracy of the GPU model, leave-one-pair-out: the figures README.md quotes.

Ground truth: the three H100 / MI300X pairs of ../shared/traces (AMD-AGI/TraceLens
tests/traces/{h100,mi300}: bert-small, Qwen1.5-0.5B-Chat, TimeSformer; the same model, shapes
and op counts on both GPUs, one step each). For each pair held out and both directions, the
fitted constant of the GPU model (the H100 floor, ``fit``) is refitted and the band's GPU
terms sized (``size_terms``) on the other two pairs only; the held-out trace is projected
onto the other GPU, and its GPU kernel time (total, per class, per group: the memory-bound
classes, PyTorch's own kernels on both vendors, and the library classes, each vendor's) is
compared with the other GPU's own trace, with its kernel-time band; and its step, twice: with
the source host as traced (``--gpu`` alone) and with the host difference given
(``--cpu-speedup`` = the ratio of the two traces' CPU work in the step, ``cpu_work_ms``),
each against its band. In-sample rows use the catalog and ERRORS as committed, which must
be what ``size_terms`` gives on all three pairs (the output says STALE otherwise).

What is fitted: only the H100's kernel floor (tracetool/gpus/h100.toml: no published figure
for a trivial kernel's duration; the MI300X's is measured on a trace that is not in a pair).
Everything else the projection uses (peaks, achievable fractions, HBM latencies) is a
catalog figure, published where the catalog tags it [P] / [S] and assumed where [U] (the
H100's compute fraction 0.70, the MI300X's HBM latency), so it does not move with the fit set.

``constants_hash()`` hashes every constant the projection of these pairs uses and the band's GPU
terms; BENCHMARKS.md records it with the run, and tests/test_gpu_model.py fails when the two
differ (a constant moved and this benchmark was not re-run).

    python benchmarks/gpu_accuracy.py [STORE]   # STORE: reuse an ingested store
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

import tracetool
from tracetool.hardware import Gpu, catalog
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay import Replayer, Scenario, band
from tracetool.replay.band import ERRORS, LIBRARY_CLASSES, SMALL_KERNEL_NS, op_errors
from tracetool.replay.compute import MEMORY_BOUND
from tracetool.replay.model import cpu_work, op_factors

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared/traces/AMD-AGI__TraceLens/tests/traces"
PAIRS = {"bert-small": "gaunernst_bert-small-uncased__1016001",
         "Qwen1.5-0.5B": "Qwen_Qwen1.5-0.5B-Chat__1016005",
         "TimeSformer": "facebook_timesformer-base-finetuned-k400__1016002"}
GPUS = {"h100": "h100", "mi300x": "mi300"}  # catalog key: TraceLens folder
FITTED = ("h100",)  # GPUs whose kernel floor is fitted on the pairs
CLASSES = ("gemm", "attention", "elementwise", "reduction", "norm", "other")
GPU_TERMS = ("kernel_small", "kernel_large", "kernel_library", "host_cpu")
DIRECTIONS = (("h100", "mi300x"), ("mi300x", "h100"))


SHORT = {"bert-small": "bert", "Qwen1.5-0.5B": "qwen", "TimeSformer": "tsf"}


def job(model: str, gpu: str) -> str:
    return f"{SHORT[model]}_{gpu}"


def trace_file(model: str, gpu: str) -> Path:
    return TRACES / GPUS[gpu] / f"{PAIRS[model]}.json.gz"


def available() -> bool:
    return all(trace_file(m, g).is_file() for m in PAIRS for g in GPUS)


def ingest_pairs(store: Path) -> None:
    """Ingest the six traces into ``store`` (jobs named by ``job``), those not there yet."""
    have: set[str] = set()
    if store.exists():
        have = {r[0] for r in tracetool.connect(store).execute(
            "SELECT DISTINCT job FROM gpu_ops").fetchall()}
    for m in PAIRS:
        for g in GPUS:
            if job(m, g) not in have:
                ingest([trace_file(m, g)], Options(store=store, job=job(m, g), rank=0))


def kernel_durations(con: object, model: str, gpu: str) -> np.ndarray:
    return con.execute(  # type: ignore[attr-defined]
        "SELECT dur_ns FROM gpu_ops WHERE job = ? AND kind = 'kernel'",
        [job(model, gpu)]).fetchnumpy()["dur_ns"].astype(float)


def floor_of(durations: list[np.ndarray]) -> float:
    """A GPU's kernel floor from its traces: the least of their kernel durations' 1st
    percentiles (a trace of large kernels only has none near the floor)."""
    return float(min(np.percentile(d, 1) for d in durations if len(d)))


def fit(con: object, models: list[str]) -> dict[str, Gpu]:
    """The catalog's H100 and MI300X with the fitted constants refitted on ``models``."""
    gpus = catalog()
    out = {}
    for g in GPUS:
        gpu = gpus[g]
        if g in FITTED:
            gpu = dataclasses.replace(gpu, kernel_floor_ns=round(floor_of(
                [kernel_durations(con, m, g) for m in models]), 0))
        out[g] = gpu
    return out


def constants_hash() -> str:
    """sha256 (12 hex) of every constant these projections use: the two GPUs' peaks,
    bandwidths, achievable fractions, HBM latencies and floors, and the band's GPU terms."""
    gpus = catalog()
    doc = {g: {"tflops": gpus[g].tflops, "hbm": gpus[g].hbm_gbps,
               "achievable": gpus[g].achievable, "latency": gpus[g].hbm_latency_ns,
               "floor": gpus[g].kernel_floor_ns} for g in GPUS}
    doc["band"] = {t: ERRORS[t].e for t in GPU_TERMS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def _kernels(graph: object) -> tuple[np.ndarray, np.ndarray]:
    ops = graph.ops  # type: ignore[attr-defined]
    sel = (ops["kind"].astype(str) == "kernel") & (ops["category"].astype(str) != "comm")
    return sel, ops["category"].astype(str)


def regime(rep: Replayer) -> str:
    """The band's kernel term a job's kernels mostly take: kernel_small when their median
    duration is under SMALL_KERNEL_NS."""
    ks, _ = _kernels(rep.graph)
    small = np.median(rep.graph.ops["dur"][ks]) < SMALL_KERNEL_NS
    return "kernel_small" if small else "kernel_large"


def _worst(ratios: list[float]) -> float:
    return max(max(r, 1 / r) - 1 for r in ratios) if ratios else 0.0


def cpu_work_ms(rep: Replayer) -> float:
    """The CPU work (``model.cpu_work``: what ``--cpu-speedup`` scales) of the trace's first
    step, the one projected: the work edges ending inside it, ms. (Over the whole trace the
    pairs' ratios differ: TimeSformer 0.932 where its step's is 0.871, as profiler set-up
    and the steps' surroundings run at other speeds.)"""
    g = rep.graph
    s = rep.run(critical_path=False).steps[0]
    start, end = s.start_ns - g.origin_ns, s.end_ns - g.origin_ns
    t = g.t0[g.dst]
    sel = cpu_work(g) & (t > start) & (t <= end)
    return float(g.base_w[sel].sum()) / 1e6


def size_terms(results: list[dict]) -> dict[str, float]:
    """The band's GPU terms sized from ``results`` (projections with ``regime``, the
    ``groups``' errors and both traces' CPU work): kernel_small / kernel_large the worst ratio
    error of the memory-bound classes' kernel time (PyTorch's own kernels on both vendors:
    the hardware model's error) of the jobs of that regime (the other regime's when none);
    kernel_library the worst of the library classes' (``band.LIBRARY_CLASSES``: each
    vendor's own implementation); host_cpu the worst ratio of the two hosts' CPU work
    (``band.fit_host_cpu``: what the term scales, and what ``--cpu-speedup`` would give)."""
    kern = {t: _worst([1 + r["groups"]["memory"][2] for r in results if r["regime"] == t])
            for t in ("kernel_small", "kernel_large")}
    for t, o in (("kernel_small", "kernel_large"), ("kernel_large", "kernel_small")):
        kern[t] = kern[t] or kern[o]
    lib = _worst([1 + r["groups"]["library"][2] for r in results
                  if r["groups"]["library"][1] > 0])
    return kern | {"kernel_library": lib, "host_cpu": band.fit_host_cpu(
        (r["cpu_source_ms"], r["cpu_target_ms"]) for r in results)}


def _ceil(terms: dict[str, float]) -> dict[str, float]:
    """Terms rounded up to a whole percent, as ``band.fit_host_cpu`` rounds."""
    return {t: math.ceil(round(100 * e, 6)) / 100 for t, e in terms.items()}


def project(src: Replayer, dst: Replayer, source: Gpu, target: Gpu,
            terms: dict[str, float] | None = None) -> dict:
    """One projection of ``src`` onto ``target`` against ``dst``'s own trace: GPU kernel
    time total, per class and per group (memory-bound / library classes: projected,
    measured ms, error) with the kernel-time band (each kernel at x/(1 + e) of its terms,
    ``band.op_errors``); the step with the source host as traced, and with the host
    difference given (``--cpu-speedup`` = the two traces' CPU work ratio, ``host_speedup``),
    each with its band. The band's GPU terms are ``terms`` where given, else ERRORS."""
    scenario = Scenario(gpu=target, source_gpu=source, label=target.key)
    f, _ = op_factors(src.graph, scenario)
    ks, cat = _kernels(src.graph)
    kd, catd = _kernels(dst.graph)
    dur, durd = src.graph.ops["dur"].astype(float), dst.graph.ops["dur"].astype(float)
    proj = dur * f
    e = op_errors(src.graph, scenario, terms)[ks]
    classes = {c: (float(proj[ks & (cat == c)].sum()) / 1e6,
                   float(durd[kd & (catd == c)].sum()) / 1e6)
               for c in CLASSES if (ks & (cat == c)).any() or (kd & (catd == c)).any()}
    groups = {}
    for name, members in (("memory", MEMORY_BOUND), ("library", LIBRARY_CLASSES)):
        p = sum(v[0] for c, v in classes.items() if c in members)
        q = sum(v[1] for c, v in classes.items() if c in members)
        groups[name] = (p, q, p / q - 1 if q else 0.0)
    cpu_src, cpu_dst = cpu_work_ms(src), cpu_work_ms(dst)
    host = Scenario(gpu=target, source_gpu=source, label=target.key,
                    cpu_speedup=cpu_src / cpu_dst)
    with band.using_terms(terms or {}):
        step = src.run(scenario, critical_path=False).steps[0]
        given = src.run(host, critical_path=False).steps[0]
    own = dst.run(critical_path=False).steps[0]
    truth = own.measured_ns / 1e6
    out = {"kernel_ms": float(proj[ks].sum()) / 1e6, "kernel_measured_ms":
           float(durd[kd].sum()) / 1e6, "classes": classes, "groups": groups,
           "kernel_low_ms": float((proj[ks] / (1 + e)).sum()) / 1e6,
           "kernel_high_ms": float((proj[ks] * (1 + e)).sum()) / 1e6,
           "step_ms": step.projected_ns / 1e6, "step_measured_ms": truth,
           "low_ms": step.low_ns / 1e6, "high_ms": step.high_ns / 1e6, "regime": regime(src),
           "cpu_source_ms": cpu_src, "cpu_target_ms": cpu_dst,
           "cpu_speedup": cpu_src / cpu_dst, "step_host_ms": given.projected_ns / 1e6,
           "host_low_ms": given.low_ns / 1e6, "host_high_ms": given.high_ns / 1e6}
    return out | {
        "kernel_err": out["kernel_ms"] / out["kernel_measured_ms"] - 1,
        "kernel_covers": out["kernel_low_ms"] <= out["kernel_measured_ms"]
        <= out["kernel_high_ms"],
        "step_err": out["step_ms"] / truth - 1,
        "covers": out["low_ms"] <= truth <= out["high_ms"],
        "step_host_err": out["step_host_ms"] / truth - 1,
        "host_covers": out["host_low_ms"] <= truth <= out["host_high_ms"]}


def rows(store: Path | None = None) -> list[dict]:
    """Every pair, both directions, out of sample and in sample: one dict per projection
    with ``model``, ``source``, ``target``, ``sample`` ('out' / 'in'), ``fit_set``, the
    fitted floors, the band's GPU ``terms`` and ``project``'s figures. Out of sample, the
    H100 floor is refitted and the band's GPU terms sized (``size_terms``, on the
    projections of the fit pairs with that floor) on the other two pairs only: nothing of
    the held-out pair enters the projection or its band. In sample: the catalog and
    ERRORS as committed. Empty when ../shared/traces is missing."""
    if not available():
        return []
    with tempfile.TemporaryDirectory() as tmp:
        store = store or Path(tmp) / "pairs"
        ingest_pairs(store)
        con = tracetool.connect(store)
        rep = {(m, g): Replayer.from_store(con, job(m, g)) for m in PAIRS for g in GPUS}
        out = []
        for held in PAIRS:
            fit_sets = {"out": [m for m in PAIRS if m != held], "in": list(PAIRS)}
            for sample, models in fit_sets.items():
                gpus = fit(con, models) if sample == "out" else catalog()
                terms = {t: ERRORS[t].e for t in GPU_TERMS}
                if sample == "out":  # the band's terms from the fit pairs' own errors
                    terms = _ceil(size_terms([
                        project(rep[(m, s)], rep[(m, d)], gpus[s], gpus[d])
                        for m in models for s, d in DIRECTIONS]))
                for src, dst in DIRECTIONS:
                    r = project(rep[(held, src)], rep[(held, dst)], gpus[src], gpus[dst],
                                terms)
                    r |= {"model": held, "source": src, "target": dst, "sample": sample,
                          "fit_set": models, "terms": terms,
                          "floors_us": {g: gpus[g].kernel_floor_ns / 1e3 for g in GPUS}}
                    out.append(r)
        return out


def in_sample_terms(rs: list[dict]) -> dict[str, float]:
    """The band's GPU terms sized on all three pairs (the in-sample projections): what
    ERRORS should hold (``print_tables`` flags a difference)."""
    return _ceil(size_terms([r for r in rs if r["sample"] == "in"]))


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _band(lo: float, hi: float, truth: float) -> str:
    return (f"[{lo:.2f}, {hi:.2f}] {'covers' if lo <= truth <= hi else 'MISSES'} "
            f"{100 * (hi - lo) / truth:.0f}%")


def _terms(t: dict[str, float]) -> str:
    return ", ".join(f"{k} x/{1 + v:.2f}" for k, v in t.items())


def print_tables(rs: list[dict]) -> None:
    if not rs:
        print("cross-GPU: skipped (../shared/traces not found)")
        return
    print(f"cross-GPU, leave-one-pair-out (constants hash {constants_hash()}): each pair's "
          "trace projected onto the other GPU, against that GPU's own trace. out = the H100 "
          "floor refitted and the band's GPU terms sized on the other two pairs only; in = "
          "the catalog and replay/band.py ERRORS (fitted / sized on all three)")
    by = {(r["model"], r["source"], r["sample"]): r for r in rs}
    print("\nGPU kernel time (ms; band: each kernel at x/(1 + e) of its terms, width in % of "
          "the measured)")
    print(f"{'pair':14}{'direction':17}{'projected':>10}{'measured':>10}{'out':>9}{'in':>9}"
          "  band out                      band in")
    for m in PAIRS:
        for src in GPUS:
            o, i = by[(m, src, "out")], by[(m, src, "in")]
            t = o["kernel_measured_ms"]
            print(f"{m:14}{src + ' -> ' + o['target']:17}{o['kernel_ms']:>10.2f}{t:>10.2f}"
                  f"{_pct(o['kernel_err']):>9}{_pct(i['kernel_err']):>9}  "
                  f"{_band(o['kernel_low_ms'], o['kernel_high_ms'], t):30}"
                  f"{_band(i['kernel_low_ms'], i['kernel_high_ms'], t)}")
    print("\nstep (ms), the source host as traced (--gpu alone) and the host difference given "
          "(--cpu-speedup = the source's CPU work / the target's, measured from the pair)")
    print(f"{'pair':14}{'direction':17}{'measured':>9}{'traced':>9}{'out':>8}{'in':>8}"
          f"  {'band out':29}{'band in':29}{'speedup':>8}{'given':>9}{'out':>8}  band out")
    for m in PAIRS:
        for src in GPUS:
            o, i = by[(m, src, "out")], by[(m, src, "in")]
            t = o["step_measured_ms"]
            print(f"{m:14}{src + ' -> ' + o['target']:17}{t:>9.2f}{o['step_ms']:>9.2f}"
                  f"{_pct(o['step_err']):>8}{_pct(i['step_err']):>8}  "
                  f"{_band(o['low_ms'], o['high_ms'], t):29}"
                  f"{_band(i['low_ms'], i['high_ms'], t):29}{o['cpu_speedup']:>8.3f}"
                  f"{o['step_host_ms']:>9.2f}{_pct(o['step_host_err']):>8}  "
                  f"{_band(o['host_low_ms'], o['host_high_ms'], t)}")
    for name in ("out", "in"):
        sel = [r for r in rs if r["sample"] == name]
        n = len(sel)

        def width(lo: str, hi: str, truth: str, rows: list[dict] = sel) -> float:
            return 100 * float(np.mean([(r[hi] - r[lo]) / r[truth] for r in rows]))

        print(f"{'out of sample' if name == 'out' else 'in sample'}: worst |kernel time "
              f"error| {100 * max(abs(r['kernel_err']) for r in sel):.1f}%, its band covers "
              f"{sum(r['kernel_covers'] for r in sel)} of {n} (mean width "
              f"{width('kernel_low_ms', 'kernel_high_ms', 'kernel_measured_ms'):.0f}%); "
              f"step as traced worst {100 * max(abs(r['step_err']) for r in sel):.1f}%, band "
              f"covers {sum(r['covers'] for r in sel)} of {n} (mean width "
              f"{width('low_ms', 'high_ms', 'step_measured_ms'):.0f}%); step with the host "
              f"given worst {100 * max(abs(r['step_host_err']) for r in sel):.1f}%, band "
              f"covers {sum(r['host_covers'] for r in sel)} of {n} (mean width "
              f"{width('host_low_ms', 'host_high_ms', 'step_measured_ms'):.0f}%)")
    print("\nthe band's GPU terms per rotation (out: sized on the other two pairs)")
    for m in PAIRS:
        o = by[(m, "h100", "out")]
        print(f"  without {m:14}{_terms(o['terms'])}; H100 floor {o['floors_us']['h100']:.3f} us")
    insample = in_sample_terms(rs)
    committed = {t: ERRORS[t].e for t in GPU_TERMS}
    print(f"  all three (in)        {_terms(insample)}"
          + ("" if insample == committed else f"  STALE: ERRORS holds {_terms(committed)}"))
    print("\nper class and group, out of sample (projected / measured ms, error); memory = "
          f"{'+'.join(MEMORY_BOUND)}, library = {'+'.join(LIBRARY_CLASSES)}")
    cols = [*CLASSES, "memory", "library"]
    print(f"{'pair':14}{'direction':17}" + "".join(f"{c:>22}" for c in cols))
    for r in (r for r in rs if r["sample"] == "out"):
        cells = []
        for c in cols:
            p, q = r["groups"][c][:2] if c in r["groups"] else r["classes"].get(c, (0.0, 0.0))
            cells.append(f"{p:.2f}/{q:.2f} {_pct(p / q - 1) if q else '-':>7}" if p or q
                         else "-")
        print(f"{r['model']:14}{r['source'] + ' -> ' + r['target']:17}"
              + "".join(f"{x:>22}" for x in cells))


def main() -> int:
    store = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print_tables(rows(store))
    return 0


if __name__ == "__main__":
    sys.exit(main())
