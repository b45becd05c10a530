"""A bounded property-based fuzz of ingest (issue 12): a real trace cropped to 400 events,
damaged by hypothesis (bytes changed, dropped or inserted; JSON punctuation inside strings;
out-of-range and non-finite numbers; invalid UTF-8; deep nesting; a long string; truncation;
a broken start; gzip), then ingested by the CLI with either decoder and pieces of several
sizes. Whatever the damage: no traceback (exit 0 or 1, every stderr line a 'tracetool: '
line), and an ingested file conserves its events and leaves a store whose every string
column reads back.

Fixed seed (derandomize) and budget: the same 50 examples on every run, about 40 s.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tracetool
from tracetool.ingest import build, decode, source

from .conftest import TRACES_DIR, run_ingest
from .test_door import stored_rows, string_columns_work

BASE = (TRACES_DIR / "facebookresearch__param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto"
        / "dlrm_kineto" / "worker0_step_12.1694128201545.pt.trace.json")

PUNCTUATION = [b"}, {", b"},{", b"}\n, {", b"]", b"}]", b'\\"traceEvents\\": [', b"[{",
               b'\\"}, {\\"ph\\": \\"X\\"}, {\\"']
NUMBERS = [b"9300000000000000", b"1e19", b"-1e300", b"1e300", b"1e400", b"NaN", b"-Infinity",
           b"-9223372036854775809", b'"1e999999999"', b"9000000000000000", b"0.0001"]
BAD_UTF8 = [b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]
BYTES = b'{}[]",:\\ -.0123456789eEtfnulxXB\x00\x1f\x7f\xff'


@functools.cache
def cropped() -> bytes:
    """The base trace cropped to 400 events (150 CPU ops, then the last 250: runtime calls,
    kernels, flows, metadata), written the way Kineto writes it."""
    doc = json.loads(BASE.read_text())
    evs = doc.pop("traceEvents")
    evs = evs[:150] + evs[-250:]
    body = ",\n  ".join(json.dumps(e) for e in evs)
    return (json.dumps(doc)[:-1] + ',\n  "traceEvents": [\n  ' + body + "\n]}\n").encode()


@st.composite
def mutant(draw: st.DrawFn, text: bytes) -> bytes:
    """``text`` with one to four kinds of damage."""
    b = bytearray(text)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["byte", "punct", "number", "utf8", "deep", "long",
                                   "truncate", "head"]))
        if op == "byte":
            k = draw(st.integers(0, len(b) - 1))
            how = draw(st.sampled_from(["set", "delete", "insert"]))
            c = draw(st.sampled_from(BYTES))
            if how == "set":
                b[k] = c
            elif how == "delete":
                del b[k]
            else:
                b.insert(k, c)
        elif op in ("punct", "utf8", "long"):
            # inside a string: just after the opening quote of a name or a string value
            starts = [m.end() for m in re.finditer(rb'": "', b)]
            k = draw(st.sampled_from(starts)) if starts else 0
            piece = (draw(st.sampled_from(PUNCTUATION)) * draw(st.integers(1, 50))
                     if op == "punct" else draw(st.sampled_from(BAD_UTF8)) if op == "utf8"
                     else b"x" * 40_000)
            b[k:k] = piece
        elif op == "number":
            spots = [m.span(1) for m in re.finditer(rb'"(?:ts|dur)": ([-0-9.e]+)', b)]
            if spots:
                s, e = draw(st.sampled_from(spots))
                b[s:e] = draw(st.sampled_from(NUMBERS))
        elif op == "deep":
            spots = [m.end() for m in re.finditer(rb'"args": \{', b)]
            if spots:
                k = draw(st.sampled_from(spots))
                d = draw(st.sampled_from([600, 1000, 5000]))
                b[k:k] = b'"deep": ' + b"[" * d + b"]" * d + b", "
        elif op == "truncate":
            del b[draw(st.integers(len(b) // 2, len(b) - 1)):]
        else:  # the file's start: a broken container or preamble
            k = draw(st.integers(1, 200))
            b[:k] = draw(st.sampled_from([b"", b" " * k, b"\xff" * k, b"[", b'{"a": ',
                                          b"\x1f\x8b"]))
    return bytes(b)


@pytest.mark.skipif(not BASE.is_file(), reason="real trace corpus not found")
@settings(derandomize=True, max_examples=50, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_real_trace_never_tracebacks_and_always_conserves(
        data: st.DataObject, monkeypatch: pytest.MonkeyPatch) -> None:
    text = data.draw(mutant(cropped()))
    gz = data.draw(st.booleans())
    fast = data.draw(st.booleans())
    piece_bytes, max_event_bytes = data.draw(st.sampled_from(
        [(16 << 20, 64 << 20), (4000, 1 << 20), (1500, 20_000)]))
    monkeypatch.setattr(decode, "FAST_MIN_BYTES", 0 if fast else 1 << 62)
    monkeypatch.setattr(build, "pieces", lambda info, *_: source.pieces(
        info, piece_bytes, max_event_bytes))
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / ("rank0.json.gz" if gz else "rank0.json")
        f.write_bytes(gzip.compress(text, 1) if gz else text)
        store = Path(tmp) / "store"
        r = run_ingest([f], store, "--rank", "0")
        assert r.exit_code in (0, 1), r.stderr
        assert all(line.startswith("tracetool: ") for line in r.stderr.splitlines()), r.stderr
        if r.exit_code == 1:
            event("an error for the file")
            assert r.results and r.results[0]["status"] == "error", r.stdout
            assert r.stderr.splitlines()[-1].startswith(f"tracetool: error: {f}: ")
            return
        (res,) = r.results
        event("ingested, " + ("some quarantined" if res["events_quarantined"] else "none "
                              "quarantined"))
        con = tracetool.connect(store)
        row = con.execute("SELECT events_read, events_stored, events_quarantined FROM "
                          "trace_files").fetchone()
        assert row == (res["events_read"], res["events_stored"], res["events_quarantined"])
        assert row[0] == row[1] + row[2]
        assert con.execute("SELECT count(*) FROM ingest_issues WHERE quarantined"
                           ).fetchone() == (row[2],)
        rows = stored_rows(con)
        if re.search(rb'"ph"\s*:\s*"E', text):  # a B/E pair is one row for two events
            assert rows <= row[1]
        else:
            assert rows == row[1]
        string_columns_work(store, views=False, con=con)
