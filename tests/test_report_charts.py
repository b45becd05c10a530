"""The report draws its charts in a child process (``analysis/charts.py``): the same
pictures as drawn in-process, a failing chart is one clear error, and a user's script that
calls the report without a ``__main__`` guard runs once (a multiprocessing child would run
it again)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracetool.analysis.charts import (
    ChartDrawer,
    ChartError,
    draw_skew,
    draw_top,
    drawing_command,
)
from tracetool.ingest.pipeline import Options, ingest

from ._util import REPO, SAMPLES, run


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("charts") / "store"
    ingest([SAMPLES], Options(s, job="gloo"))
    return s


def test_a_chart_drawn_in_the_child_equals_one_drawn_here(tmp_path: Path) -> None:
    grid = np.array([[0.0, 1.5, np.nan], [2.0, 0.0, 0.25]])
    draw_skew("j", [0, 1], grid, tmp_path / "here.png")
    with ChartDrawer() as d:
        d.draw(draw_skew, "j", [0, 1], grid, tmp_path / "child.png")
        d.wait()
    assert (tmp_path / "child.png").read_bytes() == (tmp_path / "here.png").read_bytes()


def test_the_drawing_process_starts_without_duckdb_or_pyarrow() -> None:
    """It draws from plain data, so it must not pay for the store's libraries (0.1 s of
    a core the report's queries need): Python lists each module it imports on stderr."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(drawing_command(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "matplotlib.figure" in imported  # the child did start and import its charting
    assert not {m for m in imported if m.split(".")[0] in ("duckdb", "pyarrow", "polars")}


def test_a_failing_chart_is_one_error_naming_it(tmp_path: Path) -> None:
    with ChartDrawer() as d:
        d.draw(draw_top, "j", {"what": "kernels", "rows": [{"name": "k"}]},  # no total_ns
               tmp_path / "top.png")
        with pytest.raises(ChartError, match=r"^draw_top: KeyError: 'total_ns'$"):
            d.wait()


def test_only_the_charts_are_sent_to_the_child() -> None:
    with ChartDrawer() as d, pytest.raises(ValueError, match="not one of the charts"):
        d.draw(print, "hello")


def test_report_from_a_script_without_a_main_guard_runs_it_once(store: Path,
                                                                 tmp_path: Path) -> None:
    ran = tmp_path / "ran.txt"
    script = tmp_path / "notebook_like.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(REPO)!r})
with open({str(ran)!r}, "a") as f:
    f.write("ran\\n")
import tracetool
from tracetool.analysis.report import make_report
make_report(tracetool.connect({str(store)!r}), "gloo", {str(tmp_path / "out")!r})
""")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert ran.read_text() == "ran\n"
    assert (tmp_path / "out" / "breakdown.png").stat().st_size > 5_000
    assert (tmp_path / "out" / "critical_path.png").stat().st_size > 5_000


def test_report_cli_draws_every_chart_it_lists(store: Path, tmp_path: Path) -> None:
    import json

    code, out, err = run("report", store, "--out", tmp_path / "r", "--json")
    assert code == 0, err
    files = json.loads(out)["files"]
    pngs = [Path(f) for k, f in files.items() if f.endswith(".png")]
    assert {p.name for p in pngs} == {"breakdown.png", "top_cpu_ops.png",
                                      "collective_skew.png", "critical_path.png",
                                      "step_timeline.png"}
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5_000


def test_charts_of_1024_ranks_stay_readable_sizes(tmp_path: Path) -> None:
    """A 1,024-rank job: the skew chart is not 360 inches tall and neither axis of ranks
    carries 1,024 overlapping labels (every k-th rank is labelled)."""
    from PIL import Image

    from tracetool.analysis.charts import MOST_INCHES, MOST_LABELS, _every, draw_breakdown

    rows = [{"rank": r, "compute_ns": 1e6, "exposed_comm_ns": 2e5, "exposed_memcpy_ns": 0,
             "idle_ns": 1e5} for r in range(1024)]
    draw_breakdown("j", rows, False, tmp_path / "b.png")
    draw_skew("j", list(range(1024)), np.random.default_rng(0).random((1024, 15)),
              tmp_path / "s.png")
    assert Image.open(tmp_path / "s.png").size[1] <= MOST_INCHES * 100 + 100
    assert Image.open(tmp_path / "b.png").size[0] <= 20 * 100 + 300
    shown = _every(1024)
    assert len(shown) <= MOST_LABELS and shown[:2] == [0, 26] and _every(8) == list(range(8))
