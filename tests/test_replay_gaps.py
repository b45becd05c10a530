"""Replay's projected critical path names unexplained gaps as critical-path does (issue 26,
item 3): the same segment kind from the same view (gpu_wait_gaps), the same one warning (in
the notes, text and JSON), the same time on the corpus's vLLM and SGLang decode traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracetool
from tracetool.replay.plots import plot_replay
from tracetool.replay.run import Replayer

from ._util import SHARED_TRACES, kineto_text, run, write
from .test_graph_inferred import SGLANG, VLLM, _queued_gap_trace

corpus = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="no trace corpus")


@pytest.fixture(scope="module")
def gap_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic job with a 120 ms and a 2 ms queued GPU gap (test_graph_inferred)."""
    tmp = tmp_path_factory.mktemp("gap")
    path = write(tmp / "gap.json", kineto_text(_queued_gap_trace(), rank=0))
    assert run("ingest", "--store", tmp / "store", "--job", "j", path)[0] == 0
    return tmp / "store"


def _critical_path(store: Path) -> tuple[dict, str]:
    code, out, _ = run("critical-path", store, "--json")
    assert code == 0
    report = json.loads(out)
    (gap,) = [w for w in report["warnings"] if "unexplained_gap" in w]
    return {s["step"]: s["by_kind"] for s in report["steps"]}, gap


def test_projected_path_names_the_queued_gap_with_critical_paths_warning(
        gap_store: Path, tmp_path: Path) -> None:
    by_kind, warning = _critical_path(gap_store)
    chrome = tmp_path / "p.json"
    code, out, err = run("replay", gap_store, "--json", "--chrome-trace", chrome)
    assert code == 0, err
    report = json.loads(out)
    # identity: the projected path is the measured one, kind for kind
    assert {s["step"]: s["critical_path_ns"] for s in report["steps"]} == by_kind
    assert by_kind[1]["unexplained_gap"] == 120_000_000
    assert by_kind[2]["unexplained_gap"] == 2_000_000
    assert [n for n in report["notes"] if "unexplained_gap" in n] == [warning]
    # the Chrome trace's path names the same segments
    events = json.loads(chrome.read_text())["traceEvents"]
    gaps = [e for e in events if e.get("cat") == "critical_path"
            and e["name"].startswith("unexplained_gap")]
    assert sorted(round(e["dur"] * 1000) for e in gaps) == [2_000_000, 120_000_000]
    # the text: the note once, and the path's share
    code, out, _ = run("replay", gap_store)
    assert code == 0
    assert [ln for ln in out.splitlines() if "unexplained_gap" in ln] == [
        f"note: {warning}",
        "projected critical path: cpu 66%, unexplained_gap 31%, idle_wait 3%, compute 0%, "
        "launch_overhead 0%"]


def test_a_what_if_keeps_the_gap_and_its_warning(gap_store: Path) -> None:
    """Kernels twice as fast: the queued gaps are no GPU work, they stay as measured."""
    code, out, err = run("replay", gap_store, "--json", "--speedup", "name~kernel=2")
    assert code == 0, err
    report = json.loads(out)
    assert [s["critical_path_ns"]["unexplained_gap"] for s in report["steps"]] == [
        120_000_000, 2_000_000]
    (note,) = [n for n in report["notes"] if "unexplained_gap" in n]
    assert note.startswith("122.000 ms of the critical path")


def test_no_gap_no_note(tmp_path: Path) -> None:
    """The 120 ms gap cut to 0.9 ms (under the 1 ms floor): no such segment, no note."""
    ev = [e for e in _queued_gap_trace() if e["ts"] < 200_000]
    for e in ev:
        if e["name"] in ("kernel_b", "kernel_c", "cudaLaunchKernel") and e["ts"] > 1_000:
            e["ts"] -= 119_100
        if e["name"] == "cudaDeviceSynchronize":
            e["dur"] -= 119_100
    path = write(tmp_path / "short.json", kineto_text(ev, rank=0))
    assert run("ingest", "--store", tmp_path / "s", "--job", "j", path)[0] == 0
    code, out, _ = run("replay", tmp_path / "s", "--json")
    assert code == 0
    report = json.loads(out)
    assert all("unexplained_gap" not in s["critical_path_ns"] for s in report["steps"])
    assert not [n for n in report["notes"] if "unexplained_gap" in n]


@corpus
@pytest.mark.parametrize(("trace", "gap_ns", "idle_gap_ns"), [
    (VLLM, 7_836_601, 7_826_151), (SGLANG, 463_257_096, 463_251_758)])
def test_vllm_and_sglang_projected_gap_is_critical_paths(tmp_path: Path, trace: Path,
                                                          gap_ns: int, idle_gap_ns: int
                                                          ) -> None:
    assert run("ingest", "--store", tmp_path / "s", "--job", "j", trace)[0] == 0
    by_kind, warning = _critical_path(tmp_path / "s")
    code, out, err = run("replay", tmp_path / "s", "--json")
    assert code == 0, err
    report = json.loads(out)
    (step,) = report["steps"]
    assert step["critical_path_ns"] == by_kind[None]
    assert step["critical_path_ns"]["unexplained_gap"] == gap_ns
    assert "launch_overhead" not in step["critical_path_ns"] or (
        step["critical_path_ns"]["launch_overhead"] < 100_000)
    assert [n for n in report["notes"] if "unexplained_gap" in n] == [warning]
    # the breakdown's: the view's wait from the launch call's end, its GPU-idle part
    (view,), = tracetool.connect(tmp_path / "s").execute(
        "SELECT sum(idle_ns) FROM gpu_wait_gaps").fetchall()
    assert step["measured_breakdown_ns"]["unexplained_gap_ns"] == view == idle_gap_ns


def test_the_breakdown_splits_the_gap_out_of_idle_as_step_breakdown(gap_store: Path,
                                                                    tmp_path: Path) -> None:
    """measured and projected breakdowns: unexplained_gap_ns, part of idle, equal to
    step_breakdown's (identity), kept under a speedup; the text says it, the plot stacks it."""
    con = tracetool.connect(gap_store)
    view = dict(con.execute("SELECT step, unexplained_gap_ns FROM step_breakdown").fetchall())
    assert view == {1: 120_000_000, 2: 2_000_000}
    code, out, _ = run("replay", gap_store, "--json", "--speedup", "name~kernel=2")
    assert code == 0
    for s in json.loads(out)["steps"]:
        assert s["measured_breakdown_ns"]["unexplained_gap_ns"] == view[s["step"]]
        assert s["projected_breakdown_ns"]["unexplained_gap_ns"] == view[s["step"]]
        assert s["projected_breakdown_ns"]["idle"] > view[s["step"]]
    code, out, _ = run("replay", gap_store)
    assert [ln.split(", of which ")[1] for ln in out.splitlines() if "breakdown" in ln] == [
        "unexplained gap 61.000 ms"] * 2  # the mean step: (120 + 2) / 2
    result = Replayer.from_store(con, "j").run()
    fig = plot_replay(result, tmp_path / "p.png")
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-1] == "unexplained gap (GPU idle, work queued)"
    pink = [p for p in ax.patches if p.get_facecolor()[:3] == (0xe3 / 255, 0x77 / 255,
                                                                0xc2 / 255)]
    assert sorted(round(p.get_height(), 6) for p in pink) == [2.0, 2.0, 120.0, 120.0]
