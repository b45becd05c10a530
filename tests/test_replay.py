"""Replay (tracetool.replay) on real traces: identity, what-ifs, CLI, Chrome trace, sweep.

Every multi-rank set of ../shared/traces and the gloo sample are ingested once into one
store. Identity replay must give every step's measured time (checked against the steps
table, computed independently in SQL); projections must move the way physics says
(halving bandwidth never speeds a step up, an infinitely fast network leaves latency only,
a datacenter split slows only the groups that span it), and a kernel's projected time must
equal the roofline ratio computed here from the catalog's TOML by hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay.compute import WhatIfError
from tracetool.replay.model import Scenario, collective_factors, resolve_gpu
from tracetool.replay.network import parse_network
from tracetool.replay.run import BREAKDOWN, Replayer
from tracetool.replay.sweep import parse_axis

from ._util import REPO, SHARED_TRACES, run
from .test_critical_path import MULTI_RANK

BERT = SHARED_TRACES / "AMD-AGI__TraceLens/tests/traces"
NETLAB = REPO / "sample_traces" / "netlab"
NETLAB_MEASURED = json.loads((NETLAB / "measured.json").read_text())["settings"]
# the first capture's settings, and the first setting of each job the second capture added
# (its other settings are the same traces under other networks: tests/test_netlab_data.py
# ingests them all, benchmarks/replay_accuracy.py projects them)
NETLAB_IDENTITY = {k: m for k, m in NETLAB_MEASURED.items() if m.get("capture", 0) == 0}
for _k, _m in NETLAB_MEASURED.items():
    if not any(o["pattern"] == _m["pattern"] and o["world_size"] == _m["world_size"]
               for o in NETLAB_IDENTITY.values()):
        NETLAB_IDENTITY[_k] = _m
GLOO_NET = "gpus_per_node=1,inter_node_bw=1Gbit/s"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample gloo job and the netlab traces always; the shared corpus when present."""
    path = tmp_path_factory.mktemp("replay") / "store"
    for job, d in MULTI_RANK.items():
        if d.is_dir():
            ingest([d], Options(store=path, job=job))
    for job, f in (("bert_h100", BERT / "h100/gaunernst_bert-small-uncased__1016001.json.gz"),
                   ("bert_mi300x",
                    BERT / "mi300/gaunernst_bert-small-uncased__1016001.json.gz")):
        if f.is_file():
            ingest([f], Options(store=path, job=job, rank=0))
    for setting, m in NETLAB_IDENTITY.items():
        ingest([NETLAB / m["dir"]], Options(store=path, job=f"netlab_{setting}"))
    return path


@pytest.fixture(scope="module")
def con(store: Path) -> duckdb.DuckDBPyConnection:
    return tracetool.connect(store)


class _Replayers(dict):
    """Replayers by job, built on first use; a job of the shared corpus skips the test when
    the corpus is not beside the repository."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        super().__init__()
        self.con = con
        self.jobs = {j for (j,) in con.execute("SELECT DISTINCT job FROM trace_files")
                     .fetchall()}

    def __missing__(self, job: str) -> Replayer:
        if job not in self.jobs:
            pytest.skip(f"{job}: real trace corpus not found at {SHARED_TRACES}")
        self[job] = Replayer.from_store(self.con, job)
        return self[job]


@pytest.fixture(scope="module")
def replayers(con: duckdb.DuckDBPyConnection) -> dict[str, Replayer]:
    return _Replayers(con)


@pytest.mark.parametrize("job", [*MULTI_RANK, *(f"netlab_{s}" for s in NETLAB_IDENTITY)])
def test_identity_replay_reproduces_every_step(job: str, con: duckdb.DuckDBPyConnection,
                                               replayers: dict[str, Replayer]) -> None:
    expected = dict(con.execute(
        "SELECT step, dur_ns FROM job_steps WHERE job = ? AND complete", [job]).fetchall())
    # the measured breakdown is step_breakdown's, averaged over the ranks (rounded as SQL does)
    breakdown = {r[0]: dict(zip((*BREAKDOWN, "comm_ns", "dur_ns", "unexplained_gap_ns"), r[1:],
                                strict=True))
                 for r in con.execute(
        """SELECT step, round(avg(compute_ns)), round(avg(exposed_comm_ns)),
                  round(avg(exposed_memcpy_ns)), round(avg(idle_ns)), round(avg(comm_ns)),
                  round(avg(dur_ns)), round(avg(unexplained_gap_ns))
           FROM step_breakdown WHERE job = ? GROUP BY step""", [job]).fetchall()}
    result = replayers[job].run()
    assert [s.step for s in result.steps] == sorted(expected)
    for s in result.steps:
        assert s.measured_ns == expected[s.step]
        assert s.measured == breakdown[s.step]
        assert abs(s.projected_ns - s.measured_ns) <= 0.02 * s.measured_ns
        assert s.projected_ns == s.measured_ns  # exact, in fact
        assert (s.low_ns <= s.projected_ns <= s.high_ns)
        assert s.projected == s.measured
        assert sum(s.measured[k] for k in BREAKDOWN) == pytest.approx(s.measured["dur_ns"],
                                                                       abs=4)
        assert sum(s.critical_path.values()) == s.projected_ns
    g = replayers[job].graph
    assert g.cycle_breaks == 0
    # every event keeps its measured times
    ev = np.flatnonzero(g.rank[:g.n_event_slots] >= 0)
    assert np.array_equal(result.times_ns[2 * ev], g.t0[2 * ev].astype(np.int64) + g.origin_ns)


def test_collectives_are_cross_rank_barriers(replayers: dict[str, Replayer]) -> None:
    g = replayers["gloo"].graph
    assert len(g.insts["instance"]) == 9  # the sample's 9 gloo allreduces, on both ranks
    assert (g.insts["n_ranks"] == 2).all()
    g = replayers["dlrm"].graph
    assert len(g.insts["instance"]) > 0
    assert (g.insts["n_ranks"] == 8).all()  # every DLRM collective matched on all 8 ranks


def _steps(r: Replayer, sc: Scenario) -> np.ndarray:
    return np.array([s.projected_ns for s in r.run(sc, critical_path=False).steps])


@pytest.mark.parametrize("job,src", [("dlrm", None), ("gloo", GLOO_NET)])
def test_halving_bandwidth_never_speeds_up_a_step(job: str, src: str | None,
                                                  replayers: dict[str, Replayer]) -> None:
    r = replayers[job]
    base = Scenario(source_network=parse_network(src) if src else None)
    prev = None
    for bw in ("400Gbit/s", "100Gbit/s", "25Gbit/s", "5Gbit/s", "1Gbit/s", "200Mbit/s"):
        net = parse_network(f"gpus_per_node=1,inter_node_bw={bw}")
        cur = _steps(r, replace(base, network=net))
        if prev is not None:
            assert (cur >= prev).all(), bw
        prev = cur
    measured = np.array([s.measured_ns for s in r.run(critical_path=False).steps])
    assert (prev > measured).all()  # 200 Mbit/s is far slower than what they ran on


@pytest.mark.usefixtures("no_host_bound")
def test_infinite_network_leaves_compute_and_latency(replayers: dict[str, Replayer]) -> None:
    r = replayers["gloo"]
    src = parse_network(GLOO_NET)
    inf = _steps(r, Scenario(source_network=src,
                             network=parse_network("inter_node_bw=inf", base=src)))
    fast = _steps(r, Scenario(source_network=src,
                              network=parse_network("inter_node_bw=1000Gbit/s", base=src)))
    # transfers priced at latency only: what is left is compute, CPU work and waits
    w = Scenario(source_network=src, network=parse_network("inter_node_bw=inf", base=src))
    k, model_ns, _, _ = collective_factors(r.graph, w)
    big = r.graph.insts["bytes"] > 1e6  # gradient buckets: bandwidth-bound, so ~vanish
    assert big.sum() >= 4 and (k[big] < 0.01).all()
    assert (k < 1).all()  # the small ones keep their latency
    assert (inf <= fast).all()
    measured = np.array([s.measured_ns for s in r.run(critical_path=False).steps])
    res = r.run(w)
    on_path = sum(s.critical_path.get("comm", 0) for s in res.steps)
    identity = r.run()
    assert on_path < 0.2 * sum(s.critical_path["comm"] for s in identity.steps)
    for s in res.steps:
        # CPU work is unchanged (its union moves a little as threads overlap differently)
        assert s.projected["compute"] == pytest.approx(s.measured["compute"], rel=0.01)
    assert (inf < measured).all()


def test_datacenter_split_slows_only_groups_that_span_it(
        replayers: dict[str, Replayer]) -> None:
    r = replayers["gloo"]
    src = parse_network(GLOO_NET)
    wan = "dc_bw=100Mbit/s,dc_latency=5ms"
    same_dc = Scenario(source_network=src,
                       network=parse_network(f"ranks_per_dc=2,{wan}", base=src))
    split = Scenario(source_network=src,
                     network=parse_network(f"ranks_per_dc=1,{wan}", base=src))
    k_same, _, _, _ = collective_factors(r.graph, same_dc)
    k_split, _, _, _ = collective_factors(r.graph, split)
    assert np.allclose(k_same, 1.0)  # both ranks in one datacenter: nothing changes
    assert (k_split > 1.5).all()
    # ... so that what-if is refused, not replayed as a silent identity (issue 26, item 8)
    with pytest.raises(WhatIfError, match=r"^network setting\(s\) ranks_per_dc, dc_bw, "
                       r"dc_latency change nothing for job gloo: no collective of this job "
                       r"crosses datacenters$"):
        _steps(r, same_dc)
    assert (_steps(r, split) > _steps(r, Scenario())).all()
    # on DLRM (8 ranks), 4 per datacenter: every collective spans both, and gets slower
    d = replayers["dlrm"]
    k, _, _, _ = collective_factors(d.graph, Scenario(network=parse_network(
        f"gpus_per_node=4,ranks_per_dc=4,{wan}")))
    assert (k > 1).all()


def test_dp_scale_recosts_data_parallel_collectives(replayers: dict[str, Replayer]) -> None:
    r = replayers["dlrm"]
    k2, _, _, _ = collective_factors(r.graph, Scenario(dp_scale=2))
    assert (k2 > 1).all()  # 8 -> 16 ranks: two nodes, inter-node links
    one = _steps(r, Scenario())
    assert (_steps(r, Scenario(dp_scale=2)) >= one).all()
    assert (_steps(r, Scenario(dp_scale=8)) >= _steps(r, Scenario(dp_scale=2))).all()


def _toml(key: str) -> dict:
    return tomllib.loads((REPO / "tracetool/gpus" / f"{key}.toml").read_text())


def test_gpu_projection_of_a_gemm_matches_a_hand_roofline(
        con: duckdb.DuckDBPyConnection, replayers: dict[str, Replayer]) -> None:
    r = replayers["dlrm"]
    row = con.execute(
        """SELECT k.rank, k.eid, k.dur_ns, o.args->>'Input Dims', o.args->>'Input type'
           FROM kernels k JOIN events o ON o.job = k.job AND o.rank = k.rank
            AND o.eid = k.op_eid
           WHERE k.job = 'dlrm' AND k.category = 'gemm' AND o.name = 'aten::addmm'
           ORDER BY k.dur_ns DESC LIMIT 1""").fetchone()
    rank, eid, dur, dims, types = row
    dims, types = json.loads(dims), json.loads(types)
    (m, kk), (_, n) = [d for d in dims if len(d) == 2][-2:]
    flops = 2 * m * kk * n
    nbytes = 4 * (sum(math.prod(d) for d in dims if d) + m * n)
    assert types[1] == "float"  # fp32 on V100

    def roof(key: str) -> float:
        t = _toml(key)
        return max(flops / (t["peak"]["fp32_tflops"] * 1e12 * t["achievable"]["compute"]),
                   nbytes / (t["peak"]["hbm_gbps"] * 1e9 * t["achievable"]["memory"]))

    res = r.run(Scenario(gpu=resolve_gpu("h100")))
    g = r.graph
    slot = g.ops["slot"][(g.ops["rank"] == rank) & (g.ops["eid"] == eid)][0]
    projected = res.times_ns[2 * slot + 1] - res.times_ns[2 * slot]
    floor = {k: _toml(k)["kernels"]["floor_us"] * 1e3 for k in ("v100", "h100")}
    assert projected == pytest.approx(
        floor["h100"] + (dur - floor["v100"]) * roof("h100") / roof("v100"), abs=1)
    # a faster GPU shrinks the job's GPU compute; this GEMM more on a B200 than on an H100,
    # though DLRM's many 2-3 us kernels sit at the GPUs' floors (the B200's, 2.1 us, is
    # above the H100's 1.6 us), so the job's compute is not less on the B200
    b200 = r.run(Scenario(gpu=resolve_gpu("b200")))
    for s_h, s_b in zip(res.steps, b200.steps, strict=True):
        assert max(s_b.projected["compute"], s_h.projected["compute"]) < s_h.measured["compute"]
    on_b200 = b200.times_ns[2 * slot + 1] - b200.times_ns[2 * slot]
    assert on_b200 < projected


def test_speedup_override_divides_matching_kernels(replayers: dict[str, Replayer]) -> None:
    from tracetool.replay.compute import parse_speedup

    r = replayers["dlrm"]
    res = r.run(Scenario(speedups=(parse_speedup("gemm=2"),)))
    g = r.graph
    gemm = g.ops["category"].astype(str) == "gemm"
    s = g.ops["slot"][gemm]
    dur = res.times_ns[2 * s + 1] - res.times_ns[2 * s]
    assert np.abs(dur - g.ops["dur"][gemm] / 2).max() <= 1
    # a name pattern composes with the category: gemm kernels named *sgemm* 2 x 3 = 6x
    res2 = r.run(Scenario(speedups=(parse_speedup("gemm=2"), parse_speedup("name~SGEMM=3"))))
    sg = gemm & (np.char.find(np.char.lower(g.ops["name"].astype(str)), "sgemm") >= 0)
    assert sg.sum() > 0
    s2 = g.ops["slot"][sg]
    assert np.abs(res2.times_ns[2 * s2 + 1] - res2.times_ns[2 * s2]
                  - g.ops["dur"][sg] / 6).max() <= 1
    other = g.ops["slot"][~gemm & (g.ops["category"].astype(str) != "comm")]
    assert np.array_equal(res.times_ns[2 * other + 1] - res.times_ns[2 * other],
                          (g.t0[2 * other + 1] - g.t0[2 * other]).astype(np.int64))


def test_cross_gpu_pair_h100_to_mi300x(con: duckdb.DuckDBPyConnection,
                                       replayers: dict[str, Replayer]) -> None:
    """The same model on an H100 and an MI300X: projecting the H100 trace onto the MI300X
    lands within 15% of the MI300X's measured step (the step is CPU-bound)."""
    h100 = replayers["bert_h100"]  # skips without the shared corpus, before any query
    mi = con.execute("SELECT dur_ns FROM job_steps "
                     "WHERE job = 'bert_mi300x' AND complete").fetchone()[0]
    res = h100.run(Scenario(gpu=resolve_gpu("mi300x")))
    (s,) = res.steps
    assert abs(s.projected_ns / mi - 1) <= 0.15


def _mean_step(con: duckdb.DuckDBPyConnection, job: str) -> float:
    return con.execute(
        "SELECT avg(dur_ns) FROM job_steps WHERE job = ? AND complete", [job]).fetchone()[0]


# The worst |error| of the mean projected step each netlab job reaches (README.md, "Network
# model"), asserted so that neither a regression nor an improvement goes unseen; every
# collective call of every netlab trace is priced (matched across ranks, its transfer span
# linked). The goal, 10%, is reached by every job (2 ranks 9.98%: lat_1gbit_1ms projected
# onto 200mbit; 4 ranks 8.3%; all-to-all 6.8%), and the band (replay/band.py) contains the
# measured mean step in every case.
NETLAB_WORST = {"ddp_allreduce, 2 ranks": (0.100, 100),
                "ddp_allreduce, 4 ranks": (0.084, 9),
                "moe_all_to_all, 4 ranks": (0.069, 16)}


def _unpriced(con: duckdb.DuckDBPyConnection, job: str) -> int:
    return con.execute("""SELECT count(*) FROM collective_ranks WHERE job = ? AND
                          (instance IS NULL OR coalesce(kernel_eid, gloo_eid) IS NULL)""",
                       [job]).fetchone()[0]


@pytest.mark.parametrize("family", list(NETLAB_WORST))
def test_network_projection_matches_shaped_network_ground_truth(
        family: str, con: duckdb.DuckDBPyConnection, replayers: dict[str, Replayer]) -> None:
    """Each netlab job (sample_traces/netlab: 2-rank DDP under 10 bandwidth x latency
    settings, 4-rank DDP under 3, 4-rank all-to-all under 4), traced under each setting and
    projected onto every other one with the gloo transport model: the mean projected step
    against the mean step measured there is within NETLAB_WORST's bound, the identity is
    exact, the band brackets the projection, and it contains the measured step in as many
    cases as NETLAB_WORST says (all of them for DDP)."""
    names = [k for k, m in NETLAB_MEASURED.items()  # the first capture: in sample
             if f"{m['pattern']}, {m['world_size']} ranks" == family and not m.get("capture")]
    errors, covered = {}, 0
    for src in names:
        r = replayers[f"netlab_{src}"]
        assert _unpriced(con, f"netlab_{src}") == 0
        for dst in names:
            res = r.run(Scenario(source_network=parse_network(NETLAB_MEASURED[src]["network_spec"]),
                                 network=parse_network(NETLAB_MEASURED[dst]["network_spec"])),
                        critical_path=False)
            projected = np.mean([s.projected_ns for s in res.steps])
            truth = _mean_step(con, f"netlab_{dst}")
            errors[src, dst] = projected / truth - 1
            low, high = (np.mean([getattr(s, k) for s in res.steps]) for k in ("low_ns",
                                                                               "high_ns"))
            assert low <= projected <= high
            covered += bool(low <= truth <= high)
    assert all(errors[s, s] == 0 for s in names)
    bound, n_covered = NETLAB_WORST[family]
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= bound, (worst, errors)
    assert covered == n_covered, (covered, len(names) ** 2)


def test_trace_without_profiler_steps_is_one_window(tmp_path: Path) -> None:
    """A launch, its kernel and a device sync: the whole trace is the window, and halving
    the kernel moves the sync's return (kernel end + its measured wake-up) and the end."""
    from ._util import kineto_text, write, x

    events = [
        x("aten::mm", 0, 100, tid=1),
        x("cudaLaunchKernel", 20, 10, cat="cuda_runtime", tid=1, correlation=1),
        x("cudaDeviceSynchronize", 110, 150, cat="cuda_runtime", tid=1),
        x("ampere_sgemm_128x64_nn", 150, 100, cat="kernel", pid=0, tid=7, correlation=1,
          stream=7, device=0),
    ]
    trace = write(tmp_path / "rank0.json", kineto_text(events, rank=0))
    store = tmp_path / "store"
    ingest([trace], Options(store=store, job="nostep"))
    r = Replayer.from_store(tracetool.connect(store), "nostep")
    (s,) = r.run().steps
    assert s.step is None and s.measured_ns == s.projected_ns == 260_000
    from tracetool.replay.compute import parse_speedup

    (s,) = r.run(Scenario(speedups=(parse_speedup("gemm=2"),))).steps
    assert s.projected_ns == 210_000  # kernel 150-200 us, sync returns 10 us later
    code, stdout, _ = run("replay", store, "--speedup", "gemm=2")
    assert code == 0 and " trace " in stdout
    # no shapes recorded: a GEMM scales by the ratio of peaks at their achievable fractions
    # (bf16 when the dtype is unknown) above the H100's floor, on top of the B200's
    h, b = _toml("h100"), _toml("b200")
    ratio = (h["peak"]["bf16_tflops"] * h["achievable"]["compute"]
             / (b["peak"]["bf16_tflops"] * b["achievable"]["compute"]))
    floor_h, floor_b = h["kernels"]["floor_us"] * 1e3, b["kernels"]["floor_us"] * 1e3
    (s,) = r.run(Scenario(gpu=resolve_gpu("b200"), source_gpu=resolve_gpu("h100"))).steps
    assert s.projected_ns == pytest.approx(
        150_000 + floor_b + (100_000 - floor_h) * ratio + 10_000, abs=1)
    code, _, stderr = run("replay", store, "--gpu", "b200")
    assert (code, stderr) == (2, "tracetool: error: GPU 'B200 (HGX, 1 kW)': job nostep names "
                                 "no device (deviceProperties), so its ops cannot be projected "
                                 "onto another GPU (give --source-gpu to name the one it ran "
                                 "on)\n")


def test_sweep_axis_units() -> None:
    assert parse_axis("inter_node_bw=25,50,100Gbit/s") == (
        "inter_node_bw", ["25Gbit/s", "50Gbit/s", "100Gbit/s"])
    assert parse_axis("dc_latency=0.5ms,2,10ms") == ("dc_latency", ["0.5ms", "2ms", "10ms"])
    with pytest.raises(ValueError, match="bad sweep axis"):
        parse_axis("inter_node_bw")


def test_cli_replay_json_and_chrome_trace(store: Path, con: duckdb.DuckDBPyConnection,
                                          replayers: dict[str, Replayer],
                                          tmp_path: Path) -> None:
    replayers["dlrm"]  # noqa: B018 - skips without the shared corpus
    out = tmp_path / "projected.json"
    code, stdout, _ = run("replay", store, "--job", "dlrm", "--gpu", "h100", "--network",
                          "gpus_per_node=4,inter_node_bw=100Gbit/s", "--json",
                          "--chrome-trace", out)
    assert code == 0
    doc = json.loads(stdout)
    (s,) = doc["steps"]
    assert s["step"] == 10
    assert s["low_ns"] <= s["projected_step_ns"] <= s["high_ns"]
    assert s["measured_step_ns"] == con.execute(
        "SELECT dur_ns FROM job_steps WHERE job = 'dlrm' AND step = 10"
    ).fetchone()[0]
    trace = json.loads(out.read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "critical_path"]
    # every graph event: X slices on CPU threads and every GPU op (the critical path's nodes)
    expected = con.execute("""
        SELECT count(*) FROM events e LEFT JOIN gpu_ops g USING (job, rank, eid)
        WHERE e.job = 'dlrm' AND e.ph = 'X' AND e.dur_ns >= 0 AND (g.eid IS NOT NULL OR
        (e.track_kind = 'cpu_thread' AND e.kind NOT IN ('kernel', 'memcpy', 'memset')))"""
                       ).fetchone()[0]
    assert len(slices) == doc["chrome_trace"]["events"] == expected
    assert all(e["dur"] >= 0 for e in slices)
    assert {e["pid"] for e in slices} == set(range(8))


def test_cli_replay_text_and_plot(store: Path, tmp_path: Path) -> None:
    png = tmp_path / "replay.png"
    code, stdout, _ = run("replay", store, "--job", "gloo", "--source-network", GLOO_NET,
                          "--network", "inter_node_bw=200Mbit/s", "--plot", png)
    assert code == 0, stdout
    assert "projected critical path:" in stdout and "band ms" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_network_from_toml_file(store: Path, tmp_path: Path) -> None:
    src, dst = tmp_path / "lab.toml", tmp_path / "wan.toml"
    src.write_text('gpus_per_node = 1\ninter_node_bw = "1Gbit/s"\n')
    dst.write_text('inter_node_bw = "1Gbit/s"\nranks_per_dc = 1\ndc_bw = "100Mbit/s"\n'
                   'dc_latency = "20ms"\n')
    code, stdout, stderr = run("replay", store, "--job", "netlab_1gbit", "--source-network",
                               src, "--network", dst, "--json")
    assert code == 0, stderr
    steps = json.loads(stdout)["steps"]
    inline = json.loads(run("replay", store, "--job", "netlab_1gbit", "--source-network",
                            GLOO_NET, "--network", "ranks_per_dc=1,dc_bw=100Mbit/s,"
                            "dc_latency=20ms", "--json")[1])["steps"]
    assert [s["projected_step_ns"] for s in steps] == [s["projected_step_ns"] for s in inline]
    assert all(s["projected_step_ns"] > 5 * s["measured_step_ns"] for s in steps)
    code, _, stderr = run("replay", store, "--job", "netlab_1gbit", "--network",
                          tmp_path / "missing.toml")
    assert code == 1 and "cannot read network file" in stderr


def test_cli_sweep_writes_table_and_plot(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "sw"
    code, stdout, _ = run("sweep", store, "--job", "gloo", "--source-network", GLOO_NET,
                          "--network", "inter_node_bw=0.25,0.5,1,2Gbit/s", "--out", out,
                          "--json")
    assert code == 0
    rows = json.loads(stdout)["rows"]
    assert [r["setting"] for r in rows] == [f"inter_node_bw={x}Gbit/s"
                                            for x in ("0.25", "0.5", "1", "2")]
    proj = [r["projected_step_ns"] for r in rows]
    assert proj == sorted(proj, reverse=True)  # more bandwidth, shorter steps
    assert rows[2]["projected_step_ns"] == rows[2]["measured_step_ns"]  # the source network
    lines = (out / "sweep.csv").read_text().splitlines()
    assert len(lines) == 5 and lines[0].startswith("setting,steps,measured_step_ns")
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,message,code", [
    (["--gpu", "tpu9"], "unknown GPU 'tpu9'", 2),
    (["--network", "inter_node_bw=fast"], "bad bandwidth 'fast'", 2),
    (["--network", "inter_node_bw=1Gbit/s"], "give --source-network", 1),
    (["--network", "nics=2"], "unknown network setting(s) ['nics']", 2),
    (["--step", "99"], "has no complete ProfilerStep#99", 2),
    (["--speedup", "gemm"], "bad speedup 'gemm'", 2),
])
def test_cli_replay_errors(store: Path, args: list[str], message: str, code: int) -> None:
    got, stdout, stderr = run("replay", store, "--job", "gloo", *args)
    assert got == code
    assert message in stderr and stderr.count("\n") == 1 and "Traceback" not in stderr


def test_cli_replay_subprocess_chrome_trace(store: Path, con: duckdb.DuckDBPyConnection,
                                            tmp_path: Path) -> None:
    out = tmp_path / "projected.json"
    p = subprocess.run([sys.executable, "-m", "tracetool", "replay", str(store), "--job",
                        "netlab_1gbit", "--json", "--source-network", GLOO_NET, "--network",
                        "inter_node_bw=500Mbit/s", "--chrome-trace", str(out)],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [s["step"] for s in doc["steps"]] == [2, 3, 4, 5, 6, 7]
    assert all(s["projected_step_ns"] > s["measured_step_ns"] for s in doc["steps"])
    trace = json.loads(out.read_text())  # valid JSON, every event of the graph as a slice
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "critical_path"]
    n_graph_events = con.execute("""
        SELECT count(*) FROM events WHERE job = 'netlab_1gbit' AND ph = 'X' AND dur_ns >= 0
           AND track_kind = 'cpu_thread'""").fetchone()[0]
    assert len(slices) == doc["chrome_trace"]["events"] == n_graph_events
    spans = [e for e in slices if e["name"] == "gloo:all_reduce" and e["cat"] != "critical_path"]
    assert len(spans) == 2 * 4 * 6  # 2 ranks, 4 allreduces a step, 6 steps
    # every slice's measured start and duration, to the ns, against the store: one offset
    # (the trace's origin) for all, and the stored duration (float64 arithmetic on ns since
    # the epoch was off by up to 256 ns)
    stored = {(r, e): (ts, dur) for r, e, ts, dur in con.execute(
        "SELECT rank, eid, ts_ns, dur_ns FROM events WHERE job = 'netlab_1gbit'").fetchall()}
    origin = {stored[e["pid"], e["args"]["eid"]][0] - round(e["args"]["measured_ts_us"] * 1e3)
              for e in slices}
    assert len(origin) == 1
    assert all(round(e["args"]["measured_dur_us"] * 1e3) == stored[e["pid"], e["args"]["eid"]][1]
               for e in slices)
    # the projected critical path: its segments cover each projected step exactly
    path = [e for e in trace["traceEvents"] if e.get("cat") == "critical_path" and e["ph"] == "X"]
    for s in doc["steps"]:
        segs = [e for e in path if e["args"]["step"] == s["step"]]
        assert sum(e["dur"] for e in segs) == pytest.approx(s["projected_step_ns"] / 1e3,
                                                             abs=1e-3 * len(segs))
        assert sum(e["dur"] for e in segs if e["name"].startswith("comm")) > 0
