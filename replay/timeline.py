"""The projected timeline as a Chrome trace (opens in Perfetto and chrome://tracing).

One process per rank ("rank R (projected)"), one thread per CPU thread or GPU stream of that
rank, named as in the source trace; every event of the replay graph at its projected start
and duration, with its measured start and duration in args; and a "critical path
(projected)" thread per rank with the projected path's segments, linked by flow arrows.
Times are microseconds from the first projected step's start, three decimals (exact ns).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import msgspec
import numpy as np

from tracetool.analysis.chrome_trace import PATH_TID

from .graph import ReplayGraph

if TYPE_CHECKING:
    from .run import ReplayResult


def write_projected_trace(con: duckdb.DuckDBPyConnection, graph: ReplayGraph,
                          result: ReplayResult, out: Path) -> int:
    """Write ``out`` atomically; returns the number of slice events written."""
    g = graph
    ev = np.flatnonzero(g.rank[:g.n_event_slots] >= 0)
    names = con.execute(
        "SELECT rank, eid, name FROM cp_nodes WHERE job = ?", [g.job]).fetchnumpy()
    name_of = {(int(r), int(e)): n for r, e, n in
               zip(names["rank"], names["eid"], names["name"], strict=True)}
    tracks = con.execute(
        """SELECT rank, track_id, track_kind, coalesce(thread_name, tid_raw) AS tname,
                  pid_raw FROM tracks WHERE job = ?""", [g.job]).fetchall()
    t = result.times_ns
    t0 = min((s.start_ns for s in result.steps), default=int(t[2 * ev].min()))
    events: list[dict] = []
    for r in g.ranks.tolist():
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                       "args": {"name": f"rank {r} (projected: {result.scenario})"}})
    for r, tid, kind, tname, pid_raw in tracks:
        label = f"{'stream' if kind == 'gpu_stream' else 'thread'} {tname} (pid {pid_raw})"
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                       "args": {"name": label}})
    start, end = t[2 * ev], t[2 * ev + 1]
    m_start, m_end = g.t0[2 * ev] + g.origin_ns, g.t0[2 * ev + 1] + g.origin_ns
    n = 0
    for i, s in enumerate(ev.tolist()):
        r, e = int(g.rank[s]), int(g.eid[s])
        events.append({
            "ph": "X", "name": name_of.get((r, e), "?"), "pid": r, "tid": int(g.track[s]),
            "ts": _us(int(start[i]) - t0), "dur": _us(int(end[i] - start[i])),
            "cat": "gpu" if g.is_gpu[s] else "cpu",
            "args": {"eid": e, "measured_ts_us": _us(int(m_start[i]) - t0),
                     "measured_dur_us": _us(int(m_end[i] - m_start[i]))}})
        n += 1
    for st in result.steps:
        events.append({"ph": "i", "s": "g", "name": f"projected step {st.step} end",
                       "pid": int(g.ranks[0]), "tid": 0, "ts": _us(st.end_ns - t0)})
    events += _path_events(result, name_of, int(g.ranks[0]), t0)
    doc = {"displayTimeUnit": "ns", "traceEvents": events,
           "otherData": {"scenario": result.scenario, "job": g.job}}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(doc))
    os.replace(tmp, out)
    return n


def _path_events(result: ReplayResult, name_of: dict, first_rank: int, t0: int) -> list[dict]:
    """The projected critical path as a "critical path (projected)" thread of each rank,
    consecutive segments of a step linked by flow arrows (as `tracetool critical-path
    --chrome-trace` draws the measured one)."""
    out: list[dict] = []
    ranks = {s["rank"] for s in result.path if s["rank"] is not None} or {first_rank}
    for r in sorted(ranks):
        out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": PATH_TID,
                    "args": {"name": "critical path (projected)"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": PATH_TID,
                    "args": {"sort_index": -1}})
    prev_rank = first_rank
    segs = result.path
    for i, s in enumerate(segs):
        rank = s["rank"] if s["rank"] is not None else prev_rank
        name = name_of.get((rank, s["eid"])) if s["eid"] is not None else None
        out.append({"ph": "X", "cat": "critical_path", "pid": rank, "tid": PATH_TID,
                    "name": f"{s['kind']}: {name}" if name else s["kind"],
                    "ts": _us(s["start_ns"] - t0), "dur": _us(s["end_ns"] - s["start_ns"]),
                    "args": {"step": s["step"], "seq": s["seq"], "eid": s["eid"]}})
        if i + 1 < len(segs) and segs[i + 1]["step"] == s["step"]:
            nxt = segs[i + 1]["rank"] if segs[i + 1]["rank"] is not None else rank
            out.append({"ph": "s", "cat": "critical_path", "name": "critical_path", "id": i,
                        "pid": rank, "tid": PATH_TID, "ts": _us(s["start_ns"] - t0)})
            out.append({"ph": "f", "bp": "e", "cat": "critical_path", "name": "critical_path",
                        "id": i, "pid": nxt, "tid": PATH_TID,
                        "ts": _us(segs[i + 1]["start_ns"] - t0)})
        prev_rank = rank
    return out


def _us(ns: int) -> float:
    """ns as microseconds; a float keeps the ns exactly below 2**53 / 1000 us (104 days)."""
    return round(ns / 1000, 3)
