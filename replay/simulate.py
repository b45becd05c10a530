"""Scheduling a replay graph: as soon as possible under every edge, in one compiled pass.

A point's time is the latest of (source time + weight) over its in-edges, or its measured time
when it has none (the first event of a thread, a kernel launched before the trace began).
Nodes are visited in topological order, so every time is final when it is read. The loops
are compiled with numba (cached on disk after the first call): tens of millions of edges a
second, where a Python loop would manage about one million.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _kahn(indptr: np.ndarray, out_ptr: np.ndarray, out_dst: np.ndarray,
          by_time: np.ndarray) -> tuple[np.ndarray, int]:  # pragma: no cover - compiled
    n = len(indptr) - 1
    indeg = indptr[1:] - indptr[:-1]
    order = np.empty(n, dtype=np.int64)
    done = np.zeros(n, dtype=np.bool_)
    queue = np.empty(n, dtype=np.int64)
    head = 0
    tail = 0
    for i in range(n):  # roots, in time order
        v = by_time[i]
        if indeg[v] == 0:
            queue[tail] = v
            tail += 1
    k = 0
    scan = 0
    breaks = 0
    while k < n:
        if head == tail:  # a cycle (zero-lag edges both ways): force its earliest node
            while done[by_time[scan]]:
                scan += 1
            v = by_time[scan]
            breaks += indeg[v]
            indeg[v] = 0
            queue[tail] = v
            tail += 1
        v = queue[head]
        head += 1
        if done[v]:
            continue
        done[v] = True
        order[k] = v
        k += 1
        for j in range(out_ptr[v], out_ptr[v + 1]):
            d = out_dst[j]
            indeg[d] -= 1
            if indeg[d] == 0 and not done[d]:
                queue[tail] = d
                tail += 1
    return order, breaks


def topological_order(indptr: np.ndarray, src: np.ndarray, t0: np.ndarray
                      ) -> tuple[np.ndarray, int]:
    """Nodes in an order where every edge's source comes first (Kahn's algorithm, roots by
    measured time), and how many edges had to be ignored to break cycles."""
    n = len(indptr) - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    by_src = np.argsort(src, kind="stable")
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(out_ptr, src + 1, 1)
    out_ptr = np.cumsum(out_ptr)
    by_time = np.argsort(t0, kind="stable").astype(np.int64)
    return _kahn(indptr, out_ptr, dst[by_src].astype(np.int64), by_time)


@njit(cache=True)
def _schedule(order: np.ndarray, indptr: np.ndarray, src: np.ndarray, w: np.ndarray,
              t0: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    t = t0.copy()
    for i in range(len(order)):
        v = order[i]
        a = indptr[v]
        b = indptr[v + 1]
        if a == b:
            continue
        best = t[src[a]] + w[a]
        for j in range(a + 1, b):
            x = t[src[j]] + w[j]
            if x > best:
                best = x
        t[v] = best
    return t


def schedule(order: np.ndarray, indptr: np.ndarray, src: np.ndarray, w: np.ndarray,
             t0: np.ndarray) -> np.ndarray:
    """Times of every node (float64 ns) under edge weights ``w``."""
    return _schedule(order, indptr, src, np.ascontiguousarray(w, dtype=np.float64),
                     np.ascontiguousarray(t0, dtype=np.float64))


@njit(cache=True)
def _binding(indptr: np.ndarray, src: np.ndarray, w: np.ndarray, kind: np.ndarray,
             t: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    n = len(indptr) - 1
    edge = np.full(n, -1, dtype=np.int64)
    for v in range(n):
        best = -np.inf
        for j in range(indptr[v], indptr[v + 1]):
            x = t[src[j]] + w[j]
            if x > best or (x == best and kind[j] < kind[edge[v]]):
                best = x
                edge[v] = j
    return edge


def binding_edges(indptr: np.ndarray, src: np.ndarray, w: np.ndarray, kind: np.ndarray,
                  t: np.ndarray) -> np.ndarray:
    """Per node: the in-edge that set its time (latest source time + weight; ties to the
    earlier edge kind), -1 for nodes without in-edges. The critical path follows these."""
    return _binding(indptr, src, np.ascontiguousarray(w, dtype=np.float64), kind, t)
