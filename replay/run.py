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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import duckdb
import numpy as np
import pyarrow as pa

from tracetool.analysis.connect import sql_file
from tracetool.analysis.critical_path import (
    CLASSES,
    SEGMENT_KINDS,
    PathGraph,
    PathWalker,
    unexplained_gap_warning,
)
from tracetool.graph import KIND_NAMES
from tracetool.numbers import round_ns

from .band import bounds, clock_band, describe, edge_errors, step_variation, widen
from .graph import NO_STEP, Bounds, ReplayGraph, build_graph
from .model import Scenario, source_network, target_network, weights
from .network import Network

_UNEXPLAINED = SEGMENT_KINDS.index("unexplained_gap")
# step_breakdown's partition of a rank's step (its columns without _ns): these add up to it
BREAKDOWN = ("compute", "exposed_comm", "exposed_memcpy", "idle")


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
    times: np.ndarray  # float64: projected time of every node, ns after origin_ns
    origin_ns: int
    notes: list[str] = field(default_factory=list)
    # the projected critical path as arrays, one entry per segment in time order: step, seq,
    # rank (-1 for filler), eid (-1 for idle), kind (index into SEGMENT_KINDS), start_ns,
    # end_ns; ``path`` gives them as dicts
    path_arrays: dict[str, np.ndarray] = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)  # what was replayed (Replayer.selection)

    @cached_property
    def times_ns(self) -> np.ndarray:
        """Projected time of every node, integer ns since the epoch. Made on first use (a
        sweep over a 10M-node graph does not need it, and it cost 0.2 s per setting)."""
        return np.round(self.times).astype(np.int64) + self.origin_ns

    @property
    def path(self) -> list[dict]:
        """The projected critical path, one dict per segment in time order: step, seq, rank
        (None for filler), eid (None for idle), kind (SEGMENT_KINDS), start_ns, end_ns.
        Built on use: a 1M-event rank's path has ~250k segments."""
        a = self.path_arrays
        if not a or not len(a["seq"]):
            return []
        cols = [a[k].tolist() for k in ("step", "seq", "rank", "eid", "kind", "start_ns",
                                         "end_ns")]
        return [{"step": None if st == NO_STEP else st, "seq": q,
                 "rank": None if r < 0 else r, "eid": None if e < 0 else e,
                 "kind": SEGMENT_KINDS[k], "start_ns": a0, "end_ns": b0}
                for st, q, r, e, k, a0, b0 in zip(*cols, strict=True)]

    def to_dict(self) -> dict:
        return {"job": self.job, "scenario": self.scenario, "notes": self.notes,
                "bounds": self.bounds,
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
        self._iv_slot = bd["slot"]
        self._iv_rank = graph.rank[bd["slot"]].astype(np.int64)
        self._iv_what = np.array(CLASSES, dtype=object)[bd["what"]]
        # the interval union is step_breakdown's own SQL (analysis/sql/25_intervals.sql), run
        # on a connection of the replayer's: the caller's connection is not touched
        self._db = duckdb.connect()
        self._db.execute(sql_file("25_intervals.sql"))
        self.measured = step_windows(graph, graph.t0)
        self._measured_breakdown: dict[int, dict[str, int]] | None = None
        # the band's schedules (compiled, without the GIL) run here beside the breakdown
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tracetool-band")

    @classmethod
    def from_store(cls, con: duckdb.DuckDBPyConnection, job: str,
                   bounds: Bounds | None = None) -> Replayer:
        """The replayer of ``job``'s graph, limited to ``bounds`` (steps, ranks)."""
        return cls(build_graph(con, job, bounds))

    def run(self, scenario: Scenario | None = None, *, critical_path: bool = True,
            breakdown: bool = True, include_incomplete: bool = False) -> ReplayResult:
        """Project every complete job step under ``scenario`` (identity if None; every step
        with ``include_incomplete``)."""
        from .simulate import schedule, schedule_many  # numba: loaded once the graph is read

        scenario = scenario or Scenario()
        g = self.graph
        wts = weights(g, scenario)
        t = schedule(g.order, g.ptr, g.src, wts.w, g.t0)
        m, p = self.measured, step_windows(g, t)
        ws = []  # the other schedules the band spans: on a thread, while the breakdown runs
        if not np.array_equal(wts.w, wts.w_alt):
            ws.append(wts.w_alt)
        err, used = edge_errors(g, scenario, wts.w)
        if used:
            ws += list(bounds(wts.w, err))
        clock = clock_band(g, scenario, wts.w)  # a clock or cap: both power laws, a floor
        ws += clock.spans + ([clock.floor] if clock.floor is not None else [])
        band = self._pool.submit(schedule_many, g.order, g.ptr, g.src, ws, g.t0) if ws else None
        path, segments = (self._path(t, wts.w, p.job_start, p.job_end) if critical_path
                          else (None, {}))
        if breakdown:
            if self._measured_breakdown is None:
                self._measured_breakdown = self._breakdowns(
                    g.t0, m, gaps=self._gap_intervals(g.t0, g.base_w))
            measured_bd = self._measured_breakdown
            # the identity schedule is the measured timeline, exactly (integer ns in float64)
            projected_bd = (measured_bd if np.array_equal(t, g.t0)
                            else self._breakdowns(t, p, self._added_waits(t, wts.w),
                                                  self._gap_intervals(t, wts.w)))
        alts = [p.job_end - p.job_start]  # the step times the band spans
        for x in band.result() if band is not None else []:
            s = step_windows(g, x)
            alts.append(s.job_end - s.job_start)
        floor = alts.pop() if clock.floor is not None else None
        spans = np.array(alts)  # the band: their span, widened by the steps' variation
        lowest = spans.min(axis=0)
        if floor is not None:  # never below the boost clock's step (nor the projection)
            lowest = np.maximum(lowest, np.minimum(floor, alts[0]))
        low, high = widen(lowest, spans.max(axis=0), step_variation(
            np.where(g.step_complete & g.step_reported, m.job_end - m.job_start, np.nan)))
        steps = []
        for i in self.reported(include_incomplete):
            s = g.steps[i]
            mb = measured_bd.get(i, {}) if breakdown else {}
            pb = projected_bd.get(i, {}) if breakdown else {}
            meas = int(round(m.job_end[i] - m.job_start[i]))
            proj = int(round(p.job_end[i] - p.job_start[i]))
            steps.append(StepResult(
                step=None if s == NO_STEP else int(s), measured_ns=meas, projected_ns=proj,
                low_ns=int(round(low[i])), high_ns=int(round(high[i])),
                measured=mb, projected=pb, critical_path=path[i] if path else {},
                start_ns=int(round(p.job_start[i])) + g.origin_ns,
                end_ns=int(round(p.job_end[i])) + g.origin_ns,
                complete=bool(g.step_complete[i])))
        return ReplayResult(job=g.job, scenario=scenario.label, steps=steps, times=t,
                            origin_ns=g.origin_ns,
                            notes=g.notes + wts.notes + describe(used) + clock.notes
                            + unchanged_note(steps, not np.array_equal(t, g.t0))
                            + self._gap_note(segments, steps),
                            path_arrays=segments,
                            bounds=self.selection())

    def reported(self, include_incomplete: bool = False) -> list[int]:
        """Indices into ``graph.steps`` of the steps a run reports: the complete ones (all
        with ``include_incomplete``) of those asked for, with a measured window."""
        g, m = self.graph, self.measured
        return [i for i in range(len(g.steps))
                if (g.step_complete[i] or include_incomplete) and g.step_reported[i]
                and np.isfinite(m.job_start[i]) and np.isfinite(m.job_end[i])]

    def selection(self) -> dict:
        """What the replay read, for the JSON: the step range and ranks asked (None: all),
        the ranks replayed, the collectives whose last arrival was outside (their measured
        wait kept as a fixed delay) and the outside events kept as fixed points."""
        g = self.graph
        return {"steps": None if g.bounds.steps is None else list(g.bounds.steps),
                "ranks": None if g.bounds.ranks is None else list(g.bounds.ranks),
                "replayed_ranks": g.replayed_ranks.tolist(), "job_ranks": g.ranks.tolist(),
                "world_size": g.world_size,
                "partial_collectives": g.partial, "fixed_points": g.frontier}

    def _gap_note(self, segments: dict[str, np.ndarray], steps: list[StepResult]
                  ) -> list[str]:
        """critical-path's one warning about unexplained gaps (``unexplained_gap_warning``),
        over the projected path of the reported steps: a GPU op of view gpu_wait_gaps whose
        wait still sets its projected start. Empty when the path has none."""
        kind = segments.get("kind")
        if kind is None or not (kind == _UNEXPLAINED).any():
            return []
        keep = np.isin(segments["step"], [NO_STEP if s.step is None else s.step
                                           for s in steps])
        rank = segments["rank"][keep]
        path = pa.table({
            "kind": pa.array(SEGMENT_KINDS).take(pa.array(kind[keep], type=pa.int64())),
            "rank": pa.array(rank, mask=rank < 0, type=pa.int64()),
            "start_ns": segments["start_ns"][keep],
            "dur_ns": segments["end_ns"][keep] - segments["start_ns"][keep]})
        gap = unexplained_gap_warning(self._db.from_arrow(path))
        return [gap] if gap else []

    def _added_waits(self, t: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
        """(rank, start, end) of the waits for a CPU-side transfer that the projection added:
        a node bound by a ``transfer_wake`` edge resumes later after its other predecessors
        allowed it than it did in the measured timeline; that extra time is communication,
        even where the thread resumed inside a CPU op (an autograd function around a DDP
        bucket's wait), and not that op's compute. None in an identity replay."""
        g = self.graph
        n, dst = g.n_nodes, g.dst
        wake = g.kind == KIND_NAMES.index("transfer_wake")
        nodes = np.unique(dst[wake])
        other = ~wake & np.isin(dst, nodes)
        ready_t = np.full(n, -np.inf)
        ready_0 = np.full(n, -np.inf)
        np.maximum.at(ready_t, dst[other], t[g.src[other]] + w[other])
        np.maximum.at(ready_0, dst[other], g.t0[g.src[other]] + g.base_w[other])
        nodes = nodes[np.isfinite(ready_t[nodes]) & np.isfinite(ready_0[nodes])]
        extra = (t[nodes] - ready_t[nodes]) - (g.t0[nodes] - ready_0[nodes])
        keep = extra > 0
        nodes, extra = nodes[keep], extra[keep]
        return (g.rank[nodes >> 1].astype(np.int64), t[nodes] - extra, t[nodes])

    def _gap_intervals(self, t: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """(rank, start, end) of the unexplained gaps on timeline ``t`` (weights ``w``):
        each GPU op of view gpu_wait_gaps (ReplayGraph.waited) waited before its start for
        its measured wait, or less when its binding dependency now comes later (the hop the
        path marks). On the measured timeline, the view's waits exactly. None when none."""
        g = self.graph
        if g.waited is None or g.wait_ns is None:
            return None
        nodes = 2 * np.flatnonzero(g.waited)
        pos = np.flatnonzero(np.isin(g.order, nodes))
        node = g.order[pos]
        start = np.empty(len(node))
        for i, (at, n) in enumerate(zip(pos.tolist(), node.tolist(), strict=True)):
            lo, hi = int(g.ptr[at]), int(g.ptr[at + 1])
            src = t[g.src[lo:hi]]
            arrive = src + w[lo:hi]
            hop = src[arrive == arrive.max()].max() if hi > lo else t[n]
            start[i] = max(t[n] - g.wait_ns[n >> 1], hop)
        return g.rank[node >> 1].astype(np.int64), start, t[node]

    def _breakdowns(self, t: np.ndarray, w: StepWindows,
                    waits: tuple[np.ndarray, ...] | None = None,
                    gaps: tuple[np.ndarray, ...] | None = None) -> dict[int, dict[str, int]]:
        """Per job step index: the mean over its ranks of step_breakdown's partition of each
        rank's step (compute, exposed comm, exposed memcpy, idle; plus comm_ns, the step's
        dur_ns and unexplained_gap_ns, the part of idle in ``gaps`` (``_gap_intervals``) with
        no GPU op running, as step_breakdown's), from the breakdown_events on timeline ``t``;
        ``waits`` (``_added_waits``) are cut out of the compute intervals and counted as
        comm."""
        g, rs = self.graph, self.graph.rank_steps
        if len(w.rank_start):
            win_rank, win_step = rs["rank"], rs["step_idx"]
            a, b = w.rank_start, w.rank_end
        else:  # one window over the whole trace: every replayed rank's share of it
            win_rank = g.replayed_ranks.astype(np.int64)
            win_step = np.zeros(len(win_rank), dtype=np.int64)
            a = np.full(len(win_rank), w.job_start[0])
            b = np.full(len(win_rank), w.job_end[0])
        ok = np.isfinite(a) & np.isfinite(b)
        db = self._db
        db.register("_iv", _cut_waits(self._iv_rank, t[2 * self._iv_slot],
                                      t[2 * self._iv_slot + 1], self._iv_what, waits))
        db.register("_win", pa.table({"rank": win_rank[ok], "step": win_step[ok],
                                      "a": a[ok], "b": b[ok]}))
        gap_rows: list[tuple] = []
        try:
            if gaps is not None and len(gaps[0]):
                # the gaps as 'compute' over every busy interval as 'comm': their union less
                # the busy time is the gaps' idle part (unexplained_gap_intervals' rule)
                db.register("_gap", pa.table({"rank": gaps[0], "s": gaps[1], "e": gaps[2]}))
                db.execute("""
                    CREATE OR REPLACE TEMP VIEW _gclip AS
                    SELECT '' AS job, w.rank, w.step, greatest(i.s, w.a) AS s_ns,
                           least(i.e, w.b) AS e_ns, i.what
                    FROM (SELECT rank, s, e, 'comm' AS what FROM _iv WHERE what <> 'cpu'
                          UNION ALL SELECT rank, s, e, 'compute' FROM _gap) i
                    JOIN _win w ON i.rank = w.rank AND i.s < w.b AND i.e > w.a""")
                gap_rows = db.execute("""
                    SELECT w.step, avg(coalesce(u.compute_or_comm, 0) - coalesce(u.comm, 0))
                    FROM _win w LEFT JOIN interval_unions('_gclip') u
                      ON u.rank = w.rank AND u.step = w.step
                    GROUP BY w.step""").fetchall()
                db.unregister("_gap")
            db.execute("""
                CREATE OR REPLACE TEMP VIEW _clip AS
                SELECT '' AS job, w.rank, w.step, greatest(i.s, w.a) AS s_ns,
                       least(i.e, w.b) AS e_ns, i.what
                FROM _iv i JOIN _win w ON i.rank = w.rank AND i.s < w.b AND i.e > w.a""")
            rows = db.execute("""
                SELECT w.step, avg(coalesce(u.compute, 0)), avg(coalesce(u.comm, 0)),
                       avg(coalesce(u.compute_or_comm, 0)), avg(coalesce(u.busy, 0)),
                       avg(w.b - w.a)
                FROM _win w LEFT JOIN interval_unions('_clip') u
                  ON u.rank = w.rank AND u.step = w.step
                GROUP BY w.step""").fetchall()
        finally:
            db.unregister("_iv")
            db.unregister("_win")
        gap = {int(step): ns for step, ns in gap_rows}
        out = {}
        for step, compute, comm, either, busy, dur in rows:
            out[int(step)] = {
                "compute": round_ns(compute), "exposed_comm": round_ns(either - compute),
                "exposed_memcpy": round_ns(busy - either), "idle": round_ns(dur - busy),
                "comm_ns": round_ns(comm), "dur_ns": round_ns(dur),
                "unexplained_gap_ns": round_ns(gap.get(int(step), 0))}
        return out

    def _path(self, t: np.ndarray, w: np.ndarray, start: np.ndarray, end: np.ndarray
              ) -> tuple[list[dict[str, int]], dict[str, np.ndarray]]:
        """Critical path of each reported projected step: ns per segment kind, and the
        segments as arrays (ReplayResult.path_arrays). The backward walk of
        tracetool.analysis.critical_path over the edges that set each projected time."""
        from .simulate import binding_edges

        g = self.graph
        edge = binding_edges(g.order, g.ptr, g.src, w, g.kind, t)
        has = edge >= 0
        ti = np.round(t).astype(np.int64)
        ev = np.arange(g.n_event_slots)
        ev = ev[g.rank[ev] >= 0]
        ends = 2 * ev + 1  # by time, then CPU before GPU, then (rank, eid): slot order
        ends = ends[np.argsort(2 * ti[ends] + g.is_gpu[ev], kind="stable")]
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
                       parent=g.parent, waited=g.waited)
        walker = PathWalker(pg)
        out, parts = [], []
        for i, (step, a, b) in enumerate(zip(g.steps.tolist(), start, end, strict=True)):
            if not (np.isfinite(a) and np.isfinite(b)) or not g.step_reported[i]:
                out.append({})
                continue
            seg = walker.walk(int(round(a)), int(round(b)))
            dur = seg["end"] - seg["start"]
            by_kind = np.bincount(seg["kind"], weights=dur, minlength=len(SEGMENT_KINDS))
            there = np.bincount(seg["kind"], minlength=len(SEGMENT_KINDS)) > 0
            out.append({k: int(by_kind[i]) for i, k in enumerate(SEGMENT_KINDS) if there[i]})
            loc, attr = seg["loc"].astype(np.int64), seg["attr"].astype(np.int64)
            is_ev = (loc >= 0) & (loc < g.n_event_slots)
            rank = np.where(is_ev, g.rank[np.where(is_ev, loc, 0)], -1)
            has_eid = (attr >= 0) & (attr < g.n_event_slots)
            parts.append({"step": np.full(len(dur), step, dtype=np.int64),
                          "seq": np.arange(len(dur), dtype=np.int64),
                          "rank": np.where(rank >= 0, rank, -1).astype(np.int64),
                          "eid": np.where(has_eid, g.eid[np.where(has_eid, attr, 0)], -1),
                          "kind": seg["kind"].astype(np.int64),
                          "start_ns": seg["start"].astype(np.int64) + g.origin_ns,
                          "end_ns": seg["end"].astype(np.int64) + g.origin_ns})
        keys = ("step", "seq", "rank", "eid", "kind", "start_ns", "end_ns")
        segments = {k: np.concatenate([p[k] for p in parts]) if parts
                    else np.zeros(0, dtype=np.int64) for k in keys}
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
    (the last: the latest rank's end). Windows that are not tiled (--annotation, --window)
    span their own points, per rank and across ranks."""
    rs = g.rank_steps
    n = len(rs["rank"])
    if n == 0:  # no ProfilerStep: one window over every event
        ev = np.arange(g.n_event_slots)
        ev = ev[g.rank[ev] >= 0]
        a = np.array([t[2 * ev].min()]) if len(ev) else np.array([np.inf])
        b = np.array([t[2 * ev + 1].max()]) if len(ev) else np.array([-np.inf])
        return StepWindows(np.zeros(0), np.zeros(0), a, b)
    node = rs["start_node"]
    raw = np.where(node >= 0, t[np.maximum(node, 0)] + rs["start_off"], rs["start_fixed"])
    last_end = np.full(n, -np.inf)
    np.maximum.at(last_end, rs["end_row"], t[rs["end_node"]] + rs["end_off"])
    rank_start, rank_end = _tile(rs["rank"], raw, last_end)
    spans = ~rs["tiled"]  # windows that are not tiled span their own points
    rank_start[spans] = raw[spans]
    rank_end[spans] = np.maximum(raw[spans], last_end[spans])
    k, idx = len(g.steps), rs["step_idx"]
    first, latest, ends = np.full(k, np.inf), np.full(k, -np.inf), np.full(k, -np.inf)
    np.minimum.at(first, idx, rank_start)
    np.maximum.at(latest, idx, rank_start)
    np.maximum.at(ends, idx, rank_end)
    if spans.any():
        return StepWindows(rank_start, rank_end, first, np.maximum(first, ends))
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


def _cut_waits(rank: np.ndarray, s: np.ndarray, e: np.ndarray, what: np.ndarray,
               waits: tuple[np.ndarray, ...] | None) -> pa.Table:
    """The breakdown's intervals with each wait cut out of the compute intervals of its rank
    that it lies in (the parts before and after stay compute) and added as comm."""
    rank, s, e = np.asarray(rank, dtype=np.int64), np.asarray(s, float), np.asarray(e, float)
    what = np.asarray(what, dtype=object)
    for r, a, b in zip(*(waits or ((), (), ())), strict=True):
        hit = np.nonzero((what == "compute") & (rank == r) & (s < b) & (e > a))[0]
        after = hit[e[hit] > b]
        piece_s = np.concatenate([np.full(len(after), b), [a]])
        piece_e = np.concatenate([e[after], [b]])
        e[hit] = np.maximum(s[hit], a)
        rank = np.concatenate([rank, np.full(len(piece_s), r, dtype=np.int64)])
        s, e = np.concatenate([s, piece_s]), np.concatenate([e, piece_e])
        what = np.concatenate([what, np.array(["compute"] * len(after) + ["comm"],
                                              dtype=object)])
    return pa.table({"rank": rank, "s": s, "e": e, "what": what})


def replay(con: duckdb.DuckDBPyConnection, job: str, scenario: Scenario | None = None
           ) -> ReplayResult:
    """Build ``job``'s graph from the store on ``con`` and replay it under ``scenario``."""
    return Replayer.from_store(con, job).run(scenario)


def unchanged_note(steps: list[StepResult], changed: bool) -> list[str]:
    """Why no step moved when the what-if moved some event (``changed``): the times it
    changes are off the critical path. Said, so that a +0.0% is never silent; a what-if
    that moves no event at all is refused before the replay (``check_scenario``)."""
    if not changed or not steps or any(s.projected_ns != s.measured_ns for s in steps):
        return []
    path: dict[str, int] = {}
    for s in steps:
        for k, v in s.critical_path.items():
            path[k] = path.get(k, 0) + v
    bound = ""
    if path:
        kind, ns = max(path.items(), key=lambda kv: kv[1])
        bound = f" (the projected critical path is {100 * ns / sum(path.values()):.0f}% {kind})"
    return ["no step time changed: the events this what-if moves are off every step's "
            f"critical path{bound}, so the step is bound by other work, e.g. the CPU side of "
            "a host-bound step"]


def listing_network(graph: ReplayGraph, scenario: Scenario) -> Network | None:
    """The network whose placement ``collective_listing`` reads the links from: the
    target's when ``scenario`` changes the network, else the source's (None: unknown, a CPU
    job without --source-network)."""
    return (target_network(graph, scenario) if scenario.changes_network
            else source_network(graph, scenario))


def collective_listing(replayer: Replayer, scenario: Scenario | None,
                       result: ReplayResult | None, include_incomplete: bool = False
                       ) -> list[dict]:
    """Per (kind, group) of the collectives in ``result``'s reported steps (``result`` None:
    as measured, projected = measured, on the steps ``Replayer.reported(include_incomplete)``
    gives, with no simulation: what an identity run's listing is; ``scenario`` then only
    names the network the links are read on), summed over
    their instances: bytes (each instance's recorded size, nccl-tests' S), the link classes
    the group crosses on the target network's placement (``network.link_classes``; the
    source's when the scenario changes no network), measured and projected transfer (the
    last arrival to the end: what the network model prices) and exposed communication,
    measured and projected: step_breakdown's exposed comm (comm not overlapped by compute,
    analysis/sql/30_breakdown.sql) shared among the collectives in flight (``_exposed``),
    mean over its ranks. Largest projected exposed first. The projected breakdown also
    counts as comm the waits for a CPU-side transfer the projection added (gloo), which
    belong to no one collective's span."""
    from .graph import COMM_DURATION
    from .model import collective_factors
    from .network import link_classes

    scenario = scenario or Scenario()
    g = replayer.graph
    insts = g.insts
    n = len(insts["transfer_ns"])
    k = collective_factors(g, scenario)[0] if result is not None else np.ones(n)
    net = listing_network(g, scenario)
    if result is None:
        reported = {None if g.steps[i] == NO_STEP else int(g.steps[i])
                    for i in replayer.reported(include_incomplete)}
    else:
        reported = {s.step for s in result.steps}
    keep = (np.isin(insts["step"], [s for s in reported if s is not None])
            if None not in reported else np.ones(n, dtype=bool))
    measured = _exposed(replayer, g.t0, n, COMM_DURATION)
    exposed = {"measured": measured,
               "projected": measured if result is None else _exposed(
                   replayer, result.times, n, COMM_DURATION)}
    out: dict[tuple, dict] = {}
    for i in np.flatnonzero(keep).tolist():
        group = tuple(int(r) for r in insts["group_ranks"][i])
        key = (str(insts["kind"][i]), group)
        if key not in out:
            out[key] = {
                "kind": key[0], "group": list(group), "pg_desc": insts["pg_desc"][i],
                "instances": 0, "bytes": 0, "sized": True,
                "links": (sorted(link_classes(net, list(group)), key=["intra", "inter",
                                                                       "dc"].index)
                          if net is not None and len(group) > 1 else None),
                "measured_transfer_ns": 0, "projected_transfer_ns": 0,
                "measured_exposed_ns": 0, "projected_exposed_ns": 0}
        row = out[key]
        row["instances"] += 1
        b = insts["bytes"][i]
        if np.isfinite(b):
            row["bytes"] += int(b)
        else:
            row["sized"] = False  # the trace records no size for it
        t = float(insts["transfer_ns"][i])
        row["measured_transfer_ns"] += t
        row["projected_transfer_ns"] += t * float(k[i])
        row["measured_exposed_ns"] += exposed["measured"][i]
        row["projected_exposed_ns"] += exposed["projected"][i]
    rows = list(out.values())
    for row in rows:
        for col in ("measured_transfer_ns", "projected_transfer_ns", "measured_exposed_ns",
                    "projected_exposed_ns"):
            row[col] = round_ns(row[col])
    return sorted(rows, key=lambda r: (-r["projected_exposed_ns"], r["kind"], r["group"]))


def _exposed(replayer: Replayer, t: np.ndarray, n: int, comm_role: int) -> np.ndarray:
    """Per collective instance on timeline ``t``: its share of its ranks' exposed comm (the
    mean over its ranks): each stretch of a rank's time that no compute interval of its
    breakdown covers is split evenly among the collectives in flight on the rank then, so
    the shares add up to the breakdown's exposed comm (the union of the comm spans outside
    compute) when the comm intervals are these spans."""
    g = replayer.graph
    own = np.flatnonzero(g.role == comm_role)
    rank = g.rank[g.dst[own] >> 1].astype(np.int64)
    inst = g.inst[own]
    a, b = t[g.src[own]], np.maximum(t[g.dst[own]], t[g.src[own]])
    comp = replayer._iv_what == "compute"
    c_rank = replayer._iv_rank[comp]
    c_s = t[2 * replayer._iv_slot[comp]]
    c_e = t[2 * replayer._iv_slot[comp] + 1]
    exp = np.zeros(len(own))
    for r in np.unique(rank).tolist():
        sel = np.flatnonzero(rank == r)
        s, e = _union(c_s[c_rank == r], c_e[c_rank == r])
        pts = np.unique(np.concatenate([a[sel], b[sel]]))  # elementary stretches between
        lo, hi = pts[:-1], pts[1:]
        busy = np.searchsorted(np.sort(a[sel]), lo, side="right") - np.searchsorted(
            np.sort(b[sel]), lo, side="right")  # collectives in flight on each stretch
        free = (hi - lo) - (_covered(s, e, hi) - _covered(s, e, lo) if len(s) else 0.0)
        share = np.concatenate([[0.0], np.cumsum(np.divide(
            free, busy, out=np.zeros(len(lo)), where=busy > 0))])
        exp[sel] = (share[np.searchsorted(pts, b[sel])]
                    - share[np.searchsorted(pts, a[sel])])
    total = np.bincount(inst, weights=exp, minlength=n)
    count = np.bincount(inst, minlength=n)
    return np.divide(total, count, out=np.zeros(n), where=count > 0)


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint intervals (sorted) covering the intervals [s, e)."""
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    if not len(s):
        return s, e
    reach = np.maximum.accumulate(e)
    new = np.concatenate([[True], s[1:] > reach[:-1]])
    idx = np.flatnonzero(new)
    ends = np.concatenate([reach[idx[1:] - 1], [reach[-1]]])
    return s[idx], ends


def _covered(s: np.ndarray, e: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For disjoint sorted intervals [s, e): the length of them before each point x."""
    cum = np.concatenate([[0.0], np.cumsum(e - s)])
    j = np.searchsorted(s, x, side="right")  # intervals starting at or before x
    last = np.maximum(j - 1, 0)
    inside = np.where(j > 0, np.minimum(x, e[last]) - s[last], 0.0)
    return cum[np.maximum(j - 1, 0)] * (j > 0) + np.maximum(inside, 0.0)
