"""Read a trace file as a stream of JSON text blocks, and cut its event array into pieces.

One pass over the file does three things: hash the bytes on disk (sha256, for idempotent
re-ingest), gunzip when the file starts with the gzip magic (isal, multi-member aware), and
hand out pieces of the ``traceEvents`` array of about ``piece_bytes`` each, cut at a ``}, {``
boundary so workers can decode them independently. Memory stays at a few pieces.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from isal import isal_zlib

from .decode import BOUNDARY

READ_BLOCK = 8 << 20
GZIP_READ_BLOCK = 1 << 20  # inflates to ~10-20 MB of text per step
PREAMBLE_LIMIT = 256 << 20
GZIP_MAGIC = b"\x1f\x8b"
TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
WHITESPACE = b"\xef\xbb\xbf \t\r\n"
BOUNDARY_CONTEXT = 1 << 16  # a "}, {" separator longer than this is not found


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
            info.hasher.update(block)
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
        pending = block
    if not d.eof:
        info.gzip_truncated = True  # salvage what was decompressed


def pieces(info: SourceInfo, piece_bytes: int = 32 << 20) -> Iterator[Piece]:
    """Yield the pieces of the event array; ``info`` gains the preamble and container.

    Pieces of a plain file are byte ranges the worker reads itself (the main process only
    hashes the file and finds the cut points); pieces of a gzip file carry their text.
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
        yield from _range_pieces(info, blocks, buf, start, piece_bytes)
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


def _range_pieces(info: SourceInfo, blocks: Iterator[bytes], head: bytes, start: int,
                  piece_bytes: int) -> Iterator[Piece]:
    """Cut points of a plain file found while hashing it; text stays on disk.

    The cut after ``target`` is searched for in the block holding ``target``; the text is
    only copied (the previous block's tail joined to this block) when ``target`` lies in
    that tail or a separator straddles two blocks."""
    seq = 0
    piece_start = start
    gap = b""
    block, block_off = head, 0  # the current block and its offset in the file
    tail = b""  # the last BOUNDARY_CONTEXT bytes before block
    while True:
        target = piece_start + piece_bytes
        m = None
        base = block_off
        if block_off + len(block) > target:
            if target >= block_off:
                m = BOUNDARY.search(block, target - block_off)
            if m is None:  # target in the tail, or a separator across the block edge
                window = tail + block
                base = block_off - len(tail)
                m = BOUNDARY.search(window, max(0, target - base))
        if m is not None:
            cut = base + m.start() + 1
            yield Piece(seq, None, piece_start, seq == 0, False, info.path, cut - piece_start,
                        gap=gap)
            gap = m.group()[1:-1]
            piece_start = base + m.end() - 1
            seq += 1
            continue
        nxt = next(blocks, None)
        if nxt is None:
            end = block_off + len(block)
            yield Piece(seq, None, piece_start, seq == 0, True, info.path, end - piece_start,
                        gap=gap)
            return
        tail = (tail + block)[-BOUNDARY_CONTEXT:] if len(block) < BOUNDARY_CONTEXT \
            else block[-BOUNDARY_CONTEXT:]
        block_off += len(block)
        block = nxt
