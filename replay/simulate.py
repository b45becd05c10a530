"""Scheduling a replay graph: as soon as possible under every edge, in one compiled pass.

A point's time is the latest of (source time + weight) over its in-edges, or its measured time
when it has none (the first event of a thread, a kernel launched before the trace began).
Nodes are visited in topological order, so every time is final when it is read. The loops
are compiled with numba (cached on disk after the first call): tens of millions of edges a
second, where a Python loop would manage about one million.

The graph is built as a CSR by destination (``csr_by_destination``), which
``topological_order`` reads; the schedules read it **in order** (``edges_in_order``): the
in-edges of the i-th node of the order are ``ptr[i]:ptr[i + 1]``, so a pass reads the edges
front to back. On the 1,024-rank benchmark's graph (10.4M nodes, 7.4M edges) that took one
schedule from 0.43-0.59 s to 0.16 s: the pass is bound by memory reads, not arithmetic.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _kahn(indptr: np.ndarray, src: np.ndarray, roots: np.ndarray
          ) -> tuple[np.ndarray, int]:  # pragma: no cover - compiled
    n = len(indptr) - 1
    m = len(src)
    out_ptr = np.zeros(n + 1, dtype=np.int64)  # out-edges: a counting sort by source
    for j in range(m):
        out_ptr[src[j] + 1] += 1
    for v in range(n):
        out_ptr[v + 1] += out_ptr[v]
    fill = out_ptr[:-1].copy()
    out_dst = np.empty(m, dtype=np.int64)
    for v in range(n):
        for j in range(indptr[v], indptr[v + 1]):
            s = src[j]
            out_dst[fill[s]] = v
            fill[s] += 1
    indeg = indptr[1:] - indptr[:-1]
    order = np.empty(n, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    tail = 0
    for i in range(len(roots)):  # roots, in time order
        queue[tail] = roots[i]
        tail += 1
    head = 0
    while head < tail:
        v = queue[head]
        order[head] = v
        head += 1
        for j in range(out_ptr[v], out_ptr[v + 1]):
            d = out_dst[j]
            indeg[d] -= 1
            if indeg[d] == 0:
                queue[tail] = d
                tail += 1
    return order, head


@njit(cache=True)
def _kahn_breaking(indptr: np.ndarray, out_ptr: np.ndarray, out_dst: np.ndarray,
                   by_time: np.ndarray) -> tuple[np.ndarray, int]:  # pragma: no cover
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
    measured time), and how many edges had to be ignored to break cycles. The common case
    (no cycle: every trace seen) sorts only the roots; a cycle reruns it with every node in
    time order, to force each cycle's earliest node."""
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    src = np.ascontiguousarray(src, dtype=np.int64)
    roots = np.flatnonzero(indptr[1:] == indptr[:-1])
    roots = roots[np.argsort(t0[roots], kind="stable")].astype(np.int64)
    order, done = _kahn(indptr, src, roots)
    if done == len(order):
        return order, 0
    n = len(indptr) - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    by_src = np.argsort(src, kind="stable")
    out_ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))]).astype(np.int64)
    by_time = np.argsort(t0, kind="stable").astype(np.int64)
    return _kahn_breaking(indptr, out_ptr, dst[by_src].astype(np.int64), by_time)


@njit(cache=True)
def _csr(dst: np.ndarray, kind: np.ndarray, src: np.ndarray,
         n: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    indptr = np.zeros(n + 1, dtype=np.int64)
    for j in range(len(dst)):
        indptr[dst[j] + 1] += 1
    for v in range(n):
        indptr[v + 1] += indptr[v]
    fill = indptr[:-1].copy()
    perm = np.empty(len(dst), dtype=np.int64)
    for j in range(len(dst)):
        perm[fill[dst[j]]] = j
        fill[dst[j]] += 1
    for v in range(n):  # a point has few in-edges: insertion sort by (kind, src)
        a = indptr[v]
        for i in range(a + 1, indptr[v + 1]):
            x = perm[i]
            k = i - 1
            while k >= a and (kind[perm[k]] > kind[x]
                              or (kind[perm[k]] == kind[x] and src[perm[k]] > src[x])):
                perm[k + 1] = perm[k]
                k -= 1
            perm[k + 1] = x
    return perm, indptr


def csr_by_destination(dst: np.ndarray, kind: np.ndarray, src: np.ndarray, n_nodes: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(perm, indptr): edges ordered by destination, then kind, then source (so ties between
    in-edges go to the earlier kind, whatever order the rows came in), as a CSR over
    ``n_nodes`` nodes. A counting sort: linear in the edges."""
    return _csr(np.ascontiguousarray(dst, dtype=np.int64),
                np.ascontiguousarray(kind, dtype=np.int8),
                np.ascontiguousarray(src, dtype=np.int64), n_nodes)


@njit(cache=True)
def _in_order(order: np.ndarray, indptr: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    n = len(order)
    ptr = np.empty(n + 1, dtype=np.int64)
    ptr[0] = 0
    for i in range(n):
        v = order[i]
        ptr[i + 1] = ptr[i] + indptr[v + 1] - indptr[v]
    perm = np.empty(ptr[n], dtype=np.int64)
    for i in range(n):
        v = order[i]
        a = indptr[v]
        for j in range(ptr[i + 1] - ptr[i]):
            perm[ptr[i] + j] = a + j
    return perm, ptr


def edges_in_order(order: np.ndarray, indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(perm, ptr): the edges of a CSR by destination regrouped in scheduling order (each
    node's in-edges keep their order), and the CSR over positions in ``order``: the
    in-edges of node ``order[i]`` are ``perm[ptr[i]:ptr[i + 1]]``."""
    return _in_order(np.ascontiguousarray(order, dtype=np.int64),
                     np.ascontiguousarray(indptr, dtype=np.int64))


@njit(cache=True)
def _smallest(indptr: np.ndarray, lag: np.ndarray) -> np.ndarray:  # pragma: no cover
    out = np.zeros(len(lag), dtype=np.bool_)
    for v in range(len(indptr) - 1):
        a, b = indptr[v], indptr[v + 1]
        if a == b:
            continue
        best = lag[a]
        for j in range(a + 1, b):
            best = min(best, lag[j])
        for j in range(a, b):
            out[j] = lag[j] == best
    return out


def smallest_in_edges(ptr: np.ndarray, lag: np.ndarray) -> np.ndarray:
    """Per edge: is its lag the smallest into its point (the binding one); the edges are
    grouped by destination (``ptr``: either CSR, by node or in order)."""
    return _smallest(ptr, np.ascontiguousarray(lag, dtype=np.float64))


@njit(cache=True, nogil=True)
def _schedule(order: np.ndarray, ptr: np.ndarray, src: np.ndarray, w: np.ndarray,
              t0: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    t = t0.copy()
    for i in range(len(order)):
        a = ptr[i]
        b = ptr[i + 1]
        if a == b:
            continue
        best = t[src[a]] + w[a]
        for j in range(a + 1, b):
            x = t[src[j]] + w[j]
            if x > best:
                best = x
        t[order[i]] = best
    return t


def schedule(order: np.ndarray, ptr: np.ndarray, src: np.ndarray, w: np.ndarray,
             t0: np.ndarray) -> np.ndarray:
    """Times of every node (float64 ns) under edge weights ``w``; edges in order
    (``edges_in_order``: ``ptr`` over positions in ``order``)."""
    return _schedule(order, ptr, src, np.ascontiguousarray(w, dtype=np.float64),
                     np.ascontiguousarray(t0, dtype=np.float64))


# a separate kernel from _schedule, not _schedule_many with one column: that one runs
# 4-35% slower for a single weight vector (0.47-0.58 against 0.35-0.54 s, 10.4M nodes)
@njit(cache=True, nogil=True)
def _schedule_many(order: np.ndarray, ptr: np.ndarray, src: np.ndarray, w: np.ndarray,
                   t0: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    k = w.shape[1]
    t = np.empty((len(t0), k))
    for v in range(len(t0)):
        for c in range(k):
            t[v, c] = t0[v]
    for i in range(len(order)):
        v = order[i]
        a = ptr[i]
        b = ptr[i + 1]
        if a == b:
            continue
        s = src[a]
        for c in range(k):
            t[v, c] = t[s, c] + w[a, c]
        for j in range(a + 1, b):
            s = src[j]
            for c in range(k):
                x = t[s, c] + w[j, c]
                if x > t[v, c]:
                    t[v, c] = x
    return t


def schedule_many(order: np.ndarray, ptr: np.ndarray, src: np.ndarray,
                  weights: list[np.ndarray], t0: np.ndarray) -> list[np.ndarray]:
    """``schedule`` under several weight vectors in one pass over the graph (each node's
    in-edges and their sources' times read once for all of them: the random reads are the
    cost, so 3 schedules cost about 2). The times per weight vector, in order (views); the
    same maxima of the same sums as ``schedule``, to the bit. Releases the GIL."""
    if len(weights) == 1:
        return [schedule(order, ptr, src, weights[0], t0)]
    w = np.empty((len(weights[0]), len(weights)))
    for c, x in enumerate(weights):
        w[:, c] = x
    t = _schedule_many(order, ptr, src, w, np.ascontiguousarray(t0, dtype=np.float64))
    return [t[:, c] for c in range(len(weights))]


@njit(cache=True)
def _binding(order: np.ndarray, ptr: np.ndarray, src: np.ndarray, w: np.ndarray,
             kind: np.ndarray, t: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    edge = np.full(len(order), -1, dtype=np.int64)
    for i in range(len(order)):
        v = order[i]
        best = -np.inf
        for j in range(ptr[i], ptr[i + 1]):
            x = t[src[j]] + w[j]
            if x > best or (x == best and kind[j] < kind[edge[v]]):
                best = x
                edge[v] = j
    return edge


def binding_edges(order: np.ndarray, ptr: np.ndarray, src: np.ndarray, w: np.ndarray,
                  kind: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per node: the in-edge that set its time (latest source time + weight; ties to the
    earlier edge kind), -1 for nodes without in-edges; edges in order, as ``schedule``'s.
    The critical path follows these."""
    return _binding(order, ptr, src, np.ascontiguousarray(w, dtype=np.float64), kind, t)


def warm_up() -> None:
    """Load every compiled function from numba's cache (about 0.3-0.5 s the first time in a
    process, most of it numba's own start-up), so that a caller can do it on a thread while
    it reads the graph from the store."""
    indptr, src = np.array([0, 0, 1], dtype=np.int64), np.array([0], dtype=np.int64)
    t0, w = np.zeros(2), np.ones(1)
    order, _ = topological_order(indptr, src, t0)
    csr_by_destination(np.array([1]), np.array([0], dtype=np.int8), src, 2)
    smallest_in_edges(indptr, w)
    _, ptr = edges_in_order(order, indptr)
    binding_edges(order, ptr, src, w, np.zeros(1, dtype=np.int8),
                  schedule(order, ptr, src, w, t0))
    schedule_many(order, ptr, src, [w, w], t0)
