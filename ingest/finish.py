"""Third stage, in the workers: write one final events part from its staged piece.

The derivation stage leaves per-event results in dense arrays indexed by eid (saved as .npy
files, memory-mapped here), so each piece's final Parquet part is written in file order by a
worker, in parallel, without moving the heavy ``args`` text through a sort or a join.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq

from tracetool.schema import EVENTS, FLOWS

from .memory import release_memory

# Columns with few distinct values get Parquet dictionary encoding; for the others (args,
# ids, times) trying it only costs time and, once the dictionary overflows, space: writing
# is 1.4x faster, the files a third smaller and DuckDB reads args 4x faster without it.
DICTIONARY_COLUMNS = ("ph", "cat", "kind", "name", "pid_raw", "tid_raw", "track_kind", "bp",
                      "series", "pid", "tid", "track_id", "depth", "device", "stream", "piece")


@dataclass(frozen=True)
class FinishJob:
    stage_part: str  # whole-row staged events ("" when the piece has none)
    out_part: str
    flows_stage_part: str  # staged flows ("" when the piece has none)
    flows_out_part: str
    derived_dir: str
    offset: int  # geid of the piece's first event (the dense arrays' index)
    ebase: int  # geid of its file's eid 0 (a derivation batch holds several files)
    base_ns: int
    track_kinds: tuple[str, ...]  # indexed by track_id


def save_dense(derived_dir: Path, **arrays: np.ndarray) -> None:
    derived_dir.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        np.save(derived_dir / f"{name}.npy", arr)


def _load(d: Path, name: str) -> np.ndarray:
    return np.load(d / f"{name}.npy", mmap_mode="r")


def finish_part(job: FinishJob) -> tuple[int, int]:
    """Write the final events and flows parts of a piece; returns the rows of each."""
    d = Path(job.derived_dir)
    n_events = _finish_events(job, d) if job.stage_part else 0
    n_flows = _finish_flows(job, d) if job.flows_stage_part else 0
    release_memory()  # the worker idles through the rest of the derivation stage
    return n_events, n_flows


def _finish_flows(job: FinishJob, d: Path) -> int:
    t = pq.read_table(job.flows_stage_part)
    geid = t["ord"].to_numpy() + job.offset
    flow_eid = _load(d, "flow_eid")
    pos = np.minimum(np.searchsorted(flow_eid, geid), max(len(flow_eid) - 1, 0))
    if not len(flow_eid) or not (flow_eid[pos] == geid).all():
        raise AssertionError("flow events missing from the flow binding")
    bound = _load(d, "flow_bound")[pos]
    cols = {
        "eid": pa.array(geid - job.ebase), "ts_ns": pc.add(t["ts_ns"], job.base_ns),
        "track_id": pa.array(_load(d, "track")[geid].astype(np.int32)),
        "bound_eid": pa.array(bound - job.ebase, mask=bound < 0),
    }
    out = pa.table({c.name: _cast(cols[c.name] if c.name in cols else t[c.name], c.type)
                    for c in FLOWS.columns})
    _write(out, job.flows_out_part)
    return out.num_rows


def _write(t: pa.Table, path: str) -> None:
    pq.write_table(t, path, compression="zstd", row_group_size=128 * 1024,
                   use_dictionary=[c for c in DICTIONARY_COLUMNS if c in t.column_names])


def _finish_events(job: FinishJob, d: Path) -> int:
    t = feather.read_table(job.stage_part, memory_map=True)
    eid = t["ord"].to_numpy() + job.offset  # geid: the dense arrays' index
    drops = _load(d, "drop_eid") if (d / "drop_eid.npy").exists() else None
    if drops is not None and len(drops):
        keep = ~np.isin(eid, drops)
        t, eid = t.filter(pa.array(keep)), eid[keep]
    dur = t["dur_ns"]
    if (d / "fix_eid.npy").exists():
        fix_eid, fix_dur = _load(d, "fix_eid"), _load(d, "fix_dur")
        pos = np.searchsorted(fix_eid, eid)
        pos = np.minimum(pos, max(len(fix_eid) - 1, 0))
        hit = (fix_eid[pos] == eid) if len(fix_eid) else np.zeros(len(eid), bool)
        if hit.any():
            d_np = dur.to_numpy().copy()
            d_np[hit] = fix_dur[pos[hit]]
            dur = pa.array(d_np, mask=hit & (d_np < 0))
    depth = _load(d, "depth")[eid]
    parent = _load(d, "parent")[eid]
    overlap = _load(d, "overlap")[eid]
    track = _load(d, "track")[eid]
    ts = pc.add(t["ts_ns"], job.base_ns)
    ph = t["ph"]
    if pc.any(pc.is_in(ph, pa.array(["I", "R", "B"]))).as_py():
        ph = pc.replace_substring_regex(pc.replace_substring_regex(ph, "^[IR]$", "i"),
                                        "^B$", "X")
    async_id = pc.if_else(pc.is_in(ph, pa.array(["b", "n", "e"])), t["async_id"],
                          pa.scalar(None, pa.string()))
    kinds = pa.array(job.track_kinds, type=pa.string())
    cols = {
        "eid": pa.array(eid - job.ebase), "ph": ph, "cat": t["cat"], "kind": t["kind"],
        "name": t["name"],
        "ts_ns": ts, "dur_ns": dur, "end_ns": pc.add(ts, dur),
        "pid": t["pid"], "tid": t["tid"], "pid_raw": t["pid_raw"], "tid_raw": t["tid_raw"],
        "track_id": pa.array(track.astype(np.int32)),
        "track_kind": kinds.take(pa.array(track)),
        "depth": pa.array(depth, mask=depth < 0),
        "parent_eid": pa.array(parent - job.ebase, mask=parent < 0),
        "overlaps_parent": pa.array(overlap, mask=depth < 0),
        "external_id": t["external_id"], "correlation": t["correlation"],
        "seq_nr": t["seq_nr"], "fwd_thread_id": t["fwd_thread_id"],
        "ev_idx": pc.coalesce(t["ev_idx"], t["ev_idx_old"]),
        "record_function_id": t["record_function_id"], "python_id": t["python_id"],
        "python_parent_id": t["python_parent_id"],
        "device": pc.cast(t["device"], pa.int32(), safe=False), "stream": t["stream"],
        "async_id": async_id,
    }
    flow_out, flow_in = _flow_lists(d, eid)
    cols["flow_out"], cols["flow_in"] = flow_out, flow_in
    cols["args"] = t["args"]
    out = pa.table({c.name: _cast(cols[c.name], c.type) for c in EVENTS.columns})
    _write(out, job.out_part)
    return out.num_rows


def _cast(a: pa.Array | pa.ChunkedArray, t: pa.DataType) -> pa.Array | pa.ChunkedArray:
    return a if a.type == t else pc.cast(a, t)


def _flow_lists(d: Path, eid: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """flow_out / flow_in of each event (ascending eids): the flow ids bound to it, in flow
    eid order, NULL when there are none of that direction."""
    fl_bound = _load(d, "fl_bound")
    lo = np.searchsorted(fl_bound, eid, "left")
    lens = np.searchsorted(fl_bound, eid, "right") - lo
    n_total = int(lens.sum())
    if not n_total:
        empty = pa.nulls(len(eid), pa.list_(pa.int64()))
        return empty, empty
    # the index of every bound flow of every event, events in order
    starts = np.cumsum(lens) - lens
    idx = np.repeat(lo - starts, lens) + np.arange(n_total)
    row = np.repeat(np.arange(len(eid)), lens)
    ids, valid, is_out = _load(d, "fl_id")[idx], _load(d, "fl_valid")[idx], _load(d, "fl_out")[idx]
    return (_lists(row[is_out], ids[is_out], valid[is_out], len(eid)),
            _lists(row[~is_out], ids[~is_out], valid[~is_out], len(eid)))


def _lists(row: np.ndarray, ids: np.ndarray, valid: np.ndarray, n: int) -> pa.Array:
    counts = np.bincount(row, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, mask=~valid),
                                    mask=pa.array(counts == 0))
