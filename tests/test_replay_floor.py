"""A projection onto another GPU says when the target's kernel floor sets a large share of
the projected kernel time (issue 26, from the last session's "noticed, left"): the Kineto
docs traces' one 20 ns kernel projected to +1531% on a B200 with no note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracetool.hardware import lookup_gpu

from ._util import SHARED_TRACES, kineto_text, run, write, x

KINETO_DOCS = SHARED_TRACES / "pytorch__kineto/docs/traces/after_fix_trace.json"


def _job(tmp: Path, dur_us: float) -> Path:
    """One step of ten kernels of ``dur_us`` each, launched 20 us apart."""
    rt = dict(cat="cuda_runtime")
    k = dict(cat="kernel", pid=0, tid=7, device=0, stream=7)
    ev = [x("ProfilerStep#1", 0, 30_000, cat="user_annotation")]
    for i in range(10):
        t = 10 + 2_500 * i
        ev += [x("cudaLaunchKernel", t, 5, correlation=i + 1, **rt),
               x("vectorized_elementwise_kernel", t + 10, dur_us, correlation=i + 1, **k)]
    ev.append(x("ProfilerStep#2", 30_000, 100, cat="user_annotation"))
    path = write(tmp / f"k{dur_us}.json", kineto_text(ev, rank=None))
    store = tmp / f"s{dur_us}"
    assert run("ingest", "--store", store, "--job", "j", path)[0] == 0
    return store


def _floor_notes(store: Path, *args: str) -> list[str]:
    code, out, err = run("replay", store, "--json", *args)
    assert code == 0, err
    return [n for n in json.loads(out)["notes"] if "kernel floor" in n]


def test_short_kernels_on_another_gpu_say_the_floor_sets_the_time(tmp_path: Path) -> None:
    b200, h100 = lookup_gpu("b200"), lookup_gpu("h100")
    assert (b200.kernel_floor_ns, h100.kernel_floor_ns) == (2100.0, 1570.0)  # the catalog's
    store = _job(tmp_path, 1.0)  # 1 us kernels: under the H100's floor, each takes the B200's
    assert _floor_notes(store, "--source-gpu", "h100", "--gpu", "b200") == [
        "the b200 kernel floor (2.1 us per kernel, tracetool/gpus/b200.toml) sets 100% of the "
        "projected kernel time (21.000 us of 21.000 us, 10 kernels; 10 ran at or under the "
        "h100 floor of 1.57 us): short kernels take the floor, not their measured time "
        "scaled, so that share of the projection rests on the floor's value"]


def test_long_kernels_need_no_floor_note(tmp_path: Path) -> None:
    store = _job(tmp_path, 2_000.0)  # 2 ms kernels: the floor is 0.1% of them
    assert _floor_notes(store, "--source-gpu", "h100", "--gpu", "b200") == []
    # the same GPU at another clock keeps its floors: nothing to say
    short = _job(tmp_path, 1.0)
    assert _floor_notes(short, "--source-gpu", "h100", "--gpu-clock", "1200") == []


@pytest.mark.skipif(not KINETO_DOCS.is_file(), reason="no trace corpus")
def test_the_kineto_docs_trace_says_its_floor(tmp_path: Path) -> None:
    assert run("ingest", "--store", tmp_path / "s", "--job", "k", KINETO_DOCS)[0] == 0
    code, out, err = run("replay", tmp_path / "s", "--json", "--gpu", "b200")
    assert code == 0, err
    report = json.loads(out)
    assert f"{100 * report['steps'][0]['error']:+.1f}%" == "+1530.8%"
    assert [n for n in report["notes"] if "kernel floor" in n] == [
        "the b200 kernel floor (2.1 us per kernel, tracetool/gpus/b200.toml) sets 100% of the "
        "projected kernel time (2.100 us of 2.100 us, 1 kernel; 1 ran at or under the "
        "h100 floor of 1.57 us): short kernels take the floor, not their measured time "
        "scaled, so that share of the projection rests on the floor's value"]
