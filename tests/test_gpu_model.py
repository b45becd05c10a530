"""The GPU model's published-figure parts: dtype peaks (and the rule for a dtype the target
lacks), the size-dependent HBM efficiency of memory-bound kernels, against hand computations
from the catalog's TOML; and the record that the out-of-sample figures were re-run when a
constant moved (benchmarks/gpu_accuracy.py's hash in BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tracetool.hardware import catalog
from tracetool.opwork import memory_bytes
from tracetool.replay.compute import memory_ratio, memory_s
from tracetool.replay.model import _compute_ratio, dtype_notes

REPO = Path(__file__).resolve().parent.parent
GPUS = catalog()
H, M, A, V = GPUS["h100"], GPUS["mi300x"], GPUS["a100"], GPUS["v100"]


def test_dtype_peaks_and_the_next_precision_rule() -> None:
    assert [H.peak_tflops(d) for d in ("fp8", "bf16", "fp16", "tf32", "fp32")] == \
        [1978.9, 989.4, 989.4, 494.7, 67.0]
    assert M.peak_tflops("fp8") == 2614.9 and M.peak_tflops("tf32") == 653.7
    # an A100 has no FP8 units: FP8 work runs at its BF16 peak; a V100 has no BF16: FP32
    assert (A.runs_at("fp8"), A.peak_tflops("fp8")) == ("bf16", 312.0)
    assert (V.runs_at("bf16"), V.peak_tflops("bf16")) == ("fp32", 15.7)
    assert (V.runs_at("fp8"), V.peak_tflops("fp8")) == ("fp32", 15.7)
    assert A.runs_at("bf16") == "bf16" and H.runs_at("fp8") == "fp8"


def test_an_fp8_gemm_onto_an_a100_runs_at_bf16_and_says_so() -> None:
    """A compute-bound FP8 GEMM (8192^3) from an H100 onto an A100: the roofline ratio of the
    H100's FP8 peak to the A100's BF16 peak, at their achievable fractions; a note names it."""
    dims, types = json.dumps([[8192, 8192], [8192, 8192]]), \
        json.dumps(["c10::Float8_e4m3fn", "c10::Float8_e4m3fn"])
    ratio, _ = _compute_ratio(("aten::mm", dims, types), H, A)
    assert ratio == pytest.approx((1978.9 * 0.70) / (312.0 * 0.75))
    ops = {"category": np.array(["gemm", "elementwise"]), "dur": np.array([900.0, 100.0]),
           "dims": np.array([dims, None], dtype=object),
           "types": np.array([types, None], dtype=object)}
    notes = dtype_notes(SimpleNamespace(ops=ops), A)
    assert notes == ["1 FP8 compute kernels (90% of GPU op time): the A100 SXM 80GB has no FP8 "
                     "units, so they are projected at its BF16 peak, the next wider precision "
                     "it has (as a framework falls back); the model it ran may not run that way"]
    assert dtype_notes(SimpleNamespace(ops=ops), M) == []  # the MI300X has FP8


def test_hbm_efficiency_grows_with_size() -> None:
    """H100: 3350 GB/s x 0.84 = 2814 GB/s achieved, 400 ns latency, so 1,125,600 bytes in
    flight give half of it; MI300X: 5300 x 0.81 = 4293 GB/s."""
    assert H.hbm_achieved_gbps == pytest.approx(2814.0)
    assert M.hbm_achieved_gbps == pytest.approx(4293.0)
    assert H.ramp_bytes == pytest.approx(1_125_600.0)
    assert H.hbm_efficiency(1_125_600.0) == pytest.approx(0.42)
    assert H.hbm_efficiency(11_256_000.0) == pytest.approx(0.84 * 10 / 11)
    assert H.hbm_efficiency(0) == 0.0
    assert memory_s(H, 2.814e6) == pytest.approx(1.4e-6)  # 400 ns + 1 us
    assert memory_s(M, 4.293e6) == pytest.approx(1.4e-6)


def test_memory_ratio_large_small_and_inferred() -> None:
    # 1 GB (from shapes): the achieved-bandwidth ratio, plus the latencies
    assert memory_ratio(0.0, 1e9, H, M) == pytest.approx(
        (0.4 + 1e9 / 4293e3) / (0.4 + 1e9 / 2814e3))
    # no bytes recorded: 10.4 us above the H100's floor moves (10.4 - 0.4) us x 2814 GB/s
    assert memory_ratio(10_400.0, None, H, M) == pytest.approx((0.4 + 28.14e6 / 4293e3) / 10.4)
    # within the latency: no bytes, the latencies' ratio (equal here)
    assert memory_ratio(300.0, None, H, M) == pytest.approx(1.0)


def test_memory_bytes_from_shapes() -> None:
    add = memory_bytes("aten::add", [[16, 16, 559, 64], [16, 16, 559, 64], []],
                       ["c10::BFloat16", "c10::BFloat16", "Scalar"])
    assert add == 3 * 16 * 16 * 559 * 64 * 2  # two inputs read, one output written
    mean = memory_bytes("aten::mean", [[16, 559, 1024], [], [], []],
                        ["float", "ScalarList", "Scalar", ""])
    assert mean == 16 * 559 * 1024 * 4  # a reduction: its output is not counted
    cat = memory_bytes("aten::cat", [[[4, 8], [4, 8]], []], ["TensorList", "Scalar"])
    assert cat is None  # a TensorList's elements have no recorded dtype here
    cat = memory_bytes("aten::cat", [[[4, 8], [4, 8]], [4, 8]], ["TensorList", "float"])
    assert cat == (32 + 32 + 32 + 32) * 4


def _gpu_accuracy():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("gpu_accuracy",
                                                  REPO / "benchmarks/gpu_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(regime: str, memory: float, library: float, cpu: tuple[float, float]) -> dict:
    """A projection as gpu_accuracy.project gives it: the groups' (projected, measured ms,
    error) and both traces' CPU work."""
    return {"regime": regime, "groups": {"memory": (0.0, 1.0, memory),
                                         "library": (0.0, 1.0, library)},
            "cpu_source_ms": cpu[0], "cpu_target_ms": cpu[1]}


def test_band_terms_sized_from_the_fit_pairs() -> None:
    """The band's GPU terms from projections: each kernel term the worst ratio error of the
    memory-bound classes of its regime's jobs (x1.5 and x/1.25 -> 0.5; the other regime's
    when none), kernel_library the worst of the library classes' (x/2 -> 1.0), host_cpu the
    worst ratio of the two hosts' CPU work (band.fit_host_cpu: 100 / 90 -> 11.1%, rounded up
    to 12%)."""
    acc = _gpu_accuracy()
    rows = [_row("kernel_large", 0.5, -0.5, (100.0, 90.0)),
            _row("kernel_large", -0.2, 0.3, (100.0, 105.0))]
    assert acc.size_terms(rows) == pytest.approx(
        {"kernel_small": 0.5, "kernel_large": 0.5, "kernel_library": 1.0, "host_cpu": 0.12})
    rows.append(_row("kernel_small", 1.0, 0.0, (1.0, 1.0)))
    assert acc.size_terms(rows)["kernel_small"] == pytest.approx(1.0)
    assert acc.size_terms(rows)["kernel_large"] == pytest.approx(0.5)


def test_the_library_term_applies_onto_another_gpu_only() -> None:
    """kernel_library prices the gemm / conv / attention kernels onto another GPU (another
    vendor's, or the same vendor's other architecture), not a clock change of the same GPU;
    kernel_small / kernel_large split every op at 10 us."""
    from tracetool.replay import Scenario
    from tracetool.replay.band import kernel_terms, op_errors, using_terms

    g = SimpleNamespace(ops={"dur": np.array([5_000.0, 50_000.0, 50_000.0, 2_000.0]),
                             "category": np.array(["gemm", "attention", "elementwise",
                                                   "conv"])}, devices=[])
    onto = kernel_terms(g, Scenario(gpu=M, source_gpu=H))
    assert onto["kernel_library"].tolist() == [True, True, False, True]
    assert onto["kernel_small"].tolist() == [True, False, False, True]
    assert kernel_terms(g, Scenario(gpu=GPUS["h200"], source_gpu=H))["kernel_library"].any()
    assert "kernel_library" not in kernel_terms(g, Scenario(gpu_clock_mhz=1000,
                                                            source_gpu=H))
    with using_terms({"kernel_small": 0.1, "kernel_large": 0.2, "kernel_library": 0.5}):
        assert op_errors(g, Scenario(gpu=M, source_gpu=H)).tolist() == [0.5, 0.5, 0.2, 0.5]
    assert op_errors(g, Scenario(gpu=M, source_gpu=H), {"kernel_library": 0.0,
                                                        "kernel_small": 0.1,
                                                        "kernel_large": 0.2}).tolist() == \
        [0.1, 0.2, 0.2, 0.1]


def test_out_of_sample_figures_were_rerun_for_these_constants() -> None:
    """benchmarks/gpu_accuracy.py prints the hash of every constant it rests on; BENCHMARKS.md
    must hold the current one: a constant (catalog or band GPU term) that moved without the
    leave-one-pair-out figures being re-run and recorded fails here. And that run's
    out-of-sample band (the GPU terms sized on the other two pairs) covered every pair's
    step, both directions, with the host difference given; the GPU terms it sized on all
    three pairs are the committed ones (no STALE)."""
    digest = _gpu_accuracy().constants_hash()
    text = (REPO / "BENCHMARKS.md").read_text()
    assert f"constants hash {digest}" in text, digest
    run = text[text.index(f"constants hash {digest}"):]
    run = run[:run.index("```")]
    out = next(ln for ln in run.splitlines() if ln.startswith("out of sample:"))
    assert "band covers 6 of 6" in out.split("step with the host given")[1], out
    assert "STALE" not in run


def test_every_catalog_figure_says_where_it_comes_from() -> None:
    """Each number in tracetool/gpus/*.toml carries exactly one tag (a vendor document [P], a
    secondary page [S], measured on a trace [M], fitted [F], unsourced [U]); a fitted one's
    file names its fit set. The H100 floor is the one fitted figure, and the H100's compute
    fraction is unsourced."""
    import re
    import tomllib

    number = re.compile(r"^\s*(\w+)\s*=\s*[0-9.]+\s*(#.*)?$")
    tagged: dict[tuple[str, str], str] = {}
    for path in sorted((REPO / "tracetool/gpus").glob("*.toml")):
        text = path.read_text()
        for line in text.splitlines():
            m = number.match(line)
            if m:
                tags = re.findall(r"\[([PSMFU])\]", m.group(2) or "")
                assert len(tags) == 1, (path.name, line)
                tagged[(path.stem, m.group(1))] = tags[0]
        if "F" in {t for (g, _), t in tagged.items() if g == path.stem}:
            assert "fit set" in " ".join(tomllib.loads(text)["source"].values()), path.name
    assert len(tagged) == 7 * 19 - 3  # 19 figures each; V100, A100, MI250X have no FP8 line
    assert [k for k, t in tagged.items() if t == "F"] == [("h100", "floor_us")]
    assert tagged[("h100", "compute")] == "U" and tagged[("mi300x", "compute")] == "S"
