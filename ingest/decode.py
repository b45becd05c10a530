"""Decode one piece of the traceEvents array into Arrow tables (runs in worker processes).

A piece is a run of whole events cut from the array at a ``}, {`` boundary. The fast path
decodes it in one msgspec call. When that fails (a cut that fell inside a nested object,
invalid JSON, an unexpected field type, the file's end) the lenient path splits the piece at
every candidate boundary, re-joins fragments that do not parse alone, repairs the known kinds
of broken JSON (bad escapes, raw control characters, unescaped quotes, a missing value) and
quarantines what it cannot read, counting everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .convert import (
    EXACT_FLOAT_US,
    id_to_int64,
    int64_column,
    raw_text_column,
    text_us_to_ns,
    to_int,
    us_column_to_ns,
)
from .events import (
    ARG_KEY_FIELDS,
    EMPTY_RAW,
    ArgKeys,
    Event,
    EventArgKeys,
    LooseEvent,
    TextTimeEvent,
)

BOUNDARY = re.compile(rb"\}\s*,\s*\{")
# A timestamp of 14+ integer digits with decimals: absolute epoch us with ns (2024-03/04 era),
# which a double cannot hold exactly.
LONG_FRACTIONAL_TS = re.compile(rb'"(?:ts|dur)"\s*:\s*"?-?\d{14,}\.\d')
ERROR_AT = re.compile(r"\(byte (\d+)\)")
MAX_JOIN = 64
MAX_REPAIRS = 50

_events_decoder = msgspec.json.Decoder(list[Event])
_argkeys_decoder = msgspec.json.Decoder(list[EventArgKeys])
_texttime_decoder = msgspec.json.Decoder(list[TextTimeEvent])
_event_decoder = msgspec.json.Decoder(Event)
_loose_decoder = msgspec.json.Decoder(LooseEvent)
_args_decoder = msgspec.json.Decoder(ArgKeys)
_any_decoder = msgspec.json.Decoder()

EVENT_PHASES = {"X", "B", "E", "i", "I", "R", "b", "n", "e"}
FLOW_PHASES = {"s", "t", "f"}


@dataclass
class Issue:
    ordinal: int | None
    offset: int | None
    issue: str
    detail: str
    quarantined: bool
    snippet: str | None = None


@dataclass
class PieceResult:
    """What a worker hands back for one piece: tables, counts and unresolved edges."""

    n_read: int = 0
    n_quarantined: int = 0
    tables: dict[str, pa.Table] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)
    head_fragment: bytes = b""
    tail_fragment: bytes = b""
    trailer: bytes | None = None
    array_closed: bool = False
    truncated: bool = False
    has_fraction: bool = False
    max_abs_ts_us: float = 0.0


# --------------------------------------------------------------------------- splitting


def _error_kind(err: Exception) -> tuple[str, int | None]:
    msg = str(err)
    m = ERROR_AT.search(msg)
    pos = int(m.group(1)) if m else None
    if "truncated" in msg:
        return "truncated", pos
    if "trailing characters" in msg:
        return "trailing", pos
    if isinstance(err, msgspec.ValidationError):
        return "type", pos
    return "malformed", pos


def _repair(text: bytes, err: Exception) -> bytes | None:
    """Fix the one problem msgspec reported, or None when it is not a known kind."""
    msg = str(err)
    m = ERROR_AT.search(msg)
    if not m:
        return None
    p = int(m.group(1))
    if p >= len(text):
        return None
    # msgspec's offset is at or just past the offending byte
    for q in (p, p - 1):
        if 0 <= q < len(text) and text[q] < 0x20 and "invalid character" in msg:
            return text[:q] + b"\\u%04x" % text[q] + text[q + 1 :]
    c = text[p : p + 1]
    if "invalid escape" in msg:
        b = text.rfind(b"\\", 0, p + 1)
        if b >= 0:
            return text[:b] + b"\\" + text[b:]
        return None
    if "invalid character" in msg and c in (b",", b"}", b"]"):
        before = text[:p].rstrip()
        if before.endswith(b":"):
            return text[:p] + b"null" + text[p:]
        if before.endswith(b",") and c in (b"}", b"]"):  # trailing comma
            k = len(before) - 1
            return text[:k] + text[k + 1 :]
    if ("expected ','" in msg or "expected ':'" in msg) and p > 0:
        # "a "quoted" word": the string ended early at an unescaped quote; escape it.
        q = text[:p].rstrip()
        if q.endswith(b'"'):
            k = len(q) - 1
            return text[:k] + b"\\" + text[k:]
    return None


def decode_one(text: bytes) -> tuple[Event | None, str | None, bool]:
    """One event's text -> (event, problem, repaired). Tries repairs, then loose types."""
    repaired = False
    for _ in range(MAX_REPAIRS):
        try:
            return _event_decoder.decode(text), None, repaired
        except msgspec.ValidationError:
            return _loose_to_event(text, repaired)
        except msgspec.DecodeError as err:
            fixed = _repair(text, err)
            if fixed is None:
                why = str(err).removeprefix("JSON is malformed: ")
                return None, f"invalid JSON: {why}", repaired
            text, repaired = fixed, True
    return None, "invalid JSON: too many problems to repair", repaired


def _loose_to_event(text: bytes, repaired: bool) -> tuple[Event | None, str | None, bool]:
    try:
        obj = _any_decoder.decode(text)
    except msgspec.DecodeError as err:
        return None, f"invalid JSON: {err}", repaired
    if not isinstance(obj, dict):
        return None, f"not an object: {type(obj).__name__}", repaired
    loose = _loose_decoder.decode(text)

    def s(v: object) -> str | None:
        if v is None:
            return None
        if isinstance(v, str):
            return v
        return msgspec.json.encode(v).decode()

    def num(v: object) -> float | str | None:
        if v is None or isinstance(v, str) or isinstance(v, bool):
            return v if isinstance(v, str) else None
        if isinstance(v, int | float):
            return float(v) if isinstance(v, float) or abs(v) < 2**53 else str(v)
        return None

    def pid(v: object) -> int | str | None:
        if v is None or isinstance(v, int | str) and not isinstance(v, bool):
            return v  # type: ignore[return-value]
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return s(v)

    ev = Event(
        ph=s(loose.ph) or "", cat=s(loose.cat), name=s(loose.name), pid=pid(loose.pid),
        tid=pid(loose.tid), ts=num(loose.ts), dur=num(loose.dur),
        id=pid(loose.id), bp=s(loose.bp), s=s(loose.s), args=loose.args,
    )
    if loose.ts is not None and ev.ts is None:
        return None, f"bad field type: ts is {type(loose.ts).__name__}", repaired
    return ev, None, True


@dataclass
class _Lenient:
    events: list[Event]
    ordinals: list[int]
    issues: list[Issue]
    n_read: int
    head: bytes
    tail: bytes
    trailer: bytes | None
    closed: bool


def split_lenient(text: bytes, base_offset: int, is_first: bool, is_last: bool) -> _Lenient:
    """Split a piece at every candidate boundary and decode event by event."""
    starts = [0] + [m.start() + 1 for m in BOUNDARY.finditer(text)]
    ends = [m.start() + 1 for m in BOUNDARY.finditer(text)] + [len(text)]
    # segment i is text[starts[i]:ends[i]] minus the separator
    segs = []
    for a, b in zip(starts, ends, strict=True):
        seg_start = a
        if a > 0:  # skip the ", {" separator's comma and whitespace, keep the brace
            j = text.find(b"{", a)
            seg_start = j
        segs.append((seg_start, b))
    out = _Lenient([], [], [], 0, b"", b"", None, False)
    i = 0
    n = len(segs)
    first_event_seen = False
    while i < n:
        a, b = segs[i]
        j = i
        chunk = text[a:b]
        while True:
            stripped = chunk.strip()
            if stripped.startswith(b","):
                stripped = stripped[1:].lstrip()
            try:
                _ = msgspec.json.decode(stripped) if stripped else None
                kind, pos = "ok", None
            except msgspec.DecodeError as err:
                kind, pos = _error_kind(err)
            if kind == "truncated" and j + 1 < n and j - i < MAX_JOIN:
                j += 1
                chunk = text[a : segs[j][1]]
                continue
            break
        lead = len(chunk) - len(chunk.lstrip())
        off = base_offset + a + lead
        if kind == "ok" and not stripped:
            i = j + 1
            continue
        if kind == "trailing" and pos is not None:
            pos = _object_end(stripped, pos)
            rest = stripped[pos:].lstrip()
            if rest.startswith(b","):
                rest = rest[1:].lstrip()
            if rest.startswith(b"]") and (is_last or j == n - 1):
                obj_text = stripped[:pos]
                _emit(out, obj_text, off)
                out.closed = True
                after = stripped[pos:].lstrip()
                after = after[1:].lstrip() if after.startswith(b",") else after
                out.trailer = after[1:]
                return out
            if not first_event_seen and not is_first:
                out.head += stripped[:pos]
                rest_text = stripped[pos:].lstrip()
                if rest_text.startswith(b","):
                    rest_text = rest_text[1:]
                # what follows the fragment is re-split as a new segment
                text = text[: a] + b" " * (len(chunk) - len(rest_text)) + rest_text + text[
                    segs[j][1] :
                ]
                return _reslice(out, text, base_offset, a + len(chunk) - len(rest_text), is_last)
        if kind == "truncated":
            # Runs to the end of the piece without closing: the next piece finishes it, or,
            # in the last piece, the file was cut here.
            if j == n - 1 and j - i < MAX_JOIN:
                out.tail = stripped
                return out
            # could not join within bounds: this segment alone is broken
            j = i
            chunk = text[a:b]
            stripped = chunk.strip()
        _emit(out, stripped, off)
        first_event_seen = True
        i = j + 1
    return out


def _object_end(text: bytes, pos: int) -> int:
    """Where the leading JSON object of text ends, given msgspec's trailing-characters
    offset (which points at, or just past, the first byte after it)."""
    return text.rfind(b"}", 0, pos) + 1


def _reslice(out: _Lenient, text: bytes, base_offset: int, start: int, is_last: bool) -> _Lenient:
    rest = split_lenient(text[start:], base_offset + start, True, is_last)
    out.events += rest.events
    out.ordinals += [o + out.n_read for o in rest.ordinals]
    for iss in rest.issues:
        if iss.ordinal is not None:
            iss.ordinal += out.n_read
    out.issues += rest.issues
    out.n_read += rest.n_read
    out.tail, out.trailer, out.closed = rest.tail, rest.trailer, rest.closed
    return out


def _emit(out: _Lenient, obj_text: bytes, offset: int) -> None:
    ordinal = out.n_read
    out.n_read += 1
    ev, problem, repaired = decode_one(obj_text)
    snippet = obj_text[:200].decode("utf-8", "replace")
    if ev is None:
        issue = "not_an_object" if problem and problem.startswith("not an object") else (
            "bad_field_type" if problem and problem.startswith("bad field") else "invalid_json")
        out.issues.append(Issue(ordinal, offset, issue, problem or "", True, snippet))
        return
    if repaired:
        out.issues.append(Issue(ordinal, offset, "repaired_json",
                                "invalid JSON or field types repaired; event kept", False, snippet))
    out.events.append(ev)
    out.ordinals.append(ordinal)


# --------------------------------------------------------------------------- decoding


def decode_piece(text: bytes, base_offset: int, is_first: bool, is_last: bool) -> PieceResult:
    """Decode a piece of the event array; the last piece also yields the trailer text."""
    res = PieceResult()
    events: list[Event] | None = None
    argkeys: list[EventArgKeys] | None = None
    body = b"[" + text + (b"" if is_last else b"]")
    try:
        events = _events_decoder.decode(body)
        if is_last:
            res.array_closed = True
            res.trailer = b""
    except msgspec.DecodeError as err:
        kind, pos = _error_kind(err)
        if is_last and kind == "trailing" and pos is not None:
            # msgspec may report the offset past a separator; the array ends at the last ]
            end = body.rfind(b"]", 0, pos + 1) + 1
            try:
                events = _events_decoder.decode(body[:end])
                res.array_closed = True
                res.trailer = body[end:]
                body = body[:end]
            except msgspec.DecodeError:
                events = None
    if events is not None:
        try:
            argkeys = _argkeys_decoder.decode(body)
        except msgspec.DecodeError:
            argkeys = None
        ordinals = None
        res.n_read = len(events)
        texttime = body if LONG_FRACTIONAL_TS.search(body) else None
    else:
        lenient = split_lenient(text, base_offset, is_first, is_last)
        events, ordinals = lenient.events, lenient.ordinals
        res.issues = lenient.issues
        res.n_read = lenient.n_read
        res.head_fragment, res.tail_fragment = lenient.head, lenient.tail
        res.trailer, res.array_closed = lenient.trailer, lenient.closed
        if is_last and not lenient.closed:
            res.truncated = True
        texttime = None
    _build_tables(res, events, ordinals, argkeys, texttime)
    res.n_quarantined = sum(1 for i in res.issues if i.quarantined)
    return res


def _arg_key_rows(events: list[Event], argkeys: list[EventArgKeys] | None) -> list[ArgKeys | None]:
    if argkeys is not None:
        return [a.args for a in argkeys]
    rows: list[ArgKeys | None] = []
    for e in events:
        raw = e.args
        if raw is EMPTY_RAW or not len(raw):
            rows.append(None)
            continue
        try:
            rows.append(_args_decoder.decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            try:
                obj = _any_decoder.decode(raw)
            except msgspec.DecodeError:
                rows.append(None)
                continue
            if not isinstance(obj, dict):
                rows.append(None)
                continue
            vals = {}
            for fname in ARG_KEY_FIELDS:
                key = ArgKeys.__struct_encode_fields__[ArgKeys.__struct_fields__.index(fname)]
                v = obj.get(key)
                vals[fname] = v if isinstance(v, int | float | str) else None
            rows.append(ArgKeys(**vals))
    return rows


def _text_times(body: bytes, n: int) -> tuple[list, list]:
    tt = _texttime_decoder.decode(body)
    assert len(tt) == n
    ts = [bytes(t.ts).decode() if len(t.ts) else None for t in tt]
    dur = [bytes(t.dur).decode() if len(t.dur) else None for t in tt]
    return ts, dur


def _build_tables(
    res: PieceResult,
    events: list[Event],
    ordinals: list[int] | None,
    argkeys: list[EventArgKeys] | None,
    texttime: bytes | None,
) -> None:
    n = len(events)
    ords = np.arange(n, dtype=np.int64) if ordinals is None else np.array(ordinals, dtype=np.int64)
    ph = [e.ph if len(e.ph) == 1 else e.ph[:1] for e in events]
    ts_vals = [e.ts for e in events]
    dur_vals = [e.dur for e in events]
    if texttime is not None:
        ts_text, dur_text = _text_times(texttime, n)
        ts_ns = np.array([text_us_to_ns(t) if t else 0 for t in ts_text], dtype=np.int64)
        ts_ok = np.array([t is not None for t in ts_text], dtype=bool)
        dur_ns = np.array([text_us_to_ns(t) if t else 0 for t in dur_text], dtype=np.int64)
        dur_ok = np.array([t is not None for t in dur_text], dtype=bool)
    else:
        ts_ns, ts_ok = us_column_to_ns(ts_vals)
        dur_ns, dur_ok = us_column_to_ns(dur_vals)
    float_ts = [v for v in ts_vals if isinstance(v, float)]
    if float_ts:
        arr = np.abs(np.array(float_ts))
        res.max_abs_ts_us = float(arr.max())
        res.has_fraction = bool(np.any(arr != np.floor(arr)))
        if res.max_abs_ts_us >= EXACT_FLOAT_US and texttime is None and res.has_fraction:
            # Should have been caught by LONG_FRACTIONAL_TS; be exact regardless.
            ts_ns = np.array([text_us_to_ns(repr(v)) or 0 for v in ts_vals], dtype=np.int64)
    str_ts = [v for v in ts_vals if isinstance(v, str)]
    if str_ts:
        res.has_fraction = res.has_fraction or any("." in v for v in str_ts)
        nums = [abs(ns) / 1000 for ns, ok in zip(ts_ns.tolist(), ts_ok.tolist(), strict=True) if ok]
        res.max_abs_ts_us = max([res.max_abs_ts_us, *nums]) if nums else res.max_abs_ts_us
    if texttime is not None:
        res.has_fraction = True
        res.max_abs_ts_us = max(res.max_abs_ts_us, float(np.abs(ts_ns).max(initial=0)) / 1000)

    ph_arr = pa.array(ph, type=pa.string())
    is_event = pc.is_in(ph_arr, value_set=pa.array(sorted(EVENT_PHASES))).to_numpy(False)
    is_flow = pc.is_in(ph_arr, value_set=pa.array(sorted(FLOW_PHASES))).to_numpy(False)
    is_counter = pc.equal(ph_arr, "C").to_numpy(False)
    is_meta = pc.equal(ph_arr, "M").to_numpy(False)
    need_ts = is_event | is_flow | is_counter
    missing_ts = need_ts & ~ts_ok
    is_x = pc.equal(ph_arr, "X").to_numpy(False)
    neg_dur = is_x & dur_ok & (dur_ns < 0)
    bad = missing_ts | neg_dur
    unsupported = ~(is_event | is_flow | is_counter | is_meta)
    for k in np.flatnonzero(unsupported | bad):
        e = events[k]
        if unsupported[k]:
            issue, detail = "unsupported_phase", f"phase {e.ph!r} is not stored ({e.name!r})"
            if not e.ph:
                issue, detail = "empty_event", "event has no ph (e.g. an empty {} sentinel)"
        elif missing_ts[k]:
            issue, detail = "missing_ts", f"ph {e.ph!r} event without a usable ts ({e.ts!r})"
        else:
            issue, detail = "negative_dur", f"complete event with negative dur {e.dur!r}"
        res.issues.append(Issue(int(ords[k]), None, issue, detail, True, None))
    # X events without dur are kept with dur 0 and noted
    no_dur = is_x & ~dur_ok & ~bad
    for k in np.flatnonzero(no_dur):
        res.issues.append(Issue(int(ords[k]), None, "missing_dur",
                                "complete event without dur; stored with dur 0", False))
    dur_ns = np.where(dur_ok & ~neg_dur, dur_ns, 0)

    keep_event = is_event & ~bad
    keep_flow = is_flow & ~bad
    keep_counter = is_counter & ~bad

    arg_rows = _arg_key_rows(events, argkeys)
    args_text = [bytes(e.args) if len(e.args) else None for e in events]
    base = {
        "ord": pa.array(ords),
        "ph": ph_arr,
        "cat": pa.array([e.cat for e in events], type=pa.string()),
        "name": pa.array([e.name for e in events], type=pa.string()),
        "ts_ns": pa.array(ts_ns),
        "dur_ns": pa.array(dur_ns),
        "pid_raw": raw_text_column([e.pid for e in events]),
        "tid_raw": raw_text_column([e.tid for e in events]),
        "args": pa.array(args_text, type=pa.binary()).cast(pa.string()),
    }
    pids, _ = int64_column([to_int(e.pid) if not isinstance(e.pid, int) else e.pid
                            for e in events])
    tids, _ = int64_column([to_int(e.tid) if not isinstance(e.tid, int) else e.tid
                            for e in events])

    if keep_event.any():
        cols = dict(base)
        cols["pid"], cols["tid"] = pids, tids
        cols["async_id"] = raw_text_column([e.id for e in events])
        for fname in ARG_KEY_FIELDS:
            if fname in ("name", "labels", "sort_index"):
                continue
            vals = [None if a is None else getattr(a, fname) for a in arg_rows]
            arr, overflow = int64_column(vals)
            for k in overflow:
                if keep_event[k]:
                    res.issues.append(Issue(int(ords[k]), None, "value_out_of_range",
                                            f"args {fname} = {vals[k]!r} does not fit int64; "
                                            "NULL in its column, kept in args", False))
            cols[fname] = arr
        res.tables["events"] = pa.table(cols).filter(pa.array(keep_event))

    if keep_flow.any():
        idx = np.flatnonzero(keep_flow)
        ids = [events[k].id for k in idx]
        res.tables["flows"] = pa.table({
            "ord": pa.array(ords[idx]),
            "ph": pa.array([ph[k] for k in idx], type=pa.string()),
            "cat": pa.array([events[k].cat for k in idx], type=pa.string()),
            "name": pa.array([events[k].name for k in idx], type=pa.string()),
            "flow_id": pa.array([id_to_int64(v) for v in ids], type=pa.int64()),
            "flow_id_raw": raw_text_column(ids),
            "ts_ns": pa.array(ts_ns[idx]),
            "pid_raw": base["pid_raw"].take(pa.array(idx)),
            "tid_raw": base["tid_raw"].take(pa.array(idx)),
            "bp": pa.array([events[k].bp for k in idx], type=pa.string()),
        })

    if keep_counter.any():
        rows: dict[str, list] = {k: [] for k in
                                 ("ord", "name", "series", "counter_id", "pid_raw", "ts_ns",
                                  "value")}
        for k in np.flatnonzero(keep_counter):
            e = events[k]
            try:
                obj = _any_decoder.decode(e.args) if len(e.args) else {}
            except msgspec.DecodeError:
                obj = None
            if not isinstance(obj, dict):
                res.issues.append(Issue(int(ords[k]), None, "bad_counter",
                                        "counter event whose args is not an object", True))
                keep_counter[k] = False
                continue
            series = [(key, _num(v)) for key, v in obj.items()]
            series = [(key, v) for key, v in series if v is not None]
            if not series:
                res.issues.append(Issue(int(ords[k]), None, "bad_counter",
                                        "counter event with no numeric series", True))
                keep_counter[k] = False
                continue
            for key, v in series:
                rows["ord"].append(int(ords[k]))
                rows["name"].append(e.name)
                rows["series"].append(key)
                rows["counter_id"].append(None if e.id is None else str(e.id))
                rows["pid_raw"].append(None if e.pid is None else str(e.pid))
                rows["ts_ns"].append(int(ts_ns[k]))
                rows["value"].append(v)
        if rows["ord"]:
            res.tables["counters"] = pa.table({
                "ord": pa.array(rows["ord"], type=pa.int64()),
                "name": pa.array(rows["name"], type=pa.string()),
                "series": pa.array(rows["series"], type=pa.string()),
                "counter_id": pa.array(rows["counter_id"], type=pa.string()),
                "pid_raw": pa.array(rows["pid_raw"], type=pa.string()),
                "ts_ns": pa.array(rows["ts_ns"], type=pa.int64()),
                "value": pa.array(rows["value"], type=pa.float64()),
            })

    if is_meta.any():
        idx = np.flatnonzero(is_meta)
        vals = []
        for k in idx:
            a = arg_rows[k]
            v = None if a is None else (a.name if a.name is not None else
                                        a.labels if a.labels is not None else a.sort_index)
            vals.append(None if v is None else str(v))
        res.tables["metadata_events"] = pa.table({
            "ord": pa.array(ords[idx]),
            "name": pa.array([events[k].name for k in idx], type=pa.string()),
            "pid_raw": base["pid_raw"].take(pa.array(idx)),
            "tid_raw": base["tid_raw"].take(pa.array(idx)),
            "value": pa.array(vals, type=pa.string()),
            "args": base["args"].take(pa.array(idx)),
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


def issues_table(issues: list[Issue]) -> pa.Table:
    return pa.table({
        "ord": pa.array([i.ordinal for i in issues], type=pa.int64()),
        "byte_offset": pa.array([i.offset for i in issues], type=pa.int64()),
        "issue": pa.array([i.issue for i in issues], type=pa.string()),
        "detail": pa.array([i.detail for i in issues], type=pa.string()),
        "quarantined": pa.array([i.quarantined for i in issues], type=pa.bool_()),
        "snippet": pa.array([i.snippet for i in issues], type=pa.string()),
    })
