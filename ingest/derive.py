"""Second stage: turn the workers' per-piece Parquet parts into the store's tables.

DuckDB (multi-threaded, spilling under a memory limit) reads only the light columns of the
staged events; two Python passes over sorted integer columns pair B/E events and compute the
per-track nesting and flow binding. Per-event results go to dense arrays (indexed by geid:
the batch's files one after another), from which the workers write the final events parts
(``finish.py``); the small tables (flows, counters, metadata, tracks) and the derived ones
(gpu_ops, steps, collectives) are written here with SQL.

A derivation covers a batch of files (``Member``: one trace file's staged parts and output
directory): every query carries the file's index ``file`` in its keys, so one statement
serves all of them. A small file's derivation is ~45 statements whose planning costs more
than their execution (~5 ms each on 2 MB files): batching many small rank files amortizes
it. Results are written per file (``write_split``); a batch of one is a plain derivation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracetool.comm_kernels import Registry, registry
from tracetool.schema import TABLES_BY_NAME
from tracetool.sqltext import literal, path_list

from .finish import FinishJob, save_dense
from .kinds import CPU_KINDS, GPU_KINDS, GPU_OP_KINDS, LAUNCH_KINDS, gpu_op_kind_sql
from .nesting import nest_and_bind
from .workers import full_events_part

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
# The file (Member.index) of a Parquet part, from its path: a member's directories are
# <batch work dir>/<index>/{stage,built}/<table>/<part> (build.py lays them out).
FILE_OF = (r"CAST(regexp_extract({}, '/(\d+)/(?:stage|built)/[^/]+/[^/]+$', 1) "
           "AS INTEGER)")
# The track of every flow event (file, eid, geid, track_id, ts_ns, ph, bp).
FLOW_TRACKS = """SELECT f.file, f.eid, f.geid, t.track_id, f.ts_ns, f.ph, f.bp FROM fl_raw f
                 JOIN track_ids t ON f.file = t.file
                                 AND f.pid_raw IS NOT DISTINCT FROM t.pid_raw
                                 AND f.tid_raw IS NOT DISTINCT FROM t.tid_raw"""


@dataclass
class Member:
    """One trace file of a derivation batch: its staged parts and where its tables go.
    ``ebase``: where its eids start in the batch's dense per-event arrays."""

    index: int
    stage: Path
    out: Path
    offsets: dict[int, int]  # piece -> eid of its first event
    total: int  # events read (eids 0 .. total - 1)
    base_ns: int
    pg_ranks: dict[str, list[int]]
    ebase: int = 0
    # which kernels are communication (the package's registry, plus --comm-kernel entries)
    comm: Registry = field(default_factory=registry)


@dataclass
class Derived:
    events_stored: int
    issues: list[tuple] = field(default_factory=list)  # (eid, byte_offset, issue, detail,
    #                                                     quarantined, snippet)
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


def read_parts(files: list[Path], members: list[Member]) -> str:
    """A subquery over Parquet parts of the batch's members, with each row's ``file`` (a
    constant for a batch of one: a large file's millions of rows need no path parsed)."""
    if len(members) == 1:
        return f"(SELECT *, {members[0].index} AS file FROM read_parquet({_list(files)}))"
    return (f"(SELECT * EXCLUDE (filename), {FILE_OF.format('filename')} AS file "
            f"FROM read_parquet({_list(files)}, filename = true))")


def read_table(members: list[Member], table: str) -> str:
    """The parts of ``table`` written so far by every member (listed, not globbed)."""
    return read_parts([p for m in members for p in _parts(m.out, table)], members)


def staged(members: list[Member], table: str) -> list[Path]:
    return [p for m in members for p in _parts(m.stage, table)]


def write_split(con: duckdb.DuckDBPyConnection, sql: str, members: list[Member],
                table: str) -> list[int]:
    """Write a query (with a ``file`` column) as each member's <table>/part-0.parquet, in
    the schema's column order, types and sort order; rows per member. One member: DuckDB
    streams the COPY (bounded memory for a file of any size); several (small files): one
    sorted result, cut per file."""
    t = TABLES_BY_NAME[table]
    cols = ", ".join(f"CAST({c.name} AS {c.sql_type}) AS {c.name}" for c in t.columns)
    if len(members) == 1:
        order = f" ORDER BY {', '.join(t.sort_key)}" if t.sort_key else ""
        path = table_dir(members[0].out, table) / "part-0.parquet"
        con.execute(f"COPY (SELECT {cols} FROM ({sql}){order}) TO {literal(path)} "
                    "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 131072)")
        return [pq.ParquetFile(path).metadata.num_rows]
    order = ", ".join(("file", *t.sort_key))
    res = con.sql(f"SELECT file, {cols} FROM ({sql}) ORDER BY {order}").to_arrow_table()
    file = res["file"].to_numpy()
    index = np.array([m.index for m in members])
    lo, hi = np.searchsorted(file, index, "left"), np.searchsorted(file, index, "right")
    res = res.drop_columns(["file"])
    for m, a, b in zip(members, lo, hi, strict=True):
        write_arrow(res.slice(a, b - a), m.out, table)
    return [int(n) for n in hi - lo]


def write_arrow(table: pa.Table, out: Path, name: str) -> None:
    pq.write_table(table.cast(TABLES_BY_NAME[name].schema),
                   table_dir(out, name) / "part-0.parquet", compression="zstd",
                   row_group_size=131072)


def empty_table(out: Path, name: str) -> None:
    write_arrow(TABLES_BY_NAME[name].schema.empty_table(), out, name)


def derive(
    con: duckdb.DuckDBPyConnection,
    members: list[Member],
    derived: Path,
    parallel_map: MapFn,
) -> list[Derived]:
    """Derive every table of the batch's members (one Derived per member, in order);
    ``derived``: the batch's dense per-event arrays."""
    results = [Derived(0) for _ in members]
    ebase = 0
    for m in members:
        m.ebase, ebase = ebase, ebase + m.total
    total = ebase
    con.execute("CREATE OR REPLACE TABLE offsets(file INTEGER, piece INTEGER, off BIGINT, "
                "base_ns BIGINT, ebase BIGINT)")
    con.executemany("INSERT INTO offsets VALUES (?, ?, ?, ?, ?)",
                    [(m.index, piece, off, m.base_ns, m.ebase) for m in members
                     for piece, off in m.offsets.items()])
    ev_parts, fl_parts = staged(members, "events"), staged(members, "flows")
    _stage_views(con, ev_parts, fl_parts, members)

    be_fix = _pair_begin_end(con, {m.index: d for m, d in zip(members, results, strict=True)})
    con.execute("CREATE OR REPLACE TABLE be_fix(file INTEGER, eid BIGINT, dur_ns BIGINT, "
                "drop_row BOOLEAN)")
    if be_fix:
        con.executemany("INSERT INTO be_fix VALUES (?, ?, ?, ?)", be_fix)
    con.execute("""
        CREATE OR REPLACE TABLE track_ids AS
        SELECT file, pid_raw, tid_raw,
               (row_number() OVER (PARTITION BY file
                                   ORDER BY TRY_CAST(pid_raw AS BIGINT) NULLS LAST, pid_raw,
                                   TRY_CAST(tid_raw AS BIGINT) NULLS LAST, tid_raw) - 1)::INTEGER
                   AS track_id
        FROM (SELECT DISTINCT file, pid_raw, tid_raw FROM ev_raw
              UNION SELECT DISTINCT file, pid_raw, tid_raw FROM fl_raw)""")
    con.execute("""
        CREATE OR REPLACE TABLE ev AS
        SELECT e.file, e.eid, e.geid, t.track_id, e.kind, e.ts_ns,
               CASE WHEN f.eid IS NOT NULL THEN f.dur_ns ELSE e.dur_ns END AS dur_ns,
               e.ph IN ('X', 'B', 'i', 'I', 'R') AS nests
        FROM ev_raw e JOIN track_ids t
          ON e.file = t.file AND e.pid_raw IS NOT DISTINCT FROM t.pid_raw
         AND e.tid_raw IS NOT DISTINCT FROM t.tid_raw
        LEFT JOIN be_fix f ON f.file = e.file AND f.eid = e.eid
        WHERE NOT coalesce(f.drop_row, false)""")
    gpu = ", ".join(f"'{k}'" for k in GPU_KINDS)
    cpu = ", ".join(f"'{k}'" for k in CPU_KINDS)
    con.execute(f"""
        CREATE OR REPLACE TABLE track_kinds AS
        SELECT file, track_id,
               CASE WHEN bool_or(kind IN ({gpu})) THEN 'gpu_stream'
                    WHEN bool_and(kind = 'cuda_sync') THEN 'gpu_device'
                    WHEN bool_or(kind IN ({cpu})) THEN 'cpu_thread'
                    WHEN bool_and(kind = 'overhead') THEN 'overhead'
                    WHEN bool_and(kind = 'trace_span') THEN 'span'
                    ELSE 'other' END AS track_kind,
               count(*) AS n_events, min(ts_ns) AS first_ns,
               max(ts_ns + coalesce(dur_ns, 0)) AS last_ns
        FROM ev GROUP BY file, track_id""")
    kinds = _kinds_by_track(con, members)

    _nesting_and_flows(con, derived, total)
    con.execute("DROP TABLE ev")  # free DuckDB's memory for the queries that follow
    by_index = {m.index: m for m in members}
    fixes = sorted((by_index[f].ebase + e, -1 if d is None else d)
                   for f, e, d, drop in be_fix if not drop)
    save_dense(derived,
               drop_eid=np.array(sorted(by_index[f].ebase + e for f, e, _, drop in be_fix
                                        if drop), dtype=np.int64),
               fix_eid=np.array([e for e, _ in fixes], dtype=np.int64),
               fix_dur=np.array([d for _, d in fixes], dtype=np.int64))

    n_events, n_flows = _finish(members, derived, kinds, parallel_map)
    n_counter_events = _counters(con, members)
    n_meta = _metadata_and_tracks(con, members)
    derive_gpu_ops(con, members)
    derive_steps(con, members)
    derive_collectives(con, members)
    t0 = time.perf_counter()
    derive_graph(con, members)
    graph_s = (time.perf_counter() - t0) / len(members)
    dropped = dict.fromkeys(by_index, 0)  # E events: merged into their B, or unmatched
    for f, _, _, drop in be_fix:
        dropped[f] += drop
    for i, (m, d) in enumerate(zip(members, results, strict=True)):
        n_unmatched_e = sum(1 for x in d.issues if x[2] == "unmatched_end")
        n_merged_e = dropped[m.index] - n_unmatched_e
        d.events_stored = (n_events[i] + n_merged_e + n_flows[i] + n_counter_events[i]
                           + n_meta[i])
        d.graph_s = graph_s
    return results


def _kinds_by_track(con: duckdb.DuckDBPyConnection, members: list[Member]
                    ) -> dict[int, tuple[str, ...]]:
    """Each file's track kinds, indexed by track_id (the finishing workers' lookup)."""
    kinds: dict[int, list[str]] = {m.index: [] for m in members}
    for f, n in con.execute("SELECT file, count(*) FROM track_ids GROUP BY file").fetchall():
        kinds[f] = ["other"] * n
    for f, tid, k in con.execute("SELECT file, track_id, track_kind FROM track_kinds"
                                 ).fetchall():
        kinds[f][tid] = k
    return {f: tuple(k) for f, k in kinds.items()}


def _finish(members: list[Member], derived: Path, kinds: dict[int, tuple[str, ...]],
            parallel_map: MapFn) -> tuple[list[int], list[int]]:
    """Write every member's final events and flows parts (``finish.py``, on the pool when
    there is one); rows of each, per member."""
    from .finish import finish_part

    jobs: list[tuple[int, FinishJob]] = []
    for i, m in enumerate(members):
        jobs += [(i, j) for j in _finish_jobs(m, derived, kinds[m.index])]
    written = list(parallel_map(finish_part, [j for _, j in jobs]))
    n_events, n_flows = [0] * len(members), [0] * len(members)
    for (i, _), (e, f) in zip(jobs, written, strict=True):
        n_events[i] += e
        n_flows[i] += f
    for i, m in enumerate(members):
        if not any(j.out_part for k, j in jobs if k == i):
            empty_table(m.out, "events")
        if not n_flows[i]:
            empty_table(m.out, "flows")
    return n_events, n_flows


def _finish_jobs(m: Member, derived: Path, kinds: tuple[str, ...]) -> list[FinishJob]:
    """The finishing workers' jobs of one member: a final events (and flows) part per
    staged piece."""
    ev_parts, fl_parts = _parts(m.stage, "events"), _parts(m.stage, "flows")
    ev_dir, fl_dir = table_dir(m.out, "events"), table_dir(m.out, "flows")
    fl_staged = {int(p.stem) for p in fl_parts}
    jobs = [FinishJob(str(full_events_part(p)), str(ev_dir / f"part-{i:05d}.parquet"),
                      str(m.stage / "flows" / p.name) if int(p.stem) in fl_staged else "",
                      str(fl_dir / f"part-{i:05d}.parquet"), str(derived),
                      m.ebase + m.offsets[int(p.stem)], m.ebase, m.base_ns, kinds)
            for i, p in enumerate(ev_parts)]
    # a piece with flows but no other events (rare) still gets its flows part
    ev_staged = {int(p.stem) for p in ev_parts}
    jobs += [FinishJob("", "", str(p), str(fl_dir / f"part-{len(jobs) + i:05d}.parquet"),
                       str(derived), m.ebase + m.offsets[int(p.stem)], m.ebase, m.base_ns,
                       kinds)
             for i, p in enumerate(p for p in fl_parts if int(p.stem) not in ev_staged)]
    return jobs


def _stage_views(con: duckdb.DuckDBPyConnection, ev_parts: list[Path],
                 fl_parts: list[Path], members: list[Member]) -> None:
    """ev_raw and fl_raw: the staged events and flows of every member, with their file,
    eid (in the file) and geid (in the batch's dense arrays), times on the file's base."""
    if ev_parts:
        con.execute(f"""
            CREATE OR REPLACE VIEW ev_raw AS
            SELECT o.file, r.ord + o.off AS eid, r.ord + o.off + o.ebase AS geid, r.ph,
                   r.kind, r.ts_ns + o.base_ns AS ts_ns, r.dur_ns, r.pid_raw, r.tid_raw
            FROM {read_parts(ev_parts, members)} r JOIN offsets o USING (file, piece)""")
    else:
        con.execute("""CREATE OR REPLACE VIEW ev_raw AS SELECT NULL::INTEGER file,
            NULL::BIGINT eid, NULL::BIGINT geid, NULL::VARCHAR ph, NULL::VARCHAR kind,
            NULL::BIGINT ts_ns, NULL::BIGINT dur_ns, NULL::VARCHAR pid_raw,
            NULL::VARCHAR tid_raw WHERE false""")
    if fl_parts:
        con.execute(f"""
            CREATE OR REPLACE VIEW fl_raw AS
            SELECT r.* EXCLUDE (ord, piece, ts_ns), r.ord + o.off AS eid,
                   r.ord + o.off + o.ebase AS geid, r.ts_ns + o.base_ns AS ts_ns
            FROM {read_parts(fl_parts, members)} r JOIN offsets o USING (file, piece)""")
    else:
        con.execute("""CREATE OR REPLACE VIEW fl_raw AS SELECT NULL::VARCHAR ph,
            NULL::VARCHAR cat, NULL::VARCHAR name, NULL::BIGINT flow_id,
            NULL::VARCHAR flow_id_raw, NULL::VARCHAR pid_raw, NULL::VARCHAR tid_raw,
            NULL::VARCHAR bp, NULL::INTEGER file, NULL::BIGINT eid, NULL::BIGINT geid,
            NULL::BIGINT ts_ns WHERE false""")


def _batches(con: duckdb.DuckDBPyConnection, sql: str) -> Iterator[dict[str, np.ndarray]]:
    reader = con.sql(sql).to_arrow_reader(BATCH_ROWS)
    for batch in reader:
        yield {name: col.to_numpy(zero_copy_only=False)
               for name, col in zip(batch.schema.names, batch.columns, strict=True)}


def _nesting_and_flows(con: duckdb.DuckDBPyConnection, derived: Path, total: int) -> None:
    """Dense per-event depth/parent/overlap/track arrays (memory-mapped .npy files, filled
    from batches, indexed by geid: every member's events, one after the other); each flow's
    bound slice (``flow_eid``/``flow_bound``, by geid) and the flows bound to each slice
    (``fl_*``, sorted by bound slice then flow), from which the workers write the flows
    parts and the events' flow_out/flow_in lists (memory-mapped too: this process never
    holds them whole). Tracks are numbered per file, so the merge's track key is
    (file, track_id) in one integer."""
    derived.mkdir(parents=True, exist_ok=True)

    def dense(name: str, dtype: type, fill: int, n: int = total) -> np.ndarray:
        arr = np.lib.format.open_memmap(derived / f"{name}.npy", mode="w+", dtype=dtype,
                                        shape=(n,))
        arr[:] = fill
        return arr

    depth, parent = dense("depth", np.int32, -1), dense("parent", np.int64, -1)
    overlap, track = dense("overlap", np.bool_, 0), dense("track", np.int32, -1)
    for b in _batches(con, "SELECT geid, track_id FROM ev UNION ALL "
                           f"SELECT geid, track_id FROM ({FLOW_TRACKS})"):
        track[b["geid"]] = b["track_id"]
    key = "(file::BIGINT << 32) + track_id"
    flow_eids, bound = nest_and_bind(
        _batches(con, f"""SELECT {key} AS track_id, ts_ns, coalesce(dur_ns, 0) AS dur_ns,
                                 geid AS eid FROM ev
                          WHERE nests ORDER BY file, track_id, ts_ns, dur_ns DESC, eid"""),
        _batches(con.cursor(), f"""
            SELECT {key} AS track_id, f.ts_ns, f.geid AS eid,
                   (f.ph = 'f' AND f.bp IS DISTINCT FROM 'e') AS nxt
            FROM ({FLOW_TRACKS}) f ORDER BY f.file, f.track_id, f.ts_ns, f.eid"""),
        depth, parent, overlap)
    # (no flush: a shared mapping's pages are the page cache, which the workers' memory maps
    # read; msync would only write them to disk, ~5 ms per array, per file)
    del depth, parent, overlap, track
    # Both orders come from DuckDB's sort (it spills under its memory limit): this process
    # holds only the merge's own output (16 bytes per flow), no sorted copies.
    f_bound = np.frombuffer(bound, dtype=np.int64)
    con.register("bound_arrow", pa.table({"geid": pa.array(np.frombuffer(flow_eids, np.int64)),
                                          "bound_eid": pa.array(f_bound)}))
    n_bound = int((f_bound >= 0).sum())
    del f_bound
    _fill(con, "SELECT geid, bound_eid FROM bound_arrow ORDER BY geid",
          {"geid": dense("flow_eid", np.int64, -1, len(flow_eids)),
           "bound_eid": dense("flow_bound", np.int64, -1, len(flow_eids))})
    _fill(con, """SELECT b.bound_eid, coalesce(f.flow_id, 0) AS flow_id,
                         f.flow_id IS NOT NULL AS valid, f.ph = 's' AS is_out
                  FROM fl_raw f JOIN bound_arrow b USING (geid) WHERE b.bound_eid >= 0
                  ORDER BY b.bound_eid, f.geid""",
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


def _counters(con: duckdb.DuckDBPyConnection, members: list[Member]) -> list[int]:
    parts = staged(members, "counters")
    if not parts:
        for m in members:
            empty_table(m.out, "counters")
        return [0] * len(members)
    write_split(con, f"""
        SELECT r.* EXCLUDE (ord, piece, ts_ns), r.ord + o.off AS eid,
               r.ts_ns + o.base_ns AS ts_ns
        FROM {read_parts(parts, members)} r JOIN offsets o USING (file, piece)""",
        members, "counters")
    n = dict(con.execute(f"SELECT file, count(DISTINCT eid) FROM "
                         f"{read_table(members, 'counters')} GROUP BY file").fetchall())
    return [n.get(m.index, 0) for m in members]


def _metadata_and_tracks(con: duckdb.DuckDBPyConnection, members: list[Member]) -> list[int]:
    parts = staged(members, "metadata_events")
    n_meta = [0] * len(members)
    if parts:
        n_meta = write_split(con, f"""
            SELECT r.* EXCLUDE (ord, piece), r.ord + o.off AS eid
            FROM {read_parts(parts, members)} r JOIN offsets o USING (file, piece)""",
            members, "metadata_events")
    else:
        for m in members:
            empty_table(m.out, "metadata_events")
    md = read_table(members, "metadata_events")
    write_split(con, f"""
        WITH names AS (
            SELECT file, pid_raw, tid_raw, name, value, eid FROM {md}
            WHERE name IN ('process_name', 'process_labels', 'thread_name')),
        pname AS (SELECT file, pid_raw, arg_max(value, eid) AS v FROM names
                  WHERE name = 'process_name' GROUP BY ALL),
        plabel AS (SELECT file, pid_raw, arg_max(value, eid) AS v FROM names
                   WHERE name = 'process_labels' GROUP BY ALL),
        tname AS (SELECT file, pid_raw, tid_raw, arg_max(value, eid) AS v FROM names
                  WHERE name = 'thread_name' GROUP BY ALL)
        SELECT t.file, t.track_id, t.pid_raw, t.tid_raw, TRY_CAST(t.pid_raw AS BIGINT) AS pid,
               TRY_CAST(t.tid_raw AS BIGINT) AS tid, coalesce(k.track_kind, 'other') AS track_kind,
               pn.v AS process_name, pl.v AS process_labels, rtrim(tn.v) AS thread_name,
               coalesce(k.n_events, 0) AS n_events, k.first_ns, k.last_ns
        FROM track_ids t LEFT JOIN track_kinds k USING (file, track_id)
        LEFT JOIN pname pn ON pn.file = t.file AND pn.pid_raw IS NOT DISTINCT FROM t.pid_raw
        LEFT JOIN plabel pl ON pl.file = t.file AND pl.pid_raw IS NOT DISTINCT FROM t.pid_raw
        LEFT JOIN tname tn ON tn.file = t.file AND tn.pid_raw IS NOT DISTINCT FROM t.pid_raw
                          AND tn.tid_raw IS NOT DISTINCT FROM t.tid_raw""", members, "tracks")
    return n_meta


def _pair_begin_end(con: duckdb.DuckDBPyConnection, results: dict[int, Derived]
                    ) -> list[tuple]:
    """(file, eid, dur or None, drop) fixes: an E closes the innermost open B on its thread.
    An unmatched E is an issue of its file's Derived (``results``, by file)."""
    rows = con.execute("""
        SELECT file, eid, ph, pid_raw, tid_raw, ts_ns FROM ev_raw WHERE ph IN ('B', 'E')
        ORDER BY file, pid_raw, tid_raw, ts_ns, CASE ph WHEN 'E' THEN 0 ELSE 1 END, eid
        """).fetchall()
    fixes: list[tuple] = []
    stack: list[tuple[int, int, int]] = []
    cur = None
    for f, eid, ph, pid, tid, ts in rows:
        if (f, pid, tid) != cur:
            fixes += [(bf, b_eid, None, False) for bf, b_eid, _ in stack]
            stack.clear()
            cur = (f, pid, tid)
        if ph == "B":
            stack.append((f, eid, ts))
        elif stack:
            bf, b_eid, b_ts = stack.pop()
            fixes.append((bf, b_eid, ts - b_ts, False))
            fixes.append((f, eid, None, True))
        else:
            fixes.append((f, eid, None, True))
            results[f].issues.append((eid, None, "unmatched_end",
                                      "E event with no open B on its thread", True, None))
    fixes += [(bf, b_eid, None, False) for bf, b_eid, _ in stack]
    return fixes


def _cpu_steps(con: duckdb.DuckDBPyConnection, members: list[Member]) -> None:
    con.execute(f"""
        CREATE OR REPLACE TABLE cpu_steps AS
        SELECT file, {STEP_NUMBER} AS step, eid, tid, ts_ns AS start_ns,
               coalesce(end_ns, 9223372036854775807) AS cpu_end_ns, end_ns, dur_ns, args
        FROM {read_table(members, "events")}
        WHERE kind IN ('user_annotation', 'cpu_op')  -- 2021 traces: cat Operator
          AND name LIKE 'ProfilerStep#%' AND {STEP_NUMBER} IS NOT NULL
    """)


def derive_gpu_ops(con: duckdb.DuckDBPyConnection, members: list[Member]) -> None:
    """GPU ops with their launch (same correlation) and issuing CPU op: the launch's parent
    when that is a cpu_op, else the cpu_op with the same External id. Each join's build side
    is cut down to the rows the GPU ops need, so this stays within DuckDB's memory limit."""
    ev = read_table(members, "events")
    launch = ", ".join(f"'{k}'" for k in LAUNCH_KINDS)
    _cpu_steps(con, members)
    # one parse of args per GPU op for all nine values (DuckDB's list-of-paths form)
    paths = ", ".join(f"'{p}'" for p in GPU_ARG_PATHS)
    gpu_op_kinds = ", ".join(f"'{k}'" for k in GPU_OP_KINDS)
    x = {name: f"TRY_CAST(jx[{i + 1}] AS BIGINT)" for i, name in enumerate(GPU_ARG_PATHS.values())}
    con.execute(f"""
        CREATE OR REPLACE TABLE g AS
        SELECT file, eid, kind, name, coalesce(device, pid)::INTEGER AS device,
               coalesce(stream, tid) AS stream, ts_ns, dur_ns, end_ns, correlation, external_id,
               {x['grid_x']} AS grid_x, {x['grid_y']} AS grid_y, {x['grid_z']} AS grid_z,
               {x['block_x']} AS block_x, {x['block_y']} AS block_y, {x['block_z']} AS block_z,
               {x['registers_per_thread']} AS registers_per_thread,
               {x['shared_memory']} AS shared_memory,
               coalesce({x['bytes']}, {x['size']}) AS bytes, is_comm
        FROM (SELECT * REPLACE ({gpu_op_kind_sql()} AS kind),
                     json_extract_string(args, [{paths}]) AS jx,
                     (kind = 'kernel' AND {members[0].comm.sql_condition()}) AS is_comm
              FROM {ev} WHERE kind IN ({gpu_op_kinds}) AND {gpu_op_kind_sql()} IS NOT NULL)""")
    con.execute(f"""
        CREATE OR REPLACE TABLE l AS
        SELECT e.file, e.correlation,
               arg_min({{'eid': e.eid, 'name': e.name, 'ts_ns': e.ts_ns, 'tid': e.tid,
                        'parent_eid': e.parent_eid}}, e.ts_ns) AS x
        FROM {ev} e SEMI JOIN g ON g.file = e.file AND g.correlation = e.correlation
        WHERE e.kind IN ({launch})
        GROUP BY e.file, e.correlation""")
    con.execute("""
        CREATE OR REPLACE TABLE j AS
        SELECT g.*, l.x.eid AS launch_eid, l.x.name AS launch_name, l.x.ts_ns AS launch_ts_ns,
               l.x.tid AS launch_tid, l.x.parent_eid AS launch_parent,
               coalesce(l.x.ts_ns, g.ts_ns) AS anchor_ns
        FROM g LEFT JOIN l USING (file, correlation)""")
    con.execute("DROP TABLE g; DROP TABLE l")
    con.execute(f"""
        CREATE OR REPLACE TABLE ops AS
        WITH parents AS (SELECT DISTINCT file, launch_parent AS eid FROM j),
        ext AS (SELECT DISTINCT file, external_id FROM j)
        SELECT e.file, e.eid, e.name, e.external_id FROM {ev} e
        LEFT JOIN parents p ON p.file = e.file AND p.eid = e.eid
        LEFT JOIN ext x ON x.file = e.file AND x.external_id = e.external_id
        WHERE e.kind = 'cpu_op' AND (p.eid IS NOT NULL OR x.external_id IS NOT NULL)""")
    # The step of each op: an ASOF join of just (eid, anchor) against the steps, then a hash
    # join back (DuckDB's ASOF join sorts its whole input: with the names along it was 30x
    # slower).
    con.execute("""
        CREATE OR REPLACE TABLE op_step AS
        SELECT a.file, a.eid, CASE WHEN a.anchor_ns < s.cpu_end_ns THEN s.step END AS step
        FROM (SELECT file, eid, anchor_ns FROM j) a
        ASOF LEFT JOIN cpu_steps s ON a.file = s.file AND a.anchor_ns >= s.start_ns""")
    write_split(con, """
        WITH ext AS (SELECT file, external_id, min(eid) AS eid FROM ops
                     WHERE external_id IS NOT NULL GROUP BY file, external_id),
        jo AS (SELECT j.*, coalesce(p.eid, x.eid) AS op_eid FROM j
               LEFT JOIN ops p ON p.file = j.file AND p.eid = j.launch_parent
               LEFT JOIN ext x ON x.file = j.file AND x.external_id = j.external_id)
        SELECT jo.*, o.name AS op_name, st.step
        FROM jo LEFT JOIN ops o ON o.file = jo.file AND o.eid = jo.op_eid
        LEFT JOIN op_step st ON st.file = jo.file AND st.eid = jo.eid""", members, "gpu_ops")
    con.execute("DROP TABLE j; DROP TABLE ops; DROP TABLE op_step")


def derive_steps(con: duckdb.DuckDBPyConnection, members: list[Member]) -> None:
    """profiler_steps: the facts of each ProfilerStep#N annotation the analysis ``steps``
    view tiles the timeline from (docs/steps.md). The GPU-side start is the first GPU op at or
    after the step's GPU annotation (gpu_user_annotation ProfilerStep#N) on its device where
    the trace has one, else the earliest op launched inside the step."""
    g = read_table(members, "gpu_ops")
    # DuckDB plans an ASOF join with a small left side (<= 64 rows, here the annotations)
    # as a nested loop and an aggregate; with the file among its keys, against every GPU op,
    # that took 150 ms on a 650k-event file, the sort-based ASOF 40 ms (the graph's ASOF
    # joins are faster as loops: the setting is for this query only)
    con.execute("SET asof_loop_join_threshold = 0")
    try:
        _write_steps(con, members, g)
    finally:
        con.execute("RESET asof_loop_join_threshold")


def _write_steps(con: duckdb.DuckDBPyConnection, members: list[Member], g: str) -> None:
    """profiler_steps' query (``g``: the batch's gpu_ops), written per member."""
    write_split(con, f"""
        WITH gs AS (SELECT file, step, min(ts_ns) AS gpu_start_ns, max(end_ns) AS gpu_end_ns,
                           arg_min(eid, (ts_ns, eid)) AS first_eid, count(*) AS n_gpu_ops
                    FROM {g} WHERE step IS NOT NULL GROUP BY file, step),
        ann AS (SELECT file, {STEP_NUMBER} AS step, min(ts_ns) AS ann_ns,
                       arg_min(coalesce(device, pid), ts_ns) AS device
                FROM {read_table(members, "events")}
                WHERE kind = 'gpu_user_annotation' AND name LIKE 'ProfilerStep#%'
                GROUP BY ALL HAVING step IS NOT NULL),
        ops AS (SELECT file, device, ts_ns, eid FROM {g}),
        first_after AS (
            SELECT a.file, a.step, a.ann_ns, o.eid, o.ts_ns FROM ann a
            ASOF LEFT JOIN ops o ON o.file = a.file AND o.device = a.device
                                AND o.ts_ns >= a.ann_ns)
        SELECT s.file, s.step, s.eid, s.tid, s.start_ns AS cpu_start_ns, s.end_ns AS cpu_end_ns,
               NOT (s.dur_ns IS NULL OR s.args LIKE '%"finished": false%'
                    OR s.args LIKE '%"finished":false%') AS finished,
               gs.gpu_start_ns, gs.gpu_end_ns, coalesce(gs.n_gpu_ops, 0) AS n_gpu_ops,
               f.ann_ns AS gpu_annotation_ns,
               CASE WHEN f.eid IS NOT NULL THEN f.eid ELSE gs.first_eid END AS gpu_first_eid,
               CASE WHEN f.eid IS NOT NULL THEN f.ts_ns ELSE gs.gpu_start_ns END
                   AS gpu_first_ns
        FROM cpu_steps s LEFT JOIN gs ON gs.file = s.file AND gs.step = s.step
        LEFT JOIN first_after f ON f.file = s.file AND f.step = s.step
        QUALIFY row_number() OVER (PARTITION BY s.file, s.step ORDER BY s.start_ns, s.eid) = 1
        """, members, "profiler_steps")


def derive_collectives(con: duckdb.DuckDBPyConnection, members: list[Member]) -> None:
    from .collectives import build

    tables = build(con, {t: read_table(members, t)
                         for t in ("events", "gpu_ops", "profiler_steps")},
                   {m.index: m.pg_ranks for m in members}, members[0].comm)
    for m in members:
        write_arrow(tables[m.index], m.out, "collectives")


def derive_graph(con: duckdb.DuckDBPyConnection, members: list[Member]) -> None:
    """cp_nodes and rank_edges: each rank's dependency graph (graph.py), from its tables."""
    from .graph import rank_graph

    tables = {t: read_table(members, t) for t in ("events", "gpu_ops", "collectives")}
    with rank_graph(con, tables) as queries:
        for name, sql in queries.items():
            write_split(con, sql, members, name)
