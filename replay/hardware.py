"""The GPU catalog the replayer projects onto: peak rates and achievable fractions.

One TOML file per GPU in ``replay/gpus/`` (peak dense TFLOPS per dtype, HBM and scale-up
bandwidth per direction, the fractions of peak tuned kernels reach, the small-kernel regime
(``[kernels]``: the duration of a trivial, launch-bound kernel; ``[class_efficiency]``: how a
kernel class runs against its roofline relative to the NVIDIA parts; ``compute.py``), the SM
clock range and power envelope the clock and power-cap what-ifs use (``clocks.py``), and
where the numbers come from). The source GPU of a trace is found from its
``deviceProperties`` names.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources

DTYPES = ("fp16", "bf16", "tf32", "fp32", "fp8")


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
    class_efficiency: dict[str, float] = field(default_factory=dict)  # by class; absent: 1
    kernels_source: str = ""

    def efficiency(self, category: str) -> float:
        """How fast kernels of ``category`` run against the roofline, relative to 1.0."""
        return self.class_efficiency.get(category, 1.0)

    def peak_tflops(self, dtype: str) -> float:
        """Peak for ``dtype``, falling back to the widest type the GPU does have units for
        (V100 runs BF16 work at FP32 rates)."""
        for d in (dtype, "fp32"):
            if self.tflops.get(d, 0.0) > 0:
                return self.tflops[d]
        raise ValueError(f"{self.key}: no peak rate for {dtype}")


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
               class_efficiency={k: float(v) for k, v in
                                 doc.get("class_efficiency", {}).items()},
               kernels_source=source.get("kernels", ""))


def catalog() -> dict[str, Gpu]:
    """Every GPU of the catalog, by key."""
    d = resources.files("tracetool.replay").joinpath("gpus")
    return {f.name[:-5]: _load(f.name[:-5], f.read_text())
            for f in sorted(d.iterdir(), key=lambda f: f.name) if f.name.endswith(".toml")}


def find_gpu(device_name: str, gpus: dict[str, Gpu] | None = None) -> Gpu | None:
    """The catalog GPU a ``deviceProperties`` name denotes, or None when it names none (or
    several: the longest match wins, so 'MI300X VF' is an MI300X and 'H200' not an H100)."""
    gpus = gpus if gpus is not None else catalog()
    name = device_name.lower()
    hits = [(len(m), g) for g in gpus.values() for m in g.match if m.lower() in name]
    return max(hits, key=lambda h: h[0])[1] if hits else None


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
