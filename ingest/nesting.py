"""Per-track nesting (depth, parent) and flow binding, with Perfetto's rules.

Slices on a track are visited sorted by (ts, longer dur first, eid). Intervals are half-open:
a slice that ends where the next begins is closed first, while a zero-length slice stays open
for slices starting at the same instant. A slice that starts inside the open one but ends after
it is a partial overlap: it is still placed under the open slice and flagged (Perfetto spills
it to an overflow track; older Perfetto dropped it).

Flow events bind on their own track: ``s``, ``t`` and ``f`` with ``bp == "e"`` to the innermost
slice open at their time, ``f`` without a binding point to the next slice that starts at or
after it.
"""

from __future__ import annotations

import numpy as np


def _closed(start: int, end: int, t: int) -> bool:
    """Is a slice [start, end) over by time t?"""
    return end < t or (end == t and start < end)


def nest(
    track: np.ndarray, ts: np.ndarray, dur: np.ndarray, eid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by (track, ts, -dur, eid) -> (depth, parent eid or -1, overlaps_parent)."""
    n = len(ts)
    depth = np.zeros(n, dtype=np.int32)
    parent = np.full(n, -1, dtype=np.int64)
    overlap = np.zeros(n, dtype=bool)
    tr, t0, d0, ids = track.tolist(), ts.tolist(), dur.tolist(), eid.tolist()
    st_start: list[int] = []
    st_end: list[int] = []
    st_id: list[int] = []
    cur = None
    for i in range(n):
        if tr[i] != cur:
            cur = tr[i]
            st_start.clear()
            st_end.clear()
            st_id.clear()
        s = t0[i]
        e = s + d0[i]
        while st_end and _closed(st_start[-1], st_end[-1], s):
            st_start.pop()
            st_end.pop()
            st_id.pop()
        if st_end:
            parent[i] = st_id[-1]
            overlap[i] = e > st_end[-1]
        depth[i] = len(st_end)
        st_start.append(s)
        st_end.append(e)
        st_id.append(ids[i])
    return depth, parent, overlap


def bind_flows(
    slice_track: np.ndarray,
    slice_ts: np.ndarray,
    slice_end: np.ndarray,
    slice_eid: np.ndarray,
    flow_track: np.ndarray,
    flow_ts: np.ndarray,
    flow_next: np.ndarray,
) -> np.ndarray:
    """Bound slice eid (or -1) for each flow event.

    Slices are sorted as for ``nest``; flows by (track, ts). ``flow_next`` marks ``f``
    events without ``bp``, which bind to the next slice starting at or after them.
    """
    out = np.full(len(flow_ts), -1, dtype=np.int64)
    st, sts, sen, sid = (slice_track.tolist(), slice_ts.tolist(), slice_end.tolist(),
                         slice_eid.tolist())
    ft, fts, fnx = flow_track.tolist(), flow_ts.tolist(), flow_next.tolist()
    n = len(sts)
    i = 0
    st_start: list[int] = []
    st_end: list[int] = []
    st_id: list[int] = []
    cur = None
    for j in range(len(fts)):
        if ft[j] != cur:
            cur = ft[j]
            st_start.clear()
            st_end.clear()
            st_id.clear()
            while i < n and st[i] < cur:
                i += 1
        t = fts[j]
        while i < n and st[i] == cur and sts[i] <= t:
            while st_end and _closed(st_start[-1], st_end[-1], sts[i]):
                st_start.pop()
                st_end.pop()
                st_id.pop()
            st_start.append(sts[i])
            st_end.append(sen[i])
            st_id.append(sid[i])
            i += 1
        if fnx[j]:
            # the first slice to begin at or after t: one already pushed at exactly t
            # (the outermost of those), else the next one on the track
            found = -1
            for m in range(len(st_start) - 1, -1, -1):
                if st_start[m] != t:
                    break
                found = st_id[m]
            if found < 0 and i < n and st[i] == cur:
                found = sid[i]
            out[j] = found
            continue
        while st_end and _closed(st_start[-1], st_end[-1], t):
            st_start.pop()
            st_end.pop()
            st_id.pop()
        if st_end:
            out[j] = st_id[-1]
    return out
