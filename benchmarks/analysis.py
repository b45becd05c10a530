"""Analysis benchmark: the step breakdown, collective matching and the critical path on a
synthetic 8-rank store of about 1M events per rank.

The ranks are Kineto-shaped traces from gen_trace.py (same program on every rank, so their
collectives match by call order), ingested once into benchmarks/.work/analysis/store. Each
query runs --runs times (median). The baseline, run in this process on the same store, is the
obvious alternative: fetch the GPU ops and steps into Python and take the interval unions there.

    python benchmarks/analysis.py [--ranks 8] [--size 420MB] [--steps 40] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_trace  # noqa: E402  (sibling script)

import tracetool  # noqa: E402
from tracetool.ingest import Options, ingest  # noqa: E402
from tracetool.store_views import STORE_FORMAT  # noqa: E402

WORK = HERE / ".work" / "analysis"


def build_store(ranks: int, size: str, steps: int) -> Path:
    """Generate the rank traces and ingest them as job 'bench' (both cached)."""
    WORK.mkdir(parents=True, exist_ok=True)
    tag = f"{size}-s{steps}-v{gen_trace.GEN_VERSION}"
    files = []
    for r in range(ranks):
        path = WORK / f"rank{r}-{tag}.json"
        meta = path.with_name(path.name + ".meta.json")
        if not (path.exists() and meta.exists()):
            print(f"generating {path.name} ...", file=sys.stderr, flush=True)
            st = gen_trace.generate(path, gen_trace.parse_size(size), steps, 0, r, ranks)
            meta.write_text(json.dumps(asdict(st)))
        files.append(path)
    store = WORK / f"store-{ranks}x{tag}-f{STORE_FORMAT}"
    done = store / "data" / "job=bench"
    if not done.is_dir() or len(list(done.glob("rank=*"))) != ranks:
        print(f"ingesting {ranks} ranks into {store} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        res = ingest(files, Options(store=store, job="bench", force=True))
        bad = [r for r in res if r.status != "ingested"]
        if bad:
            raise SystemExit(f"ingest failed: {bad[0].path}: {bad[0].message}")
        print(f"  {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    return store


def timed(fn, runs: int) -> tuple[float, object]:  # noqa: ANN001
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def python_breakdown(con) -> int:  # noqa: ANN001
    """Baseline: per (rank, step) union of GPU busy time, computed in Python."""
    steps = con.execute("SELECT rank, step, start_ns, end_ns FROM steps").fetchall()
    ops = con.execute("SELECT rank, ts_ns, end_ns FROM gpu_ops ORDER BY rank, ts_ns").fetchall()
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for r, s, e in ops:
        by_rank.setdefault(r, []).append((s, e))
    rows = 0
    for r, _step, s0, s1 in steps:
        cur_s = cur_e = None
        busy = 0
        for s, e in by_rank.get(r, []):
            if e <= s0 or s >= s1:
                continue
            s, e = max(s, s0), min(e, s1)
            if cur_e is None or s > cur_e:
                busy += 0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += 0 if cur_e is None else cur_e - cur_s
        rows += 1
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--size", default="420MB", help="uncompressed size per rank (~1M events)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    store = build_store(a.ranks, a.size, a.steps)
    con = tracetool.connect(store)
    n_events = con.execute("SELECT count(*) FROM events").fetchone()[0]
    results = {"ranks": a.ranks, "events": n_events, "runs": a.runs}

    sec, rows = timed(lambda: con.execute("SELECT * FROM step_breakdown").fetchall(), a.runs)
    base, _ = timed(lambda: python_breakdown(con), max(1, min(a.runs, 3)))
    results["breakdown"] = {"seconds": sec, "rows": len(rows), "python_baseline_s": base,
                            "speedup": base / sec}
    sec, rows = timed(lambda: con.execute("SELECT * FROM collective_instances").fetchall(),
                      a.runs)
    results["collective_instances"] = {"seconds": sec, "rows": len(rows)}
    try:
        from tracetool.analysis.critical_path import critical_path
    except ImportError:
        results["critical_path"] = None
    else:
        def all_steps() -> int:
            # a fresh connection each run, so building the edges is part of the time
            return len(critical_path(tracetool.connect(store), "bench").fetchall())

        sec, n_segs = timed(all_steps, max(1, min(a.runs, 3)))
        results["critical_path"] = {"seconds_all_steps": sec, "segments": n_segs,
                                    "events_per_s": n_events / sec,
                                    "vs_hta_17k_nodes_per_s": n_events / sec / 17_000}
    if a.json:
        print(json.dumps(results, indent=1))
        return
    b, c = results["breakdown"], results["collective_instances"]
    print(f"store: {a.ranks} ranks, {n_events:,} events ({n_events / a.ranks:,.0f} per rank)")
    print(f"step_breakdown        {b['seconds']:.3f} s  ({b['rows']} rows)   python baseline "
          f"{b['python_baseline_s']:.2f} s  -> {b['speedup']:.1f}x")
    print(f"collective_instances  {c['seconds']:.3f} s  ({c['rows']} rows)")
    cp = results["critical_path"]
    if cp:
        print(f"critical_path (every step, all ranks, edges included) "
              f"{cp['seconds_all_steps']:.2f} s  {cp['events_per_s']:,.0f} events/s  "
              f"({cp['vs_hta_17k_nodes_per_s']:.1f}x HTA's ~17k nodes/s)")
    else:
        print("critical_path: not available")


if __name__ == "__main__":
    main()
