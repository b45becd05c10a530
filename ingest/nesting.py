"""Per-track nesting (depth, parent) and flow binding, with Perfetto's rules, streamed.

Slices on a track are visited sorted by (ts, longer dur first, eid). Intervals are half-open:
a slice that ends where the next begins is closed first, while a zero-length slice stays open
for slices starting at the same instant. A slice that starts inside the open one but ends after
it is a partial overlap: it is still placed under the open slice and flagged (Perfetto spills
it to an overflow track; older Perfetto dropped it).

Flow events bind on their own track: ``s``, ``t`` and ``f`` with ``bp == "e"`` to the innermost
slice open at their time (slices starting at that very time included), ``f`` without a binding
point to the next slice that starts at or after it.

Both sorted streams arrive in batches and are merged in one pass, so memory does not grow with
the trace: results go straight into (memory-mapped) arrays indexed by eid.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

Batch = dict[str, np.ndarray]


class _Stack:
    __slots__ = ("track", "start", "end", "eid")

    def __init__(self) -> None:
        self.track: object = None
        self.start: list[int] = []
        self.end: list[int] = []
        self.eid: list[int] = []

    def reset(self, track: object) -> None:
        self.track = track
        self.start.clear()
        self.end.clear()
        self.eid.clear()

    def close_before(self, t: int) -> None:
        """Pop slices over by time t ([start, end) half-open; zero-length at t stays)."""
        start, end, eid = self.start, self.end, self.eid
        while end and (end[-1] < t or (end[-1] == t and start[-1] < end[-1])):
            start.pop()
            end.pop()
            eid.pop()


def _slices(batches: Iterator[Batch]) -> Iterator[tuple[int, int, int, int]]:
    for b in batches:
        yield from zip(b["track_id"].tolist(), b["ts_ns"].tolist(), b["dur_ns"].tolist(),
                       b["eid"].tolist(), strict=True)


def _flows(batches: Iterator[Batch]) -> Iterator[tuple[int, int, int, bool]]:
    for b in batches:
        yield from zip(b["track_id"].tolist(), b["ts_ns"].tolist(), b["eid"].tolist(),
                       np.asarray(b["nxt"], dtype=bool).tolist(), strict=True)


def nest_and_bind(
    slice_batches: Iterator[Batch],
    flow_batches: Iterator[Batch],
    depth: np.ndarray,
    parent: np.ndarray,
    overlap: np.ndarray,
) -> tuple[array, array]:
    """Fill depth/parent/overlap (indexed by eid) from slices sorted by (track, ts, -dur, eid);
    bind flows sorted by (track, ts, eid). Returns (flow eids, bound slice eid or -1)."""
    stack = _Stack()
    flow_eids = array("q")  # compact: a trace can have millions of flows
    bound = array("q")
    flows = _flows(flow_batches)
    nxt_flow = next(flows, None)

    def bind(flow: tuple[int, int, int, bool], upcoming: tuple | None) -> None:
        f_track, t, f_eid, to_next = flow
        found = -1
        if stack.track == f_track:
            if to_next:
                # the first slice to begin at or after t: one already open that began at t
                # (the outermost such), else the upcoming one
                for m in range(len(stack.start) - 1, -1, -1):
                    if stack.start[m] != t:
                        break
                    found = stack.eid[m]
            else:
                stack.close_before(t)
                if stack.end:
                    found = stack.eid[-1]
        if found < 0 and to_next and upcoming is not None and upcoming[0] == f_track:
            found = upcoming[3]
        flow_eids.append(f_eid)
        bound.append(found)

    for sl in _slices(slice_batches):
        track, s, d, eid = sl
        # flows that come before this slice in (track, ts) order bind now
        while nxt_flow is not None and (nxt_flow[0] < track or
                                        (nxt_flow[0] == track and nxt_flow[1] < s)):
            bind(nxt_flow, sl)
            nxt_flow = next(flows, None)
        if track != stack.track:
            stack.reset(track)
        stack.close_before(s)
        e = s + d
        if stack.end:
            parent[eid] = stack.eid[-1]
            overlap[eid] = e > stack.end[-1]
        depth[eid] = len(stack.end)
        stack.start.append(s)
        stack.end.append(e)
        stack.eid.append(eid)
    while nxt_flow is not None:
        bind(nxt_flow, None)
        nxt_flow = next(flows, None)
    return flow_eids, bound
