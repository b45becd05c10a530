"""Read a trace file and cut its event array into pieces.

Pieces of the ``traceEvents`` array are about ``piece_bytes`` each, cut at a ``}, {``
boundary so workers can decode them independently; memory stays at a few pieces. A plain
file's cut points are found by reading a little text at each target offset (the workers read
their pieces themselves, and the file's sha256 is taken later, by ``sha256_of``); a gzip file
is read in one pass that hashes the bytes on disk, gunzips (isal, multi-member aware) and
hands out pieces carrying their text.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from isal import isal_zlib

from .decode import BOUNDARY

READ_BLOCK = 8 << 20
GZIP_READ_BLOCK = 1 << 20  # inflates to ~10-20 MB of text per step
PREAMBLE_LIMIT = 256 << 20
GZIP_MAGIC = b"\x1f\x8b"
TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
WHITESPACE = b"\xef\xbb\xbf \t\r\n"
BOUNDARY_CONTEXT = 1 << 16  # a "}, {" separator longer than this is not found
CUT_WINDOW = 1 << 20  # text read at a plain file's target offset to find the cut


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
    pending = first
    while True:
        while pending:
            try:
                out = d.decompress(pending)
            except isal_zlib.error as err:
                raise TraceFileError(f"corrupt gzip data: {err}") from None
            if out:
                info.json_bytes += len(out)
                yield out
            if d.eof:
                pending = d.unused_data
                if pending.strip(b"\x00"):  # another gzip member
                    if not pending.startswith(GZIP_MAGIC):
                        raise TraceFileError("corrupt gzip data: garbage after a gzip member")
                    d = isal_zlib.decompressobj(wbits=31)
                    continue
                pending = b""
            else:
                pending = b""
        block = next(raw, None)
        if block is None:
            break
        info.hasher.update(block)
        pending = block
    if not d.eof:
        info.gzip_truncated = True  # salvage what was decompressed


def pieces(info: SourceInfo, piece_bytes: int = 32 << 20) -> Iterator[Piece]:
    """Yield the pieces of the event array; ``info`` gains the preamble and container.

    Pieces of a plain file are byte ranges the worker reads itself, and ``info.sha256``
    stays empty (the caller takes it with ``sha256_of``); pieces of a gzip file carry their
    text, and the file is hashed as it is read.
    """
    blocks = _text_blocks(info)
    buf = b""
    for block in blocks:
        buf += block
        if buf.lstrip(WHITESPACE):
            break
    lead = len(buf) - len(buf.lstrip(WHITESPACE))
    if len(buf) == lead:
        raise TraceFileError("empty file (only whitespace)")
    if buf[lead : lead + 1] == b"[":
        info.container = "array"
        start = lead + 1
    elif buf[lead : lead + 1] == b"{":
        info.container = "object"
        while True:
            m = TRACE_EVENTS_KEY.search(buf, lead)
            if m:
                break
            if len(buf) > PREAMBLE_LIMIT:
                raise TraceFileError("no traceEvents array in the first 256 MB")
            block = next(blocks, None)
            if block is None:
                raise TraceFileError("not a trace: JSON object without a traceEvents array")
            buf += block
        info.preamble = buf[lead + 1 : m.start()]
        start = m.end()
    else:
        text = buf[lead : lead + 20].decode("utf-8", "replace")
        raise TraceFileError(f"not JSON: starts with {text!r}")
    if info.compression == "none":
        blocks.close()
        yield from _range_pieces(info, start, piece_bytes)
    else:
        yield from _text_pieces(blocks, buf[start:], start, piece_bytes)
        info.sha256 = info.hasher.hexdigest()


def _text_pieces(blocks: Iterator[bytes], buf: bytes, offset: int, piece_bytes: int
                 ) -> Iterator[Piece]:
    seq = 0
    eof = False
    gap = b""
    while True:
        m = None
        more = [buf]
        size = len(buf)
        while not eof:
            if size > piece_bytes:
                buf = b"".join(more)
                more = [buf]
                m = BOUNDARY.search(buf, piece_bytes)
                if m:
                    break
            block = next(blocks, None)
            if block is None:
                eof = True
            else:
                more.append(block)
                size += len(block)
        buf = b"".join(more) if len(more) > 1 else more[0]
        if m is None:
            yield Piece(seq, buf, offset, seq == 0, True, gap=gap)
            return
        yield Piece(seq, buf[: m.start() + 1], offset, seq == 0, False, gap=gap)
        gap = buf[m.start() + 1 : m.end() - 1]
        nxt = m.end() - 1
        offset += nxt
        buf = buf[nxt:]
        seq += 1


def _range_pieces(info: SourceInfo, start: int, piece_bytes: int) -> Iterator[Piece]:
    """Byte-range pieces of a plain file: the cut after each target offset is found in a
    little text read there, so this process does not read (or hash) the whole file while
    the workers decode it."""
    try:
        f = open(info.path, "rb")  # noqa: SIM115
    except OSError as err:
        raise TraceFileError(f"cannot open: {err.strerror or err}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        seq, piece_start, gap = 0, start, b""
        while True:
            cut = _next_cut(f, piece_start + piece_bytes, size)
            info.bytes_on_disk = info.json_bytes = size if cut is None else cut[0]
            if cut is None:
                yield Piece(seq, None, piece_start, seq == 0, True, info.path,
                            size - piece_start, gap=gap)
                return
            at, nxt, sep = cut
            yield Piece(seq, None, piece_start, seq == 0, False, info.path, at - piece_start,
                        gap=gap)
            seq, piece_start, gap = seq + 1, nxt, sep


def _next_cut(f: BinaryIO, target: int, size: int) -> tuple[int, int, bytes] | None:
    """The first "}, {" separator starting at or after ``target``: (end of this piece,
    start of the next, the separator between them), or None when there is none."""
    pos = target
    while pos < size:
        f.seek(pos)
        try:
            window = f.read(CUT_WINDOW)
        except OSError as err:
            raise TraceFileError(f"read error: {err.strerror or err}") from None
        m = BOUNDARY.search(window)
        if m is not None:
            return pos + m.start() + 1, pos + m.end() - 1, m.group()[1:-1]
        if pos + len(window) >= size:
            return None
        # a separator may straddle the window's end: search again from before it
        pos += max(len(window) - BOUNDARY_CONTEXT, 1)
    return None
