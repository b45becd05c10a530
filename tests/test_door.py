"""Values checked at the door (issue 12): out-of-range times, invalid UTF-8, JSON punctuation
inside strings, deep nesting, events over the size limit, and whitespace before the event
array. Inputs are real traces of the corpus (or the repo's sample trace) with events changed
or added at test time; every case runs the real CLI and reads the store with DuckDB."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tracetool
from tracetool.ingest import decode, source
from tracetool.ingest.pipeline import Options
from tracetool.ingest.pipeline import ingest as ingest_api
from tracetool.ingest.source import SourceInfo, pieces
from tracetool.schema import TABLES_BY_NAME

from .conftest import REPO_ROOT, TRACES_DIR, run_ingest
from .test_fastpath import assert_same

REAL = TRACES_DIR / "pytorch__kineto" / "docs" / "traces" / "after_fix_trace.json"
SAMPLE = REPO_ROOT / "sample_traces" / "ddp_gloo_2rank" / "rank0.pt.trace.json.gz"
SAMPLE_EVENTS = 888
DECODERS = {"fast": 0, "general": 1 << 62}  # decode.FAST_MIN_BYTES forcing each decoder

needs_corpus = pytest.mark.skipif(not REAL.is_file(), reason="real trace corpus not found")


def real_doc() -> dict:
    """The real trace, without its baseTimeNanoseconds: the derivation stage adds the base
    to every ts, and the cases below go up to the very end of int64 ns."""
    doc = json.loads(REAL.read_text())
    doc.pop("baseTimeNanoseconds")
    return doc


def trace_text(doc: dict, extra: list[bytes]) -> bytes:
    """``doc`` with raw event texts appended to its traceEvents."""
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    evs = [json.dumps(e).encode() for e in doc["traceEvents"]] + extra
    return (json.dumps(head)[:-1].encode() + b', "traceEvents": [\n' + b",\n".join(evs)
            + b"\n]}\n")


def raw(ev: dict, **fields: bytes) -> bytes:
    """``ev`` as JSON text with some fields' values written as raw bytes (tokens no JSON
    encoder writes: NaN, 1e400, invalid UTF-8)."""
    text = json.dumps({**ev, **{k: f"@{k}@" for k in fields}}).encode()
    for k, v in fields.items():
        text = text.replace(f'"@{k}@"'.encode(), v)
    return text


def first(doc: dict, cat: str) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("cat") == cat)


def run_cli(tmp_path: Path, text: bytes, *options: str, name: str = "t.json",
            gz: bool = False) -> tuple[dict, Path, str]:
    f = tmp_path / name
    f.write_bytes(gzip.compress(text, 1) if gz else text)
    store = tmp_path / "store"
    r = run_ingest([f], store, "--rank", "0", *options)
    assert r.exit_code == 0, r.stderr
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, r.stderr
    return r.results[0], store, r.stderr


def string_columns_work(store: Path, views: bool = True, con: object = None) -> None:
    """Every string column of every store table (and analysis view) reads back, store-wide
    (a store with invalid UTF-8 fails here: 'Invalid string encoding found in Parquet
    file'). Without views, each table's columns as DuckDB reads them (duckdb_columns()
    binds every view: 1.2 s a call); ``con``: a connection to the store already open."""
    con = con or tracetool.connect(store)
    cols: dict[str, list[str]] = {}
    if views:
        for t, c in con.execute("SELECT table_name, column_name FROM duckdb_columns() "
                                "WHERE data_type = 'VARCHAR' AND NOT internal").fetchall():
            cols.setdefault(t, []).append(c)
    else:
        for t in TABLES_BY_NAME:
            rel = con.sql(f'SELECT * FROM "{t}"')
            cols[t] = [c for c, ty in zip(rel.columns, rel.types, strict=True)
                       if str(ty) == "VARCHAR"]
        cols = {t: cs for t, cs in cols.items() if cs}
    assert "events" in cols and "args" in cols["events"]
    for t, cs in cols.items():
        total = " + ".join(f'coalesce(length("{c}"), 0)' for c in cs)
        con.execute(f'SELECT count(*), sum({total}) FROM "{t}"').fetchone()


def stored_rows(con: object) -> int:
    """Events the store holds a row for (a counter event has a row per series; a B/E pair
    is one row for two events, none in these inputs)."""
    return con.execute("""SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM flows)
        + (SELECT count(DISTINCT eid) FROM counters)
        + (SELECT count(*) FROM metadata_events)""").fetchone()[0]


def conserved(r: dict, store: Path) -> None:
    con = tracetool.connect(store)
    row = con.execute("SELECT events_read, events_stored, events_quarantined FROM trace_files"
                      ).fetchone()
    assert row == (r["events_read"], r["events_stored"], r["events_quarantined"])
    assert row[0] == row[1] + row[2]
    assert stored_rows(con) == row[1]
    assert con.execute("SELECT count(*) FROM ingest_issues WHERE quarantined").fetchone() == (
        row[2],)


# --------------------------------------------------------------------------- times


TIME_CASES = [  # (ts, dur, the reason, or None: stored with these exact ns)
    (b"9300000000000000", b"1", "ts 9300000000000000 us is outside the int64 ns range"),
    (b"1e19", b"1", "ts 1e+19 us is outside the int64 ns range"),
    (b"-1e19", b"1", "ts -1e+19 us is outside the int64 ns range"),
    (b'"9300000000000000"', b"1", "ts 9300000000000000 us is outside the int64 ns range"),
    (b"1e400", b"1", "ts 1e400 us is outside the int64 ns range"),
    (b"5", b"-1e300", "dur -1e+300 us is outside the int64 ns range"),
    (b"5", b"1e300", "dur 1e+300 us is outside the int64 ns range"),
    (b"5", b"9300000000000000", "dur 9300000000000000 us is outside the int64 ns range"),
    (b"NaN", b"1", "ts NaN is not a number"),
    (b"5", b"NaN", "dur NaN is not a number"),
    (b"5", b"Infinity", "dur Infinity us is outside the int64 ns range"),
    (b"-Infinity", b"1", "ts -Infinity us is outside the int64 ns range"),
    (b"9000000000000000", b"300000000000000",
     "end ts 9000000000000000 + dur 300000000000000 us is outside the int64 ns range"),
    (b"9000000000000000", b"1", (9_000_000_000_000_000_000, 1000)),
    (b"-9000000000000000", b"0.001", (-9_000_000_000_000_000_000, 1)),
    (b"9223372036854774.807", b"0", (9_223_372_036_854_774_807, 0)),
]


@needs_corpus
@pytest.mark.parametrize("decoder", DECODERS)
def test_times_outside_int64_ns_are_quarantined_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str) -> None:
    """Wrapped ns (9300000000000000 us stored as -9146744073709551616), zeros for 1e19 and
    1e300, 'negative dur' for a huge dur and an overflowing end were stored or misreported;
    now each is quarantined with its reason, the same in both decoders."""
    monkeypatch.setattr(decode, "FAST_MIN_BYTES", DECODERS[decoder])
    doc = real_doc()
    op = {**first(doc, "cpu_op"), "args": {"External id": 7}}
    n = len(doc["traceEvents"])
    extra = [raw({**op, "name": f"case{i}"}, ts=ts, dur=dur)
             for i, (ts, dur, _) in enumerate(TIME_CASES)]
    text = trace_text(doc, extra)
    r, store, _ = run_cli(tmp_path, text)
    bad = [(n + i, why) for i, (_, _, why) in enumerate(TIME_CASES) if isinstance(why, str)]
    assert (r["events_read"], r["events_quarantined"]) == (n + len(TIME_CASES), len(bad))
    con = tracetool.connect(store)
    assert con.execute("SELECT eid, detail FROM ingest_issues WHERE issue = 'bad_time' "
                       "AND quarantined ORDER BY eid").fetchall() == bad
    assert con.execute("SELECT count(*) FROM ingest_issues WHERE quarantined").fetchone() == (
        len(bad),)
    stored = con.execute("SELECT name, ts_ns, dur_ns FROM events WHERE name LIKE 'case%' "
                         "ORDER BY eid").fetchall()
    assert stored == [(f"case{i}", *why) for i, (_, _, why) in enumerate(TIME_CASES)
                      if not isinstance(why, str)]
    conserved(r, store)
    # and piece by piece, the two decoders build the same tables and issues
    body = text[text.index(b"[") + 1 : text.rindex(b"]")]
    assert_same(decode.decode_piece(body, 0, True, False, fast=True),
                decode.decode_piece(body, 0, True, False, fast=False))


# --------------------------------------------------------------------------- UTF-8


@needs_corpus
@pytest.mark.parametrize("decoder", DECODERS)
def test_invalid_utf8_is_repaired_and_counted_and_the_store_stays_queryable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str) -> None:
    """Invalid UTF-8 in a cpu_op's args was stored as is (afterwards every query touching
    args failed), in a kernel's args it rejected the file; now each event is repaired to
    U+FFFD, stored and counted as repaired_utf8."""
    monkeypatch.setattr(decode, "FAST_MIN_BYTES", DECODERS[decoder])
    doc = real_doc()
    op, kernel = first(doc, "cpu_op"), first(doc, "kernel")
    n = len(doc["traceEvents"])
    extra = [
        raw({**op, "name": "bad_args", "args": "@args@"},
            args=b'{"External id": 11, "Input Dims": "x\xff\xfey"}'),
        raw({**kernel, "name": "bad_kernel_args", "args": "@args@"},
            args=b'{"device": 0, "stream": 7, "correlation": 12, "note": "\xc3"}'),
        raw({**op, "name": "@name@"}, name=b'"cut \xe2\x82"'),
        raw({**op, "name": "bad_cat", "cat": "@cat@"}, cat=b'"cpu\xed\xa0\x80op"'),
        raw({**op, "name": "fine"}, args=b'{"note": "caf\xc3\xa9 \xf0\x9f\x98\x80"}'),
    ]
    r, store, _ = run_cli(tmp_path, trace_text(doc, extra))
    assert (r["events_read"], r["events_stored"], r["events_quarantined"]) == (n + 5, n + 5, 0)
    con = tracetool.connect(store)
    assert con.execute("SELECT eid, detail, quarantined FROM ingest_issues "
                       "WHERE issue = 'repaired_utf8' ORDER BY eid").fetchall() == [
        (n + k, "invalid UTF-8 replaced by U+FFFD; event kept", False) for k in range(4)]
    rows = con.execute(f"SELECT name, cat, args FROM events WHERE eid >= {n} ORDER BY eid"
                       ).fetchall()
    assert rows[0] == ("bad_args", "cpu_op",
                       '{"External id": 11, "Input Dims": "x\ufffd\ufffdy"}')
    assert rows[1][2] == '{"device": 0, "stream": 7, "correlation": 12, "note": "\ufffd"}'
    assert rows[2][0] == "cut \ufffd"
    assert rows[3][1] == "cpu\ufffd\ufffd\ufffdop"
    assert rows[4][2] == '{"note": "caf\u00e9 \U0001f600"}'
    assert con.execute("SELECT count(*) FROM events WHERE args LIKE '%Input Dims%'"
                       ).fetchone() == (1,)
    assert con.execute("SELECT count(*) FROM events WHERE args LIKE '%\ufffd%'").fetchone() == (
        2,)
    assert con.execute("SELECT external_id FROM events WHERE name = 'bad_args'").fetchone() == (
        11,)
    string_columns_work(store)
    conserved(r, store)


# --------------------------------------------------------------------------- the splitter


def sample_doc() -> dict:
    return json.loads(gzip.decompress(SAMPLE.read_bytes()))


PUNCTUATION = ["}, {", "},{", "}\n,\n{", "]", "}]", '"traceEvents": [', "\\", '\\"}, {\\"',
               '{"ph": "X"}, {']


def test_json_punctuation_inside_strings_never_changes_the_count(tmp_path: Path) -> None:
    """A name holding 17 MB of '}, {' made an 888-event file read as 4457336 events (73 s,
    3.4 GB): the cut between pieces, and the lenient splitter, now respect strings."""
    doc = sample_doc()
    evs = doc["traceEvents"]
    assert len(evs) == SAMPLE_EVENTS
    evs[400] = {**evs[400], "name": "}, {" * (17_000_000 // 4)}
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    store = tmp_path / "store"
    out, peak_kb, seconds = measure([sys.executable, "-m", "tracetool", "ingest", str(f),
                                     "--store", str(store), "--json"])
    r = json.loads(out)
    assert (r["events_read"], r["events_stored"], r["events_quarantined"]) == (
        SAMPLE_EVENTS, SAMPLE_EVENTS, 0)
    assert seconds < 30 and peak_kb < 1_000_000, (seconds, peak_kb)
    con = tracetool.connect(store)
    assert con.execute("SELECT length(name) FROM events WHERE eid = 400").fetchone() == (
        17_000_000,)


@pytest.mark.parametrize("gz", [False, True])
def test_every_cut_is_outside_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      gz: bool) -> None:
    """Pieces of a few hundred bytes, names and args full of JSON punctuation: every piece
    is whole events (it decodes alone), and ingest with such pieces counts every event."""
    monkeypatch.setattr(source, "CUT_WINDOW", 64)
    monkeypatch.setattr(source, "BOUNDARY_CONTEXT", 16)
    doc = sample_doc()
    evs = doc["traceEvents"][:300]
    for i, e in enumerate(evs):
        p = PUNCTUATION[i % len(PUNCTUATION)] * (1 + i % 7)
        evs[i] = {**e, "name": f"{e.get('name')}{p}", "args": {**e.get("args", {}), "p": p}}
    doc["traceEvents"] = evs
    text = json.dumps(doc).encode()
    f = tmp_path / ("t.json.gz" if gz else "t.json")
    f.write_bytes(gzip.compress(text, 1) if gz else text)
    found = list(pieces(SourceInfo(path=f), 300))
    assert len(found) > 50
    n = 0
    for p in found:
        body = p.load()
        res = decode.decode_piece(body, p.offset, p.is_first, p.is_last, fast=False)
        assert not res.cut_inside_event and not res.issues, (p.seq, body[:80])
        n += res.n_read
    assert n == len(evs)
    (res,) = ingest_api([f], Options(store=tmp_path / "s", rank=0, job="j", piece_bytes=300,
                                     workers=1))
    assert (res.events_read, res.events_stored, res.events_quarantined) == (len(evs),) * 2 + (
        0,)


# --------------------------------------------------------------------------- nesting


@needs_corpus
@pytest.mark.parametrize("decoder", DECODERS)
def test_deeply_nested_args_are_one_line_quarantines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str) -> None:
    """args nested 1,000 deep raised RecursionError (a traceback); now the event is
    quarantined as too_deep and the rest of the file ingests; 600 deep is stored as is."""
    monkeypatch.setattr(decode, "FAST_MIN_BYTES", DECODERS[decoder])
    doc = real_doc()
    op = first(doc, "cpu_op")
    n = len(doc["traceEvents"])
    nested = {600: b"[" * 600 + b"]" * 600, 1000: b'{"a":' * 1000 + b"1" + b"}" * 1000,
              100_000: b"[" * 100_000 + b"]" * 100_000}
    extra = [raw({**op, "name": f"deep{d}", "args": "@args@"}, args=b'{"x": ' + v + b"}")
             for d, v in nested.items()]
    r, store, _ = run_cli(tmp_path, trace_text(doc, extra))
    assert (r["events_read"], r["events_stored"], r["events_quarantined"]) == (n + 3, n + 1, 2)
    con = tracetool.connect(store)
    issues = con.execute("SELECT eid, issue, quarantined, detail FROM ingest_issues "
                         "ORDER BY eid").fetchall()
    assert [i[:3] for i in issues] == [(n + 1, "too_deep", True), (n + 2, "too_deep", True)]
    assert re.fullmatch(r"nested 1002 levels deep: more than the decoder reads \(about \d+\)",
                        issues[0][3])
    assert issues[1][3].startswith("nested 100002 levels deep")
    assert con.execute("SELECT length(args) FROM events WHERE name = 'deep600'").fetchone() == (
        1207,)
    conserved(r, store)


# --------------------------------------------------------------------------- size limit


def measure(cmd: list[str]) -> tuple[str, int, float]:
    """Run ``cmd`` from a fresh Python process: (stdout, peak RSS of it and every process
    it started, in KB, seconds)."""
    probe = ("import json, resource, subprocess, sys, time\n"
             "t = time.perf_counter()\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "t = time.perf_counter() - t\n"
             "assert p.returncode == 0 and 'Traceback' not in p.stderr, p.stderr\n"
             "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
             "print(json.dumps([p.stdout, rss, t]))\n")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True,
                         check=True, cwd=REPO_ROOT).stdout
    stdout, rss, seconds = json.loads(out)
    return stdout, rss, seconds


@pytest.mark.parametrize("gz", [False, True])
def test_an_event_over_the_limit_is_quarantined_unread(tmp_path: Path, gz: bool) -> None:
    """A single 500 MB string pushed RSS past 4 GB; now an event over --max-event-bytes is
    never read whole: it is quarantined with its size and the limit, the rest ingests, in
    seconds and little memory (here: 100 MB, the default limit of 64 MiB)."""
    doc = sample_doc()
    doc["traceEvents"][300]["name"] = "x" * 100_000_000
    size = len(json.dumps(doc["traceEvents"][300]))
    text = json.dumps(doc).encode()
    f = tmp_path / ("rank0.json.gz" if gz else "rank0.json")
    f.write_bytes(gzip.compress(text, 1) if gz else text)
    del doc, text
    store = tmp_path / "store"
    out, peak_kb, seconds = measure([sys.executable, "-m", "tracetool", "ingest", str(f),
                                     "--store", str(store), "--json"])
    r = json.loads(out)
    assert (r["events_read"], r["events_stored"], r["events_quarantined"]) == (
        SAMPLE_EVENTS, SAMPLE_EVENTS - 1, 1)
    assert seconds < 30 and peak_kb < 600_000, (seconds, peak_kb)
    con = tracetool.connect(store)
    assert con.execute("SELECT eid, issue, detail, quarantined FROM ingest_issues").fetchall() == [
        (300, "event_too_large", f"event of {size} bytes is larger than the limit of 67108864 "
         "bytes (--max-event-bytes); not decoded", True)]
    string_columns_work(store)


@pytest.mark.parametrize("where", [0, 300, SAMPLE_EVENTS - 1])
def test_the_limit_cuts_around_the_event(tmp_path: Path, where: int) -> None:
    """An event over the limit as the first, a middle or the last event, with small pieces:
    one piece of its own (never loaded), the array still closes after the last one."""
    doc = sample_doc()
    doc["traceEvents"][where]["name"] = "}, {" * 5000 + "x" * 30_000
    size = len(json.dumps(doc["traceEvents"][where]))
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    big = [p for p in pieces(SourceInfo(path=f), 2000, max_event_bytes=16_000)
           if p.too_large]
    assert [(p.length, p.too_large) for p in big] == [(size, 16_000)]
    (res,) = ingest_api([f], Options(store=tmp_path / "s", rank=0, job="j", piece_bytes=2000,
                                     workers=1))
    assert (res.events_read, res.events_stored, res.salvaged) == (SAMPLE_EVENTS,) * 2 + (False,)


def test_max_event_bytes_option(tmp_path: Path) -> None:
    doc = sample_doc()
    doc["traceEvents"][10]["name"] = "x" * 3_000_000
    r, store, _ = run_cli(tmp_path, json.dumps(doc).encode(), "--max-event-bytes", "1MiB")
    assert (r["events_stored"], r["events_quarantined"]) == (SAMPLE_EVENTS - 1, 1)
    con = tracetool.connect(store)
    assert "limit of 1048576 bytes" in con.execute("SELECT detail FROM ingest_issues"
                                                   ).fetchone()[0]


# --------------------------------------------------------------------------- the preamble


@pytest.mark.parametrize(("prefix", "message"), [
    (b" " * 3_000_000, "no JSON text in the first 2 MB: only whitespace"),
    (b"\n\t " * 1_000_000, "no JSON text in the first 2 MB: only whitespace"),
    (b"{" + b" " * 3_000_000, "no traceEvents array in the first 2 MB"),
    (b'{"junk": "' + b"j" * 3_000_000 + b'", ', "no traceEvents array in the first 2 MB"),
])
@pytest.mark.parametrize("gz", [False, True])
def test_whitespace_or_junk_before_the_events_is_a_one_line_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: bytes, message: str,
        gz: bool) -> None:
    monkeypatch.setattr(source, "PREAMBLE_LIMIT", 2 << 20)
    f = tmp_path / ("t.json.gz" if gz else "t.json")
    text = prefix + b'"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}]}'
    f.write_bytes(gzip.compress(text, 1) if gz else text)
    r = run_ingest([f], tmp_path / "store", "--rank", "0")
    assert (r.exit_code, r.stderr) == (1, f"tracetool: error: {f}: {message}\n")


def test_gigabytes_of_leading_whitespace_fail_fast(tmp_path: Path) -> None:
    """1 GB of whitespace in a 5 MB .json.gz grew RSS without bound, silently; it now stops
    at the preamble bound (256 MB of text) with a one-line error."""
    block = gzip.compress(b" " * (64 << 20), 1)
    f = tmp_path / "t.json.gz"
    with open(f, "wb") as out:
        for _ in range(16):
            out.write(block)
        out.write(gzip.compress(b'{"traceEvents": []}'))
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "print(p.stderr, end='')\n")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "tracetool",
                          "ingest", str(f), "--store", str(tmp_path / "s"), "--rank", "0"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    status, err = out.split("\n", 1)
    code, peak_kb = map(int, status.split())
    assert (code, err) == (1, f"tracetool: error: {f}: no JSON text in the first 256 MB: "
                              "only whitespace\n")
    assert peak_kb < 600_000


@pytest.mark.parametrize("base, ts", [(9_000_000_000_000_000_000, 8_999_999_999_999_990),
                                      (-9_000_000_000_000_000_000, -8_999_999_999_999_990)])
def test_a_base_time_that_puts_times_outside_int64_is_a_one_line_error(
        tmp_path: Path, base: int, ts: int) -> None:
    doc = sample_doc()
    doc["baseTimeNanoseconds"] = base
    doc["traceEvents"][5]["ts"] = ts  # in range alone, out of range with the base
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    r = run_ingest([f], tmp_path / "store", "--rank", "0")
    assert (r.exit_code, r.stderr) == (1, (
        f"tracetool: error: {f}: baseTimeNanoseconds {base} plus ts up to {abs(ts)} us is "
        "outside the int64 ns range\n"))
    doc["traceEvents"][5]["ts"] = 10  # the same base with small times is fine
    f.write_text(json.dumps(doc))
    assert run_ingest([f], tmp_path / "store2", "--rank", "0").exit_code == 0
