"""Exact conversions of JSON scalars into typed Arrow columns.

Timestamps are microseconds, possibly fractional. A double holds them exactly enough for every
era but one (absolute epoch us with three decimals, 2024-03/04), so the vectorised path splits
each value into whole and fractional microseconds, and the caller re-reads the text for that
one era (see ``text_us_to_ns``). Every us -> ns conversion of both decoders is range-checked
here: a time that int64 ns cannot hold is reported (``time_problem``), never wrapped.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Below 2**43 us (~101.8 days), floor + round of the fraction recovers the exact ns.
EXACT_FLOAT_US = float(2**43)
# |us| below this float (2**63 / 1000 rounded up to a double) converts inside int64 ns.
MAX_ABS_US = 2**63 / 1000
# A value beyond int64 ns in any case comes back as this (no integer of a million digits).
FAR_NS = 2**64
# status of a converted time value
TIME_OK, TIME_MISSING, TIME_BAD = 0, 1, 2


def floats_us_to_ns(values: np.ndarray) -> np.ndarray:
    """float64 microseconds (each |v| < MAX_ABS_US) -> int64 nanoseconds, exact for
    |v| < 2**43 and integral v."""
    whole = np.floor(values)
    frac_ns = np.rint((values - whole) * 1000.0)
    return whole.astype(np.int64) * 1000 + frac_ns.astype(np.int64)


def text_us_to_ns(text: str) -> int | None:
    """One microsecond value written as JSON text (number or string) -> exact ns; None when
    it is not a number (NaN included). A value far outside int64 ns (Infinity, 1e400)
    comes back as +-FAR_NS."""
    t = text.strip().strip('"').strip()
    if not t:
        return None
    head, dot, tail = t.partition(".")
    digits = head.lstrip("-")
    if not any(c in t for c in "eE") and digits.isdigit() and (not dot or tail.isdigit()):
        neg = head.startswith("-")
        if len(digits) > 19:
            return -FAR_NS if neg else FAR_NS
        ns = int(digits) * 1000 + int((tail + "000")[:3] or "0")
        if len(tail) > 3 and int(tail[3]) >= 5:
            ns += 1
        return -ns if neg else ns
    try:
        d = Decimal(t)
    except (InvalidOperation, ValueError):
        return None
    if d.is_nan():
        return None
    if d.is_infinite() or d.adjusted() > 20:
        return -FAR_NS if d < 0 else FAR_NS
    if d.adjusted() < -20:
        return 0
    return int((d * 1000).to_integral_value())


def us_column_to_ns(values: list | tuple) -> tuple[np.ndarray, np.ndarray]:
    """float/str/None microsecond values -> (int64 ns, status): TIME_OK, TIME_MISSING
    (absent, or not a number at all) or TIME_BAD (NaN, infinite, or outside int64 ns);
    ns is 0 where the status is not TIME_OK."""
    n = len(values)
    types = set(map(type, values))
    if types <= {float, int, type(None)}:
        arr = np.array(values, dtype=np.float64) if n else np.zeros(0)
        present = ~np.isnan(arr)  # None (a JSON float is never NaN)
        ok = present & (np.abs(arr) < MAX_ABS_US)
        status = np.where(ok, TIME_OK, np.where(present, TIME_BAD, TIME_MISSING))
        return floats_us_to_ns(np.where(ok, arr, 0.0)), status.astype(np.int8)
    out = np.zeros(n, dtype=np.int64)
    status = np.full(n, TIME_MISSING, dtype=np.int8)
    for i, v in enumerate(values):
        st, ns = _time_value(v)
        status[i] = st
        if st == TIME_OK:
            out[i] = ns
    return out, status


def _time_value(v: object) -> tuple[int, int]:
    """One microsecond value -> (status, ns)."""
    if isinstance(v, bool) or v is None:
        return TIME_MISSING, 0
    if isinstance(v, float | int):
        f = float(v)
        if math.isnan(f) or not abs(f) < MAX_ABS_US:
            return TIME_BAD, 0
        return TIME_OK, int(floats_us_to_ns(np.array([f]))[0])
    if isinstance(v, str):
        ns = text_us_to_ns(v)
        if ns is None:
            nan = v.strip().strip('"').strip().lstrip("+-").lower() == "nan"
            return (TIME_BAD if nan else TIME_MISSING), 0
        return (TIME_OK, ns) if INT64_MIN <= ns <= INT64_MAX else (TIME_BAD, 0)
    return TIME_MISSING, 0


def time_problem(field: str, v: object) -> str:
    """The one-line reason a ts or dur value of status TIME_BAD cannot be stored."""
    shown = _number_text(v)
    if shown.lstrip("+-").lower() == "nan":
        return f"{field} {shown} is not a number"
    return f"{field} {shown} us is outside the int64 ns range"


def end_out_of_range(ts_ns: np.ndarray, dur_ns: np.ndarray) -> np.ndarray:
    """Where ts + dur (int64 ns each) would overflow int64."""
    with np.errstate(over="ignore"):
        return np.where(dur_ns > 0, ts_ns > INT64_MAX - dur_ns, ts_ns < INT64_MIN - dur_ns)


def end_problem(ts: object, dur: object) -> str:
    """The one-line reason an event whose ts + dur overflows int64 ns cannot be stored."""
    return (f"end ts {_number_text(ts)} + dur {_number_text(dur)} us is outside the int64 ns "
            "range")


def _number_text(v: object) -> str:
    """A time value for a message, the same whether it was read as a double or as its text:
    a double as an integer where it is one, else Python's repr; what no double holds
    (1e400, Infinity, NaN) as written, at most 40 characters."""
    if isinstance(v, str):
        t = v.strip().strip('"').strip()
        try:
            f = float(t)
        except ValueError:
            f = math.nan
        if not math.isfinite(f):
            return t if len(t) <= 40 else t[:37] + "..."
        v = f
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e17 else repr(v)
    return str(v)


def to_int(v: object) -> int | None:
    """A JSON scalar -> int when it denotes one (ints, integral floats, decimal/hex strings)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v.is_integer() else None
    if isinstance(v, str):
        s = v.strip()
        try:
            if s[:2].lower() == "0x" or s[:3].lower() == "-0x":
                return int(s, 16)
            return int(s)
        except ValueError:
            return None
    return None


def int64_column(values: list) -> tuple[pa.Array, list[int]]:
    """Scalars -> int64 array; returns the positions of values that exist but do not fit."""
    try:
        return pa.array(values, type=pa.int64()), []
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass
    out: list[int | None] = []
    bad: list[int] = []
    for i, v in enumerate(values):
        iv = to_int(v)
        if iv is not None and not (INT64_MIN <= iv <= INT64_MAX):
            bad.append(i)
            iv = None
        out.append(iv)
    return pa.array(out, type=pa.int64()), bad


def id_to_int64(v: object) -> int | None:
    """A flow/async id -> int64; uint64 values above 2**63 wrap (two's complement)."""
    iv = to_int(v)
    if iv is None:
        return None
    if INT64_MAX < iv < 2**64:
        return iv - 2**64
    if INT64_MIN <= iv <= INT64_MAX:
        return iv
    return None


def raw_text_column(values: list | tuple) -> pa.Array:
    """pid/tid/id values -> the text as written (ints as decimal, strings as-is).

    Column-wise: ints go through Arrow's cast, strings as they are; only other types (floats,
    bools: rare) take a Python path."""
    types = set(map(type, values))
    if types <= {int, type(None)}:
        try:
            return pa.array(values, type=pa.int64()).cast(pa.string())
        except (pa.ArrowInvalid, OverflowError):
            pass
    if types <= {int, str, type(None)}:
        strs = pa.array([v if type(v) is str else None for v in values], type=pa.string())
        try:
            ints = pa.array([v if type(v) is int else None for v in values], type=pa.int64())
            return pc.coalesce(strs, ints.cast(pa.string()))
        except (pa.ArrowInvalid, OverflowError):
            pass
    return pa.array(
        [None if v is None else (v if isinstance(v, str) else _scalar_text(v)) for v in values],
        type=pa.string(),
    )


def int_column(values: list | tuple) -> pa.Array:
    """pid/tid values -> int64: ints as they are, decimal strings parsed, others NULL."""
    try:
        return pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass
    types = set(map(type, values))
    if types <= {int, str, type(None)}:
        try:
            ints = pa.array([v if type(v) is int else None for v in values], type=pa.int64())
        except (pa.ArrowInvalid, OverflowError):
            ints = None
        if ints is not None:
            strs = pa.array([v if type(v) is str else None for v in values], type=pa.string())
            numeric = pc.match_substring_regex(strs, r"^\s*-?\d{1,18}\s*$")
            parsed = pc.cast(pc.utf8_trim_whitespace(
                pc.if_else(numeric, strs, pa.scalar(None, pa.string()))), pa.int64())
            return pc.coalesce(ints, parsed)
    arr, _ = int64_column([to_int(v) for v in values])
    return arr


def _scalar_text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)
