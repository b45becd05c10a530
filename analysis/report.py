"""One job's report: a terminal summary, JSON, and Markdown + HTML pages with PNG charts.

Every number comes from the analysis views (steps, step_breakdown, kernel_summary,
op_summary, collective_instances), so the report agrees with what ``tracetool sql`` shows.
The charts are drawn from plain data by ``charts.py``, in a second process.
"""

from __future__ import annotations

import html
import importlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from tracetool.analysis import efficiency
from tracetool.analysis.charts import (
    ChartDrawer,
    draw_breakdown,
    draw_critical_path,
    draw_memory,
    draw_roofline,
    draw_skew,
    draw_step_timeline,
    draw_top,
)
from tracetool.analysis.chrome_trace import write_path_trace
from tracetool.analysis.collectives import collective_warnings, job_missing_ranks_note
from tracetool.analysis.step_timeline import choose_step, timeline_data
from tracetool.errors import one_line
from tracetool.numbers import round_ns
from tracetool.outputs import write_text
from tracetool.text import markdown_cell, number_ranges, printable

TOP = 15  # rows of the top kernels / ops tables and chart
NAME_WIDTH = 80  # long C++ kernel names are cut to this in tables (never in JSON)
CHART_FILES = ("breakdown.png", "top_kernels.png", "top_cpu_ops.png", "collective_skew.png",
               "memory.png", "critical_path.png", "step_timeline.png", "step_timeline.json",
               "roofline.png")


def first_line(err: BaseException) -> str:
    """An error's message in one line (DuckDB's run to several; ``errors.one_line``)."""
    return one_line(err)


def rows(con: duckdb.DuckDBPyConnection, sql: str,
         params: Sequence[object] | dict[str, object] = ()) -> list[dict[str, Any]]:
    """Query result as dicts; ``*_ns`` averages and medians rounded to whole nanoseconds so
    that every time in the JSON is an integer."""
    cur = con.execute(sql, params if isinstance(params, dict) else list(params))
    cols = [d[0] for d in cur.description]
    out = []
    for r in cur.fetchall():
        d = dict(zip(cols, r, strict=True))
        for k, v in d.items():
            if k.endswith("_ns") and isinstance(v, float):
                d[k] = round_ns(v)
        out.append(d)
    return out


# ---------------------------------------------------------------------------------- the data

def summarize(con: duckdb.DuckDBPyConnection, job: str, include_incomplete: bool = False,
              ready: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """What the report shows, as plain JSON-ready data (times in ns). Incomplete steps
    (docs/steps.md) are left out of the statistics unless ``include_incomplete``.
    The charted parts (breakdown, top, collectives) are computed first, and ``ready(key,
    parts so far)`` is told of each as soon as it is known: the report's drawing process
    starts on them while the rest runs."""
    has_kernels = con.execute("SELECT count(*) FROM kernels WHERE job = ?",
                              [job]).fetchone()[0] > 0
    charted: dict[str, Any] = {}
    for key, compute in (
            ("breakdown", lambda: breakdown(con, job, include_incomplete)),
            ("top", lambda: top_kernels(con, job) if has_kernels else top_cpu_ops(con, job)),
            ("collectives", lambda: collectives(con, job))):
        charted[key] = compute()
        if ready is not None:
            ready(key, charted)
    files = rows(con, """
        SELECT rank, backend, world_size, device_names FROM trace_files
        WHERE job = ? ORDER BY rank""", [job])
    return {
        "job": job,
        "ranks": [f["rank"] for f in files],
        "backend": next((f["backend"] for f in files if f["backend"]), None),
        "world_size": next((f["world_size"] for f in files if f["world_size"]), None),
        "devices": sorted({d for f in files for d in (f["device_names"] or []) if d}),
        # deviceProperties entries with an empty name (seen in vLLM's ROCm traces), per rank
        "unnamed_devices": max((sum(not d for d in f["device_names"] or []) for f in files),
                               default=0),
        "job_steps": job_steps(con, job, include_incomplete),
        "steps": step_stats(con, job, include_incomplete),
        "incomplete_steps": [] if include_incomplete else incomplete_steps(con, job),
        "breakdown": charted["breakdown"],
        "top": charted["top"],
        "collectives": charted["collectives"],
        "memory_peaks": memory_peaks(con, job, include_incomplete),
        "cupti_counters": cupti_totals(con, job),
        # a job of one rank of many, then how well collectives matched
        "warnings": [w for w in [job_missing_ranks_note(con, job)] if w]
        + collective_warnings(con, job),
    }


def job_steps(con: duckdb.DuckDBPyConnection, job: str, all_steps: bool = False
              ) -> list[dict[str, Any]]:
    """The complete job steps (job_steps: the iteration across ranks; what replay measures),
    every one with ``all_steps``."""
    return rows(con, """
        SELECT step, n_ranks, dur_ns, mean_rank_dur_ns, complete FROM job_steps
        WHERE job = $job AND (complete OR $all) ORDER BY step""",
                {"job": job, "all": all_steps})


def step_stats(con: duckdb.DuckDBPyConnection, job: str, all_steps: bool = False
               ) -> list[dict[str, Any]]:
    """Per rank: its complete steps (steps: tiles of its timeline) and their durations."""
    return rows(con, """
        SELECT rank, count(*) AS n_steps, median(dur_ns) AS median_ns, avg(dur_ns) AS mean_ns,
               min(dur_ns) AS min_ns, max(dur_ns) AS max_ns
        FROM steps WHERE job = $job AND (complete OR $all) GROUP BY rank ORDER BY rank""",
                {"job": job, "all": all_steps})


def memory_peaks(con: duckdb.DuckDBPyConnection, job: str, all_steps: bool = False
                 ) -> list[dict[str, Any]]:
    """Per rank and device with allocator events: the step (complete ones, every one with
    ``all_steps``) of the highest memory_peaks peak, with what held the memory then."""
    return rows(con, """
        WITH p AS (
            SELECT m.* FROM memory_peaks m
            JOIN steps s ON s.job = m.job AND s.rank = m.rank AND s.step = m.step
            WHERE m.job = $job AND (s.complete OR $all))
        SELECT rank, device_type, device, count(*) AS n_steps,
               arg_max(step, (peak_allocated_bytes, -step)) AS step,
               max(peak_allocated_bytes) AS peak_allocated_bytes,
               arg_max(peak_reserved_bytes, (peak_allocated_bytes, -step))
                   AS peak_reserved_bytes,
               arg_max(live_at_peak_bytes, (peak_allocated_bytes, -step)) AS live_at_peak_bytes,
               arg_max(peak_top_op_name, (peak_allocated_bytes, -step)) AS peak_top_op_name,
               bool_or(relative) AS relative
        FROM p GROUP BY ALL ORDER BY rank, device_type, device""",
                {"job": job, "all": all_steps})


def cupti_totals(con: duckdb.DuckDBPyConnection, job: str) -> list[dict[str, Any]]:
    """Per CUPTI range-profiler metric (cupti_counters; empty for a trace without them): its
    total over the profiled kernels, how many, and the CPU op whose kernels add most to it."""
    return rows(con, """
        WITH by_op AS (
            SELECT metric, top_op_name, sum(value) AS v FROM cupti_counters
            WHERE job = $job GROUP BY ALL)
        SELECT c.metric, count(DISTINCT c.rank || ':' || c.eid) AS kernels,
               sum(c.value) AS total,
               (SELECT arg_max(top_op_name, v) FROM by_op b WHERE b.metric = c.metric)
                   AS top_op_name,
               (SELECT max(v) FROM by_op b WHERE b.metric = c.metric) AS top_op_total
        FROM cupti_counters c WHERE c.job = $job GROUP BY c.metric ORDER BY c.metric""",
                {"job": job})


def memory_series(con: duckdb.DuckDBPyConnection, job: str, peaks: list[dict[str, Any]]
                  ) -> dict[str, Any] | None:
    """The memory over the step of the job's highest device peak (the host's when no device
    has events), on that rank: per device, ms from the step's start, allocated and reserved
    MB (memory_timeline); None without allocator events."""
    if not peaks:
        return None
    top = max(peaks, key=lambda r: (r["device_type"] != "cpu", r["peak_allocated_bytes"]))
    series = rows(con, """
        SELECT m.device_type || ':' || m.device AS device,
               list((m.ts_ns - s.start_ns) / 1e6 ORDER BY m.ts_ns, m.eid) AS ms,
               list(m.allocated_bytes / 1e6 ORDER BY m.ts_ns, m.eid) AS allocated_mb,
               list(m.reserved_bytes / 1e6 ORDER BY m.ts_ns, m.eid) AS reserved_mb
        FROM memory_timeline m
        JOIN steps s ON s.job = m.job AND s.rank = m.rank AND s.step = m.step
        WHERE m.job = $job AND m.rank = $rank AND m.step = $step
        GROUP BY ALL ORDER BY device""", {"job": job, "rank": top["rank"], "step": top["step"]})
    return {"rank": top["rank"], "step": top["step"], "relative": top["relative"],
            "series": series}


def incomplete_steps(con: duckdb.DuckDBPyConnection, job: str) -> list[dict[str, Any]]:
    """The job steps left out of every statistic, and why (job_steps.incomplete_reason)."""
    return rows(con, """
        SELECT step, n_ranks, dur_ns, incomplete_reason FROM job_steps
        WHERE job = ? AND NOT complete ORDER BY step""", [job])


def breakdown(con: duckdb.DuckDBPyConnection, job: str, all_steps: bool = False
              ) -> list[dict[str, Any]]:
    """Per rank, the mean over its complete steps of step_breakdown: compute + exposed comm
    + exposed memcpy + idle add up to the step, so the stacked bars read as where it went."""
    return rows(con, """
        SELECT rank, count(*) AS n_steps, avg(dur_ns) AS dur_ns,
               avg(compute_ns) AS compute_ns, avg(comm_ns) AS comm_ns,
               avg(overlap_ns) AS overlap_ns, avg(exposed_comm_ns) AS exposed_comm_ns,
               avg(memcpy_ns) AS memcpy_ns, avg(exposed_memcpy_ns) AS exposed_memcpy_ns,
               avg(idle_ns) AS idle_ns, avg(cpu_bound_ns) AS cpu_bound_ns,
               avg(unexplained_gap_ns) AS unexplained_gap_ns
        FROM step_breakdown WHERE job = $job AND (complete OR $all)
        GROUP BY rank ORDER BY rank""", {"job": job, "all": all_steps})


def top_kernels(con: duckdb.DuckDBPyConnection, job: str, n: int = TOP) -> dict[str, Any]:
    """The kernels with the most total time over all ranks of the job."""
    return {"what": "kernels", "rows": rows(con, """
        SELECT name, any_value(category) AS category, sum(count)::BIGINT AS count,
               sum(total_ns)::BIGINT AS total_ns, sum(total_ns) / sum(count) AS mean_ns,
               sum(total_ns) / sum(sum(total_ns)) OVER () AS share
        FROM kernel_summary WHERE job = ? GROUP BY name
        ORDER BY total_ns DESC, name LIMIT ?""", [job, n])}


def top_cpu_ops(con: duckdb.DuckDBPyConnection, job: str, n: int = TOP) -> dict[str, Any]:
    """For a job without kernels: the CPU ops with the most self time. Self rather than
    inclusive time because CPU ops nest: by inclusive time the wrappers around everything
    (forward, backward, DDP hooks) would fill the list and count their children again."""
    return {"what": "cpu_ops", "rows": rows(con, """
        SELECT name, sum(count)::BIGINT AS count, sum(self_ns)::BIGINT AS self_ns,
               sum(total_ns)::BIGINT AS total_ns, sum(total_ns) / sum(count) AS mean_ns,
               sum(self_ns) / sum(sum(self_ns)) OVER () AS share
        FROM op_summary WHERE job = ? GROUP BY name
        ORDER BY self_ns DESC, name LIMIT ?""", [job, n])}


def collectives(con: duckdb.DuckDBPyConnection, job: str) -> dict[str, Any]:
    """Collective calls matched across ranks: totals per collective type and per rank."""
    by_type = rows(con, """
        WITH inst AS (
            SELECT instance, any_value(collective) AS collective, max(n_ranks) AS n_ranks,
                   max(skew_ns) AS skew_ns, max(transfer_ns) AS transfer_ns,
                   max(bytes) AS bytes, sum(wait_ns) AS wait_ns
            FROM collective_instances WHERE job = ? GROUP BY instance)
        SELECT collective, count(*) AS instances, count(bytes) AS sized_instances,
               -- the total only when every instance's size is known (2021 traces: none)
               CASE WHEN count(bytes) = count(*) THEN sum(bytes)::BIGINT END AS bytes,
               median(transfer_ns) AS median_transfer_ns, avg(skew_ns) AS mean_skew_ns,
               max(skew_ns) AS max_skew_ns, sum(wait_ns)::BIGINT AS wait_ns
        FROM inst GROUP BY collective ORDER BY wait_ns DESC, collective""", [job])
    by_rank = rows(con, """
        SELECT rank, count(*) AS calls, sum(dur_ns)::BIGINT AS dur_ns,
               sum(wait_ns)::BIGINT AS wait_ns,
               count(*) FILTER (WHERE rank = last_rank AND n_ranks > 1) AS times_last
        FROM collective_instances WHERE job = ? GROUP BY rank ORDER BY rank""", [job])
    return {"instances": sum(t["instances"] for t in by_type), "by_type": by_type,
            "by_rank": by_rank}


def critical_path_segments(con: duckdb.DuckDBPyConnection, job: str,
                           include_incomplete: bool = False
                           ) -> tuple[duckdb.DuckDBPyRelation | None, str | None]:
    """(the path's segments as a relation, None) from ``tracetool.analysis.critical_path``,
    or (None, why not). The rows stay in DuckDB: the summary and the chart aggregate them
    there.

    That module is optional and developed separately, so any failure to import it or to run
    it on this store makes the chart unavailable rather than failing the report."""
    try:
        cp = importlib.import_module("tracetool.analysis.critical_path")
    except Exception as err:  # ImportError, or a module that breaks while importing
        return None, f"tracetool.analysis.critical_path is not available ({first_line(err)})"
    try:
        path = cp.critical_path(con, job, include_incomplete=include_incomplete,
                                names=False)  # the summary and the chart need no names
        if not isinstance(path, duckdb.DuckDBPyRelation):  # a frame or rows: into DuckDB
            import pyarrow as pa

            path = con.from_arrow(pa.Table.from_pylist(_records(path)))
        missing = {"rank", "start_ns", "end_ns", "kind"} - set(path.columns)
        empty = not missing and not path.limit(1).fetchall()
    except Exception as err:  # its failure on this store must not fail the report
        return None, f"critical_path() failed on this store: {type(err).__name__}: " \
                     f"{first_line(err)}"
    if missing:
        return None, f"critical_path() rows lack {', '.join(sorted(missing))}"
    if empty:
        return None, "critical_path() found no path in this job"
    return path, None


def _records(obj: Any) -> list[dict[str, Any]]:
    """Rows of a table-like value (DuckDB relation, polars or pandas frame, pyarrow table,
    or a sequence of dicts / named tuples / dataclasses) as dicts."""
    if isinstance(obj, duckdb.DuckDBPyRelation):
        return [dict(zip(obj.columns, r, strict=True)) for r in obj.fetchall()]
    if hasattr(obj, "to_dicts"):  # polars
        return obj.to_dicts()
    if hasattr(obj, "to_pylist"):  # pyarrow
        return obj.to_pylist()
    if hasattr(obj, "to_dict"):  # pandas
        return obj.to_dict("records")
    out = []
    for r in obj:
        if is_dataclass(r) and not isinstance(r, type):
            out.append(asdict(r))
        elif hasattr(r, "_asdict"):
            out.append(r._asdict())
        else:
            out.append(dict(r))
    return out


def _path_columns(path: duckdb.DuckDBPyRelation) -> str:
    """The columns the summary and the chart read, as a select list (``step`` and ``seq``
    are optional: NULL when the rows have none; ``kind`` as text, 'None' when NULL)."""
    cols = set(path.columns)
    return ", ".join([
        "step" if "step" in cols else "NULL::INTEGER AS step",
        "seq" if "seq" in cols else "NULL::BIGINT AS seq",
        "rank", "coalesce(kind::VARCHAR, 'None') AS kind", "start_ns", "end_ns"])


def summarize_path(path: duckdb.DuckDBPyRelation) -> dict[str, Any]:
    """Segments, covered time and time per kind of a critical path (for text and JSON), in
    one aggregate query over its segments. Kinds by time, longest first (ties: in order of
    first appearance on the path)."""
    (n, steps, by_kind), = path.query("_cp_path", f"""
        WITH p AS (SELECT {_path_columns(path)} FROM _cp_path),
        k AS (SELECT kind, sum(end_ns - start_ns)::BIGINT AS ns, min((step, seq)) AS first
              FROM p GROUP BY kind)
        SELECT (SELECT count(*) FROM p),
               (SELECT list(DISTINCT step ORDER BY step) FILTER (WHERE step IS NOT NULL)
                FROM p),
               (SELECT list(struct_pack(kind := kind, dur_ns := ns)
                            ORDER BY ns DESC, first, kind) FROM k)""").fetchall()
    by_kind = by_kind or []
    return {"segments": n, "steps": steps or [], "dur_ns": sum(k["dur_ns"] for k in by_kind),
            "by_kind": [{"kind": k["kind"], "dur_ns": k["dur_ns"]} for k in by_kind]}


# -------------------------------------------------------------------------------- the charts

def skew_grid(con: duckdb.DuckDBPyConnection, job: str) -> tuple[list[int], np.ndarray]:
    """The collective skew chart's data: its ranks, and per rank and collective instance (in
    order of first arrival) how long the rank waited for the last one (ms; NaN: no call)."""
    cells = con.execute("""
        SELECT instance, rank, wait_ns, min(first_arrival_ns) OVER (PARTITION BY instance) AS t
        FROM collective_instances WHERE job = ?""", [job]).fetchall()
    instances = sorted({(t, i) for i, _, _, t in cells})
    col = {i: n for n, (_, i) in enumerate(instances)}
    ranks = sorted({r for _, r, _, _ in cells})
    row = {r: n for n, r in enumerate(ranks)}
    grid = np.full((len(ranks), len(instances)), np.nan)
    for i, r, wait, _ in cells:
        grid[row[r], col[i]] = (wait or 0) / 1e6
    return ranks, grid


CHART_COLUMNS = 1200  # the critical path chart is 12 in at 100 dpi: at most 1,200 px across


def critical_path_bars(path: duckdb.DuckDBPyRelation, columns: int = CHART_COLUMNS
                       ) -> dict[str, Any]:
    """What the critical path chart draws, aggregated in DuckDB so its cost is bounded by the
    picture, not by the number of segments.

    The path's span is cut into ``columns`` equal columns (each at most a pixel wide).
    A segment at least a column wide is one bar, as it is. The narrower ones are merged per
    rank, column and kind into one bar as long as their summed time, the kinds of a column
    placed side by side from the column's first narrow segment on: every kind keeps its
    exact total time on every lane, and a merged bar is off from where its time was by less
    than two columns. Returns t0_ns (the path's start), span_ns, column_ns, ranks (lanes,
    None last), kinds (sorted), steps_ns (each step's start, in step order), and per bar
    numpy arrays lane, kind (index into kinds), start_ns (after t0), dur_ns, merged."""
    cols = _path_columns(path)
    (t0, t1, ranks, no_rank, kinds, step_starts), = path.query("_cp_path", f"""
        WITH p AS (SELECT {cols} FROM _cp_path),
        s AS (SELECT step, min(start_ns) AS t FROM p GROUP BY step)
        SELECT min(start_ns), max(end_ns),
               list(DISTINCT rank ORDER BY rank) FILTER (WHERE rank IS NOT NULL),
               bool_or(rank IS NULL), list(DISTINCT kind ORDER BY kind),
               (SELECT list(t ORDER BY step NULLS LAST) FROM s)
        FROM p""").fetchall()
    ranks = [*(ranks or []), *([None] if no_rank else [])]
    kinds = sorted(kinds or [])
    span = int(t1 - t0)
    w = max(1, -(-span // columns))  # ns per column, rounded up
    bars = path.query("_cp_path", f"""
        WITH p AS (SELECT rank, kind, start_ns - {int(t0)} AS s, end_ns - start_ns AS d
                   FROM (SELECT {cols} FROM _cp_path) WHERE end_ns > start_ns),
        narrow AS (SELECT rank, kind, s // {w} AS col, min(s) AS s, sum(d)::BIGINT AS d
                   FROM p WHERE d < {w} GROUP BY ALL),
        bars AS (
            SELECT rank, kind, s, d, FALSE AS merged FROM p WHERE d >= {w}
            UNION ALL
            SELECT rank, kind, min(s) OVER (PARTITION BY rank, col) + coalesce(sum(d) OVER (
                       PARTITION BY rank, col ORDER BY kind
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::BIGINT,
                   d, TRUE
            FROM narrow)
        SELECT coalesce(list_position({_sql_list(ranks[:len(ranks) - no_rank])}, rank),
                        {len(ranks)}) - 1 AS lane,
               list_position({_sql_list(kinds)}, kind) - 1 AS kind,
               s AS start_ns, d AS dur_ns, merged
        FROM bars ORDER BY lane, kind, start_ns""").fetchnumpy()
    return {"t0_ns": int(t0), "span_ns": span, "column_ns": w, "ranks": ranks, "kinds": kinds,
            "steps_ns": [int(t) - int(t0) for t in step_starts or []],
            **{k: np.asarray(v) for k, v in bars.items()}}


def _sql_list(values: Sequence[Any]) -> str:
    """A SQL list literal of ints or plain strings (kind names, ranks)."""
    return "[" + ", ".join(str(int(v)) if isinstance(v, int) else
                           "'" + str(v).replace("'", "''") + "'" for v in values) + "]::" + (
        "BIGINT[]" if all(isinstance(v, int) for v in values) else "VARCHAR[]")


def chart_critical_path(path: duckdb.DuckDBPyRelation, job: str, out: Path) -> None:
    """Draw the critical path chart of ``path`` into ``out`` here (the report draws it in
    its drawing process)."""
    draw_critical_path(critical_path_bars(path), job, out)


# ------------------------------------------------------------------------ the report itself

@dataclass
class Section:
    """One part of the report, rendered the same way as text, Markdown and HTML."""

    title: str
    lines: list[str] = field(default_factory=list)
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)
    image: str | None = None  # file name inside the report directory


@dataclass
class Report:
    """A written report: its data (what ``--json`` prints) and its sections."""

    summary: dict[str, Any]
    sections: list[Section]
    out_dir: Path

    def text(self) -> str:
        """The terminal summary: every section's text and tables, charts as file paths."""
        out = [printable(f"tracetool report: job {self.summary['job']}")]
        for s in self.sections:
            title = printable(s.title)
            out += ["", title, "-" * len(title), *map(printable, s.lines)]
            for headers, body in s.tables:
                out += text_table(headers, body)
            if s.image:
                out.append(f"chart: {self.out_dir / s.image}")
        out += ["", "written: " + ", ".join(self.summary["files"].values())]
        return "\n".join(out) + "\n"


def make_report(con: duckdb.DuckDBPyConnection, job: str, out_dir: Path | str,
                store: Path | str | None = None, include_incomplete: bool = False,
                windows: str | None = None,
                collective_links: Callable[[], dict[str, Any] | None] | None = None
                ) -> Report:
    """Summarise ``job``, draw its charts and write ``report.md`` and ``report.html`` into
    ``out_dir`` (created). Charts left there by an earlier report are removed first, so the
    directory never shows a chart this report did not draw. ``collective_links``: called
    once the rest is known, it gives the collectives by link (``links_summary``'s dict, or
    None for none); the CLI computes it with replay's listing, which this layer cannot
    import, on a thread meanwhile."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in CHART_FILES:
        (out / name).unlink(missing_ok=True)
    # the charts are drawn in a second process while this one runs the queries; the
    # critical path runs on a second connection to the same database, on a thread, since
    # DuckDB releases the GIL while it executes (charts.py says why a process)
    with ChartDrawer() as drawer, con.cursor() as cp_con, ThreadPoolExecutor(1) as pool:
        cp_run = pool.submit(critical_path_segments, cp_con, job, include_incomplete)
        charts: dict[str, str] = {}
        summary = summarize(con, job, include_incomplete,
                            lambda key, parts: _draw_part(con, job, key, parts, out, charts,
                                                          drawer))
        summary["windows"] = windows  # None: ProfilerSteps; else the --annotation / --window
        cp_path, why_not = cp_run.result()
        summary["critical_path"] = (
            {"available": True, "reason": None, **summarize_path(cp_path)}
            if cp_path is not None else {"available": False, "reason": why_not})
        if cp_path is not None:
            gap = importlib.import_module(
                "tracetool.analysis.critical_path").unexplained_gap_warning(cp_path)
            if gap:
                summary["warnings"].append(gap)
            charts["critical_path"] = "critical_path.png"
            drawer.draw(draw_critical_path, critical_path_bars(cp_path), job,
                        out / charts["critical_path"])
        summary["step_timeline"] = step_timeline(con, job, cp_path, out, charts, drawer)
        mem = memory_series(con, job, summary["memory_peaks"])
        if mem is not None:
            charts["memory"] = "memory.png"
            drawer.draw(draw_memory, job, mem, out / charts["memory"])
        summary["op_efficiency"] = efficiency.summary(con, job, TOP)
        if summary["op_efficiency"] and summary["op_efficiency"]["points"]:
            charts["roofline"] = "roofline.png"
            drawer.draw(draw_roofline, job, summary["op_efficiency"], out / charts["roofline"])
        summary["collective_links"] = collective_links() if collective_links else None
        drawer.wait()
    sections = _sections(summary, charts, store)
    title = f"tracetool report: job {job}"
    write_text(out / "report.md", _markdown(title, sections))
    write_text(out / "report.html", _html(title, sections))
    summary["files"] = {**{k: str(out / v) for k, v in charts.items()},
                        "markdown": str(out / "report.md"), "html": str(out / "report.html")}
    return Report(summary, sections, out)


def step_timeline(con: duckdb.DuckDBPyConnection, job: str,
                  cp_path: duckdb.DuckDBPyRelation | None, out: Path,
                  charts: dict[str, str], drawer: ChartDrawer) -> dict[str, Any] | None:
    """The step timeline picture and its Perfetto trace (``step_timeline.py``), or None
    for a job without a complete step."""
    choice = choose_step(con, job, cp_path)
    if choice is None:
        return None
    charts["step_timeline"] = "step_timeline.png"
    drawer.draw(draw_step_timeline, timeline_data(con, job, choice, cp_path),
                out / charts["step_timeline"])
    info = {"step": choice.step, "ranks": choice.ranks, "slowest_because": choice.why,
            "start_ns": choice.start_ns, "end_ns": choice.end_ns, "perfetto": None}
    if cp_path is not None:
        segments = cp_path.filter(f"step = {choice.step}").to_arrow_table()
        if segments.num_rows:
            write_path_trace(con, job, segments, out / "step_timeline.json", choice.ranks)
            info["perfetto"] = "step_timeline.json"
    return info


def _draw_part(con: duckdb.DuckDBPyConnection, job: str, key: str, parts: dict[str, Any],
               out: Path, charts: dict[str, str], drawer: ChartDrawer) -> None:
    """Draw the charts that the summary's part ``key`` completes (``parts``: those known so
    far; the breakdown's title needs top's kind), if they have data; ``charts``: chart ->
    file name in out."""
    if key == "top":
        top = parts["top"]
        if parts["breakdown"]:
            charts["breakdown"] = "breakdown.png"
            drawer.draw(draw_breakdown, job, parts["breakdown"], top["what"] == "cpu_ops",
                        out / charts["breakdown"])
        if top["rows"]:
            charts["top"] = f"top_{top['what']}.png"  # top_kernels / top_cpu_ops
            drawer.draw(draw_top, job, top, out / charts["top"])
    elif key == "collectives" and parts["collectives"]["instances"]:
        charts["collective_skew"] = "collective_skew.png"
        drawer.draw(draw_skew, job, *skew_grid(con, job), out / charts["collective_skew"])


def _short(name: str, width: int = NAME_WIDTH) -> str:
    name = printable(name)
    return name if len(name) <= width else name[:width - 1] + "…"


def _mb(r: dict[str, Any]) -> str:
    """Total MB of a collective type, or why there is none (sizes not in the trace)."""
    if r["bytes"] is not None:
        return f"{r['bytes'] / 1e6:,.1f}"
    if r["sized_instances"]:
        return f"unknown ({r['sized_instances']} of {r['instances']} sized)"
    return "unknown"


def _ms(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e6:,.3f}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _left_out(incomplete: list[dict[str, Any]]) -> str | None:
    """One line for the job steps left out: the step, its reason and time when there is one;
    else their count and the steps of each reason as ranges (a clocks_disagree job leaves
    out every step: one line, not one per step)."""
    if len(incomplete) == 1:
        (r,) = incomplete
        return (f"Left out: step {r['step']} ({r['incomplete_reason']}, {_ms(r['dur_ns'])} ms "
                f"on {r['n_ranks']} ranks); include it with --include-incomplete.")
    if not incomplete:
        return None
    by_reason: dict[str, list[int]] = {}
    for r in incomplete:
        by_reason.setdefault(str(r["incomplete_reason"]), []).append(int(r["step"]))
    which = ", ".join(f"{_step_ranges(steps)} ({reason})" for reason, steps in by_reason.items())
    return (f"Left out: {len(incomplete)} incomplete job steps, {which}; include them with "
            "--include-incomplete.")


def _step_ranges(steps: list[int]) -> str:
    """[2, 3, 4, 7] -> 'steps 2-4, 7' ('step 7' alone)."""
    return f"step{'s' if len(steps) > 1 else ''} {number_ranges(steps, ', ')}"


def _sections(s: dict[str, Any], charts: dict[str, str], store: Path | str | None
              ) -> list[Section]:
    job_lines = [f"Ranks: {', '.join(map(str, s['ranks']))}"
                 + (f" of world size {s['world_size']}" if s["world_size"] else "")
                 + (f"; backend {s['backend']}" if s["backend"] else "")]
    if s["devices"]:
        job_lines.append(f"Devices: {', '.join(s['devices'])}")
    if s["unnamed_devices"]:
        job_lines.append(f"{'Also ' if s['devices'] else 'Devices: '}{s['unnamed_devices']} "
                         "per rank with no name in the trace's deviceProperties")
    if store is not None:
        job_lines.insert(0, f"Store: {store}")
    out = [Section("Job", job_lines)]
    if s.get("warnings"):
        out.append(Section("Warnings", list(s["warnings"])))

    what = s.get("windows") or "complete ProfilerSteps"
    if s["job_steps"]:
        job_steps = Section(f"Job steps ({what}, ms)")
        job_steps.lines.append("The iteration across ranks, as replay measures it; "
                               "docs/steps.md.")
        job_steps.tables.append((["step", "ranks", "job step", "mean rank step"], [
            [str(r["step"]), str(r["n_ranks"]), _ms(r["dur_ns"]), _ms(r["mean_rank_dur_ns"])]
            for r in s["job_steps"]]))
        out.append(job_steps)
    steps = Section(f"Steps per rank ({what}, ms)")
    if left_out := _left_out(s["incomplete_steps"]):
        steps.lines.append(left_out)
    if s["steps"]:
        steps.tables.append((["rank", "steps", "median", "mean", "min", "max"], [
            [str(r["rank"]), str(r["n_steps"]), _ms(r["median_ns"]), _ms(r["mean_ns"]),
             _ms(r["min_ns"]), _ms(r["max_ns"])] for r in s["steps"]]))
    else:
        steps.lines.append("No complete ProfilerStep windows: no step statistics or breakdown.")
    out.append(steps)

    if s["breakdown"]:
        bd = Section("Step breakdown (mean over steps, ms)", image=charts.get("breakdown"))
        bd.lines.append("compute + exposed comm + memcpy (not overlapped) + idle = step.")
        if s["top"]["what"] == "cpu_ops":
            bd.lines.append("CPU-only job: compute is top-level CPU ops, comm the gloo "
                            "transfers.")
        bd.tables.append((["rank", "mean step", "compute", "comm", "overlap", "exposed comm",
                           "memcpy", "memcpy exposed", "idle"], [
            [str(r["rank"]), _ms(r["dur_ns"]), _ms(r["compute_ns"]), _ms(r["comm_ns"]),
             _ms(r["overlap_ns"]), _ms(r["exposed_comm_ns"]), _ms(r["memcpy_ns"]),
             _ms(r["exposed_memcpy_ns"]), _ms(r["idle_ns"])] for r in s["breakdown"]]))
        out.append(bd)

    top = s["top"]
    if top["what"] == "kernels":
        sec = Section(f"Top {len(top['rows'])} kernels by total time (all ranks)",
                      image=charts.get("top"))
        sec.tables.append((["total ms", "share", "count", "mean us", "category", "name"], [
            [_ms(r["total_ns"]), _pct(r["share"]), str(r["count"]), f"{r['mean_ns'] / 1e3:.1f}",
             r["category"], _short(r["name"])] for r in top["rows"]]))
    else:
        sec = Section(f"Top {len(top['rows'])} CPU ops by self time (all ranks; no GPU "
                      "kernels in this job)", image=charts.get("top"))
        sec.tables.append((["self ms", "share", "total ms", "count", "mean us", "name"], [
            [_ms(r["self_ns"]), _pct(r["share"]), _ms(r["total_ns"]), str(r["count"]),
             f"{r['mean_ns'] / 1e3:.1f}", _short(r["name"])] for r in top["rows"]]))
    if not top["rows"]:
        sec.lines.append("Nothing recorded.")
    out.append(sec)

    c = s["collectives"]
    coll = Section("Collectives", image=charts.get("collective_skew"))
    if c["instances"]:
        coll.lines.append(f"{c['instances']} collective calls matched across ranks. "
                          "Wait: how long a rank waited for the last one to arrive.")
        coll.tables.append((["collective", "instances", "MB", "median transfer ms",
                             "mean skew ms", "max skew ms", "total wait ms"], [
            [r["collective"] or "unnamed (no Collective name in the trace)", str(r["instances"]),
             _mb(r),
             _ms(r["median_transfer_ns"]), _ms(r["mean_skew_ns"]), _ms(r["max_skew_ns"]),
             _ms(r["wait_ns"])] for r in c["by_type"]]))
        coll.tables.append((["rank", "calls", "in collectives ms", "waited ms", "times last"], [
            [str(r["rank"]), str(r["calls"]), _ms(r["dur_ns"]), _ms(r["wait_ns"]),
             str(r["times_last"])] for r in c["by_rank"]]))
    else:
        coll.lines.append("No collective calls recorded.")
    out.append(coll)
    if links := s.get("collective_links"):
        out.append(links_section(links))

    if s.get("memory_peaks"):
        out.append(_memory_section(s["memory_peaks"], charts))
    if s.get("cupti_counters"):
        out.append(_cupti_section(s["cupti_counters"]))

    cp = s["critical_path"]
    st = s.get("step_timeline")
    if st:
        tl = Section(f"Step timeline (job step {st['step']})", image=charts.get("step_timeline"))
        tl.lines.append(
            f"Job step {st['step']}, the complete step of median duration, on "
            + " and ".join(f"rank {r}" for r in st["ranks"])
            + (f" (the slowest: {st['slowest_because']})" if len(st["ranks"]) > 1 else "")
            + ": every CPU thread and GPU stream as a lane, GPU ops coloured by kernel "
              "category, CPU ops (two levels of nesting) in brown, the critical path as a "
              "black line along the lanes it ran on.")
        if st["perfetto"]:
            tl.lines.append(f"The same window as a trace for Perfetto (ui.perfetto.dev, Open "
                            f"trace file): {st['perfetto']}, with the critical path as its "
                            "own track.")
    crit = Section("Critical path", image=charts.get("critical_path"))
    if cp["available"]:
        crit.lines.append(f"{cp['segments']} segments, {_ms(cp['dur_ns'])} ms in all.")
        crit.tables.append((["kind", "ms", "share"], [
            [k["kind"], _ms(k["dur_ns"]), _pct(k["dur_ns"] / cp["dur_ns"] if cp["dur_ns"]
                                               else None)] for k in cp["by_kind"]]))
    else:
        crit.lines.append(f"Critical path chart unavailable: {cp['reason']}.")
    out.append(crit)
    if st:
        out.append(tl)
    if s.get("op_efficiency"):
        out.append(op_efficiency_section(s["op_efficiency"], charts.get("roofline")))
    return out


def _memory_section(peaks: list[dict[str, Any]], charts: dict[str, str]) -> Section:
    sec = Section("Memory (allocator events)", image=charts.get("memory"))
    sec.lines.append("The highest peak of allocated memory over the steps, per rank and "
                     "device (memory_peaks); held by this trace's allocations: what was "
                     "allocated in the trace and still live then (the rest predates it).")
    if any(r["relative"] for r in peaks):
        sec.lines.append("Relative levels: the trace records no allocator totals, so the "
                         "levels are sums of its allocations from its first event.")
    sec.tables.append((["rank", "device", "step", "peak MB", "reserved MB",
                        "held by this trace's allocations MB", "peak reached in"], [
        [str(r["rank"]), f"{r['device_type']}:{r['device']}", str(r["step"]),
         _mb_of(r["peak_allocated_bytes"]), _mb_of(r["peak_reserved_bytes"]),
         _mb_of(r["live_at_peak_bytes"]), _short(r["peak_top_op_name"] or "")]
        for r in peaks]))
    return sec


def _cupti_section(totals: list[dict[str, Any]]) -> Section:
    sec = Section("Hardware counters (CUPTI range profiler)")
    sec.lines.append("Each metric summed over the profiled kernels (view cupti_counters), and "
                     "the CPU op whose kernels add most to it (ranges paired with kernel "
                     "launches in order, as HTA does).")
    sec.tables.append((["metric", "kernels", "total", "most from", "its share"], [
        [r["metric"], str(r["kernels"]), f"{r['total']:,.0f}" if r["total"] is not None else "",
         _short(r["top_op_name"] or "") if r["top_op_total"] else "",
         _pct(r["top_op_total"] / r["total"] if r["total"] else None)] for r in totals]))
    return sec


def _mb_of(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes / 1e6:,.1f}"


def op_efficiency_section(e: dict[str, Any], image: str | None) -> Section:
    """The top ops and shapes by kernel time against the GPU's roofline (the op_efficiency
    view, ``efficiency.summary``'s data)."""
    sec = Section(f"Op efficiency against the roofline (top {len(e['rows'])} ops and shapes "
                  "by kernel time, all ranks)", image=image)
    share = e["worked_ns"] / e["kernel_ns"] if e["kernel_ns"] else 0.0
    sec.lines.append(f"FLOPs and bytes from the ops' recorded shapes cover {_pct(share)} of "
                     "the kernel time (view op_efficiency; docs/op_efficiency.md).")
    roof = e["roofline"]
    if roof is not None:
        sec.lines.append(
            f"{e['gpu_name']}: {roof['runs_at'].upper()} peak {roof['peak_tflops']:g} TFLOP/s, "
            f"HBM {roof['peak_tbps']:g} TB/s; ridge {roof['ridge']:.0f} FLOP/B at the "
            "achievable fractions replay uses. % peak: of the bounding resource; % roofline: "
            "the roofline's time over the measured.")
        if e["other_dtypes"]:
            sec.lines.append(f"The chart shows the {roof['dtype'].upper()} ops; "
                             f"{e['other_dtypes']} ops and shapes of other dtypes are in the "
                             "view only.")
    elif e["gpu"] is None:
        names = ", ".join(e["devices"]) or "no name in deviceProperties"
        sec.lines.append(f"GPU not in the catalog ({names}): achieved rates only, no % of "
                         "peak, bound or roofline.")
    if not e["worked_ns"]:
        sec.lines.append("No op here has recorded shapes (profile with record_shapes=True).")

    def num(v: float | None, fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    sec.tables.append((["total ms", "count", "class", "op", "shapes", "TFLOP/s", "TB/s",
                        "% peak", "bound", "% roofline"], [
        [_ms(r["total_ns"]), str(r["count"]), r["category"] or "", _short(r["op"], 40),
         _short(_shapes(r["input_dims"]), 48), num(r["achieved_tflops"], ".2f"),
         num(r["achieved_tbps"], ".3f"), num(r["pct_peak"], ".1f"), r["bound"] or "",
         num(r["pct_roofline"], ".1f")] for r in e["rows"]]))
    return sec


def _shapes(dims: str | None) -> str:
    """Input Dims without the trailing non-tensor arguments ([] each)."""
    if not dims:
        return "not recorded"
    shapes = json.loads(dims)
    while shapes and shapes[-1] == []:
        shapes.pop()
    return json.dumps(shapes, separators=(",", ":"))


def text_table(headers: list[str], body: list[list[str]]) -> list[str]:
    """Aligned columns: numbers to the right, text to the left; control characters in the
    cells shown as escapes (names come from traces)."""
    headers = [printable(h) for h in headers]
    body = [[printable(c) for c in r] for r in body]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    right = [all(_numeric(r[i]) for r in body) for i in range(len(headers))]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in body)]


def _numeric(text: str) -> bool:
    """A number as the tables print it (1,234.5, +3.2%, -1.000 ms), or a placeholder for
    one ('', '-', 'new')."""
    if text in ("", "-", "new"):
        return True
    try:
        float(text.removesuffix(" ms").rstrip("%").replace(",", ""))
        return True
    except ValueError:
        return False


def _markdown(title: str, sections: list[Section]) -> str:
    out = [f"# {markdown_cell(title)}", ""]
    for s in sections:
        out += [f"## {markdown_cell(s.title)}", ""]
        out += [x for line in s.lines for x in (markdown_cell(line), "")]
        for headers, body in s.tables:
            out += ["| " + " | ".join(markdown_cell(h) for h in headers) + " |",
                    "|" + "---|" * len(headers)]
            out += ["| " + " | ".join(markdown_cell(c) for c in r) + " |" for r in body]
            out.append("")
        if s.image:
            out += [f"![{s.title}]({s.image})", ""]
    return "\n".join(out)


def _html(title: str, sections: list[Section]) -> str:
    e = html.escape
    # one file beside its PNGs; no script, no external resource; fits a laptop screen
    # (tables scroll inside their box rather than widening the page)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;"
           "padding:0 1em;}.t{overflow-x:auto;}"
           "table{border-collapse:collapse;margin:1em 0;font-size:90%;}"
           "td,th{border:1px solid #ccc;padding:2px 8px;}td{text-align:right;}"
           "td:last-child{text-align:left;word-break:break-all;}img{max-width:100%;}"
           "</style></head><body>",
           f"<h1>{e(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{e(line)}</p>" for line in s.lines]
        for headers, body in s.tables:
            out.append('<div class="t"><table><tr>'
                       + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in body]
            out.append("</table></div>")
        if s.image:
            out.append(f'<p><img src="{e(s.image)}" alt="{e(s.title)}"></p>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def to_json(summary: dict[str, Any]) -> str:
    """The summary as one line of JSON."""
    return json.dumps(summary, default=str)


def links_summary(rows: list[dict[str, Any]] | None, where: str, projected: bool = False,
                  network: str | None = None, reason: str | None = None) -> dict[str, Any]:
    """The report's ``collective_links``: replay's listing ``rows`` (its JSON's
    ``collectives``) on the placement ``where`` names, as measured or ``projected`` (under
    --network ``network`` and/or a --placement), or why there is none (``reason``, rows
    None)."""
    return {"available": rows is not None, "reason": reason, "where": where,
            "projected": projected, "network": network, "rows": rows}


def links_section(links: dict[str, Any]) -> Section:
    """The report's section of ``links_summary``'s dict."""
    if not links["available"]:
        return Section("Collectives by link", [f"Unavailable: {links['reason']}."])
    how = (f"projected onto network {links['network']}" if links["network"] else "projected"
           ) if links["projected"] else "as measured"
    return collective_links_section(links["rows"], f"{how}, {links['where']}",
                                    projected=links["projected"])


def collective_links_section(rows: list[dict[str, Any]], where: str, top: int = TOP,
                             projected: bool = True) -> Section:
    """Which collectives cross which links and what each costs: the top ``top`` rows of
    replay's collective listing (``replay.run.collective_listing``, per kind and group,
    summed over the steps; passed in: the analysis layer does not replay), ``where`` naming
    the placement and scenario; the projected columns only with ``projected`` (a what-if:
    without one they repeat the measured ones)."""
    sec = Section("Collectives by link", [
        f"Per kind and group, summed over the steps ({where}): the links the group crosses "
        "(intra-node, inter-node, dc = across datacenters), its bytes, its transfer (last "
        "arrival to end) and its exposed part (not overlapped by compute, as in the "
        "breakdown), " + ("measured and projected; largest projected exposed first."
                          if projected else "largest first.")])
    if not rows:
        sec.lines.append("No collective in the steps.")
        return sec
    cols = [("kind", lambda r: r["kind"]), ("group", lambda r: number_ranges(r["group"])),
            ("links", lambda r: "+".join(r["links"] or ["?"])),
            ("n", lambda r: str(r["instances"])),
            ("MB", lambda r: f"{r['bytes'] / 1e6:.3f}" if r["sized"] else "unknown"),
            ("transfer ms", lambda r: _ms(r["measured_transfer_ns"])),
            ("projected ms", lambda r: _ms(r["projected_transfer_ns"])),
            ("exposed ms", lambda r: _ms(r["measured_exposed_ns"])),
            ("projected exposed ms", lambda r: _ms(r["projected_exposed_ns"]))]
    if not projected:
        cols = [c for c in cols if not c[0].startswith("projected")]
    sec.tables.append(([h for h, _ in cols], [[cell(r) for _, cell in cols]
                                              for r in rows[:top]]))
    if len(rows) > top:
        sec.lines.append(f"{len(rows) - top} more in the JSON.")
    return sec
