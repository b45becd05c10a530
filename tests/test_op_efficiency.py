"""The op_efficiency view (issue 31): per op and shape, FLOPs and bytes from the shapes,
achieved TFLOP/s and TB/s, % of the GPU's peak and the roofline's bound, checked against
FLOPs computed here by hand from the shapes and kernel times read here from the raw JSON:
bert-small on an H100 (GEMM, flash attention, elementwise) and ResNet-18 on an MI300X
(convolution, forward and backward) from TraceLens, and HTA's MI250 toy, whose
"AMD Radeon Graphics" the catalog does not know. The replay projects one op with the same
roofline (tracetool/opwork.py, the one home of both)."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import duckdb
import pytest

import tracetool
from tracetool.analysis.efficiency import roofline_row
from tracetool.hardware import catalog
from tracetool.opwork import memory_bytes, op_class, op_work, work_of
from tracetool.replay.model import Scenario, resolve_gpu
from tracetool.replay.run import Replayer

from ._util import run
from .conftest import TRACES_DIR

TL = TRACES_DIR / "AMD-AGI__TraceLens/tests/traces"
TRACES = {"bert": TL / "h100/gaunernst_bert-small-uncased__1016001.json.gz",
          "resnet": TL / "mi300/ddp_resnet18_no_pool/train_resnet18.json.gz",
          "toy": TRACES_DIR / ("facebookresearch__HolisticTraceAnalysis/tests/data/amd_trace/"
                               "mi250_minitoy_train_ROCm6_2_kineto.json.gz")}
GPUS = catalog()
BF16 = '"c10::BFloat16"'


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not all(p.is_file() for p in TRACES.values()):
        pytest.skip(f"real trace corpus not found at {TRACES_DIR}")
    path = tmp_path_factory.mktemp("eff") / "store"
    for job, src in TRACES.items():
        code, _, err = run("ingest", src, "--store", path, "--job", job, "--rank", "0")
        assert code == 0, err
    return path


@pytest.fixture(scope="module")
def con(store: Path) -> duckdb.DuckDBPyConnection:
    return tracetool.connect(store)


@functools.cache
def _raw(job: str) -> tuple[list[dict], list[dict], dict]:
    """The trace's CPU ops, its launches (runtime calls whose correlation a kernel carries)
    and its kernels' durations by correlation, read from the JSON."""
    ev = json.load(gzip.open(TRACES[job]))["traceEvents"]
    kernels = {e["args"]["correlation"]: float(e["dur"]) for e in ev
               if e.get("cat") == "kernel" and "correlation" in e.get("args", {})}
    launches = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e.get("args", {}).get("correlation") in kernels]
    return [e for e in ev if e.get("cat") == "cpu_op"], launches, kernels


def raw_kernel_ns(job: str, op: str, dims: list) -> tuple[int, float]:
    """From the JSON alone: the calls of ``op`` with Input Dims ``dims``, and the summed
    duration (ns) of the kernels launched inside them (a runtime call on the op's thread,
    within its interval, whose correlation a kernel carries)."""
    ops, launches, kernels = _raw(job)
    calls = [e for e in ops if e["name"] == op and e.get("args", {}).get("Input Dims") == dims]
    total = 0.0
    for c in calls:
        t0, t1 = float(c["ts"]), float(c["ts"]) + float(c["dur"])
        total += sum(kernels[e["args"]["correlation"]] * 1e3 for e in launches
                     if e["tid"] == c["tid"] and e["pid"] == c["pid"]
                     and t0 <= float(e["ts"]) <= t1)
    return len(calls), total


def _row(con: duckdb.DuckDBPyConnection, job: str, op: str, dims: str) -> dict:
    rel = con.sql("SELECT * FROM op_efficiency WHERE job = $job AND op = $op "
                  "AND input_dims = $dims", params={"job": job, "op": op, "dims": dims})
    rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    assert len(rows) == 1, rows
    return rows[0]


def _check(con: duckdb.DuckDBPyConnection, job: str, op: str, dims: list, gpu: str,
           flops: int, nbytes: int, category: str) -> dict:
    """The row of (job, op, dims) against hand-computed FLOPs and bytes, the raw JSON's
    kernel time and the catalog's peaks."""
    r = _row(con, job, op, json.dumps(dims, separators=(",", ":")))
    calls, ns = raw_kernel_ns(job, op, dims)
    g = GPUS[gpu]
    assert (r["flops"], r["bytes"], r["dtype"], r["gpu"]) == (flops, nbytes, "bf16", gpu)
    assert r["count"] == calls and r["category"] == category
    assert r["total_ns"] == pytest.approx(ns, abs=r["kernels"])  # ns rounding per kernel
    tflops = flops * calls / ns / 1e3
    assert r["achieved_tflops"] == pytest.approx(tflops, rel=1e-4)
    assert r["achieved_tbps"] == pytest.approx(nbytes * calls / ns / 1e3, rel=1e-4)
    assert r["intensity"] == pytest.approx(flops / nbytes)
    assert r["pct_peak_flops"] == pytest.approx(100 * tflops / g.tflops["bf16"], rel=1e-4)
    assert r["pct_peak_hbm"] == pytest.approx(
        100 * nbytes * calls / ns / 1e3 / (g.hbm_gbps / 1e3), rel=1e-4)
    ridge = (g.tflops["bf16"] * 1e12 * g.achievable["compute"]
             / (g.hbm_gbps * 1e9 * g.achievable["memory"]))
    assert r["ridge"] == pytest.approx(ridge)
    assert r["bound"] == ("compute" if flops / nbytes >= ridge else "memory")
    roof = max(flops / (g.tflops["bf16"] * 1e12 * g.achievable["compute"]),
               nbytes / (g.hbm_gbps * 1e9 * g.achievable["memory"])) * 1e9
    assert r["roofline_ns"] == pytest.approx(roof)
    assert r["pct_roofline"] == pytest.approx(100 * roof * calls / ns, rel=1e-4)
    assert r["note"] is None
    return r


def test_gemm_on_an_h100(con: duckdb.DuckDBPyConnection) -> None:
    # the MLM head: addmm(bias [30522], x [141, 512], W^T [512, 30522]): 2 m k n
    m, k, n = 141, 512, 30522
    r = _check(con, "bert", "aten::addmm", [[n], [m, k], [k, n], [], []], "h100",
               2 * m * k * n, 2 * (n + m * k + k * n + m * n), "gemm")
    assert r["count"] == 1 and r["bound"] == "memory"  # 110 FLOP/B, under the H100's ridge


def test_flash_attention_on_an_h100(con: duckdb.DuckDBPyConnection) -> None:
    # [batch 1, seq 141, heads 8, head_dim 64]: QK^T and PV, 2 x 2 b h s s d
    q = [1, 141, 8, 64]
    r = _check(con, "bert", "aten::_flash_attention_forward", [q, q, q] + [[]] * 12, "h100",
               4 * 1 * 8 * 141 * 141 * 64, 2 * 4 * 141 * 8 * 64, "attention")
    assert r["count"] == 4


def test_elementwise_on_an_h100(con: duckdb.DuckDBPyConnection) -> None:
    # the residual add: one FLOP per element, two inputs read and one output written
    e = 141 * 512
    r = _check(con, "bert", "aten::add", [[1, 141, 512], [1, 141, 512], []], "h100",
               e, 3 * e * 2, "elementwise")
    assert r["count"] == 9 and r["bound"] == "memory"


def test_convolution_on_an_mi300x(con: duckdb.DuckDBPyConnection) -> None:
    # ResNet's stem: 7x7, stride 2, padding 3 over 224x224 -> 112x112 output positions;
    # 2 x positions x the weight's 64 x 3 x 7 x 7 elements
    out = (224 + 2 * 3 - 1 * (7 - 1) - 1) // 2 + 1
    assert out == 112
    x, w, o = 512 * 3 * 224 * 224, 64 * 3 * 7 * 7, 512 * 64 * out * out
    r = _check(con, "resnet", "aten::miopen_convolution",
               [[512, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []], "mi300x",
               2 * 512 * out * out * w, 2 * (x + w + o), "conv")
    assert r["count"] == 5
    # its backward (grad_output, input, weight; output_mask [True, True, False]): the
    # input's and the weight's gradients, a forward's FLOPs each, over grad_output's 56x56
    g, w = 512 * 64 * 56 * 56, 64 * 64 * 3 * 3
    _check(con, "resnet", "aten::convolution_backward",
           [[512, 64, 56, 56], [512, 64, 56, 56], [64, 64, 3, 3]] + [[]] * 8, "mi300x",
           2 * 2 * 512 * 56 * 56 * w, 2 * (g + g + w + g + w), "conv")


def test_an_unknown_gpu_has_no_peak_and_says_so(con: duckdb.DuckDBPyConnection) -> None:
    # the toy's deviceProperties name "AMD Radeon Graphics": FLOPs and achieved rates, no %
    r = _row(con, "toy", "aten::mm", "[[128,5],[5,128]]")
    assert r["flops"] == 2 * 128 * 5 * 128 and r["dtype"] == "fp32"
    calls, ns = raw_kernel_ns("toy", "aten::mm", [[128, 5], [5, 128]])
    assert r["achieved_tflops"] == pytest.approx(r["flops"] * calls / ns / 1e3, rel=1e-4)
    assert [r[c] for c in ("gpu", "peak_tflops", "pct_peak", "pct_peak_flops", "bound",
                           "roofline_ns", "pct_roofline")] == [None] * 7
    assert r["note"] == "GPU not in the catalog (AMD Radeon Graphics): no peak or roofline"
    notes = con.execute("SELECT DISTINCT note FROM op_efficiency WHERE job = 'toy' "
                        "ORDER BY 1").fetchall()
    assert notes == [("GPU not in the catalog (AMD Radeon Graphics): no peak or roofline",),
                     ("no tensor of a known size and dtype in the shapes",)]


def test_replay_projects_an_op_with_the_views_roofline(con: duckdb.DuckDBPyConnection
                                                      ) -> None:
    """Every bert GEMM and attention kernel, projected onto a B200 by the replay: the
    B200's floor plus its time above the H100's floor scaled by the roofline ratio, where
    the H100's roofline is the view's roofline_ns and the B200's the view's function."""
    h100, b200 = GPUS["h100"], GPUS["b200"]
    r = Replayer.from_store(con, "bert")
    res = r.run(Scenario(gpu=resolve_gpu("b200")))
    ops = r.graph.ops
    rows = con.execute("""
        SELECT k.rank, k.eid, k.dur_ns, v.roofline_ns, v.dtype, v.flops, v.bytes, v.bound
        FROM kernels k JOIN events o ON o.job = k.job AND o.rank = k.rank AND o.eid = k.op_eid
        JOIN op_efficiency v ON v.job = k.job AND v.op = o.name
         AND v.input_dims = o.args->>'Input Dims' AND v.input_types = o.args->>'Input type'
        WHERE k.job = 'bert' AND k.category IN ('gemm', 'attention')""").fetchall()
    assert len(rows) == 30
    for rank, eid, dur, roof_h100, dtype, flops, nbytes, bound in rows:
        roof_b200 = roofline_row(["NVIDIA B200"], dtype, flops, nbytes)["roofline_ns"]
        want = b200.kernel_floor_ns + max(dur - h100.kernel_floor_ns, 0) * roof_b200 / roof_h100
        slot = ops["slot"][(ops["rank"] == rank) & (ops["eid"] == eid)][0]
        got = res.times_ns[2 * slot + 1] - res.times_ns[2 * slot]
        assert abs(got - want) <= 1, (eid, got, want, bound)


def test_sql_cli_reads_the_view(store: Path, con: duckdb.DuckDBPyConnection) -> None:
    code, out, err = run("sql", store, "SELECT * FROM op_efficiency", "--format", "csv")
    assert code == 0, err
    lines = out.splitlines()
    cols = [c[0] for c in con.execute("DESCRIBE op_efficiency").fetchall()]
    assert lines[0].split(",") == cols
    assert len(lines) - 1 == con.execute("SELECT count(*) FROM op_efficiency").fetchone()[0]


def test_formulas_by_hand() -> None:
    bf = ["c10::BFloat16"] * 3
    # a 3x3 convolution, stride 1, padding 1 keeps 14x14; cudnn's argument order
    conv = op_work("aten::cudnn_convolution", [[8, 16, 14, 14], [32, 16, 3, 3]], bf,
                   ["", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"])
    assert conv.flops == 2 * 8 * 14 * 14 * 32 * 16 * 9
    # stride 2 halves it (padding before stride in cudnn_convolution's arguments)
    conv2 = op_work("aten::cudnn_convolution", [[8, 16, 14, 14], [32, 16, 3, 3]], bf,
                    ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1"])
    assert conv2.flops == 2 * 8 * 7 * 7 * 32 * 16 * 9
    # transposed, or stride not recorded: no count
    assert op_work("aten::convolution", [[8, 16, 14, 14], [16, 32, 3, 3], [32]], bf,
                   ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "True", "[0, 0]", "1"]) is None
    assert op_work("aten::cudnn_convolution", [[8, 16, 14, 14], [32, 16, 3, 3]], bf) is None
    # attention backward: 10 b h s_q s_k d (2.5 x the forward), q and k after grad_out
    q = [2, 4, 128, 64]  # SDPA layout [batch, heads, seq, dim]
    bwd = op_work("aten::_scaled_dot_product_flash_attention_backward", [q] * 5, bf + bf[:2])
    assert bwd.flops == 10 * 2 * 4 * 128 * 128 * 64
    # a lookup moves the rows it picks: 141 ids into a 30522 x 512 table, dim 0
    assert memory_bytes("aten::index_select", [[30522, 512], [], [141]],
                        ["c10::BFloat16", "Scalar", "long int"], ["", "0", ""]) \
        == 141 * 8 + 2 * 141 * 512 * 2
    # args no profiler writes: no work, never an error (the view's function would fail)
    f2 = '["float","float"]'
    assert work_of("aten::mm", "[" * 100_000, f2) is None
    assert work_of("aten::mm", "[[1e400,2],[2,3]]", f2) is None
    big = 10 ** 200  # FLOPs past a float's range
    assert work_of("aten::mm", f"[[{big},2],[2,{big}]]", f2) is None
    assert work_of("aten::add", "[[-5,2],[2,3]]", f2, any_op=True).flops == 6  # [2, 3] only
    assert [op_class(o) for o in ("aten::addmm", "aten::_flash_attention_forward",
                                  "aten::miopen_convolution", "aten::add")] == \
        ["gemm", "attention", "conv", None]


def test_the_reports_section_and_chart(con: duckdb.DuckDBPyConnection, tmp_path: Path
                                       ) -> None:
    """The section shows the view's top rows; the chart is drawn (make_report draws it when
    there are points: test_report_browser checks roofline.png in DLRM's report)."""
    from tracetool.analysis.charts import draw_roofline
    from tracetool.analysis.efficiency import summary
    from tracetool.analysis.report import op_efficiency_section

    eff = summary(con, "bert", 15)
    sec = op_efficiency_section(eff, "roofline.png")
    top = con.execute("SELECT op, count, achieved_tflops, pct_peak, bound FROM op_efficiency "
                      "WHERE job = 'bert' ORDER BY total_ns DESC LIMIT 1").fetchone()
    (headers, body), = sec.tables
    first = dict(zip(headers, body[0], strict=True))
    assert (first["op"], first["count"], first["TFLOP/s"], first["% peak"], first["bound"]) \
        == (top[0], str(top[1]), f"{top[2]:.2f}", f"{top[3]:.1f}", top[4])
    assert len(body) == 15
    assert sec.lines[0].startswith("FLOPs and bytes from the ops' recorded shapes cover 100.0% "
                                   "of the kernel time")
    # the chart's points: every BF16 op and shape with FLOPs (aten::all and aten::eq are on
    # bool / int64 inputs, the three lookups only move data)
    n = con.execute("SELECT count(*) FROM op_efficiency WHERE job = 'bert' AND dtype = 'bf16' "
                    "AND flops > 0").fetchone()[0]
    assert len(eff["points"]) == n == 10 and eff["other_dtypes"] == 2
    draw_roofline("bert", eff, tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").read_bytes()[:4] == b"\x89PNG"
    # the unknown GPU: the rates, no roofline (no chart), and why
    toy = summary(con, "toy", 15)
    assert toy["roofline"] is None and toy["points"] == []
    assert op_efficiency_section(toy, None).lines[1] == (
        "GPU not in the catalog (AMD Radeon Graphics): achieved rates only, no % of peak, "
        "bound or roofline.")
