"""The replay's compiled scheduler (replay/simulate.py) against an independent longest-path
computation (the standard library's graphlib for the order, a Python loop for the times), on
random DAGs whose node numbers are shuffled, so the topological order is not the numbering."""

from __future__ import annotations

from graphlib import TopologicalSorter

import numpy as np
import pytest

from tracetool.replay.simulate import (
    binding_edges,
    csr_by_destination,
    edges_in_order,
    schedule,
    schedule_many,
    topological_order,
)


def random_dag(seed: int, n: int = 400, m: int = 1500
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, w, t0): m edges over n nodes, each from an earlier to a later node of a
    hidden order, numbered by a random permutation; a few roots get measured times."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n - 1, m)
    b = a + 1 + (rng.integers(0, n, m) % (n - 1 - a))
    perm = rng.permutation(n)
    w = rng.integers(0, 1000, m).astype(np.float64)
    t0 = np.where(rng.random(n) < 0.05, rng.integers(0, 500, n), 0).astype(np.float64)
    return perm[a].astype(np.int64), perm[b].astype(np.int64), w, t0


def reference_times(src: np.ndarray, dst: np.ndarray, w: np.ndarray, t0: np.ndarray
                    ) -> np.ndarray:
    """Each node's time: its measured time with no in-edge, else max(source time + weight)."""
    preds: dict[int, list[tuple[int, float]]] = {v: [] for v in range(len(t0))}
    for s, d, x in zip(src.tolist(), dst.tolist(), w.tolist(), strict=True):
        preds[d].append((s, x))
    t = t0.copy()
    for v in TopologicalSorter({v: [s for s, _ in p] for v, p in preds.items()}).static_order():
        if preds[v]:
            t[v] = max(t[s] + x for s, x in preds[v])
    return t


@pytest.mark.parametrize("seed", range(5))
def test_schedule_in_order_is_the_longest_path(seed: int) -> None:
    src, dst, w, t0 = random_dag(seed)
    by_dst, indptr = csr_by_destination(dst, np.zeros(len(dst), dtype=np.int8), src, len(t0))
    order, breaks = topological_order(indptr, src[by_dst], t0)
    assert breaks == 0 and sorted(order.tolist()) == list(range(len(t0)))
    perm, ptr = edges_in_order(order, indptr)
    edges = by_dst[perm]  # the input's edge numbers, in scheduling order
    # every position's group is exactly that node's in-edges
    for i, v in enumerate(order.tolist()):
        assert sorted(edges[ptr[i]:ptr[i + 1]].tolist()) == sorted(
            np.flatnonzero(dst == v).tolist())
    want = reference_times(src, dst, w, t0)
    got = schedule(order, ptr, src[edges], w[edges], t0)
    assert np.array_equal(got, want)
    # several weight vectors in one pass: the same times as one at a time
    w2 = w[edges] * 2
    many = schedule_many(order, ptr, src[edges], [w[edges], w2], t0)
    assert np.array_equal(many[0], got)
    assert np.array_equal(many[1], schedule(order, ptr, src[edges], w2, t0))
    # the binding edge of each node with in-edges gives its time
    bind = binding_edges(order, ptr, src[edges], w[edges], np.zeros(len(edges), np.int8), got)
    has = bind >= 0
    assert np.array_equal(has, np.isin(np.arange(len(t0)), dst))
    e = edges[bind[has]]
    assert np.array_equal(got[src[e]] + w[e], got[has])
