"""Cutting the event array into pieces: a plain file's cuts (found by reading a little text
at each target offset) must be exactly those of the same text streamed from gzip."""

from __future__ import annotations

import gzip
import hashlib
import random
from pathlib import Path

import pytest

from tracetool.ingest import source
from tracetool.ingest.source import SourceInfo, pieces, sha256_of


def _trace(rng: random.Random, n: int) -> bytes:
    """Events of varied sizes joined by separators with up to 12 bytes of whitespace."""
    evs = []
    for i in range(n):
        pad = "x" * rng.randrange(0, 120)
        evs.append(f'{{"ph":"X","name":"op{i}{pad}","pid":1,"tid":1,"ts":{i},"dur":1}}')
    seps = ["," + " " * rng.randrange(0, 6) + "\n" * rng.randrange(0, 2)
            + "\t" * rng.randrange(0, 5) for _ in evs]
    body = "".join(e + s for e, s in zip(evs[:-1], seps, strict=False)) + evs[-1]
    return ('{"schemaVersion": 1, "traceEvents": [' + body + ']}\n').encode()


@pytest.mark.parametrize("window, context", [(1 << 20, 1 << 16), (40, 16), (23, 20)])
def test_plain_cuts_equal_streamed_cuts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        window: int, context: int) -> None:
    monkeypatch.setattr(source, "CUT_WINDOW", window)
    monkeypatch.setattr(source, "BOUNDARY_CONTEXT", context)
    rng = random.Random(7)
    text = _trace(rng, 400)
    plain, gz = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(text)
    gz.write_bytes(gzip.compress(text, mtime=0))
    for piece_bytes in (700, 1500, 1 << 20):
        a_info, b_info = SourceInfo(path=plain), SourceInfo(path=gz)
        a, b = list(pieces(a_info, piece_bytes)), list(pieces(b_info, piece_bytes))
        assert [(p.offset, p.is_first, p.is_last, p.gap) for p in a] == [
            (p.offset, p.is_first, p.is_last, p.gap) for p in b]
        assert [p.load() for p in a] == [p.text for p in b]
        if piece_bytes < len(text):
            assert len(a) > 5
        # the pieces and separators rebuild the event array exactly
        start = text.index(b"[") + 1
        assert b"".join(p.gap + p.load() for p in a) == text[start:]
        assert a_info.bytes_on_disk == a_info.json_bytes == len(text)
        assert a_info.sha256 == ""  # a plain file is hashed by the caller, later
        assert b_info.sha256 == hashlib.sha256(gz.read_bytes()).hexdigest()


def test_sha256_of_and_unreadable_file(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_bytes(b"[]" * 5_000_000)
    assert sha256_of(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    with pytest.raises(source.TraceFileError, match="read error"):
        sha256_of(tmp_path / "missing.json")
