"""Each input quirk of ../shared/docs/kineto-format.md on a minimal fixture, through the CLI."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import con, kineto_text, run, write, x


def ingest_one(tmp_path: Path, text: str | bytes, *extra: str, name: str = "rank0.json",
               gz: bool = False) -> tuple[int, list[dict], str, Path]:
    f = write(tmp_path / name, text, gz=gz)
    store = tmp_path / "store"
    code, out, err = run("ingest", f, "--store", store, "--json", "--job", "t", *extra)
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return code, rows, err, store


def test_object_form_counts_and_exact_relative_times(tmp_path: Path) -> None:
    base = 1743521598000000000
    evs = [x("aten::mm", "4458676522690.655", 10.5), x("aten::add", 4458676522691.001, 1.25),
           {"ph": "i", "s": "t", "name": "mark", "pid": 1, "tid": 1, "ts": 4458676522700.999},
           {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main "}}]
    code, rows, err, store = ingest_one(tmp_path, kineto_text(evs, base=base))
    assert code == 0, err
    assert rows[0]["events_read"] == 4 and rows[0]["events_stored"] == 4
    c = con(store)
    got = c.execute("SELECT eid, ts_ns, dur_ns, depth, parent_eid FROM events ORDER BY eid"
                    ).fetchall()
    assert got == [
        (0, base + 4458676522690655, 10500, 0, None),
        (1, base + 4458676522691001, 1250, 1, 0),
        (2, base + 4458676522700999, 0, 1, 0),  # inside aten::mm
    ]
    assert c.execute("SELECT ts_convention, base_time_ns FROM trace_files").fetchone() == (
        "rel_base", base)
    assert c.execute("SELECT thread_name FROM tracks WHERE tid = 1").fetchone() == ("main",)


def test_absolute_epoch_us_with_decimals_is_exact(tmp_path: Path) -> None:
    # 19 significant digits: a double cannot hold these; the text must be read.
    evs = ['{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,'
           '"ts":1712195495406752.797,"dur":3.001}',
           '{"ph":"X","cat":"cpu_op","name":"b","pid":1,"tid":1,'
           '"ts":1712195495406752.001,"dur":0.999}']
    code, _, err, store = ingest_one(tmp_path, kineto_text(evs))
    assert code == 0, err
    c = con(store)
    assert c.execute("SELECT ts_ns, dur_ns FROM events ORDER BY eid").fetchall() == [
        (1712195495406752797, 3001), (1712195495406752001, 999)]
    assert c.execute("SELECT ts_convention FROM trace_files").fetchone() == ("abs_us_frac",)


def test_integer_epoch_us_and_base_after_trace_events(tmp_path: Path) -> None:
    code, _, err, store = ingest_one(tmp_path, kineto_text([x("a", 1707417525509335, 36)]))
    assert code == 0, err
    c = con(store)
    assert c.execute("SELECT ts_ns, dur_ns FROM events").fetchone() == (1707417525509335000, 36000)
    assert c.execute("SELECT ts_convention FROM trace_files").fetchone() == ("abs_us_int",)
    # baseTimeNanoseconds written after traceEvents (pre-2025-03 order) is still applied
    text = kineto_text([x("a", "12.5", 1)], extra_after=', "baseTimeNanoseconds": 1000000000')
    sub = tmp_path / "b"
    sub.mkdir()
    code, _, err, store2 = ingest_one(sub, text)
    assert code == 0, err
    assert con(store2).execute("SELECT ts_ns FROM events").fetchone() == (1000012500,)


def test_bare_array_legacy_categories_and_string_pids(tmp_path: Path) -> None:
    text = """[
  {"ph": "X", "cat": "Operator", "name": "aten::empty", "pid": 96862, "tid": "2580322112",
   "ts": 1607786188033639, "dur": 36, "args": {"Profiler Event Index": 7}},
  {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7",
   "ts": 1607786188033650, "dur": 5, "args": {"correlation": 3, "stream": 7, "device": 0}},
  {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
   "tid": "PyTorch Profiler", "ts": 1607786188033411, "dur": 1000},
  {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
   "tid": "Trace PyTorch Profiler", "ts": 1607786188033411}
]"""
    code, rows, err, store = ingest_one(tmp_path, text, name="worker3.pt.trace.json")
    assert code == 0, err
    assert rows[0]["rank"] == 3  # from the file name
    c = con(store)
    assert c.execute("SELECT container, rank_source FROM trace_files").fetchone() == (
        "array", "file_name")
    got = c.execute("SELECT name, kind, pid, tid, pid_raw, tid_raw, track_kind, ev_idx "
                "FROM events ORDER BY eid").fetchall()
    assert got == [
        ("aten::empty", "cpu_op", 96862, 2580322112, "96862", "2580322112", "cpu_thread", 7),
        ("k", "kernel", 0, None, "0", "stream 7", "gpu_stream", None),
        ("PyTorch Profiler (0)", "trace_span", None, None, "Spans", "PyTorch Profiler", "span",
         None),
        ("Iteration Start: PyTorch Profiler", "other", None, None, "Traces",
         "Trace PyTorch Profiler", "other", None),
    ]
    assert c.execute("SELECT stream, device FROM gpu_ops").fetchone() == (7, 0)


def test_invalid_json_inside_strings_is_repaired_and_reported(tmp_path: Path) -> None:
    evs = [
        '{"ph":"X","cat":"cpu_op","name":"C:\\Users\\me","pid":1,"tid":1,"ts":1,"dur":1}',
        '{"ph":"X","cat":"cpu_op","name":"line\nbreak","pid":1,"tid":1,"ts":3,"dur":1}',
        '{"ph":"X","cat":"cpu_op","name":"a "quoted" word","pid":1,"tid":1,"ts":5,"dur":1}',
        '{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":1,"ts":7,"dur":1,'
        '"args":{"Collective name":"allreduce","Process Group Description": ,"Group size":2}}',
        x("ok", 9, 1),
    ]
    code, rows, err, store = ingest_one(tmp_path, kineto_text(evs))
    assert code == 0, err
    assert rows[0]["events_read"] == 5 and rows[0]["events_stored"] == 5
    c = con(store)
    names = [r[0] for r in c.execute("SELECT name FROM events ORDER BY eid").fetchall()]
    assert names == ["C:\\Users\\me", "line\nbreak", 'a "quoted" word', "record_param_comms",
                     "ok"]
    issues = c.execute("SELECT eid, issue, quarantined FROM ingest_issues ORDER BY eid").fetchall()
    assert issues == [(0, "repaired_json", False), (1, "repaired_json", False),
                      (2, "repaired_json", False), (3, "repaired_json", False)]
    assert c.execute("SELECT args->>'$.\"Group size\"' FROM events WHERE eid = 3").fetchone() == (
        "2",)


def test_unreadable_event_is_quarantined_not_dropped(tmp_path: Path) -> None:
    evs = [x("a", 1, 1), '{"ph":"X", "name": [1, 2,, 3], "ts": 2}', x("b", 3, 1),
           '{"ph":"O","name":"snapshot","pid":1,"ts":4,"id":"0x1"}', "{}"]
    code, rows, err, store = ingest_one(tmp_path, kineto_text(evs))
    assert code == 0, err
    r = rows[0]
    assert (r["events_read"], r["events_stored"], r["events_quarantined"]) == (5, 2, 3)
    c = con(store)
    assert c.execute("SELECT eid, issue FROM ingest_issues WHERE quarantined ORDER BY eid"
                 ).fetchall() == [(1, "invalid_json"), (3, "unsupported_phase"),
                                  (4, "empty_event")]
    assert c.execute("SELECT events_read, events_stored, events_quarantined FROM trace_files"
                 ).fetchone() == (5, 2, 3)


def test_non_json_tail_after_trace_events(tmp_path: Path) -> None:
    text = kineto_text([x("a", 1, 1)])[:-2] + ',\n"INFO": [not json at all]\n}\n'
    code, _, err, store = ingest_one(tmp_path, text)
    assert code == 0, err
    c = con(store)
    assert c.execute("SELECT count(*) FROM events").fetchone() == (1,)
    assert c.execute("SELECT metadata->>'$.traceName' FROM trace_files").fetchone() == ("x.json",)
    assert c.execute("SELECT issue FROM ingest_issues").fetchone() == ("bad_top_level",)


def test_nan_and_infinity_are_repaired_to_null(tmp_path: Path) -> None:
    # Python's json module writes them (HTA's json.loads reads them); JSON has no such values
    evs = ['{"ph":"X","cat":"cpu_op","name":"record_param_comms","pid":1,"tid":1,"ts":7,'
           '"dur":1,"args":{"Collective name":"allreduce","Seq":3,"a":NaN,"b":-Infinity,'
           '"c":[1, Infinity]}}', x("ok", 9, 1)]
    code, rows, err, store = ingest_one(tmp_path, kineto_text(evs))
    assert code == 0, err
    assert (rows[0]["events_stored"], rows[0]["events_quarantined"]) == (2, 0)
    c = con(store)
    args = json.loads(c.execute("SELECT args FROM events WHERE eid = 0").fetchone()[0])
    assert args == {"Collective name": "allreduce", "Seq": 3, "a": None, "b": None,
                    "c": [1, None]}
    assert c.execute("SELECT eid, issue, quarantined FROM ingest_issues").fetchall() == [
        (0, "repaired_json", False)]
    assert c.execute("SELECT collective, seq FROM collectives").fetchall() == [("allreduce", 3)]


BROKEN_LAST = ('{"ph":"X","cat":"cpu_op","name":"bad","pid":1,"tid":1,"ts":7,"dur":1,'
               '"args":{"x":[{"a":1}], "y": tru}}')


@pytest.mark.parametrize("container", ["object", "array"])
def test_broken_last_event_is_quarantined_and_the_array_still_closes(
        tmp_path: Path, container: str) -> None:
    if container == "object":
        text = kineto_text([x("ok", 1, 1), BROKEN_LAST],
                           extra_after=', "deviceProperties": [{"name": "GPU Z"}]')
    else:
        text = "[" + json.dumps(x("ok", 1, 1)) + ",\n" + BROKEN_LAST + "]\n"
    code, rows, err, store = ingest_one(tmp_path, text)
    assert code == 0, err
    assert "truncated" not in err
    r = rows[0]
    assert (r["events_read"], r["events_stored"], r["events_quarantined"], r["salvaged"]) == (
        2, 1, 1, False)
    c = con(store)
    assert c.execute("SELECT eid, issue, quarantined FROM ingest_issues").fetchall() == [
        (1, "invalid_json", True)]
    if container == "object":
        assert c.execute("SELECT device_names FROM trace_files").fetchone() == (["GPU Z"],)
    (tmp_path / "strict").mkdir()
    code, rows, err, _ = ingest_one(tmp_path / "strict", text, "--strict")
    assert code == 0 and rows[0]["status"] == "ingested", err


def test_uint64_ids_and_flows(tmp_path: Path) -> None:
    evs = [
        x("record_param_comms", 10, 5, **{"Comms Id": 10159970886766084423,
                                         "Collective name": "allreduce"}),
        {"ph": "s", "id": 18446744073709551615, "pid": 1, "tid": 1, "ts": 10, "cat": "ac2g",
         "name": "ac2g"},
        x("cudaLaunchKernel", 11, 2, cat="cuda_runtime", correlation=77),
        {"ph": "s", "id": 77, "pid": 1, "tid": 1, "ts": 11, "cat": "ac2g", "name": "ac2g"},
        x("k", 20, 4, cat="kernel", pid=0, tid=7, correlation=77, stream=7, device=0),
        {"ph": "f", "id": 77, "pid": 0, "tid": 7, "ts": 20, "cat": "ac2g", "name": "ac2g",
         "bp": "e"},
    ]
    code, rows, err, store = ingest_one(tmp_path, kineto_text(evs))
    assert code == 0, err
    c = con(store)
    assert c.execute("SELECT comms_id FROM collectives").fetchone() == (10159970886766084423,)
    flows = c.execute("SELECT flow_id, flow_id_raw, bound_eid FROM flows ORDER BY eid").fetchall()
    assert flows == [
        (-1, "18446744073709551615", 0), (77, "77", 2), (77, "77", 4)]
    assert c.execute("SELECT launch_eid, launch_name, op_eid FROM gpu_ops").fetchone() == (
        2, "cudaLaunchKernel", 0)
    assert c.execute("SELECT flow_out FROM events WHERE eid = 2").fetchone() == ([77],)
    assert c.execute("SELECT flow_in FROM events WHERE eid = 4").fetchone() == ([77],)


def test_begin_end_pairs_and_unmatched_end(tmp_path: Path) -> None:
    evs = [{"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 1},
           {"ph": "B", "name": "inner", "pid": 1, "tid": 1, "ts": 2},
           {"ph": "E", "pid": 1, "tid": 1, "ts": 4},
           {"ph": "E", "pid": 1, "tid": 1, "ts": 10},
           {"ph": "E", "pid": 1, "tid": 1, "ts": 12}]
    code, rows, err, store = ingest_one(tmp_path, kineto_text(evs))
    assert code == 0, err
    r = rows[0]
    assert (r["events_read"], r["events_stored"], r["events_quarantined"]) == (5, 4, 1)
    c = con(store)
    assert c.execute("SELECT eid, name, ph, dur_ns, depth FROM events ORDER BY eid").fetchall() == [
        (0, "outer", "X", 9000, 0), (1, "inner", "X", 2000, 1)]
    assert c.execute("SELECT eid, issue FROM ingest_issues").fetchall() == [(4, "unmatched_end")]


def test_counters(tmp_path: Path) -> None:
    evs = [{"pid": "0", "name": "sclk", "ph": "C", "ts": 5, "args": {"sclk": 1700, "": "2.5"}},
           {"pid": "0", "name": "mem", "ph": "C", "ts": "6", "args": {"depth": 0}}]
    code, rows, err, store = ingest_one(tmp_path, kineto_text(evs))
    assert code == 0, err
    assert rows[0]["events_stored"] == 2
    assert con(store).execute("SELECT eid, name, series, ts_ns, value FROM counters ORDER BY eid, "
                          "series").fetchall() == [
        (0, "sclk", "", 5000, 2.5), (0, "sclk", "sclk", 5000, 1700.0), (1, "mem", "depth", 6000,
                                                                         0.0)]


def test_truncated_file_is_salvaged_with_warning(tmp_path: Path) -> None:
    full = kineto_text([x("a", 1, 1), x("b", 3, 1), x("c", 5, 1)])
    cut = full[: full.index('"name": "c"') + 5]  # inside the third event
    code, rows, err, store = ingest_one(tmp_path, cut)
    assert code == 0
    r = rows[0]
    assert r["salvaged"] is True
    assert (r["events_read"], r["events_stored"], r["events_quarantined"]) == (3, 2, 1)
    warn = [line for line in err.splitlines() if "warning" in line]
    assert len(warn) == 1 and "rank0.json" in warn[0] and "truncated" in warn[0]
    c = con(store)
    assert c.execute("SELECT salvaged FROM trace_files").fetchone() == (True,)
    assert c.execute("SELECT issue, quarantined FROM ingest_issues").fetchall() == [
        ("truncated", True)]


def test_truncated_strict_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    full = kineto_text([x("a", 1, 1), x("b", 3, 1)])
    code, rows, err, store = ingest_one(tmp_path, full[: full.rindex("]")], "--strict")
    assert code == 1
    assert "rank0.json" in err and "--strict" in err and "Traceback" not in err
    assert not list(store.glob("data/*/*"))


def test_truncated_gzip_stream_is_salvaged(tmp_path: Path) -> None:
    import gzip

    text = kineto_text([x(f"op{i}", i * 2, 1) for i in range(2000)])
    data = gzip.compress(text.encode())
    code, rows, err, _ = ingest_one(tmp_path, data[: len(data) // 2], name="rank0.json.gz")
    assert code == 0, err
    r = rows[0]
    assert r["salvaged"] and 0 < r["events_stored"] < 2000
    assert r["events_read"] == r["events_stored"] + r["events_quarantined"]


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (b"\x1f\x8b\x08\x00garbage-not-deflate", "bad.json.gz", "corrupt gzip"),
        (b"hello world", "rank0.json", "not JSON"),
        (b"", "rank0.json", "empty file"),
        (b'{"schemaVersion": 1, "traceEvents": []}', "rank0.json", "no events"),
        (b'{"schema": "1.0.1", "nodes": []}', "rank0.json", "without a traceEvents"),
    ],
)
def test_bad_input_one_line_error(tmp_path: Path, content: bytes, name: str, message: str
                                  ) -> None:
    bad = write(tmp_path / name, content)
    good = write(tmp_path / "rank1.json", kineto_text([x("a", 1, 1)], rank=1))
    store = tmp_path / "store"
    code, out, err = run("ingest", bad, good, "--store", store)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tracetool: error: {bad}: ") and message in lines[0]
    # the other file still ingested, the bad one left nothing behind
    assert sorted(p.name for p in store.glob("data/*/*")) == ["rank=1"]
    assert not list((store / ".tmp").glob("*")) if (store / ".tmp").exists() else True


def test_missing_path_and_directory_without_traces(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = run("ingest", tmp_path / "nope.json", tmp_path / "empty", "--store",
                       tmp_path / "s")
    assert code == 1
    assert "nope.json: no such file" in err and "holds no .json" in err
    assert "Traceback" not in err


def test_rank_resolution(tmp_path: Path) -> None:
    text = kineto_text([x("a", 1, 1)], rank=None)
    f = write(tmp_path / "trace.json", text)
    store = tmp_path / "s"
    # one file with no rank anywhere is rank 0, as for every peer tool, with a warning
    code, out, err = run("ingest", f, "--store", store, "--job", "one", "--json")
    assert code == 0 and json.loads(out)["rank"] == 0
    assert err == (f"tracetool: warning: {f}: no rank in the trace (distributedInfo) or its "
                   "file name: stored as rank 0 (a single file); --rank N chooses another\n")
    assert tracetool.connect(store).execute(
        "SELECT rank_source FROM trace_files WHERE job = 'one'").fetchall() == [("single_file",)]
    # two of them cannot both be rank 0 of one job: the error says what to do
    h = write(tmp_path / "other.json", kineto_text([x("c", 1, 1)], rank=None))
    code, _, err = run("ingest", f, h, "--store", store, "--job", "two")
    assert code == 1 and f"{f}: no rank" in err and "--rank" in err
    assert "--job-per-file to ingest each file as a job of its own" in err
    code, out, err = run("ingest", f, "--store", store, "--job", "j", "--rank", "5", "--json")
    assert code == 0, err
    assert json.loads(out)["rank"] == 5
    # a second, different file claiming the same rank is refused, not merged
    g = write(tmp_path / "rank5.json", kineto_text([x("b", 1, 1)], rank=None))
    code, _, err = run("ingest", g, "--store", store, "--job", "j")
    assert code == 1 and "rank 5 already holds trace.json" in err


def test_job_per_file(tmp_path: Path) -> None:
    """Unrelated single-rank traces in one folder: each a job named after its file."""
    d = tmp_path / "traces"
    d.mkdir()
    for name in ("resnet.pt.trace.json", "bert.json"):
        write(d / name, kineto_text([x(name, 1, 1)], rank=None))
    store = tmp_path / "s"
    code, out, err = run("ingest", d, "--store", store, "--job-per-file", "--json")
    assert code == 0, err
    assert sorted((r["job"], r["rank"]) for r in map(json.loads, out.splitlines())) == \
        [("bert", 0), ("resnet", 0)]
    code, _, err = run("ingest", d, "--store", store, "--job-per-file", "--job", "x")
    assert code == 2 and "--job-per-file names each job after its file" in err


def test_recursive_ingest_and_same_names_in_two_folders(tmp_path: Path) -> None:
    """A directory's subfolders are read with --recursive only (without it, the error says
    how many trace files are below); --job-per-file tells files of one name apart by their
    folder."""
    d = tmp_path / "traces"
    for sub in ("a", "b", "b/c"):
        (d / sub).mkdir(parents=True)
        write(d / sub / "trace.json", kineto_text([x(sub, 1, 1)], rank=None))
    store = tmp_path / "s"
    code, _, err = run("ingest", d, "--store", store, "--job-per-file")
    assert code == 1 and err == (f"tracetool: error: {d}: directory holds no .json or .json.gz "
                                 "trace files (3 in its subfolders: add --recursive)\n")
    code, out, err = run("ingest", d, "--store", store, "--job-per-file", "--recursive",
                         "--json")
    assert code == 0, err
    assert sorted((r["job"], r["path"]) for r in map(json.loads, out.splitlines())) == [
        ("a_trace", str(d / "a" / "trace.json")), ("b_c_trace", str(d / "b/c/trace.json")),
        ("b_trace", str(d / "b" / "trace.json"))]
    names = {j: n for j, n in con(store).execute(
        "SELECT job, any_value(name) FROM events GROUP BY job").fetchall()}
    assert names == {"a_trace": "a", "b_trace": "b", "b_c_trace": "b/c"}
    # without --job-per-file, the three files are one job's ranks, and none says which
    code, _, err = run("ingest", d, "--store", tmp_path / "s2", "-r", "--job", "j")
    assert code == 1 and err.count("no rank: the trace") == 3


def test_reingest_is_noop_and_force_replaces(tmp_path: Path) -> None:
    f = write(tmp_path / "rank0.json", kineto_text([x("a", 1, 1)]))
    store = tmp_path / "s"
    assert run("ingest", f, "--store", store, "--job", "j")[0] == 0
    before = (store / "data/job=j/rank=0/trace_files/part-0.parquet").stat().st_mtime_ns
    code, out, _ = run("ingest", f, "--store", store, "--job", "j", "--json")
    assert code == 0 and json.loads(out)["status"] == "skipped"
    assert (store / "data/job=j/rank=0/trace_files/part-0.parquet").stat().st_mtime_ns == before
    f.write_text(kineto_text([x("a", 1, 1), x("b", 2, 1)]))
    code, _, err = run("ingest", f, "--store", store, "--job", "j")
    assert code == 1 and "--force" in err
    code, out, _ = run("ingest", f, "--store", store, "--job", "j", "--force", "--json")
    assert code == 0 and json.loads(out)["events_stored"] == 2
    assert con(store).execute("SELECT count(*) FROM events").fetchone() == (2,)


def _tables(store: Path) -> dict[str, list]:
    c = con(store)
    return {t: c.execute(f"SELECT * EXCLUDE (job) FROM {t} ORDER BY ALL").fetchall()
            for t in ("events", "flows", "gpu_ops", "ingest_issues", "profiler_steps",
                      "collectives")}


def test_small_pieces_and_workers_give_identical_tables(tmp_path: Path) -> None:
    """Cuts inside nested objects and strings, stitched across pieces and processes."""
    evs = []
    for i in range(300):
        evs.append(x(f"op {{'k': 1}},{{'j': 2}} {i}", i * 10, 5,
                     nested=[{"a": i}, {"b": [1, {"c": 2}]}], **{"External id": i}))
        evs.append({"ph": "f", "id": i, "pid": 1, "tid": 1, "ts": i * 10, "cat": "fwdbwd",
                    "name": "fwdbwd", "bp": "e"})
    f = write(tmp_path / "rank0.json", kineto_text(evs))
    stores = []
    for workers, piece in ((1, 1 << 30), (1, 997), (2, 2048)):
        store = tmp_path / f"s{workers}_{piece}"
        res = ingest([f], Options(store=store, job="j", workers=workers, piece_bytes=piece))
        assert res[0].status == "ingested", res[0].message
        assert (res[0].events_read, res[0].events_quarantined) == (600, 0)
        stores.append(_tables(store))
    assert stores[0] == stores[1] == stores[2]
    assert len(stores[0]["events"]) == 300 and len(stores[0]["flows"]) == 300


def test_flow_lists_match_the_flows_table_across_pieces(tmp_path: Path) -> None:
    """Each slice's flow_out / flow_in are the flow ids bound to it (in flow eid order, a
    non-integer id as NULL, NULL when none), also when the slice and its flows are decoded
    in different pieces by different workers; checked against an aggregation of the flows
    table, and by hand for a few slices."""
    evs: list[dict] = []
    for i in range(120):
        tid, ts = 1 + i % 2, 100 * i
        evs.append({"ph": "s", "id": 1000 + i, "pid": 1, "tid": tid, "ts": ts + 20,
                    "cat": "ac2g", "name": "a"})  # written before its slice
        evs.append(x(f"op{i}", ts, 50, tid=tid, pad="p" * 40))
        evs.append({"ph": "s", "id": i if i % 7 else f"zz-{i}", "pid": 1, "tid": tid,
                    "ts": ts + 10, "cat": "fwdbwd", "name": "f"})
        if i % 3 == 0:
            evs.append({"ph": "f", "id": i - 2, "pid": 1, "tid": tid, "ts": ts + 30,
                        "cat": "fwdbwd", "name": "f", "bp": "e"})
            evs.append({"ph": "t", "id": 5000 + i, "pid": 1, "tid": tid, "ts": ts + 40,
                        "cat": "x", "name": "t"})
    f = write(tmp_path / "rank0.json", kineto_text(evs))
    store = tmp_path / "s"
    res = ingest([f], Options(store=store, job="j", workers=2, piece_bytes=1500))
    assert res[0].status == "ingested", res[0].message
    c = con(store)
    got = dict(c.execute("SELECT eid, [flow_out, flow_in] FROM events").fetchall())
    want = dict(c.execute("""
        SELECT e.eid, [list(f.flow_id ORDER BY f.eid) FILTER (WHERE f.ph = 's'),
                       list(f.flow_id ORDER BY f.eid) FILTER (WHERE f.ph IN ('f', 't'))]
        FROM events e LEFT JOIN flows f ON f.bound_eid = e.eid GROUP BY e.eid""").fetchall())
    assert len(got) == 120 and got == want
    assert c.execute("SELECT count(*) FROM flows WHERE bound_eid IS NULL").fetchone() == (0,)
    by_name = dict(c.execute("SELECT name, [flow_out, flow_in] FROM events").fetchall())
    assert by_name["op3"] == [[1003, 3], [1, 5003]]  # s at ts+20 written first, then s, f, t
    assert by_name["op7"] == [[1007, None], None]  # "zz-7": no integer id
    assert by_name["op1"] == [[1001, 1], None]


def test_two_inputs_claiming_one_rank_in_one_call(tmp_path: Path) -> None:
    a = write(tmp_path / "a.json", kineto_text([x("a", 1, 1)], rank=3))
    b = write(tmp_path / "b.json", kineto_text([x("b", 1, 1)], rank=3))
    code, out, err = run("ingest", a, b, "--store", tmp_path / "s", "--job", "j", "--json",
                         "--workers", "2")
    assert code == 1
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["status"] for r in rows] == ["ingested", "error"]
    assert "rank 3 is also claimed by a.json" in rows[1]["message"]
    assert rows[1]["message"].endswith("or, for unrelated single-rank traces, --job-per-file")
    assert con(tmp_path / "s").execute("SELECT name FROM events").fetchall() == [("a",)]


def test_a_file_named_twice_is_ingested_once(tmp_path: Path) -> None:
    d = tmp_path / "job"
    d.mkdir()
    a = write(d / "rank0.json", kineto_text([x("a", 1, 1)], rank=0))
    write(d / "rank1.json", kineto_text([x("b", 1, 1)], rank=1))
    code, out, err = run("ingest", a, d, tmp_path / "job" / ".." / "job" / "rank0.json",
                         "--store", tmp_path / "s", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(Path(r["path"]).name, r["rank"], r["status"]) for r in rows] == [
        ("rank0.json", 0, "ingested"), ("rank1.json", 1, "ingested")]


def _no_space(*_: object, **__: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where, workers", [
    ("tracetool.ingest.workers.feather.write_feather", 1),  # staging a piece, inline
    ("tracetool.ingest.workers.feather.write_feather", 2),  # staging a piece, on the pool
    ("tracetool.ingest.finish._write", 2),  # a final part, on the pool
])
def test_full_disk_is_a_one_line_error_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, workers: int) -> None:
    evs = [x(f"op{i}", 10 * i, 5, pad="p" * 60) for i in range(200)]
    f = write(tmp_path / "rank0.json", kineto_text(evs))
    store = tmp_path / "store"
    monkeypatch.setattr(where, _no_space)  # the forked workers inherit it
    res = ingest([f], Options(store=store, job="j", workers=workers, piece_bytes=2000))
    assert (res[0].status, res[0].message) == (
        "error", "writing the store failed: No space left on device")
    assert not list((store / ".tmp").iterdir())  # no work file left
    assert not list(store.glob("data/*/*"))  # no partition, not even a half-written one
    if workers == 1:
        code, out, err = run("ingest", f, "--store", store, "--workers", "1")
        assert code == 1 and out == ""
        assert err == (f"tracetool: error: {f}: writing the store failed: No space left on "
                       "device\n")


def test_store_that_is_not_a_directory(tmp_path: Path) -> None:
    f = write(tmp_path / "rank0.json", kineto_text([x("a", 1, 1)]))
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run("ingest", f, "--store", afile)
    assert code == 2 and err.strip().endswith(f"Error: --store {afile} is not a directory")
    code, _, err = run("ingest", f, "--store", afile / "sub")
    assert code == 1 and err == (f"tracetool: error: {afile / 'sub'}: cannot write to the "
                                 "store: Not a directory\n")
    assert afile.read_text() == "x"


def _interrupt(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("where, n_files", [
    ("tracetool.ingest.derive.derive", 1),  # one file, in the derivation stage
    ("tracetool.ingest.pipeline.commit_built", 2),  # two files built on the pool, one pending
])
def test_ctrl_c_leaves_no_work_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     where: str, n_files: int) -> None:
    files = [write(tmp_path / f"rank{r}.json", kineto_text([x("a", 1, 1)], rank=r))
             for r in range(n_files)]
    store = tmp_path / "store"
    monkeypatch.setattr(where, _interrupt)
    with pytest.raises(KeyboardInterrupt):
        ingest(files, Options(store=store, job="j", workers=2))
    assert not list((store / ".tmp").iterdir())  # no work file left
    assert not list(store.glob("data/*/*"))
