"""Report lines that were noise (issue 26, from the last session's "noticed, left"): one
"Left out" line for every incomplete step, and the "could not be aligned" warning for a
process group with a single call per rank, where there is nothing to align."""

from __future__ import annotations

from pathlib import Path

from tracetool.analysis.report import _left_out

from ._util import kineto_text, run, write, x


def _row(step: int, reason: str) -> dict:
    return {"step": step, "incomplete_reason": reason, "dur_ns": 2_500_000, "n_ranks": 4}


def test_left_out_is_one_line_with_the_count_and_the_steps() -> None:
    assert _left_out([]) is None
    assert _left_out([_row(9, "cut")]) == (
        "Left out: step 9 (cut, 2.500 ms on 4 ranks); include it with --include-incomplete.")
    rows = [_row(n, "clocks_disagree") for n in (2, 3, 4, 5, 7)] + [_row(9, "cut")]
    assert _left_out(rows) == (
        "Left out: 6 incomplete job steps, steps 2-5, 7 (clocks_disagree), step 9 (cut); "
        "include them with --include-incomplete.")


def _rank(r: int, calls: int) -> list[dict]:
    """A step with a gemm and ``calls`` user all-reduce kernels (--comm-kernel)."""
    rt = dict(cat="cuda_runtime")
    k = dict(cat="kernel", pid=0, tid=7, device=0, stream=7)
    ev = [x("ProfilerStep#1", 0, 2000, cat="user_annotation"),
          x("cudaLaunchKernel", 10, 5, correlation=1, **rt),
          x("gemm_kernel", 20, 100, correlation=1, **k)]
    for i in range(calls):
        t = 200 + 400 * i
        ev += [x("cudaLaunchKernel", t, 5, correlation=2 + i, **rt),
               x("my_allreduce_kernel", t + 10 + 30 * r, 300, correlation=2 + i, **k)]
    return ev + [x("ProfilerStep#2", 2000, 1000, cat="user_annotation")]


def _warnings(tmp: Path, calls: dict[int, int]) -> list[str]:
    paths = [write(tmp / f"r{r}.json", kineto_text(_rank(r, n), rank=r))
             for r, n in calls.items()]
    code, _, err = run("ingest", "--store", tmp / "s", "--job", "u", "--comm-kernel",
                       "my_allreduce=allreduce", *paths)
    assert code == 0, err
    code, _, err = run("report", tmp / "s", "--out", tmp / "rep")
    assert code == 0
    return [ln for ln in err.splitlines() if "kernel:user" in ln]


def test_a_single_call_per_rank_is_no_alignment_to_warn_about(tmp_path: Path) -> None:
    assert _warnings(tmp_path, {0: 1, 1: 1}) == []


def test_a_single_call_against_several_still_warns(tmp_path: Path) -> None:
    lines = _warnings(tmp_path, {0: 1, 1: 3})
    assert any("the calls of rank 1 could not be aligned to rank 0's" in ln for ln in lines)
