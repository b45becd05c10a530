"""Rough edges a new user hits (issue 15, "Rough edges seen"), each fixed and kept fixed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import tracetool
from tracetool.analysis.critical_path import critical_path, critical_path_summary
from tracetool.ingest.pipeline import Options, ingest

from ._util import BERT_DDP, DLRM, SAMPLES, run


@pytest.fixture(scope="module")
def gloo(shared_store: Callable[[str], Path]) -> Path:
    return shared_store("gloo")


def test_sql_keeps_duckdbs_did_you_mean(gloo: Path) -> None:
    code, out, err = run("sql", gloo, "SELECT * FROM step_breakdwn")
    assert code == 1 and out == ""
    assert err == ("tracetool: error: Catalog Error: Table with name step_breakdwn does not "
                   'exist! Did you mean "step_breakdown"?\n')


def test_chrome_trace_into_a_directory_not_made_yet(gloo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "deeper" / "path.json"
    code, stdout, err = run("critical-path", gloo, "--chrome-trace", out)
    assert code == 0, err
    events = json.loads(out.read_text())["traceEvents"]
    assert len(events) > 10 and f"wrote {out}" in stdout


def test_a_typo_in_the_job_names_the_jobs(gloo: Path) -> None:
    con = tracetool.connect(gloo)
    with pytest.raises(ValueError, match=r"^no job 'glo' in the store \(it holds 'gloo'\)$"):
        critical_path_summary(con, "glo")
    assert critical_path_summary(con, "gloo").fetchall()  # the connection is still usable


@pytest.mark.skipif(not DLRM.is_dir(), reason=f"corpus not found: {DLRM}")
def test_ns_columns_are_bigint_in_polars(dlrm_store: Path) -> None:
    store = dlrm_store
    con = tracetool.connect(store)
    frame = con.sql("SELECT * FROM kernel_summary WHERE job = 'dlrm'").pl()
    assert str(frame.schema["total_ns"]) == "Int64"
    assert str(con.sql("SELECT self_ns, total_ns FROM op_summary").pl().schema["self_ns"]) \
        == "Int64"
    # the totals are the kernels' own durations, summed independently
    want = {}
    for f in sorted(DLRM.glob("*.json")):
        rank = json.loads(f.read_text())["distributedInfo"]["rank"]
        for e in json.loads(f.read_text())["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "kernel":
                k = (rank, e["name"])
                want[k] = want.get(k, 0) + round(float(e["dur"]) * 1000)
    got = {(r, n): t for r, n, t in zip(frame["rank"], frame["name"], frame["total_ns"],
                                         strict=True)}
    assert got == want


@pytest.mark.skipif(not BERT_DDP.is_dir(), reason=f"corpus not found: {BERT_DDP}")
def test_unknown_collective_sizes_show_as_unknown(tmp_path: Path,
                                                  shared_store: Callable[[str], Path]) -> None:
    """The 2021 BERT DDP pair records no message sizes: the report says unknown, not 0.0."""
    store = shared_store("bert_ddp")
    code, stdout, err = run("report", store, "--out", tmp_path / "report", "--json")
    assert code == 0, err
    by_type = json.loads(stdout)["collectives"]["by_type"]
    assert by_type and all(t["bytes"] is None and t["sized_instances"] == 0 for t in by_type)
    md = (tmp_path / "report" / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "allreduce" in line]
    assert rows and all("| unknown |" in line for line in rows) and "| 0.0 |" not in md


KERNELS = [  # kernel names as the H100 bert-small trace of ../shared/traces has them
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::"
    "BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul>)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::"
    "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}"
    "::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, ...)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<long, long, "
    "bool, at::native::(anonymous namespace)::CompareEqFunctor<long> >, std::array<char*, 2ul> "
    ">(int, ...)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
    "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*)",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
    "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)",
    "Memcpy HtoD (Pageable -> Device)",
    "aten::mm",
]


def test_chart_names_are_short_and_tell_kernels_apart() -> None:
    from tracetool.text import short_names

    got = short_names(KERNELS)
    assert got == [
        "vectorized_elementwise_kernel<CUDAFunctor_add>",
        "vectorized_elementwise_kernel<GeluCUDAKernelImpl>",
        "vectorized_elementwise_kernel<AUnaryFunctor>",
        "vectorized_layer_norm_kernel",
        "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_…",
        "Memcpy HtoD (Pageable -> Device)",
        "aten::mm",
    ]
    assert all(len(n) <= 60 for n in got)
    # names still equal once shortened are numbered, never merged
    assert short_names(["void f<1>(int)", "void f<1>(long)"]) == ["f", "f #2"]


def test_one_palette_a_kind_keeps_its_colour() -> None:
    """A critical-path kind's colour does not depend on which other kinds a path has (it did:
    colours were assigned by position among the kinds present)."""
    from tracetool.analysis.charts import BREAKDOWN_PARTS
    from tracetool.analysis.critical_path import SEGMENT_KINDS
    from tracetool.palette import colour
    from tracetool.replay.plots import PARTS

    assert len({colour(k) for k in SEGMENT_KINDS}) == len(SEGMENT_KINDS)  # all told apart
    assert colour("compute") == BREAKDOWN_PARTS[0][2] == PARTS[0][2]
    assert [p[2] for p in BREAKDOWN_PARTS] == [p[2] for p in PARTS]  # report = replay plots
    with pytest.raises(KeyError):
        colour("computee")


def test_a_big_sweep_is_curves_and_facets_not_36_bars(tmp_path: Path) -> None:
    """6 bandwidths x 3 latencies x 2 datacenter layouts: x = bandwidth, a line per latency,
    a facet per layout; a 4-setting sweep of one axis stays a bar chart."""
    from tracetool.replay import Replayer, Scenario, parse_network
    from tracetool.replay.plots import plot_sweep
    from tracetool.replay.sweep import sweep

    netlab = SAMPLES.parent / "netlab" / "bw_1gbit"
    ingest([netlab], Options(tmp_path / "s", job="n"))
    r = Replayer.from_store(tracetool.connect(tmp_path / "s"), "n")
    base = Scenario(source_network=parse_network(  # a dc_latency: ranks_per_dc changes links
        "gpus_per_node=1,inter_node_bw=1Gbit/s,inter_node_latency=43us,dc_latency=1ms"))
    rows = sweep(r, base, ["inter_node_bw=100Mbit/s,200Mbit/s,500Mbit/s,1,2,5Gbit/s",
                           "inter_node_latency=43us,1ms,5ms", "ranks_per_dc=1,2"])
    assert len(rows) == 36 and rows[0]["axes"] == {
        "inter_node_bw": "100Mbit/s", "inter_node_latency": "43us", "ranks_per_dc": "1"}
    fig = plot_sweep(rows, "bw x latency x dc", tmp_path / "sweep.png")
    facets = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in facets] == ["ranks_per_dc=1", "ranks_per_dc=2"]
    for ax in facets:
        curves = [ln for ln in ax.get_lines() if ln.get_label().startswith("inter_node_lat")]
        assert [len(ln.get_xdata()) for ln in curves] == [6, 6, 6]
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    small = sweep(r, base, ["inter_node_bw=200Mbit/s,500Mbit/s,1Gbit/s,2Gbit/s"])
    bars = plot_sweep(small, "inter_node_bw", tmp_path / "small.png")
    assert len(bars.axes[0].patches) >= 4 and not any(ax.get_title() for ax in bars.axes)


@pytest.mark.skipif(not DLRM.is_dir(), reason=f"corpus not found: {DLRM}")
def test_the_report_shows_a_step_timeline_of_the_median_step(tmp_path: Path,
                                                             dlrm_store: Path) -> None:
    """The step is the complete job step of median duration; the ranks are the lowest and
    the one holding most of that step's critical path; the Perfetto file beside the picture
    holds those ranks' events of the step (and the ranks the path visits) and the path."""
    store = dlrm_store
    code, stdout, err = run("report", store, "--out", tmp_path / "r", "--json")
    assert code == 0, err
    st = json.loads(stdout)["step_timeline"]
    con = tracetool.connect(store)
    durs = sorted(con.execute("SELECT dur_ns, step FROM job_steps WHERE job = 'dlrm' AND "
                              "complete").fetchall())
    assert st["step"] == durs[(len(durs) - 1) // 2][1]
    critical_path(con, "dlrm")  # the same path, computed here
    held = con.execute(
        """SELECT rank FROM critical_path WHERE job = 'dlrm' AND step = ? AND rank IS NOT NULL
           GROUP BY rank ORDER BY sum(dur_ns) DESC, rank LIMIT 1""", [st["step"]]).fetchall()
    assert st["ranks"] == [0, held[0][0]] and held[0][0] != 0
    trace = json.loads((tmp_path / "r" / "step_timeline.json").read_text())["traceEvents"]
    pids = {e["pid"] for e in trace if e["ph"] == "X" and e.get("cat") != "critical_path"}
    path_ranks = {e["pid"] for e in trace if e.get("cat") == "critical_path"}
    assert pids == set(st["ranks"]) | path_ranks and len(pids) < 8
    assert (tmp_path / "r" / "step_timeline.png").stat().st_size > 10_000
    md = (tmp_path / "r" / "report.md").read_text()
    assert f"## Step timeline (job step {st['step']})" in md
    assert r"step\_timeline.json" in md  # Markdown-escaped
