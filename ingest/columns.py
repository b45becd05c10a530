"""Decoded events of one piece -> Arrow tables (events, flows, counters, metadata_events).

This is the per-event hot path, so it works column-wise: fields are transposed with
``attrgetter`` + ``zip`` (C loops), numbers converted with numpy, and the raw ``args`` texts
concatenated into one Arrow string buffer without a Python-level copy per event.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

import msgspec
import numpy as np
import pyarrow as pa

from .convert import (
    EXACT_FLOAT_US,
    TIME_BAD,
    TIME_OK,
    end_out_of_range,
    end_problem,
    id_to_int64,
    int64_column,
    int_column,
    raw_text_column,
    time_problem,
    us_column_to_ns,
)
from .events import ArgKeys, Event, EventArgKeys, TextTimeEvent
from .kinds import EVENT_PHASES, FLOW_PHASES, KIND_OF_CAT, OTHER

_texttimes_decoder = msgspec.json.Decoder(list[TextTimeEvent])
_texttime_decoder = msgspec.json.Decoder(TextTimeEvent)


def _raw_text(r: msgspec.Raw) -> str | None:
    return bytes(r).decode() if len(r) else None


def time_texts_of_array(body: bytes) -> tuple[list, list]:
    """ts and dur of every element of a JSON array of events, as their text."""
    tt = _texttimes_decoder.decode(body)
    return [_raw_text(t.ts) for t in tt], [_raw_text(t.dur) for t in tt]


def time_texts_of_event(text: bytes) -> tuple[str | None, str | None]:
    t = _texttime_decoder.decode(text)
    return _raw_text(t.ts), _raw_text(t.dur)
_args_decoder = msgspec.json.Decoder(ArgKeys)
_any_decoder = msgspec.json.Decoder()

_EVENT_FIELDS = attrgetter("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")
KEY_COLUMNS = ("external_id", "correlation", "seq_nr", "fwd_thread_id", "ev_idx",
               "ev_idx_old", "record_function_id", "python_id", "python_parent_id", "device",
               "stream")
_KEY_FIELDS = attrgetter(*KEY_COLUMNS)
_NO_KEYS = ArgKeys()
# phase code: 1 event, 2 flow, 3 counter, 4 metadata, 0 not stored
_PH_CODE = {**{p: 1 for p in EVENT_PHASES}, **{p: 2 for p in FLOW_PHASES}, "C": 3, "M": 4}


class Problem:
    """An event the tables could not take (or took with a note), by position in the piece."""

    __slots__ = ("index", "issue", "detail", "quarantined")

    def __init__(self, index: int, issue: str, detail: str, quarantined: bool) -> None:
        self.index, self.issue, self.detail, self.quarantined = index, issue, detail, quarantined


def raw_json_column(raws: tuple) -> pa.Array:
    """msgspec.Raw values -> a string array (NULL where absent), joined in one C call."""
    n = len(raws)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = b"".join(raws)
    valid = np.packbits(lens > 0, bitorder="little")
    arr = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data),
                                           pa.py_buffer(valid))
    return arr.cast(pa.string())


def _key_columns(events: list[Event], argkeys: list[EventArgKeys] | None) -> list[tuple]:
    if argkeys is not None:
        rows = [a.args or _NO_KEYS for a in argkeys]
    else:
        rows = [args_keys(e.args) for e in events]
    return list(zip(*map(_KEY_FIELDS, rows), strict=True)) if rows else [()] * len(KEY_COLUMNS)


def args_keys(raw: msgspec.Raw | bytes) -> ArgKeys:
    """The typed join keys of one event's raw args (none when args is not an object)."""
    if not len(raw):
        return _NO_KEYS
    try:
        return _args_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass
    try:
        obj = _any_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # (too deep: no keys; args kept as text)
        return _NO_KEYS
    if not isinstance(obj, dict):
        return _NO_KEYS
    vals = {}
    for fname, key in zip(ArgKeys.__struct_fields__, ArgKeys.__struct_encode_fields__,
                          strict=True):
        v = obj.get(key)
        vals[fname] = v if isinstance(v, int | float | str) and not isinstance(v, bool) else None
    return ArgKeys(**vals)


def kind_column(cat: pa.Array) -> pa.Array:
    """The normalized kind of each category (``kinds.KIND_OF_CAT``)."""
    enc = cat.dictionary_encode()
    kinds = pa.array([KIND_OF_CAT.get(c, OTHER) for c in enc.dictionary.to_pylist()],
                     type=pa.string())
    out = kinds.take(enc.indices)
    return out.fill_null(OTHER) if out.null_count else out


def build_tables(
    events: list[Event],
    ordinals: list[int] | None,
    argkeys: list[EventArgKeys] | None,
    time_texts: Callable[[], tuple[list, list] | None],
) -> tuple[dict[str, pa.Table], list[Problem], bool, float]:
    """Returns (tables, problems, any fractional ts, max |ts| in us).

    ``time_texts`` gives every event's ts and dur text, or None when the piece has no
    fractional value too large for a double; it is only called when a ts is that large.
    """
    n = len(events)
    problems: list[Problem] = []
    if n == 0:
        return {}, problems, False, 0.0
    ords = (np.arange(n, dtype=np.int64) if ordinals is None
            else np.array(ordinals, dtype=np.int64))
    ph, cat, name, pid, tid, ts_v, dur_v, raws = zip(*map(_EVENT_FIELDS, events), strict=True)
    ph_enc = pa.array(ph, type=pa.string()).dictionary_encode()
    phases = [p[:1] for p in ph_enc.dictionary.to_pylist()]
    if any(len(p) != 1 for p in ph_enc.dictionary.to_pylist()):
        ph = tuple(p[:1] for p in ph)
    idx = ph_enc.indices.to_numpy(zero_copy_only=False)
    code = np.array([_PH_CODE.get(p, 0) for p in phases], dtype=np.int8)[idx]
    is_x = np.array([p == "X" for p in phases], dtype=bool)[idx]

    ts_ns, ts_st = us_column_to_ns(ts_v)
    dur_ns, dur_st = us_column_to_ns(dur_v)
    has_fraction, max_abs = _ts_stats(ts_v, ts_ns, ts_st == TIME_OK)
    if max_abs >= EXACT_FLOAT_US:
        # epoch us with ns decimals (2024-03/04) do not fit a double: read their text
        texts = time_texts()
        if texts is not None:
            ts_v, dur_v = texts
            ts_ns, ts_st = us_column_to_ns(ts_v)
            dur_ns, dur_st = us_column_to_ns(dur_v)
            has_fraction = True
    ts_ok, dur_ok = ts_st == TIME_OK, dur_st == TIME_OK

    # what cannot be stored: unknown phases, no usable ts, a time outside int64 ns (ts, dur
    # or their sum), negative complete durations
    timed = (code > 0) & (code < 4)
    missing_ts = timed & ~ts_ok
    bad_dur = (code == 1) & (dur_st == TIME_BAD)
    bad_end = (code == 1) & ts_ok & dur_ok & end_out_of_range(ts_ns, dur_ns)
    neg_dur = is_x & dur_ok & (dur_ns < 0)
    bad = (code == 0) | missing_ts | bad_dur | bad_end | neg_dur
    for k in np.flatnonzero(bad):
        e = events[k]
        if code[k] == 0:
            issue, detail = "unsupported_phase", f"phase {e.ph!r} is not stored ({e.name!r})"
            if not e.ph:
                issue, detail = "empty_event", "event has no ph (e.g. an empty {} sentinel)"
        elif missing_ts[k] and ts_st[k] == TIME_BAD:
            issue, detail = "bad_time", time_problem("ts", ts_v[k])
        elif missing_ts[k]:
            issue, detail = "missing_ts", f"ph {e.ph!r} event without a usable ts ({e.ts!r})"
        elif bad_dur[k]:
            issue, detail = "bad_time", time_problem("dur", dur_v[k])
        elif bad_end[k]:
            issue, detail = "bad_time", end_problem(ts_v[k], dur_v[k])
        else:
            issue, detail = "negative_dur", f"complete event with negative dur {e.dur!r}"
        problems.append(Problem(int(k), issue, detail, True))
    for k in np.flatnonzero(is_x & ~dur_ok & ~bad):
        problems.append(Problem(int(k), "missing_dur",
                                "complete event without dur; stored with dur 0", False))
    dur_ns = np.where(dur_ok & ~neg_dur, dur_ns, 0)
    good = ~bad
    tables: dict[str, pa.Table] = {}
    pid_raw, tid_raw = raw_text_column(list(pid)), raw_text_column(list(tid))

    keep = good & (code == 1)
    if keep.any():
        keys = _key_columns(events, argkeys)
        cat_arr = pa.array(cat, type=pa.string())
        cols = {
            "ord": pa.array(ords), "ph": pa.array(ph, type=pa.string()), "cat": cat_arr,
            "kind": kind_column(cat_arr), "name": pa.array(name, type=pa.string()),
            "ts_ns": pa.array(ts_ns), "dur_ns": pa.array(dur_ns),
            "pid_raw": pid_raw, "tid_raw": tid_raw,
            "pid": int_column(pid), "tid": int_column(tid),
            "async_id": raw_text_column([e.id for e in events]) if
            any(p in "bne" for p in set(ph)) else pa.nulls(n, pa.string()),
        }
        for cname, vals in zip(KEY_COLUMNS, keys, strict=True):
            arr, overflow = int64_column(list(vals))
            for k in overflow:
                if keep[k]:
                    problems.append(Problem(int(k), "value_out_of_range",
                                            f"args {cname} = {vals[k]!r} does not fit int64; "
                                            "NULL in its column, kept in args", False))
            cols[cname] = arr
        cols["args"] = raw_json_column(raws)
        t = pa.table(cols)
        tables["events"] = t if keep.all() else t.filter(pa.array(keep))

    idx = np.flatnonzero(good & (code == 2))
    if len(idx):
        ids = [events[k].id for k in idx]
        take = pa.array(idx)
        tables["flows"] = pa.table({
            "ord": pa.array(ords[idx]),
            "ph": pa.array([ph[k] for k in idx], type=pa.string()),
            "cat": pa.array([cat[k] for k in idx], type=pa.string()),
            "name": pa.array([name[k] for k in idx], type=pa.string()),
            "flow_id": pa.array([id_to_int64(v) for v in ids], type=pa.int64()),
            "flow_id_raw": raw_text_column(ids),
            "ts_ns": pa.array(ts_ns[idx]),
            "pid_raw": pid_raw.take(take), "tid_raw": tid_raw.take(take),
            "bp": pa.array([events[k].bp for k in idx], type=pa.string()),
        })

    idx = np.flatnonzero(good & (code == 3))
    if len(idx):
        t = counters_table(events, idx, ords, ts_ns, problems)
        if t is not None:
            tables["counters"] = t

    idx = np.flatnonzero(code == 4)
    if len(idx):
        take = pa.array(idx)
        tables["metadata_events"] = pa.table({
            "ord": pa.array(ords[idx]),
            "name": pa.array([name[k] for k in idx], type=pa.string()),
            "pid_raw": pid_raw.take(take), "tid_raw": tid_raw.take(take),
            "value": metadata_values([raws[k] for k in idx]),
            "args": raw_json_column(tuple(raws[k] for k in idx)),
        })
    return tables, problems, has_fraction, max_abs


def metadata_values(raws: list) -> pa.Array:
    """The value of each metadata event: its args' name, labels or sort_index, as text."""
    vals = []
    for raw in raws:
        a = args_keys(raw)
        v = a.name if a.name is not None else (
            a.labels if a.labels is not None else a.sort_index)
        vals.append(None if v is None else str(v))
    return pa.array(vals, type=pa.string())


def _ts_stats(ts_v: tuple, ts_ns: np.ndarray, ts_ok: np.ndarray) -> tuple[bool, float]:
    """(any ts with a fraction of a microsecond, max |ts| in us) of a piece."""
    ok_ns = ts_ns[ts_ok]
    max_abs = float(np.abs(ok_ns).max(initial=0)) / 1000
    has_fraction = bool(np.any(ok_ns % 1000 != 0))
    if not has_fraction and str in set(map(type, ts_v)):
        has_fraction = any("." in v for v in ts_v if type(v) is str)
    return has_fraction, max_abs


def counters_table(events: list[Event] | dict[int, Event], idx: np.ndarray, ords: np.ndarray,
                   ts_ns: np.ndarray, problems: list[Problem]) -> pa.Table | None:
    """One row per numeric series of each counter event (``ph`` C) at positions idx."""
    rows: dict[str, list] = {k: [] for k in ("ord", "name", "series", "counter_id", "pid_raw",
                                             "ts_ns", "value")}
    for k in idx:
        e = events[k]
        try:
            obj = _any_decoder.decode(e.args) if len(e.args) else {}
        except (msgspec.DecodeError, RecursionError):
            obj = None
        series = [(key, _num(v)) for key, v in obj.items()] if isinstance(obj, dict) else []
        series = [(key, v) for key, v in series if v is not None]
        if not series:
            problems.append(Problem(int(k), "bad_counter",
                                    "counter event without a numeric series in args", True))
            continue
        for key, v in series:
            rows["ord"].append(int(ords[k]))
            rows["name"].append(e.name)
            rows["series"].append(key)
            rows["counter_id"].append(None if e.id is None else str(e.id))
            rows["pid_raw"].append(None if e.pid is None else str(e.pid))
            rows["ts_ns"].append(int(ts_ns[k]))
            rows["value"].append(v)
    if not rows["ord"]:
        return None
    return pa.table({
        "ord": pa.array(rows["ord"], type=pa.int64()),
        "name": pa.array(rows["name"], type=pa.string()),
        "series": pa.array(rows["series"], type=pa.string()),
        "counter_id": pa.array(rows["counter_id"], type=pa.string()),
        "pid_raw": pa.array(rows["pid_raw"], type=pa.string()),
        "ts_ns": pa.array(rows["ts_ns"], type=pa.int64()),
        "value": pa.array(rows["value"], type=pa.float64()),
    })


def _num(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None
