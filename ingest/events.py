"""Typed views of one trace event, for msgspec's fast decoder.

Only the fields ingest needs are declared; msgspec skips everything else without building
Python objects, which is what makes the decode fast. ``args`` stays raw JSON text (kept
losslessly in the store); a second, narrow pass (``ArgKeys``) pulls the join keys out of it.
"""

from __future__ import annotations

import msgspec

EMPTY_RAW = msgspec.Raw()

Scalar = int | float | str | None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | str | None = None
    dur: float | str | None = None
    id: int | str | None = None
    bp: str | None = None
    s: str | None = None
    args: msgspec.Raw = EMPTY_RAW


class TextTimeEvent(msgspec.Struct, gc=False):
    """ts and dur as their JSON text, for the one era whose values a double cannot hold."""

    ts: msgspec.Raw = EMPTY_RAW
    dur: msgspec.Raw = EMPTY_RAW


def _f(key: str) -> Scalar:
    return msgspec.field(default=None, name=key)


class ArgKeys(msgspec.Struct, gc=False):
    """The typed join keys Kineto writes into args (old and new spellings)."""

    external_id: Scalar = _f("External id")
    correlation: Scalar = None
    seq_nr: Scalar = _f("Sequence number")
    fwd_thread_id: Scalar = _f("Fwd thread id")
    ev_idx: Scalar = _f("Ev Idx")
    ev_idx_old: Scalar = _f("Profiler Event Index")
    record_function_id: Scalar = _f("Record function id")
    python_id: Scalar = _f("Python id")
    python_parent_id: Scalar = _f("Python parent id")
    device: Scalar = None
    stream: Scalar = None
    # metadata (M) events
    name: Scalar = None
    labels: Scalar = None
    sort_index: Scalar = None


class EventArgKeys(msgspec.Struct, gc=False):
    args: ArgKeys | None = None


class LooseEvent(msgspec.Struct, gc=False):
    """Any JSON types at all: the fallback when an event has unexpected field types (ts and
    dur as their text: a number no double holds, 1e400, is still read and reported)."""

    ph: object = None
    cat: object = None
    name: object = None
    pid: object = None
    tid: object = None
    ts: msgspec.Raw = EMPTY_RAW
    dur: msgspec.Raw = EMPTY_RAW
    id: object = None
    bp: object = None
    s: object = None
    args: msgspec.Raw = EMPTY_RAW

