"""The report's step timeline: one step of a rank (and of the slowest rank), lane by lane.

The picture a user otherwise builds in Perfetto by hand: every CPU thread and GPU stream of
the chosen ranks as a lane over one job step, GPU ops coloured by kernel category
(``tracetool.palette``), CPU ops (the outer two levels of nesting) in the CPU colour, and
the step's critical path drawn over the lanes it ran on. The step is the complete job step
of median duration (a typical one, not an outlier); the ranks are the lowest and the one
whose step was longest. The same window is written as a Chrome trace beside the picture
(``chrome_trace.write_path_trace``), to open in Perfetto.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from tracetool.palette import colour


@dataclass
class StepChoice:
    step: int
    start_ns: int
    end_ns: int
    ranks: list[int]  # the lowest rank, then the one that decided the step (when another)
    why: str  # how the second rank was chosen


def choose_step(con: duckdb.DuckDBPyConnection, job: str,
                path: duckdb.DuckDBPyRelation | None = None) -> StepChoice | None:
    """The complete job step of median duration and the ranks to show, or None (no step):
    the lowest rank and the slowest one, which is the rank holding most of the step's
    critical path when ``path`` has it (the rank the others waited for), else the rank whose
    step took longest."""
    rows = con.execute("""SELECT step, start_ns, end_ns FROM job_steps
                          WHERE job = ? AND complete ORDER BY dur_ns, step""", [job]).fetchall()
    if not rows:
        return None
    step, start, end = rows[(len(rows) - 1) // 2]
    first, longest = con.execute(
        "SELECT min(rank), arg_max(rank, dur_ns) FROM steps WHERE job = ? AND step = ?",
        [job, step]).fetchall()[0]
    slowest, why = longest, "its step took longest"
    if path is not None:
        held = path.filter(f"step = {int(step)} AND rank IS NOT NULL").aggregate(
            "rank, sum(dur_ns) AS ns", "rank").order("ns DESC, rank").limit(1).fetchall()
        if held:
            slowest, why = held[0][0], "it holds most of the step's critical path"
    ranks = [int(r) for r in dict.fromkeys([first, slowest]) if r is not None]
    return StepChoice(int(step), int(start), int(end), ranks, why)


_BARS_SQL = """
SELECT e.rank, e.track_id, t.track_kind, coalesce(t.thread_name, t.tid_raw) AS lane_name,
       greatest(e.ts_ns, $start) AS a, least(e.end_ns, $end) AS b, coalesce(e.depth, 0) AS depth,
       CASE WHEN g.eid IS NULL THEN 'cpu' WHEN g.kind IN ('memcpy', 'memset') THEN 'memcpy'
            ELSE coalesce(k.category, 'other') END AS what
FROM events e
JOIN tracks t ON t.job = e.job AND t.rank = e.rank AND t.track_id = e.track_id
LEFT JOIN gpu_ops g ON g.job = e.job AND g.rank = e.rank AND g.eid = e.eid
LEFT JOIN kernels k ON k.job = e.job AND k.rank = e.rank AND k.eid = e.eid
WHERE e.job = $job AND list_contains($ranks, e.rank) AND e.ph = 'X'
  AND e.ts_ns < $end AND e.end_ns > $start
  AND (t.track_kind = 'gpu_stream'
       OR (t.track_kind = 'cpu_thread' AND coalesce(e.depth, 0) <= 1 AND g.eid IS NULL))
"""


def chart_step_timeline(con: duckdb.DuckDBPyConnection, job: str, choice: StepChoice,
                        path_rel: duckdb.DuckDBPyRelation | None, out: Path) -> Any:
    """Draw the step's lanes into ``out`` (PNG); returns the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    params = {"job": job, "ranks": choice.ranks, "start": choice.start_ns,
              "end": choice.end_ns}
    bars = con.execute(_BARS_SQL, params).fetchnumpy()
    lanes = sorted({(int(r), 0 if k == "cpu_thread" else 1, int(t), str(n))
                    for r, k, t, n in zip(bars["rank"], bars["track_kind"], bars["track_id"],
                                          bars["lane_name"], strict=True)})
    index = {(r, t): i for i, (r, _, t, _) in enumerate(lanes)}
    lane = np.array([index[(int(r), int(t))] for r, t in zip(bars["rank"], bars["track_id"],
                                                             strict=True)], dtype=float)
    fig = Figure(figsize=(13, max(3.0, 0.42 * len(lanes) + 1.6)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ms = lambda ns: (np.asarray(ns, dtype=float) - choice.start_ns) / 1e6  # noqa: E731
    x0, x1 = ms(bars["a"]), ms(bars["b"])
    # CPU ops: the outer level full height, what they call half height below it
    h = np.where((bars["what"] == "cpu") & (bars["depth"] > 0), 0.35, 0.7)
    y0 = np.where(h < 0.7, lane, lane - 0.35)
    whats = list(dict.fromkeys(bars["what"].tolist()))
    for w in whats:
        m = bars["what"] == w
        verts = np.stack([np.stack([x0[m], y0[m]], 1), np.stack([x0[m], y0[m] + h[m]], 1),
                          np.stack([x1[m], y0[m] + h[m]], 1), np.stack([x1[m], y0[m]], 1)], 1)
        ax.add_collection(PolyCollection(verts, facecolors=colour(w), linewidths=0,
                                         alpha=0.55 if w == "cpu" else 1.0))
    handles = [Patch(color=colour(w), label=w) for w in whats]
    if path_rel is not None:
        segs = path_rel.filter(f"step = {choice.step}").project(
            "rank, track_id, start_ns, end_ns").fetchnumpy()
        on = [(index.get((int(r), int(t))), a, b) for r, t, a, b in zip(
            segs["rank"], segs["track_id"], segs["start_ns"], segs["end_ns"], strict=True)
            if r is not None and t is not None and (int(r), int(t)) in index]
        if on:  # the path: a black line under the lane it ran on, one artist for all
            ax.add_collection(LineCollection(
                [[(ms(a), i + 0.42), (ms(b), i + 0.42)] for i, a, b in on], colors="black",
                linewidths=2.2, capstyle="butt"))
            handles.append(Patch(color="black", label="critical path"))
    ax.set_xlim(0, (choice.end_ns - choice.start_ns) / 1e6)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(lanes)), [f"rank {r} · {n}"[:48] for r, _, _, n in lanes],
                  fontsize=8)
    ax.set_xlabel(f"ms since the start of job step {choice.step}")
    shown = " and ".join(f"rank {r}" for r in choice.ranks)
    ax.set_title(f"{job}: step {choice.step} (the median step), {shown}"
                 + (f" (the slowest: {choice.why})" if len(choice.ranks) > 1 else ""),
                 fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.savefig(out, bbox_inches="tight")
    return fig
