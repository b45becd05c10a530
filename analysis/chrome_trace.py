"""Write a job's events and its critical path as one Chrome trace (opens in Perfetto).

One process per rank ("rank R"), one thread per track of that rank (named as in the trace),
and a "critical path" thread per rank holding the path's segments, chained by flow arrows
(cat ``critical_path``) so the path can be followed across threads, streams and ranks.
Counter tracks beside them, as HTA's augmented counters (``_COUNTERS_JSON``): each stream's
launch-queue length, memory-copy bandwidth by direction, and allocated / reserved memory per
device, from the views of the same names. Times are microseconds from the path's start,
written with three decimals (exact ns).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import duckdb
import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from tracetool.outputs import atomic_write

PATH_TID = 2_000_000_000  # the "critical path" thread of each rank's process


def us_text(ns: int) -> str:
    """ns as microsecond text with three decimals; float() of it prints back the same digits
    (well under 16 significant digits), so the ns survive the round trip."""
    sign = "-" if ns < 0 else ""
    return f"{sign}{abs(ns) // 1000}.{abs(ns) % 1000:03d}"


def us_sql(ns: str) -> str:
    """SQL for ``us_text``: ns as microsecond text with three decimals (a JSON number)."""
    return (f"(CASE WHEN {ns} < 0 THEN '-' ELSE '' END || abs({ns}) // 1000 || '.' || "
            f"lpad((abs({ns}) % 1000)::VARCHAR, 3, '0'))")


def arrow_sql(pid: str, ts: str, next_pid: str, next_ts: str) -> str:
    """SQL text, starting with a comma, of the flow arrow from a path segment (its row's
    ``i``: the arrow's id) to the next one: a Chrome trace's "s" and "f" events on the
    ranks' "critical path" threads; ``ts`` and ``next_ts`` in ns from the trace's start."""
    return (f"""',' || chr(10) || '{{"ph":"s","cat":"critical_path","name":"critical_path",'
            || '"id":' || i || ',"pid":' || {pid} || ',"tid":{PATH_TID},"ts":'
            || {us_sql(ts)} || '}}'
            || ',' || chr(10) || '{{"ph":"f","bp":"e","cat":"critical_path",'
            || '"name":"critical_path","id":' || i || ',"pid":' || {next_pid}
            || ',"tid":{PATH_TID},"ts":' || {us_sql(next_ts)} || '}}'""")


class EventArray:
    """The ``traceEvents`` array of a Chrome trace being written to ``f`` (after its
    opening bracket): events from Python dicts, or the JSON texts of a DuckDB query,
    streamed; ``n`` counts the events written."""

    BATCH = 50_000  # query rows per Arrow batch

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.n = 0
        self._encode = msgspec.json.Encoder().encode

    def _texts(self, texts: list[bytes], events: int) -> None:
        if texts:
            self.f.write((b",\n" if self.n else b"") + b",\n".join(texts))
            self.n += events

    def dicts(self, events: list[dict]) -> None:
        self._texts([self._encode(e) for e in events], len(events))

    def query(self, con: duckdb.DuckDBPyConnection, sql: str, params: dict,
              tables: dict[str, pa.Table] | None = None) -> None:
        """The texts of ``sql``'s first column, each holding as many events as its column
        ``n`` says (one each without it), with ``tables`` registered under their names."""
        for name, table in (tables or {}).items():
            con.register(name, table)
        try:
            for batch in con.sql(sql, params=params).to_arrow_reader(self.BATCH):
                texts = [t.encode() for t in batch.column(0).to_pylist()]
                counted = "n" in batch.schema.names
                self._texts(texts, sum(batch.column("n").to_pylist()) if counted
                            else batch.num_rows)
        finally:
            for name in tables or {}:
                con.unregister(name)


# The trace's events as JSON text, built in DuckDB: one Python object per event instead of
# a dict to encode (the events of a whole trace can be millions; to_json escapes the text).
_EVENTS_JSON = f"""
SELECT '{{"ph":' || to_json(ph) || ',"cat":' || to_json(coalesce(cat, ''))
       || ',"name":' || to_json(coalesce(name, '')) || ',"pid":' || rank
       || ',"tid":' || track_id || ',"ts":' || {us_sql("(ts_ns - $t0)")}
       || CASE WHEN ph = 'X' THEN ',"dur":' || {us_sql("coalesce(dur_ns, 0)")}
               ELSE ',"s":"t"' END
       || ',"args":{{"eid":' || eid || '}}}}'
FROM events WHERE job = $job AND ph IN ('X', 'i') AND ts_ns <= $t1 AND end_ns >= $t0
  AND track_kind IN ('cpu_thread', 'gpu_stream', 'gpu_device') AND list_contains($ranks, rank)
ORDER BY rank, ts_ns, eid
"""


# Counter tracks (ph C) as JSON text, on each rank's process within [$t0, $t1]: the step
# functions of stream_queue_length (the rows that change it: launches and starts),
# memory_bw_time_series (each segment's start) and memory_timeline (allocated and reserved
# bytes after each allocator event). Perfetto names a track "<name> <arg key>".
_COUNTERS_JSON = f"""
WITH c AS (
    SELECT rank, ts_ns, eid AS o, 'queue length (device ' || device || ' stream ' || stream
               || ')' AS name, '{{"ops":' || queue_length || '}}' AS args
    FROM stream_queue_length
    WHERE job = $job AND event <> 'end' AND list_contains($ranks, rank)
      AND ts_ns BETWEEN $t0 AND $t1
    UNION ALL
    SELECT rank, start_ns, 0, 'memory bandwidth ' || direction,
           '{{"GB/s":' || bw_gbps || '}}'
    FROM memory_bw_time_series
    WHERE job = $job AND list_contains($ranks, rank) AND start_ns BETWEEN $t0 AND $t1
    UNION ALL
    SELECT rank, ts_ns, eid, 'memory (' || device_type || ':' || device || ')',
           '{{"allocated bytes":' || allocated_bytes
           || coalesce(',"reserved bytes":' || reserved_bytes, '') || '}}'
    FROM memory_timeline
    WHERE job = $job AND list_contains($ranks, rank) AND ts_ns BETWEEN $t0 AND $t1)
SELECT '{{"ph":"C","name":' || to_json(name) || ',"pid":' || rank || ',"ts":'
       || {us_sql("(ts_ns - $t0)")} || ',"args":' || args || '}}'
FROM c ORDER BY rank, name, ts_ns, o
"""


# The path's segments as JSON text, built in DuckDB over the Arrow table of them registered
# as _path_trace_segments (critical_path's columns; ``{missing}`` adds the optional ones it
# lacks): each segment's slice on its rank's "critical path" thread, then, when the next
# segment is of the same step, a flow arrow from this segment's start to the next one's (id:
# the segment's position in (step, seq) order). ``n``: the trace events a row holds (1, or 3
# with the arrow).
_SEGMENTS_JSON = f"""
WITH s AS (
    SELECT *, row_number() OVER w - 1 AS i, lead(seq) OVER w IS NOT NULL
               AND lead(step) OVER w IS NOT DISTINCT FROM step AS arrow,
           lead(rank) OVER w AS next_rank, lead(start_ns) OVER w AS next_start_ns
    FROM (SELECT * {{missing}} FROM _path_trace_segments) WINDOW w AS (ORDER BY step, seq))
SELECT '{{"ph":"X","cat":"critical_path","name":'
       || to_json(CASE WHEN coalesce(name, '') <> '' THEN kind || ': ' || name ELSE kind END)
       || ',"pid":' || coalesce(rank::VARCHAR, 'null') || ',"tid":{PATH_TID},"ts":'
       || {us_sql("(start_ns - $t0)")} || ',"dur":' || {us_sql("(end_ns - start_ns)")}
       || ',"args":{{"step":' || coalesce(step::VARCHAR, 'null') || ',"seq":' || seq
       || ',"eid":' || coalesce(eid::VARCHAR, 'null')
       || ',"track_id":' || coalesce(track_id::VARCHAR, 'null')
       || ',"edge_kind":' || coalesce(to_json(edge_kind), 'null') || '}}}}'
       || CASE WHEN arrow THEN
            {arrow_sql("coalesce(rank::VARCHAR, 'null')", "(start_ns - $t0)",
                       "coalesce(next_rank::VARCHAR, 'null')", "(next_start_ns - $t0)")}
          ELSE '' END AS text,
       CASE WHEN arrow THEN 3 ELSE 1 END AS n
FROM s ORDER BY i
"""


# segment columns the trace can do without (a window's path has no step, idle time no event)
_OPTIONAL = {"step": "INTEGER", "eid": "BIGINT", "track_id": "INTEGER", "edge_kind": "VARCHAR",
             "name": "VARCHAR"}


def write_path_trace(con: duckdb.DuckDBPyConnection, job: str, segments: pa.Table,
                     out: Path, ranks: list[int] | None = None) -> int:
    """Write ``out`` (atomically); returns the number of trace events written. ``segments``:
    rows of the critical_path view, in any order (rank, seq, kind, start_ns and end_ns
    needed; without ``name`` a slice is named by its kind alone). ``ranks``: the ranks whose
    events to include besides those the path runs on (default: all). Every event is built
    as JSON text in DuckDB: a whole trace's path is hundreds of thousands of segments."""
    if not segments.num_rows:
        raise ValueError("no critical path segments to write")
    t0, t1 = pc.min(segments["start_ns"]).as_py(), pc.max(segments["end_ns"]).as_py()
    if ranks is None:
        ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM trace_files "
                                           "WHERE job = ?", [job]).fetchall()]
    on_path = pc.unique(segments["rank"].drop_null()).to_pylist()
    ranks = sorted(set(on_path) | set(ranks))
    with atomic_write(out) as f:  # missing directories made, as for report's --out
        f.write(b'{"displayTimeUnit": "ns", "traceEvents": [\n')
        events = EventArray(f)
        for r in ranks:
            events.dicts([
                {"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}},
                {"ph": "M", "name": "process_sort_index", "pid": r,
                 "args": {"sort_index": r}},
                {"ph": "M", "name": "thread_name", "pid": r, "tid": PATH_TID,
                 "args": {"name": "critical path"}},
                {"ph": "M", "name": "thread_sort_index", "pid": r, "tid": PATH_TID,
                 "args": {"sort_index": -1}}])
        events.dicts([{"ph": "M", "name": "thread_name", "pid": rank, "tid": track_id,
                       "args": {"name": f"{name} ({kind})"}}
                      for rank, track_id, name, kind in con.execute("""
                SELECT rank, track_id, coalesce(thread_name, pid_raw || '/' || tid_raw),
                       track_kind FROM tracks WHERE job = ? AND n_events > 0
                  AND list_contains(?, rank)""", [job, ranks]).fetchall()])
        events.query(con, _EVENTS_JSON, {"job": job, "t0": t0, "t1": t1, "ranks": ranks})
        events.query(con, _COUNTERS_JSON, {"job": job, "t0": t0, "t1": t1, "ranks": ranks})
        missing = "".join(f", NULL::{t} AS {c}" for c, t in _OPTIONAL.items()
                          if c not in segments.column_names)
        events.query(con, _SEGMENTS_JSON.replace("{missing}", missing), {"t0": t0},
                     {"_path_trace_segments": segments})
        f.write(b"\n]}\n")
    return events.n
