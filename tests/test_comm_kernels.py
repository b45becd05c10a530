"""Communication that is not NCCL-named: the registry (tracetool/comm_kernels.toml) makes
DeepEP, symmetric-memory and user-named kernels communication everywhere, replay prices or
notes them, and a network what-if that prices nothing is refused.

The synthetic job: two ranks, each a step of compute kernels on stream 7 and DeepEP's
dispatch / combine on stream 20 (DeepEP's own kernel names, csrc/kernels/internode.cu:
``deep_ep::internode::dispatch`` / ``combine``), launched by CPU ops with no
record_param_comms (DeepEP records none). Every expected figure is written from the
trace's construction below, not read from the code.
"""

from __future__ import annotations

import gzip
import json
import math
from decimal import Decimal
from pathlib import Path

import pytest

import tracetool
from tracetool.replay.model import Scenario, op_factors, resolve_gpu
from tracetool.replay.run import Replayer

from ._util import SHARED_TRACES, kineto_text, run, write, x
from .conftest import run_ingest

DISPATCH = "void deep_ep::internode::dispatch<false, 8, 4>(int4*, float*, int const*)"
COMBINE = "void deep_ep::internode::combine<__nv_bfloat16, 8>(int4*, float*, int const*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
CUSTOM = "my_fabric_a2a_kernel<8>(void*)"
# (name, stream, start us, duration us, launching CPU op, its start us): per rank
KERNELS = [(GEMM, 7, 20, 300, "aten::mm", 10), (DISPATCH, 20, 30, 200, "deep_ep::dispatch", 15),
           (GEMM, 7, 400, 100, "aten::mm", 390), (COMBINE, 20, 520, 150, "deep_ep::combine", 510),
           (CUSTOM, 20, 700, 40, "fabric::a2a", 690), (GEMM, 7, 760, 50, "aten::mm", 750)]
COMM = {DISPATCH, COMBINE}
STEP = (0, 1000)  # ProfilerStep#1, us
B200 = SHARED_TRACES / "AMD-AGI__TraceLens/tests/traces/b200/eager_trace.json.gz"


def _rank(rank: int, skew_us: int) -> str:
    ev = [x("ProfilerStep#1", STEP[0] + skew_us, STEP[1], cat="user_annotation")]
    for corr, (name, stream, ts, dur, op, op_ts) in enumerate(KERNELS, start=1):
        ts, op_ts = ts + skew_us, op_ts + skew_us
        ev.append(x(op, op_ts, 8, **{"External id": corr}))
        ev.append(x("cudaLaunchKernel", op_ts + 1, 5, cat="cuda_runtime", correlation=corr,
                    **{"External id": corr}))
        ev.append(x(name, ts, dur, cat="kernel", pid=0, tid=stream, device=0, stream=stream,
                    correlation=corr, **{"External id": corr}))
    return kineto_text(ev, rank=rank)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("deepep")
    files = [write(d / f"rank{r}.json", _rank(r, 3 * r)) for r in (0, 1)]
    got = run_ingest(files, d / "store", "--job", "ep", "--comm-kernel", "fabric_a2a=all_to_all")
    assert got.exit_code == 0, got.stderr
    return d / "store"


@pytest.fixture(scope="module")
def con(store: Path):
    return tracetool.connect(store)


def _union_us(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def test_deepep_and_user_kernels_are_communication_everywhere(con) -> None:
    comm = COMM | {CUSTOM}
    # kernels view, gpu_ops.is_comm
    rows = con.execute("SELECT name, category FROM kernels WHERE rank = 0").fetchall()
    assert sorted(n for n, c in rows if c == "comm") == sorted(comm)
    # the breakdown: comm, overlap and exposed comm from the construction
    spans = [(ts, ts + d) for n, _, ts, d, _, _ in KERNELS if n in comm]
    compute = [(ts, ts + d) for n, _, ts, d, _, _ in KERNELS if n not in comm]
    both = _union_us(spans) + _union_us(compute) - _union_us(spans + compute)
    assert (_union_us(spans), both) == (390, 200)  # dispatch under the first GEMM
    got = con.execute("SELECT comm_ns, overlap_ns, exposed_comm_ns FROM step_breakdown "
                      "ORDER BY rank").fetchall()
    assert got == [(390_000, 200_000, 190_000)] * 2
    # per-rank collectives: one per kernel, the registry's kind and backend, matched across
    # the two ranks (same signature, same order), no size
    c = con.execute("""SELECT rank, kernel_name, collective, backend, instance, bytes
                       FROM collective_ranks ORDER BY rank, ts_ns""").fetchall()
    want = [(n, "all_to_all", "user" if n == CUSTOM else "deepep")
            for n, *_ in sorted(KERNELS, key=lambda k: k[2]) if n in comm]
    for r in (0, 1):
        assert [row[1:4] for row in c if row[0] == r] == want
    assert [row[4] for row in c if row[0] == 0] == [row[4] for row in c if row[0] == 1]
    assert all(row[4] is not None and row[5] is None for row in c)
    # critical-path categories: the graph's comm nodes are exactly the comm kernels
    got = con.execute("""SELECT rank, cls, count(*) FROM cp_nodes WHERE cls <> 'cpu'
                         GROUP BY ALL ORDER BY ALL""").fetchall()
    assert got == [(r, cls, n) for r in (0, 1)
                   for cls, n in (("comm", len(comm)), ("compute", len(KERNELS) - len(comm)))]


def test_report_lists_them(store: Path) -> None:
    code, out, err = run("report", store, "--json", "--out", store.parent / "rep")
    assert code == 0, err
    assert "No collective calls recorded" not in out
    coll = json.loads(out)["collectives"]
    comm = [(ts, d) for n, _, ts, d, _, _ in KERNELS if n in COMM | {CUSTOM}]
    assert [(t["collective"], t["instances"], t["sized_instances"]) for t in coll["by_type"]
            ] == [("all_to_all", len(comm), 0)]
    assert [(r["rank"], r["calls"], r["dur_ns"]) for r in coll["by_rank"]] == [
        (r, len(comm), 1000 * sum(d for _, d in comm)) for r in (0, 1)]


def test_replay_prices_them_and_gpu_leaves_them(con, store: Path) -> None:
    replayer = Replayer.from_store(con, "ep")
    g = replayer.graph
    # --gpu scales compute by the model, never communication (the network's)
    f, _ = op_factors(g, Scenario(gpu=resolve_gpu("b200"), source_gpu=resolve_gpu("h100")))
    cat = g.ops["category"].astype(str)
    assert (f[cat == "comm"] == 1).all() and (f[cat == "gemm"] != 1).all()
    # across nodes at 1 Gbit/s, the unsized all-to-alls (sized from their transfer time on
    # the source network) take longer: the step grows by more than nothing
    code, out, err = run("replay", store, "--source-gpu", "h100", "--json", "--network",
                         "gpus_per_node=1,inter_node_bw=1Gbit/s")
    assert code == 0, err
    doc = json.loads(out)
    step = doc["steps"][0]
    assert step["projected_step_ns"] > step["measured_step_ns"]
    assert step["measured_breakdown_ns"]["comm_ns"] == 390_000
    assert any("3 collectives without a recorded size" in n for n in doc["notes"])


def test_network_that_crosses_no_link_is_refused(store: Path) -> None:
    # both ranks on one node of the default 8: no inter-node link is crossed
    code, out, err = run("replay", store, "--source-gpu", "h100", "--network",
                         "inter_node_bw=1Gbit/s")
    assert (code, out) == (2, "")
    assert err == ("tracetool: error: network setting(s) inter_node_bw change nothing for "
                   "job ep: every collective of this job is intra-node: gpus_per_node=8 >= "
                   "2 ranks\n")
    out_dir = store.parent / "sweep"
    code, _, err2 = run("sweep", store, "--source-gpu", "h100", "--out", out_dir, "--network",
                        "inter_node_bw=1,10,100Gbit/s")
    assert (code, err2) == (2, err.replace("error: ", "error: sweep axis inter_node_bw: ", 1))
    assert not out_dir.exists()  # refused before anything is written
    # a setting that does cross a link runs
    code, _, err = run("sweep", store, "--source-gpu", "h100", "--out", out_dir, "--network",
                       "intra_node_bw=10,100GB/s")
    assert code == 0, err
    assert len((out_dir / "sweep.csv").read_text().splitlines()) == 3  # a header, 2 rows


def test_comm_kernel_option_refuses_what_classifies_nothing(tmp_path: Path) -> None:
    f = write(tmp_path / "rank0.json", _rank(0, 0))
    got = run_ingest([f], tmp_path / "s", "--comm-kernel", "no_such_kernel=allreduce")
    assert got.exit_code == 2
    assert got.stderr.splitlines()[-1] == (
        "tracetool: error: --comm-kernel 'no_such_kernel=allreduce': matches no kernel of "
        "the 1 trace file(s) ingested (they are in the store; it classified nothing)")
    got = run_ingest([f], tmp_path / "s2", "--comm-kernel", "fabric=frobnicate")
    assert got.exit_code == 2 and not (tmp_path / "s2").exists()
    assert got.stderr == ("tracetool: error: --comm-kernel 'fabric=frobnicate': unknown kind "
                          "'frobnicate'; known: allreduce, allgather, reduce_scatter, "
                          "all_to_all, broadcast, reduce, send, recv, barrier, other\n")


def test_a_kernel_that_records_its_call_is_sized_from_its_args(tmp_path: Path) -> None:
    """No record_param_comms, but the NCCL kernel's own args name the call: its group,
    sequence number, dtype and element counts are the collective's."""
    args = {"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000,
            "dtype": "BFloat16", "Process Group Name": "3", "Seq": 7, "Group size": 4}
    ev = [x("ProfilerStep#1", 0, 100, cat="user_annotation"),
          x("my_allreduce_wrapper", 5, 10, **{"External id": 1}),
          x("cudaLaunchKernel", 6, 3, cat="cuda_runtime", correlation=1),
          x("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20,
            30, cat="kernel", pid=0, tid=7, device=0, stream=7, correlation=1, **args)]
    got = run_ingest([write(tmp_path / "rank0.json", kineto_text(ev))], tmp_path / "s")
    assert got.exit_code == 0, got.stderr
    row = tracetool.connect(tmp_path / "s").execute(
        "SELECT collective, backend, pg_name, seq, group_size, in_bytes, bytes, instance "
        "FROM collective_ranks").fetchall()
    assert row == [("allreduce", "nccl", "3", 7, 4, 2000, 2000, "pg:3:seq:7")]


@pytest.mark.skipif(not B200.is_file(), reason="real trace corpus not found")
def test_b200_symmetric_memory_is_communication(tmp_path: Path) -> None:
    """The B200 trace's 73 torch symmetric-memory all-reduces (and its one NCCL
    all-gather): communication in the kernel summary and the replay's breakdown, sized from
    the launching symm_mem op's Input Dims, and noted by replay (rank 0 of 8 is the only
    traced rank: no peer, so nothing to price)."""
    doc = json.loads(gzip.open(B200).read())
    ns = [(int(Decimal(str(e["ts"])) * 1000), int(Decimal(str(e["ts"])) * 1000
                                                   + Decimal(str(e["dur"])) * 1000), e["name"])
          for e in doc["traceEvents"] if e.get("cat") == "kernel"
          and ("multimem_all_reduce_kernel" in e["name"] or e["name"].startswith("nccl"))]
    assert len(ns) == 74
    got = run_ingest([B200], tmp_path / "s", "--job", "b200")
    assert got.exit_code == 0, got.stderr
    con = tracetool.connect(tmp_path / "s")
    total = con.execute("SELECT count(*), sum(dur_ns) FROM kernels WHERE category = 'comm'"
                        ).fetchone()
    assert total == (74, sum(b - a for a, b, _ in ns))
    # each kernel's launching op (same External id): symm_mem::multimem_all_reduce_, whose
    # first input is the bf16 buffer reduced
    ext = [e["args"]["External id"] for e in sorted(
        (e for e in doc["traceEvents"] if e.get("cat") == "kernel"
         and "multimem_all_reduce_kernel" in e["name"]), key=lambda e: e["ts"])]
    op = {e["args"]["External id"]: e["args"] for e in doc["traceEvents"]
          if e.get("cat") == "cpu_op" and e["name"] == "symm_mem::multimem_all_reduce_"}
    assert {op[i]["Input type"][0] for i in ext} == {"c10::BFloat16"}
    sizes = con.execute("SELECT bytes FROM collective_ranks WHERE backend = 'symm_mem' "
                        "ORDER BY ts_ns").fetchall()
    assert sizes == [(math.prod(op[i]["Input Dims"][0]) * 2,) for i in ext]
    code, out, err = run("replay", tmp_path / "s", "--json", "--gpu", "h100")
    assert code == 0, err
    r = json.loads(out)
    assert r["steps"][0]["measured_breakdown_ns"]["comm_ns"] == _union_us(
        [(a, b) for a, b, _ in ns])
    # the NCCL all-gather records its group (8 ranks) and is priced; the all-reduces name
    # none, and rank 0 is the only one traced
    ms = sum(b - a for a, b, n in ns if not n.startswith("nccl")) / 1e6
    assert (f"73 communication kernels ({ms:.3f} ms over the replayed ranks) are not priced "
            "by the network model and stay as measured: 73 with no peer rank in the trace "
            "(its group is unknown or one rank)") in r["notes"]
    code, _, err = run("replay", tmp_path / "s", "--network", "dc_bw=1Gbit/s")
    assert code == 2
    assert err == ("tracetool: error: network setting(s) dc_bw change nothing for job b200: "
                   "no collective of this job crosses datacenters (one datacenter: set "
                   "ranks_per_dc)\n")
    code, _, err = run("replay", tmp_path / "s", "--network", "inter_node_bw=1Gbit/s")
    assert code == 2
    assert err == ("tracetool: error: network setting(s) inter_node_bw change nothing for "
                   "job b200: every collective of this job is intra-node: gpus_per_node=8 >= "
                   "8 ranks\n")
