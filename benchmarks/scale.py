"""1,024 ranks on one small machine (issue 14, item 4): ingest and cross-rank analysis of an
N-rank job through the CLI, with how each cost grows with the number of ranks.

The job: N Kineto-shaped rank traces from gen_trace.py (``job_ranks``: a lockstep
data-parallel job, ~2 MB and 3 ProfilerSteps per rank, an NCCL all-reduce per DDP bucket
with its Seq on every rank, each collective ending together on all ranks; per-rank ids,
pids, devices and node clocks (+-1.5 ms); max(1, N // 256) stragglers, slow before one
all-reduce of every step). Files are generated in parallel processes and cached under
benchmarks/.work/scale/. Then, for each N, every command runs as a whole process
(``.venv/bin/tracetool ...``, as users run it), timed, with the peak RSS of its process tree
(summed RSS sampled every 0.2 s, and the largest single process from wait4):

    tracetool ingest DIR --store S --job scale --json                   (into a fresh store)
    tracetool sql S "SELECT count(*) FROM trace_files"                  (start-up: the floor)
    tracetool sql S "SELECT count(*) FROM (SELECT * FROM VIEW)"         for collective_instances,
                                    stragglers, rank_clock_offsets, step_breakdown (all ranks)
    tracetool report S --out DIR --json
    tracetool critical-path S --step 3 --json
    tracetool replay S --step 3 --json
    tracetool sweep S --network inter_node_bw=<10 settings> --out DIR --json

Baseline, in the same run: ingest of one file of --baseline-size (same generator, one rank)
for the MB/s that per-file overhead is measured against; and the smallest N's costs, against
which the growth to the larger Ns is printed (x: time at N / time at the smallest N, for
N / smallest N times the ranks).

Run it alone on the machine (other benchmarks take the same lock):

    flock /tmp/tracetool-bench.lock .venv/bin/python benchmarks/scale.py [--ranks 8,64,1024]
        [--size 2MB] [--steps 3] [--baseline-size 500MB] [--only ingest,report,...]
        [--reuse-store] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import gen_trace  # noqa: E402  (sibling scripts, not a package)
import hta_baseline  # noqa: E402

WORK = HERE / ".work" / "scale"
JOB_GEN = 2  # bump when job_ranks() or this file's layout of a job changes
TARGETS = {  # issue 14 on this 2-core machine (seconds; ingest in MB/s)
    "ingest": 40.0, "collective_instances": 3.0, "stragglers": 3.0,
    "rank_clock_offsets": 3.0, "step_breakdown": 3.0, "report": 20.0,
    "critical-path": 10.0, "replay": 10.0, "sweep": 30.0,
}
RSS_TARGET_MB = 4096
QUERIES = ("collective_instances", "stragglers", "rank_clock_offsets", "step_breakdown")
COMMANDS = ("ingest", "startup", *QUERIES, "report", "critical-path", "replay", "sweep")
SWEEP_BW = "inter_node_bw=" + ",".join(f"{g}Gbit/s" for g in
                                       (10, 25, 50, 100, 200, 400, 800, 1600, 3200, 6400))


@dataclass
class Run:
    """One command at one N."""

    command: str
    seconds: float
    tree_rss_mb: float
    max_process_rss_mb: float
    ok: bool
    note: str = ""


@dataclass
class Scale:
    """Every command at one N."""

    ranks: int
    files: int
    mb: float
    events: int = 0
    runs: dict[str, Run] = field(default_factory=dict)


# --------------------------------------------------------------------------- generation


def _gen_one(args: tuple) -> tuple[int, int]:
    path, size, steps, rank, world, job = args
    st = gen_trace.generate(path, size, steps, 0, rank, world, job=job)
    return st.bytes, st.events


def job_dir(ranks: int, size: str, steps: int) -> Path:
    """The cached traces of an N-rank job (generated once, in parallel processes)."""
    d = WORK / f"job-{ranks}r-{size.upper()}-s{steps}-v{gen_trace.GEN_VERSION}-j{JOB_GEN}"
    done = d.with_name(d.name + ".done.json")  # beside the traces: ingest reads every file
    if done.exists():
        return d
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t = time.perf_counter()
    nbytes = gen_trace.parse_size(size)
    specs = gen_trace.job_ranks(ranks, nbytes, steps)
    work = [(d / f"rank{r}.pt.trace.json", nbytes, steps, r, ranks, specs[r])
            for r in range(ranks)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        out = list(ex.map(_gen_one, work, chunksize=16))
    meta = {"ranks": ranks, "bytes": sum(b for b, _ in out), "events": sum(e for _, e in out),
            "seconds": time.perf_counter() - t,
            "stragglers": {r: s.straggle for r, s in enumerate(specs) if s.straggle}}
    done.write_text(json.dumps(meta))
    print(f"generated {ranks} ranks ({meta['bytes'] / 1e6:.0f} MB, {meta['events']:,} events) "
          f"in {meta['seconds']:.1f} s", file=sys.stderr, flush=True)
    return d


def baseline_file(size: str, steps: int = 129) -> Path:
    """One rank file of `size` (the ingest MB/s that the many-file ingest is measured
    against)."""
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"one-{size.upper()}-s{steps}-v{gen_trace.GEN_VERSION}.json"
    if not path.exists():
        gen_trace.generate(path, gen_trace.parse_size(size), steps, 0, 0, 8)
    return path


# --------------------------------------------------------------------------- running


def tracetool_cmd() -> list[str]:
    exe = REPO / ".venv" / "bin" / "tracetool"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tracetool"]


def run(name: str, argv: list[str], timeout: float) -> tuple[Run, str]:
    r = hta_baseline.run_measured([*tracetool_cmd(), *argv], timeout=timeout,
                                  sample_interval=0.2)
    ok = r.returncode == 0
    note = "" if ok else (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1][:200]
    return Run(name, r.seconds, r.tree_peak_rss_mb, r.maxrss_mb, ok, note), r.stdout


def run_scale(ranks: int, a: argparse.Namespace) -> Scale:
    d = job_dir(ranks, a.size, a.steps)
    meta = json.loads(d.with_name(d.name + ".done.json").read_text())
    res = Scale(ranks, ranks, meta["bytes"] / 1e6, meta["events"])
    store = WORK / f"store-{d.name}"
    out = WORK / f"out-{ranks}r"
    only = set(a.only.split(",")) if a.only else set(COMMANDS)
    step = str(2 + a.steps // 2)  # the middle ProfilerStep (first_step is 2)
    t_out = a.timeout

    def do(name: str, argv: list[str]) -> str:
        if name not in only:
            return ""
        r, stdout = run(name, argv, t_out)
        res.runs[name] = r
        flag = "" if r.ok else f"  FAILED: {r.note}"
        print(f"  {ranks:5} ranks {name:22} {r.seconds:7.2f} s  {r.tree_rss_mb:6.0f} MB{flag}",
              file=sys.stderr, flush=True)
        return stdout

    if not (a.reuse_store and (store / "data").is_dir()):
        shutil.rmtree(store, ignore_errors=True)
        do("ingest", ["ingest", str(d), "--store", str(store), "--job", "scale", "--json"])
    sql = ["sql", str(store)]
    do("startup", [*sql, "SELECT count(*) FROM trace_files"])
    for q in QUERIES:
        do(q, [*sql, f"SELECT count(*) FROM (SELECT * FROM {q})"])
    shutil.rmtree(out, ignore_errors=True)
    do("report", ["report", str(store), "--out", str(out / "report"), "--json"])
    do("critical-path", ["critical-path", str(store), "--step", step, "--json"])
    do("replay", ["replay", str(store), "--step", step, "--json"])
    do("sweep", ["sweep", str(store), "--network", SWEEP_BW, "--out", str(out / "sweep"),
                 "--json"])
    return res


def run_baseline(a: argparse.Namespace) -> Run | None:
    if not a.baseline_size or (a.only and "ingest" not in a.only.split(",")):
        return None
    path = baseline_file(a.baseline_size)
    store = WORK / "store-baseline"
    shutil.rmtree(store, ignore_errors=True)
    r, _ = run("ingest one file", ["ingest", str(path), "--store", str(store), "--job", "one",
                                   "--json"], a.timeout)
    r.note = r.note or f"{path.stat().st_size / 1e6:.0f} MB"
    shutil.rmtree(store, ignore_errors=True)
    return r


# --------------------------------------------------------------------------- output


def table(scales: list[Scale], base: Run | None, base_mb: float) -> str:
    """Seconds (and MB/s for ingest) and peak RSS per command and N, the growth against the
    smallest N, and the issue's target."""
    lines = []
    head = f"{'command':22}" + "".join(f"{f'{s.ranks} ranks s':>14}{'RSS MB':>8}"
                                       for s in scales)
    if len(scales) > 1:
        head += f"{f'x {scales[-1].ranks}/{scales[0].ranks}':>10}"
    head += f"{'target':>9}  met"
    lines += [head, "-" * len(head)]
    for c in COMMANDS:
        if not any(c in s.runs for s in scales):
            continue
        row = f"{c:22}"
        for s in scales:
            r = s.runs.get(c)
            row += (f"{r.seconds:14.2f}{r.tree_rss_mb:8.0f}" if r and r.ok
                    else f"{'failed' if r else '-':>14}{'':8}")
        a, b = scales[0].runs.get(c), scales[-1].runs.get(c)
        if len(scales) > 1:
            row += f"{b.seconds / a.seconds:10.1f}" if a and b and a.ok and b.ok else f"{'':10}"
        tgt = TARGETS.get(c)
        last = scales[-1].runs.get(c)
        if tgt is None or last is None or not last.ok:
            row += f"{'':9}"
        elif c == "ingest":
            mbs = scales[-1].mb / last.seconds
            row += f"{f'>={tgt:.0f}MB/s':>9}  {'yes' if mbs >= tgt else 'no'}"
        else:
            row += f"{f'<={tgt:.0f}s':>9}  {'yes' if last.seconds <= tgt else 'no'}"
        lines.append(row)
    lines.append("")
    for s in scales:
        ing = s.runs.get("ingest")
        rss = max((r.tree_rss_mb for r in s.runs.values() if r.ok), default=0)
        txt = (f"{s.ranks} ranks: {s.files} files, {s.mb:.0f} MB, {s.events:,} events")
        if ing and ing.ok:
            txt += (f"; ingest {s.mb / ing.seconds:.1f} MB/s, "
                    f"{ing.seconds / s.files * 1000:.1f} ms per file")
        txt += f"; peak RSS {rss:.0f} MB (target <= {RSS_TARGET_MB} MB)"
        lines.append(txt)
    if base and base.ok:
        mbs = base_mb / base.seconds
        lines.append(f"baseline: ingest of one {base_mb:.0f} MB file {base.seconds:.2f} s = "
                     f"{mbs:.1f} MB/s, {base.tree_rss_mb:.0f} MB RSS")
        last = scales[-1].runs.get("ingest") if scales else None
        if last and last.ok:
            lines.append(f"  {scales[-1].ranks} files against one file: "
                         f"{scales[-1].mb / last.seconds / mbs:.2f}x the MB/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1024", help="comma-separated job sizes, e.g. 8,64,1024")
    ap.add_argument("--size", default="2MB", help="uncompressed size per rank")
    ap.add_argument("--steps", type=int, default=3, help="ProfilerSteps per rank")
    ap.add_argument("--baseline-size", default="500MB",
                    help="size of the one-file ingest baseline ('' to skip)")
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(COMMANDS)}")
    ap.add_argument("--reuse-store", action="store_true",
                    help="keep an existing store (ingest is then not run)")
    ap.add_argument("--timeout", type=float, default=900.0, help="per command, seconds")
    ap.add_argument("--json", type=Path, help="also write the results to this JSON file")
    a = ap.parse_args(argv)
    ns = sorted(int(x) for x in a.ranks.split(","))
    scales = [run_scale(n, a) for n in ns]
    base = run_baseline(a)
    base_mb = (baseline_file(a.baseline_size).stat().st_size / 1e6) if base else 0.0
    print(table(scales, base, base_mb))
    if a.json:
        a.json.write_text(json.dumps({"scales": [asdict(s) for s in scales],
                                      "baseline": asdict(base) if base else None,
                                      "baseline_mb": base_mb}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
