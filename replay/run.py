"""Replaying a job under a scenario: projected step times, breakdown, critical path, band.

``Replayer(graph)`` holds one built graph; ``run(scenario)`` re-weights its edges
(``model.weights``), schedules it (``simulate.schedule``) and reads the results off the
projected timeline, so a sweep of many scenarios builds the graph once.

Steps are the analysis views' (``steps`` per rank, ``job_steps`` across ranks; docs/steps.md):
``step_windows`` tiles any timeline by the same rules, so on the measured timeline it gives
exactly the views' times, and on the projected one the projected steps. The measured step of
a result is the job step; its breakdown is the mean over ranks of step_breakdown, made of the
same events (the view breakdown_events). A job without ProfilerStep is one window: its first
event's start to its last event's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import numpy as np

from tracetool.analysis.critical_path import (
    CLASSES,
    SEGMENT_KINDS,
    PathGraph,
    PathWalker,
)
from tracetool.numbers import round_ns

from .graph import NO_STEP, ReplayGraph, build_graph
from .model import Scenario, weights
from .simulate import binding_edges, schedule

# step_breakdown's partition of a rank's step (its columns without _ns): these add up to it
BREAKDOWN = ("compute", "exposed_comm", "exposed_memcpy", "idle")
_COMPUTE, _COMM, _MEMCPY = (CLASSES.index(c) for c in ("compute", "comm", "memcpy"))


@dataclass
class StepResult:
    step: int | None  # None: a job without ProfilerStep, replayed as one window
    measured_ns: int
    projected_ns: int
    low_ns: int
    high_ns: int
    # breakdown: BREAKDOWN + comm_ns + dur_ns (the rank's step), mean over the ranks' steps
    measured: dict[str, int]
    projected: dict[str, int]
    critical_path: dict[str, int]  # projected path: ns per segment kind
    start_ns: int  # projected window, ns since the epoch
    end_ns: int
    complete: bool = True  # job_steps.complete of the measured step

    @property
    def error(self) -> float:
        return self.projected_ns / self.measured_ns - 1 if self.measured_ns else 0.0


@dataclass
class ReplayResult:
    job: str
    scenario: str
    steps: list[StepResult]
    times_ns: np.ndarray  # projected time of every node, ns since the epoch
    notes: list[str] = field(default_factory=list)
    # the projected critical path, one dict per segment in time order: step, seq, rank
    # (None for filler), eid (None for idle), kind (SEGMENT_KINDS), start_ns, end_ns
    path: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"job": self.job, "scenario": self.scenario, "notes": self.notes,
                "steps": [{
                    "step": s.step, "complete": s.complete, "measured_step_ns": s.measured_ns,
                    "projected_step_ns": s.projected_ns, "low_ns": s.low_ns,
                    "high_ns": s.high_ns, "error": s.error,
                    "measured_breakdown_ns": s.measured,
                    "projected_breakdown_ns": s.projected,
                    "critical_path_ns": s.critical_path} for s in self.steps]}


class Replayer:
    """One job's graph, replayed under any number of scenarios."""

    def __init__(self, graph: ReplayGraph) -> None:
        self.graph = graph
        bd = graph.breakdown
        order = np.lexsort((bd["slot"], graph.rank[bd["slot"]]))
        self._iv_slot, self._iv_what = bd["slot"][order], bd["what"][order]
        iv_rank = graph.rank[self._iv_slot]
        ranks, first = np.unique(iv_rank, return_index=True)
        bounds = np.append(first, len(iv_rank))
        self._iv_range = {int(r): (int(bounds[i]), int(bounds[i + 1]))
                          for i, r in enumerate(ranks)}
        self.measured = step_windows(graph, graph.t0)

    @classmethod
    def from_store(cls, con: duckdb.DuckDBPyConnection, job: str) -> Replayer:
        return cls(build_graph(con, job))

    def run(self, scenario: Scenario | None = None, *, critical_path: bool = True,
            breakdown: bool = True, include_incomplete: bool = False) -> ReplayResult:
        """Project every complete job step under ``scenario`` (identity if None; every step
        with ``include_incomplete``)."""
        scenario = scenario or Scenario()
        g = self.graph
        wts = weights(g, scenario)
        t = schedule(g.order, g.indptr, g.src, wts.w, g.t0)
        m, p = self.measured, step_windows(g, t)
        if np.array_equal(wts.w, wts.w_alt):
            alt = p.job_end - p.job_start
        else:
            a = step_windows(g, schedule(g.order, g.indptr, g.src, wts.w_alt, g.t0))
            alt = a.job_end - a.job_start
        low, high = self._band(np.where(g.step_complete, m.job_end - m.job_start, np.nan),
                               p.job_end - p.job_start, alt)
        path, segments = (self._path(t, wts.w, p.job_start, p.job_end) if critical_path
                          else (None, []))
        steps = []
        for i, s in enumerate(g.steps):
            if not (g.step_complete[i] or include_incomplete):
                continue
            if not np.isfinite(m.job_start[i]) or not np.isfinite(m.job_end[i]):
                continue
            mb = self._breakdown(g.t0, m, i) if breakdown else {}
            pb = self._breakdown(t, p, i) if breakdown else {}
            meas = int(round(m.job_end[i] - m.job_start[i]))
            proj = int(round(p.job_end[i] - p.job_start[i]))
            steps.append(StepResult(
                step=None if s == NO_STEP else int(s), measured_ns=meas, projected_ns=proj,
                low_ns=int(round(low[i])), high_ns=int(round(high[i])),
                measured=mb, projected=pb, critical_path=path[i] if path else {},
                start_ns=int(round(p.job_start[i])) + g.origin_ns,
                end_ns=int(round(p.job_end[i])) + g.origin_ns,
                complete=bool(g.step_complete[i])))
        times = np.round(t).astype(np.int64) + g.origin_ns
        return ReplayResult(job=g.job, scenario=scenario.label, steps=steps, times_ns=times,
                            notes=wts.notes, path=segments)

    def _band(self, measured: np.ndarray, projected: np.ndarray, alt: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) per step: the two calibrations' projections (``model.Weights``)
        bracket the model part (nothing for the identity); the job's own step-to-step
        variation (coefficient of variation of the measured step times) widens it both
        ways, since a projection of one step cannot be surer than the steps repeat."""
        ok = np.isfinite(measured) & (measured > 0)
        m = measured[ok]
        u_steps = float(np.std(m, ddof=1) / np.mean(m)) if len(m) > 1 else 0.0
        lo, hi = np.minimum(projected, alt), np.maximum(projected, alt)
        return lo - u_steps * projected, hi + u_steps * projected

    def _breakdown(self, t: np.ndarray, w: StepWindows, i: int) -> dict[str, int]:
        """Mean over the ranks of job step ``i`` of step_breakdown's partition of each rank's
        step (compute, exposed comm, exposed memcpy, idle; plus comm_ns and the step's
        dur_ns), from the breakdown_events on timeline ``t``."""
        g = self.graph
        rows = np.flatnonzero(g.rank_steps["step_idx"] == i) if len(w.rank_start) else []
        windows = ([(int(g.rank_steps["rank"][r]), w.rank_start[r], w.rank_end[r])
                    for r in rows] if len(rows)
                   else [(int(r), w.job_start[i], w.job_end[i]) for r in g.ranks])
        acc = dict.fromkeys((*BREAKDOWN, "comm", "dur"), 0.0)
        for rank, a, b in windows:
            lo, hi = self._iv_range.get(rank, (0, 0))
            sl = self._iv_slot[lo:hi]
            s, e = t[2 * sl], t[2 * sl + 1]
            inside = (e > a) & (s < b)
            s, e = np.maximum(s[inside], a), np.minimum(e[inside], b)
            what = self._iv_what[lo:hi][inside]
            compute = _union(s[what == _COMPUTE], e[what == _COMPUTE])
            either = _union(s[what != _MEMCPY], e[what != _MEMCPY])
            busy = _union(s, e)
            acc["compute"] += compute
            acc["exposed_comm"] += either - compute
            acc["exposed_memcpy"] += busy - either
            acc["idle"] += (b - a) - busy
            acc["comm"] += _union(s[what == _COMM], e[what == _COMM])
            acc["dur"] += b - a
        n = max(len(windows), 1)
        out = {k: round_ns(acc[k] / n) for k in BREAKDOWN}
        out["comm_ns"] = round_ns(acc["comm"] / n)
        out["dur_ns"] = round_ns(acc["dur"] / n)
        return out

    def _path(self, t: np.ndarray, w: np.ndarray, start: np.ndarray, end: np.ndarray
              ) -> tuple[list[dict[str, int]], list[dict]]:
        """Critical path of each projected step: ns per segment kind, and the segments (see
        ReplayResult.path). The backward walk of tracetool.analysis.critical_path over the
        edges that set each projected time."""
        g = self.graph
        edge = binding_edges(g.indptr, g.src, w, g.kind, t)
        has = edge >= 0
        ti = np.round(t).astype(np.int64)
        ev = np.arange(g.n_event_slots)
        ev = ev[g.rank[ev] >= 0]
        ends = 2 * ev + 1
        ends = ends[np.lexsort((g.eid[ev], g.rank[ev], g.is_gpu[ev], ti[ends]))]
        pred = np.where(has, g.src[np.maximum(edge, 0)], -1)
        # an edge with a negative weight (a wait that ended just before its transfer's
        # recorded end) points forward in time: follow its source's own binding chain back
        # to the first point at or before the waiting one, so the path stays contiguous
        late = np.flatnonzero((pred >= 0) & (ti[np.maximum(pred, 0)] > ti))
        for _ in range(64):
            if len(late) == 0:
                break
            pred[late] = pred[pred[late]]
            late = late[(pred[late] >= 0) & (ti[np.maximum(pred[late], 0)] > ti[late])]
        pg = PathGraph(t=ti, pred=pred,
                       pred_kind=np.where(has, g.kind[np.maximum(edge, 0)], -1).astype(np.int8),
                       ends=ends, rank=g.rank, eid=g.eid, track=g.track, cls=g.cls,
                       parent=g.parent)
        walker = PathWalker(pg)
        out, segments = [], []
        for step, a, b in zip(g.steps.tolist(), start, end, strict=True):
            if not (np.isfinite(a) and np.isfinite(b)):
                out.append({})
                continue
            seg = walker.walk(int(round(a)), int(round(b)))
            dur = seg["end"] - seg["start"]
            out.append({k: int(dur[seg["kind"] == i].sum()) for i, k in enumerate(SEGMENT_KINDS)
                        if (seg["kind"] == i).any()})
            for i in range(len(dur)):
                loc, attr = int(seg["loc"][i]), int(seg["attr"][i])
                rank = int(g.rank[loc]) if 0 <= loc < g.n_event_slots else -1
                segments.append({
                    "step": None if step == NO_STEP else step, "seq": i,
                    "rank": rank if rank >= 0 else None,
                    "eid": int(g.eid[attr]) if 0 <= attr < g.n_event_slots else None,
                    "kind": SEGMENT_KINDS[seg["kind"][i]],
                    "start_ns": int(seg["start"][i]) + g.origin_ns,
                    "end_ns": int(seg["end"][i]) + g.origin_ns})
        return out, segments


@dataclass
class StepWindows:
    """Steps tiled on one timeline (relative ns): per graph.rank_steps row the rank's step,
    per graph.steps entry the job step (NaN/inf where a step has no points)."""

    rank_start: np.ndarray
    rank_end: np.ndarray
    job_start: np.ndarray
    job_end: np.ndarray


def step_windows(g: ReplayGraph, t: np.ndarray) -> StepWindows:
    """The steps and job_steps views' tiling (analysis/sql/05_steps.sql) on timeline ``t``:
    per rank, each step starts at its start point, never before the previous step's start,
    and ends where the next starts (the last at its latest point); a job step starts where
    the last rank starts it (the first: the earliest rank) and ends where the next starts
    (the last: the latest rank's end)."""
    rs = g.rank_steps
    n = len(rs["rank"])
    if n == 0:  # no ProfilerStep: one window over every event
        ev = np.arange(g.n_event_slots)
        ev = ev[g.rank[ev] >= 0]
        a = np.array([t[2 * ev].min()]) if len(ev) else np.array([np.inf])
        b = np.array([t[2 * ev + 1].max()]) if len(ev) else np.array([-np.inf])
        return StepWindows(np.zeros(0), np.zeros(0), a, b)
    node = rs["start_node"]
    raw = np.where(node >= 0, t[np.maximum(node, 0)], rs["start_fixed"])
    last_end = np.full(n, -np.inf)
    np.maximum.at(last_end, rs["end_row"], t[rs["end_node"]])
    rank_start, rank_end = _tile(rs["rank"], raw, last_end)
    k, idx = len(g.steps), rs["step_idx"]
    first, latest, ends = np.full(k, np.inf), np.full(k, -np.inf), np.full(k, -np.inf)
    np.minimum.at(first, idx, rank_start)
    np.maximum.at(latest, idx, rank_start)
    np.maximum.at(ends, idx, rank_end)
    raw_job = np.where(np.arange(k) == 0, first, latest)
    job_start, job_end = _tile(np.zeros(k, dtype=np.int64), raw_job, ends)
    return StepWindows(rank_start, rank_end, job_start, job_end)


def _tile(group: np.ndarray, raw: np.ndarray, last_end: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by group (then step): start = running max of ``raw`` within the group,
    end = the next row's start, the group's last row: max(its start, ``last_end``)."""
    start = raw.astype(np.float64)
    cuts = np.flatnonzero(np.diff(group)) + 1
    for seg in np.split(np.arange(len(raw)), cuts):
        start[seg] = np.maximum.accumulate(start[seg])
    end = np.empty_like(start)
    end[:-1] = start[1:]
    is_last = np.ones(len(start), dtype=bool)
    is_last[:-1] = group[1:] != group[:-1]
    end[is_last] = np.maximum(start[is_last], last_end[is_last])
    return start, end


def _union(s: np.ndarray, e: np.ndarray) -> float:
    """Length of the union of intervals [s, e): sorted by start, each adds what it reaches
    beyond the furthest end before it."""
    if len(s) == 0:
        return 0.0
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    reach = np.concatenate([[-math.inf], np.maximum.accumulate(e)[:-1]])
    return float(np.maximum(0.0, e - np.maximum(s, reach)).sum())


def replay(con: duckdb.DuckDBPyConnection, job: str, scenario: Scenario | None = None
           ) -> ReplayResult:
    """Build ``job``'s graph from the store on ``con`` and replay it under ``scenario``."""
    return Replayer.from_store(con, job).run(scenario)
