"""GPU clock and power-cap what-ifs (replay/clocks.py) on real traces: a small A100 trace
without shapes (HTA's alexnet, where the kernel class decides) and a small H100 trace with
shapes (TraceLens' bert-small, where the roofline decides), plus the gloo sample as a CPU job.

Expected kernel times are computed here from the kernel table and the catalog's TOML by
hand, not read back from the model: the identity is exact, compute-bound kernels lengthen by
boost / clock, memory-bound ones keep their time, a power cap gives the clock of
P = P_static + (TDP - P_static) (f / f_boost)^3, and bad inputs exit 2 with one line.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import duckdb
import numpy as np
import pytest

import tracetool
from tracetool.hardware import catalog
from tracetool.replay.band import ERRORS, using_terms
from tracetool.replay.clocks import (
    PowerCap,
    parse_gpu_clock,
    parse_power_cap,
    scenario_clock,
    sustained_clock_mhz,
)
from tracetool.replay.compute import COMPUTE_BOUND, WhatIfError
from tracetool.replay.model import Scenario, resolve_gpu
from tracetool.replay.run import Replayer

from ._util import REPO, SAMPLES, run
from .conftest import TRACES_DIR

ALEXNET = (TRACES_DIR / "facebookresearch__HolisticTraceAnalysis/tests/data/critical_path/"
           "alexnet/benchmark_result_2869224_1695835535_trace.json.gz")  # A100, no shapes
BERT = (TRACES_DIR / "AMD-AGI__TraceLens/tests/traces/h100/"
        "gaunernst_bert-small-uncased__1016001.json.gz")  # H100, Input Dims recorded
# the class map of the model, written out: these kernel classes are compute-bound
COMPUTE_CLASSES = ("gemm", "conv", "attention")
SOURCE_GPU = {"alexnet": "a100", "bert": "h100"}


def _toml(key: str) -> dict:
    return tomllib.loads((REPO / "tracetool/gpus" / f"{key}.toml").read_text())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Jobs alexnet (A100) and bert (H100) from the shared corpus, and nl (the gloo
    sample: a CPU job)."""
    if not (ALEXNET.is_file() and BERT.is_file()):
        pytest.skip(f"real trace corpus not found at {TRACES_DIR}")
    path = tmp_path_factory.mktemp("clocks") / "store"
    for job, src in (("alexnet", ALEXNET), ("bert", BERT)):
        code, _, err = run("ingest", src, "--store", path, "--job", job, "--rank", "0")
        assert code == 0, err
    code, _, err = run("ingest", SAMPLES, "--store", path, "--job", "nl")
    assert code == 0, err
    return path


@pytest.fixture(scope="module")
def con(store: Path) -> duckdb.DuckDBPyConnection:
    return tracetool.connect(store)


@pytest.fixture(scope="module")
def replayers(con: duckdb.DuckDBPyConnection) -> dict[str, Replayer]:
    return {job: Replayer.from_store(con, job) for job in ("alexnet", "bert", "nl")}


def _durations(r: Replayer, times_ns: np.ndarray, rank: int, eid: int) -> int:
    """The projected duration of GPU op (rank, eid)."""
    g = r.graph
    slot = g.ops["slot"][(g.ops["rank"] == rank) & (g.ops["eid"] == eid)][0]
    return int(times_ns[2 * slot + 1] - times_ns[2 * slot])


def _kernels(con: duckdb.DuckDBPyConnection, job: str) -> list[tuple]:
    """(rank, eid, category, dur_ns, op name, Input Dims, Input type) of every kernel."""
    return con.execute(
        """SELECT k.rank, k.eid, k.category, k.dur_ns, o.name, o.args->>'Input Dims',
                  o.args->>'Input type'
           FROM kernels k LEFT JOIN events o
             ON o.job = k.job AND o.rank = k.rank AND o.eid = k.op_eid
           WHERE k.job = ? ORDER BY k.rank, k.eid""", [job]).fetchall()


def _roofline_s(op: str, dims: list, types: list, gpu: dict) -> tuple[float, float]:
    """(FLOP time, byte time) in s of one addmm or flash-attention op on a catalog GPU at its
    achievable fractions, from torch's flop-counter formulas (bytes: inputs + output)."""
    assert [t.lower() for t in types[:2]] == ["c10::bfloat16"] * 2
    if op == "aten::addmm":
        (m, k), (_, n) = [d for d in dims if len(d) == 2][-2:]
        flops, out = 2 * m * k * n, m * n
    else:
        assert op == "aten::_flash_attention_forward"
        (b, s_q, h, d), (_, s_k, _, _) = dims[:2]  # [batch, seq, heads, head_dim]
        flops, out = 4 * b * h * s_q * s_k * d, b * s_q * h * d
    nbytes = 2 * (sum(math.prod(x) for x in dims if x) + out)
    return (flops / (gpu["peak"]["bf16_tflops"] * 1e12 * gpu["achievable"]["compute"]),
            nbytes / (gpu["peak"]["hbm_gbps"] * 1e9 * gpu["achievable"]["memory"]))


# -- the catalog and the relation -------------------------------------------------------------

def test_every_catalog_gpu_has_consistent_clock_and_power_data() -> None:
    assert COMPUTE_BOUND == COMPUTE_CLASSES  # the class map is one list, and it is this one
    for key, g in catalog().items():
        c, t = g.clocks, _toml(key)
        assert c is not None and c.source, key
        assert c.boost_mhz == t["clocks"]["boost_mhz"] and c.tdp_w == t["power"]["tdp_w"]
        assert 0 < c.min_mhz < c.boost_mhz, key
        assert c.base_mhz == 0 or c.min_mhz <= c.base_mhz <= c.boost_mhz, key
        assert 0 < c.static_w < c.min_limit_w < c.tdp_w, key
        assert sustained_clock_mhz(c, c.tdp_w) == c.boost_mhz
        assert c.min_mhz < sustained_clock_mhz(c, c.min_limit_w) < c.boost_mhz, key


@pytest.mark.parametrize("key", sorted(catalog()))
def test_a_power_cap_gives_the_clock_of_the_documented_relation(key: str) -> None:
    t = _toml(key)
    boost, tdp = t["clocks"]["boost_mhz"], t["power"]["tdp_w"]
    static, floor = t["power"]["static_w"], t["power"]["min_limit_w"]
    lowest = t["clocks"]["min_mhz"]
    gpu = catalog()[key]
    for text, watts in (("70%", 0.7 * tdp), ("0.7", 0.7 * tdp), (f"{0.7 * tdp:g}W", 0.7 * tdp),
                        (f"{floor:g}", floor), (f"{floor:g} w", floor)):
        cubic = boost * ((watts - static) / (tdp - static)) ** (1 / 3)
        linear = max(lowest, boost * (watts - static) / (tdp - static))  # at least the lowest
        mhz, notes = scenario_clock(gpu, None, parse_power_cap(text))
        assert mhz == pytest.approx(cubic, rel=1e-12), text
        assert linear < cubic < boost
        assert f"sustained SM clock {cubic:.0f} MHz" in notes[1]
        assert f"{linear:.0f} MHz if power is linear in the clock" in notes[1]
    # a clock lock and a cap together: the lower of the two clocks
    assert scenario_clock(gpu, boost / 2, parse_power_cap("0.95"))[0] == boost / 2
    assert scenario_clock(gpu, boost, parse_power_cap("0.5"))[0] == pytest.approx(
        boost * ((tdp / 2 - static) / (tdp - static)) ** (1 / 3))
    for text in ("100%", "1", f"{tdp:g}W", f"{2 * tdp:g}"):  # at or above TDP: max boost
        assert scenario_clock(gpu, None, parse_power_cap(text))[0] == boost


def test_power_and_clock_texts() -> None:
    assert parse_power_cap("300") == PowerCap(watts=300, text="300")
    assert parse_power_cap(" 300W ").watts == 300 and parse_power_cap("1.5").watts == 1.5
    assert parse_power_cap("0.7").tdp_fraction == 0.7
    assert parse_power_cap("70%").tdp_fraction == pytest.approx(0.7)
    assert parse_power_cap("1").tdp_fraction == 1
    assert str(parse_power_cap("70%")) == "70%" and str(PowerCap(watts=250)) == "250W"
    assert parse_gpu_clock("1200") == parse_gpu_clock("1200MHz") == parse_gpu_clock("1.2e3")
    for bad in ("0", "-300", "abc", "", "nan", "inf", "300 kW", "70 %%"):
        with pytest.raises(WhatIfError, match="bad power cap"):
            parse_power_cap(bad)
    for bad in ("0", "-1", "fast", "", "nan", "1.2GHz"):
        with pytest.raises(WhatIfError, match="bad GPU clock"):
            parse_gpu_clock(bad)


# -- identity ---------------------------------------------------------------------------------

@pytest.mark.parametrize("job", ["alexnet", "bert"])
def test_the_reference_clock_and_an_uncapped_power_are_the_identity(
        job: str, replayers: dict[str, Replayer]) -> None:
    t = _toml(SOURCE_GPU[job])
    boost, tdp = t["clocks"]["boost_mhz"], t["power"]["tdp_w"]
    r = replayers[job]
    identity = r.run()
    assert identity.steps and all(s.projected_ns == s.measured_ns for s in identity.steps)
    for sc in (Scenario(gpu_clock_mhz=boost), Scenario(power_cap=parse_power_cap(f"{tdp:g}W")),
               Scenario(power_cap=parse_power_cap("100%")), Scenario(power_cap=PowerCap(2 * tdp)),
               Scenario(gpu_clock_mhz=boost, power_cap=parse_power_cap("1"))):
        res = r.run(sc)
        assert [(s.measured_ns, s.projected_ns, s.low_ns, s.high_ns) for s in res.steps] == \
            [(s.measured_ns, s.projected_ns, s.low_ns, s.high_ns) for s in identity.steps]
        assert all(s.projected == s.measured for s in res.steps)
        assert np.array_equal(res.times_ns, identity.times_ns)  # every point, exactly
        assert res.notes[0].startswith("assumed: the trace ran at its GPU's max boost clock")


# -- kernels under a lower SM clock -----------------------------------------------------------

def test_halving_the_sm_clock_doubles_compute_class_kernels_only(
        con: duckdb.DuckDBPyConnection, replayers: dict[str, Replayer]) -> None:
    """alexnet records no shapes: gemm/conv/attention kernels take boost / clock = 2, the
    other classes (memory-bound) and the host copies keep their time."""
    rows = _kernels(con, "alexnet")
    assert rows and all(dims is None for *_, dims, _ in rows)  # the class map decides
    total = sum(r[3] for r in rows)
    compute = sum(r[3] for r in rows if r[2] in COMPUTE_CLASSES)
    assert compute > 0.4 * total  # gemm is the largest class of the job's kernel time
    r = replayers["alexnet"]
    res = r.run(Scenario(gpu_clock_mhz=_toml("a100")["clocks"]["boost_mhz"] / 2))
    for rank, eid, category, dur, *_ in rows:
        expected = 2 * dur if category in COMPUTE_CLASSES else dur
        assert abs(_durations(r, res.times_ns, rank, eid) - expected) <= 1, (category, dur)
    copies = con.execute("SELECT rank, eid, dur_ns FROM gpu_ops "
                         "WHERE job = 'alexnet' AND kind <> 'kernel'").fetchall()
    assert copies
    for rank, eid, dur in copies:
        assert _durations(r, res.times_ns, rank, eid) == dur
    (s,) = res.steps
    assert s.projected["compute"] == pytest.approx(s.measured["compute"] + compute, abs=2)
    assert s.projected_ns > s.measured_ns


def test_roofline_memory_bound_kernels_keep_their_time_at_half_clock(
        con: duckdb.DuckDBPyConnection, replayers: dict[str, Replayer]) -> None:
    """bert's gemm and attention ops have shapes: each kernel takes the roofline ratio
    max(2 c, m) / max(c, m) computed here; the job's are small, so all memory-bound."""
    h100 = _toml("h100")
    r = replayers["bert"]
    res = r.run(Scenario(gpu_clock_mhz=h100["clocks"]["boost_mhz"] / 2))
    memory_bound = compute_class = 0
    for rank, eid, category, dur, op, dims, types in _kernels(con, "bert"):
        expected = dur
        if category in COMPUTE_CLASSES:
            compute_class += 1
            c, m = _roofline_s(op, json.loads(dims), json.loads(types), h100)
            expected = dur * max(2 * c, m) / max(c, m)
            memory_bound += m >= 2 * c
        assert abs(_durations(r, res.times_ns, rank, eid) - expected) <= 1, (op, dims)
    assert compute_class == memory_bound == 30
    (s,) = res.steps
    assert s.projected_ns == s.measured_ns
    assert any(n.startswith("30 gemm/conv/attention kernels") and "memory-bound by their "
               "roofline" in n for n in res.notes)


def test_a_power_cap_lengthens_compute_kernels_by_its_clock(
        con: duckdb.DuckDBPyConnection, replayers: dict[str, Replayer]) -> None:
    t = _toml("a100")
    boost, tdp, static = t["clocks"]["boost_mhz"], t["power"]["tdp_w"], t["power"]["static_w"]
    clock = boost * ((200 - static) / (tdp - static)) ** (1 / 3)
    r = replayers["alexnet"]
    res = r.run(Scenario(power_cap=parse_power_cap("200W")))
    for rank, eid, category, dur, *_ in _kernels(con, "alexnet"):
        expected = dur * boost / clock if category in COMPUTE_CLASSES else dur
        assert abs(_durations(r, res.times_ns, rank, eid) - expected) <= 1


def test_with_a_target_gpu_the_clock_is_the_targets(
        con: duckdb.DuckDBPyConnection, replayers: dict[str, Replayer]) -> None:
    """alexnet (A100) onto an H100 at half the H100's boost: compute-class kernels (no shapes:
    the ratio of peaks at their achievable fractions, bf16 assumed): the H100's floor plus
    their time above the A100's floor x A100 / H100 achievable peak x 2 (the floor, a
    launch-bound kernel's time, is not scaled by the clock); the rest as for --gpu alone."""
    a100, h100 = _toml("a100"), _toml("h100")
    r = replayers["alexnet"]
    onto = r.run(Scenario(gpu=resolve_gpu("h100")))
    half = r.run(Scenario(gpu=resolve_gpu("h100"),
                          gpu_clock_mhz=h100["clocks"]["boost_mhz"] / 2))
    ratio = (a100["peak"]["bf16_tflops"] * a100["achievable"]["compute"]
             / (h100["peak"]["bf16_tflops"] * h100["achievable"]["compute"]))
    for rank, eid, category, dur, *_ in _kernels(con, "alexnet"):
        got = _durations(r, half.times_ns, rank, eid)
        if category in COMPUTE_CLASSES:
            above = max(dur - a100["kernels"]["floor_us"] * 1e3, 0)
            assert abs(got - (h100["kernels"]["floor_us"] * 1e3 + above * ratio * 2)) <= 1
        else:
            assert abs(got - _durations(r, onto.times_ns, rank, eid)) <= 1  # ns rounding
    assert "the H100 SXM at 990 of its 1980 MHz" in half.notes[0]


# -- the CLI and the Python API -----------------------------------------------------------------

def _replay_json(store: Path, job: str, *args: str) -> dict:
    code, stdout, stderr = run("replay", store, "--job", job, "--json", *args)
    assert code == 0, stderr
    return json.loads(stdout)


def test_cli_json_carries_the_assumption_note(store: Path) -> None:
    t = _toml("a100")
    out = _replay_json(store, "alexnet", "--gpu-clock", "705")
    assert out["scenario"] == "gpu_clock=705MHz"
    assert out["notes"][0].startswith("assumed: the trace ran at its GPU's max boost clock "
                                      "(traces record no clock); the A100 SXM 80GB at 705 of "
                                      "its 1410 MHz")
    (step,) = out["steps"]
    assert step["projected_step_ns"] > step["measured_step_ns"]
    capped = _replay_json(store, "alexnet", "--power-cap", "50%")
    assert capped["scenario"] == "power_cap=50%"
    p = t["power"]
    clock = 1410 * ((200 - p["static_w"]) / (p["tdp_w"] - p["static_w"])) ** (1 / 3)
    assert capped["notes"][0].startswith("assumed: the trace ran at its GPU's max boost clock")
    assert capped["notes"][1].startswith(f"power cap 200 W, 50% of the A100 SXM 80GB's 400 W "
                                         f"TDP: sustained SM clock {clock:.0f} MHz")
    same = _replay_json(store, "alexnet", "--power-cap", "200W")
    assert same["steps"] == capped["steps"]
    code, stdout, _ = run("replay", store, "--job", "bert", "--gpu-clock", "1980")
    assert code == 0 and "note: assumed: the trace ran at its GPU's max boost clock" in stdout


def _one_error(code: int, stdout: str, stderr: str, message: str) -> None:
    assert (code, stdout, stderr) == (2, "", f"tracetool: error: {message}\n")


A100_RANGE = "the A100 SXM 80GB's SM clock range, 210-1410 MHz (tracetool/gpus/a100.toml)"
BAD_CAP = "give watts (300, 300W) or a fraction of the TDP (0.7, 70%), > 0"
CPU_JOB = "job nl has no GPU ops (a CPU job), so a GPU clock or power cap changes nothing"


@pytest.mark.parametrize(("job", "args", "message"), [
    ("alexnet", ["--gpu-clock", "5000"], f"GPU clock 5000 MHz: outside {A100_RANGE}"),
    ("alexnet", ["--gpu-clock", "100MHz"], f"GPU clock 100 MHz: outside {A100_RANGE}"),
    ("alexnet", ["--gpu-clock", "1500"], f"GPU clock 1500 MHz: outside {A100_RANGE}"),
    ("alexnet", ["--gpu", "v100", "--gpu-clock", "1600"],
     "GPU clock 1600 MHz: outside the V100 SXM2's SM clock range, 135-1530 MHz "
     "(tracetool/gpus/v100.toml)"),
    ("alexnet", ["--gpu-clock", "0"], "bad GPU clock '0': give the SM clock in MHz, > 0 "
                                      "(e.g. 1200)"),
    ("alexnet", ["--gpu-clock", "-700"], "bad GPU clock '-700': give the SM clock in MHz, > 0 "
                                         "(e.g. 1200)"),
    ("alexnet", ["--gpu-clock", "fast"], "bad GPU clock 'fast': give the SM clock in MHz, > 0 "
                                         "(e.g. 1200)"),
    ("alexnet", ["--power-cap", "0"], f"bad power cap '0': {BAD_CAP}"),
    ("alexnet", ["--power-cap", "-300W"], f"bad power cap '-300W': {BAD_CAP}"),
    ("alexnet", ["--power-cap", "lots"], f"bad power cap 'lots': {BAD_CAP}"),
    ("alexnet", ["--power-cap", "50W"], "power cap '50W': below the A100 SXM 80GB's minimum "
                                        "power limit of 100 W (tracetool/gpus/a100.toml)"),
    ("alexnet", ["--power-cap", "10%"], "power cap '10%' (40 W): below the A100 SXM 80GB's "
                                        "minimum power limit of 100 W (tracetool/gpus/a100.toml)"),
    ("nl", ["--gpu-clock", "900"], f"GPU clock 900 MHz: {CPU_JOB}"),
    ("nl", ["--power-cap", "300W"], f"power cap '300W': {CPU_JOB}"),
])
def test_replay_rejects_bad_clocks_and_caps(store: Path, job: str, args: list[str],
                                            message: str) -> None:
    _one_error(*run("replay", store, "--job", job, *args), message)


def test_the_clock_range_is_the_target_gpus(store: Path) -> None:
    """1500 MHz is past the A100's max boost but within the H100's."""
    out = _replay_json(store, "alexnet", "--gpu", "h100", "--gpu-clock", "1500")
    assert out["scenario"] == "gpu=h100, gpu_clock=1500MHz"
    assert "the H100 SXM at 1500 of its 1980 MHz" in out["notes"][0]


def test_sweep_shares_the_clock_options(store: Path, tmp_path: Path) -> None:
    def rows(*args: str) -> list[dict]:
        code, stdout, stderr = run("sweep", store, "--job", "alexnet", "--gpu", "a100,h100",
                                   "--out", tmp_path / "sw", "--json", *args)
        assert code == 0, stderr
        return json.loads(stdout)["rows"]

    plain, capped = rows(), rows("--power-cap", "70%")
    assert [r["setting"] for r in capped] == ["gpu=a100", "gpu=h100"]
    assert plain[0]["projected_step_ns"] == plain[0]["measured_step_ns"]  # a100 onto itself
    for p, c in zip(plain, capped, strict=True):
        assert c["projected_breakdown_ns"]["compute"] > p["projected_breakdown_ns"]["compute"]
    _one_error(*run("sweep", store, "--job", "alexnet", "--gpu", "h100,v100", "--gpu-clock",
                    "1600", "--out", tmp_path / "bad"),
               "GPU clock 1600 MHz: outside the V100 SXM2's SM clock range, 135-1530 MHz "
               "(tracetool/gpus/v100.toml)")
    _one_error(*run("sweep", store, "--job", "alexnet", "--gpu", "h100", "--power-cap", "x",
                    "--out", tmp_path / "bad"), f"bad power cap 'x': {BAD_CAP}")
    assert not (tmp_path / "bad").exists()


def test_the_python_api_checks_clocks_and_caps(replayers: dict[str, Replayer]) -> None:
    with pytest.raises(WhatIfError, match=re.escape(f"GPU clock 5000 MHz: outside {A100_RANGE}")):
        replayers["alexnet"].run(Scenario(gpu_clock_mhz=5000))
    with pytest.raises(WhatIfError, match=re.escape(f"power cap '300W': {CPU_JOB}")):
        replayers["nl"].run(Scenario(power_cap=parse_power_cap("300W")))


# -- the band under a clock or a cap, and the energy per step ---------------------------------

def _clocks(key: str, watts: float) -> tuple[float, float]:
    """(cubic, linear) law's SM clock under a ``watts`` cap, from the catalog's TOML."""
    t = _toml(key)
    boost, tdp = t["clocks"]["boost_mhz"], t["power"]["tdp_w"]
    share = (watts - t["power"]["static_w"]) / (tdp - t["power"]["static_w"])
    return boost * share ** (1 / 3), max(t["clocks"]["min_mhz"], boost * share)


@pytest.mark.parametrize("cap", ["50%", "70%", "90%"])
def test_the_band_spans_both_power_laws_and_never_beats_the_boost_clock(
        con: duckdb.DuckDBPyConnection, replayers: dict[str, Replayer], cap: str) -> None:
    """alexnet (A100, no shapes): under the linear law, compute-class kernels take boost /
    f_linear (the clock computed here from the TOML); the band holds both laws' projected
    steps and starts no lower than the measured (boost-clock) step."""
    t = _toml("a100")
    watts = float(cap[:-1]) / 100 * t["power"]["tdp_w"]
    cubic, linear = _clocks("a100", watts)
    assert linear < cubic
    r = replayers["alexnet"]
    res = r.run(Scenario(power_cap=parse_power_cap(cap)))
    lin = r.run(Scenario(power_cap=parse_power_cap(cap), dvfs_exponent=1.0))
    boost = t["clocks"]["boost_mhz"]
    for rank, eid, category, dur, *_ in _kernels(con, "alexnet"):
        expected = dur * boost / linear if category in COMPUTE_CLASSES else dur
        assert abs(_durations(r, lin.times_ns, rank, eid) - expected) <= 1
    (s,), (s_lin,) = res.steps, lin.steps
    assert s.measured_ns < s.projected_ns < s_lin.projected_ns  # slower, the linear the most
    assert s.measured_ns <= s.low_ns < s.projected_ns and s_lin.projected_ns < s.high_ns
    assert "band: spans the power cap's clock by both laws, power cubic and linear in the " \
           "clock (replay/clocks.py)" in res.notes
    assert res.notes[-1] == ("band: a lower clock never makes the job faster: its low end is "
                             "at least the measured step")


# one CPU thread launching one GEMM (no shapes: compute-bound, boost / clock) and waiting for
# it: the window is 300 us of CPU and waits plus the kernel's 100 us (tests/test_cpu_speedup.py)
ONE_GEMM = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
     "ts": 20, "dur": 10, "args": {"correlation": 1}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
     "ts": 110, "dur": 150},
    {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
     "ts": 150, "dur": 100, "args": {"correlation": 1, "stream": 7, "device": 0}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 270, "dur": 130},
]


@pytest.fixture(scope="module")
def one_gemm(tmp_path_factory: pytest.TempPathFactory) -> Replayer:
    from tracetool.ingest.pipeline import Options, ingest

    from ._util import kineto_text, write

    d = tmp_path_factory.mktemp("gemm")
    trace = write(d / "rank0.json", kineto_text(ONE_GEMM, rank=None))
    assert ingest([trace], Options(store=d / "store", job="g", rank=0))[0].status == "ingested"
    return Replayer.from_store(tracetool.connect(d / "store"), "g")


@pytest.mark.parametrize(("cap", "clock"), [("25%", None), ("50%", None), ("90%", None),
                                            (None, 705.0)])
def test_the_band_of_one_gemm_by_hand(one_gemm: Replayer, cap: str | None,
                                      clock: float | None) -> None:
    """The step is 300 us + the kernel (100 us x boost / f). The band: low, the cubic law's
    step with the kernel at x/(1 + e) (kernel_large), but never below the measured 400 us
    (the floor binds at a 90% cap); high, the linear law's (the clock a cap gives if power is
    linear in it, at least the lowest clock: 210 MHz at a 25% cap) with the kernel at x (1 + e).
    e is set to 0.15 here, not the committed value, so that the floor's case stays tested."""
    t = _toml("a100")
    boost = t["clocks"]["boost_mhz"]
    cubic, linear = (_clocks("a100", float(cap[:-1]) / 100 * t["power"]["tdp_w"])
                     if cap else (clock, clock))
    with using_terms({"kernel_large": 0.15}):
        res = one_gemm.run(Scenario(source_gpu=resolve_gpu("a100"), gpu_clock_mhz=clock,
                                    power_cap=parse_power_cap(cap) if cap else None))
        k = 1 + ERRORS["kernel_large"].e
    assert k == 1.15
    (s,) = res.steps
    us = 1000
    assert s.measured_ns == 400 * us
    assert s.projected_ns == round((300 + 100 * boost / cubic) * us)
    assert s.low_ns == round(max(400, 300 + 100 * boost / cubic / k) * us)
    assert s.high_ns == round((300 + 100 * boost / linear * k) * us)
    if cap == "90%":
        assert s.low_ns == s.measured_ns  # the floor binds
    if cap == "25%":
        assert linear == t["clocks"]["min_mhz"] and s.low_ns > s.measured_ns


def test_a_lower_clock_and_a_targets_cap_keep_the_floor(replayers: dict[str, Replayer]) -> None:
    """A clock lock (no law to span) starts at the measured step too; with --gpu the floor is
    the low end of the target's band at its boost clock, which a cap never lowers."""
    r = replayers["alexnet"]
    (s,) = r.run(Scenario(gpu_clock_mhz=705)).steps
    assert s.measured_ns <= s.low_ns < s.projected_ns < s.high_ns
    (onto,) = r.run(Scenario(gpu=resolve_gpu("h100"))).steps
    for sc in (Scenario(gpu=resolve_gpu("h100"), power_cap=parse_power_cap("50%")),
               Scenario(gpu=resolve_gpu("h100"), gpu_clock_mhz=990)):
        res = r.run(sc)
        (capped,) = res.steps
        assert onto.low_ns <= capped.low_ns < onto.projected_ns <= capped.projected_ns
        assert capped.high_ns >= onto.high_ns
        assert res.notes[-1].endswith("at least the low end of the same projection's band "
                                      "at the boost clock")


def test_energy_per_step_is_the_power_law_times_the_step(store: Path) -> None:
    """--json: the power model's draw P(f) = P_static + (TDP - P_static) (f / f_boost)^3 per
    GPU (at a cap below the TDP: the cap itself) and each step's energy, P x projected step
    x GPUs (one per replayed rank with GPU ops), J; none for a CPU job."""
    t = _toml("a100")
    boost, tdp, static = t["clocks"]["boost_mhz"], t["power"]["tdp_w"], t["power"]["static_w"]
    cases = {(): (boost, tdp), ("--power-cap", "200W"): (_clocks("a100", 200)[0], 200.0),
             ("--gpu-clock", "705"): (705, static + (tdp - static) * (705 / boost) ** 3)}
    for args, (mhz, watts) in cases.items():
        out = _replay_json(store, "alexnet", *args)
        assert out["power"]["gpu"] == "A100 SXM 80GB" and out["power"]["gpus"] == 1
        assert out["power"]["sm_clock_mhz"] == pytest.approx(mhz, rel=1e-12)
        assert out["power"]["gpu_power_w"] == pytest.approx(watts, rel=1e-12)
        (step,) = out["steps"]
        assert step["energy_j"] == pytest.approx(watts * step["projected_step_ns"] * 1e-9,
                                                 rel=1e-12)
    h100 = _toml("h100")
    out = _replay_json(store, "bert", "--gpu", "mi300x")
    assert out["power"]["gpu_power_w"] == _toml("mi300x")["power"]["tdp_w"] != \
        h100["power"]["tdp_w"]
    nl = _replay_json(store, "nl", "--source-network", "gpus_per_node=1,inter_node_bw=1Gbit/s")
    assert nl["power"] is None and all(s["energy_j"] is None for s in nl["steps"])


def test_power_cap_and_gpu_clock_are_sweep_axes(store: Path, tmp_path: Path,
                                                replayers: dict[str, Replayer]) -> None:
    out = tmp_path / "sw"
    code, stdout, stderr = run("sweep", store, "--job", "alexnet", "--power-cap", "50%,70%,90%",
                               "--out", out, "--json")
    assert code == 0, stderr
    rows = json.loads(stdout)["rows"]
    assert [r["setting"] for r in rows] == ["power_cap=50%", "power_cap=70%", "power_cap=90%"]
    assert [r["axes"] for r in rows] == [{"power_cap": c} for c in ("50%", "70%", "90%")]
    lines = (out / "sweep.csv").read_text().splitlines()
    head = lines[0].split(",")
    assert head[-3:] == ["gpu_clock_mhz", "gpu_power_w", "energy_j"] and len(lines) == 4
    for r, line, frac in zip(rows, lines[1:], (0.5, 0.7, 0.9), strict=True):
        (s,) = replayers["alexnet"].run(Scenario(power_cap=PowerCap(tdp_fraction=frac))).steps
        assert (r["projected_step_ns"], r["low_ns"], r["high_ns"]) == (
            s.projected_ns, s.low_ns, s.high_ns)
        watts = frac * 400
        cell = dict(zip(head, line.split(","), strict=True))
        assert float(cell["gpu_clock_mhz"]) == pytest.approx(_clocks("a100", watts)[0],
                                                             rel=1e-5)
        assert float(cell["gpu_power_w"]) == pytest.approx(watts, rel=1e-5)
        assert float(cell["energy_j"]) == pytest.approx(watts * s.projected_ns * 1e-9, rel=1e-5)
    # two axes: a grid, the clock lock and the cap together at the lower clock
    code, stdout, stderr = run("sweep", store, "--job", "alexnet", "--gpu-clock", "705,1000",
                               "--power-cap", "50%,90%", "--out", out, "--json")
    assert code == 0, stderr
    rows = json.loads(stdout)["rows"]
    assert [r["setting"] for r in rows] == [
        "gpu_clock=705MHz, power_cap=50%", "gpu_clock=705MHz, power_cap=90%",
        "gpu_clock=1000MHz, power_cap=50%", "gpu_clock=1000MHz, power_cap=90%"]
    assert [r["gpu_clock_mhz"] for r in rows] == pytest.approx(
        [705, 705, min(1000, _clocks("a100", 200)[0]), min(1000, _clocks("a100", 360)[0])])


@pytest.mark.parametrize(("args", "message", "code"), [
    (["--power-cap", "50%,0.5"], "bad --power-cap '50%,0.5': a value is given twice", 2),
    (["--gpu-clock", "705,705MHz"], "bad --gpu-clock '705,705MHz': a value is given twice", 2),
    (["--power-cap", "50%,x"], f"bad power cap 'x': {BAD_CAP}", 2),
    (["--gpu-clock", "705,5000"], f"GPU clock 5000 MHz: outside {A100_RANGE}", 2),
    (["--power-cap", "70%,10%"], "power cap '10%' (40 W): below the A100 SXM 80GB's minimum "
                                 "power limit of 100 W (tracetool/gpus/a100.toml)", 2),
    (["--power-cap", "50%"], "nothing to sweep: give --network key=v1,v2,..., --gpu, "
                             "--dp-scale, or several --gpu-clock, --power-cap, --cpu-speedup "
                             "or --expert-skew values (--placement is not an axis)", 2),
])
def test_sweep_rejects_bad_clock_and_cap_axes(store: Path, tmp_path: Path, args: list[str],
                                              message: str, code: int) -> None:
    got = run("sweep", store, "--job", "alexnet", "--out", tmp_path / "bad", *args)
    assert got == (code, "", f"tracetool: error: {message}\n")
    assert not (tmp_path / "bad").exists()
