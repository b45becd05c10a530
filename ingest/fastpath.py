"""Columns straight from the bytes: the fast decoder for well-formed pieces.

The general decoder (msgspec into Python objects, then columns) spends most of its time
creating and walking per-event Python objects. For a piece whose events are all ordinary, a
compiled scanner (``_scan_kernel``) records byte spans and exact integer values instead, and
the columns are cut out of the piece with one gather per column: no Python object per event.

It builds the very tables ``columns.build_tables`` builds (tests compare both on every real
trace). Any piece it is not sure about (an escape in a name, a float pid, an unknown phase,
a truncated event: see ``_scan_kernel.REASONS``) returns None and goes the general way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import _scan_kernel as K
from .columns import KEY_COLUMNS, Problem, _args_keys_one, _counters, _kind_column
from .events import Event
from .kinds import EVENT_PHASES, FLOW_PHASES

# phase byte -> code: 1 event, 2 flow, 3 counter, 4 metadata, 0 not stored
_CODE = np.zeros(256, dtype=np.int8)
for _p, _c in [*((p, 1) for p in EVENT_PHASES), *((p, 2) for p in FLOW_PHASES), ("C", 3),
               ("M", 4)]:
    _CODE[ord(_p)] = _c
_ASYNC = np.zeros(256, dtype=bool)
_ASYNC[[ord("b"), ord("n"), ord("e")]] = True

_event_decoder = __import__("msgspec").json.Decoder(Event)


class Scan:
    """The per-event spans and values of one scanned piece (columns of ``_scan_kernel.F``)."""

    def __init__(self, text: bytes, buf: np.ndarray, F: np.ndarray, n: int) -> None:
        # one contiguous column per field (the kernel writes an event's fields side by side)
        self.text, self.buf, self.F, self.n = text, buf, np.ascontiguousarray(F[:n].T), n

    def strings(self, f_start: int, f_end: int, rows: np.ndarray | None = None) -> pa.Array:
        """The spans of a field as a string column (NULL where the field was absent)."""
        s, e = self.F[f_start], self.F[f_end]
        if rows is not None:
            s, e = s[rows], e[rows]
        offsets, data = K.gather(self.buf, np.ascontiguousarray(s), np.ascontiguousarray(e))
        valid = s >= 0
        mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.StringArray.from_buffers(len(s), pa.py_buffer(offsets), pa.py_buffer(data),
                                           mask)

    def ints(self, f_value: int, f_ok: int) -> pa.Array:
        ok = self.F[f_ok] != 0
        return pa.array(self.F[f_value], mask=~ok) if not ok.all() else pa.array(self.F[f_value])

    def event(self, k: int) -> Event:
        return _event_decoder.decode(self.text[self.F[K.F_START, k]:self.F[K.F_END, k]])

    def args_raw(self, k: int) -> bytes:
        s = self.F[K.F_ARGS_S, k]
        return b"" if s < 0 else self.text[s:self.F[K.F_ARGS_E, k]]


def scan(text: bytes, is_last: bool) -> tuple[Scan | None, int, int]:
    """(scan, reason, end of the array) for a piece; scan is None unless reason is OK."""
    buf = np.frombuffer(text, dtype=np.uint8)
    F = np.empty((len(text) // 64 + 1024, K.N_FIELDS), dtype=np.int64)
    n, reason, close = K.scan(buf, is_last, F)
    if reason == K.FULL:  # events of < 64 bytes on average: size the output exactly
        F = np.empty((text.count(b'"ph"') + 1, K.N_FIELDS), dtype=np.int64)
        n, reason, close = K.scan(buf, is_last, F)
    if reason != K.OK:
        return None, reason, close
    if len(buf) and buf.max() >= 0x80:
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            return None, K.BAD_JSON, close
    return Scan(text, buf, F, n), K.OK, close


def fast_tables(sc: Scan) -> tuple[dict[str, pa.Table], list[Problem], bool, float] | None:
    """``build_tables``'s result for a scanned piece, or None when an event needs the
    general path's handling (an unsupported phase, a missing ts or dur, a string flow id)."""
    n = sc.n
    if n == 0:
        return None
    F = sc.F
    ph = F[K.F_PH].astype(np.uint8)
    code = _CODE[ph]
    ts_ok, dur_ok = F[K.F_TS_OK] != 0, F[K.F_DUR_OK] != 0
    is_x = ph == ord("X")
    if ((code == 0) | ((code < 4) & ~ts_ok) | (is_x & ~dur_ok)).any() \
            or (is_x & (F[K.F_DUR] < 0)).any():
        return None
    ts_ns = F[K.F_TS]
    dur_ns = np.where(dur_ok, F[K.F_DUR], 0)
    ok_ts = ts_ns[ts_ok]
    max_abs = float(np.abs(ok_ts).max(initial=0)) / 1000
    has_fraction = bool(np.any(ok_ts % 1000 != 0))
    ords = np.arange(n, dtype=np.int64)
    problems: list[Problem] = []
    tables: dict[str, pa.Table] = {}
    ph_str = pa.array(ph.view("S1")).cast(pa.string())
    pid_raw = sc.strings(K.F_PID_S, K.F_PID_E)
    tid_raw = sc.strings(K.F_TID_S, K.F_TID_E)

    keep = code == 1
    if keep.any():
        cat = sc.strings(K.F_CAT_S, K.F_CAT_E)
        cols = {
            "ord": pa.array(ords), "ph": ph_str, "cat": cat, "kind": _kind_column(cat),
            "name": sc.strings(K.F_NAME_S, K.F_NAME_E),
            "ts_ns": pa.array(ts_ns), "dur_ns": pa.array(dur_ns),
            "pid_raw": pid_raw, "tid_raw": tid_raw,
            "pid": sc.ints(K.F_PID_V, K.F_PID_OK), "tid": sc.ints(K.F_TID_V, K.F_TID_OK),
            "async_id": sc.strings(K.F_ID_S, K.F_ID_E) if _ASYNC[ph].any()
            else pa.nulls(n, pa.string()),
        }
        nk = len(K.ARG_KEYS)
        for j, cname in enumerate(KEY_COLUMNS):
            cols[cname] = sc.ints(K.F_KEYS + j, K.F_KEYS + nk + j)
        cols["args"] = sc.strings(K.F_ARGS_S, K.F_ARGS_E)
        t = pa.table(cols)
        tables["events"] = t if keep.all() else t.filter(pa.array(keep))

    idx = np.flatnonzero(code == 2)
    if len(idx):
        if (F[K.F_ID_T][idx] == K.T_STR).any():
            return None
        take = pa.array(idx)
        ids = F[K.F_ID_V][idx]
        tables["flows"] = pa.table({
            "ord": pa.array(ords[idx]),
            "ph": ph_str.take(take),
            "cat": sc.strings(K.F_CAT_S, K.F_CAT_E, idx),
            "name": sc.strings(K.F_NAME_S, K.F_NAME_E, idx),
            "flow_id": pa.array(ids, mask=F[K.F_ID_T][idx] != K.T_INT),
            "flow_id_raw": sc.strings(K.F_ID_S, K.F_ID_E, idx),
            "ts_ns": pa.array(ts_ns[idx]),
            "pid_raw": pid_raw.take(take), "tid_raw": tid_raw.take(take),
            "bp": sc.strings(K.F_BP_S, K.F_BP_E, idx),
        })

    idx = np.flatnonzero(code == 3)
    if len(idx):
        events = {int(k): sc.event(int(k)) for k in idx}
        t = _counters(events, idx, ords, ts_ns, problems)  # type: ignore[arg-type]
        if t is not None:
            tables["counters"] = t

    idx = np.flatnonzero(code == 4)
    if len(idx):
        raws = [sc.args_raw(int(k)) for k in idx]
        vals = []
        for raw in raws:
            a = _args_keys_one(raw)  # type: ignore[arg-type]
            v = a.name if a.name is not None else (
                a.labels if a.labels is not None else a.sort_index)
            vals.append(None if v is None else str(v))
        take = pa.array(idx)
        tables["metadata_events"] = pa.table({
            "ord": pa.array(ords[idx]),
            "name": sc.strings(K.F_NAME_S, K.F_NAME_E, idx),
            "pid_raw": pid_raw.take(take), "tid_raw": tid_raw.take(take),
            "value": pa.array(vals, type=pa.string()),
            "args": pa.array([r.decode() if r else None for r in raws], type=pa.string()),
        })
    return tables, problems, has_fraction, max_abs


_SAMPLE = (b'{"ph": "X", "cat": "c", "name": "n", "pid": 1, "tid": "t", "ts": 1.5, "dur": 2, '
           b'"args": {"External id": 3, "x": [1, {"y": null}]}}, {"ph": "s", "id": 4, '
           b'"pid": 1, "tid": 1, "ts": 2, "cat": "ac2g", "name": "ac2g", "bp": "e"}')


def warm() -> None:
    """Load the compiled scanner now (numba's first call costs ~0.3 s per process): the
    ingest calls this before forking its workers, so they inherit it instead of each
    loading it."""
    sc, _, _ = scan(_SAMPLE, False)
    if sc is not None:
        fast_tables(sc)
