"""Hostile input (issue 12). Names from a trace are hostile text (item 9): a kernel or op
name with newlines, terminal escape sequences or Markdown must not inject headings or links
into report.md, nor escape sequences into the terminal through report, diff or sql's table
output. A rank the store cannot hold is refused at the door (item 1)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from tracetool.ingest.pipeline import Options, ingest
from tracetool.text import markdown_cell, printable

from ._util import kineto_text, run, write, x

HEADING = "gemm\n# injected heading\n"
LINK = "[click](javascript:alert(1))"
OSC = "evil\x1b]0;pwned\x07kernel"  # an OSC sequence: retitles the terminal
NAMES = (HEADING + LINK, OSC, "a|b|c\r\u2028x")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    events = [x("ProfilerStep#1", 0, 1000, cat="user_annotation"),  # lanes of the timeline
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": OSC}},
              {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "s\x1b7"}}]
    for i, name in enumerate(NAMES):
        t = 10 + 300 * i
        events += [x(name, t, 100, tid=1),
                   x("cudaLaunchKernel", t + 10, 5, cat="cuda_runtime", correlation=i + 1),
                   x(name, t + 50, 200, cat="kernel", pid=0, tid=7, device=0, stream=7,
                     correlation=i + 1)]
    trace = write(d / "rank0.json", kineto_text(events, rank=0))
    s = d / "store"
    assert ingest([trace], Options(store=s, job="j"))[0].status == "ingested"
    return s


def test_printable_and_markdown_cell() -> None:
    assert printable(OSC) == "evil\\x1b]0;pwned\\x07kernel"
    assert printable("a\nb\tc\u2028") == "a\\nb\\tc\\u2028"
    assert printable("plain name<int>") == "plain name<int>"
    # the escape's backslash is escaped too: Markdown shows \n, not a line break
    assert markdown_cell(HEADING + LINK) == (
        "gemm\\\\n# injected heading\\\\n\\[click\\](javascript:alert(1))")
    assert markdown_cell("a|b_c*<T>") == "a\\|b\\_c\\*&lt;T>"


def test_report_markdown_carries_no_markup_from_names(store: Path, tmp_path: Path,
                                                      capfd: pytest.CaptureFixture) -> None:
    code, out, err = run("report", store, "--out", tmp_path / "r")
    assert code == 0, err
    # the charts (drawn in a child process, on this stderr) label names with escapes: no
    # "Glyph 27 missing from font" warning (issue 32, item 8)
    assert "Glyph" not in capfd.readouterr().err
    assert (tmp_path / "r" / "step_timeline.png").is_file()
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    assert not any(line.startswith("# injected") for line in md.splitlines())
    assert "[click](" not in md and "\\[click\\](javascript:alert(1))" in md
    assert "\x1b" not in md and markdown_cell(OSC) in md
    # every table keeps its columns: no name broke a row with | or a newline
    tables, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(len(re.findall(r"(?<!\\)\|", line)))
        elif current:
            tables, current = tables + [current], []
    assert len(tables) >= 4 and all(len(set(t)) == 1 for t in tables)
    assert any("evil" in line for line in md.splitlines() if line.startswith("|"))
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text and "# injected heading\n" not in text
    assert "evil\\x1b]0;pwned\\x07kernel" in out


def test_diff_and_sql_tables_escape_control_characters(store: Path, tmp_path: Path) -> None:
    code, out, err = run("diff", store, store)
    assert code == 0, err
    assert "\x1b" not in out and "\\x1b]0;pwned\\x07kernel" in out
    code, out, err = run("sql", store, "SELECT DISTINCT name FROM kernels ORDER BY name")
    assert code == 0, err
    assert "\x1b" not in out and "\r" not in out
    assert out.splitlines()[2:5] == sorted(printable(n) for n in NAMES)
    # csv on stdout escapes them as the table does (issue 32, item 8); written with
    # --output it keeps every character
    query = "SELECT DISTINCT name || chr(0) AS name FROM kernels ORDER BY name"
    code, out, err = run("sql", store, query, "--format", "csv")
    assert code == 0, err
    assert out == "name\n" + "".join(
        f'"{printable(n)}\\x00"\n' if '"' in n or "," in n else f"{printable(n)}\\x00\n"
        for n in sorted(NAMES))
    assert not any(c in out for c in "\x1b\x07\x00\r\u2028")
    code, _, err = run("sql", store, query, "--format", "csv", "--output", tmp_path / "k.csv")
    assert code == 0, err
    with open(tmp_path / "k.csv", newline="", encoding="utf-8") as f:
        assert list(csv.reader(f)) == [["name"], *([n + "\x00"] for n in sorted(NAMES))]


def test_a_rank_beyond_32_bits_is_an_error_for_that_file(tmp_path: Path) -> None:
    """Issue 12, item 1: a rank of 2^31 used to be stored, and then every query of every job
    failed to cast the hive partition; now it is refused, one line, and the store stays
    readable."""
    (tmp_path / "a").mkdir()
    good = write(tmp_path / "a" / "rank0.json", kineto_text([x("aten::mm", 0, 10)], rank=0))
    bad = write(tmp_path / "b.json", kineto_text([x("aten::mm", 0, 10)], rank=2**31))
    s = tmp_path / "store"
    code, out, err = run("ingest", good, "--store", s, "--job", "ok")
    assert code == 0, err
    code, out, err = run("ingest", bad, "--store", s, "--job", "big")
    assert code == 1
    assert err == (f"tracetool: error: {bad}: rank 2147483648 (from distributedInfo) is "
                   "outside 0..2147483647\n")
    code, out, err = run("ingest", good, "--store", s, "--job", "opt", "--rank", "2147483648")
    assert code == 2 and "2147483648 is not in the range" in err
    code, out, err = run("sql", s, "SELECT job, rank FROM trace_files ORDER BY job")
    assert code == 0 and out.splitlines()[2].split() == ["ok", "0"]
    assert len(out.splitlines()) == 4  # header, rule, one row, the count


def test_inputs_that_are_not_trace_files_are_one_line_errors(tmp_path: Path) -> None:
    """Issue 12, item 7: a FIFO hung the read forever, a symlink loop and a 300-character
    --job were tracebacks."""
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop2.json")
    (tmp_path / "loop2.json").symlink_to(loop)
    s = tmp_path / "store"
    for path, message in ((fifo, "not a regular file (a FIFO, socket or device): give a "
                                 "trace file"), (loop, "symlink loop")):
        code, out, err = run("ingest", path, "--store", s, "--rank", "0")
        assert (code, err) == (1, f"tracetool: error: {path}: {message}\n")
    good = write(tmp_path / "rank0.json", kineto_text([x("aten::mm", 0, 10)], rank=0))
    code, out, err = run("ingest", good, "--store", s, "--job", "j" * 300)
    assert code == 2 and "Traceback" not in err  # a usage error, as click prints them
    assert err.splitlines()[-1] == ("Error: invalid job name 'jjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjj"
                                    "jjjjj'...: 300 characters, at most 200")


def test_file_names_that_are_not_utf8_are_stored_as_escaped_text(tmp_path: Path) -> None:
    """Issue 32, item 5: a name that is not UTF-8 was a traceback from pyarrow, and in a
    directory the files after it were not stored; a newline in a name was printed raw. The
    store keeps such a name with each undecodable byte as the text \\xNN."""
    import json
    import os

    d = tmp_path / "traces"
    d.mkdir()
    names = [b"bad\xff.json", b"r\nank1.json", b"worker2\xfe\xfd.json"]
    for rank, name in enumerate(names):
        with open(os.fsencode(d) + b"/" + name, "wb") as f:
            f.write(kineto_text([x("aten::mm", 0, 10 + rank)], rank=rank).encode())
    shown = {0: f"{d}/bad\\xff.json", 1: f"{d}/r\\nank1.json", 2: f"{d}/worker2\\xfe\\xfd.json"}
    s = tmp_path / "store"
    code, out, err = run("ingest", d, "--store", s, "--job", "j")
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"ingested {shown[r]} -> job j rank {r}: 1 events read, 1 "
                                "stored, 0 quarantined" for r in (0, 1, 2)]
    code, out, err = run("sql", s, "SELECT rank, path, file_name FROM trace_files ORDER BY rank",
                         "--format", "json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    # the newline is stored as it is (the name is UTF-8); only the bytes that are not are \xNN
    stored = {0: "bad\\xff.json", 1: "r\nank1.json", 2: "worker2\\xfe\\xfd.json"}
    assert rows == [{"rank": r, "path": f"{d}/{stored[r]}", "file_name": stored[r]}
                    for r in (0, 1, 2)]
    code, out, err = run("ingest", d, "--store", s, "--job", "j", "--json")
    assert code == 0 and [json.loads(line)["path"] for line in out.splitlines()] == [
        f"{d}/{stored[r]}" for r in (0, 1, 2)]


def test_a_store_path_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    import os

    good = write(tmp_path / "rank0.json", kineto_text([x("aten::mm", 0, 10)], rank=0))
    store = os.fsdecode(os.fsencode(tmp_path) + b"/st\xfe")
    line = (f"tracetool: error: {tmp_path}/st\\xfe: the store's path is not valid UTF-8 "
            "(DuckDB opens files by UTF-8 names): give a store path whose names are UTF-8\n")
    for args in (["ingest", good, "--store", store], ["sql", store, "SELECT 1"],
                 ["report", store]):
        code, out, err = run(*args)
        assert (code, out, err) == (1, "", line), args
    assert not os.path.lexists(store)


def test_pack_of_a_path_that_is_not_a_store(tmp_path: Path) -> None:
    code, out, err = run("pack", tmp_path / "nosuch")
    assert (code, out, err) == (1, "", f"tracetool: error: {tmp_path / 'nosuch'}: not a "
                                       "tracetool store (no data/ directory)\n")
