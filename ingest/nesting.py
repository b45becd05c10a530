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
the trace: results go straight into (memory-mapped) arrays indexed by eid. The merge runs in a
compiled (numba) kernel that keeps its open-slice stack in small arrays between batches; a
Python loop over every event was half of the derivation stage.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

Batch = dict[str, np.ndarray]

_NO_TRACK = np.iinfo(np.int64).min


_EMPTY_SLICES = {k: np.zeros(0, dtype=np.int64) for k in ("track_id", "ts_ns", "dur_ns", "eid")}
_EMPTY_FLOWS = {"track_id": np.zeros(0, dtype=np.int64), "ts_ns": np.zeros(0, dtype=np.int64),
                "eid": np.zeros(0, dtype=np.int64), "nxt": np.zeros(0, dtype=np.bool_)}


def _ints(b: Batch, keys: tuple[str, ...]) -> Batch:
    out = {k: np.ascontiguousarray(b[k], dtype=np.int64) for k in keys}
    if "nxt" in b:
        out["nxt"] = np.ascontiguousarray(b["nxt"], dtype=np.bool_)
    return out


def nest_and_bind(
    slice_batches: Iterator[Batch],
    flow_batches: Iterator[Batch],
    depth: np.ndarray,
    parent: np.ndarray,
    overlap: np.ndarray,
) -> tuple[array, array]:
    """Fill depth/parent/overlap (indexed by eid) from slices sorted by (track, ts, -dur, eid);
    bind flows sorted by (track, ts, eid). Returns (flow eids, bound slice eid or -1)."""
    # imported here, not at the top: the decode workers fork before this runs and need not
    # carry the compiler (about 100 MB of RSS each)
    from ._nest_kernel import DONE, NEED_FLOWS, NEED_SLICES, NEED_STACK, merge

    depth, parent, overlap = np.asarray(depth), np.asarray(parent), np.asarray(overlap)
    st = [np.zeros(4096, dtype=np.int64) for _ in range(3)]
    state = np.array([0, _NO_TRACK], dtype=np.int64)
    flow_eids, bound = array("q"), array("q")
    slices = (_ints(b, ("track_id", "ts_ns", "dur_ns", "eid")) for b in slice_batches)
    flows = (_ints(b, ("track_id", "ts_ns", "eid")) for b in flow_batches)
    sb, fb = next(slices, None), next(flows, None)
    slices_done, flows_done = sb is None, fb is None
    sb, fb = sb or _EMPTY_SLICES, fb or _EMPTY_FLOWS
    fl_bound = np.full(len(fb["eid"]), -1, dtype=np.int64)
    i = j = 0
    while True:
        status, i, j = merge(
            sb["track_id"], sb["ts_ns"], sb["dur_ns"], sb["eid"], i, slices_done,
            fb["track_id"], fb["ts_ns"], fb["eid"], fb["nxt"], fl_bound, j, flows_done,
            st[0], st[1], st[2], state, depth, parent, overlap)
        if status == NEED_STACK:
            st = [np.concatenate([a, np.zeros_like(a)]) for a in st]
        elif status == NEED_SLICES:
            nxt = next(slices, None)
            slices_done = nxt is None
            sb, i = nxt or _EMPTY_SLICES, 0
        elif status == NEED_FLOWS:
            flow_eids.frombytes(fb["eid"].tobytes())
            bound.frombytes(fl_bound.tobytes())
            nxt = next(flows, None)
            flows_done = nxt is None
            fb, j = nxt or _EMPTY_FLOWS, 0
            fl_bound = np.full(len(fb["eid"]), -1, dtype=np.int64)
        else:
            assert status == DONE
            flow_eids.frombytes(fb["eid"][:j].tobytes())
            bound.frombytes(fl_bound[:j].tobytes())
            return flow_eids, bound
