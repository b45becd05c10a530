"""Compare two jobs (usually a baseline store and a new one): what changed, and by how much.

Two views of the difference:

- per name, for CPU ops (op_summary) and GPU ops (kernels, memcpy and memset from gpu_ops):
  count, total time and mean of each job (summed over all its ranks and its whole trace), the
  absolute and relative deltas, sorted by the absolute change of total time, so the first rows
  are what moved the most. A name on one side only is 'added' or 'removed'.
- three per-step metrics for regression gates (``--fail-if``): the median job step
  (job_steps, the iteration across ranks, as report and replay print it) and medians over
  the (rank, step) pairs of complete steps. Per step, because two runs rarely profile the
  same number of steps or ranks; median, because one slow warm-up step should not trip a
  gate. Incomplete steps (docs/steps.md) are left out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import duckdb

from tracetool.analysis.report import rows, text_table

METRICS = {
    "step_time": "median job step duration (job_steps.dur_ns: the iteration across ranks)",
    "kernel_time": "median over ranks and steps of the summed durations of the compute "
                   "kernels launched in the step (communication kernels excluded)",
    "comm_time": "median over ranks and steps of the time with communication running "
                 "(step_breakdown.comm_ns)",
}
UNIT_NS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
EXPR = re.compile(r"(?P<metric>[a-z_]+)\s*(?P<op>[<>])\s*"
                  r"(?P<value>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>%|ns|us|ms|s)")
EXPR_HELP = ("expected METRIC>VALUE with METRIC one of " + ", ".join(METRICS)
             + " and VALUE a change like +5% or an absolute one like +2ms (units ns, us, ms, s)")


class MetricUnavailable(Exception):
    """A gate names a metric that one of the jobs cannot provide (no complete steps)."""


@dataclass(frozen=True)
class Threshold:
    """One ``--fail-if`` expression: crossed when B's metric moved past ``value`` from A's,
    relative (``value`` in percent) or absolute (``value`` in ns)."""

    text: str
    metric: str
    op: str  # '>' or '<'
    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> Threshold:
        """``step_time>+5%``, ``kernel_time>+10%``, ``step_time>+2ms``, ``comm_time<-5%``...
        Raises ValueError with a one-line message for anything else."""
        m = EXPR.fullmatch(text.strip())
        if not m:
            raise ValueError(f"--fail-if {text!r}: {EXPR_HELP}")
        if m["metric"] not in METRICS:
            raise ValueError(f"--fail-if {text!r}: unknown metric {m['metric']!r} "
                             f"(one of {', '.join(METRICS)})")
        value, unit = float(m["value"]), m["unit"]
        return cls(text.strip(), m["metric"], m["op"],
                   value if unit == "%" else value * UNIT_NS[unit], unit == "%")

    def observe(self, a: float, b: float) -> float:
        """B's change from A: percent when relative (±inf from a zero A), else ns."""
        if not self.relative:
            return b - a
        if a == 0:
            return 0.0 if b == 0 else math.copysign(math.inf, b)
        return (b - a) / a * 100

    def crossed(self, a: float, b: float) -> bool:
        seen = self.observe(a, b)
        return seen > self.value if self.op == ">" else seen < self.value


def job_metrics(con: duckdb.DuckDBPyConnection, job: str) -> dict[str, Any]:
    """The gate metrics of one job (None when it has no complete ProfilerStep), how many
    (rank, step) pairs the per-rank ones are medians over, and the complete job steps."""
    out = rows(con, """
        WITH st AS (SELECT rank, step, dur_ns FROM steps WHERE job = $job AND complete),
        k AS (SELECT rank, step, sum(dur_ns) AS ns FROM kernels
              WHERE job = $job AND category <> 'comm' AND step IS NOT NULL
              GROUP BY rank, step),
        b AS (SELECT rank, step, comm_ns FROM step_breakdown WHERE job = $job)
        SELECT count(*) AS rank_steps,
               (SELECT median(dur_ns) FROM job_steps WHERE job = $job AND complete)
                   AS step_time_ns,
               median(coalesce(k.ns, 0)) AS kernel_time_ns,
               median(coalesce(b.comm_ns, 0)) AS comm_time_ns
        FROM st LEFT JOIN k USING (rank, step) LEFT JOIN b USING (rank, step)""",
               {"job": job})[0]
    out["job_steps"] = rows(con, """SELECT step, dur_ns FROM job_steps
                                    WHERE job = ? AND complete ORDER BY step""", [job])
    return out


def totals_by_name(con: duckdb.DuckDBPyConnection, job: str, what: str
                   ) -> dict[str, dict[str, Any]]:
    """name -> {kind, count, total_ns} over all ranks of the job; ``what`` is 'cpu_ops' (CPU
    operators, inclusive time) or 'gpu_ops' (kernels, memcpy, memset)."""
    sql = {
        "cpu_ops": """SELECT name, 'cpu_op' AS kind, sum(count)::BIGINT AS count,
                             sum(total_ns)::BIGINT AS total_ns
                      FROM op_summary WHERE job = ? GROUP BY name""",
        "gpu_ops": """SELECT name, any_value(kind) AS kind, count(*) AS count,
                             sum(dur_ns)::BIGINT AS total_ns
                      FROM gpu_ops WHERE job = ? GROUP BY name""",
    }[what]
    return {r["name"]: r for r in rows(con, sql, [job])}


def _rel(a: float | None, b: float | None) -> float | None:
    """(b - a) / a; None when it has no value (a missing or zero)."""
    return None if a is None or b is None or a == 0 else (b - a) / a


def diff_names(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]
               ) -> list[dict[str, Any]]:
    """One row per name of either side, the largest absolute change of total time first."""
    out = []
    for name in a.keys() | b.keys():
        ra, rb = a.get(name), b.get(name)
        ca, ta = (ra["count"], ra["total_ns"]) if ra else (0, 0)
        cb, tb = (rb["count"], rb["total_ns"]) if rb else (0, 0)
        ma = round(ta / ca) if ca else None
        mb = round(tb / cb) if cb else None
        out.append({
            "name": name, "kind": (ra or rb)["kind"],
            "status": "added" if ra is None else "removed" if rb is None else "both",
            "count_a": ca, "count_b": cb, "count_delta": cb - ca,
            "total_a_ns": ta, "total_b_ns": tb, "total_delta_ns": tb - ta,
            "total_rel": _rel(ta, tb),
            "mean_a_ns": ma, "mean_b_ns": mb,
            "mean_delta_ns": None if ma is None or mb is None else mb - ma,
            "mean_rel": _rel(ma, mb),
        })
    out.sort(key=lambda r: (-abs(r["total_delta_ns"]), r["name"]))
    return out


def diff_jobs(con_a: duckdb.DuckDBPyConnection, job_a: str, con_b: duckdb.DuckDBPyConnection,
              job_b: str, top: int | None = None) -> dict[str, Any]:
    """The difference from job A to job B as JSON-ready data; per-name tables keep their
    ``top`` largest changes (all when None)."""
    sides = {}
    for side, con, job in (("a", con_a, job_a), ("b", con_b, job_b)):
        ranks = [r for (r,) in con.execute(
            "SELECT DISTINCT rank FROM trace_files WHERE job = ? ORDER BY rank", [job]
        ).fetchall()]
        sides[side] = {"job": job, "ranks": ranks, **job_metrics(con, job)}
    out: dict[str, Any] = {**sides, "metrics": []}
    for m in METRICS:
        va, vb = sides["a"][f"{m}_ns"], sides["b"][f"{m}_ns"]
        out["metrics"].append({
            "metric": m, "a_ns": va, "b_ns": vb,
            "delta_ns": None if va is None or vb is None else vb - va, "rel": _rel(va, vb)})
    for what in ("cpu_ops", "gpu_ops"):
        a, b = totals_by_name(con_a, job_a, what), totals_by_name(con_b, job_b, what)
        d = diff_names(a, b)
        out[what] = {"names_a": len(a), "names_b": len(b),
                     "added": sum(r["status"] == "added" for r in d),
                     "removed": sum(r["status"] == "removed" for r in d),
                     "total_a_ns": sum(r["total_ns"] for r in a.values()),
                     "total_b_ns": sum(r["total_ns"] for r in b.values()),
                     "rows": d if top is None else d[:top]}
    return out


def check(result: dict[str, Any], thresholds: list[Threshold]) -> list[dict[str, Any]]:
    """Each threshold evaluated on a diff_jobs result: expr, metric, crossed, observed
    (percent or ns) and a one-line message. Raises MetricUnavailable when a job has no
    value for the metric: a gate that cannot be evaluated must not pass silently."""
    out = []
    for t in thresholds:
        a, b = result["a"][f"{t.metric}_ns"], result["b"][f"{t.metric}_ns"]
        for side, v in (("A", a), ("B", b)):
            if v is None:
                job = result[side.lower()]["job"]
                raise MetricUnavailable(f"--fail-if {t.text!r}: job {job} ({side}) has no "
                                        f"complete ProfilerStep, so no {t.metric}")
        seen = t.observe(a, b)
        change = _signed_pct(seen) if t.relative else _signed_ms(seen)
        out.append({"expr": t.text, "metric": t.metric, "crossed": t.crossed(a, b),
                    "observed": seen if math.isfinite(seen) else None,
                    "message": f"{t.metric} {_ms(a)} ms -> {_ms(b)} ms ({change})"})
    return out


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.3f}"


def _signed_ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:+,.3f} ms"


def _signed_pct(pct: float | None) -> str:
    if pct is None:
        return "-"
    return "new" if math.isinf(pct) else f"{pct:+.1f}%"


def render_text(result: dict[str, Any], checks: list[dict[str, Any]]) -> str:
    """The diff as text: both sides, the metrics, the two per-name tables, the gates."""
    out = []
    for side in ("a", "b"):
        s = result[side]
        where = f"{s['store']}, " if "store" in s else ""
        out.append(f"{side.upper()}: {where}job {s['job']}, ranks "
                   f"{', '.join(map(str, s['ranks']))}, {s['rank_steps']} rank-steps")
    out.append("")
    out += text_table(["metric", "A ms", "B ms", "delta", "change"], [
        [m["metric"], _ms(m["a_ns"]), _ms(m["b_ns"]), _signed_ms(m["delta_ns"]),
         _signed_pct(None if m["rel"] is None else 100 * m["rel"])]
        for m in result["metrics"]])
    for what, title in (("cpu_ops", "CPU ops"), ("gpu_ops", "GPU ops (kernels, memcpy, memset)")):
        d = result[what]
        out += ["", f"{title}: {d['names_a']} names in A, {d['names_b']} in B "
                    f"({d['added']} added, {d['removed']} removed); total "
                    f"{_ms(d['total_a_ns'])} ms -> {_ms(d['total_b_ns'])} ms"
                    + (f"; the {len(d['rows'])} largest changes of total time:"
                       if d["rows"] else "")]
        if d["rows"]:
            out += text_table(
                ["delta ms", "change", "A ms", "B ms", "count A", "count B", "mean A us",
                 "mean B us", "name"],
                [[f"{r['total_delta_ns'] / 1e6:+,.3f}",
                  "new" if r["status"] == "added" else _signed_pct(
                      None if r["total_rel"] is None else 100 * r["total_rel"]),
                  _ms(r["total_a_ns"]), _ms(r["total_b_ns"]), str(r["count_a"]),
                  str(r["count_b"]), _us(r["mean_a_ns"]), _us(r["mean_b_ns"]),
                  _cut(r["name"])] for r in d["rows"]])
    if checks:
        out.append("")
        out += [f"fail-if {c['expr']}: {'CROSSED' if c['crossed'] else 'ok'}: {c['message']}"
                for c in checks]
    return "\n".join(out) + "\n"


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def _cut(name: str, width: int = 80) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"
