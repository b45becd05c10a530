"""Replay benchmark: the compiled scheduler on synthetic training-step graphs of 1M-10M nodes.

The graphs are made directly as numpy arrays, shaped as ``tracetool.replay.graph`` shapes a
job (no trace, no DuckDB). Node n is point n & 1 (0 start, 1 end) of slot n >> 1. Per rank,
one CPU thread issues K ops; op i is a CPU op (slot A), a launch call nested in it (slot L)
and the kernel it launches (slot G). Slots are rank-major: A of every op, then L, then G;
one barrier slot per collective after all ranks. Edges, with their weights in ns:

- CPU program order: A end(i-1) -> A start(i) (CPU work between ops), A start -> L start,
  L start -> L end (the launch call), L end -> A end;
- launch: L start -> G start (launch latency);
- stream order: G end -> next G start on the same stream (compute stream; comm stream for
  every 50th kernel, a collective);
- duration: G start -> G end (kernel time; a comm kernel's own edge is its transfer time);
- per collective, one barrier node: arrival edges, every rank's comm start -> barrier
  (weight 0), and transfer edges, barrier -> every rank's comm end (the transfer time);
- stream waits (CUDA events): the kernel before a collective's end -> its start (the data
  it sends), and its end -> the start of the compute kernel 10 ops later (the data it
  brings), so a collective is partly hidden behind compute and partly exposed;
- sync: every 100th op, its kernel's end -> its launch call's end (the CPU waits).

The measured times ``t0`` are the schedule of those weights from each rank's first op (so
identity replay reproduces them exactly, as on a real graph). Per config, with the median of
--runs runs: ``topological_order`` and ``edges_in_order`` (the build step a sweep pays once)
and ``schedule`` (one simulation). The numba JIT is warmed up on a tiny graph first; the
first call and a compile from scratch (no disk cache) are printed apart. The baseline, in
the same run, is a plain Python loop over the same order (on the 8-rank 1M-node graph, or the
smallest one), checked to give the same times; the sweep runs 100 network settings (transfer
times x 0.5..2) on that one built graph.

    python benchmarks/replay.py [--sizes 1M,10M] [--ranks 8,1024] [--runs 5] [--json]
    python benchmarks/replay.py --quick   # 100k nodes, 8 ranks: a few seconds
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from dataclasses import dataclass

import numba
import numpy as np

from tracetool.replay import simulate
from tracetool.replay.simulate import edges_in_order, schedule, topological_order

COLL_EVERY = 50  # every 50th kernel of a rank is a collective (on the comm stream)
SYNC_EVERY = 100  # every 100th op the CPU waits for its kernel
WAIT_AHEAD = 10  # the compute kernel 10 ops after a collective waits for it
SWEEP = 100  # settings in the sweep
BASELINE_LIMIT_S = 60.0  # above this (projected), the Python baseline runs on a prefix
PREFIX_NODES = 100_000


@dataclass
class Graph:
    ranks: int
    ops_per_rank: int
    n_coll: int
    indptr: np.ndarray  # int64, n_nodes + 1: CSR by destination (topological_order's input)
    src_by_dst: np.ndarray  # int64 per edge, in that CSR's order
    order: np.ndarray  # int64: the topological order
    ptr: np.ndarray  # int64, n_nodes + 1: the edges in order (edges_in_order), as a replay
    src: np.ndarray  # int64 per edge, in order
    w: np.ndarray  # float64 per edge, in order: the identity weights
    t0: np.ndarray  # float64 per node: "measured" times (the schedule of w)
    comm_own: np.ndarray  # edge indices (in order): comm kernels' duration edges
    transfer: np.ndarray  # edge indices (in order): barrier -> comm end
    xfer_ns: np.ndarray  # float64 per edge in comm_own and transfer: the transfer time

    @property
    def n_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def n_edges(self) -> int:
        return len(self.src)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.order, self.ptr, self.src, self.w, self.t0))


def parse_count(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(s[-1:], 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def label(n: int) -> str:
    for div, suf in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{suf}"
    return str(n)


def make_graph(n_nodes: int, ranks: int, seed: int = 0) -> Graph:
    """A synthetic replay graph of about ``n_nodes`` nodes over ``ranks`` ranks (module
    docstring), vectorized: no Python loop over ops, ranks or edges."""
    k = max(2, round(n_nodes / (6 * ranks + 2 / COLL_EVERY)))
    rng = np.random.default_rng(seed)
    i = np.arange(k, dtype=np.int64)
    is_comm = i % COLL_EVERY == COLL_EVERY - 1
    coll_ops = np.flatnonzero(is_comm)
    comp_ops = np.flatnonzero(~is_comm)
    n_coll = len(coll_ops)
    base = (np.arange(ranks, dtype=np.int64) * 3 * k)[:, None]
    a_slot, l_slot, g_slot = base + i, base + k + i, base + 2 * k + i  # (ranks, k)
    b_slot = ranks * 3 * k + np.arange(n_coll, dtype=np.int64)
    n = 2 * (ranks * 3 * k + n_coll)

    def start(s: np.ndarray) -> np.ndarray:
        return 2 * s

    def end(s: np.ndarray) -> np.ndarray:
        return 2 * s + 1

    def ns(x: np.ndarray) -> np.ndarray:
        return np.round(x)

    shape = (ranks, k)
    xfer_t = ns(rng.uniform(50_000, 500_000, n_coll))  # per collective, same on every rank
    kern = ns(rng.lognormal(np.log(20_000), 0.8, shape))
    kern[:, coll_ops] = xfer_t
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [
        # CPU thread: work between ops, before the launch, the launch call, after it
        (end(a_slot[:, :-1]), start(a_slot[:, 1:]), ns(rng.exponential(2_000, (ranks, k - 1)))),
        (start(a_slot), start(l_slot), ns(rng.exponential(3_000, shape))),
        (start(l_slot), end(l_slot), ns(2_000 + rng.exponential(1_000, shape))),
        (end(l_slot), end(a_slot), ns(rng.exponential(1_000, shape))),
        # launch latency
        (start(l_slot), start(g_slot), ns(4_000 + rng.exponential(1_000, shape))),
        # stream order, compute and comm streams
        (end(g_slot[:, comp_ops[:-1]]), start(g_slot[:, comp_ops[1:]]),
         ns(rng.exponential(1_000, (ranks, len(comp_ops) - 1)))),
        (end(g_slot[:, coll_ops[:-1]]), start(g_slot[:, coll_ops[1:]]),
         ns(rng.exponential(1_000, (ranks, max(n_coll - 1, 0))))),
        # duration edges (a comm kernel's is its transfer time)
        (start(g_slot), end(g_slot), kern),
    ]
    n_before_comm = sum(p[0].size for p in parts)
    own = n_before_comm - k * ranks + (np.arange(ranks)[:, None] * k + coll_ops).ravel()
    bb = np.broadcast_to(b_slot, (ranks, n_coll))
    sync_ops = np.flatnonzero(i % SYNC_EVERY == SYNC_EVERY - 1)
    waited = coll_ops[coll_ops + WAIT_AHEAD < k]
    parts += [
        # barrier: arrival (weight 0), transfer
        (start(g_slot[:, coll_ops]), start(bb), np.zeros((ranks, n_coll))),
        (start(bb), end(g_slot[:, coll_ops]), np.broadcast_to(xfer_t, (ranks, n_coll))),
        # stream waits (events): a collective waits for the compute kernel before it, and
        # the compute kernel WAIT_AHEAD ops later waits for the collective
        (end(g_slot[:, coll_ops - 1]), start(g_slot[:, coll_ops]),
         ns(rng.exponential(1_000, (ranks, n_coll)))),
        (end(g_slot[:, waited]), start(g_slot[:, waited + WAIT_AHEAD]),
         ns(rng.exponential(1_000, (ranks, len(waited))))),
        # sync: the CPU call returns after its kernel (plus a wake-up)
        (end(g_slot[:, sync_ops]), end(l_slot[:, sync_ops]),
         ns(1_000 + rng.exponential(1_000, (ranks, len(sync_ops))))),
    ]
    n_before_xfer = n_before_comm + ranks * n_coll
    xfer = n_before_xfer + np.arange(ranks * n_coll)
    src = np.concatenate([p[0].ravel() for p in parts])
    dst = np.concatenate([p[1].ravel() for p in parts])
    w = np.concatenate([np.ravel(p[2]) for p in parts]).astype(np.float64)
    is_own = np.zeros(len(src), dtype=bool)
    is_own[own] = True
    is_xfer = np.zeros(len(src), dtype=bool)
    is_xfer[xfer] = True
    del parts

    # CSR by destination
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    perm = np.argsort(dst, kind="stable")
    del dst
    src, w, is_own, is_xfer = src[perm], w[perm], is_own[perm], is_xfer[perm]
    del perm

    # measured times: the schedule of w from each rank's first op (roots: those, and the
    # barriers' end points, which take their barrier's time as in graph.py)
    t0 = np.zeros(n)
    t0[start(a_slot[:, 0])] = ns(rng.uniform(0, 50_000, ranks))
    order, breaks = topological_order(indptr, src, t0)
    assert breaks == 0, "synthetic graph has a cycle"
    in_order, ptr = edges_in_order(order, indptr)
    src_by_dst = src
    src, w, is_own, is_xfer = src[in_order], w[in_order], is_own[in_order], is_xfer[in_order]
    t0 = schedule(order, ptr, src, w, t0)
    t0[end(b_slot)] = t0[start(b_slot)]
    comm_own, transfer = np.flatnonzero(is_own), np.flatnonzero(is_xfer)
    return Graph(ranks=ranks, ops_per_rank=k, n_coll=n_coll, indptr=indptr,
                 src_by_dst=src_by_dst, order=order, ptr=ptr, src=src, w=w, t0=t0,
                 comm_own=comm_own, transfer=transfer,
                 xfer_ns=w[np.concatenate([comm_own, transfer])])


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, runs: int) -> tuple[float, object]:  # noqa: ANN001
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def warm_up() -> dict:
    """First calls of the compiled functions on a tiny graph (numba loads them from its disk
    cache when it can), then the same functions compiled from scratch (no cache), timed."""
    indptr = np.array([0, 0, 1, 2], dtype=np.int64)  # a chain 0 -> 1 -> 2
    src = np.array([0, 1], dtype=np.int64)
    w = np.array([1.0, 2.0])
    t0 = np.zeros(3)

    def run() -> np.ndarray:
        order, _ = topological_order(indptr, src, t0)
        _, ptr = edges_in_order(order, indptr)  # a chain: the edges are already in order
        return schedule(order, ptr, src, w, t0)

    t = time.perf_counter()
    assert run().tolist() == [0.0, 1.0, 3.0]
    out = {"first_call_s": time.perf_counter() - t}
    out["cache_hits"] = sum(sum(f.stats.cache_hits.values())
                            for f in (simulate._kahn, simulate._schedule))
    kahn, sched = simulate._kahn, simulate._schedule
    try:  # fresh copies, no cache: the compile time proper
        simulate._kahn = numba.njit(kahn.py_func)
        simulate._schedule = numba.njit(sched.py_func)
        t = time.perf_counter()
        order, _ = topological_order(indptr, src, t0)
        out["compile_kahn_s"] = time.perf_counter() - t
        _, ptr = edges_in_order(order, indptr)
        t = time.perf_counter()
        schedule(order, ptr, src, w, t0)
        out["compile_schedule_s"] = time.perf_counter() - t
    finally:
        simulate._kahn, simulate._schedule = kahn, sched
    return out


def python_schedule(order: np.ndarray, ptr: np.ndarray, src: np.ndarray, w: np.ndarray,
                    t0: np.ndarray, limit: int | None = None) -> np.ndarray:
    """The reference: the same pass as ``simulate._schedule`` as a plain Python loop (over
    the first ``limit`` nodes of the order; those times are final)."""
    p, s, ww, t = ptr.tolist(), src.tolist(), w.tolist(), t0.tolist()
    for i, v in enumerate(order[:limit].tolist()):
        a = p[i]
        b = p[i + 1]
        if a == b:
            continue
        best = t[s[a]] + ww[a]
        for j in range(a + 1, b):
            x = t[s[j]] + ww[j]
            if x > best:
                best = x
        t[v] = best
    return np.array(t)


def baseline(g: Graph, order: np.ndarray, t_compiled: np.ndarray, sched_s: float,
             runs: int) -> dict:
    """The Python loop against ``schedule``: same times (exactly), speed ratio. On the
    whole graph unless its projection from a prefix is over BASELINE_LIMIT_S."""
    n = g.n_nodes
    limit = None
    if n > PREFIX_NODES:
        t = time.perf_counter()
        python_schedule(order, g.ptr, g.src, g.w, g.t0, PREFIX_NODES)
        if (time.perf_counter() - t) * n / PREFIX_NODES > BASELINE_LIMIT_S:
            limit = PREFIX_NODES
    sec, t_py = timed(lambda: python_schedule(order, g.ptr, g.src, g.w, g.t0, limit),
                      max(1, min(runs, 3)))
    nodes = order[:limit]
    assert np.array_equal(t_py[nodes], t_compiled[nodes]), "Python and compiled times differ"
    n_done = len(nodes)
    e_done = int(g.ptr[len(nodes)])
    # compiled time on the same part: the whole schedule scaled by nodes (prefix case only)
    compiled_s = sched_s * n_done / n
    return {"nodes": n_done, "edges": e_done, "prefix": limit is not None, "seconds": sec,
            "runs": max(1, min(runs, 3)), "nodes_per_s": n_done / sec,
            "edges_per_s": e_done / sec, "max_abs_diff": float(
                np.abs(t_py[nodes] - t_compiled[nodes]).max()),
            "speedup": sec / compiled_s}


def sweep(g: Graph, order: np.ndarray, topo_s: float, sched_s: float) -> dict:
    """SWEEP settings on one built graph: comm transfer times x factor (as a network model
    scales them: a comm kernel's own edge and its transfer edges), weights made per setting."""
    factors = np.linspace(0.5, 2.0, SWEEP)
    sel = np.concatenate([g.comm_own, g.transfer])
    makespan = np.empty(SWEEP)
    sched_only = 0.0
    t_all = time.perf_counter()
    for i, f in enumerate(factors):
        w = g.w.copy()
        w[sel] = g.xfer_ns * f
        t = time.perf_counter()
        times = schedule(order, g.ptr, g.src, w, g.t0)
        sched_only += time.perf_counter() - t
        makespan[i] = times.max()
    total = time.perf_counter() - t_all
    assert (np.diff(makespan) >= 0).all(), "makespan should not shrink as transfers grow"
    rebuild = SWEEP * (topo_s + sched_s)
    return {"settings": SWEEP, "factors": [float(factors[0]), float(factors[-1])],
            "total_s": total, "schedule_only_s": sched_only, "settings_per_s": SWEEP / total,
            "makespan_ms": [float(makespan[0] / 1e6), float(makespan[-1] / 1e6)],
            "rebuild_each_s": rebuild, "reuse_gain": rebuild / total}


def bench_config(n_target: int, ranks: int, runs: int) -> tuple[dict, Graph, np.ndarray,
                                                                np.ndarray]:
    t = time.perf_counter()
    g = make_graph(n_target, ranks)
    gen_s = time.perf_counter() - t
    def build() -> tuple[np.ndarray, int]:  # what a replay builds once: the order, the edges in it
        order, breaks = topological_order(g.indptr, g.src_by_dst, g.t0)
        edges_in_order(order, g.indptr)
        return order, breaks

    topo_s, (_, breaks) = timed(build, runs)
    assert breaks == 0
    order = g.order  # the order the graph's edges were put in (from the first op's times)
    sched_s, times = timed(lambda: schedule(order, g.ptr, g.src, g.w, g.t0), runs)
    assert np.array_equal(times, g.t0), "identity replay must give the measured times"
    res = {"target": label(n_target), "ranks": ranks, "ops_per_rank": g.ops_per_rank,
           "collectives": g.n_coll, "nodes": g.n_nodes, "edges": g.n_edges, "gen_s": gen_s,
           "order_s": topo_s, "order_nodes_per_s": g.n_nodes / topo_s,
           "schedule_s": sched_s, "nodes_per_s": g.n_nodes / sched_s,
           "edges_per_s": g.n_edges / sched_s, "graph_mb": g.nbytes / 2**20,
           "peak_rss_mb": peak_rss_mb()}
    return res, g, order, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,10M", help="total nodes per graph, comma-separated")
    ap.add_argument("--ranks", default="8,1024", help="ranks per graph, comma-separated")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smoke run: 100k nodes, 8 ranks")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.sizes, a.ranks = "100k", "8"
    sizes = sorted({parse_count(s) for s in a.sizes.split(",")})
    ranks = sorted({int(r) for r in a.ranks.split(",")})
    configs = [(n, r) for n in sizes for r in ranks]
    # the baseline and the sweep run on the 8-rank 1M-node graph, else the smallest one
    ref = (1_000_000, 8) if (1_000_000, 8) in configs else configs[0]

    t_start = time.perf_counter()
    jit = warm_up()
    out: dict = {"runs": a.runs, "jit": jit, "configs": [], "numba": numba.__version__}
    for n, r in configs:
        res, g, order, times = bench_config(n, r, a.runs)
        if (n, r) == ref:
            out["baseline"] = {"config": f"{res['target']} x {r}",
                               **baseline(g, order, times, res["schedule_s"], a.runs)}
            out["sweep"] = {"config": f"{res['target']} x {r}",
                            **sweep(g, order, res["order_s"], res["schedule_s"])}
            res["peak_rss_mb"] = peak_rss_mb()
        out["configs"].append(res)
        del g, order, times
    out["wall_s"] = time.perf_counter() - t_start
    out["peak_rss_mb"] = peak_rss_mb()
    if a.json:
        print(json.dumps(out, indent=1))
        return
    report(out)


def report(out: dict) -> None:
    j = out["jit"]
    how = "loaded from numba's disk cache" if j["cache_hits"] else "compiled (no disk cache)"
    print(f"replay scheduler (numba {out['numba']}), synthetic training-step graphs, "
          f"median of {out['runs']} run(s)")
    print(f"JIT: first calls (tiny graph, {how}) {j['first_call_s']:.3f} s; compile from "
          f"scratch: _kahn {j['compile_kahn_s']:.2f} s, _schedule {j['compile_schedule_s']:.2f} s"
          " (not in the figures below)")
    cols = ("graph", "ranks", "ops/rank", "colls", "nodes", "edges", "gen s", "order s",
            "Mnodes/s", "sched s", "Mnodes/s", "Medges/s", "RSS MB")
    fmt = "{:<7}{:>6}{:>9}{:>6}{:>12}{:>12}{:>7}{:>9}{:>9}{:>9}{:>9}{:>9}{:>8}"
    head = fmt.format(*cols)
    print()
    print(f"{'':<59}{'topological_order':>18}{'schedule (one simulation)':>27}")
    print(head)
    print("-" * len(head))
    for c in out["configs"]:
        print(fmt.format(c["target"], c["ranks"], f"{c['ops_per_rank']:,}",
                         c["collectives"], f"{c['nodes']:,}", f"{c['edges']:,}",
                         f"{c['gen_s']:.2f}", f"{c['order_s']:.3f}",
                         f"{c['order_nodes_per_s'] / 1e6:.1f}", f"{c['schedule_s']:.4f}",
                         f"{c['nodes_per_s'] / 1e6:.1f}", f"{c['edges_per_s'] / 1e6:.1f}",
                         f"{c['peak_rss_mb']:.0f}"))
    print("(gen s: making the graph and its measured times, once; RSS MB: peak of the process "
          "so far)")
    b = out.get("baseline")
    if b:
        part = f"first {b['nodes']:,} nodes in order" if b["prefix"] else "whole graph"
        print()
        print(f"Python loop baseline on {b['config']} ({part}, {b['edges']:,} edges, median of "
              f"{b['runs']}): {b['seconds']:.2f} s = {b['nodes_per_s'] / 1e6:.2f} Mnodes/s, "
              f"{b['edges_per_s'] / 1e6:.2f} Medges/s")
        print(f"  same times as schedule() (max |diff| {b['max_abs_diff']:g} ns); "
              f"compiled / python speed: {b['speedup']:.0f}x")
    s = out.get("sweep")
    if s:
        print(f"Sweep of {s['settings']} settings on one built graph ({s['config']}, transfer "
              f"times x {s['factors'][0]:g}..{s['factors'][1]:g}): {s['total_s']:.2f} s total "
              f"({s['schedule_only_s']:.2f} s in schedule), {s['settings_per_s']:.1f} "
              f"settings/s")
        print(f"  makespan {s['makespan_ms'][0]:.1f} -> {s['makespan_ms'][1]:.1f} ms; "
              f"rebuilding the order per setting would take ~{s['rebuild_each_s']:.1f} s "
              f"({s['reuse_gain']:.1f}x)")
    print(f"wall {out['wall_s']:.1f} s, peak RSS {out['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
