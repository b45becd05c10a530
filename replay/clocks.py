"""GPU clock and power-cap what-ifs: the SM clock a scenario runs the GPU at.

**Reference clock.** Kineto traces record no clock (``deviceProperties`` has none), so a trace
is assumed to have run at its GPU's max boost clock (``boost_mhz`` in ``tracetool/gpus/*.toml``),
and every clock what-if is relative to that; the replay's notes say so. A GPU that was
power- or thermally throttled while traced ran below it, which makes a lower clock look
costlier than it is.

**Kernels** (``model.op_factors`` through ``at_clock``). An SM clock f scales the GPU's peak
FLOPS by f / f_boost and leaves its HBM bandwidth alone (the memory clock, which SM-clock
locks and power caps do not move), so with the kernel model of ``compute.py``:

- a compute-class kernel (``compute.COMPUTE_BOUND``: gemm, conv, attention) whose launching
  op has shapes takes the roofline ratio ``max(c f_boost / f, m) / max(c, m)`` (c, m: its
  FLOP and byte times at the achievable fractions): f_boost / f when compute-bound, 1 when
  memory-bound;
- without shapes a compute-class kernel is compute-bound (f_boost / f), and every other class
  (norm, reduction, elementwise, other, memcpy, memset) memory-bound (unchanged);
- communication kernels (the network model's), host copies and CPU work are unchanged.

With ``--gpu`` the clock is the target GPU's, relative to the target's max boost.

**Power cap -> clock.** Dynamic power is ``a C V^2 f``, and over the DVFS range the voltage
rises about linearly with the clock, so it grows as f^3 (T. Mudge, "Power: a first-class
architectural design constraint", IEEE Computer 34(4), 2001). With a static part P_static
(leakage and what the SM clock does not drive; the GPU's idle draw, ``static_w`` in its TOML)
and the GPU drawing its TDP at max boost::

    P(f) = P_static + (TDP - P_static) (f / f_boost)^3
    f(cap) = f_boost ((cap - P_static) / (TDP - P_static))^(1/3)   (f_boost for cap >= TDP)

A cap below the driver's minimum limit (``min_limit_w``) is refused, as ``nvidia-smi -pl``
refuses it. ``--gpu-clock`` and ``--power-cap`` together run at the lower of the two clocks.

**Uncertainty.** The relation is for work that draws the TDP at max boost (dense compute);
lighter work (memory-bound, small kernels) draws less and keeps more clock under the same
cap, so there the model is pessimistic. For deep caps it is optimistic: below the DVFS knee
the voltage sits at its floor and power is about linear in f, and under load P_static is
above the idle draw (HBM, leakage when hot). Public measurements: SDXL on a V100 ran 1.13x
faster at 250 W than at 175 W (bradrlaw/ai-server#32; the relation gives 1.18x for fully
compute-bound work); an RTX 3090's SM clock followed its cap linearly, 705 MHz at 180 W to
1695 MHz at 310 W (noonghunna/club-3090#104), below even the linear law (with a ~30 W idle
draw); cuBLAS GEMM on a GB300 capped at 36% of its 1400 W ran at 0.28-0.39x its uncapped rate
(facebookexperimental/triton#2023), where the relation gives about 0.66x (with a 10% static
share). Neither GPU is in the catalog, but the physics is the same. So the notes give
the linear law's clock, ``P = P_static + (TDP - P_static) f / f_boost``, beside the cubic's:
take the cubic for moderate caps and expect the linear or lower for caps near the minimum.
Several catalog constants are tagged [U] (unverified) in their TOML.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from tracetool.hardware import Clocks, Gpu

from .compute import COMPUTE_BOUND, WhatIfError

DVFS_EXPONENT = 3.0  # P_dyn ~ f V^2 with V ~ f
_POWER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(w|%)?\s*$", re.IGNORECASE)
_MHZ = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(mhz)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class PowerCap:
    """A board power limit as given: watts, or a fraction of the TDP of the GPU it applies to
    (the ``--gpu`` target, else the trace's GPU: known only when the scenario is applied)."""

    watts: float | None = None
    tdp_fraction: float | None = None
    text: str = ""  # as given, for labels and messages

    def __str__(self) -> str:
        if self.text:
            return self.text
        return f"{self.watts:g}W" if self.watts is not None else f"{100 * self.tdp_fraction:g}%"

    def watts_on(self, clocks: Clocks) -> float:
        return self.watts if self.watts is not None else self.tdp_fraction * clocks.tdp_w


def parse_power_cap(text: str) -> PowerCap:
    """``300`` or ``300W``: watts; ``0.7`` (a plain number up to 1) or ``70%``: a fraction of
    the GPU's TDP. Raises ``WhatIfError`` for anything else, zero included."""
    m = _POWER.match(text)
    value = float(m.group(1)) if m else 0.0
    if not (value > 0 and math.isfinite(value)):
        raise WhatIfError(f"bad power cap {text!r}: give watts (300, 300W) or a fraction of "
                          "the TDP (0.7, 70%), > 0")
    unit = (m.group(2) or "").lower()
    if unit == "%":
        return PowerCap(tdp_fraction=value / 100, text=text.strip())
    if not unit and value <= 1:
        return PowerCap(tdp_fraction=value, text=text.strip())
    return PowerCap(watts=value, text=text.strip())


def parse_gpu_clock(text: str) -> float:
    """An SM clock in MHz (``1200``, ``1200MHz``); ``WhatIfError`` unless a number > 0."""
    m = _MHZ.match(text)
    value = float(m.group(1)) if m else 0.0
    if not (value > 0 and math.isfinite(value)):
        raise WhatIfError(f"bad GPU clock {text!r}: give the SM clock in MHz, > 0 (e.g. 1200)")
    return value


def sustained_clock_mhz(clocks: Clocks, watts: float, exponent: float = DVFS_EXPONENT
                        ) -> float:
    """The SM clock the GPU sustains under a ``watts`` cap while drawing its TDP at max boost
    uncapped: ``P(f) = P_static + (TDP - P_static) (f / f_boost)^exponent`` solved for f
    (module docstring), at least the GPU's lowest clock."""
    if watts >= clocks.tdp_w:
        return clocks.boost_mhz
    share = max(watts - clocks.static_w, 0.0) / (clocks.tdp_w - clocks.static_w)
    return max(clocks.min_mhz, clocks.boost_mhz * share ** (1 / exponent))


def scenario_clock(gpu: Gpu, clock_mhz: float | None, power_cap: PowerCap | None,
                   exponent: float = DVFS_EXPONENT) -> tuple[float, list[str]]:
    """The SM clock ``gpu`` runs at under a clock lock and / or a power cap (the lower of the
    two; the cap's clock by the power law of ``exponent``: 3 the model, 1 the linear law the
    band spans too), and notes saying what was assumed. ``WhatIfError`` for a clock outside
    the GPU's range or a cap below its minimum power limit."""
    c = gpu.clocks
    if c is None:
        raise WhatIfError(f"the catalog has no clock and power data for the {gpu.name} "
                          f"(tracetool/gpus/{gpu.key}.toml)")
    mhz, notes = c.boost_mhz, []
    if clock_mhz is not None:
        if not c.min_mhz <= clock_mhz <= c.boost_mhz:
            raise WhatIfError(f"GPU clock {clock_mhz:g} MHz: outside the {gpu.name}'s SM clock "
                              f"range, {c.min_mhz:g}-{c.boost_mhz:g} MHz "
                              f"(tracetool/gpus/{gpu.key}.toml)")
        mhz = clock_mhz
    if power_cap is not None:
        watts = power_cap.watts_on(c)
        given = f"power cap {str(power_cap)!r}" + (
            "" if power_cap.watts is not None else f" ({watts:g} W)")
        if watts < c.min_limit_w:
            raise WhatIfError(f"{given}: below the {gpu.name}'s minimum power limit of "
                              f"{c.min_limit_w:g} W (tracetool/gpus/{gpu.key}.toml)")
        capped = sustained_clock_mhz(c, watts, exponent)
        if watts >= c.tdp_w:
            notes.append(f"{given}: at or above the {gpu.name}'s {c.tdp_w:g} W TDP, so no "
                         "throttling")
        else:
            cubic, linear = (sustained_clock_mhz(c, watts, x) for x in (DVFS_EXPONENT, 1))
            notes.append(f"power cap {watts:g} W, {100 * watts / c.tdp_w:.0f}% of the "
                         f"{gpu.name}'s {c.tdp_w:g} W TDP: sustained SM clock {cubic:.0f} "
                         "MHz by P = P_static + (TDP - P_static) (f / f_boost)^3 with P_static "
                         f"{c.static_w:g} W; {linear:.0f} MHz if power is linear in the clock "
                         "(voltage at its floor), likelier for deep caps; the band spans both "
                         "(replay/clocks.py)")
        mhz = min(mhz, capped)
    notes.insert(0, f"assumed: the trace ran at its GPU's max boost clock (traces record no "
                    f"clock); the {gpu.name} at {mhz:.0f} of its {c.boost_mhz:g} MHz: "
                    f"compute-bound kernels (roofline from shapes, else {'/'.join(COMPUTE_BOUND)}"
                    ") scale with the SM clock; memory-bound ones, communication and CPU work "
                    "stay as measured")
    return mhz, notes


def at_clock(gpu: Gpu, mhz: float) -> Gpu:
    """``gpu`` with its SM clock at ``mhz``: peak FLOPS scaled by mhz / max boost, memory
    bandwidth unchanged (``gpu`` itself at max boost)."""
    if gpu.clocks is None or mhz == gpu.clocks.boost_mhz:
        return gpu
    r = mhz / gpu.clocks.boost_mhz
    return replace(gpu, tflops={d: v * r for d, v in gpu.tflops.items()})


def power_w(clocks: Clocks, mhz: float, exponent: float = DVFS_EXPONENT) -> float:
    """The board power of the GPU at SM clock ``mhz``: ``P(f) = P_static + (TDP - P_static)
    (f / f_boost)^exponent``, the relation a cap's clock solves (so under a cap below the TDP
    it is the cap), for work that draws the TDP at max boost (dense compute: an upper end
    for lighter work and for the time the GPU idles, when it draws about P_static)."""
    return clocks.static_w + (clocks.tdp_w - clocks.static_w) * (mhz / clocks.boost_mhz) ** exponent


@dataclass(frozen=True)
class GpuPower:
    """What the power model says the replayed GPUs draw: one GPU per replayed rank with GPU
    ops, each at ``watts`` = P(f) (``power_w``) at its SM clock ``mhz``, for the whole step.
    The energy of a step is that times its (projected) time: GPU board power only, at full
    load (the host, the network, cooling are not in it; idle GPU time is counted at full
    load too, so for a host-bound step it is an upper end)."""

    gpu: str  # catalog name of the GPU the ops run on (the --gpu target, else the trace's)
    mhz: float
    watts: float  # per GPU
    gpus: int

    def energy_j(self, step_ns: float) -> float:
        """Joules of one step of ``step_ns`` ns."""
        return self.watts * self.gpus * step_ns * 1e-9

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "sm_clock_mhz": self.mhz, "gpu_power_w": self.watts,
                "gpus": self.gpus}


def gpu_power(gpu: Gpu, clock_mhz: float | None, power_cap: PowerCap | None, gpus: int
              ) -> GpuPower | None:
    """The power model's draw of ``gpus`` of ``gpu`` under a clock lock and / or a power cap
    (their clock: ``scenario_clock``), None when the catalog has no power data for it."""
    if gpu.clocks is None:
        return None
    mhz = scenario_clock(gpu, clock_mhz, power_cap)[0]
    return GpuPower(gpu.name, mhz, power_w(gpu.clocks, mhz), gpus)
