"""The GPU catalog of the replayer: complete entries, and trace device names mapped to them."""

from __future__ import annotations

import pytest

from tracetool.hardware import DTYPES, catalog, find_gpu


def test_catalog_has_the_gpus_with_complete_numbers() -> None:
    gpus = catalog()
    assert sorted(gpus) == ["a100", "b200", "h100", "h200", "mi250x", "mi300x", "v100"]
    for g in gpus.values():
        assert g.hbm_gbps > 0 and g.scale_up_gbps > 0 and g.source
        assert set(g.tflops) == set(DTYPES) and g.tflops["fp32"] > 0
        assert set(g.achievable) == {"compute", "memory", "scale_up"}
        assert all(0 < v <= 1 for v in g.achievable.values())
    # generations get faster where the datasheets say so
    bf16 = {k: gpus[k].peak_tflops("bf16") for k in ("a100", "h100", "b200")}
    assert bf16["a100"] < bf16["h100"] < bf16["b200"]
    assert gpus["h200"].hbm_gbps > gpus["h100"].hbm_gbps
    assert gpus["v100"].peak_tflops("bf16") == gpus["v100"].tflops["fp32"]  # no BF16 units


@pytest.mark.parametrize(("device", "key"), [
    ("Tesla V100-SXM2-32GB", "v100"), ("Tesla V100-DGXS-32GB", "v100"),
    ("NVIDIA A100-PG509-200", "a100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100", "h100"), ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"), ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI300X VF", "mi300x"), ("AMD Instinct MI250X", "mi250x"),
    # names that say too little: the user gives --gpu at replay
    ("AMD Radeon Graphics", None), ("Quadro GP100", None), ("NVIDIA GeForce RTX 2080 Ti", None),
    ("", None),
])
def test_device_names_from_real_traces(device: str, key: str | None) -> None:
    g = find_gpu(device)
    assert (g.key if g else None) == key
