"""The projected timeline as a Chrome trace (opens in Perfetto and chrome://tracing).

One process per rank ("rank R (projected)"), one thread per CPU thread or GPU stream of that
rank, named as in the source trace; every event of the replay graph at its projected start
and duration, with its measured start and duration in args; and a "critical path
(projected)" thread per rank with the projected path's segments, linked by flow arrows.
Times are microseconds from the first projected step's start, three decimals (exact ns).

The slices and the path (a 1M-event rank: a million slices, ~250k segments) are JSON text
built by DuckDB from Arrow tables of the graph's arrays, named from ``cp_nodes`` in the same
query, and streamed to the file: no Python object per event.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import msgspec
import numpy as np
import pyarrow as pa

from tracetool.analysis.chrome_trace import PATH_TID, EventArray, arrow_sql, us_sql, us_text
from tracetool.analysis.critical_path import SEGMENT_KINDS
from tracetool.outputs import atomic_write

from .graph import NO_STEP, ReplayGraph

if TYPE_CHECKING:
    from .run import ReplayResult

# every replayed event at its projected time (ts, dur) and its measured one (mts, mdur), all
# ns from the trace's t0; ``i``: the order of the slices in the file
_SLICES_JSON = f"""
SELECT '{{"ph":"X","name":' || to_json(coalesce(n.name, '?')) || ',"pid":' || s.rank
       || ',"tid":' || s.track || ',"ts":' || {us_sql("s.ts")} || ',"dur":'
       || {us_sql("s.dur")} || ',"cat":"' || CASE WHEN s.is_gpu THEN 'gpu' ELSE 'cpu' END
       || '","args":{{"eid":' || s.eid || ',"measured_ts_us":' || {us_sql("s.mts")}
       || ',"measured_dur_us":' || {us_sql("s.mdur")} || '}}}}'
FROM _projected_slices s
LEFT JOIN cp_nodes n ON n.job = $job AND n.rank = s.rank AND n.eid = s.eid
ORDER BY s.i
"""

# the projected path: a segment without a rank (filler) is drawn on the rank of the segment
# before it (the first rank at the start); consecutive segments of a step are linked by a
# flow arrow from this one's start to the next one's (id: the segment's position)
_PATH_JSON = f"""
WITH p AS (
    SELECT *, coalesce(last_value(rank IGNORE NULLS) OVER
                       (ORDER BY i ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
                       $first_rank) AS lane
    FROM _projected_path),
s AS (
    SELECT p.*, n.name, lead(i) OVER w IS NOT NULL
                        AND lead(step) OVER w IS NOT DISTINCT FROM step AS arrow,
           lead(lane) OVER w AS next_lane, lead(ts) OVER w AS next_ts
    FROM p LEFT JOIN cp_nodes n ON n.job = $job AND n.rank = p.lane AND n.eid = p.eid
    WINDOW w AS (ORDER BY i))
SELECT '{{"ph":"X","cat":"critical_path","pid":' || lane || ',"tid":{PATH_TID},"name":'
       || to_json(CASE WHEN coalesce(name, '') <> '' THEN kind || ': ' || name
                       ELSE kind END)
       || ',"ts":' || {us_sql("ts")} || ',"dur":' || {us_sql("dur")}
       || ',"args":{{"step":' || coalesce(step::VARCHAR, 'null') || ',"seq":' || seq
       || ',"eid":' || coalesce(eid::VARCHAR, 'null') || '}}}}'
       || CASE WHEN arrow THEN {arrow_sql("lane", "ts", "next_lane", "next_ts")}
          ELSE '' END
FROM s ORDER BY i
"""


def write_projected_trace(con: duckdb.DuckDBPyConnection, graph: ReplayGraph,
                          result: ReplayResult, out: Path) -> int:
    """Write ``out`` atomically; returns the number of slice events written."""
    g = graph
    ev = np.flatnonzero(g.rank[:g.n_event_slots] >= 0)
    t = result.times_ns
    t0 = min((s.start_ns for s in result.steps), default=int(t[2 * ev].min()))
    # measured times as integers before the origin is added: float64 cannot hold ns since
    # the epoch (its step there is 256 ns)
    measured = np.rint(g.t0).astype(np.int64) + (g.origin_ns - t0)
    start, end = t[2 * ev] - t0, t[2 * ev + 1] - t0
    slices = pa.table({
        "i": np.arange(len(ev)), "rank": g.rank[ev], "eid": g.eid[ev], "track": g.track[ev],
        "is_gpu": g.is_gpu[ev].astype(bool), "ts": start, "dur": end - start,
        "mts": measured[2 * ev], "mdur": measured[2 * ev + 1] - measured[2 * ev]})
    first_rank = int(g.ranks[0])
    path = _path_table(result, t0)
    with atomic_write(out) as f:
        f.write(b'{"displayTimeUnit":"ns","traceEvents":[\n')
        events = EventArray(f)
        events.dicts(_names(con, g, result))
        events.query(con, _SLICES_JSON, {"job": g.job}, {"_projected_slices": slices})
        events.dicts([{"ph": "i", "s": "g", "name": f"projected step {st.step} end",
                       "pid": first_rank, "tid": 0, "ts": float(us_text(st.end_ns - t0))}
                      for st in result.steps])
        events.dicts(_path_threads(path, first_rank))
        events.query(con, _PATH_JSON, {"job": g.job, "first_rank": first_rank},
                     {"_projected_path": path})
        f.write(b'\n],"otherData":' + msgspec.json.encode(
            {"scenario": result.scenario, "job": g.job}) + b"}")
    return len(ev)


def _names(con: duckdb.DuckDBPyConnection, g: ReplayGraph, result: ReplayResult
           ) -> list[dict]:
    """The processes' and threads' names."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                           "args": {"name": f"rank {r} (projected: {result.scenario})"}}
                          for r in g.ranks.tolist()]
    for r, tid, kind, tname, pid_raw in con.execute(
            """SELECT rank, track_id, track_kind, coalesce(thread_name, tid_raw) AS tname,
                      pid_raw FROM tracks WHERE job = ?""", [g.job]).fetchall():
        label = f"{'stream' if kind == 'gpu_stream' else 'thread'} {tname} (pid {pid_raw})"
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                       "args": {"name": label}})
    return events


def _path_threads(path: pa.Table, first_rank: int) -> list[dict]:
    """The "critical path (projected)" thread of each rank the path runs on."""
    events = []
    for r in sorted(set(path["rank"].drop_null().to_pylist()) or {first_rank}):
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": PATH_TID,
                       "args": {"name": "critical path (projected)"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": PATH_TID,
                       "args": {"sort_index": -1}})
    return events


def _path_table(result: ReplayResult, t0: int) -> pa.Table:
    """The projected path's segments (``ReplayResult.path_arrays``) as an Arrow table: step
    and rank NULL where there is none, eid NULL for idle time, kind by name, times from t0."""
    a = result.path_arrays or {k: np.zeros(0, dtype=np.int64) for k in (
        "step", "seq", "rank", "eid", "kind", "start_ns", "end_ns")}
    start = np.asarray(a["start_ns"], dtype=np.int64) - t0
    return pa.table({
        "i": np.arange(len(a["seq"])),
        "step": pa.array(a["step"], mask=a["step"] == NO_STEP, type=pa.int64()),
        "seq": a["seq"],
        "rank": pa.array(a["rank"], mask=a["rank"] < 0, type=pa.int64()),
        "eid": pa.array(a["eid"], mask=a["eid"] < 0, type=pa.int64()),
        "kind": pa.array(SEGMENT_KINDS).take(pa.array(a["kind"], type=pa.int64())),
        "ts": start, "dur": np.asarray(a["end_ns"], dtype=np.int64) - t0 - start})
