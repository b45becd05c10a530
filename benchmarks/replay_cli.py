"""Replay through the CLI: `tracetool replay` as whole processes on a 1M-event rank (issue 14,
"replay >= 1M events/s").

Input: the one-rank store of benchmarks/critical_path.py (a 420 MB Kineto-shaped trace of
~1M events, 40 steps, generated and ingested once, cached under benchmarks/.work/; ingest is
not timed). Each run starts, in turn, as fresh processes (wall time):

    tracetool sql STORE "SELECT count(*) AS n FROM events" --format json   # start-up
    tracetool critical-path STORE --json                                  # the baseline
    tracetool replay STORE --json                                         # identity
    tracetool replay STORE --gpu h100 --network inter_node_bw=100Gbit/s --json
    tracetool replay STORE --steps 10:12 --json                           # a bounded one
    tracetool replay STORE --json --chrome-trace FILE                     # the timeline

and, with --previous, the same three replays (identity, projected, the timeline) with the
replay code of git HEAD (a copy of the package in which replay/ and
tracetool/cli/{replay,sweep}.py are HEAD's, first on PYTHONPATH), so a change is measured
against the code before it in the same run. Prints the median of --runs (and the range),
events/s (events = rows of `events` of the replayed ranks, as critical_path_cli.py counts
them), the ratios to `critical-path` and to the previous code, and each command's peak RSS
(/usr/bin/time -v) per event.

    python benchmarks/replay_cli.py [--size 420MB] [--steps 40] [--runs 5] [--previous] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import critical_path as cp_bench  # noqa: E402  (sibling script: its cached store)

# the package's directories (pyproject's package-dir), to assemble a previous tree
PACKAGE_DIRS = {"tracetool": "tracetool", "tracetool/ingest": "ingest",
                "tracetool/analysis": "analysis", "tracetool/replay": "replay"}
PREVIOUS_FILES = ("replay", "tracetool/cli/replay.py", "tracetool/cli/sweep.py")


# the events a replay of steps 10-12 reads: those overlapping the steps' span
_BOUNDED_EVENTS = """
SELECT count(*) AS n FROM events e,
       (SELECT min(start_ns) AS lo, max(end_ns) AS hi FROM steps WHERE step BETWEEN 10 AND 12) w
WHERE e.ts_ns <= w.hi AND e.ts_ns + coalesce(e.dur_ns, 0) >= w.lo"""


def commands(store: Path, work: Path) -> dict[str, list[str]]:
    s = str(store)
    return {
        "sql": ["sql", s, "SELECT count(*) AS n FROM events", "--format", "json"],
        "critical-path": ["critical-path", s, "--json"],
        "replay": ["replay", s, "--json"],
        "replay --gpu --network": ["replay", s, "--gpu", "h100", "--network",
                                   "inter_node_bw=100Gbit/s", "--json"],
        "replay --steps 10:12": ["replay", s, "--steps", "10:12", "--json"],
        "replay --chrome-trace": ["replay", s, "--json", "--chrome-trace",
                                  str(work / "projected.json")],
    }


def tracetool(args: list[str], cwd: Path, pythonpath: Path | None = None
              ) -> tuple[float, int, str]:
    """Run ``python -m tracetool ARGS`` under /usr/bin/time -v: (wall s, peak RSS KB,
    stdout)."""
    env = os.environ.copy()
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "tracetool", *args],
                       cwd=cwd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"tracetool {' '.join(args)} failed: {r.stderr.strip()[-500:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return dt, rss, r.stdout


def previous_tree(work: Path) -> Path:
    """A copy of the package with HEAD's replay code, the rest as in the working tree."""
    root = work / "previous"
    for pkg, src in PACKAGE_DIRS.items():
        shutil.copytree(REPO / src, root / pkg, ignore=shutil.ignore_patterns("__pycache__"),
                        dirs_exist_ok=True)
    stage = work / "head"
    stage.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", *PREVIOUS_FILES],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(stage)], input=archive, check=True)
    shutil.rmtree(root / "tracetool/replay")
    shutil.copytree(stage / "replay", root / "tracetool/replay")
    for f in PREVIOUS_FILES[1:]:
        shutil.copy(stage / f, root / f)
    return root


def run_store(store: Path, runs: int, work: Path, previous: bool) -> dict:
    """Every command, --runs times in turn: medians, ranges, peak RSS."""
    cmds = commands(store, work)
    prev = previous_tree(work) if previous else None
    plan = [(c, args, None) for c, args in cmds.items()]
    if prev is not None:
        plan += [(f"previous {c}", cmds[c], prev)
                 for c in ("replay", "replay --gpu --network", "replay --chrome-trace")]
    times: dict[str, list[float]] = {c: [] for c, _, _ in plan}
    rss: dict[str, list[int]] = {c: [] for c, _, _ in plan}
    outs: dict[str, str] = {}
    for _ in range(runs):
        for c, args, path in plan:
            dt, kb, outs[c] = tracetool(args, work, path)
            times[c].append(dt)
            rss[c].append(kb)
    events = json.loads(outs["sql"].splitlines()[0])["n"]
    rp = json.loads(outs["replay"])
    if prev is not None:  # the same answer as before
        old = json.loads(outs["previous replay"])
        new = {k: v for k, v in rp.items() if k != "bounds"}
        assert old == new, "the replay's output changed"
    bounded = json.loads(outs["replay --steps 10:12"])
    _, _, n = tracetool(["sql", str(store), _BOUNDED_EVENTS, "--format", "json"], work)
    bounded_events = json.loads(n.splitlines()[0])["n"]
    med = {c: statistics.median(v) for c, v in times.items()}
    out = {
        "store": str(store), "events": events, "steps": len(rp["steps"]),
        "bounded_steps": [s["step"] for s in bounded["steps"]],
        "bounded_events": bounded_events,
        "seconds": med, "range": {c: (min(v), max(v)) for c, v in times.items()},
        "peak_rss_mb": {c: max(v) / 1024 for c, v in rss.items()},
        "rss_bytes_per_event": {c: max(v) * 1024 / events for c, v in rss.items()},
        "events_per_s": {c: events / med[c] for c in med if c != "sql"},
        "events_per_s_less_startup": {c: events / (med[c] - med["sql"]) for c in med
                                      if c != "sql"},
        "replay_vs_critical_path": med["replay"] / med["critical-path"],
    }
    if prev is not None:
        out["speedup_vs_previous"] = {
            c: med[f"previous {c}"] / med[c]
            for c in ("replay", "replay --gpu --network", "replay --chrome-trace")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="420MB", help="trace size of the rank (~1M events)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--previous", action="store_true",
                    help="also time the replay code of git HEAD (the baseline before a change)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    _, store = cp_bench.build_store(a.size, a.steps)
    with tempfile.TemporaryDirectory(prefix="replay-cli-") as d:
        r = run_store(store, a.runs, Path(d), a.previous)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"one rank: {r['events']:,} events, {r['steps']} steps (median of {a.runs}; range; "
          "peak RSS)")
    for c, s in r["seconds"].items():
        lo, hi = r["range"][c]
        rate = (f"{r['events_per_s'][c]:>11,.0f} events/s" if c in r["events_per_s"]
                else " " * 20)
        print(f"  {c:34} {s:6.2f} s  ({lo:.2f}-{hi:.2f})  {rate}  "
              f"{r['peak_rss_mb'][c]:6.0f} MB = {r['rss_bytes_per_event'][c]:4.0f} B/event")
    print(f"  replay: {r['events_per_s']['replay']:,.0f} events/s "
          f"({r['events_per_s_less_startup']['replay']:,.0f} less the bare sql run); "
          f"replay / critical-path {r['replay_vs_critical_path']:.2f}x")
    print(f"  --steps 10:12 replayed steps {r['bounded_steps']} "
          f"(~{r['bounded_events']:,} events overlap them)")
    if "speedup_vs_previous" in r:
        print("  previous / now: " + ", ".join(f"{c} {x:.2f}x"
                                                for c, x in r["speedup_vs_previous"].items()))


if __name__ == "__main__":
    main()
