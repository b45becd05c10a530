"""Decode one piece of the traceEvents array into Arrow tables (runs in worker processes).

A piece is a run of whole events cut from the array at a ``}, {`` boundary. Large pieces go
first to the compiled scanner (``fastpath``), which builds the columns straight from the
bytes; any piece it declines, and every small one, is decoded here in one msgspec call. When
that fails (a cut that fell inside a nested object, invalid JSON, an unexpected field type,
the file's end) the lenient path splits the piece at every candidate boundary, re-joins
fragments that do not parse alone, repairs the known kinds of broken JSON (bad escapes, raw
control characters, unescaped quotes, a missing value) and quarantines what it cannot read,
counting everything. Values are checked at the door: invalid UTF-8 is repaired to U+FFFD
(the event is kept and counted as ``repaired_utf8``), so every stored string is valid; args
nested too deep for the decoder quarantine their event instead of raising.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

import msgspec
import numpy as np
import pyarrow as pa

from .boundary import boundaries
from .columns import build_tables, time_texts_of_array, time_texts_of_event
from .events import Event, EventArgKeys, LooseEvent

# A timestamp of 14+ integer digits with decimals: absolute epoch us with ns (2024-03/04 era),
# which a double cannot hold exactly.
LONG_FRACTIONAL_TS = re.compile(rb'"(?:ts|dur)"\s*:\s*"?-?\d{14,}\.\d')
ERROR_AT = re.compile(r"\(byte (\d+)\)")
MAX_JOIN = 64
FAST_MIN_BYTES = 4 << 20
MAX_REPAIRS = 50

_events_decoder = msgspec.json.Decoder(list[Event])
_argkeys_decoder = msgspec.json.Decoder(list[EventArgKeys])
_event_decoder = msgspec.json.Decoder(Event)
_loose_decoder = msgspec.json.Decoder(LooseEvent)
_any_decoder = msgspec.json.Decoder()
_raw_decoder = msgspec.json.Decoder(msgspec.Raw)  # validates the grammar, builds nothing
# A NaN or Infinity written as the value of an event's own ts or dur (not one in its args)
TIME_KEY_BEFORE = re.compile(rb'"(?:ts|dur)"\s*:\s*-?$')
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


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
    # the cut before or after this piece fell inside an event: nothing was decoded, the
    # caller joins this piece with its neighbour and decodes again
    cut_inside_event: bool = False
    tail_fragment: bytes = b""  # last piece only: the event the file's end cut
    trailer: bytes | None = None
    array_closed: bool = False
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
    # NaN, Infinity, -Infinity: Python's json module writes them; JSON has no such values.
    # As an event's ts or dur it becomes a string (quarantined with its reason), else null.
    for token in (b"NaN", b"Infinity"):
        if "invalid character" in msg and text.startswith(token, p):
            s = p - 1 if token == b"Infinity" and text[p - 1 : p] == b"-" else p
            value = b"null"
            if TIME_KEY_BEFORE.search(text, max(0, s - 64), p) and _depth(text[:s]) == 1:
                value = b'"' + text[s : p + len(token)] + b'"'
            return text[:s] + value + text[p + len(token) :]
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


def _depth(text: bytes) -> int:
    """How many objects and arrays are open at the end of ``text`` (strings skipped)."""
    t = STRING.sub(b"", text)
    return t.count(b"{") + t.count(b"[") - t.count(b"}") - t.count(b"]")


def deep_problem(text: bytes) -> str:
    """Why an event the decoder refused for its nesting is quarantined, in one line."""
    b = np.frombuffer(STRING.sub(b"", text), dtype=np.uint8)
    step = (b == 0x7B).astype(np.int64) + (b == 0x5B) - (b == 0x7D) - (b == 0x5D)
    depth = int(np.cumsum(step).max(initial=0))
    return (f"nested {depth} levels deep: more than the decoder reads (about "
            f"{sys.getrecursionlimit()})")


def valid_utf8(text: bytes) -> bool:
    """Whether ``text`` is valid UTF-8 (msgspec checks the strings it decodes, not those it
    skips: args are kept raw)."""
    if text.isascii():
        return True
    try:
        text.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def repair_utf8(text: bytes) -> tuple[bytes, bool]:
    """(text with each invalid UTF-8 sequence replaced by U+FFFD, whether any was)."""
    if valid_utf8(text):
        return text, False
    return text.decode("utf-8", "replace").encode("utf-8"), True


def decode_one(text: bytes) -> tuple[Event | None, str | None, bool, bytes]:
    """One event's text -> (event, problem, repaired, repaired text). Tries repairs, then
    loose types."""
    repaired = False
    for _ in range(MAX_REPAIRS):
        try:
            return _event_decoder.decode(text), None, repaired, text
        except RecursionError:
            return None, deep_problem(text), repaired, text
        except msgspec.ValidationError:
            return (*_loose_to_event(text, repaired), text)
        except msgspec.DecodeError as err:
            fixed = _repair(text, err)
            if fixed is None:
                why = str(err).removeprefix("JSON is malformed: ")
                return None, f"invalid JSON: {why}", repaired, text
            text, repaired = fixed, True
    return None, "invalid JSON: too many problems to repair", repaired, text


def _loose_to_event(text: bytes, repaired: bool) -> tuple[Event | None, str | None, bool]:
    try:
        loose = _loose_decoder.decode(text)
    except RecursionError:
        return None, deep_problem(text), repaired
    except msgspec.ValidationError as err:
        try:
            obj = _any_decoder.decode(text)
        except (msgspec.DecodeError, RecursionError):
            return None, f"invalid JSON: {err}", repaired
        return None, f"not an object: {type(obj).__name__}", repaired
    except msgspec.DecodeError as err:
        return None, f"invalid JSON: {err}", repaired

    def s(v: object) -> str | None:
        if v is None:
            return None
        if isinstance(v, str):
            return v
        return msgspec.json.encode(v).decode()

    def num(raw: msgspec.Raw) -> float | str | None:
        if not len(raw):
            return None
        try:
            v = _any_decoder.decode(raw)
        except msgspec.DecodeError:  # a number no double holds (1e400): its text
            return bytes(raw).decode("utf-8", "replace")
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
    if len(loose.ts) and ev.ts is None and bytes(loose.ts).strip() != b"null":
        kind = {b"[": "list", b"{": "dict"}.get(bytes(loose.ts).lstrip()[:1], "bool")
        return None, f"bad field type: ts is {kind}", repaired
    return ev, None, True


@dataclass
class _Lenient:
    events: list[Event]
    ordinals: list[int]
    issues: list[Issue]
    n_read: int
    head_broken: bool
    tail: bytes
    trailer: bytes | None
    closed: bool
    long_ts: bool = False
    ts_texts: list = field(default_factory=list)
    dur_texts: list = field(default_factory=list)


def split_lenient(text: bytes, base_offset: int, is_first: bool, is_last: bool,
                  long_ts: bool | None = None) -> _Lenient:
    """Split a piece at every candidate boundary outside strings and decode event by
    event."""
    cuts = [m.start() + 1 for m in boundaries(text)]
    starts = [0] + cuts
    ends = [*cuts, len(text)]
    # segment i is text[starts[i]:ends[i]] minus the separator
    segs = []
    for a, b in zip(starts, ends, strict=True):
        seg_start = a
        if a > 0:  # skip the ", {" separator's comma and whitespace, keep the brace
            j = text.find(b"{", a)
            seg_start = j
        segs.append((seg_start, b))
    if long_ts is None:
        long_ts = bool(LONG_FRACTIONAL_TS.search(text))
    out = _Lenient([], [], [], 0, False, b"", None, False, long_ts)
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
                _ = _raw_decoder.decode(stripped) if stripped else None
                kind, pos = "ok", None
            except msgspec.DecodeError as err:
                kind, pos = _error_kind(err)
            except RecursionError:
                kind, pos = "deep", None
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
                # the piece starts inside an event cut from the previous piece
                out.head_broken = True
                return out
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
        if is_last and j == n - 1 and kind != "ok" and (cut := array_close(stripped)):
            # a broken last event: the array still closes after it
            _emit(out, stripped[:cut], off)
            out.closed, out.trailer = True, stripped[cut + 1 :]
            return out
        _emit(out, stripped, off)
        first_event_seen = True
        i = j + 1
    return out


def array_close(text: bytes) -> int | None:
    """Where the event array closes after a last event that does not parse: the first "]"
    after a "}" that leaves a valid end of the top-level object (nothing, for the bare-array
    form); failing that, the first one followed by "}", "," or nothing."""
    cands = [m.start() for m in re.finditer(rb"\}\s*\]", text)]
    cands = [text.index(b"]", c) for c in cands]
    for k in cands:
        rest = text[k + 1 :].strip()
        if not rest:
            return k
        try:
            _raw_decoder.decode(b"{" + rest.removeprefix(b",").lstrip())
            return k
        except (msgspec.DecodeError, RecursionError):
            continue
    return next((k for k in cands if text[k + 1 :].lstrip()[:1] in (b"", b"}", b",")), None)


def _object_end(text: bytes, pos: int) -> int:
    """Where the leading JSON object of text ends, given msgspec's trailing-characters
    offset (which points at, or just past, the first byte after it)."""
    return text.rfind(b"}", 0, pos) + 1


def _emit(out: _Lenient, obj_text: bytes, offset: int) -> None:
    ordinal = out.n_read
    out.n_read += 1
    obj_text, utf8_fixed = repair_utf8(obj_text)
    ev, problem, repaired, fixed = decode_one(obj_text)
    snippet = obj_text[:200].decode("utf-8", "replace")
    if ev is None:
        issue = "not_an_object" if problem and problem.startswith("not an object") else (
            "bad_field_type" if problem and problem.startswith("bad field") else
            "too_deep" if problem and problem.startswith("nested") else "invalid_json")
        out.issues.append(Issue(ordinal, offset, issue, problem or "", True, snippet))
        return
    if utf8_fixed:
        out.issues.append(Issue(ordinal, offset, "repaired_utf8",
                                "invalid UTF-8 replaced by U+FFFD; event kept", False, snippet))
    if repaired:
        out.issues.append(Issue(ordinal, offset, "repaired_json",
                                "invalid JSON or field types repaired; event kept", False, snippet))
    out.events.append(ev)
    out.ordinals.append(ordinal)
    if out.long_ts:
        ts_text, dur_text = time_texts_of_event(fixed)
        out.ts_texts.append(ts_text)
        out.dur_texts.append(dur_text)


# --------------------------------------------------------------------------- decoding


# A pool worker that has decoded this much text of small pieces the general way loads the
# compiled scanner (~0.5 s, once) for the rest: it decodes a 2 MB piece in ~15 ms against
# ~50 ms, so it pays after ~30 more such pieces (a job of many small rank files); a job of a
# few small files never loads it.
SCANNER_AFTER_BYTES = 64 << 20
_general_bytes = 0
_scanner: bool | None = None  # loaded here (True), or failed to load (False)


def _use_scanner(n: int) -> bool:
    """Whether a piece of ``n`` bytes goes to the compiled scanner first."""
    global _general_bytes, _scanner
    if n >= FAST_MIN_BYTES:
        return True
    from .workers import in_worker

    if _scanner is not None or FAST_MIN_BYTES >= 1 << 62 or not in_worker():
        return bool(_scanner)  # (FAST_MIN_BYTES that large: the ingest found no scanner)
    _general_bytes += n
    if _general_bytes < SCANNER_AFTER_BYTES:
        return False
    try:
        from .fastpath import warm

        warm()
        _scanner = True
    except Exception:  # noqa: BLE001  # any failure only means the general decoder
        _scanner = False
    return _scanner


def decode_piece(text: bytes, base_offset: int, is_first: bool, is_last: bool,
                 join_edges: bool = True, fast: bool | None = None) -> PieceResult:
    """Decode a piece of the event array; the last piece also yields the trailer text.

    ``fast``: try the compiled scanner first (``fastpath``); None tries it on pieces of at
    least FAST_MIN_BYTES, where it pays for loading the compiled code."""
    if fast or (fast is None and _use_scanner(len(text))):
        res = _fast_piece(text, is_last)
        if res is not None:
            return res
    res = PieceResult()
    events: list[Event] | None = None
    argkeys: list[EventArgKeys] | None = None
    # invalid UTF-8 (which msgspec lets through inside args) is repaired event by event
    valid = valid_utf8(text)
    body = b"[" + text + (b"" if is_last else b"]")
    try:
        events = _events_decoder.decode(body) if valid else None
        if is_last and valid:
            res.array_closed = True
            res.trailer = b""
    except RecursionError:  # args nested too deep: the lenient path quarantines the event
        events = None
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
            except (msgspec.DecodeError, RecursionError):
                events = None
    if events is not None:
        try:
            argkeys = _argkeys_decoder.decode(body)
        except (msgspec.DecodeError, RecursionError):
            argkeys = None
        ordinals = None
        res.n_read = len(events)
        def texts() -> tuple[list, list] | None:
            return time_texts_of_array(body) if LONG_FRACTIONAL_TS.search(body) else None
    else:
        lenient = split_lenient(text, base_offset, is_first or not join_edges, is_last)
        events, ordinals = lenient.events, lenient.ordinals
        res.issues = lenient.issues
        res.n_read = lenient.n_read
        if join_edges and (lenient.head_broken or (lenient.tail and not is_last)):
            return PieceResult(cut_inside_event=True)
        if lenient.tail and not is_last:
            lenient.issues.append(Issue(lenient.n_read, base_offset + len(text) - len(lenient.tail),
                                        "invalid_json", "unterminated event", True,
                                        lenient.tail[:200].decode("utf-8", "replace")))
            lenient.n_read += 1
        else:
            res.tail_fragment = lenient.tail
        res.trailer, res.array_closed = lenient.trailer, lenient.closed
        def texts() -> tuple[list, list] | None:
            return (lenient.ts_texts, lenient.dur_texts) if lenient.long_ts else None
    tables, problems, res.has_fraction, res.max_abs_ts_us = build_tables(
        events, ordinals, argkeys, texts)
    res.tables = tables
    for pr in problems:
        ordinal = pr.index if ordinals is None else ordinals[pr.index]
        res.issues.append(Issue(ordinal, None, pr.issue, pr.detail, pr.quarantined))
    res.n_quarantined = sum(1 for i in res.issues if i.quarantined)
    return res


def too_large(offset: int, size: int, limit: int, head: bytes) -> PieceResult:
    """The result for one event larger than the limit, which is never read: quarantined
    with its size."""
    why = (f"event of {size} bytes is larger than the limit of {limit} bytes "
           "(--max-event-bytes); not decoded")
    snippet = head[:200].decode("utf-8", "replace")
    return PieceResult(n_read=1, n_quarantined=1,
                       issues=[Issue(0, offset, "event_too_large", why, True, snippet)])


def _fast_piece(text: bytes, is_last: bool) -> PieceResult | None:
    from . import fastpath

    sc, _, close = fastpath.scan(text, is_last)
    built = fastpath.fast_tables(sc) if sc is not None else None
    if built is None:
        return None
    res = PieceResult(n_read=sc.n, tables=built[0], has_fraction=built[2],  # type: ignore[union-attr]
                      max_abs_ts_us=built[3])
    res.issues = [Issue(p.index, None, p.issue, p.detail, p.quarantined) for p in built[1]]
    res.n_quarantined = sum(1 for i in res.issues if i.quarantined)
    if is_last:
        res.array_closed, res.trailer = True, text[close:]
    return res


def issues_table(issues: list[Issue]) -> pa.Table:
    return pa.table({
        "ord": pa.array([i.ordinal for i in issues], type=pa.int64()),
        "byte_offset": pa.array([i.offset for i in issues], type=pa.int64()),
        "issue": pa.array([i.issue for i in issues], type=pa.string()),
        "detail": pa.array([i.detail for i in issues], type=pa.string()),
        "quarantined": pa.array([i.quarantined for i in issues], type=pa.bool_()),
        "snippet": pa.array([i.snippet for i in issues], type=pa.string()),
    })
