"""Exact conversions of JSON scalars into typed Arrow columns.

Timestamps are microseconds, possibly fractional. A double holds them exactly enough for every
era but one (absolute epoch us with three decimals, 2024-03/04), so the vectorised path splits
each value into whole and fractional microseconds, and the caller re-reads the text for that
one era (see ``text_us_to_ns``).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Below 2**43 us (~101.8 days), floor + round of the fraction recovers the exact ns.
EXACT_FLOAT_US = float(2**43)


def floats_us_to_ns(values: np.ndarray) -> np.ndarray:
    """float64 microseconds -> int64 nanoseconds, exact for |v| < 2**43 and integral v."""
    whole = np.floor(values)
    frac_ns = np.rint((values - whole) * 1000.0)
    return whole.astype(np.int64) * 1000 + frac_ns.astype(np.int64)


def text_us_to_ns(text: str) -> int | None:
    """One microsecond value written as JSON text (number or string) -> exact ns."""
    t = text.strip().strip('"').strip()
    if not t:
        return None
    head, dot, tail = t.partition(".")
    if not any(c in t for c in "eE") and head.lstrip("-").isdigit() and (not dot or tail.isdigit()):
        neg = head.startswith("-")
        ns = int(head.lstrip("-") or "0") * 1000 + int((tail + "000")[:3] or "0")
        if len(tail) > 3 and int(tail[3]) >= 5:
            ns += 1
        return -ns if neg else ns
    try:
        return int((Decimal(t) * 1000).to_integral_value())
    except (InvalidOperation, ValueError):
        return None


def us_column_to_ns(values: list | tuple) -> tuple[np.ndarray, np.ndarray]:
    """float/str/None microsecond values -> (int64 ns, valid mask)."""
    n = len(values)
    types = set(map(type, values))
    if types <= {float, int, type(None)}:
        arr = np.array(values, dtype=np.float64) if n else np.zeros(0)
        valid = ~np.isnan(arr)
        arr = np.where(valid, arr, 0.0)
        return floats_us_to_ns(arr), valid
    out = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    for i, v in enumerate(values):
        if v is None:
            continue
        if isinstance(v, str):
            ns = text_us_to_ns(v)
        elif isinstance(v, float | int) and not isinstance(v, bool):
            ns = int(floats_us_to_ns(np.array([float(v)]))[0])
        else:
            ns = None
        if ns is not None and INT64_MIN <= ns <= INT64_MAX:
            out[i] = ns
            valid[i] = True
    return out, valid


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
