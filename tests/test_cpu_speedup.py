"""The host CPU what-if (``--cpu-speedup F``, ``Scenario.cpu_speedup``): the CPU's own work
divided by F, its waits left to their dependencies.

On a synthetic trace of known structure every projected time is worked out here by hand;
on the bert-small H100 / MI300X pair (a CPU-bound step: the hosts differ by 10.5%) the
projection is checked against the analysis's own critical path (its CPU time shrinks by
1 - 1/F while the path stays on the CPU) and against the other host's measured step.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay import Replayer, Scenario, resolve_gpu
from tracetool.replay.band import ERRORS
from tracetool.replay.compute import WhatIfError
from tracetool.replay.model import cpu_work, weights
from tracetool.replay.simulate import schedule

from ._util import SHARED_TRACES, kineto_text, run, write, x

US = 1000  # ns
HOST_CPU = 1 + ERRORS["host_cpu"].e  # the band's ratio on CPU work (x/1.2)

# one CPU thread: aten::mm (0-100 us) launching a GEMM (cudaLaunchKernel 20-30) that runs
# 150-250 on the GPU, a device sync 110-260 (returns 10 us after the kernel ends), then
# aten::add 270-400. The CPU work: 20 + 10 + 70 (mm around the launch), 10 (to the sync),
# 10 (after it) + 130 (add) = 250 us; the launch's queueing (130 us) and the sync's wake-up
# (10 us) are waits and stay.
HOST = [
    x("aten::mm", 0, 100, tid=1),
    x("cudaLaunchKernel", 20, 10, cat="cuda_runtime", tid=1, correlation=1),
    x("cudaDeviceSynchronize", 110, 150, cat="cuda_runtime", tid=1),
    x("ampere_sgemm_128x64_nn", 150, 100, cat="kernel", pid=0, tid=7, correlation=1,
      stream=7, device=0),
    x("aten::add", 270, 130, tid=1),
]
# two kernels and nothing on a CPU thread: no CPU work to scale
GPU_ONLY = [x("ampere_sgemm_128x64_nn", t, 100, cat="kernel", pid=0, tid=7, correlation=i,
              stream=7, device=0) for i, t in enumerate((150, 300), 1)]


def host_step_us(cpu: float) -> float:
    """The synthetic job's window (us) with every CPU work edge multiplied by ``cpu``,
    scheduled here by hand: the launch starts at 20 cpu, its kernel 130 later, the sync
    returns 10 after the kernel's end unless the CPU reaches it later (mm's end + 10 cpu),
    then 10 cpu to aten::add and 130 cpu in it."""
    kernel_end = 20 * cpu + 130 + 100
    sync_end = max(kernel_end + 10, (100 + 10) * cpu)
    return sync_end + (10 + 130) * cpu


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cpu")
    store = d / "store"
    for job, events in (("host", HOST), ("gpu_only", GPU_ONLY)):
        trace = write(d / f"{job}.json", kineto_text(events, rank=None))
        assert ingest([trace], Options(store=store, job=job, rank=0))[0].status == "ingested"
    return store


@pytest.fixture(scope="module")
def host(synthetic: Path) -> Replayer:
    return Replayer.from_store(tracetool.connect(synthetic), "host")


# -- the synthetic job: every number by hand ---------------------------------------------------

@pytest.mark.parametrize("f", [2.0, 0.5, 1.25, 10.0])
def test_cpu_work_is_divided_and_waits_are_kept(host: Replayer, f: float) -> None:
    g = host.graph
    sel = cpu_work(g)
    assert int(sel.sum()) == 6 and g.base_w[sel].sum() == 250 * US
    res = host.run(Scenario(cpu_speedup=f))
    (s,) = res.steps
    assert s.measured_ns == 400 * US == round(host_step_us(1.0) * US)
    assert s.projected_ns == round(host_step_us(1 / f) * US)
    # the band: the CPU work at x/(1 + e) (host_cpu), scheduled by hand at both ends
    assert s.low_ns == round(host_step_us(1 / f / HOST_CPU) * US)
    assert s.high_ns == round(host_step_us(HOST_CPU / f) * US)
    assert f"CPU work divided by {f:g}: 6 edges, 0.250 ms of the replayed events' CPU time" \
        in res.notes[0]
    assert res.notes[1] == f"band: host_cpu x/{HOST_CPU:g} (6 edges) (replay/band.py ERRORS, " \
                           "docs/replay_band.md)"


def test_the_gpu_side_keeps_its_times(host: Replayer) -> None:
    """The kernel keeps its 100 us and its 130 us launch queueing; the sync its 10 us."""
    res = host.run(Scenario(cpu_speedup=2.0))
    g = host.graph
    k = int(g.ops["slot"][0])
    t = res.times_ns - res.origin_ns
    assert (t[2 * k], t[2 * k + 1]) == (140 * US, 240 * US)  # launched at 10 us, + 130
    assert res.steps[0].projected["compute"] == 100 * US


def test_identity_and_undo_are_exact(host: Replayer) -> None:
    """cpu_speedup 1 is the identity (every point exactly); a factor 2 applied to the weights
    and undone (x 2, exact in binary floating point) schedules the measured timeline."""
    g = host.graph
    assert np.array_equal(host.run(Scenario(cpu_speedup=1.0)).times, g.t0)
    w = weights(g, Scenario(cpu_speedup=2.0)).w
    sel = cpu_work(g)
    assert np.array_equal(w[sel] * 2, g.base_w[sel]) and np.array_equal(w[~sel], g.base_w[~sel])
    undone = w.copy()
    undone[sel] *= 2
    assert np.array_equal(schedule(g.order, g.ptr, g.src, undone, g.t0), g.t0)


def _one_error(code: int, stdout: str, stderr: str, message: str) -> None:
    assert (code, stdout, stderr) == (2, "", f"tracetool: error: {message}\n")


NO_CPU = ("--cpu-speedup 2: job gpu_only has no CPU work the replay could scale (no time on a "
          "CPU thread that bound the next point: its events are GPU ops, waits and hand-offs "
          "only)")
RANGE = "give a factor from 0.001 to 1000 (e.g. 1.5: the CPU work takes 1/1.5 of its time)"


@pytest.mark.parametrize(("job", "value", "message"), [
    ("host", "1", "bad --cpu-speedup '1': a factor of 1 changes nothing"),
    ("host", "1.0", "bad --cpu-speedup '1.0': a factor of 1 changes nothing"),
    ("host", "0", f"bad --cpu-speedup '0': {RANGE}"),
    ("host", "1001", f"bad --cpu-speedup '1001': {RANGE}"),
    ("host", "nan", f"bad --cpu-speedup 'nan': {RANGE}"),
    ("host", "fast", f"bad --cpu-speedup 'fast': {RANGE}"),
    ("gpu_only", "2", NO_CPU),
])
def test_replay_refuses_a_cpu_speedup_that_changes_nothing(synthetic: Path, job: str,
                                                           value: str, message: str) -> None:
    _one_error(*run("replay", synthetic, "--job", job, "--cpu-speedup", value), message)


def test_the_python_api_refuses_it_too(synthetic: Path) -> None:
    r = Replayer.from_store(tracetool.connect(synthetic), "gpu_only")
    with pytest.raises(WhatIfError) as err:
        r.run(Scenario(cpu_speedup=2.0))
    assert str(err.value) == NO_CPU
    host = Replayer.from_store(tracetool.connect(synthetic), "host")
    with pytest.raises(WhatIfError, match=r"^bad --cpu-speedup 5000\.0: give a factor from "):
        host.run(Scenario(cpu_speedup=5000.0))


def test_cli_json(synthetic: Path) -> None:
    code, stdout, stderr = run("replay", synthetic, "--job", "host", "--cpu-speedup", "2",
                               "--json")
    assert code == 0, stderr
    doc = json.loads(stdout)
    assert doc["scenario"] == "cpu_speedup=2"
    (s,) = doc["steps"]
    assert (s["measured_step_ns"], s["projected_step_ns"]) == (400 * US, 320 * US)
    # no deviceProperties: no catalog GPU, so no power model and no energy
    assert doc["power"] is None and s["energy_j"] is None


# -- the cross-GPU pair: the hosts' difference -----------------------------------------------

BERT = SHARED_TRACES / "AMD-AGI__TraceLens/tests/traces"
PAIR = {"h100": BERT / "h100/gaunernst_bert-small-uncased__1016001.json.gz",
        "mi300x": BERT / "mi300/gaunernst_bert-small-uncased__1016001.json.gz"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, duckdb.DuckDBPyConnection, dict[str, Replayer]]:
    if not all(f.is_file() for f in PAIR.values()):
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
    store = tmp_path_factory.mktemp("pair") / "store"
    for gpu, f in PAIR.items():
        assert ingest([f], Options(store=store, job=gpu, rank=0))[0].status == "ingested"
    con = tracetool.connect(store)
    return store, con, {g: Replayer.from_store(con, g) for g in PAIR}


def _measured(con: duckdb.DuckDBPyConnection, job: str) -> int:
    (dur,), = con.execute("SELECT dur_ns FROM job_steps WHERE job = ? AND complete",
                          [job]).fetchall()
    return dur


@pytest.mark.parametrize("job", ["h100", "mi300x"])
def test_a_cpu_bound_step_shrinks_by_its_critical_paths_cpu_time(pair, job: str) -> None:  # noqa: ANN001
    """The analysis's critical path of the step (``critical-path``, not the replay) is 98-100%
    CPU: with the CPU F times faster, and the path still on the CPU, the step is its measured
    time less (1 - 1/F) of the path's CPU time, to the ns; a tiny factor moves it (by 4 us
    per 0.1%), the further the more."""
    store, _, replayers = pair
    code, stdout, stderr = run("critical-path", store, "--job", job, "--json")
    assert code == 0, stderr
    (step,) = json.loads(stdout)["steps"]
    cpu = step["by_kind"]["cpu"]
    assert cpu > 0.98 * step["dur_ns"]
    got = {}
    for f in (1.001, 1.01, 1.1, 2.0):
        (s,) = replayers[job].run(Scenario(cpu_speedup=f), critical_path=False).steps
        assert s.measured_ns == step["dur_ns"]
        assert abs(s.projected_ns - (s.measured_ns - cpu * (1 - 1 / f))) <= 1, f
        got[f] = s.projected_ns
    assert list(got.values()) == sorted(got.values(), reverse=True)
    slower = [replayers[job].run(Scenario(cpu_speedup=f), critical_path=False)
              .steps[0].projected_ns for f in (0.999, 0.9, 0.5)]
    assert step["dur_ns"] < slower[0] < slower[1] < slower[2]


@pytest.mark.parametrize(("src", "dst"), [("h100", "mi300x"), ("mi300x", "h100")])
def test_the_pairs_host_difference_closes(pair, src: str, dst: str) -> None:  # noqa: ANN001
    """--gpu alone keeps the source host's CPU time: off by the hosts' 10.5%. With the hosts'
    ratio (the measured steps': 4.426 / 4.007 ms) as --cpu-speedup the projection lands
    within 0.2% of the other GPU's measured step, inside its band."""
    _, con, replayers = pair
    src_ms, dst_ms = _measured(con, src), _measured(con, dst)
    r = replayers[src]
    (plain,) = r.run(Scenario(gpu=resolve_gpu(dst)), critical_path=False).steps
    assert abs(plain.projected_ns / dst_ms - 1) > 0.09
    (s,) = r.run(Scenario(gpu=resolve_gpu(dst), cpu_speedup=src_ms / dst_ms),
                 critical_path=False).steps
    assert abs(s.projected_ns / dst_ms - 1) < 0.002, (s.projected_ns, dst_ms)
    assert s.low_ns <= dst_ms <= s.high_ns


def test_sweep_axis_and_csv(pair, tmp_path: Path) -> None:  # noqa: ANN001
    store, _, replayers = pair
    out = tmp_path / "sw"
    code, stdout, stderr = run("sweep", store, "--job", "h100", "--cpu-speedup", "1,1.5,2",
                               "--gpu", "h100,mi300x", "--out", out, "--json")
    assert code == 0, stderr
    rows = json.loads(stdout)["rows"]
    assert [r["setting"] for r in rows] == [f"gpu={g}, cpu_speedup={f}" for g in
                                            ("h100", "mi300x") for f in ("1", "1.5", "2")]
    assert rows[0]["axes"] == {"gpu": "h100", "cpu_speedup": "1"}
    for r, f in zip(rows[:3], (1.0, 1.5, 2.0), strict=True):  # the trace's own GPU
        (s,) = replayers["h100"].run(Scenario(cpu_speedup=f), critical_path=False).steps
        assert (r["projected_step_ns"], r["low_ns"], r["high_ns"]) == (
            s.projected_ns, s.low_ns, s.high_ns)
    assert rows[0]["projected_step_ns"] == rows[0]["measured_step_ns"]
    lines = (out / "sweep.csv").read_text().splitlines()
    assert lines[0] == ("setting,steps,measured_step_ns,projected_step_ns,low_ns,high_ns,"
                        "compute_ns,exposed_comm_ns,exposed_memcpy_ns,idle_ns,comm_ns,"
                        "gpu_clock_mhz,gpu_power_w,energy_j")
    assert lines[1].startswith('"gpu=h100, cpu_speedup=1",1,')
    assert len(lines) == 7


@pytest.mark.parametrize(("args", "message"), [
    (["--cpu-speedup", "2,2"], "bad --cpu-speedup '2,2': a value is given twice"),
    (["--cpu-speedup", "1"], "bad --cpu-speedup '1': a factor of 1 changes nothing"),
    (["--cpu-speedup", "1,0"], f"bad --cpu-speedup '0': {RANGE}"),
    (["--cpu-speedup", "2"], "nothing to sweep: give --network key=v1,v2,..., --gpu, "
                             "--dp-scale, or several --gpu-clock, --power-cap, "
                             "--cpu-speedup or --expert-skew values (--placement is not an "
                             "axis)"),
])
def test_sweep_refuses_bad_cpu_speedups(synthetic: Path, tmp_path: Path, args: list[str],
                                        message: str) -> None:
    code, stdout, stderr = run("sweep", synthetic, "--job", "host", "--out", tmp_path / "sw",
                               *args)
    assert (code, stdout, stderr) == (2, "",
                                      f"tracetool: error: {message}\n")
    assert not (tmp_path / "sw").exists()
    _one_error(*run("sweep", synthetic, "--job", "gpu_only", "--out", tmp_path / "sw",
                    "--cpu-speedup", "1,2"), NO_CPU)
