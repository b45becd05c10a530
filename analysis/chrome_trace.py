"""Write a job's events and its critical path as one Chrome trace (opens in Perfetto).

One process per rank ("rank R"), one thread per track of that rank (named as in the trace),
and a "critical path" thread per rank holding the path's segments, chained by flow arrows
(cat ``critical_path``) so the path can be followed across threads, streams and ranks.
Times are microseconds from the path's start, written with three decimals (exact ns).
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import msgspec

PATH_TID = 2_000_000_000  # the "critical path" thread of each rank's process


def _us(ns: int, t0: int) -> str:
    """ns after t0 as microsecond text with three decimals; float() of it prints back the
    same digits (well under 16 significant digits), so the ns survive the round trip."""
    d = ns - t0
    sign = "-" if d < 0 else ""
    d = abs(d)
    return f"{sign}{d // 1000}.{d % 1000:03d}"


def _us_sql(ns: str) -> str:
    """SQL for ``_us``: ns as microsecond text with three decimals (a JSON number)."""
    return (f"(CASE WHEN {ns} < 0 THEN '-' ELSE '' END || abs({ns}) // 1000 || '.' || "
            f"lpad((abs({ns}) % 1000)::VARCHAR, 3, '0'))")


# The trace's events as JSON text, built in DuckDB: one Python object per event instead of
# a dict to encode (the events of a whole trace can be millions; to_json escapes the text).
_EVENTS_JSON = f"""
SELECT '{{"ph":' || to_json(ph) || ',"cat":' || to_json(coalesce(cat, ''))
       || ',"name":' || to_json(coalesce(name, '')) || ',"pid":' || rank
       || ',"tid":' || track_id || ',"ts":' || {_us_sql("(ts_ns - $t0)")}
       || CASE WHEN ph = 'X' THEN ',"dur":' || {_us_sql("coalesce(dur_ns, 0)")}
               ELSE ',"s":"t"' END
       || ',"args":{{"eid":' || eid || '}}}}'
FROM events WHERE job = $job AND ph IN ('X', 'i') AND ts_ns <= $t1 AND end_ns >= $t0
  AND track_kind IN ('cpu_thread', 'gpu_stream', 'gpu_device') AND list_contains($ranks, rank)
ORDER BY rank, ts_ns, eid
"""


def write_path_trace(con: duckdb.DuckDBPyConnection, job: str, segments: list[dict],
                     out: Path, ranks: list[int] | None = None) -> int:
    """Write ``out`` (atomically); returns the number of trace events written. ``ranks``:
    the ranks whose events to include besides those the path runs on (default: all)."""
    if not segments:
        raise ValueError("no critical path segments to write")
    t0 = min(s["start_ns"] for s in segments)
    t1 = max(s["end_ns"] for s in segments)
    if ranks is None:
        ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM trace_files "
                                           "WHERE job = ?", [job]).fetchall()]
    ranks = sorted({s["rank"] for s in segments if s["rank"] is not None} | set(ranks))
    out.parent.mkdir(parents=True, exist_ok=True)  # as report's --out: made when missing
    tmp = out.with_name(out.name + ".tmp")
    n = 0
    encode = msgspec.json.Encoder().encode  # ~10x json.dumps, on tens of thousands of events
    with open(tmp, "wb") as f:
        f.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')
        first = True

        def emit(ev: dict) -> None:
            nonlocal first, n
            f.write((b"" if first else b",\n") + encode(ev))
            first = False
            n += 1

        for r in ranks:
            emit({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
            emit({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
            emit({"ph": "M", "name": "thread_name", "pid": r, "tid": PATH_TID,
                  "args": {"name": "critical path"}})
            emit({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": PATH_TID,
                  "args": {"sort_index": -1}})
        for rank, track_id, name, kind in con.execute("""
                SELECT rank, track_id, coalesce(thread_name, pid_raw || '/' || tid_raw),
                       track_kind FROM tracks WHERE job = ? AND n_events > 0
                  AND list_contains(?, rank)""", [job, ranks]).fetchall():
            emit({"ph": "M", "name": "thread_name", "pid": rank, "tid": track_id,
                  "args": {"name": f"{name} ({kind})"}})
        reader = con.sql(_EVENTS_JSON, params={"job": job, "t0": t0, "t1": t1, "ranks": ranks}
                         ).to_arrow_reader(50_000)
        for batch in reader:
            texts = batch.column(0).to_pylist()
            if texts:
                f.write((b"" if first else b",\n") + ",\n".join(texts).encode())
                first = False
                n += len(texts)
        for i, s in enumerate(segments):
            label = f"{s['kind']}: {s['name']}" if s.get("name") else s["kind"]
            emit({"ph": "X", "cat": "critical_path", "name": label, "pid": s["rank"],
                  "tid": PATH_TID, "ts": float(_us(s["start_ns"], t0)),
                  "dur": float(_us(s["end_ns"] - s["start_ns"], 0)),
                  "args": {"step": s.get("step"), "seq": s["seq"], "eid": s.get("eid"),
                           "track_id": s.get("track_id"), "edge_kind": s.get("edge_kind")}})
            if i + 1 < len(segments) and segments[i + 1].get("step") == s.get("step"):
                nxt = segments[i + 1]
                emit({"ph": "s", "cat": "critical_path", "name": "critical_path", "id": i,
                      "pid": s["rank"], "tid": PATH_TID, "ts": float(_us(s["start_ns"], t0))})
                emit({"ph": "f", "bp": "e", "cat": "critical_path", "name": "critical_path",
                      "id": i, "pid": nxt["rank"], "tid": PATH_TID,
                      "ts": float(_us(nxt["start_ns"], t0))})
        f.write(b"\n]}\n")
    os.replace(tmp, out)
    return n
