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

import msgspec
import numpy as np
import pyarrow as pa

from . import _scan_kernel as K
from .columns import KEY_COLUMNS, Problem, counters_table, kind_column, metadata_values
from .convert import end_out_of_range
from .events import Event
from .kinds import EVENT_PHASES, FLOW_PHASES

# phase byte -> code: 1 event, 2 flow, 3 counter, 4 metadata, 0 not stored
_CODE = np.zeros(256, dtype=np.int8)
for _p, _c in [*((p, 1) for p in EVENT_PHASES), *((p, 2) for p in FLOW_PHASES), ("C", 3),
               ("M", 4)]:
    _CODE[ord(_p)] = _c
_ASYNC = np.zeros(256, dtype=bool)
_ASYNC[[ord("b"), ord("n"), ord("e")]] = True

_event_decoder = msgspec.json.Decoder(Event)


class Scan:
    """The per-event spans and values of one scanned piece (``_scan_kernel.F``). Columns are
    read for a selection of rows (a table's events), so no table is built for all rows and
    then filtered."""

    def __init__(self, text: bytes, buf: np.ndarray, F: np.ndarray, n: int) -> None:
        # The kernel writes an event's fields side by side; one transposing copy makes each
        # field contiguous (reading ~50 fields strided would pass over the matrix each time).
        self.text, self.buf, self.n = text, buf, n
        self.F = np.ascontiguousarray(F[:n].T)

    def col(self, f: int, rows: np.ndarray | None = None) -> np.ndarray:
        """One field of the selected rows, contiguous."""
        return self.F[f] if rows is None else self.F[f][rows]

    def strings(self, f_start: int, f_end: int, rows: np.ndarray | None = None) -> pa.Array:
        """The spans of a field as a string column (NULL where the field was absent)."""
        s, e = self.col(f_start, rows), self.col(f_end, rows)
        offsets, data = K.gather(self.buf, s, e)
        valid = s >= 0
        mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.StringArray.from_buffers(len(s), pa.py_buffer(offsets), pa.py_buffer(data),
                                           mask)

    def ints(self, f_value: int, f_ok: int, rows: np.ndarray | None = None) -> pa.Array:
        values, ok = self.col(f_value, rows), self.col(f_ok, rows) != 0
        return pa.array(values) if ok.all() else pa.array(values, mask=~ok)

    def event(self, k: int) -> Event:
        return _event_decoder.decode(self.text[self.F[K.F_START, k]:self.F[K.F_END, k]])

    def args_raw(self, k: int) -> bytes:
        s = self.F[K.F_ARGS_S, k]
        return b"" if s < 0 else self.text[s:self.F[K.F_ARGS_E, k]]


def _phases(ph: np.ndarray) -> pa.Array:
    """Phase bytes -> a string column."""
    return pa.array(ph.view("S1")).cast(pa.string())


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
    general path's handling (an unsupported phase, a missing ts or dur, an end past int64
    ns, a string flow id)."""
    n = sc.n
    if n == 0:
        return None
    ph = sc.col(K.F_PH).astype(np.uint8)
    code = _CODE[ph]
    ts_ok, dur_ok = sc.col(K.F_TS_OK) != 0, sc.col(K.F_DUR_OK) != 0
    ts_ns, dur = sc.col(K.F_TS), sc.col(K.F_DUR)
    is_x = ph == ord("X")
    # (each time the scanner reads fits int64 ns: it leaves larger ones to the general
    # path; ts + dur may not)
    if ((code == 0) | ((code < 4) & ~ts_ok) | (is_x & ~dur_ok)).any() \
            or (is_x & (dur < 0)).any() \
            or ((code == 1) & ts_ok & dur_ok & end_out_of_range(ts_ns, dur)).any():
        return None
    dur_ns = np.where(dur_ok, dur, 0)
    ok_ts = ts_ns[ts_ok]
    max_abs = float(np.abs(ok_ts).max(initial=0)) / 1000
    has_fraction = bool(np.any(ok_ts % 1000 != 0))
    problems: list[Problem] = []
    tables: dict[str, pa.Table] = {}

    ev = np.flatnonzero(code == 1)
    if len(ev):
        rows = None if len(ev) == n else ev
        cat = sc.strings(K.F_CAT_S, K.F_CAT_E, rows)
        ev_ph = ph[ev]
        cols = {
            "ord": pa.array(ev.astype(np.int64)), "ph": _phases(ev_ph), "cat": cat,
            "kind": kind_column(cat), "name": sc.strings(K.F_NAME_S, K.F_NAME_E, rows),
            "ts_ns": pa.array(ts_ns[ev]), "dur_ns": pa.array(dur_ns[ev]),
            "pid_raw": sc.strings(K.F_PID_S, K.F_PID_E, rows),
            "tid_raw": sc.strings(K.F_TID_S, K.F_TID_E, rows),
            "pid": sc.ints(K.F_PID_V, K.F_PID_OK, rows),
            "tid": sc.ints(K.F_TID_V, K.F_TID_OK, rows),
            "async_id": sc.strings(K.F_ID_S, K.F_ID_E, rows) if _ASYNC[ev_ph].any()
            else pa.nulls(len(ev), pa.string()),
        }
        nk = len(K.ARG_KEYS)
        for j, cname in enumerate(KEY_COLUMNS):
            cols[cname] = sc.ints(K.F_KEYS + j, K.F_KEYS + nk + j, rows)
        cols["args"] = sc.strings(K.F_ARGS_S, K.F_ARGS_E, rows)
        tables["events"] = pa.table(cols)

    idx = np.flatnonzero(code == 2)
    if len(idx):
        id_type = sc.col(K.F_ID_T, idx)
        if (id_type == K.T_STR).any():
            return None
        tables["flows"] = pa.table({
            "ord": pa.array(idx.astype(np.int64)),
            "ph": _phases(ph[idx]),
            "cat": sc.strings(K.F_CAT_S, K.F_CAT_E, idx),
            "name": sc.strings(K.F_NAME_S, K.F_NAME_E, idx),
            "flow_id": pa.array(sc.col(K.F_ID_V, idx), mask=id_type != K.T_INT),
            "flow_id_raw": sc.strings(K.F_ID_S, K.F_ID_E, idx),
            "ts_ns": pa.array(ts_ns[idx]),
            "pid_raw": sc.strings(K.F_PID_S, K.F_PID_E, idx),
            "tid_raw": sc.strings(K.F_TID_S, K.F_TID_E, idx),
            "bp": sc.strings(K.F_BP_S, K.F_BP_E, idx),
        })

    ords = np.arange(n, dtype=np.int64)
    idx = np.flatnonzero(code == 3)
    if len(idx):
        events = {int(k): sc.event(int(k)) for k in idx}
        t = counters_table(events, idx, ords, ts_ns, problems)
        if t is not None:
            tables["counters"] = t

    idx = np.flatnonzero(code == 4)
    if len(idx):
        raws = [sc.args_raw(int(k)) for k in idx]
        tables["metadata_events"] = pa.table({
            "ord": pa.array(ords[idx]),
            "name": sc.strings(K.F_NAME_S, K.F_NAME_E, idx),
            "pid_raw": sc.strings(K.F_PID_S, K.F_PID_E, idx),
            "tid_raw": sc.strings(K.F_TID_S, K.F_TID_E, idx),
            "value": metadata_values(raws),
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
