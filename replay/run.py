"""Replaying a job under a scenario: projected step times, breakdown, critical path, band.

``Replayer(graph)`` holds one built graph; ``run(scenario)`` re-weights its edges
(``model.weights``), schedules it (``simulate.schedule``) and reads the results off the
projected timeline, so a sweep of many scenarios builds the graph once.

A step of a job is, as everywhere in tracetool, the window from the earliest ProfilerStep#N
start over ranks to the latest end of its annotation or of a GPU op launched inside it; the
projected step is the same window on the projected timeline. A job without ProfilerStep is
one window: its first event's start to its last event's end.
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

from .graph import NO_STEP, ReplayGraph, build_graph
from .model import Scenario, weights
from .simulate import binding_edges, schedule

BREAKDOWN = ("compute", "memcpy", "exposed_comm", "idle")  # these add up to the step time
_COMPUTE, _COMM, _MEMCPY = (CLASSES.index(c) for c in ("compute", "comm", "memcpy"))


@dataclass
class StepResult:
    step: int | None  # None: a job without ProfilerStep, replayed as one window
    measured_ns: int
    projected_ns: int
    low_ns: int
    high_ns: int
    measured: dict[str, int]  # breakdown (BREAKDOWN + comm_ns), mean over ranks
    projected: dict[str, int]
    critical_path: dict[str, int]  # projected path: ns per segment kind
    start_ns: int  # projected window, ns since the epoch
    end_ns: int

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
                    "step": s.step, "measured_step_ns": s.measured_ns,
                    "projected_step_ns": s.projected_ns, "low_ns": s.low_ns,
                    "high_ns": s.high_ns, "error": s.error,
                    "measured_breakdown_ns": s.measured,
                    "projected_breakdown_ns": s.projected,
                    "critical_path_ns": s.critical_path} for s in self.steps]}


class Replayer:
    """One job's graph, replayed under any number of scenarios."""

    def __init__(self, graph: ReplayGraph) -> None:
        self.graph = graph
        g = graph
        ev = np.arange(g.n_event_slots)
        has_gpu = np.zeros(int(g.rank.max()) + 2, dtype=bool)
        has_gpu[g.rank[ev][g.is_gpu[ev]]] = True
        comm_tracks = {(int(r), int(t)) for r, t in zip(g.rank[ev][g.cls[ev] == _COMM],
                                                        g.track[ev][g.cls[ev] == _COMM],
                                                        strict=True)}
        # intervals of the breakdown, per slot: class index or -1 (not counted)
        what = np.full(len(g.rank), -1, dtype=np.int8)
        gpu = ev[g.is_gpu[ev]]
        what[gpu] = g.cls[gpu]
        cpu_only = ev[~has_gpu[g.rank[ev]] & ~g.is_gpu[ev]]
        is_comm = g.cls[cpu_only] == _COMM
        what[cpu_only[is_comm]] = _COMM
        on_comm_track = np.array([(int(r), int(t)) in comm_tracks for r, t in
                                  zip(g.rank[cpu_only], g.track[cpu_only], strict=True)],
                                 dtype=bool)
        compute = ~is_comm & g.is_op[cpu_only] & ~on_comm_track
        what[cpu_only[compute]] = _COMPUTE
        self._iv_slot = np.flatnonzero(what >= 0)
        self._iv_what = what[self._iv_slot]
        self._iv_rank = g.rank[self._iv_slot]
        self.measured = self._steps(g.t0)

    @classmethod
    def from_store(cls, con: duckdb.DuckDBPyConnection, job: str) -> Replayer:
        return cls(build_graph(con, job))

    def _steps(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) per step on timeline ``t`` (relative ns)."""
        g = self.graph
        n = len(g.steps)
        start, end = np.full(n, np.inf), np.full(n, -np.inf)
        si, sn = g.step_start_nodes
        ei, en = g.step_end_nodes
        np.minimum.at(start, si, t[sn])
        np.maximum.at(end, ei, t[en])
        return start, end

    def run(self, scenario: Scenario | None = None, *, critical_path: bool = True,
            breakdown: bool = True) -> ReplayResult:
        """Project every complete step of the job under ``scenario`` (identity if None)."""
        scenario = scenario or Scenario()
        g = self.graph
        wts = weights(g, scenario)
        t = schedule(g.order, g.indptr, g.src, wts.w, g.t0)
        m_start, m_end = self.measured
        p_start, p_end = self._steps(t)
        if np.array_equal(wts.w, wts.w_alt):
            alt = p_end - p_start
        else:
            a_start, a_end = self._steps(schedule(g.order, g.indptr, g.src, wts.w_alt, g.t0))
            alt = a_end - a_start
        low, high = self._band(m_end - m_start, p_end - p_start, alt)
        path, segments = (self._path(t, wts.w, p_start, p_end) if critical_path
                          else (None, []))
        steps = []
        for i, s in enumerate(g.steps):
            if not np.isfinite(m_start[i]) or not np.isfinite(m_end[i]):
                continue
            mb = self._breakdown(g.t0, m_start[i], m_end[i]) if breakdown else {}
            pb = self._breakdown(t, p_start[i], p_end[i]) if breakdown else {}
            meas, proj = int(round(m_end[i] - m_start[i])), int(round(p_end[i] - p_start[i]))
            steps.append(StepResult(
                step=None if s == NO_STEP else int(s), measured_ns=meas, projected_ns=proj,
                low_ns=int(round(low[i])), high_ns=int(round(high[i])),
                measured=mb, projected=pb, critical_path=path[i] if path else {},
                start_ns=int(round(p_start[i])) + g.origin_ns,
                end_ns=int(round(p_end[i])) + g.origin_ns))
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

    def _breakdown(self, t: np.ndarray, a: float, b: float) -> dict[str, int]:
        """Mean over ranks of the step window split into compute, memcpy (not under
        compute), exposed comm (not under either) and idle; plus comm_ns (all comm time)."""
        g = self.graph
        s, e = t[2 * self._iv_slot], t[2 * self._iv_slot + 1]
        inside = (e > a) & (s < b)
        s, e = np.maximum(s[inside], a), np.minimum(e[inside], b)
        what, rank = self._iv_what[inside], self._iv_rank[inside]
        acc = dict.fromkeys((*BREAKDOWN, "comm"), 0.0)
        ranks = g.ranks
        for r in ranks:
            sel = rank == r
            w = what[sel]
            rs, re_ = s[sel], e[sel]
            comp = _union(rs[w == _COMPUTE], re_[w == _COMPUTE])
            comp_copy = _union(rs[w != _COMM], re_[w != _COMM])
            busy = _union(rs, re_)
            acc["compute"] += comp
            acc["memcpy"] += comp_copy - comp
            acc["exposed_comm"] += busy - comp_copy
            acc["idle"] += (b - a) - busy
            acc["comm"] += _union(rs[w == _COMM], re_[w == _COMM])
        n = max(len(ranks), 1)
        out = {k: int(round(v / n)) for k, v in acc.items() if k != "comm"}
        out["comm_ns"] = int(round(acc["comm"] / n))
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
