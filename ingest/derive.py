"""Second stage: turn the workers' per-piece Parquet parts into the store's tables.

Runs in DuckDB (multi-threaded, spilling to disk under a memory limit) plus two Python passes
over sorted integer columns: B/E pairing and per-track nesting with flow binding. It assigns
the final event ids (piece offset + position), adds the base time, names tracks, and derives
gpu_ops, steps and collectives from the written events table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from tracetool.schema import TABLES_BY_NAME

from .nesting import bind_flows, nest

KIND_OF_CAT = {
    "cpu_op": "cpu_op", "Operator": "cpu_op", "operator": "cpu_op",
    "user_annotation": "user_annotation", "python_function": "python_function",
    "cuda_runtime": "cuda_runtime", "Runtime": "cuda_runtime", "cuda_driver": "cuda_driver",
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy", "gpu_memset": "memset", "Memset": "memset",
    "gpu_user_annotation": "gpu_user_annotation", "cuda_sync": "cuda_sync",
    "cuda_event": "cuda_event", "cpu_instant_event": "cpu_instant", "overhead": "overhead",
    "Trace": "trace_span", "mtia_runtime": "accelerator_runtime",
    "xpu_runtime": "accelerator_runtime", "privateuse1_runtime": "accelerator_runtime",
    "mtia_ccp_events": "accelerator_op", "hpu_op": "accelerator_op",
}
GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation", "cuda_event", "accelerator_op")
CPU_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver",
             "cpu_instant", "accelerator_runtime")
COMM_KERNEL = ("(name ILIKE 'nccl%' OR name ILIKE '%rccl%' OR name ILIKE '%nccl%Kernel%' "
               "OR name ILIKE '%multimem%' OR name ILIKE '%all_reduce%kernel%' "
               "OR name ILIKE '%allreduce%kernel%' OR args LIKE '%\"Collective name\"%')")


def _case(column: str, mapping: dict[str, str], default: str) -> str:
    arms = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in mapping.items())
    return f"CASE {column} {arms} ELSE '{default}' END"


@dataclass
class Derived:
    events_stored: int
    issues: list[tuple]  # (eid, byte_offset, issue, detail, quarantined, snippet)


def connect(tmp: Path, threads: int, memory_limit: str) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET threads = {max(1, threads)}")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET temp_directory = '{tmp / 'duckdb-spill'}'")
    con.execute("SET preserve_insertion_order = false")
    return con


def _parts(stage: Path, table: str) -> str | None:
    files = sorted((stage / table).glob("*.parquet"))
    if not files:
        return None
    return "[" + ", ".join(f"'{f}'" for f in files) + "]"


def _copy(con: duckdb.DuckDBPyConnection, sql: str, out: Path, table: str) -> int:
    """Write a query to out/<table>.parquet with the schema module's column order and types."""
    t = TABLES_BY_NAME[table]
    cols = ", ".join(
        f"CAST({c.name} AS {c.sql_type}) AS {c.name}" for c in t.columns
    )
    order = f" ORDER BY {', '.join(t.sort_key)}" if t.sort_key else ""
    path = out / f"{table}.parquet"
    con.execute(
        f"COPY (SELECT {cols} FROM ({sql}){order}) TO '{path}' "
        "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)"
    )
    return con.execute(f"SELECT count(*) FROM read_parquet('{path}')").fetchone()[0]


def empty_table(out: Path, table: str) -> None:
    import pyarrow.parquet as pq

    pq.write_table(TABLES_BY_NAME[table].schema.empty_table(), out / f"{table}.parquet")


def derive(
    con: duckdb.DuckDBPyConnection,
    stage: Path,
    out: Path,
    offsets: dict[int, int],
    base_ns: int,
    pg_ranks: dict[str, list[int]],
) -> Derived:
    con.execute("CREATE OR REPLACE TEMP TABLE offsets(piece INTEGER, off BIGINT)")
    con.executemany("INSERT INTO offsets VALUES (?, ?)", list(offsets.items()))
    issues: list[tuple] = []
    ev_parts, fl_parts = _parts(stage, "events"), _parts(stage, "flows")
    kind = _case("cat", KIND_OF_CAT, "other")
    if ev_parts:
        con.execute(f"""
            CREATE OR REPLACE TEMP VIEW ev_raw AS
            SELECT r.* EXCLUDE (ord, piece, ts_ns), r.ord + o.off AS eid,
                   r.ts_ns + {base_ns} AS ts_ns, {kind} AS kind
            FROM read_parquet({ev_parts}) r JOIN offsets o USING (piece)""")
    else:
        con.execute("""CREATE OR REPLACE TEMP VIEW ev_raw AS SELECT
            NULL::VARCHAR ph, NULL::VARCHAR cat, NULL::VARCHAR name, NULL::BIGINT dur_ns,
            NULL::VARCHAR pid_raw, NULL::VARCHAR tid_raw, NULL::VARCHAR args, NULL::BIGINT pid,
            NULL::BIGINT tid, NULL::VARCHAR async_id, NULL::BIGINT external_id,
            NULL::BIGINT correlation, NULL::BIGINT seq_nr, NULL::BIGINT fwd_thread_id,
            NULL::BIGINT ev_idx, NULL::BIGINT ev_idx_old, NULL::BIGINT record_function_id,
            NULL::BIGINT python_id, NULL::BIGINT python_parent_id, NULL::BIGINT device,
            NULL::BIGINT stream, NULL::BIGINT eid, NULL::BIGINT ts_ns, NULL::VARCHAR kind
            WHERE false""")
    if fl_parts:
        con.execute(f"""
            CREATE OR REPLACE TEMP VIEW fl_raw AS
            SELECT r.* EXCLUDE (ord, piece, ts_ns), r.ord + o.off AS eid,
                   r.ts_ns + {base_ns} AS ts_ns
            FROM read_parquet({fl_parts}) r JOIN offsets o USING (piece)""")
    else:
        con.execute("""CREATE OR REPLACE TEMP VIEW fl_raw AS SELECT NULL::VARCHAR ph,
            NULL::VARCHAR cat, NULL::VARCHAR name, NULL::BIGINT flow_id,
            NULL::VARCHAR flow_id_raw, NULL::VARCHAR pid_raw, NULL::VARCHAR tid_raw,
            NULL::VARCHAR bp, NULL::BIGINT eid, NULL::BIGINT ts_ns WHERE false""")

    # --- B/E pairing: an E closes the innermost open B on its thread
    be_fix = _pair_begin_end(con, issues)
    con.execute("CREATE OR REPLACE TEMP TABLE be_fix(eid BIGINT, dur_ns BIGINT, drop_row BOOLEAN)")
    if be_fix:
        con.executemany("INSERT INTO be_fix VALUES (?, ?, ?)", be_fix)

    # --- tracks
    con.execute("""
        CREATE OR REPLACE TEMP TABLE track_ids AS
        SELECT pid_raw, tid_raw,
               (row_number() OVER (ORDER BY TRY_CAST(pid_raw AS BIGINT) NULLS LAST, pid_raw,
                                   TRY_CAST(tid_raw AS BIGINT) NULLS LAST, tid_raw) - 1)::INTEGER
                   AS track_id
        FROM (SELECT DISTINCT pid_raw, tid_raw FROM ev_raw
              UNION SELECT DISTINCT pid_raw, tid_raw FROM fl_raw)""")
    gpu = ", ".join(f"'{k}'" for k in GPU_KINDS)
    cpu = ", ".join(f"'{k}'" for k in CPU_KINDS)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE ev AS
        SELECT e.* EXCLUDE (dur_ns, ev_idx, ev_idx_old),
               CASE WHEN f.eid IS NOT NULL THEN f.dur_ns ELSE e.dur_ns END AS dur_ns,
               coalesce(e.ev_idx, e.ev_idx_old) AS ev_idx,
               CASE WHEN e.ph IN ('I', 'R') THEN 'i' WHEN e.ph = 'B' THEN 'X' ELSE e.ph END
                   AS ph2,
               t.track_id
        FROM ev_raw e JOIN track_ids t
          ON e.pid_raw IS NOT DISTINCT FROM t.pid_raw AND e.tid_raw IS NOT DISTINCT FROM t.tid_raw
        LEFT JOIN be_fix f ON f.eid = e.eid
        WHERE NOT coalesce(f.drop_row, false)""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE track_kinds AS
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

    # --- nesting and flow binding (Python passes over sorted integer columns)
    sl = con.sql("""
        SELECT track_id, ts_ns, coalesce(dur_ns, 0) AS dur_ns, eid FROM ev
        WHERE ph2 IN ('X', 'i') ORDER BY track_id, ts_ns, dur_ns DESC, eid""").to_arrow_table()
    s_track = sl["track_id"].to_numpy()
    s_ts = sl["ts_ns"].to_numpy()
    s_dur = sl["dur_ns"].to_numpy()
    s_eid = sl["eid"].to_numpy()
    depth, parent, overlap = nest(s_track, s_ts, s_dur, s_eid)
    con.register("nest_arrow", pa.table({
        "eid": s_eid, "depth": depth,
        "parent_eid": pa.array(parent, mask=parent < 0),
        "overlaps_parent": overlap,
    }))
    con.execute("CREATE OR REPLACE TEMP TABLE nest AS SELECT * FROM nest_arrow")
    con.unregister("nest_arrow")
    fl = con.sql("""
        SELECT f.eid, t.track_id, f.ts_ns, (f.ph = 'f' AND f.bp IS DISTINCT FROM 'e') AS nxt
        FROM fl_raw f JOIN track_ids t
          ON f.pid_raw IS NOT DISTINCT FROM t.pid_raw AND f.tid_raw IS NOT DISTINCT FROM t.tid_raw
        ORDER BY t.track_id, f.ts_ns, f.eid""").to_arrow_table()
    bound = bind_flows(s_track, s_ts, s_ts + s_dur, s_eid, fl["track_id"].to_numpy(),
                       fl["ts_ns"].to_numpy(), fl["nxt"].to_numpy(zero_copy_only=False))
    con.register("bound_arrow", pa.table({
        "eid": fl["eid"], "track_id": fl["track_id"],
        "bound_eid": pa.array(bound, mask=bound < 0),
    }))
    con.execute("CREATE OR REPLACE TEMP TABLE bound AS SELECT * FROM bound_arrow")
    con.unregister("bound_arrow")
    del sl, fl, s_track, s_ts, s_dur, s_eid, depth, parent, overlap, bound

    n_flows = _copy(con, """
        SELECT f.*, b.track_id, b.bound_eid FROM fl_raw f JOIN bound b USING (eid)""",
        out, "flows")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE flow_lists AS
        SELECT bound_eid AS eid,
               list(flow_id ORDER BY eid) FILTER (WHERE ph = 's') AS flow_out,
               list(flow_id ORDER BY eid) FILTER (WHERE ph IN ('f', 't')) AS flow_in
        FROM read_parquet('{p}') WHERE bound_eid IS NOT NULL GROUP BY bound_eid
    """.format(p=out / "flows.parquet"))
    n_events = _copy(con, """
        SELECT e.* EXCLUDE (ph, ph2), e.ph2 AS ph, e.ts_ns + e.dur_ns AS end_ns,
               k.track_kind, n.depth, n.parent_eid, n.overlaps_parent,
               CASE WHEN e.ph IN ('b', 'n', 'e') THEN e.async_id END AS async_id2,
               fl.flow_out, fl.flow_in
        FROM ev e JOIN track_kinds k USING (track_id)
        LEFT JOIN nest n USING (eid) LEFT JOIN flow_lists fl USING (eid)
    """.replace("e.* EXCLUDE (ph, ph2)", "e.* EXCLUDE (ph, ph2, async_id)")
       .replace("AS async_id2", "AS async_id"), out, "events")
    n_unmatched_e = sum(1 for i in issues if i[2] == "unmatched_end")
    n_merged_e = sum(1 for _, _, d in be_fix if d) - n_unmatched_e

    # --- counters and metadata
    n_counter_events = 0
    ct_parts = _parts(stage, "counters")
    if ct_parts:
        _copy(con, f"""
            SELECT r.* EXCLUDE (ord, piece, ts_ns), r.ord + o.off AS eid,
                   r.ts_ns + {base_ns} AS ts_ns
            FROM read_parquet({ct_parts}) r JOIN offsets o USING (piece)""", out, "counters")
        n_counter_events = con.execute(
            f"SELECT count(DISTINCT eid) FROM read_parquet('{out / 'counters.parquet'}')"
        ).fetchone()[0]
    else:
        empty_table(out, "counters")
    md_parts = _parts(stage, "metadata_events")
    n_meta = 0
    if md_parts:
        n_meta = _copy(con, f"""
            SELECT r.* EXCLUDE (ord, piece), r.ord + o.off AS eid
            FROM read_parquet({md_parts}) r JOIN offsets o USING (piece)""",
            out, "metadata_events")
    else:
        empty_table(out, "metadata_events")
    md = f"read_parquet('{out / 'metadata_events.parquet'}')"
    _copy(con, f"""
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

    derive_gpu_ops(con, out)
    derive_steps(con, out)
    derive_collectives(con, out, pg_ranks)
    stored = n_events + n_merged_e + n_flows + n_counter_events + n_meta
    return Derived(stored, issues)


def _pair_begin_end(con: duckdb.DuckDBPyConnection, issues: list[tuple]) -> list[tuple]:
    rows = con.execute("""
        SELECT eid, ph, pid_raw, tid_raw, ts_ns FROM ev_raw WHERE ph IN ('B', 'E')
        ORDER BY pid_raw, tid_raw, ts_ns, CASE ph WHEN 'E' THEN 0 ELSE 1 END, eid""").fetchall()
    fixes: list[tuple] = []
    stack: list[tuple[int, int]] = []
    cur = None
    for eid, ph, pid, tid, ts in rows:
        if (pid, tid) != cur:
            for b_eid, _ in stack:
                fixes.append((b_eid, None, False))
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
    for b_eid, _ in stack:
        fixes.append((b_eid, None, False))
    return fixes


def derive_gpu_ops(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    ev = f"read_parquet('{out / 'events.parquet'}')"
    _copy(con, f"""
        WITH g AS (SELECT * FROM {ev} WHERE kind IN ('kernel', 'memcpy', 'memset')),
        launch AS (
            SELECT correlation, arg_min(eid, ts_ns) AS eid FROM {ev}
            WHERE kind IN ('cuda_runtime', 'cuda_driver', 'accelerator_runtime')
              AND correlation IS NOT NULL GROUP BY correlation),
        l AS (SELECT e.* FROM {ev} e JOIN launch USING (eid)),
        op_by_ext AS (
            SELECT external_id, arg_min(eid, ts_ns) AS eid FROM {ev}
            WHERE kind = 'cpu_op' AND external_id IS NOT NULL GROUP BY external_id),
        st AS (SELECT step, start_ns, cpu_end_ns FROM steps_tmp)
        SELECT g.eid, g.kind, g.name,
               coalesce(g.device, g.pid)::INTEGER AS device, coalesce(g.stream, g.tid) AS stream,
               g.ts_ns, g.dur_ns, g.end_ns, g.correlation, g.external_id,
               TRY_CAST(g.args->>'$.grid[0]' AS BIGINT) AS grid_x,
               TRY_CAST(g.args->>'$.grid[1]' AS BIGINT) AS grid_y,
               TRY_CAST(g.args->>'$.grid[2]' AS BIGINT) AS grid_z,
               TRY_CAST(g.args->>'$.block[0]' AS BIGINT) AS block_x,
               TRY_CAST(g.args->>'$.block[1]' AS BIGINT) AS block_y,
               TRY_CAST(g.args->>'$.block[2]' AS BIGINT) AS block_z,
               TRY_CAST(g.args->>'$."registers per thread"' AS BIGINT) AS registers_per_thread,
               TRY_CAST(g.args->>'$."shared memory"' AS BIGINT) AS shared_memory,
               TRY_CAST(coalesce(g.args->>'$.bytes', g.args->>'$.size') AS BIGINT) AS bytes,
               (g.kind = 'kernel' AND {COMM_KERNEL.replace('name', 'g.name')
                                      .replace('args', 'g.args')}) AS is_comm,
               l.eid AS launch_eid, l.name AS launch_name, l.ts_ns AS launch_ts_ns,
               l.tid AS launch_tid,
               coalesce(CASE WHEN p.kind = 'cpu_op' THEN p.eid END, x.eid) AS op_eid,
               coalesce(CASE WHEN p.kind = 'cpu_op' THEN p.name END, xo.name) AS op_name,
               (SELECT max(step) FROM st WHERE coalesce(l.ts_ns, g.ts_ns) >= st.start_ns
                   AND coalesce(l.ts_ns, g.ts_ns) < st.cpu_end_ns) AS step
        FROM g LEFT JOIN l ON l.correlation = g.correlation
        LEFT JOIN {ev} p ON p.eid = l.parent_eid
        LEFT JOIN op_by_ext x ON x.external_id = g.external_id
        LEFT JOIN {ev} xo ON xo.eid = x.eid""".replace("FROM steps_tmp", _STEPS_CPU.format(ev=ev)),
        out, "gpu_ops")


_STEPS_CPU = """FROM (
    SELECT TRY_CAST(regexp_extract(name, 'ProfilerStep#(\\d+)', 1) AS INTEGER) AS step,
           ts_ns AS start_ns, coalesce(end_ns, 9223372036854775807) AS cpu_end_ns
    FROM {ev} WHERE kind = 'user_annotation' AND name LIKE 'ProfilerStep#%')"""


def derive_steps(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    ev = f"read_parquet('{out / 'events.parquet'}')"
    g = f"read_parquet('{out / 'gpu_ops.parquet'}')"
    _copy(con, f"""
        WITH s AS (
            SELECT TRY_CAST(regexp_extract(name, 'ProfilerStep#(\\d+)', 1) AS INTEGER) AS step,
                   eid, ts_ns AS cpu_start_ns, end_ns AS cpu_end_ns,
                   NOT (dur_ns IS NULL OR args LIKE '%"finished": false%'
                        OR args LIKE '%"finished":false%') AS complete
            FROM {ev} WHERE kind = 'user_annotation' AND name LIKE 'ProfilerStep#%'),
        gs AS (SELECT step, min(ts_ns) AS gpu_start_ns, max(end_ns) AS gpu_end_ns,
                      count(*) AS n_gpu_ops
               FROM {g} WHERE step IS NOT NULL GROUP BY step)
        SELECT s.step, s.eid, s.cpu_start_ns, s.cpu_end_ns, gs.gpu_start_ns, gs.gpu_end_ns,
               s.cpu_start_ns AS start_ns,
               greatest(s.cpu_end_ns, coalesce(gs.gpu_end_ns, s.cpu_end_ns)) AS end_ns,
               greatest(s.cpu_end_ns, coalesce(gs.gpu_end_ns, s.cpu_end_ns)) - s.cpu_start_ns
                   AS dur_ns,
               coalesce(gs.n_gpu_ops, 0) AS n_gpu_ops, s.complete
        FROM s LEFT JOIN gs USING (step) WHERE s.step IS NOT NULL""", out, "steps")


def derive_collectives(
    con: duckdb.DuckDBPyConnection, out: Path, pg_ranks: dict[str, list[int]]
) -> None:
    import pyarrow.parquet as pq

    from .collectives import build

    pq.write_table(build(con, out, pg_ranks), out / "collectives.parquet", compression="zstd")
