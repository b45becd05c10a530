"""Every trace of ../shared/traces and sample_traces/ through ingest, report, critical-path and
one what-if, checked against invariants that hold on any trace (issue 26): a table of every
trace with its figures, and the invariants each one breaks.

Why: the answers must be right on traces this project was not built on; an invariant that
fails on one real trace is a silently wrong answer somewhere. The checks (``check_jobs``,
``whatif_verdict``) are shared with the test suite (tests/test_real_traces.py), which runs
them over the corpus store it builds; this script builds its own store once (or reuses it)
and also runs the real CLI's report, critical-path and replay on every job.

    python benchmarks/corpus_audit.py [--store DIR] [--rebuild] [--only SUBSTR] [--json]

Invariants, per job:
- self_time: no CPU op has a negative self time (cpu_ops.self_ns >= 0).
- breakdown: compute + exposed comm + exposed memcpy + idle = the step, every rank and step.
- comm: where kernels are classed communication, the breakdown shows comm time.
- launch_overhead: no critical-path segment of launch_overhead over 10 ms (a longer one is a
  gap, not a launch), and none at all on a job without GPU ops.
- job_steps: each complete job step lies within its ranks' extent of that step: from the
  earliest CPU or GPU start of it on any rank to the latest end, or to the latest start of
  the next step (its CPU start or first GPU op), where the next tile may begin.
- what_if: the job's what-if (--gpu b200 for a GPU job, a network for a multi-rank job, a
  GPU speedup otherwise) changes the projection, or says why not (what it moves is off the
  critical path), or is refused with a reason.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACES = REPO.parent / "shared" / "traces"
SAMPLES = REPO / "sample_traces"
WORK = HERE / ".work" / "corpus_audit"
DLRM_DIR = "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
ET_NAME = re.compile(r"_et\.json(\.gz)?$")
LAUNCH_MOST_NS = 10_000_000  # a launch_overhead segment longer than this is not a launch


def job_for(rel_path: str) -> str:
    """The job a corpus file is ingested as (tests/test_real_traces.py names them so too)."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", rel_path)


@dataclass
class Audit:
    """One job's figures and the invariants it breaks."""

    job: str
    figures: dict[str, object] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)


# per job, in one pass over the store (a view filtered by job re-reads every job's files:
# 0.8 s a query for step_breakdown on the corpus): the figures and counts the invariants need
_JOB_FACTS_SQL = """
WITH r AS (  -- per rank and step: its first start and last end, CPU or GPU, and the latest
             -- of its starts (where the next tile may begin: docs/steps.md)
    SELECT job, step, least(cpu_start_ns, coalesce(gpu_start_ns, cpu_start_ns)) AS lo,
           greatest(cpu_end_ns, coalesce(gpu_end_ns, cpu_end_ns)) AS hi,
           greatest(cpu_start_ns, coalesce(gpu_first_ns, cpu_start_ns)) AS late_start
    FROM steps),
n AS (SELECT *, lead(late_start) OVER (PARTITION BY job ORDER BY step) AS next_start
      FROM (SELECT job, step, min(lo) AS lo, max(hi) AS hi, max(late_start) AS late_start
            FROM r GROUP BY job, step)),
outside AS (
    SELECT j.job, count(*) FILTER (WHERE j.complete AND (j.start_ns < n.lo OR
               j.end_ns > greatest(n.hi, coalesce(n.next_start, n.hi)))) AS n_outside,
           count(*) FILTER (WHERE j.complete) AS n_steps
    FROM job_steps j JOIN n USING (job, step) GROUP BY j.job),
bd AS (
    SELECT job, count(*) FILTER (WHERE compute_ns + exposed_comm_ns + exposed_memcpy_ns
                                       + idle_ns <> dur_ns) AS n_bad,
           sum(comm_ns) AS comm_ns, sum(dur_ns) AS step_ns
    FROM step_breakdown GROUP BY job),
neg AS (SELECT job, count(*) AS n_neg, min(self_ns) AS min_self FROM cpu_ops
        WHERE self_ns < 0 GROUP BY job),
g AS (SELECT job, count(*) AS n_gpu_ops FROM gpu_ops GROUP BY job),
k AS (SELECT job, count(*) AS n_comm FROM kernels WHERE category = 'comm' GROUP BY job)
SELECT f.job, count(*) AS ranks, any_value(coalesce(g.n_gpu_ops, 0)),
       any_value(coalesce(o.n_steps, 0)), any_value(coalesce(o.n_outside, 0)),
       any_value(coalesce(bd.n_bad, 0)), any_value(bd.comm_ns), any_value(bd.step_ns),
       any_value(coalesce(neg.n_neg, 0)), any_value(neg.min_self), any_value(coalesce(k.n_comm, 0))
FROM trace_files f LEFT JOIN g USING (job) LEFT JOIN outside o USING (job)
LEFT JOIN bd USING (job) LEFT JOIN neg USING (job) LEFT JOIN k USING (job)
GROUP BY f.job ORDER BY f.job
"""


def check_jobs(con: duckdb.DuckDBPyConnection) -> dict[str, Audit]:
    """Every job's SQL and critical-path invariants (see the module docstring)."""
    out = {}
    for (job, ranks, gpu_ops, steps, outside, bad, comm_ns, step_ns, neg, min_self,
         comm_kernels) in con.execute(_JOB_FACTS_SQL).fetchall():
        a = out[job] = Audit(job)
        a.figures.update(ranks=ranks, gpu_ops=gpu_ops, steps=steps, comm_kernels=comm_kernels,
                         comm_share=round(comm_ns / step_ns, 3) if step_ns else None)
        if neg:
            a.broken.append(f"self_time: {neg} CPU ops with negative self time (min "
                            f"{min_self / 1e6:.3f} ms)")
        if bad:
            a.broken.append(f"breakdown: {bad} rank steps whose parts do not add up to the "
                            "step")
        if comm_kernels and step_ns and not comm_ns:
            a.broken.append(f"comm: {comm_kernels} communication kernels but no comm time in "
                            "the breakdown")
        if outside:
            a.broken.append(f"job_steps: {outside} complete job steps outside their ranks' "
                            "extent")
        _check_path(con, a)
    return out


def _check_path(con: duckdb.DuckDBPyConnection, a: Audit) -> None:
    """The critical-path invariants of ``a.job``: no long launch_overhead, none without GPU
    ops; the path's top kinds as a figure."""
    from tracetool.analysis.critical_path import critical_path

    try:
        path = critical_path(con, a.job, names=False)
    except ValueError as err:  # no events on threads or streams (counters only)
        a.figures["critical_path"] = f"none: {err}"
        return
    by_kind = dict(path.query("_p", "SELECT kind, sum(dur_ns) FROM _p GROUP BY kind").fetchall())
    total = sum(by_kind.values()) or 1
    a.figures["critical_path"] = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in
                                           sorted(by_kind.items(), key=lambda kv: -kv[1])[:3])
    longest = by_kind and path.query("_p", "SELECT max(dur_ns) FROM _p WHERE kind = "
                                     "'launch_overhead'").fetchall()[0][0]
    if longest and longest > LAUNCH_MOST_NS:
        a.broken.append(f"launch_overhead: a segment of {longest / 1e6:.1f} ms")
    if longest and not a.figures["gpu_ops"]:
        a.broken.append("launch_overhead: on a job without GPU ops")


def whatif_args(con: duckdb.DuckDBPyConnection, job: str) -> list[str]:
    """The one what-if a job gets: onto a B200 (GPU jobs), a 10x slower network (jobs of
    several ranks), else a 2x CPU-side speedup of every GPU op (refused on a CPU job)."""
    ranks, gpu_ops = con.execute(
        "SELECT (SELECT count(*) FROM trace_files WHERE job = $1), "
        "(SELECT count(*) FROM gpu_ops WHERE job = $1)", [job]).fetchone()
    if gpu_ops:  # onto a B200, or an H100 for a B200 trace (its own GPU is refused)
        b200 = con.execute("SELECT bool_or(list_contains(device_names, 'NVIDIA B200')) "
                           "FROM trace_files WHERE job = $1", [job]).fetchone()[0]
        return ["--gpu", "h100" if b200 else "b200"]
    if ranks > 1:
        return ["--source-network", "gpus_per_node=1,inter_node_bw=10Gbit/s",
                "--network", "inter_node_bw=1Gbit/s"]
    return ["--speedup", "gemm=2"]


def whatif_verdict(exit_code: int, output: str) -> tuple[str, str | None]:
    """(figure, broken invariant or None) of a what-if's ``replay --json`` run: a change of
    the projection, or a refusal (exit 2, one line) that says why."""
    if exit_code == 2:
        line = output.strip().splitlines()[-1] if output.strip() else ""
        ok = line.startswith("tracetool: error: ") and output.strip().count("\n") == 0
        return f"refused: {line[18:90]}", None if ok else f"what_if: refusal not one line: {line}"
    if exit_code == 1 and "has no events on CPU threads or GPU streams" in output:
        return "nothing to replay (no events on threads or streams)", None
    if exit_code != 0:
        return f"failed ({exit_code})", f"what_if: exit {exit_code}: {output.strip()[-200:]}"
    result = json.loads(output.strip().splitlines()[-1])
    steps = result["steps"]
    measured = sum(s["measured_step_ns"] for s in steps)
    projected = sum(s["projected_step_ns"] for s in steps)
    if projected == measured:
        if any(n.startswith("no step time changed") for n in result["notes"]):
            return "+0.0% (off the critical path, noted)", None
        return "+0.0%", "what_if: the projection did not change and nothing says why"
    return f"{100 * (projected - measured) / measured:+.1f}%", None


def inputs() -> list[tuple[str, list[Path], list[str]]]:
    """(job, paths, extra ingest options) of every trace: one job per corpus file, the DLRM
    ranks as one job, each sample directory one job."""
    out = []
    if TRACES.is_dir():
        for p in sorted(TRACES.rglob("*")):
            rel = p.relative_to(TRACES).as_posix()
            if not p.is_file() or not p.name.endswith((".json", ".json.gz")):
                continue
            if ET_NAME.search(p.name) or rel.startswith(DLRM_DIR + "/"):
                continue
            out.append((job_for(rel), [p], []))
        out.append(("dlrm", [TRACES / DLRM_DIR], []))
    for d in sorted({p.parent for p in SAMPLES.rglob("*.json.gz")}):
        out.append((job_for(d.relative_to(REPO).as_posix()), [d], []))
    return out


def build(store: Path) -> list[str]:
    """Ingest every input (once per store); the jobs."""
    from click.testing import CliRunner

    from tracetool.cli import cli

    jobs = []
    for job, paths, extra in inputs():
        res = CliRunner().invoke(cli, ["ingest", *map(str, paths), "--store", str(store),
                                       "--job", job, *extra])
        if res.exit_code == 0:  # ingested, or already stored (skipped)
            jobs.append(job)
        else:
            print(f"{job}: not ingested: {res.output.strip()[-200:]}", file=sys.stderr)
    return jobs


def run_cli(store: Path, a: Audit, out: Path) -> dict:
    """The real CLI's report, critical-path and what-if on ``a.job``: their times, and what
    they break added to ``a``."""
    from click.testing import CliRunner

    from tracetool.analysis.connect import connect
    from tracetool.cli import cli

    job = a.job
    con = connect(store)
    args = whatif_args(con, job)
    con.close()
    times = {}
    for name, cmd in (("report", ["report", str(store), "--job", job, "--json", "--out",
                                  str(out / job)]),
                      ("critical-path", ["critical-path", str(store), "--job", job, "--json"]),
                      ("replay", ["replay", str(store), "--job", job, "--json", *args])):
        t = time.perf_counter()
        res = CliRunner().invoke(cli, cmd)  # click 8.2+: stdout and stderr apart
        times[name] = round(time.perf_counter() - t, 2)
        if name == "replay":
            figure, broken = whatif_verdict(res.exit_code, res.stdout if res.exit_code == 0
                                            else res.stderr)
            a.figures["what_if"] = f"{' '.join(args[-2:])}: {figure}"
            if broken:
                a.broken.append(broken)
        elif res.exit_code != 0 and not (name == "critical-path" and "no events" in res.stderr):
            a.broken.append(f"{name}: exit {res.exit_code}: {res.stderr.strip()[-160:]}")
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=WORK / "store")
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--only", help="only the jobs whose name contains this")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    if ns.rebuild and ns.store.exists():
        shutil.rmtree(ns.store)
    t0 = time.perf_counter()
    jobs = build(ns.store)
    built = time.perf_counter() - t0
    from tracetool.analysis.connect import connect

    con = connect(ns.store)
    checked = check_jobs(con)
    con.close()
    audits = []
    for job in jobs:
        if ns.only and ns.only not in job:
            continue
        a = checked[job]
        audits.append((a, run_cli(ns.store, a, WORK / "reports")))
    if ns.json:
        print(json.dumps([{"job": a.job, **a.figures, "broken": a.broken, "seconds": t}
                          for a, t in audits]))
    else:
        print(f"{len(audits)} jobs ({built:.0f} s to ingest or reuse the store)")
        print("| job | ranks | GPU ops | steps | comm share | critical path (top 3) | "
              "what-if | broken |")
        print("|---|---|---|---|---|---|---|---|")
        for a, _ in audits:
            f = a.figures
            share = "" if f["comm_share"] is None else f"{100 * f['comm_share']:.1f}%"
            print(f"| {a.job[-60:]} | {f['ranks']} | {f['gpu_ops']} | {f['steps']} | "
                  f"{share} | {f.get('critical_path', '')} | {f.get('what_if', '')} | "
                  f"{'; '.join(a.broken) or 'none'} |")
    bad = sum(1 for a, _ in audits if a.broken)
    print(f"{bad} of {len(audits)} jobs break an invariant", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
