"""Critical path through the CLI: `tracetool critical-path` and `tracetool report` as whole
processes (issue 11, "Fast summaries").

Two stores of Kineto-shaped traces from gen_trace.py (generated and ingested once, cached
under benchmarks/.work/): one rank of about 1M events (the store of
benchmarks/critical_path.py) and a 2-rank job of the same size per rank (the store layout of
benchmarks/analysis.py). Ingest is not timed. Each run starts, per store and in turn:

    tracetool sql STORE "SELECT count(*) FROM events" --format json   # baseline: start-up
    tracetool critical-path STORE --json
    tracetool report STORE --out DIR --json
    tracetool critical-path STORE --json --chrome-trace FILE          # the Perfetto export

as subprocesses (wall time), so every figure includes Python's start-up, the imports and
building the graph, as a user sees it. Prints the median of --runs (and the range), the
critical path's events/s, `critical-path` less the bare `sql` run (the fixed start-up cost
left out), and the report / critical-path and export / critical-path ratios. A second
baseline, in this process on the 1M-event rank: summarising the stored path the old way
(fetch every segment, one Python loop) against the one SQL query the CLI now runs.

    python benchmarks/critical_path_cli.py [--size 420MB] [--steps 40] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analysis as analysis_bench  # noqa: E402, I001  (sibling scripts: their cached stores)
import critical_path as cp_bench  # noqa: E402

from tracetool.analysis.critical_path import critical_path  # noqa: E402
from tracetool.cli.critical_path import summarize  # noqa: E402
from tracetool.analysis.connect import connect  # noqa: E402

COMMANDS = ("sql", "critical-path", "report", "chrome-trace")


def tracetool(args: list[str], cwd: Path) -> tuple[float, str]:
    """Run ``python -m tracetool ARGS`` in a fresh process: (wall seconds, stdout)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "tracetool", *args], cwd=cwd,
                       capture_output=True, text=True, env=os.environ.copy())
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"tracetool {' '.join(args)} failed: {r.stderr.strip()}")
    return dt, r.stdout


def run_store(store: Path, runs: int, work: Path) -> dict:
    """Every command on ``store``, --runs times in turn; medians and ranges."""
    args = {
        "sql": ["sql", str(store), "SELECT count(*) AS n FROM events", "--format", "json"],
        "critical-path": ["critical-path", str(store), "--json"],
        "report": ["report", str(store), "--out", str(work / "report"), "--json"],
        "chrome-trace": ["critical-path", str(store), "--json", "--chrome-trace",
                         str(work / "path.json")],
    }
    times: dict[str, list[float]] = {c: [] for c in COMMANDS}
    outs: dict[str, str] = {}
    for _ in range(runs):
        for c in COMMANDS:
            dt, outs[c] = tracetool(args[c], work)
            times[c].append(dt)
    events = json.loads(outs["sql"].splitlines()[0])["n"]
    cp = json.loads(outs["critical-path"])
    rep = json.loads(outs["report"])["critical_path"]
    med = {c: statistics.median(v) for c, v in times.items()}
    return {
        "store": str(store), "events": events, "steps": len(cp["steps"]),
        "segments": sum(s["segments"] for s in cp["steps"]),
        "report_path_segments": rep.get("segments"),
        "seconds": med, "range": {c: (min(v), max(v)) for c, v in times.items()},
        "events_per_s": events / med["critical-path"],
        "events_per_s_less_startup": events / (med["critical-path"] - med["sql"]),
        "report_vs_critical_path": med["report"] / med["critical-path"],
        "chrome_trace_events": json.loads(outs["chrome-trace"])["chrome_trace"]["events"],
        "chrome_trace_vs_critical_path": med["chrome-trace"] / med["critical-path"],
    }


def python_summary(job: str, segs: list[dict]) -> dict:
    """The CLI's summary before it moved into SQL (the baseline): one Python pass over
    every segment's row."""
    steps: dict = {}
    for s in segs:
        st = steps.setdefault(s["step"], {"step": s["step"], "start_ns": s["start_ns"],
                                          "end_ns": s["end_ns"], "segments": 0,
                                          "rank_changes": 0, "by_kind": {}, "by_rank": {},
                                          "_last": s["rank"]})
        st["start_ns"] = min(st["start_ns"], s["start_ns"])
        st["end_ns"] = max(st["end_ns"], s["end_ns"])
        st["segments"] += 1
        st["by_kind"][s["kind"]] = st["by_kind"].get(s["kind"], 0) + s["dur_ns"]
        key = str(s["rank"])
        st["by_rank"][key] = st["by_rank"].get(key, 0) + s["dur_ns"]
        if s["rank"] is not None and st["_last"] is not None and s["rank"] != st["_last"]:
            st["rank_changes"] += 1
        st["_last"] = s["rank"] if s["rank"] is not None else st["_last"]
    out = []
    for st in steps.values():
        st.pop("_last")
        st["dur_ns"] = st["end_ns"] - st["start_ns"]
        out.append(st)
    return {"job": job, "steps": out}


def summary_baseline(store: Path, runs: int) -> dict:
    """In one process, on the stored path: the old fetch + Python loop vs the SQL query
    (same result, checked)."""
    if "segs" in summarize.__code__.co_varnames[:2]:  # a tracetool from before issue 11
        return {}
    con = connect(store)
    rel = critical_path(con, "bench")
    py, sql = [], []
    for _ in range(runs):
        t = time.perf_counter()
        segs = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
        want = python_summary("bench", segs)
        py.append(time.perf_counter() - t)
        t = time.perf_counter()
        got = summarize("bench", rel)
        sql.append(time.perf_counter() - t)
    assert got == want, "SQL summary differs from the Python one"
    con.close()
    return {"segments": len(segs), "python_s": statistics.median(py),
            "sql_s": statistics.median(sql)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="420MB", help="trace size per rank (~1M events)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the job store")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    _, one = cp_bench.build_store(a.size, a.steps)
    job = analysis_bench.build_store(a.ranks, a.size, a.steps)
    with tempfile.TemporaryDirectory(prefix="cp-cli-") as d:
        res = {"runs": a.runs,
               "one_rank": run_store(one, a.runs, Path(d)),
               f"{a.ranks}_ranks": run_store(job, a.runs, Path(d)),
               "summary_baseline": summary_baseline(one, a.runs)}
    if a.json:
        print(json.dumps(res, indent=1))
        return
    for name in ("one_rank", f"{a.ranks}_ranks"):
        r = res[name]
        print(f"{name}: {r['events']:,} events, {r['steps']} steps, {r['segments']:,} path "
              f"segments  (median of {a.runs}; range)")
        for c in COMMANDS:
            lo, hi = r["range"][c]
            print(f"  {c:14} {r['seconds'][c]:6.2f} s  ({lo:.2f}-{hi:.2f})")
        print(f"  critical-path: {r['events_per_s']:,.0f} events/s "
              f"({r['events_per_s_less_startup']:,.0f} less the bare sql run)")
        print(f"  report / critical-path: {r['report_vs_critical_path']:.2f}x")
        print(f"  chrome-trace ({r['chrome_trace_events']:,} trace events) / critical-path: "
              f"{r['chrome_trace_vs_critical_path']:.2f}x")
    b = res["summary_baseline"]
    if b:
        print(f"summary of the stored path ({b['segments']:,} segments): fetch + Python loop "
              f"{b['python_s']:.3f} s, one SQL query {b['sql_s']:.3f} s "
              f"({b['python_s'] / b['sql_s']:.0f}x)")


if __name__ == "__main__":
    main()
