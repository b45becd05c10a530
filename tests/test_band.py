"""The uncertainty band (tracetool.replay.band): error terms carried through the schedule.

The band must contain the measured truth on the project's ground truth: the cross-GPU pair
of ../shared/traces (bert-small, H100 and MI300X, both ways), measured independently by the
job_steps view of the target's own trace. Identity stays exact (no model, no error term)."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay import Replayer, Scenario, band, resolve_gpu
from tracetool.replay.band import ERRORS, bounds

from ._util import SHARED_TRACES, kineto_text, run, write, x

BERT = SHARED_TRACES / "AMD-AGI__TraceLens/tests/traces"
PAIR = {"h100": BERT / "h100/gaunernst_bert-small-uncased__1016001.json.gz",
        "mi300x": BERT / "mi300/gaunernst_bert-small-uncased__1016001.json.gz"}


def test_bounds_hold_both_signs() -> None:
    w = np.array([100.0, -50.0, 0.0, 10.0])
    e = np.array([1.0, 1.0, 0.5, 0.0])
    lo, hi = bounds(w, e)
    assert (lo <= w).all() and (w <= hi).all()
    assert lo.tolist() == [50.0, -100.0, 0.0, 10.0]
    assert hi.tolist() == [200.0, -25.0, 0.0, 10.0]


def test_every_error_term_says_where_it_comes_from() -> None:
    assert all(t.e > 0 and len(t.source) > 40 for t in ERRORS.values())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    if not all(f.is_file() for f in PAIR.values()):
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
    store = tmp_path_factory.mktemp("band") / "store"
    for gpu, f in PAIR.items():
        assert ingest([f], Options(store=store, job=gpu, rank=0))[0].status == "ingested"
    con = tracetool.connect(store)
    measured = {gpu: con.execute("SELECT dur_ns FROM job_steps WHERE job = ? AND complete",
                                 [gpu]).fetchall() for gpu in PAIR}
    return con, {g: Replayer.from_store(con, g) for g in PAIR}, measured


@pytest.mark.parametrize(("src", "dst"), [("h100", "mi300x"), ("mi300x", "h100")])
def test_cross_gpu_truth_lies_in_the_band(pair, src: str, dst: str) -> None:  # noqa: ANN001
    _, replayers, measured = pair
    res = replayers[src].run(Scenario(gpu=resolve_gpu(dst)))
    (truth,), = measured[dst]
    s = res.steps[0]
    assert len(res.steps) == 1 and s.low_ns <= truth <= s.high_ns, (s, truth)
    assert s.low_ns < s.projected_ns < s.high_ns
    notes = " ".join(res.notes)
    assert "kernel_small" in notes and "host_cpu" in notes
    assert "not measured" not in notes  # every GPU term is sized from the pairs' errors


def test_identity_has_no_model_error(pair) -> None:  # noqa: ANN001
    _, replayers, measured = pair
    res = replayers["h100"].run()
    (truth,), = measured["h100"]
    s = res.steps[0]
    assert s.low_ns == s.projected_ns == s.high_ns == truth  # one step: no variation either
    assert not any(n.startswith("band:") for n in res.notes)


@functools.cache
def _floor_without_bert() -> float:
    """The H100 floor fitted leaving the bert pair out (benchmarks/gpu_accuracy.py ``fit``):
    the least 1st percentile of the kernel durations of the other pairs' H100 traces, read
    from their JSON (their ingest would cost ~40 s)."""
    import gzip
    import json

    import numpy as np

    p1 = []
    for name in ("Qwen_Qwen1.5-0.5B-Chat__1016005", "facebook_timesformer-base-finetuned-k400"
                 "__1016002"):
        with gzip.open(BERT / "h100" / f"{name}.json.gz") as f:
            events = json.load(f)["traceEvents"]
        dur = [round(e["dur"] * 1000) for e in events
               if e.get("cat") == "kernel" and e.get("ph") == "X"]
        p1.append(float(np.percentile(dur, 1)))
    return min(p1)


@pytest.mark.parametrize(("src", "dst", "lo", "hi"), [("h100", "mi300x", -0.32, -0.31),
                                                      ("mi300x", "h100", 0.58, 0.59)])
def test_cross_gpu_kernel_time_out_of_sample(pair, src: str, dst: str, lo: float,  # noqa: ANN001
                                             hi: float) -> None:
    """The bert pair held out (the H100 floor, the one fitted constant, refitted on the other
    two pairs: 1.568 us): its GPU kernel time projected onto the other GPU against that GPU's
    own trace is off by the -31.5% / +58.5% benchmarks/gpu_accuracy.py measured (4 attention
    kernels the MI300X runs as a Triton kernel at 3x FlashAttention's time), within the
    kernel-time band of the committed terms (each kernel at x/(1 + e), kernel_library on its
    26 gemm and 4 attention kernels), and the band covers the step."""
    import dataclasses

    from tracetool.hardware import catalog
    from tracetool.replay.model import op_factors

    floor = _floor_without_bert()
    assert floor == 1568.0
    gpus = catalog()
    gpus["h100"] = dataclasses.replace(gpus["h100"], kernel_floor_ns=floor)
    con, replayers, measured = pair
    scenario = Scenario(gpu=gpus[dst], source_gpu=gpus[src])
    g = replayers[src].graph
    f, _ = op_factors(g, scenario)
    kernels = g.ops["kind"].astype(str) == "kernel"
    projected = float((g.ops["dur"][kernels] * f[kernels]).sum())
    truth = con.execute("SELECT sum(dur_ns) FROM gpu_ops WHERE job = ? AND kind = 'kernel'",
                        [dst]).fetchone()[0]
    assert lo <= projected / truth - 1 <= hi, (projected, truth)
    terms = band.kernel_terms(g, scenario)
    cat = g.ops["category"].astype(str)
    assert int((terms["kernel_library"] & kernels).sum()) == 30
    assert set(cat[terms["kernel_library"]]) == {"gemm", "attention"}
    e = band.op_errors(g, scenario)[kernels]
    p = g.ops["dur"][kernels] * f[kernels]
    assert (p / (1 + e)).sum() <= truth <= (p * (1 + e)).sum()
    s = replayers[src].run(scenario, critical_path=False).steps[0]
    (step,), = measured[dst]
    assert s.low_ns <= step <= s.high_ns


# steps of 100, 100, 100 and 1000 us (CPU annotation, one kernel launched in each): their
# variation u = stdev / mean = 450 / 325 is more than 1
VARIED = {1: (0, 100), 2: (100, 200), 3: (200, 300), 4: (300, 1300)}


def test_a_band_never_holds_a_negative_time(tmp_path: Path) -> None:
    """The step-to-step variation widens the band as a ratio, [low / (1 + u), high (1 + u)]:
    subtracted (low - u x projected), it made every 100 us step's band start below zero."""
    events = []
    for n, (cs, ce) in VARIED.items():
        events += [x(f"ProfilerStep#{n}", cs, ce - cs, cat="user_annotation"),
                   x("cudaLaunchKernel", cs + 10, 5, cat="cuda_runtime", correlation=n),
                   x("volta_sgemm_128x64_nn", cs + 20, ce - cs - 30, cat="kernel", pid=0,
                     tid=7, device=0, stream=7, correlation=n)]
    s = tmp_path / "store"
    trace = write(tmp_path / "rank0.json", kineto_text(events, rank=0))
    assert ingest([trace], Options(store=s, job="j"))[0].status == "ingested"
    code, out, err = run("replay", s, "--json")
    assert code == 0, err
    durs = [(ce - cs) * 1000 for cs, ce in VARIED.values()]
    u = statistics.stdev(durs) / statistics.mean(durs)
    assert u > 1
    got = [(r["step"], r["measured_step_ns"], r["low_ns"], r["high_ns"])
           for r in json.loads(out)["steps"]]
    assert [g[:2] for g in got] == list(zip(VARIED, durs, strict=True))
    for (_, d, low, high) in got:
        assert 0 < low < d < high
        assert abs(low - d / (1 + u)) <= 1 and abs(high - d * (1 + u)) <= 1


def test_host_factor_is_the_steps_cpu_work(pair) -> None:  # noqa: ANN001
    """benchmarks/gpu_accuracy.py's host difference: the CPU work (model.cpu_work) ending
    inside the projected step, not the whole trace's (9.679 / 8.761 ms); each less than its
    step, and their ratio 1.110, the --cpu-speedup BENCHMARKS.md records for this pair."""
    import importlib.util

    from tracetool.replay.model import cpu_work

    path = Path(__file__).resolve().parent.parent / "benchmarks/gpu_accuracy.py"
    spec = importlib.util.spec_from_file_location("gpu_accuracy", path)
    acc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(acc)
    _, replayers, measured = pair
    ms = {g: acc.cpu_work_ms(replayers[g]) for g in ("h100", "mi300x")}
    assert ms == pytest.approx({"h100": 4.418474, "mi300x": 3.982399}, abs=1e-6)
    for g, r in replayers.items():
        (step,), = measured[g]
        whole = float(r.graph.base_w[cpu_work(r.graph)].sum()) / 1e6
        assert ms[g] < step / 1e6 < whole
    assert round(ms["h100"] / ms["mi300x"], 3) == 1.110
