"""Read a trace file and cut its event array into pieces.

Pieces of the ``traceEvents`` array are about ``piece_bytes`` each, cut at a ``}, {``
boundary outside strings (``boundary.judge``) so workers can decode them independently;
memory stays at a few pieces. A plain file's cut points are found by reading a little text
at each target offset (the workers read their pieces themselves, and the file's sha256 is
taken later, by ``sha256_of``); a gzip file is read in one pass that hashes the bytes on
disk, gunzips (isal, multi-member aware) and hands out pieces carrying their text.

An event larger than ``max_event_bytes`` is never held whole: its piece carries only its
place, its size and its first bytes, and is quarantined unread.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from isal import isal_zlib

from .boundary import BOUNDARY, INSIDE, OUTSIDE, UNDECIDED, judge, string_end
from .decode import array_close

READ_BLOCK = 8 << 20
GZIP_READ_BLOCK = 1 << 20  # inflates to ~10-20 MB of text per step
MAX_INFLATE = 16 << 20  # text per gunzip step at most (1 MB of gzip may hold 1 GB of text)
PREAMBLE_LIMIT = 256 << 20
GZIP_MAGIC = b"\x1f\x8b"
TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
WHITESPACE = b"\xef\xbb\xbf \t\r\n"
BOUNDARY_CONTEXT = 1 << 16  # a "}, {" separator longer than this is not found
CUT_WINDOW = 1 << 20  # text read at a target offset to find the cut
MAX_CUT_WINDOW = 64 << 20  # doubled up to this while a candidate cut is undecided
MAX_BACK_CANDIDATES = 1024  # judged looking back for where a too-large event starts
DEFAULT_MAX_EVENT_BYTES = 64 << 20
SNIPPET_BYTES = 200


class TraceFileError(Exception):
    """A file that cannot be ingested; the message is one line naming the problem."""


@dataclass
class Piece:
    seq: int
    text: bytes | None  # None: read ``length`` bytes at ``offset`` of ``path``
    offset: int  # offset of text[0] in the JSON text
    is_first: bool
    is_last: bool
    path: Path | None = None
    length: int = 0
    join_edges: bool = True  # False: quarantine a broken first/last event, don't ask to join
    gap: bytes = b","  # the separator between the previous piece and this one, as written
    # > 0: the piece is one event of ``length`` bytes over this limit; never loaded
    too_large: int = 0
    head: bytes = b""  # a too-large event's first bytes
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES  # joins of pieces stop past this

    def load(self) -> bytes:
        if self.text is not None:
            return self.text
        with open(self.path, "rb") as f:  # type: ignore[arg-type]
            f.seek(self.offset)
            return f.read(self.length)


@dataclass
class SourceInfo:
    path: Path
    bytes_on_disk: int = 0
    json_bytes: int = 0
    compression: str = "none"
    container: str = "object"
    preamble: bytes = b""
    sha256: str = ""
    gzip_truncated: bool = False
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256, repr=False)


def sha256_of(path: Path) -> str:
    """The file's sha256. hashlib and file reads release the GIL, so a thread can take it
    beside other work."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(READ_BLOCK):
                h.update(block)
    except OSError as err:
        raise TraceFileError(f"read error: {err.strerror or err}") from None
    return h.hexdigest()


def _raw_blocks(info: SourceInfo, block_size: int = READ_BLOCK) -> Iterator[bytes]:
    try:
        f = open(info.path, "rb")  # noqa: SIM115
    except IsADirectoryError:
        raise TraceFileError("is a directory") from None
    except PermissionError:
        raise TraceFileError("permission denied") from None
    except FileNotFoundError:
        raise TraceFileError("no such file") from None
    except OSError as err:
        raise TraceFileError(f"cannot open: {err.strerror or err}") from None
    with f:
        while True:
            try:
                block = f.read(block_size)
            except OSError as err:
                raise TraceFileError(f"read error: {err.strerror or err}") from None
            if not block:
                return
            info.bytes_on_disk += len(block)
            yield block


def is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False  # reported by _raw_blocks


def _text_blocks(info: SourceInfo) -> Iterator[bytes]:
    raw = _raw_blocks(info, GZIP_READ_BLOCK if is_gzip(info.path) else READ_BLOCK)
    first = next(raw, b"")
    if not first:
        raise TraceFileError("empty file")
    if not first.startswith(GZIP_MAGIC):
        info.json_bytes += len(first)
        yield first
        for block in raw:
            info.json_bytes += len(block)
            yield block
        return
    info.compression = "gzip"
    info.hasher.update(first)
    d = isal_zlib.decompressobj(wbits=31)
    pending, full = first, False
    while True:
        while pending or full:  # (a full step may leave text to come without more input)
            try:
                out = d.decompress(pending, MAX_INFLATE)
            except isal_zlib.error as err:
                raise TraceFileError(f"corrupt gzip data: {err}") from None
            full = len(out) >= MAX_INFLATE
            if out:
                info.json_bytes += len(out)
                yield out
            if d.eof:
                full = False
                pending = d.unused_data
                if pending.strip(b"\x00"):  # another gzip member
                    if not pending.startswith(GZIP_MAGIC):
                        raise TraceFileError("corrupt gzip data: garbage after a gzip member")
                    d = isal_zlib.decompressobj(wbits=31)
                    continue
                pending = b""
            else:
                pending = d.unconsumed_tail  # what MAX_INFLATE left for the next step
        block = next(raw, None)
        if block is None:
            break
        info.hasher.update(block)
        pending = block
    if not d.eof:
        info.gzip_truncated = True  # salvage what was decompressed


def pieces(info: SourceInfo, piece_bytes: int = 32 << 20,
           max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> Iterator[Piece]:
    """Yield the pieces of the event array; ``info`` gains the preamble and container.

    Pieces of a plain file are byte ranges the worker reads itself, and ``info.sha256``
    stays empty (the caller takes it with ``sha256_of``); pieces of a gzip file carry their
    text, and the file is hashed as it is read.
    """
    blocks = _text_blocks(info)
    skipped = 0  # leading whitespace, dropped block by block
    for block in blocks:
        first = block.lstrip(WHITESPACE)
        skipped += len(block) - len(first)
        if first or skipped > PREAMBLE_LIMIT:
            break
    else:
        raise TraceFileError("empty file (only whitespace)")
    if skipped > PREAMBLE_LIMIT:
        raise TraceFileError(f"no JSON text in the first {PREAMBLE_LIMIT >> 20} MB: "
                             "only whitespace")
    buf = bytearray(first)  # the text from offset ``skipped`` on
    if buf[:1] == b"[":
        info.container = "array"
        start = 1
    elif buf[:1] == b"{":
        info.container = "object"
        searched = 0
        while (m := TRACE_EVENTS_KEY.search(buf, searched)) is None or \
                skipped + m.start() > PREAMBLE_LIMIT:
            if skipped + len(buf) > PREAMBLE_LIMIT:
                raise TraceFileError(f"no traceEvents array in the first "
                                     f"{PREAMBLE_LIMIT >> 20} MB")
            block = next(blocks, None)
            if block is None:
                raise TraceFileError("not a trace: JSON object without a traceEvents array")
            searched = max(len(buf) - BOUNDARY_CONTEXT, 0)
            buf += block
        info.preamble = bytes(buf[1 : m.start()])
        start = m.end()
    else:
        text = bytes(buf[:20]).decode("utf-8", "replace")
        raise TraceFileError(f"not JSON: starts with {text!r}")
    if info.compression == "none":
        blocks.close()
        del buf
        try:
            f = open(info.path, "rb")  # noqa: SIM115
        except OSError as err:
            raise TraceFileError(f"cannot open: {err.strerror or err}") from None
        with f:
            yield from _cut(_FileText(f, info), skipped + start, piece_bytes, max_event_bytes)
    else:
        rest = _StreamText(blocks, buf[start:], skipped + start)
        del buf
        yield from _cut(rest, rest.base, piece_bytes, max_event_bytes)
        info.sha256 = info.hasher.hexdigest()


class Cut(NamedTuple):
    at: int  # the end of the piece before the separator (after its "}")
    nxt: int  # the start of the next piece (its "{")
    sep: bytes  # the text between them


class _FileText:
    """A plain file's JSON text, read where asked; its pieces are byte ranges."""

    def __init__(self, f: BinaryIO, info: SourceInfo) -> None:
        self.f, self.info = f, info
        self.size = os.fstat(f.fileno()).st_size

    def read(self, pos: int, n: int) -> bytes:
        try:
            self.f.seek(pos)
            return self.f.read(n)
        except OSError as err:
            raise TraceFileError(f"read error: {err.strerror or err}") from None

    def forget(self, pos: int) -> None:
        pass

    def earliest(self) -> int:
        return 0

    def end(self) -> int:
        return self.size

    def piece(self, seq: int, offset: int, length: int, is_first: bool, is_last: bool,
              **kw: object) -> Piece:
        self.info.bytes_on_disk = self.info.json_bytes = offset + length
        return Piece(seq, None, offset, is_first, is_last, self.info.path, length,
                     **kw)  # type: ignore[arg-type]


class _StreamText:
    """A gzip stream's JSON text, held from the oldest offset still needed (``forget``
    lets go of what lies before an offset); its pieces carry their text."""

    def __init__(self, blocks: Iterator[bytes], text: bytes | bytearray, base: int) -> None:
        self.blocks, self.buf, self.base, self.done = blocks, bytearray(text), base, False

    def read(self, pos: int, n: int) -> bytes:
        if pos < self.base:
            raise AssertionError(f"offset {pos} was forgotten (held from {self.base})")
        while not self.done and self.base + len(self.buf) < pos + n:
            self._more()
        s = pos - self.base
        with memoryview(self.buf) as mv:
            return mv[s : s + n].tobytes()

    def _more(self) -> None:
        block = next(self.blocks, None)
        if block is None:
            self.done = True
        else:
            self.buf += block

    def forget(self, pos: int) -> None:
        k = min(pos - self.base, len(self.buf))
        if k > 0:
            del self.buf[:k]
            self.base += k

    def earliest(self) -> int:
        return self.base

    def end(self) -> int:
        while not self.done:
            self._more()
        return self.base + len(self.buf)

    def piece(self, seq: int, offset: int, length: int, is_first: bool, is_last: bool,
              **kw: object) -> Piece:
        text = b"" if kw.get("too_large") else self.read(offset, length)
        self.forget(offset + length)
        return Piece(seq, text, offset, is_first, is_last, length=length,
                     **kw)  # type: ignore[arg-type]


_Text = _FileText | _StreamText


def _cut(text: _Text, start: int, piece_bytes: int, limit: int) -> Iterator[Piece]:
    """The pieces from ``start`` on. An event spanning a piece's target offset that is
    larger than ``limit`` becomes a piece of its own, never read whole (and a piece is at
    most ``limit`` long up to its target, so no event inside one can be larger)."""
    piece_bytes = max(min(piece_bytes, limit), 1)
    seq, pos, gap, first = 0, start, b"", True

    def piece(offset: int, length: int, is_last: bool, **kw: object) -> Piece:
        nonlocal seq, first
        p = text.piece(seq, offset, length, first, is_last, max_event_bytes=limit, **kw)
        seq, first = seq + 1, False
        return p

    while True:
        target = pos + piece_bytes
        cut = _find_cut(text, target, stop=target + limit)
        if isinstance(cut, int) or (cut.at if cut else text.end()) - pos > limit:
            # the event spanning the target may be too large: where does it start and end?
            before = _last_cut(text, pos, target)
            ev = before.nxt if before else pos
            head = text.read(ev, SNIPPET_BYTES)
            if isinstance(cut, int):  # past the limit already: find its end, unkept
                if before:
                    yield piece(pos, before.at - pos, False, gap=gap)
                    pos, gap = ev, before.sep
                cut = _find_cut(text, cut, stop=None, skip=True)
            end = cut.at if cut else text.end()
            if end - ev > limit:
                if before and pos < ev:  # the events before it
                    yield piece(pos, before.at - pos, False, gap=gap)
                    gap = before.sep
                close = None if cut else _array_end(text, ev, end)
                yield piece(ev, (close or end) - ev, cut is None and close is None, gap=gap,
                            too_large=limit, head=head)
                first = True  # nothing before the next piece to join with
                if cut is None:
                    if close is not None:  # the array's "]" and what follows it
                        yield piece(close, end - close, True, gap=b"")
                    return
                pos, gap = cut.nxt, cut.sep
                continue
        if cut is None:
            yield piece(pos, text.end() - pos, True, gap=gap)
            return
        yield piece(pos, cut.at - pos, False, gap=gap)
        pos, gap = cut.nxt, cut.sep


def _find_cut(text: _Text, pos: int, stop: int | None, skip: bool = False
              ) -> Cut | int | None:
    """The first separator outside strings at or after ``pos``; None when the text ends
    first; an int (where the search got to) once it has passed ``stop``. ``skip``: forget
    the text behind the search (an event read past, not kept)."""
    size = CUT_WINDOW
    while True:
        if stop is not None and pos > stop:
            return pos
        if skip:
            text.forget(pos)
        window = text.read(pos, size)
        eof = len(window) < size
        i = 0
        while (m := BOUNDARY.search(window, i)) is not None:
            verdict = judge(window, m.start(), eof or size >= MAX_CUT_WINDOW)
            if verdict == OUTSIDE:
                return Cut(pos + m.start() + 1, pos + m.end() - 1, m.group()[1:-1])
            if verdict == UNDECIDED:  # again from this candidate, with more text
                nxt, size = pos + m.start(), size * 2
                break
            i, closed = string_end(window, m.start())  # inside a string: go on after it
            if not closed:  # the string runs past the window
                after = _past_string(text, pos + i, skip)
                if after is None:
                    return None
                nxt, size = after, CUT_WINDOW
                break
        else:
            if eof:
                return None
            # no separator left (one may straddle the window's end: search again before it)
            nxt, size = pos + max(len(window) - BOUNDARY_CONTEXT, i, 1), CUT_WINDOW
        pos = nxt


def _past_string(text: _Text, pos: int, skip: bool) -> int | None:
    """From inside a string at ``pos``: the offset after its closing quote, or None when the
    text ends first."""
    while True:
        if skip:
            text.forget(pos)
        window = text.read(pos, CUT_WINDOW)
        e, closed = string_end(window, 0)
        if closed:
            return pos + e
        if len(window) < CUT_WINDOW:
            return None
        pos += max(e, 1)  # e: the window's end, or a final backslash to read again


def _last_cut(text: _Text, lo: int, hi: int) -> Cut | None:
    """The last separator outside strings that starts in [lo, hi), or None (also after
    MAX_BACK_CANDIDATES candidates: the event is then taken to start at lo). A candidate
    inside a string sends the search to before the string's opening quote."""
    end, tried, in_string = hi, 0, False
    while end > lo and tried < MAX_BACK_CANDIDATES:
        begin = max(lo, end - CUT_WINDOW)
        want = end - begin + CUT_WINDOW
        window = text.read(begin, want)
        eof = len(window) < want
        limit = end - begin
        if in_string:  # look for the opening quote of the string the search is in
            limit = _opening_quote(window, limit)
            in_string = limit < 0
        found = [m for m in BOUNDARY.finditer(window, 0, max(limit, 0) + BOUNDARY_CONTEXT)
                 if m.start() < limit]
        while found and tried < MAX_BACK_CANDIDATES:
            m = found.pop()
            tried += 1
            if judge(window, m.start(), eof) != INSIDE:
                return Cut(begin + m.start() + 1, begin + m.end() - 1, m.group()[1:-1])
            q = _opening_quote(window, m.start())
            if q < 0:  # the string began before this window
                in_string = True
                break
            while found and found[-1].start() >= q:
                found.pop()
        if begin == lo:
            return None
        end = begin if in_string else min(begin + BOUNDARY_CONTEXT, end - 1)
    return None


def _opening_quote(text: bytes, i: int) -> int:
    """The last unescaped quote before ``text[i]`` (the opening quote of a string that
    ``text[i]`` is inside), or -1."""
    q = text.rfind(b'"', 0, i)
    while q >= 0:
        k = q
        while k > 0 and text[k - 1] == 0x5C:
            k -= 1
        if (q - k) % 2 == 0:
            return q
        q = text.rfind(b'"', 0, q)
    return -1


def _array_end(text: _Text, lo: int, hi: int) -> int | None:
    """Where the event array closes (its "]") in the last text of a file whose last event is
    too large: looked for in the final window only."""
    begin = max(lo, hi - CUT_WINDOW, text.earliest())
    k = array_close(text.read(begin, hi - begin))
    return None if k is None else begin + k
