"""Projecting measured kernel times onto another GPU (roofline, or class ratios).

A kernel's work comes from the shapes of the op that launched it (``tracetool/opwork.py``,
the one home of FLOP and byte counts, which the ``op_efficiency`` view uses too). With work
known, a kernel's model time on a GPU is the roofline
``max(flops / (peak * achievable), bytes / (hbm * achievable))`` and the projection keeps the
kernel's measured efficiency: ``t_target = t_measured * model(target) / model(source)``, so
projecting onto the source GPU returns the measured time exactly. Without shapes, kernels
scale by their class: compute-bound classes (gemm, conv, attention) by the peak-TFLOPS ratio
of their dtype, the rest by the HBM-bandwidth ratio; communication is the network model's.

Onto another GPU (``project_kernel_ns``), a kernel's time is the GPU's floor (a trivial
kernel's launch-bound duration, ``Gpu.kernel_floor_ns``) plus the rest, and only the rest
scales. Compute-bound classes scale by the roofline or peak ratio above, at each GPU's
achievable compute fraction (published figures: ``tracetool/gpus/*.toml``). Memory-bound classes
(``MEMORY_BOUND``: elementwise, reduction, norm, other) are bound by the HBM bandwidth each GPU
achieves, with a size-dependent efficiency (``memory_ratio``): a kernel moving B bytes takes
``latency + B / achieved bandwidth`` above the floor, i.e. reaches ``achievable x B / (B +
bandwidth x latency)`` of the peak (``Gpu.hbm_efficiency``), so a large kernel scales by the
achieved-bandwidth ratio and a small one by the latencies'. B comes from the launching op's
shapes where recorded (``memory_bytes``), else from the measured time under the source's
model. No factor per class: a 1.6 us H100 elementwise kernel takes the MI300X's 2.0 us floor,
a 100 us one the bandwidth ratio. Applied when the GPU changes (not for a clock change of the
same GPU, whose floors and memory are the same).

The categories a GPU op can have (``CATEGORIES``) are the one list ``--speedup`` accepts: the
kernel classes of the ``kernels`` view (``analysis/sql/10_ops.sql``; a test checks the two
agree) and, for the other GPU ops, their kind (the replay graph's
``coalesce(kernels.category, gpu_ops.kind)``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from tracetool.errors import InputError
from tracetool.hardware import Gpu
from tracetool.opwork import Work, roofline_s

# the values of kernels.category (analysis/sql/10_ops.sql)
KERNEL_CATEGORIES = ("gemm", "conv", "attention", "norm", "reduction", "elementwise", "comm",
                     "other")
# gpu_ops.kind of the GPU ops that are not kernels: their category in the replay graph
NON_KERNEL_KINDS = ("memcpy", "memset")
CATEGORIES = KERNEL_CATEGORIES + NON_KERNEL_KINDS
COMPUTE_BOUND = ("gemm", "conv", "attention")
# kernel classes bound by HBM bandwidth onto another GPU (memory_ratio)
MEMORY_BOUND = ("elementwise", "reduction", "norm", "other")


def memory_s(gpu: Gpu, nbytes: float) -> float:
    """Model seconds above the floor of a memory-bound kernel moving ``nbytes`` on ``gpu``:
    its HBM latency plus the bytes at its achieved bandwidth, i.e. ``nbytes / (hbm x
    gpu.hbm_efficiency(nbytes))``."""
    return gpu.hbm_latency_ns * 1e-9 + max(nbytes, 0.0) / (gpu.hbm_achieved_gbps * 1e9)


def memory_ratio(above_ns: float, nbytes: float | None, source: Gpu, target: Gpu) -> float:
    """Target / source time of a memory-bound kernel's work above the floor. Its bytes are
    ``nbytes`` (from shapes) or, when unknown, those the source's model moves in the
    measured ``above_ns`` (none when that is within the latency)."""
    if nbytes is None or not nbytes > 0:
        nbytes = max(above_ns * 1e-9 - source.hbm_latency_ns * 1e-9, 0.0) \
            * source.hbm_achieved_gbps * 1e9
    src = memory_s(source, nbytes)
    if src <= 0:
        return source.hbm_achieved_gbps / target.hbm_achieved_gbps
    return memory_s(target, nbytes) / src


def project_ns(measured_ns: float, category: str, source: Gpu, target: Gpu,
               work: Work | None = None, dtype: str = "bf16") -> float:
    """The kernel's time on ``target``, from its measured time on ``source``."""
    if category == "comm":
        return measured_ns  # priced by the network model
    if work is not None and work.flops > 0:
        return measured_ns * roofline_s(target, work) / roofline_s(source, work)
    if category in COMPUTE_BOUND:
        return measured_ns * source.peak_tflops(dtype) / target.peak_tflops(dtype)
    return measured_ns * source.hbm_gbps / target.hbm_gbps


def project_kernel_ns(measured_ns: np.ndarray, ratio: np.ndarray, source: Gpu,
                      target: Gpu) -> np.ndarray:
    """Kernels' times on another GPU from their measured times and the ratios (target /
    source time) of their work above the floor: the target's floor plus the measured time
    above the source's floor, scaled."""
    above = np.maximum(np.asarray(measured_ns, dtype=float) - source.kernel_floor_ns, 0.0)
    return target.kernel_floor_ns + above * ratio


class WhatIfError(InputError):
    """A what-if input that names nothing, or would change nothing: a ``--speedup`` whose
    category is unknown or has no GPU op in the job, a pattern matching no GPU op, a GPU not
    in the catalog (the CLI exits 2, a usage error)."""


@dataclass(frozen=True)
class Speedup:
    """A user override: 'gemm=1.5' (a kernel category) or 'name~flash=2' (name pattern)."""

    category: str | None
    pattern: re.Pattern | None
    factor: float
    text: str = ""  # as given, for messages

    def __str__(self) -> str:
        if self.text:
            return self.text
        key = f"name~{self.pattern.pattern}" if self.pattern is not None else self.category
        return f"{key}={self.factor:g}"

    def applies(self, category: str, name: str) -> bool:
        if self.pattern is not None:
            return bool(self.pattern.search(name))
        return category == self.category


# the factors a --speedup may give: a slowdown past 1/1000 would carry a step's times past
# what a float holds exactly as integer ns (and to inf), a speedup past 1000 is a kernel gone
SPEEDUP_RANGE = (1e-3, 1e3)


def parse_speedup(text: str) -> Speedup:
    """``CATEGORY=F`` (one of ``CATEGORIES``, case-insensitive: ``GEMM`` is ``gemm``) or
    ``name~REGEX=F`` (searched in GPU op names, case-insensitive); F in SPEEDUP_RANGE.
    Raises ``WhatIfError`` on anything else, an unknown category included."""
    key, sep, value = text.rpartition("=")
    try:
        factor = float(value)
    except ValueError:
        factor = math.nan
    lo, hi = SPEEDUP_RANGE
    if not sep or not lo <= factor <= hi:
        raise WhatIfError(f"bad speedup {text!r}: use CATEGORY=FACTOR or name~REGEX=FACTOR "
                          f"with FACTOR from {lo:g} to {hi:g} (e.g. gemm=1.5, name~flash=2)")
    if factor == 1:
        raise WhatIfError(f"bad speedup {text!r}: a factor of 1 changes nothing")
    key = key.strip()
    if key.startswith("name~"):
        try:
            return Speedup(None, re.compile(key[5:], re.IGNORECASE), factor, text)
        except re.error as err:
            raise WhatIfError(f"bad speedup {text!r}: {err}") from None
    category = key.lower()
    if category not in CATEGORIES:
        raise WhatIfError(f"bad speedup {text!r}: unknown category {key!r}; known: "
                          f"{', '.join(CATEGORIES)} (or name~REGEX=FACTOR)")
    return Speedup(category, None, factor, text)


def apply_speedups(ns: float, category: str, name: str, speedups: list[Speedup]) -> float:
    """Divide by every matching factor (they compose)."""
    for s in speedups:
        if s.applies(category, name):
            ns /= s.factor
    return ns
