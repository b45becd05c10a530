"""Windows other than ProfilerStep: a user annotation's instances, or a time window.

``--annotation NAME [--instance N]`` (as HTA's critical path takes an annotation and an
instance) and ``--window 10ms:250ms`` (relative to the job's first event) make ``report``,
``critical-path``, ``replay`` and ``sweep`` work on those windows instead of the
ProfilerSteps. They do it in one place: ``use_windows`` redefines the view ``step_marks`` that
``steps`` and ``job_steps`` are made from (analysis/sql/05_steps.sql), so every number of every
command follows, exactly as for steps. Such windows are not tiled: each spans its own events
(docs/steps.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb

from tracetool.errors import InputError

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TIME = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s)\s*$")


class WindowError(InputError):
    """A window that names nothing: an unknown annotation, a missing instance, a time window
    outside the trace, or a malformed one."""


@dataclass(frozen=True)
class Windows:
    """What the steps are made of: ProfilerSteps (both None), an annotation, or a window."""

    annotation: str | None = None
    instance: int | None = None
    window: tuple[int, int] | None = None  # ns after the job's first event

    def __post_init__(self) -> None:
        if self.annotation is not None and self.window is not None:
            raise WindowError("give --annotation or --window, not both")
        if self.instance is not None and self.annotation is None:
            raise WindowError("--instance needs --annotation")

    @property
    def label(self) -> str | None:
        if self.annotation is not None:
            return f"annotation {self.annotation!r}" + (
                "" if self.instance is None else f" instance {self.instance}")
        if self.window is not None:
            return f"window {self.window[0] / 1e6:g}ms:{self.window[1] / 1e6:g}ms"
        return None


def parse_time(text: str) -> int:
    """'250ms' -> 250000000 (ns); units ns, us, ms, s; at most 2^63-1 ns (a BIGINT, ~292
    years: a longer one overflows)."""
    m = _TIME.match(text)
    if not m:
        raise WindowError(f"bad time {text!r}: use a number and a unit (ns, us, ms, s), "
                          "e.g. 250ms")
    ns = float(m.group(1)) * _UNITS_NS[m.group(2)]
    if not ns < 2**63:  # inf for a number of 400 digits
        raise WindowError(f"bad time {text[:40]!r}: at most {2**63 - 1} ns")
    return round(ns)


def parse_window(text: str) -> tuple[int, int]:
    """'10ms:250ms' -> (10000000, 250000000): ns after the job's first event."""
    a, sep, b = text.partition(":")
    if not sep:
        raise WindowError(f"bad window {text!r}: use START:END with units, e.g. 10ms:250ms")
    start, end = parse_time(a), parse_time(b)
    if end <= start:
        raise WindowError(f"bad window {text!r}: its end must be after its start")
    return start, end


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def use_windows(con: duckdb.DuckDBPyConnection, job: str, windows: Windows) -> None:
    """Make ``con``'s steps (and everything built on them) ``windows`` of ``job``; nothing for
    ProfilerSteps. Raises WindowError when the windows would select nothing."""
    if windows.annotation is not None:
        _use_annotation(con, job, windows.annotation, windows.instance)
    elif windows.window is not None:
        _use_time_window(con, job, *windows.window)


def _use_annotation(con: duckdb.DuckDBPyConnection, job: str, name: str,
                    instance: int | None) -> None:
    counts = dict(con.execute(
        """SELECT rank, count(*) FROM events WHERE job = ? AND name = ? AND ph = 'X'
             AND track_kind = 'cpu_thread' AND dur_ns IS NOT NULL GROUP BY rank""",
        [job, name]).fetchall())
    if not counts:
        known = [n for (n,) in con.execute(
            """SELECT name FROM events WHERE job = ? AND kind = 'user_annotation' AND ph = 'X'
               AND NOT starts_with(name, 'ProfilerStep#') GROUP BY name
               ORDER BY count(*) DESC, name LIMIT 8""", [job]).fetchall()]
        raise WindowError(f"job {job} has no annotation {name!r} on a CPU thread"
                          + (f"; its annotations include: {', '.join(known)}" if known
                             else ""))
    if instance is not None and instance >= min(counts.values()):
        raise WindowError(f"annotation {name!r} of job {job} has instances 0 to "
                          f"{min(counts.values()) - 1} on every rank, not {instance}")
    keep = "" if instance is None else f"WHERE step = {int(instance)}"
    marks = f"""(
        SELECT * FROM (
            SELECT job, rank, (row_number() OVER (PARTITION BY job, rank
                                                   ORDER BY ts_ns, eid) - 1)::INTEGER AS step,
                   eid, tid, ts_ns AS cpu_start_ns, end_ns AS cpu_end_ns
            FROM events WHERE job = {_literal(job)} AND name = {_literal(name)} AND ph = 'X'
              AND track_kind = 'cpu_thread' AND dur_ns IS NOT NULL) {keep})"""
    con.execute(f"""
        CREATE OR REPLACE VIEW step_gpu_ops AS
        SELECT m.job, m.rank, m.step, g.eid FROM {marks} m JOIN gpu_ops g
          ON g.job = m.job AND g.rank = m.rank
         AND coalesce(g.launch_ts_ns, g.ts_ns) >= m.cpu_start_ns
         AND coalesce(g.launch_ts_ns, g.ts_ns) < m.cpu_end_ns""")
    con.execute(f"""
        CREATE OR REPLACE VIEW step_marks AS
        WITH gs AS (
            SELECT o.job, o.rank, o.step, min(g.ts_ns) AS gpu_start_ns,
                   max(g.end_ns) AS gpu_end_ns, count(*) AS n_gpu_ops,
                   arg_min(g.eid, (g.ts_ns, g.eid)) AS gpu_first_eid
            FROM step_gpu_ops o JOIN gpu_ops g USING (job, rank, eid) GROUP BY ALL)
        SELECT m.step, m.eid, m.tid, m.cpu_start_ns, m.cpu_end_ns, TRUE AS finished,
               gs.gpu_start_ns, gs.gpu_end_ns, coalesce(gs.n_gpu_ops, 0) AS n_gpu_ops,
               NULL::BIGINT AS gpu_annotation_ns, gs.gpu_first_eid,
               gs.gpu_start_ns AS gpu_first_ns, m.job, m.rank, FALSE AS tiled,
               NULL::BIGINT AS window_start_ns, NULL::BIGINT AS window_end_ns
        FROM {marks} m LEFT JOIN gs USING (job, rank, step)""")


def _use_time_window(con: duckdb.DuckDBPyConnection, job: str, start: int, end: int) -> None:
    t0, t1 = con.execute(
        """SELECT min(ts_ns), max(end_ns) FROM events
           WHERE job = ? AND ph = 'X' AND dur_ns >= 0""", [job]).fetchone()
    if t0 is None:
        raise WindowError(f"job {job} has no events to take a window of")
    span = t1 - t0
    if end > span:
        raise WindowError(f"window {start / 1e6:g}ms:{end / 1e6:g}ms ends after the trace of "
                          f"job {job}, which spans {span / 1e6:.3f} ms from its first event")
    con.execute("""
        CREATE OR REPLACE VIEW step_gpu_ops AS
        SELECT job, rank, 0 AS step, eid FROM gpu_ops WHERE FALSE""")
    con.execute(f"""
        CREATE OR REPLACE VIEW step_marks AS
        SELECT 0 AS step, NULL::BIGINT AS eid, NULL::BIGINT AS tid,
               {t0 + start}::BIGINT AS cpu_start_ns, {t0 + end}::BIGINT AS cpu_end_ns,
               TRUE AS finished, NULL::BIGINT AS gpu_start_ns, NULL::BIGINT AS gpu_end_ns,
               0::BIGINT AS n_gpu_ops, NULL::BIGINT AS gpu_annotation_ns,
               NULL::BIGINT AS gpu_first_eid, NULL::BIGINT AS gpu_first_ns, job, rank,
               FALSE AS tiled, {t0 + start}::BIGINT AS window_start_ns,
               {t0 + end}::BIGINT AS window_end_ns
        FROM trace_files WHERE job = {_literal(job)}""")


def no_complete_steps(con: duckdb.DuckDBPyConnection, job: str) -> str | None:
    """The one line for ``job`` when it has steps but none complete (job_steps), naming how
    many were left out and why, so critical-path, replay and sweep neither fall back to the
    whole trace nor print an empty table; None when a step is complete or the job has none
    (no ProfilerStep: the whole trace is the window)."""
    rows = con.execute("""SELECT incomplete_reason, count(*) FROM job_steps WHERE job = ?
                          GROUP BY ALL ORDER BY 2 DESC, 1""", [job]).fetchall()
    if not rows or any(reason is None for reason, _ in rows):
        return None
    why = ", ".join(f"{n} {reason}" for reason, n in rows)
    n = sum(n for _, n in rows)
    return (f"job {job} has no complete step: {n} left out as incomplete ({why}; "
            "docs/steps.md); --include-incomplete takes them")
