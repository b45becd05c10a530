"""Cross-GPU accuracy of the GPU model, leave-one-pair-out: the figures README.md quotes.

Ground truth: the three H100 / MI300X pairs of ../shared/traces (AMD-AGI/TraceLens
tests/traces/{h100,mi300}: bert-small, Qwen1.5-0.5B-Chat, TimeSformer; the same model, shapes
and op counts on both GPUs, one step each). For each pair held out and both directions, the
fitted constants of the GPU model are refitted on the other two pairs only (``fit``), the
held-out trace is projected onto the other GPU, and its GPU kernel time (total and per class)
and its step are compared with the other GPU's own trace; the band (replay/band.py) is checked
to cover the measured step, twice: with the band's GPU terms as committed (sized from all
three pairs' out-of-sample errors), and with the terms sized from the other two pairs only
(``size_terms``: the band itself out of sample). In-sample rows use the catalog's constants,
fitted on all three.

What is fitted: only the H100's kernel floor (tracetool/gpus/h100.toml: no published figure
for a trivial kernel's duration; the MI300X's is measured on a trace that is not in a pair).
Everything else the projection uses is a published figure (peaks, achievable fractions, HBM
latency; sources in the catalog), so it does not move with the fit set.

``CONSTANTS_HASH`` hashes every constant the projection of these pairs uses and the band's GPU
terms; BENCHMARKS.md records it with the run, and tests/test_gpu_model.py fails when the two
differ (a constant moved and this benchmark was not re-run).

    python benchmarks/gpu_accuracy.py [STORE]   # STORE: reuse an ingested store
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import tracetool
from tracetool.hardware import Gpu, catalog
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay import Replayer, Scenario, band
from tracetool.replay.band import ERRORS, SMALL_KERNEL_NS, ErrorTerm
from tracetool.replay.model import op_factors

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared/traces/AMD-AGI__TraceLens/tests/traces"
PAIRS = {"bert-small": "gaunernst_bert-small-uncased__1016001",
         "Qwen1.5-0.5B": "Qwen_Qwen1.5-0.5B-Chat__1016005",
         "TimeSformer": "facebook_timesformer-base-finetuned-k400__1016002"}
GPUS = {"h100": "h100", "mi300x": "mi300"}  # catalog key: TraceLens folder
FITTED = ("h100",)  # GPUs whose kernel floor is fitted on the pairs
CLASSES = ("gemm", "attention", "elementwise", "reduction", "norm", "other")
GPU_TERMS = ("kernel_small", "kernel_large", "host_cpu")
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


def size_terms(results: list[dict]) -> dict[str, float]:
    """The band's GPU terms sized from ``results`` (projections with ``regime``): each kernel
    term the worst ratio error of the GPU kernel time of its regime's jobs (the other
    regime's when none), host_cpu the worst ratio error of their steps (``band.fit_host_cpu``:
    ``--gpu`` keeps the source host's CPU time, so what the step misses beyond the kernels is
    the hosts')."""
    kern = {t: _worst([1 + r["kernel_err"] for r in results if r["regime"] == t])
            for t in ("kernel_small", "kernel_large")}
    for t, o in (("kernel_small", "kernel_large"), ("kernel_large", "kernel_small")):
        kern[t] = kern[t] or kern[o]
    return kern | {"host_cpu": band.fit_host_cpu((1 + r["step_err"], 1.0) for r in results)}


def band_with(rep: Replayer, scenario: Scenario, terms: dict[str, float]) -> tuple[float, float]:
    """(low, high) ms of the first step's band with the GPU terms set to ``terms``."""
    saved = {t: ERRORS[t] for t in terms}
    try:
        for t, e in terms.items():
            band.ERRORS[t] = ErrorTerm(e, "sized by benchmarks/gpu_accuracy.py size_terms")
        s = rep.run(scenario, critical_path=False).steps[0]
    finally:
        band.ERRORS.update(saved)
    return s.low_ns / 1e6, s.high_ns / 1e6


def project(src: Replayer, dst: Replayer, source: Gpu, target: Gpu) -> dict:
    """One projection of ``src`` onto ``target`` against ``dst``'s own trace: GPU kernel
    time total and per class (projected, measured, ms), the step and its band (ms)."""
    scenario = Scenario(gpu=target, source_gpu=source, label=target.key)
    f, _ = op_factors(src.graph, scenario)
    ks, cat = _kernels(src.graph)
    kd, catd = _kernels(dst.graph)
    dur, durd = src.graph.ops["dur"].astype(float), dst.graph.ops["dur"].astype(float)
    proj = dur * f
    classes = {c: (float(proj[ks & (cat == c)].sum()) / 1e6,
                   float(durd[kd & (catd == c)].sum()) / 1e6)
               for c in CLASSES if (ks & (cat == c)).any() or (kd & (catd == c)).any()}
    step = src.run(scenario, critical_path=False).steps[0]
    own = dst.run(critical_path=False).steps[0]
    out = {"kernel_ms": float(proj[ks].sum()) / 1e6, "kernel_measured_ms":
           float(durd[kd].sum()) / 1e6, "classes": classes,
           "step_ms": step.projected_ns / 1e6, "step_measured_ms": own.measured_ns / 1e6,
           "low_ms": step.low_ns / 1e6, "high_ms": step.high_ns / 1e6, "regime": regime(src)}
    return out | {"kernel_err": out["kernel_ms"] / out["kernel_measured_ms"] - 1,
                  "step_err": out["step_ms"] / out["step_measured_ms"] - 1,
                  "covers": out["low_ms"] <= out["step_measured_ms"] <= out["high_ms"]}


def rows(store: Path | None = None) -> list[dict]:
    """Every pair, both directions, out of sample (fitted on the other two pairs) and in
    sample (the catalog): one dict per projection with ``model``, ``source``, ``target``,
    ``sample`` ('out' / 'in'), ``fit_set``, the fitted floors and ``project``'s figures, and
    ``kernel_err`` / ``step_err`` (projected / measured - 1) and ``covers``; out-of-sample
    rows also ``terms`` (the band's GPU terms sized from the other two pairs) and
    ``nested_low_ms`` / ``nested_high_ms`` / ``nested_covers`` (the band with them). Empty
    when ../shared/traces is missing."""
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
                terms = None
                if sample == "out":  # the band's terms from the fit pairs' own errors
                    terms = size_terms([project(rep[(m, s)], rep[(m, d)], gpus[s], gpus[d])
                                        for m in models for s, d in DIRECTIONS])
                for src, dst in DIRECTIONS:
                    r = project(rep[(held, src)], rep[(held, dst)], gpus[src], gpus[dst])
                    r |= {"model": held, "source": src, "target": dst, "sample": sample,
                          "fit_set": models,
                          "floors_us": {g: gpus[g].kernel_floor_ns / 1e3 for g in GPUS}}
                    if terms is not None:
                        lo, hi = band_with(rep[(held, src)], Scenario(
                            gpu=gpus[dst], source_gpu=gpus[src]), terms)
                        r |= {"terms": terms, "nested_low_ms": lo, "nested_high_ms": hi,
                              "nested_covers": lo <= r["step_measured_ms"] <= hi}
                    out.append(r)
        return out


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def print_tables(rs: list[dict]) -> None:
    if not rs:
        print("cross-GPU: skipped (../shared/traces not found)")
        return
    print(f"cross-GPU, leave-one-pair-out (constants hash {constants_hash()}): each pair's "
          "trace projected onto the other GPU, against that GPU's own trace; out = fitted on "
          "the other two pairs, in = the catalog (fitted on all three)")
    print(f"{'pair':14}{'direction':17}{'kernel ms':>10}{'measured':>10}{'out':>9}{'in':>9}"
          f"{'step ms':>10}{'measured':>10}{'out':>9}{'in':>9}  band (out)")
    by = {(r["model"], r["source"], r["sample"]): r for r in rs}
    for m in PAIRS:
        for src in GPUS:
            o, i = by[(m, src, "out")], by[(m, src, "in")]
            band = (f"[{o['low_ms']:.2f}, {o['high_ms']:.2f}] "
                    f"{'covers' if o['covers'] else 'MISSES'}, width "
                    f"{100 * (o['high_ms'] - o['low_ms']) / o['step_measured_ms']:.0f}%")
            print(f"{m:14}{src + ' -> ' + o['target']:17}{o['kernel_ms']:>10.2f}"
                  f"{o['kernel_measured_ms']:>10.2f}{_pct(o['kernel_err']):>9}"
                  f"{_pct(i['kernel_err']):>9}{o['step_ms']:>10.2f}{o['step_measured_ms']:>10.2f}"
                  f"{_pct(o['step_err']):>9}{_pct(i['step_err']):>9}  {band}")
    outs = [r for r in rs if r["sample"] == "out"]
    ins = [r for r in rs if r["sample"] == "in"]
    for name, sel in (("out of sample", outs), ("in sample", ins)):
        width = np.mean([(r["high_ms"] - r["low_ms"]) / r["step_measured_ms"] for r in sel])
        print(f"{name}: worst |GPU kernel time error| "
              f"{100 * max(abs(r['kernel_err']) for r in sel):.1f}%, worst |step error| "
              f"{100 * max(abs(r['step_err']) for r in sel):.1f}%, band covers "
              f"{sum(r['covers'] for r in sel)} of {len(sel)}, mean band width "
              f"{100 * width:.0f}%")
    print("the band with its GPU terms sized from the other two pairs only (size_terms), "
          "against the held-out pair's measured step:")
    for r in outs:
        t = r["terms"]
        print(f"  {r['model']:14}{r['source'] + ' -> ' + r['target']:17}kernel_small "
              f"x/{1 + t['kernel_small']:.2f}, kernel_large x/{1 + t['kernel_large']:.2f}, "
              f"host_cpu x/{1 + t['host_cpu']:.2f}: [{r['nested_low_ms']:.2f}, "
              f"{r['nested_high_ms']:.2f}] {'covers' if r['nested_covers'] else 'MISSES'} "
              f"{r['step_measured_ms']:.2f}")
    width = np.mean([(r["nested_high_ms"] - r["nested_low_ms"]) / r["step_measured_ms"]
                     for r in outs])
    print(f"  covers {sum(r['nested_covers'] for r in outs)} of {len(outs)}, mean width "
          f"{100 * width:.0f}%")
    print("fitted H100 floor per rotation (us): " + ", ".join(
        f"without {r['model']} {r['floors_us']['h100']:.3f}" for r in outs
        if r["source"] == "h100"))
    print("\nper class, out of sample (projected / measured ms, error):")
    print(f"{'pair':14}{'direction':17}" + "".join(f"{c:>22}" for c in CLASSES))
    for r in outs:
        cells = []
        for c in CLASSES:
            p, q = r["classes"].get(c, (0.0, 0.0))
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
