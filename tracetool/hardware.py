"""The GPU catalog the replayer projects onto: peak rates and achievable fractions.

One TOML file per GPU in ``tracetool/gpus/`` (peak dense TFLOPS per dtype, HBM and scale-up
bandwidth per direction, the fractions of peak tuned kernels reach (``[achievable]``, from
published measurements), the HBM latency that sets how large a memory-bound kernel must be to
reach that fraction (``[memory]``), the duration of a trivial, launch-bound kernel
(``[kernels]``; ``compute.py``), the SM clock range and power envelope the clock and power-cap
what-ifs use (``clocks.py``), and where each number comes from: every figure is tagged [P]
(a vendor document or the device's own readout), [S] (secondary), [M] (measured on a trace of
that GPU), [F] (fitted; its fit set in ``[source]``) or [U] (unsourced or assumed), and a test
holds every file to it). The source GPU of a trace is found from its ``deviceProperties``
names.

Dtypes: a GPU without units for a dtype (an A100 has no FP8, a V100 no BF16) runs that work
at its next wider precision (``NEXT_PRECISION``: FP8 -> BF16 -> FP32, FP16 / TF32 -> FP32),
as frameworks do when they fall back, and the replay's notes say so (``model.dtype_notes``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources

DTYPES = ("fp16", "bf16", "tf32", "fp32", "fp8")
# the precision a GPU without units for a dtype runs its work at (FP8 -> BF16: an FP8 model
# on an A100 runs in BF16; BF16 -> FP32: a V100 has no BF16 units)
NEXT_PRECISION = {"fp8": "bf16", "bf16": "fp32", "fp16": "fp32", "tf32": "fp32"}


@dataclass(frozen=True)
class Clocks:
    """A GPU's SM clock range and power envelope (its TOML's ``[clocks]`` and ``[power]``)."""

    boost_mhz: float  # max SM clock: the reference, the clock a trace is assumed to run at
    base_mhz: float  # 0 = not published
    min_mhz: float  # lowest SM clock the GPU runs at
    memory_mhz: float  # 0 = not found; no what-if changes it
    tdp_w: float
    min_limit_w: float  # the lowest power limit the driver accepts
    static_w: float  # P_static of the power-clock relation (clocks.py)
    source: str = ""


@dataclass(frozen=True)
class Gpu:
    key: str  # file stem: v100, a100, ...
    name: str
    vendor: str
    match: tuple[str, ...]
    tflops: dict[str, float]  # dense peak per dtype; 0 = no such units
    hbm_gbps: float
    scale_up_gbps: float  # per direction
    achievable: dict[str, float] = field(default_factory=dict)  # compute, memory, scale_up
    source: str = ""
    clocks: Clocks | None = None
    kernel_floor_ns: float = 0.0  # a trivial, launch-bound kernel's duration
    kernels_source: str = ""
    hbm_latency_ns: float = 0.0  # a load's round trip to HBM: sets the bytes in flight needed
    achievable_source: str = ""

    def runs_at(self, dtype: str) -> str:
        """The precision this GPU runs ``dtype`` work at: the dtype itself when it has units
        for it, else the next wider one it has (``NEXT_PRECISION``)."""
        d = dtype
        while self.tflops.get(d, 0.0) <= 0:
            if d not in NEXT_PRECISION:
                raise ValueError(f"{self.key}: no peak rate for {dtype}")
            d = NEXT_PRECISION[d]
        return d

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for ``dtype`` work: at ``runs_at(dtype)`` (an A100 runs FP8 at BF16)."""
        return self.tflops[self.runs_at(dtype)]

    @property
    def hbm_achieved_gbps(self) -> float:
        """The HBM bandwidth a large streaming kernel reaches (peak x achievable memory)."""
        return self.hbm_gbps * self.achievable["memory"]

    @property
    def ramp_bytes(self) -> float:
        """Bytes at which a memory-bound kernel reaches half its achievable bandwidth: the
        bytes in flight that cover the HBM latency (Little's law, bandwidth x latency)."""
        return self.hbm_achieved_gbps * self.hbm_latency_ns

    def hbm_efficiency(self, nbytes: float) -> float:
        """The fraction of peak HBM bandwidth a kernel moving ``nbytes`` reaches:
        ``achievable x B / (B + ramp_bytes)``, so its time above the floor is
        ``latency + B / achieved bandwidth`` (``compute.memory_s``)."""
        b = max(float(nbytes), 0.0)
        return self.achievable["memory"] * b / (b + self.ramp_bytes) if b > 0 else 0.0


def _load(key: str, text: str) -> Gpu:
    doc = tomllib.loads(text)
    peak = doc["peak"]
    tflops = {d: float(peak.get(f"{d}_tflops", 0.0)) for d in DTYPES}
    source = doc.get("source", {})
    clocks = None
    if "clocks" in doc and "power" in doc:
        clocks = Clocks(**{k: float(v) for k, v in (doc["clocks"] | doc["power"]).items()},
                        source=source.get("clocks", ""))
    return Gpu(key=key, name=doc["name"], vendor=doc["vendor"], match=tuple(doc["match"]),
               tflops=tflops, hbm_gbps=float(peak["hbm_gbps"]),
               scale_up_gbps=float(peak["scale_up_gbps"]),
               achievable={k: float(v) for k, v in doc["achievable"].items()},
               source=source.get("text", ""), clocks=clocks,
               kernel_floor_ns=float(doc.get("kernels", {}).get("floor_us", 0.0)) * 1e3,
               kernels_source=source.get("kernels", ""),
               hbm_latency_ns=float(doc.get("memory", {}).get("latency_ns", 0.0)),
               achievable_source=source.get("achievable", ""))


def catalog() -> dict[str, Gpu]:
    """Every GPU of the catalog, by key."""
    d = resources.files("tracetool").joinpath("gpus")
    return {f.name[:-5]: _load(f.name[:-5], f.read_text())
            for f in sorted(d.iterdir(), key=lambda f: f.name) if f.name.endswith(".toml")}


def find_gpu(device_name: str, gpus: dict[str, Gpu] | None = None) -> Gpu | None:
    """The catalog GPU a ``deviceProperties`` name denotes, or None when it names none (or
    several: the longest match wins, so 'MI300X VF' is an MI300X and 'H200' not an H100)."""
    gpus = gpus if gpus is not None else catalog()
    name = device_name.lower()
    hits = [(len(m), g) for g in gpus.values() for m in g.match if m.lower() in name]
    return max(hits, key=lambda h: h[0])[1] if hits else None


def trace_gpu(device_names: Iterable[str], gpus: dict[str, Gpu] | None = None) -> Gpu | None:
    """The catalog GPU a trace ran on: the first of its ``deviceProperties`` names (in sorted
    order) that ``find_gpu`` knows, None when none is in the catalog."""
    gpus = gpus if gpus is not None else catalog()
    for name in sorted(n for n in device_names if n):
        gpu = find_gpu(name, gpus)
        if gpu is not None:
            return gpu
    return None


def lookup_gpu(text: str, gpus: dict[str, Gpu] | None = None) -> Gpu | None:
    """The catalog GPU ``text`` names exactly, case-insensitive: its key (h100), its ``name``
    (H100 SXM) or one of its ``match`` names (MI250); None for anything else."""
    gpus = gpus if gpus is not None else catalog()
    want = text.strip().lower()
    for g in gpus.values():
        if want in {g.key.lower(), g.name.lower(), *(m.lower() for m in g.match)}:
            return g
    return None


def catalog_help(gpus: dict[str, Gpu] | None = None) -> str:
    """What a GPU option accepts, from the catalog, for help texts: 'a catalog key (a100,
    b200, ...) or name (e.g. 'A100 SXM 80GB'), case-insensitive'."""
    gpus = gpus if gpus is not None else catalog()
    example = f" (e.g. '{next(iter(gpus.values())).name}')" if gpus else ""
    return f"a catalog key ({', '.join(gpus)}) or name{example}, case-insensitive"


def describe_catalog(gpus: dict[str, Gpu] | None = None) -> str:
    """'a100 (A100 SXM 80GB), ...': every key with its name, for error messages."""
    gpus = gpus if gpus is not None else catalog()
    return ", ".join(f"{k} ({g.name})" for k, g in gpus.items())
