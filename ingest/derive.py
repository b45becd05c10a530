"""Second stage: turn the workers' per-piece Parquet parts into the store's tables.

DuckDB (multi-threaded, spilling under a memory limit) reads only the light columns of the
staged events; two Python passes over sorted integer columns pair B/E events and compute the
per-track nesting and flow binding. Per-event results go to dense arrays indexed by eid, from
which the workers write the final events parts (``finish.py``); the small tables (flows,
counters, metadata, tracks) and the derived ones (gpu_ops, steps, collectives) are written
here with SQL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracetool.schema import TABLES_BY_NAME
from tracetool.sqltext import literal, path_list

from .finish import FinishJob, save_dense
from .kinds import CPU_KINDS, GPU_KINDS, LAUNCH_KINDS
from .nesting import nest_and_bind
from .workers import full_events_part

COMM_KERNEL = ("(g.name ILIKE 'nccl%' OR g.name ILIKE '%rccl%' OR g.name ILIKE '%multimem%' "
               "OR g.name ILIKE '%all_reduce%kernel%' OR g.name ILIKE '%allreduce%kernel%' "
               "OR g.args LIKE '%\"Collective name\"%')")
STEP_NUMBER = r"TRY_CAST(regexp_extract(name, 'ProfilerStep#(\d+)', 1) AS INTEGER)"

# JSON paths of the GPU op columns read from args -> the column (bytes: size's fallback)
GPU_ARG_PATHS = {
    "$.grid[0]": "grid_x", "$.grid[1]": "grid_y", "$.grid[2]": "grid_z",
    "$.block[0]": "block_x", "$.block[1]": "block_y", "$.block[2]": "block_z",
    '$."registers per thread"': "registers_per_thread", '$."shared memory"': "shared_memory",
    "$.bytes": "bytes", "$.size": "size",
}

MapFn = Callable[[Callable, Iterable], Iterable]
BATCH_ROWS = 1 << 18
# The track of every flow event (eid, track_id, ts_ns, ph, bp).
FLOW_TRACKS = """SELECT f.eid, t.track_id, f.ts_ns, f.ph, f.bp FROM fl_raw f
                 JOIN track_ids t ON f.pid_raw IS NOT DISTINCT FROM t.pid_raw
                                 AND f.tid_raw IS NOT DISTINCT FROM t.tid_raw"""


@dataclass
class Derived:
    events_stored: int
    issues: list[tuple]  # (eid, byte_offset, issue, detail, quarantined, snippet)
    graph_s: float = 0.0  # of derive's time, building the dependency graph


def connect(tmp: Path, threads: int, memory_limit: str) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET threads = {max(1, threads)}")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET temp_directory = {literal(tmp / 'duckdb-spill')}")
    con.execute("SET preserve_insertion_order = false")
    return con


def reuse(con: duckdb.DuckDBPyConnection, tmp: Path) -> bool:
    """Point a connection that derived another file at ``tmp``'s spill directory; False when
    DuckDB cannot switch (it spilled into the previous one): then it must be closed."""
    try:
        con.execute(f"SET temp_directory = {literal(tmp / 'duckdb-spill')}")
    except duckdb.Error:
        return False
    return True


def reset(con: duckdb.DuckDBPyConnection) -> None:
    """Drop every table and view a derivation created, so the connection can derive the
    next file from a clean catalog."""
    rows = con.execute("""
        SELECT 'VIEW', database_name, schema_name, view_name FROM duckdb_views()
        WHERE NOT internal
        UNION ALL
        SELECT 'TABLE', database_name, schema_name, table_name FROM duckdb_tables()
        WHERE NOT internal""").fetchall()
    for kind, db, schema, name in rows:
        con.execute(f'DROP {kind} IF EXISTS "{db}"."{schema}"."{name}"')


def _parts(stage: Path, table: str) -> list[Path]:
    return sorted((stage / table).glob("*.parquet"))


def _list(files: list[Path]) -> str:
    return path_list(files)  # any store path: quoted, and never taken for a glob


def table_dir(out: Path, table: str) -> Path:
    d = out / table
    d.mkdir(parents=True, exist_ok=True)
    return d


def events_glob(out: Path) -> str:
    return read_table(out, "events")


def read_table(out: Path, table: str) -> str:
    """read_parquet() over the parts of ``table`` written so far (listed, not globbed)."""
    return f"read_parquet({_list(_parts(out, table))})"


def copy_table(con: duckdb.DuckDBPyConnection, sql: str, out: Path, table: str) -> int:
    """Write a query as out/<table>/part-0.parquet, in the schema's column order and types."""
    t = TABLES_BY_NAME[table]
    cols = ", ".join(f"CAST({c.name} AS {c.sql_type}) AS {c.name}" for c in t.columns)
    order = f" ORDER BY {', '.join(t.sort_key)}" if t.sort_key else ""
    path = table_dir(out, table) / "part-0.parquet"
    con.execute(f"COPY (SELECT {cols} FROM ({sql}){order}) TO {literal(path)} "
                "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 131072)")
    return pq.ParquetFile(path).metadata.num_rows


def write_arrow(table: pa.Table, out: Path, name: str) -> None:
    pq.write_table(table.cast(TABLES_BY_NAME[name].schema),
                   table_dir(out, name) / "part-0.parquet", compression="zstd")


def empty_table(out: Path, name: str) -> None:
    write_arrow(TABLES_BY_NAME[name].schema.empty_table(), out, name)


def derive(
    con: duckdb.DuckDBPyConnection,
    stage: Path,
    out: Path,
    offsets: dict[int, int],
    total: int,
    base_ns: int,
    pg_ranks: dict[str, list[int]],
    parallel_map: MapFn,
) -> Derived:
    work = stage.parent
    issues: list[tuple] = []
    con.execute("CREATE OR REPLACE TABLE offsets(piece INTEGER, off BIGINT)")
    con.executemany("INSERT INTO offsets VALUES (?, ?)", list(offsets.items()))
    ev_parts, fl_parts = _parts(stage, "events"), _parts(stage, "flows")
    _stage_views(con, ev_parts, fl_parts, base_ns)

    be_fix = _pair_begin_end(con, issues)
    con.execute("CREATE OR REPLACE TABLE be_fix(eid BIGINT, dur_ns BIGINT, drop_row BOOLEAN)")
    if be_fix:
        con.executemany("INSERT INTO be_fix VALUES (?, ?, ?)", be_fix)
    con.execute("""
        CREATE OR REPLACE TABLE track_ids AS
        SELECT pid_raw, tid_raw,
               (row_number() OVER (ORDER BY TRY_CAST(pid_raw AS BIGINT) NULLS LAST, pid_raw,
                                   TRY_CAST(tid_raw AS BIGINT) NULLS LAST, tid_raw) - 1)::INTEGER
                   AS track_id
        FROM (SELECT DISTINCT pid_raw, tid_raw FROM ev_raw
              UNION SELECT DISTINCT pid_raw, tid_raw FROM fl_raw)""")
    con.execute("""
        CREATE OR REPLACE TABLE ev AS
        SELECT e.eid, t.track_id, e.kind, e.ts_ns,
               CASE WHEN f.eid IS NOT NULL THEN f.dur_ns ELSE e.dur_ns END AS dur_ns,
               e.ph IN ('X', 'B', 'i', 'I', 'R') AS nests
        FROM ev_raw e JOIN track_ids t
          ON e.pid_raw IS NOT DISTINCT FROM t.pid_raw AND e.tid_raw IS NOT DISTINCT FROM t.tid_raw
        LEFT JOIN be_fix f ON f.eid = e.eid
        WHERE NOT coalesce(f.drop_row, false)""")
    gpu = ", ".join(f"'{k}'" for k in GPU_KINDS)
    cpu = ", ".join(f"'{k}'" for k in CPU_KINDS)
    con.execute(f"""
        CREATE OR REPLACE TABLE track_kinds AS
        SELECT track_id,
               CASE WHEN bool_or(kind IN ({gpu})) THEN 'gpu_stream'
                    WHEN bool_and(kind = 'cuda_sync') THEN 'gpu_device'
                    WHEN bool_or(kind IN ({cpu})) THEN 'cpu_thread'
                    WHEN bool_and(kind = 'overhead') THEN 'overhead'
                    WHEN bool_and(kind = 'trace_span') THEN 'span'
                    ELSE 'other' END AS track_kind,
               count(*) AS n_events, min(ts_ns) AS first_ns,
               max(ts_ns + coalesce(dur_ns, 0)) AS last_ns
        FROM ev GROUP BY track_id""")
    n_tracks = con.execute("SELECT count(*) FROM track_ids").fetchone()[0]
    kinds = ["other"] * n_tracks
    for tid, k in con.execute("SELECT track_id, track_kind FROM track_kinds").fetchall():
        kinds[tid] = k

    derived = work / "derived"
    _nesting_and_flows(con, derived, total)
    con.execute("DROP TABLE ev")  # free DuckDB's memory for the queries that follow
    fixes = [(e, -1 if d is None else d) for e, d, drop in be_fix if not drop]
    fixes.sort()
    save_dense(derived,
               drop_eid=np.array(sorted(e for e, _, drop in be_fix if drop), dtype=np.int64),
               fix_eid=np.array([e for e, _ in fixes], dtype=np.int64),
               fix_dur=np.array([d for _, d in fixes], dtype=np.int64))

    ev_dir, fl_dir = table_dir(out, "events"), table_dir(out, "flows")
    fl_staged = {int(p.stem) for p in fl_parts}
    jobs = [FinishJob(str(full_events_part(p)), str(ev_dir / f"part-{i:05d}.parquet"),
                      str(stage / "flows" / p.name) if int(p.stem) in fl_staged else "",
                      str(fl_dir / f"part-{i:05d}.parquet"), str(derived),
                      offsets[int(p.stem)], base_ns, tuple(kinds))
            for i, p in enumerate(ev_parts)]
    # a piece with flows but no other events (rare) still gets its flows part
    ev_staged = {int(p.stem) for p in ev_parts}
    jobs += [FinishJob("", "", str(p), str(fl_dir / f"part-{len(jobs) + i:05d}.parquet"),
                       str(derived), offsets[int(p.stem)], base_ns, tuple(kinds))
             for i, p in enumerate(p for p in fl_parts if int(p.stem) not in ev_staged)]
    from .finish import finish_part

    written = list(parallel_map(finish_part, jobs))
    n_events = sum(e for e, _ in written)
    n_flows = sum(f for _, f in written)
    if not any(j.out_part for j in jobs):
        empty_table(out, "events")
    if not n_flows:
        empty_table(out, "flows")
    n_unmatched_e = sum(1 for i in issues if i[2] == "unmatched_end")
    n_merged_e = sum(1 for _, _, d in be_fix if d) - n_unmatched_e

    n_counter_events = _counters(con, stage, out, base_ns)
    n_meta = _metadata_and_tracks(con, stage, out)
    derive_gpu_ops(con, out)
    derive_steps(con, out)
    derive_collectives(con, out, pg_ranks)
    t0 = time.perf_counter()
    derive_graph(con, out)
    graph_s = time.perf_counter() - t0
    stored = n_events + n_merged_e + n_flows + n_counter_events + n_meta
    return Derived(stored, issues, graph_s)


def _stage_views(con: duckdb.DuckDBPyConnection, ev_parts: list[Path], fl_parts: list[Path],
                 base_ns: int) -> None:
    if ev_parts:
        con.execute(f"""
            CREATE OR REPLACE VIEW ev_raw AS
            SELECT r.ord + o.off AS eid, r.ph, r.kind, r.ts_ns + {base_ns} AS ts_ns, r.dur_ns,
                   r.pid_raw, r.tid_raw
            FROM read_parquet({_list(ev_parts)}) r JOIN offsets o USING (piece)""")
    else:
        con.execute("""CREATE OR REPLACE VIEW ev_raw AS SELECT NULL::BIGINT eid,
            NULL::VARCHAR ph, NULL::VARCHAR kind, NULL::BIGINT ts_ns, NULL::BIGINT dur_ns,
            NULL::VARCHAR pid_raw, NULL::VARCHAR tid_raw WHERE false""")
    if fl_parts:
        con.execute(f"""
            CREATE OR REPLACE VIEW fl_raw AS
            SELECT r.* EXCLUDE (ord, piece, ts_ns), r.ord + o.off AS eid,
                   r.ts_ns + {base_ns} AS ts_ns
            FROM read_parquet({_list(fl_parts)}) r JOIN offsets o USING (piece)""")
    else:
        con.execute("""CREATE OR REPLACE VIEW fl_raw AS SELECT NULL::VARCHAR ph,
            NULL::VARCHAR cat, NULL::VARCHAR name, NULL::BIGINT flow_id,
            NULL::VARCHAR flow_id_raw, NULL::VARCHAR pid_raw, NULL::VARCHAR tid_raw,
            NULL::VARCHAR bp, NULL::BIGINT eid, NULL::BIGINT ts_ns WHERE false""")


def _batches(con: duckdb.DuckDBPyConnection, sql: str) -> Iterator[dict[str, np.ndarray]]:
    reader = con.sql(sql).to_arrow_reader(BATCH_ROWS)
    for batch in reader:
        yield {name: col.to_numpy(zero_copy_only=False)
               for name, col in zip(batch.schema.names, batch.columns, strict=True)}


def _nesting_and_flows(con: duckdb.DuckDBPyConnection, derived: Path, total: int) -> None:
    """Dense per-eid depth/parent/overlap/track arrays (memory-mapped .npy files, filled
    from batches); each flow's bound slice (``flow_eid``/``flow_bound``, by eid) and the flows
    bound to each slice (``fl_*``, sorted by bound slice then flow eid), from which the
    workers write the flows parts and the events' flow_out/flow_in lists (memory-mapped too:
    this process never holds them whole)."""
    derived.mkdir(parents=True, exist_ok=True)

    def dense(name: str, dtype: type, fill: int, n: int = total) -> np.ndarray:
        arr = np.lib.format.open_memmap(derived / f"{name}.npy", mode="w+", dtype=dtype,
                                        shape=(n,))
        arr[:] = fill
        return arr

    depth, parent = dense("depth", np.int32, -1), dense("parent", np.int64, -1)
    overlap, track = dense("overlap", np.bool_, 0), dense("track", np.int32, -1)
    for b in _batches(con, "SELECT eid, track_id FROM ev UNION ALL "
                           f"SELECT eid, track_id FROM ({FLOW_TRACKS})"):
        track[b["eid"]] = b["track_id"]
    flow_eids, bound = nest_and_bind(
        _batches(con, """SELECT track_id, ts_ns, coalesce(dur_ns, 0) AS dur_ns, eid FROM ev
                         WHERE nests ORDER BY track_id, ts_ns, dur_ns DESC, eid"""),
        _batches(con.cursor(), f"""
            SELECT f.eid, f.track_id, f.ts_ns, (f.ph = 'f' AND f.bp IS DISTINCT FROM 'e') AS nxt
            FROM ({FLOW_TRACKS}) f ORDER BY f.track_id, f.ts_ns, f.eid"""),
        depth, parent, overlap)
    # (no flush: a shared mapping's pages are the page cache, which the workers' memory maps
    # read; msync would only write them to disk, ~5 ms per array, per file)
    del depth, parent, overlap, track
    # Both orders come from DuckDB's sort (it spills under its memory limit): this process
    # holds only the merge's own output (16 bytes per flow), no sorted copies.
    f_bound = np.frombuffer(bound, dtype=np.int64)
    con.register("bound_arrow", pa.table({"eid": pa.array(np.frombuffer(flow_eids, np.int64)),
                                          "bound_eid": pa.array(f_bound)}))
    n_bound = int((f_bound >= 0).sum())
    del f_bound
    _fill(con, "SELECT eid, bound_eid FROM bound_arrow ORDER BY eid",
          {"eid": dense("flow_eid", np.int64, -1, len(flow_eids)),
           "bound_eid": dense("flow_bound", np.int64, -1, len(flow_eids))})
    _fill(con, """SELECT b.bound_eid, coalesce(f.flow_id, 0) AS flow_id,
                         f.flow_id IS NOT NULL AS valid, f.ph = 's' AS is_out
                  FROM fl_raw f JOIN bound_arrow b USING (eid) WHERE b.bound_eid >= 0
                  ORDER BY b.bound_eid, f.eid""",
          {"bound_eid": dense("fl_bound", np.int64, -1, n_bound),
           "flow_id": dense("fl_id", np.int64, 0, n_bound),
           "valid": dense("fl_valid", np.bool_, 0, n_bound),
           "is_out": dense("fl_out", np.bool_, 0, n_bound)})
    con.unregister("bound_arrow")


def _fill(con: duckdb.DuckDBPyConnection, sql: str, arrays: dict[str, np.ndarray]) -> None:
    """Stream a query's columns, in order, into (memory-mapped) arrays of its row count."""
    at = 0
    for b in _batches(con, sql):
        k = len(next(iter(b.values())))
        for name, arr in arrays.items():
            arr[at:at + k] = b[name]
        at += k


def _counters(con: duckdb.DuckDBPyConnection, stage: Path, out: Path, base_ns: int) -> int:
    parts = _parts(stage, "counters")
    if not parts:
        empty_table(out, "counters")
        return 0
    copy_table(con, f"""
        SELECT r.* EXCLUDE (ord, piece, ts_ns), r.ord + o.off AS eid,
               r.ts_ns + {base_ns} AS ts_ns
        FROM read_parquet({_list(parts)}) r JOIN offsets o USING (piece)""", out, "counters")
    return con.execute(f"SELECT count(DISTINCT eid) FROM {read_table(out, 'counters')}"
                       ).fetchone()[0]


def _metadata_and_tracks(con: duckdb.DuckDBPyConnection, stage: Path, out: Path) -> int:
    parts = _parts(stage, "metadata_events")
    n_meta = 0
    if parts:
        n_meta = copy_table(con, f"""
            SELECT r.* EXCLUDE (ord, piece), r.ord + o.off AS eid
            FROM read_parquet({_list(parts)}) r JOIN offsets o USING (piece)""",
            out, "metadata_events")
    else:
        empty_table(out, "metadata_events")
    md = read_table(out, "metadata_events")
    copy_table(con, f"""
        WITH names AS (
            SELECT pid_raw, tid_raw, name, value, eid FROM {md}
            WHERE name IN ('process_name', 'process_labels', 'thread_name')),
        pname AS (SELECT pid_raw, arg_max(value, eid) AS v FROM names
                  WHERE name = 'process_name' GROUP BY ALL),
        plabel AS (SELECT pid_raw, arg_max(value, eid) AS v FROM names
                   WHERE name = 'process_labels' GROUP BY ALL),
        tname AS (SELECT pid_raw, tid_raw, arg_max(value, eid) AS v FROM names
                  WHERE name = 'thread_name' GROUP BY ALL)
        SELECT t.track_id, t.pid_raw, t.tid_raw, TRY_CAST(t.pid_raw AS BIGINT) AS pid,
               TRY_CAST(t.tid_raw AS BIGINT) AS tid, coalesce(k.track_kind, 'other') AS track_kind,
               pn.v AS process_name, pl.v AS process_labels, rtrim(tn.v) AS thread_name,
               coalesce(k.n_events, 0) AS n_events, k.first_ns, k.last_ns
        FROM track_ids t LEFT JOIN track_kinds k USING (track_id)
        LEFT JOIN pname pn ON pn.pid_raw IS NOT DISTINCT FROM t.pid_raw
        LEFT JOIN plabel pl ON pl.pid_raw IS NOT DISTINCT FROM t.pid_raw
        LEFT JOIN tname tn ON tn.pid_raw IS NOT DISTINCT FROM t.pid_raw
                          AND tn.tid_raw IS NOT DISTINCT FROM t.tid_raw""", out, "tracks")
    return n_meta


def _pair_begin_end(con: duckdb.DuckDBPyConnection, issues: list[tuple]) -> list[tuple]:
    """(eid, dur or None, drop) fixes: an E closes the innermost open B on its thread."""
    rows = con.execute("""
        SELECT eid, ph, pid_raw, tid_raw, ts_ns FROM ev_raw WHERE ph IN ('B', 'E')
        ORDER BY pid_raw, tid_raw, ts_ns, CASE ph WHEN 'E' THEN 0 ELSE 1 END, eid""").fetchall()
    fixes: list[tuple] = []
    stack: list[tuple[int, int]] = []
    cur = None
    for eid, ph, pid, tid, ts in rows:
        if (pid, tid) != cur:
            fixes += [(b_eid, None, False) for b_eid, _ in stack]
            stack.clear()
            cur = (pid, tid)
        if ph == "B":
            stack.append((eid, ts))
        elif stack:
            b_eid, b_ts = stack.pop()
            fixes.append((b_eid, ts - b_ts, False))
            fixes.append((eid, None, True))
        else:
            fixes.append((eid, None, True))
            issues.append((eid, None, "unmatched_end", "E event with no open B on its thread",
                           True, None))
    fixes += [(b_eid, None, False) for b_eid, _ in stack]
    return fixes


def _cpu_steps(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    con.execute(f"""
        CREATE OR REPLACE TABLE cpu_steps AS
        SELECT {STEP_NUMBER} AS step, eid, tid, ts_ns AS start_ns,
               coalesce(end_ns, 9223372036854775807) AS cpu_end_ns, end_ns, dur_ns, args
        FROM {events_glob(out)}
        WHERE kind IN ('user_annotation', 'cpu_op')  -- 2021 traces: cat Operator
          AND name LIKE 'ProfilerStep#%' AND {STEP_NUMBER} IS NOT NULL
    """)


def derive_gpu_ops(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    """GPU ops with their launch (same correlation) and issuing CPU op: the launch's parent
    when that is a cpu_op, else the cpu_op with the same External id. Each join's build side
    is cut down to the rows the GPU ops need, so this stays within DuckDB's memory limit."""
    ev = events_glob(out)
    launch = ", ".join(f"'{k}'" for k in LAUNCH_KINDS)
    _cpu_steps(con, out)
    # one parse of args per GPU op for all nine values (DuckDB's list-of-paths form)
    paths = ", ".join(f"'{p}'" for p in GPU_ARG_PATHS)
    x = {name: f"TRY_CAST(jx[{i + 1}] AS BIGINT)" for i, name in enumerate(GPU_ARG_PATHS.values())}
    con.execute(f"""
        CREATE OR REPLACE TABLE g AS
        SELECT eid, kind, name, coalesce(device, pid)::INTEGER AS device,
               coalesce(stream, tid) AS stream, ts_ns, dur_ns, end_ns, correlation, external_id,
               {x['grid_x']} AS grid_x, {x['grid_y']} AS grid_y, {x['grid_z']} AS grid_z,
               {x['block_x']} AS block_x, {x['block_y']} AS block_y, {x['block_z']} AS block_z,
               {x['registers_per_thread']} AS registers_per_thread,
               {x['shared_memory']} AS shared_memory,
               coalesce({x['bytes']}, {x['size']}) AS bytes, is_comm
        FROM (SELECT *, json_extract_string(args, [{paths}]) AS jx,
                     (kind = 'kernel' AND {COMM_KERNEL.replace('g.', '')}) AS is_comm
              FROM {ev} WHERE kind IN ('kernel', 'memcpy', 'memset'))""")
    con.execute(f"""
        CREATE OR REPLACE TABLE l AS
        SELECT correlation,
               arg_min({{'eid': eid, 'name': name, 'ts_ns': ts_ns, 'tid': tid,
                        'parent_eid': parent_eid}}, ts_ns) AS x
        FROM {ev}
        WHERE kind IN ({launch}) AND correlation IN (SELECT correlation FROM g)
        GROUP BY correlation""")
    con.execute("""
        CREATE OR REPLACE TABLE j AS
        SELECT g.*, l.x.eid AS launch_eid, l.x.name AS launch_name, l.x.ts_ns AS launch_ts_ns,
               l.x.tid AS launch_tid, l.x.parent_eid AS launch_parent,
               coalesce(l.x.ts_ns, g.ts_ns) AS anchor_ns
        FROM g LEFT JOIN l USING (correlation)""")
    con.execute("DROP TABLE g; DROP TABLE l")
    con.execute(f"""
        CREATE OR REPLACE TABLE ops AS
        SELECT eid, name, external_id FROM {ev}
        WHERE kind = 'cpu_op' AND (eid IN (SELECT launch_parent FROM j)
                                   OR external_id IN (SELECT external_id FROM j))""")
    # The step of each op: an ASOF join of just (eid, anchor) against the steps, then a hash
    # join back (DuckDB's ASOF join sorts its whole input: with the names along it was 30x
    # slower).
    con.execute("""
        CREATE OR REPLACE TABLE op_step AS
        SELECT a.eid, CASE WHEN a.anchor_ns < s.cpu_end_ns THEN s.step END AS step
        FROM (SELECT eid, anchor_ns FROM j) a
        ASOF LEFT JOIN cpu_steps s ON a.anchor_ns >= s.start_ns""")
    copy_table(con, """
        WITH ext AS (SELECT external_id, min(eid) AS eid FROM ops
                     WHERE external_id IS NOT NULL GROUP BY external_id),
        jo AS (SELECT j.*, coalesce(p.eid, x.eid) AS op_eid FROM j
               LEFT JOIN ops p ON p.eid = j.launch_parent
               LEFT JOIN ext x ON x.external_id = j.external_id)
        SELECT jo.*, o.name AS op_name, st.step
        FROM jo LEFT JOIN ops o ON o.eid = jo.op_eid
        LEFT JOIN op_step st ON st.eid = jo.eid""", out, "gpu_ops")
    con.execute("DROP TABLE j; DROP TABLE ops; DROP TABLE op_step")


def derive_steps(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    """profiler_steps: the facts of each ProfilerStep#N annotation the analysis ``steps``
    view tiles the timeline from (docs/steps.md). The GPU-side start is the first GPU op at or
    after the step's GPU annotation (gpu_user_annotation ProfilerStep#N) on its device where
    the trace has one, else the earliest op launched inside the step."""
    g = read_table(out, "gpu_ops")
    copy_table(con, f"""
        WITH gs AS (SELECT step, min(ts_ns) AS gpu_start_ns, max(end_ns) AS gpu_end_ns,
                           arg_min(eid, (ts_ns, eid)) AS first_eid, count(*) AS n_gpu_ops
                    FROM {g} WHERE step IS NOT NULL GROUP BY step),
        ann AS (SELECT {STEP_NUMBER} AS step, min(ts_ns) AS ann_ns,
                       arg_min(coalesce(device, pid), ts_ns) AS device
                FROM {events_glob(out)}
                WHERE kind = 'gpu_user_annotation' AND name LIKE 'ProfilerStep#%'
                GROUP BY ALL HAVING step IS NOT NULL),
        ops AS (SELECT device, ts_ns, eid FROM {g}),
        first_after AS (
            SELECT a.step, a.ann_ns, o.eid, o.ts_ns FROM ann a
            ASOF LEFT JOIN ops o ON o.device = a.device AND o.ts_ns >= a.ann_ns)
        SELECT s.step, s.eid, s.tid, s.start_ns AS cpu_start_ns, s.end_ns AS cpu_end_ns,
               NOT (s.dur_ns IS NULL OR s.args LIKE '%"finished": false%'
                    OR s.args LIKE '%"finished":false%') AS finished,
               gs.gpu_start_ns, gs.gpu_end_ns, coalesce(gs.n_gpu_ops, 0) AS n_gpu_ops,
               f.ann_ns AS gpu_annotation_ns,
               CASE WHEN f.eid IS NOT NULL THEN f.eid ELSE gs.first_eid END AS gpu_first_eid,
               CASE WHEN f.eid IS NOT NULL THEN f.ts_ns ELSE gs.gpu_start_ns END
                   AS gpu_first_ns
        FROM cpu_steps s LEFT JOIN gs USING (step) LEFT JOIN first_after f USING (step)
        QUALIFY row_number() OVER (PARTITION BY s.step ORDER BY s.start_ns, s.eid) = 1
        """, out, "profiler_steps")


def derive_collectives(
    con: duckdb.DuckDBPyConnection, out: Path, pg_ranks: dict[str, list[int]]
) -> None:
    from .collectives import build

    write_arrow(build(con, out, pg_ranks), out, "collectives")


def derive_graph(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    """cp_nodes and rank_edges: the rank's dependency graph (graph.py), from its tables."""
    from .graph import rank_graph

    tables = {t: read_table(out, t) for t in ("events", "gpu_ops", "collectives")}
    with rank_graph(con, tables) as queries:
        for name, sql in queries.items():
            copy_table(con, sql, out, name)
