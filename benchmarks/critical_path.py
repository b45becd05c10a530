"""Critical-path benchmark: the path of every step of a synthetic ~1M-event rank.

A Kineto-shaped trace from gen_trace.py (``--size 420MB``: about 1M events, 40 steps) is
generated and ingested once into ``benchmarks/.work/critical_path/`` (both cached; the
ingest stores the rank's dependency graph, cp_nodes and rank_edges). Then, in a fresh
DuckDB connection per run: ``critical_path`` of every step (the stored graph read, binding
edges chosen over numpy arrays, then the walk).
Prints the median of --runs runs as events/s of the rank, and as graph nodes/s against HTA's
published ~17k nodes/s for its critical path (HTA's nodes are, as ours, the start and end of
each CPU op, runtime call and GPU op).

    python benchmarks/critical_path.py [--size 420MB] [--steps 40] [--runs 5] [--json]
    python benchmarks/critical_path.py --hta-reference  # constants of test_critical_path.py
    python benchmarks/critical_path.py --hta-speed 5    # also time HTA on the first 5 steps
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

from tracetool.analysis.connect import connect  # noqa: E402
from tracetool.analysis.critical_path import critical_path  # noqa: E402
from tracetool.ingest import Options, ingest  # noqa: E402
from tracetool.store_views import STORE_FORMAT  # noqa: E402

WORK = HERE / ".work" / "critical_path"
HTA_NODES_PER_S = 17_000  # HTA's critical path on one rank, as published in issue 3
HTA_CP = "facebookresearch__HolisticTraceAnalysis/tests/data/critical_path"
# (case, trace dir under HTA_CP, annotation, instance) as HTA's tests/test_critical_path_analysis.py
HTA_CASES = [
    ("simple_add", "end_to_end/simple_add/input",
     "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("alexnet", "alexnet", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("cuda_event_sync", "cuda_event_sync", "ProfilerStep", 0),
    ("cuda_event_sync_multi_stream", "cuda_event_sync_multi_stream", "", None),
]
# Runs inside the HTA venv: HTA's critical path of one case, summarised (times in us).
_HTA_CHILD = r"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
case, trace_dir, annotation, instance = json.loads(sys.argv[1])
a = TraceAnalysis(trace_dir=trace_dir)
g, ok = a.critical_path_analysis(rank=0, annotation=annotation, instance_id=instance)
nodes = [g.node_list[n] for n in g.critical_path_nodes]
zero = sum(g.node_list[v].ts - g.node_list[u].ts
           for u, v in zip(g.critical_path_nodes, g.critical_path_nodes[1:])
           if g.edges[u, v]["object"].weight == 0)
edf = g.get_critical_path_breakdown()
point = lambda n: [int(n.ev_idx), "start" if n.is_start else "end"]
print("HTA_CP " + json.dumps({
    "case": case, "ok": bool(ok), "first": point(nodes[0]), "last": point(nodes[-1]),
    "extent_us": int(nodes[-1].ts - nodes[0].ts), "total_us": int(edf.duration.sum()),
    "zero_weight_us": int(zero),
    "bound_by_us": {k: int(v) for k, v in edf.groupby("bound_by").duration.sum().items() if k},
    "gpu_events": sorted(int(x) for x in
                         edf[edf.bound_by == "gpu_compute_bound"].event_idx.unique()),
}))
"""


def build_store(size: str, steps: int) -> tuple[Path, Path]:
    """Generate one rank's trace and ingest it as job 'bench' (both cached): (trace, store)."""
    WORK.mkdir(parents=True, exist_ok=True)
    tag = f"{size}-s{steps}-v{gen_trace.GEN_VERSION}"
    path = WORK / f"rank0-{tag}.json"
    meta = path.with_name(path.name + ".meta.json")
    if not (path.exists() and meta.exists()):
        print(f"generating {path.name} ...", file=sys.stderr, flush=True)
        st = gen_trace.generate(path, gen_trace.parse_size(size), steps, 0, 0, 8)
        meta.write_text(json.dumps(asdict(st)))
    store = WORK / f"store-{tag}-f{STORE_FORMAT}"
    if not (store / "data" / "job=bench" / "rank=0").is_dir():
        print(f"ingesting into {store} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        res = ingest([path], Options(store=store, job="bench", force=True))
        print(f"  {time.perf_counter() - t:.1f} s ({res[0].timings})", file=sys.stderr,
              flush=True)
        if res[0].status != "ingested":
            raise SystemExit(f"ingest failed: {res[0].message}")
    return path, store


def run_once(store: Path) -> dict:
    """One cold run: a new connection, then the path of every step."""
    t0 = time.perf_counter()
    con = connect(store)  # the analysis views: the graph reads steps and collective_ranks
    t1 = time.perf_counter()
    path = critical_path(con, "bench")
    n_segments = len(path)
    t2 = time.perf_counter()
    out = {"connect_s": t1 - t0, "path_s": t2 - t1, "total_s": t2 - t0, "segments": n_segments}
    out["events"], out["node_events"], out["edges"], out["steps"] = con.execute(
        """SELECT (SELECT count(*) FROM events WHERE job = 'bench'),
                  (SELECT count(*) FROM cp_nodes WHERE job = 'bench'),
                  (SELECT count(*) FROM edges WHERE job = 'bench'),
                  (SELECT count(DISTINCT step) FROM critical_path WHERE job = 'bench')"""
    ).fetchone()
    con.close()
    return out

# Runs inside the HTA venv: time HTA's critical path over the first N ProfilerSteps.
_HTA_SPEED_CHILD = r"""
import json, logging, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
n = int(sys.argv[2])
t = time.perf_counter()
g, ok = a.critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=(0, n - 1))
s = time.perf_counter() - t
print("HTA_SPEED " + json.dumps({"ok": bool(ok), "steps": n, "nodes": len(g.node_list),
                                 "seconds": s, "nodes_per_s": len(g.node_list) / s}))
"""


def hta_speed(trace: Path, steps: int) -> dict:
    """HTA's own critical path (graph + longest path, load excluded) on the same trace."""
    import subprocess
    import tempfile

    from hta_baseline import ensure_hta_venv

    py = ensure_hta_venv()
    with tempfile.TemporaryDirectory(prefix="hta-cp-") as d:
        (Path(d) / "rank-0.json").symlink_to(trace)
        r = subprocess.run([str(py), "-c", _HTA_SPEED_CHILD, d, str(steps)],
                           capture_output=True, text=True, check=True)
    line = next(s for s in r.stdout.splitlines() if s.startswith("HTA_SPEED "))
    return json.loads(line.split(" ", 1)[1])


def hta_reference() -> list[dict]:
    """HTA 0.5.0's critical path of its own test fixtures (in the isolated HTA venv), the
    constants tests/test_critical_path.py compares with."""
    import subprocess

    from hta_baseline import ensure_hta_venv

    traces = HERE.parent.parent / "shared" / "traces" / HTA_CP
    py = ensure_hta_venv()
    out = []
    for case, rel, annotation, instance in HTA_CASES:
        arg = json.dumps([case, str(traces / rel), annotation, instance])
        r = subprocess.run([str(py), "-c", _HTA_CHILD, arg], capture_output=True, text=True,
                           check=True)
        line = next(s for s in r.stdout.splitlines() if s.startswith("HTA_CP "))
        out.append(json.loads(line.split(" ", 1)[1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="420MB", help="uncompressed trace size (~1M events)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hta-reference", action="store_true",
                    help="print HTA's critical path of its test fixtures instead")
    ap.add_argument("--hta-speed", type=int, metavar="STEPS", default=0,
                    help="also time HTA's critical path over the first STEPS steps")
    a = ap.parse_args()
    if a.hta_reference:
        for case in hta_reference():
            print(json.dumps(case))
        return
    trace, store = build_store(a.size, a.steps)
    runs = [run_once(store) for _ in range(a.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("connect_s", "path_s", "total_s")}
    r = runs[0]
    res = {**r, **med, "runs": a.runs,
           "events_per_s": r["events"] / med["total_s"],
           "nodes_per_s": 2 * r["node_events"] / med["total_s"]}
    res["vs_hta"] = res["nodes_per_s"] / HTA_NODES_PER_S
    if a.hta_speed:
        res["hta_measured"] = hta_speed(trace, a.hta_speed)
        res["vs_hta_measured"] = res["nodes_per_s"] / res["hta_measured"]["nodes_per_s"]
    if a.json:
        print(json.dumps(res, indent=1))
        return
    print(f"rank: {r['events']:,} events ({r['node_events']:,} graph events, "
          f"{2 * r['node_events']:,} nodes, {r['edges']:,} edges), {r['steps']} steps")
    print(f"connect {med['connect_s']:.2f} s + critical_path (all steps) "
          f"{med['path_s']:.2f} s = {med['total_s']:.2f} s  (median of {a.runs})")
    print(f"{res['events_per_s']:,.0f} events/s; {res['nodes_per_s']:,.0f} nodes/s = "
          f"{res['vs_hta']:.0f}x HTA's ~{HTA_NODES_PER_S:,} nodes/s")
    if a.hta_speed:
        h = res["hta_measured"]
        print(f"HTA 0.5.0 on the first {h['steps']} steps of the same trace: {h['nodes']:,} "
              f"nodes in {h['seconds']:.2f} s = {h['nodes_per_s']:,.0f} nodes/s "
              f"(ours {res['vs_hta_measured']:.0f}x)")


if __name__ == "__main__":
    main()
