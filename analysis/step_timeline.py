"""The report's step timeline: one step of a rank (and of the slowest rank), lane by lane.

The picture a user otherwise builds in Perfetto by hand: every CPU thread and GPU stream of
the chosen ranks as a lane over one job step, GPU ops coloured by kernel category
(``tracetool.palette``), CPU ops (the outer two levels of nesting) in the CPU colour, and
the step's critical path drawn over the lanes it ran on. The step is the complete job step
of median duration (a typical one, not an outlier); the ranks are the lowest and the one
whose step was longest. The same window is written as a Chrome trace beside the picture
(``chrome_trace.write_path_trace``), to open in Perfetto. Drawn by ``charts.draw_step_timeline``
from ``timeline_data``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np


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


# The bars of the chosen ranks in the step window; lane: CPU threads before GPU streams,
# per rank, numbered from 0 down the chart.
_BARS_SQL = """
SELECT e.rank, e.track_id, coalesce(t.thread_name, t.tid_raw) AS lane_name,
       dense_rank() OVER (ORDER BY e.rank, t.track_kind <> 'cpu_thread', e.track_id) - 1
           AS lane,
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


def timeline_data(con: duckdb.DuckDBPyConnection, job: str, choice: StepChoice,
                  path_rel: duckdb.DuckDBPyRelation | None) -> dict[str, Any]:
    """What ``charts.draw_step_timeline`` draws, as plain data: per bar its lane, start and
    end (ms since the step's start, cut to the step), depth and category; the lanes (rank,
    name), top to bottom; the path's segments on those lanes."""
    params = {"job": job, "ranks": choice.ranks, "start": choice.start_ns,
              "end": choice.end_ns}
    bars = con.execute(_BARS_SQL, params).fetchnumpy()
    _, first = np.unique(bars["lane"], return_index=True)  # lanes are 0..n-1, in order
    lanes = [(int(bars["rank"][i]), int(bars["track_id"][i]), str(bars["lane_name"][i]))
             for i in first]
    index = {(r, t): i for i, (r, t, _) in enumerate(lanes)}
    ms = lambda ns: (np.asarray(ns, dtype=float) - choice.start_ns) / 1e6  # noqa: E731
    on: list[tuple[int, int, int]] = []
    if path_rel is not None:
        segs = path_rel.filter(f"step = {choice.step} AND rank IS NOT NULL AND "
                               "track_id IS NOT NULL").project(
            "rank, track_id, start_ns, end_ns").fetchall()
        on = [(index[(r, t)], a, b) for r, t, a, b in segs if (r, t) in index]
    path = np.array(on, dtype=np.int64).reshape(-1, 3)
    shown = " and ".join(f"rank {r}" for r in choice.ranks)
    return {"lane": bars["lane"].astype(float), "x0": ms(bars["a"]), "x1": ms(bars["b"]),
            "depth": np.asarray(bars["depth"]), "what": np.asarray(bars["what"], dtype=str),
            "lanes": [(r, n) for r, _, n in lanes],
            "path_lane": path[:, 0].astype(float), "path_x0": ms(path[:, 1]),
            "path_x1": ms(path[:, 2]), "span_ms": (choice.end_ns - choice.start_ns) / 1e6,
            "xlabel": f"ms since the start of job step {choice.step}",
            "title": f"{job}: step {choice.step} (the median step), {shown}"
                     + (f" (the slowest: {choice.why})" if len(choice.ranks) > 1 else "")}
