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
PREAMBLE_LIMIT = 256 << 20
GZIP_MAGIC = b"\x1f\x8b"
TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class TraceFileError(Exception):
    """A file that cannot be ingested; the message is one line naming the problem."""


@dataclass
class Piece:
    seq: int
    text: bytes
    offset: int  # offset of text[0] in the JSON text
    is_first: bool
    is_last: bool


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


def _raw_blocks(info: SourceInfo) -> Iterator[bytes]:
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
                block = f.read(READ_BLOCK)
            except OSError as err:
                raise TraceFileError(f"read error: {err.strerror or err}") from None
            if not block:
                return
            info.bytes_on_disk += len(block)
            info.hasher.update(block)
            yield block


def _text_blocks(info: SourceInfo) -> Iterator[bytes]:
    raw = _raw_blocks(info)
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
    """Yield the pieces of the event array; ``info`` gains the preamble and container."""
    blocks = _text_blocks(info)
    buf = b""
    for block in blocks:
        buf += block
        stripped = buf.lstrip(b"\xef\xbb\xbf \t\r\n")
        if stripped:
            break
    buf = buf.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not buf:
        raise TraceFileError("empty file (only whitespace)")
    offset = 0
    if buf[:1] == b"[":
        info.container = "array"
        start = 1
    elif buf[:1] == b"{":
        info.container = "object"
        while True:
            m = TRACE_EVENTS_KEY.search(buf)
            if m:
                break
            if len(buf) > PREAMBLE_LIMIT:
                raise TraceFileError("no traceEvents array in the first 256 MB")
            block = next(blocks, None)
            if block is None:
                raise TraceFileError("not a trace: JSON object without a traceEvents array")
            buf += block
        info.preamble = buf[1 : m.start()]
        start = m.end()
    else:
        raise TraceFileError(
            f"not JSON: starts with {buf[:20].decode('utf-8', 'replace')!r}"
        )
    buf = buf[start:]
    offset = start
    seq = 0
    first = True
    eof = False
    while True:
        while not eof and len(buf) < piece_bytes + (1 << 20):
            block = next(blocks, None)
            if block is None:
                eof = True
                break
            buf += block
        if eof:
            yield Piece(seq, buf, offset, first, True)
            break
        m = BOUNDARY.search(buf, piece_bytes)
        while m is None and not eof:
            block = next(blocks, None)
            if block is None:
                eof = True
                break
            buf += block
            m = BOUNDARY.search(buf, piece_bytes)
        if m is None:
            yield Piece(seq, buf, offset, first, True)
            break
        cut = m.start() + 1
        yield Piece(seq, buf[:cut], offset, first, False)
        nxt = m.end() - 1
        offset += nxt
        buf = buf[nxt:]
        seq += 1
        first = False
    info.sha256 = info.hasher.hexdigest()
