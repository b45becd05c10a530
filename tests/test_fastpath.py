"""The compiled fast decoder builds exactly the tables of the general (msgspec) decoder.

Every piece of every real trace is decoded both ways and compared table by table; minimal
fixtures pin each case the fast path handles itself (string pids, null fields, epoch
timestamps, nested args, counters, metadata, non-ASCII names, the closing bracket) and each
case it must hand to the general decoder (escapes, float pids, exponents, duplicate keys,
unknown phases, broken JSON, a piece cut inside an event), where the result must still equal
the general decoder's.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tracetool.ingest import _scan_kernel as K
from tracetool.ingest import decode, fastpath
from tracetool.ingest.pipeline import Options, ingest
from tracetool.ingest.source import SourceInfo, pieces

from .conftest import REPO_ROOT, TRACES_DIR, corpus_files

# The two corpus files whose pieces go the general way, and why.
CORPUS_FALLBACKS = {
    "ROCm__rocmProfileData/examples/rocm-profile-data/results/matmul_result.json":
        K.EMPTY_EVENT,  # {} sentinels
    "facebookresearch__HolisticTraceAnalysis/tests/data/amd_trace/"
    "mi250_minitoy_train_ROCm6_2_kineto.json.gz": K.FIELD_TYPE,  # a string key value
}


def _both(text: bytes, is_last: bool = False) -> tuple[decode.PieceResult, decode.PieceResult]:
    fast = decode.decode_piece(text, 0, True, is_last, fast=True)
    general = decode.decode_piece(text, 0, True, is_last, fast=False)
    return fast, general


def assert_same(fast: decode.PieceResult, general: decode.PieceResult) -> None:
    assert sorted(fast.tables) == sorted(general.tables)
    for name, table in general.tables.items():
        assert fast.tables[name].schema == table.schema, name
        assert fast.tables[name].equals(table), name
    assert fast.n_read == general.n_read
    assert fast.n_quarantined == general.n_quarantined
    assert [(i.ordinal, i.issue) for i in fast.issues] == \
        [(i.ordinal, i.issue) for i in general.issues]
    assert fast.has_fraction == general.has_fraction
    # the general path's max |ts| comes from doubles before it re-reads long timestamps
    assert math.isclose(fast.max_abs_ts_us, general.max_abs_ts_us, rel_tol=1e-12)
    assert (fast.array_closed, fast.trailer) == (general.array_closed, general.trailer)


def reason(text: bytes, is_last: bool = False) -> int:
    return fastpath.scan(text, is_last)[1]


def events(*objs: str) -> bytes:
    return ", ".join(objs).encode()


X = '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 8, "ts": 10.5, ' \
    '"dur": 2, "args": {"External id": 11, "Ev Idx": 3}}'


@pytest.mark.skipif(not TRACES_DIR.is_dir(), reason="real trace corpus not found")
def test_every_corpus_piece_decodes_the_same_both_ways() -> None:
    fast_pieces = 0
    fell_back: dict[str, int] = {}
    for f in corpus_files():
        if f.name.endswith(("_et.json", "_et.json.gz")):
            continue
        info = SourceInfo(path=f)
        for p in pieces(info, 16 << 20):
            text = p.load()
            sc, why, _ = fastpath.scan(text, p.is_last)
            if sc is None or fastpath.fast_tables(sc) is None:
                fell_back[f.relative_to(TRACES_DIR).as_posix()] = why
                continue
            fast = decode.decode_piece(text, p.offset, p.is_first, p.is_last, fast=True)
            general = decode.decode_piece(text, p.offset, p.is_first, p.is_last, fast=False)
            assert_same(fast, general)
            fast_pieces += 1
    assert fell_back == CORPUS_FALLBACKS
    assert fast_pieces >= 60


@pytest.mark.parametrize("objs", [
    [X],
    # string pids and tids (2020-era "Spans", "stream 7"), numeric strings, null fields
    ['{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "pid": "Spans", '
     '"tid": "PyTorch Profiler", "ts": 1, "dur": 5}',
     '{"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 3, '
     '"dur": 1, "args": {"device": 0, "stream": 7, "correlation": 99}}',
     '{"ph": "X", "cat": null, "name": null, "pid": " 12 ", "tid": null, "ts": -4.25, '
     '"dur": 0}'],
    # epoch microseconds with ns decimals (a double cannot hold them) and whole ones
    ['{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 2, '
     '"ts": 1712195496004644.123, "dur": 1.001}',
     '{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, '
     '"ts": 1712195496004645, "s": "t", "args": {"Bytes": -64}}'],
    # args that are not objects, keys whose values are not integers, nested values
    ['{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
     '"args": null}',
     '{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
     '"args": [1, 2]}',
     '{"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
     '"args": {"device": true, "stream": [1], "Input Dims": [[1, 2], []], '
     '"x": {"y": {"z": [null, false, 1e5, "s\\"q"]}}, "External id": 5}}',
     '{"ph": "X", "cat": "cpu_op", "name": "d", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
     '"args": {}}'],
    # flows, async events, counters, metadata, unknown top-level keys
    ['{"ph": "s", "id": 5, "pid": 1, "tid": 1, "ts": 1, "cat": "ac2g", "name": "ac2g"}',
     '{"ph": "f", "id": 5, "pid": 1, "tid": 2, "ts": 2, "cat": "ac2g", "name": "ac2g", '
     '"bp": "e"}',
     '{"ph": "b", "id": 9, "pid": 1, "tid": 1, "ts": 1, "cat": "a", "name": "n"}',
     '{"ph": "e", "id": "0x9", "pid": 1, "tid": 1, "ts": 2, "cat": "a", "name": "n"}',
     '{"ph": "C", "name": "mem", "pid": 1, "ts": 3, "args": {"used": 5, "free": "7"}}',
     '{"ph": "C", "name": "empty", "pid": 1, "ts": 3, "args": {"x": "y"}}',
     '{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}',
     '{"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 3}}',
     '{"tts": 5, "ph": "X", "dev": {"a": 1}, "cat": "cpu_op", "name": "z", "pid": 1, '
     '"tid": 1, "ts": 1, "dur": 1}'],
    # non-ASCII names and args
    ['{"ph": "X", "cat": "user_annotation", "name": "étape ✓", "pid": 1, "tid": 1, "ts": 1, '
     '"dur": 1, "args": {"note": "日本"}}'],
])
def test_fast_path_handles(objs: list[str]) -> None:
    text = events(*objs)
    assert reason(text) == K.OK
    fast, general = _both(text)
    assert_same(fast, general)


def test_last_piece_with_trailer() -> None:
    text = (X + ',\n  ' + X + '\n  ],\n  "displayTimeUnit": "ms"\n}\n').encode()
    assert reason(text, is_last=True) == K.OK
    fast, general = _both(text, is_last=True)
    assert fast.array_closed and fast.trailer.lstrip(b", \n").startswith(b'"displayTimeUnit"')
    assert_same(fast, general)


@pytest.mark.parametrize(("text", "why"), [
    ('{"ph": "X", "name": "a\\"b", "pid": 1, "tid": 1, "ts": 1, "dur": 1}', K.ESCAPE),
    ('{"ph": "X", "name": "a", "pid": 1.5, "tid": 1, "ts": 1, "dur": 1}', K.FIELD_TYPE),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1e3, "dur": 1}', K.NUMBER_FORM),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.2345, "dur": 1}', K.NUMBER_FORM),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": "12", "dur": 1}', K.FIELD_TYPE),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "ts": 2, "dur": 1}',
     K.DUPLICATE_KEY),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
     '"args": {"External id": "7"}}', K.FIELD_TYPE),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "id": '
     '18446744073709551615}', K.NUMBER_FORM),
    ('{"ph": "XX", "name": "a", "pid": 1, "tid": 1, "ts": 1}', K.LONG_PH),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1', K.END_OF_PIECE),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1,}', K.BAD_JSON),
    ('{"ph": "X", "name": "a\x01", "pid": 1, "tid": 1, "ts": 1, "dur": 1}', K.BAD_JSON),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"x": tru}}',
     K.BAD_JSON),
    ('{}', K.EMPTY_EVENT),
    ('[1]', K.NOT_AN_OBJECT),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1} x', K.TRAILING),
])
def test_scanner_hands_over(text: str, why: int) -> None:
    assert reason(text.encode()) == why
    fast, general = _both(text.encode())
    assert_same(fast, general)


@pytest.mark.parametrize(("text", "issue"), [
    ('{"ph": "P", "name": "sample", "pid": 1, "tid": 1, "ts": 1}', "unsupported_phase"),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1}', "missing_dur"),
    ('{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": -3}', "negative_dur"),
    ('{"ph": "i", "name": "a", "pid": 1, "tid": 1}', "missing_ts"),
    ('{"ph": "f", "id": " 5", "pid": 1, "tid": 1, "ts": 1}', None),  # a string flow id
])
def test_tables_hand_over(text: str, issue: str | None) -> None:
    sc, why, _ = fastpath.scan(text.encode(), False)
    assert why == K.OK and fastpath.fast_tables(sc) is None
    fast, general = _both(text.encode())
    assert_same(fast, general)
    if issue:
        assert [i.issue for i in fast.issues] == [issue]
    else:
        assert fast.tables["flows"]["flow_id"].to_pylist() == [5]


def test_invalid_utf8_hands_over() -> None:
    text = b'{"ph": "X", "name": "a\xff", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    assert reason(text) == K.BAD_JSON
    fast, general = _both(text)
    assert_same(fast, general)


@pytest.fixture(scope="module")
def generated_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6 MB Kineto-shaped trace from the benchmark generator."""
    trace = tmp_path_factory.mktemp("gen") / "rank0.json"
    subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "gen_trace.py"),
                    "--size", "6MB", "--steps", "4", "--out", str(trace)], check=True)
    return trace


def test_ingest_without_the_scanner(generated_trace: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """When the compiled scanner cannot load (numba missing or broken), the ingest decodes
    every piece the general way instead of failing."""
    monkeypatch.setattr(decode, "FAST_MIN_BYTES", 1 << 20)  # restored after the test

    def broken() -> None:
        raise RuntimeError("numba cannot compile here")

    monkeypatch.setattr(fastpath, "warm", broken)
    (r,) = ingest([generated_trace], Options(store=tmp_path / "s", job="j", workers=2,
                                             piece_bytes=2 << 20))
    assert r.status == "ingested" and r.events_quarantined == 0
    assert r.events_stored == r.events_read == len(json.loads(generated_trace.read_bytes())[
        "traceEvents"])
    assert decode.FAST_MIN_BYTES == 1 << 62


def test_store_is_the_same_either_way(generated_trace: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated 6 MB trace through the whole ingest: the fast path (its pieces are large
    enough) and the general path write identical stores."""
    trace = generated_trace
    stores = {}
    for tag, threshold in (("fast", 0), ("general", 1 << 62)):
        monkeypatch.setattr(decode, "FAST_MIN_BYTES", threshold)
        stores[tag] = tmp_path / tag
        opts = Options(store=stores[tag], job="j", workers=2, piece_bytes=2 << 20)
        (r,) = ingest([trace], opts)
        assert r.status == "ingested" and r.events_quarantined == 0
    con = duckdb.connect()
    tables = sorted(d.name for d in (stores["fast"] / "data/job=j/rank=0").iterdir())
    assert "events" in tables and "gpu_ops" in tables
    for t in tables:
        a, b = (f"read_parquet('{stores[k]}/data/job=j/rank=0/{t}/*.parquet')"
                for k in ("fast", "general"))
        cols = [c[0] for c in con.execute(f"DESCRIBE SELECT * FROM {a}").fetchall()
                if c[0] not in ("ingested_at",)]
        sel = ", ".join(f'"{c}"' for c in cols)
        n = con.execute(f"SELECT count(*) FROM {a}").fetchone()[0]
        diff = con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM {a} EXCEPT ALL "
                           f"SELECT {sel} FROM {b})").fetchone()[0]
        assert diff == 0, t
        assert n == con.execute(f"SELECT count(*) FROM {b}").fetchone()[0], t


def test_mutated_pieces_decode_the_same_both_ways() -> None:
    """Random one-byte damage to a real piece (the sample trace): whatever the scanner accepts
    must be exactly what the general decoder reads, and whatever it does not accept goes the
    general way. Guards against the scanner taking JSON that msgspec would reject or read
    differently."""
    path = REPO_ROOT / "sample_traces" / "ddp_gloo_2rank" / "rank0.pt.trace.json.gz"
    (piece,) = list(pieces(SourceInfo(path=path), 64 << 20))
    sample = piece.load()[:200_000]
    sample = sample[:sample.rindex(b"}") + 1]  # whole events only (not the last piece)
    rng = random.Random(20261129)
    alphabet = b'{}[]",:\\ -.0123456789eEtfnulx\x00\x1f\xff'
    scanned = 0
    for _ in range(300):
        b = bytearray(sample)
        k = rng.randrange(len(b))
        op = rng.randrange(3)
        if op == 0:
            b[k] = rng.choice(alphabet)
        elif op == 1:
            del b[k]
        else:
            b.insert(k, rng.choice(alphabet))
        damaged = bytes(b)
        fast, general = _both(damaged)
        assert_same(fast, general)
        scanned += fastpath.scan(damaged, False)[0] is not None
    assert 0 < scanned < 300  # both kinds of outcome were exercised
