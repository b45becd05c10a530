"""The compiled scanner behind ``fastpath.scan_piece`` (numba).

It walks a piece of the ``traceEvents`` array byte by byte, validates the JSON grammar of
every event and records, per event, where its fields' values are (byte spans) and what the
numbers are (exact integer nanoseconds from the number's text, integer join keys). Anything
it is not sure to read exactly as the msgspec path would (an escape in a field it extracts, a
float where an integer belongs, a duplicate key, an unknown shape) makes it give up on the
whole piece with a reason code, and the caller decodes the piece the general way.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Top-level event keys the scanner extracts, and the args keys (the typed join keys).
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "args", "s")
ARG_KEYS = ("External id", "correlation", "Sequence number", "Fwd thread id", "Ev Idx",
            "Profiler Event Index", "Record function id", "Python id", "Python parent id",
            "device", "stream")
K_PH, K_CAT, K_NAME, K_PID, K_TID, K_TS, K_DUR, K_ID, K_BP, K_ARGS, K_S = range(11)

# Columns of the per-event output matrix F (shape: capacity x N_FIELDS).
(F_START, F_END, F_PH, F_CAT_S, F_CAT_E, F_NAME_S, F_NAME_E, F_BP_S, F_BP_E,
 F_PID_S, F_PID_E, F_PID_T, F_PID_V, F_PID_OK, F_TID_S, F_TID_E, F_TID_T, F_TID_V, F_TID_OK,
 F_ID_S, F_ID_E, F_ID_T, F_ID_V, F_ID_OK, F_TS, F_TS_OK, F_DUR, F_DUR_OK,
 F_ARGS_S, F_ARGS_E) = range(30)
F_KEYS = 30  # values of ARG_KEYS; presence at F_KEYS + len(ARG_KEYS) + k
N_FIELDS = F_KEYS + 2 * len(ARG_KEYS)

# value types of pid/tid/id
T_NONE, T_INT, T_STR = 0, 1, 2

# Why a piece was left to the general decoder (0: scanned).
(OK, BAD_JSON, END_OF_PIECE, NOT_AN_OBJECT, EMPTY_EVENT, ESCAPE, DUPLICATE_KEY, FIELD_TYPE,
 NUMBER_FORM, LONG_PH, TOO_DEEP, TRAILING, FULL) = range(13)
REASONS = ("ok", "invalid JSON", "piece ends inside an event", "element is not an object",
           "empty event", "escape in an extracted string", "duplicate key",
           "unexpected field type", "number form (exponent, >3 decimals, too many digits)",
           "ph longer than one character", "nesting too deep", "text after the array",
           "more events than the output has rows")


def _blob(keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    data = b"".join(k.encode() for k in keys)
    off = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum([len(k.encode()) for k in keys], out=off[1:])
    return np.frombuffer(data, dtype=np.uint8).copy(), off


EVENT_KEY_BLOB, EVENT_KEY_OFF = _blob(EVENT_KEYS)
# bytes that need no attention inside a string (not a quote, backslash or control character)
_PLAIN = np.ones(256, dtype=np.bool_)
_PLAIN[:32] = False
_PLAIN[[34, 92]] = False
ARG_KEY_BLOB, ARG_KEY_OFF = _blob(ARG_KEYS)


@njit(cache=True)
def _ws(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    while i < n:
        c = b[i]
        if c == 32 or c == 10 or c == 13 or c == 9:
            i += 1
        else:
            break
    return i


@njit(cache=True)
def _string_end(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    """b[i] is an opening quote: (index after the closing quote or -1, escape seen)."""
    i += 1
    esc = False
    while i < n:
        while i < n and _PLAIN[b[i]]:
            i += 1
        if i >= n:
            break
        c = b[i]
        if c == 34:
            return i + 1, esc
        if c == 92:
            esc = True
            if i + 1 >= n:
                return -1, esc
            d = b[i + 1]
            if d == 117:  # \uXXXX
                if i + 5 >= n:
                    return -1, esc
                for k in range(i + 2, i + 6):
                    h = b[k]
                    if not ((48 <= h <= 57) or (65 <= h <= 70) or (97 <= h <= 102)):
                        return -1, esc
                i += 6
                continue
            if d == 34 or d == 92 or d == 47 or d == 98 or d == 102 or d == 110 or d == 114 \
                    or d == 116:
                i += 2
                continue
            return -1, esc
        if c < 32:
            return -1, esc
        i += 1
    return -1, esc


@njit(cache=True)
def _number_end(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    """A JSON number at b[i]: (end or -1, 1 integer / 2 with fraction / 3 with exponent)."""
    form = 1
    if i < n and b[i] == 45:
        i += 1
    if i >= n:
        return -1, 0
    if b[i] == 48:
        i += 1
    elif 49 <= b[i] <= 57:
        while i < n and 48 <= b[i] <= 57:
            i += 1
    else:
        return -1, 0
    if i < n and b[i] == 46:
        i += 1
        if i >= n or not (48 <= b[i] <= 57):
            return -1, 0
        while i < n and 48 <= b[i] <= 57:
            i += 1
        form = 2
    if i < n and (b[i] == 101 or b[i] == 69):
        i += 1
        if i < n and (b[i] == 43 or b[i] == 45):
            i += 1
        if i >= n or not (48 <= b[i] <= 57):
            return -1, 0
        while i < n and 48 <= b[i] <= 57:
            i += 1
        form = 3
    return i, form


@njit(cache=True)
def _literal_end(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    """true / false / null at b[i]: (end or -1, 0 null / 1 boolean)."""
    c = b[i]
    if c == 116 and i + 4 <= n and b[i + 1] == 114 and b[i + 2] == 117 and b[i + 3] == 101:
        return i + 4, 1
    if c == 102 and i + 5 <= n and b[i + 1] == 97 and b[i + 2] == 108 and b[i + 3] == 115 \
            and b[i + 4] == 101:
        return i + 5, 1
    if c == 110 and i + 4 <= n and b[i + 1] == 117 and b[i + 2] == 108 and b[i + 3] == 108:
        return i + 4, 0
    return -1, 0


@njit(cache=True)
def _int_value(b, s, e):  # noqa: ANN001, ANN202  # pragma: no cover
    """The integer written in b[s:e] (JSON integer form): (value, ok); not ok past 18
    digits or for "-0" (whose text would not round-trip)."""
    neg = b[s] == 45
    k = s + 1 if neg else s
    if e - k > 18 or (neg and e - k == 1 and b[k] == 48):
        return 0, False
    v = 0
    while k < e:
        v = v * 10 + (b[k] - 48)
        k += 1
    return (-v if neg else v), True


@njit(cache=True)
def _decimal_int(b, s, e):  # noqa: ANN001, ANN202  # pragma: no cover
    """A string's content as an int the way ``convert.int_column`` reads strings
    (``^\\s*-?\\d{1,18}\\s*$``): (value, ok)."""
    while s < e and b[s] == 32:
        s += 1
    while e > s and b[e - 1] == 32:
        e -= 1
    neg = s < e and b[s] == 45
    k = s + 1 if neg else s
    if e - k < 1 or e - k > 18:
        return 0, False
    v = 0
    while k < e:
        c = b[k]
        if not (48 <= c <= 57):
            return 0, False
        v = v * 10 + (c - 48)
        k += 1
    return (-v if neg else v), True


@njit(cache=True)
def _ns_value(b, s, e):  # noqa: ANN001, ANN202  # pragma: no cover
    """Microseconds written in b[s:e] (no exponent) -> exact ns: (value, ok); not ok for more
    than 3 decimals or more than 9e15 us."""
    neg = b[s] == 45
    k = s + 1 if neg else s
    whole = 0
    digits = 0
    while k < e and b[k] != 46:
        whole = whole * 10 + (b[k] - 48)
        digits += 1
        k += 1
        if digits > 16:
            return 0, False
    if whole > 9_000_000_000_000_000:
        return 0, False
    frac = 0
    nd = 0
    if k < e:  # the '.'
        k += 1
        while k < e:
            if nd == 3:
                return 0, False
            frac = frac * 10 + (b[k] - 48)
            nd += 1
            k += 1
    while nd < 3:
        frac *= 10
        nd += 1
    v = whole * 1000 + frac
    return (-v if neg else v), True


@njit(cache=True)
def _key_index(b, s, e, blob, off):  # noqa: ANN001, ANN202  # pragma: no cover
    """Index of b[s:e] among the keys in (blob, off), or -1."""
    m = e - s
    for k in range(len(off) - 1):
        a = off[k]
        if off[k + 1] - a != m:
            continue
        same = True
        for j in range(m):
            if b[s + j] != blob[a + j]:
                same = False
                break
        if same:
            return k
    return -1


@njit(cache=True)
def _past_key(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    """The index after an object member's key and colon (whitespace allowed before each),
    or -BAD_JSON."""
    i = _ws(b, i, n)
    if i >= n or b[i] != 34:
        return -BAD_JSON
    i, _ = _string_end(b, i, n)
    if i < 0:
        return -BAD_JSON
    i = _ws(b, i, n)
    if i >= n or b[i] != 58:
        return -BAD_JSON
    return i + 1


@njit(cache=True)
def _skip_value(b, i, n, stack):  # noqa: ANN001, ANN202  # pragma: no cover
    """Validate and skip one JSON value starting at b[i] (after whitespace): end or -code."""
    depth = 0
    while True:
        i = _ws(b, i, n)
        if i >= n:
            return -END_OF_PIECE
        c = b[i]
        closed_now = False
        if c == 123 or c == 91:
            if depth >= len(stack):
                return -TOO_DEEP
            stack[depth] = c
            depth += 1
            i = _ws(b, i + 1, n)
            if i >= n:
                return -END_OF_PIECE
            if (c == 123 and b[i] == 125) or (c == 91 and b[i] == 93):
                depth -= 1
                i += 1
                closed_now = True
            elif c == 123:
                i = _past_key(b, i, n)
                if i < 0:
                    return i
                continue
            else:
                continue
        if not closed_now:
            if c == 34:
                i, _ = _string_end(b, i, n)
                if i < 0:
                    return -BAD_JSON
            elif c == 45 or (48 <= c <= 57):
                i, form = _number_end(b, i, n)
                if i < 0:
                    return -BAD_JSON
            else:
                i, _ = _literal_end(b, i, n)
                if i < 0:
                    return -BAD_JSON
        # after a value: close containers, or go on after a comma
        while True:
            if depth == 0:
                return i
            i = _ws(b, i, n)
            if i >= n:
                return -END_OF_PIECE
            c = b[i]
            top = stack[depth - 1]
            if c == 44:
                i += 1
                if top == 123:
                    i = _past_key(b, i, n)
                    if i < 0:
                        return i
                break
            if (c == 125 and top == 123) or (c == 93 and top == 91):
                depth -= 1
                i += 1
                continue
            return -BAD_JSON


@njit(cache=True)
def _null_end(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    """The end of a null at b[i], or -code (any other literal is a type the general path
    handles)."""
    e, kind = _literal_end(b, i, n)
    if e < 0:
        return -BAD_JSON
    return -FIELD_TYPE if kind != 0 else e


@njit(cache=True)
def _plain_string_end(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    """The end of a string without escapes at b[i] (its quote), or -code."""
    e, esc = _string_end(b, i, n)
    if e < 0:
        return -BAD_JSON
    return -ESCAPE if esc else e


@njit(cache=True)
def _integer(b, i, n):  # noqa: ANN001, ANN202  # pragma: no cover
    """An integer token at b[i]: (end, value), or (-code, 0)."""
    e, form = _number_end(b, i, n)
    if e < 0:
        return -BAD_JSON, 0
    if form != 1:
        return -FIELD_TYPE, 0
    v, ok = _int_value(b, i, e)
    return (e, v) if ok else (-NUMBER_FORM, 0)


@njit(cache=True)
def _scalar_field(b, i, n, F, k, f_s, f_e, f_t, f_v, f_ok):  # noqa: ANN001, ANN202, PLR0913  # pragma: no cover
    """pid/tid/id: an integer, a string or null. Returns end or -code."""
    c = b[i]
    if c == 34:
        e = _plain_string_end(b, i, n)
        if e >= 0:
            F[k, f_s], F[k, f_e], F[k, f_t] = i + 1, e - 1, T_STR
            v, ok = _decimal_int(b, i + 1, e - 1)
            F[k, f_v], F[k, f_ok] = v, ok
        return e
    if c == 45 or (48 <= c <= 57):
        e, v = _integer(b, i, n)
        if e >= 0:
            F[k, f_s], F[k, f_e], F[k, f_t], F[k, f_v], F[k, f_ok] = i, e, T_INT, v, 1
        return e
    return _null_end(b, i, n)


@njit(cache=True)
def _string_field(b, i, n, F, k, f_s, f_e):  # noqa: ANN001, ANN202, PLR0913  # pragma: no cover
    """cat/name/bp/s: a string without escapes, or null. Returns end or -code."""
    if b[i] != 34:
        return _null_end(b, i, n)
    e = _plain_string_end(b, i, n)
    if e >= 0 and f_s >= 0:
        F[k, f_s], F[k, f_e] = i + 1, e - 1
    return e


@njit(cache=True)
def _time_field(b, i, n, F, k, f_v, f_ok):  # noqa: ANN001, ANN202, PLR0913  # pragma: no cover
    """ts/dur: a number (exact ns from its text) or null. Returns end or -code."""
    c = b[i]
    if c == 45 or (48 <= c <= 57):
        e, form = _number_end(b, i, n)
        if e < 0:
            return -BAD_JSON
        if form == 3:
            return -NUMBER_FORM
        v, ok = _ns_value(b, i, e)
        if not ok:
            return -NUMBER_FORM
        F[k, f_v], F[k, f_ok] = v, 1
        return e
    if c == 34:
        return -FIELD_TYPE  # a string timestamp: the general path reads it
    return _null_end(b, i, n)


@njit(cache=True)
def _args_field(b, i, n, F, k, stack):  # noqa: ANN001, ANN202  # pragma: no cover
    """args: kept as its raw text; when an object, its integer join keys are read."""
    F[k, F_ARGS_S] = i
    if b[i] != 123:
        e = _skip_value(b, i, n, stack)
        if e >= 0:
            F[k, F_ARGS_E] = e
        return e
    nk = len(ARG_KEY_OFF) - 1
    seen = 0
    i = _ws(b, i + 1, n)
    if i >= n:
        return -END_OF_PIECE
    if b[i] == 125:
        F[k, F_ARGS_E] = i + 1
        return i + 1
    while True:
        if b[i] != 34:
            return -BAD_JSON
        ks = i + 1
        i, esc = _string_end(b, i, n)
        if i < 0:
            return -BAD_JSON
        if esc:
            return -ESCAPE  # an escaped key might spell a join key
        idx = _key_index(b, ks, i - 1, ARG_KEY_BLOB, ARG_KEY_OFF)
        i = _ws(b, i, n)
        if i >= n or b[i] != 58:
            return -BAD_JSON
        i = _ws(b, i + 1, n)
        if i >= n:
            return -END_OF_PIECE
        if idx >= 0:
            if seen & (1 << idx):
                return -DUPLICATE_KEY
            seen |= 1 << idx
            c = b[i]
            if c == 45 or (48 <= c <= 57):
                e, v = _integer(b, i, n)
                if e < 0:
                    return e
                F[k, F_KEYS + idx] = v
                F[k, F_KEYS + nk + idx] = 1
                i = e
            elif c == 34:
                return -FIELD_TYPE  # a string key value: the general path converts it
            else:  # null, booleans, lists, objects: no key value (as the general path)
                i = _skip_value(b, i, n, stack)
                if i < 0:
                    return i
        else:
            i = _skip_value(b, i, n, stack)
            if i < 0:
                return i
        i = _ws(b, i, n)
        if i >= n:
            return -END_OF_PIECE
        if b[i] == 44:
            i = _ws(b, i + 1, n)
            if i >= n:
                return -END_OF_PIECE
            continue
        if b[i] == 125:
            F[k, F_ARGS_E] = i + 1
            return i + 1
        return -BAD_JSON


@njit(cache=True)
def scan(b, is_last, F):  # noqa: ANN001, ANN201  # pragma: no cover
    """Scan the events of a piece into F. Returns (events, reason, index after the array's
    closing bracket or -1)."""
    n = len(b)
    stack = np.empty(512, dtype=np.uint8)
    cap = F.shape[0]
    k = 0
    i = _ws(b, 0, n)
    while True:
        if i >= n:
            if is_last:
                return k, END_OF_PIECE, -1
            return k, OK, -1
        if b[i] != 123:
            if is_last and b[i] == 93 and k == 0:
                return k, EMPTY_EVENT, -1  # an empty array: the general path reports it
            return k, NOT_AN_OBJECT, -1
        if k >= cap:
            return k, FULL, -1
        F[k, F_START] = i
        for f in range(F_CAT_S, F_ARGS_E + 1):
            F[k, f] = -1
        F[k, F_PH] = 0
        F[k, F_PID_T] = T_NONE
        F[k, F_TID_T] = T_NONE
        F[k, F_ID_T] = T_NONE
        for f in (F_PID_OK, F_TID_OK, F_ID_OK, F_TS_OK, F_DUR_OK, F_PID_V, F_TID_V, F_ID_V,
                  F_TS, F_DUR):
            F[k, f] = 0
        for f in range(F_KEYS, F.shape[1]):
            F[k, f] = 0
        i = _ws(b, i + 1, n)
        if i >= n:
            return k, END_OF_PIECE, -1
        if b[i] == 125:
            return k, EMPTY_EVENT, -1
        seen = 0
        while True:
            if b[i] != 34:
                return k, BAD_JSON, -1
            ks = i + 1
            i, esc = _string_end(b, i, n)
            if i < 0:
                return k, BAD_JSON, -1
            if esc:
                return k, ESCAPE, -1
            key = _key_index(b, ks, i - 1, EVENT_KEY_BLOB, EVENT_KEY_OFF)
            i = _ws(b, i, n)
            if i >= n or b[i] != 58:
                return k, BAD_JSON, -1
            i = _ws(b, i + 1, n)
            if i >= n:
                return k, END_OF_PIECE, -1
            if key >= 0:
                if seen & (1 << key):
                    return k, DUPLICATE_KEY, -1
                seen |= 1 << key
            if key == K_PH:
                if b[i] != 34:
                    return k, FIELD_TYPE, -1
                e = _plain_string_end(b, i, n)
                if e < 0:
                    return k, -e, -1
                if e - i != 3:
                    return k, LONG_PH if e - i > 3 else EMPTY_EVENT, -1
                F[k, F_PH] = b[i + 1]
                i = e
            elif key == K_CAT:
                i = _string_field(b, i, n, F, k, F_CAT_S, F_CAT_E)
            elif key == K_NAME:
                i = _string_field(b, i, n, F, k, F_NAME_S, F_NAME_E)
            elif key == K_BP:
                i = _string_field(b, i, n, F, k, F_BP_S, F_BP_E)
            elif key == K_S:
                i = _string_field(b, i, n, F, k, -1, -1)
            elif key == K_PID:
                i = _scalar_field(b, i, n, F, k, F_PID_S, F_PID_E, F_PID_T, F_PID_V, F_PID_OK)
            elif key == K_TID:
                i = _scalar_field(b, i, n, F, k, F_TID_S, F_TID_E, F_TID_T, F_TID_V, F_TID_OK)
            elif key == K_ID:
                i = _scalar_field(b, i, n, F, k, F_ID_S, F_ID_E, F_ID_T, F_ID_V, F_ID_OK)
            elif key == K_TS:
                i = _time_field(b, i, n, F, k, F_TS, F_TS_OK)
            elif key == K_DUR:
                i = _time_field(b, i, n, F, k, F_DUR, F_DUR_OK)
            elif key == K_ARGS:
                i = _args_field(b, i, n, F, k, stack)
            else:
                i = _skip_value(b, i, n, stack)
            if i < 0:
                return k, -i, -1
            i = _ws(b, i, n)
            if i >= n:
                return k, END_OF_PIECE, -1
            c = b[i]
            if c == 44:
                i = _ws(b, i + 1, n)
                if i >= n:
                    return k, END_OF_PIECE, -1
                continue
            if c == 125:
                i += 1
                break
            return k, BAD_JSON, -1
        if F[k, F_PH] == 0:
            return k, EMPTY_EVENT, -1
        F[k, F_END] = i
        k += 1
        i = _ws(b, i, n)
        if i >= n:
            if is_last:
                return k, END_OF_PIECE, -1
            return k, OK, -1
        c = b[i]
        if c == 44:
            i = _ws(b, i + 1, n)
            continue
        if c == 93 and is_last:
            return k, OK, i + 1
        return k, TRAILING, -1


@njit(cache=True)
def gather(b, starts, ends):  # noqa: ANN001, ANN201  # pragma: no cover
    """Concatenate the spans b[starts[r]:ends[r]] (start < 0: NULL): (offsets, data)."""
    n = len(starts)
    offsets = np.empty(n + 1, dtype=np.int32)
    total = 0
    offsets[0] = 0
    for r in range(n):
        if starts[r] >= 0:
            total += ends[r] - starts[r]
        offsets[r + 1] = total
    data = np.empty(total, dtype=np.uint8)
    for r in range(n):
        s = starts[r]
        if s >= 0:
            p, m = offsets[r], ends[r] - s
            if m < 32:  # a loop beats a slice copy's set-up for short strings
                for j in range(m):
                    data[p + j] = b[s + j]
            else:
                data[p:p + m] = b[s:s + m]
    return offsets, data
