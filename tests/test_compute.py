"""Projecting kernel times across GPUs: work from op shapes, roofline, class ratios, speedups."""

from __future__ import annotations

import json

import pytest

from tracetool.hardware import catalog
from tracetool.opwork import Work, op_work, roofline_s
from tracetool.replay.compute import apply_speedups, parse_speedup, project_ns

from ._util import SHARED_TRACES

GPUS = catalog()


def test_work_from_shapes() -> None:
    w = op_work("aten::mm", [[64, 128], [128, 256]], ["float", "float"])
    assert w == Work(2 * 64 * 128 * 256, (64 * 128 + 128 * 256 + 64 * 256) * 4, "fp32")
    with_bias = op_work("aten::addmm", [[512], [141, 512], [512, 512], [], []],
                        ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"])
    no_bias = op_work("aten::addmm", [[], [141, 512], [512, 512], [], []],
                      ["", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"])
    assert with_bias.flops == no_bias.flops == 2 * 141 * 512 * 512
    assert with_bias.dtype == "bf16"
    bmm = op_work("aten::bmm", [[8, 64, 32], [8, 32, 16]], ["c10::Half", "c10::Half"])
    assert bmm.flops == 2 * 8 * 64 * 32 * 16 and bmm.dtype == "fp16"
    # flash attention forward: [batch, seq, heads, dim]; SDPA: [batch, heads, seq, dim]
    fa = op_work("aten::_flash_attention_forward", [[1, 141, 8, 64]] * 3, ["c10::BFloat16"] * 3)
    sdpa = op_work("aten::_scaled_dot_product_flash_attention", [[1, 8, 141, 64]] * 3,
                   ["c10::BFloat16"] * 3)
    assert fa.flops == sdpa.flops == 4 * 1 * 8 * 141 * 141 * 64
    assert op_work("aten::add", [[4, 4], [4, 4]], ["float", "float"]) is None
    assert op_work("aten::mm", [[], []], ["", ""]) is None


def test_projection_onto_the_source_gpu_is_the_measurement() -> None:
    w = Work(1e12, 1e9, "bf16")
    for g in GPUS.values():
        assert project_ns(1234.0, "gemm", g, g, w) == pytest.approx(1234.0)
        assert project_ns(1234.0, "elementwise", g, g) == pytest.approx(1234.0)


def test_roofline_and_class_ratios_between_generations() -> None:
    h100, b200 = GPUS["h100"], GPUS["b200"]
    big_gemm = Work(1e13, 1e9, "bf16")  # compute-bound on both
    ratio = project_ns(1e6, "gemm", h100, b200, big_gemm) / 1e6
    want = (989.4 * 0.70) / (2250.0 * 0.65)
    assert ratio == pytest.approx(want)
    assert roofline_s(h100, big_gemm) > roofline_s(b200, big_gemm)
    # memory-bound without shapes: HBM ratio; compute-bound without shapes: TFLOPS ratio
    assert project_ns(1e6, "elementwise", h100, b200) == pytest.approx(1e6 * 3350 / 8000)
    assert project_ns(1e6, "gemm", h100, b200, dtype="bf16") == pytest.approx(
        1e6 * 989.4 / 2250.0)
    assert project_ns(1e6, "comm", h100, b200) == 1e6  # the network model's job


def test_speedups() -> None:
    s = [parse_speedup("gemm=1.5"), parse_speedup("name~flash=2")]
    assert apply_speedups(300.0, "gemm", "sm90_xmma_gemm", s) == pytest.approx(200.0)
    assert apply_speedups(300.0, "attention", "flash_fwd_kernel", s) == pytest.approx(150.0)
    assert apply_speedups(300.0, "elementwise", "add", s) == 300.0
    for bad in ("gemm", "gemm=0", "gemm=fast", "name~(=2"):
        with pytest.raises(ValueError, match="bad speedup"):
            parse_speedup(bad)


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="real trace corpus not found")
def test_gemm_kernels_of_a_real_trace_get_work_from_their_ops(tmp_path) -> None:  # noqa: ANN001
    import tracetool
    from tracetool.ingest import Options, ingest

    trace = (SHARED_TRACES / "AMD-AGI__TraceLens/tests/traces/h100/"
             "gaunernst_bert-small-uncased__1016001.json.gz")
    store = tmp_path / "s"
    assert ingest([trace], Options(store=store, rank=0, workers=1))[0].status == "ingested"
    con = tracetool.connect(store)
    rows = con.execute("""
        SELECT k.category, o.name, o.args FROM kernels k
        JOIN events o ON o.job = k.job AND o.rank = k.rank AND o.eid = k.op_eid
        WHERE k.category IN ('gemm', 'attention')""").fetchall()
    assert len(rows) == 30
    for _cat, name, args in rows:
        a = json.loads(args)
        w = op_work(name, a["Input Dims"], a["Input type"])
        assert w is not None and w.flops > 0 and w.dtype == "bf16", name


def test_small_kernels_take_the_target_floor() -> None:
    """A 1.57 us H100 kernel (its floor) takes the MI300X's 2.0 us floor; a 10 us attention
    kernel: the floor plus the 8.43 us above it, scaled by the peak and achievable ratio (hand
    computation from the catalog's TOML); no factor per class."""
    import numpy as np

    from tracetool.replay.compute import project_kernel_ns

    h, m = catalog()["h100"], catalog()["mi300x"]
    assert (h.kernel_floor_ns, m.kernel_floor_ns) == (1570.0, 2000.0)
    ratio = (989.4 * 0.70) / (1307.4 * 0.45)
    got = project_kernel_ns(np.array([1570.0, 10_000.0]), np.array([3350 / 5300, ratio]), h, m)
    assert got[0] == pytest.approx(2000.0)
    assert got[1] == pytest.approx(2000.0 + 8430.0 * ratio)
    back = project_kernel_ns(np.array([got[1]]), np.array([1 / ratio]), m, h)
    assert back[0] == pytest.approx(10_000.0)  # the model is its own inverse above the floors
