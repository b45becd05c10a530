"""A store may live at any path (issue 12, item 7): a quote, brackets, a glob character, a
backslash, a brace, a space or non-ASCII in the store's path must change nothing. Paths meet
SQL only through tracetool.sqltext (quoted once; files listed in Python, never globbed by
DuckDB), so ingest and every command give the numbers a store at a plain path gives."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tracetool.sqltext import exact_path, literal, path_list

from ._util import SHARED_TRACES, run

ONE_RANK = SHARED_TRACES / "AMD-AGI__TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz"  # noqa: E501
TWO_RANKS = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data/trace_filter"
CHARS = {"quote": "'", "open_bracket": "[", "close_bracket": "]", "star": "*", "question": "?",
         "backslash": "\\", "brace": "{", "space": " ", "non_ascii": "é測"}
# every character at once, with brackets that form a glob class
EVERY = "it's [1]*?\\{x} é測"
COUNTS = "SELECT job, rank, count(*) AS n, sum(dur_ns) AS dur FROM events GROUP BY ALL ORDER BY ALL"
BREAKDOWN = ("SELECT job, rank, step, dur_ns, compute_ns, comm_ns, exposed_comm_ns, idle_ns "
             "FROM step_breakdown ORDER BY ALL")

needs_corpus = pytest.mark.skipif(not ONE_RANK.is_file() or not TWO_RANKS.is_dir(),
                                  reason=f"real trace corpus not found at {SHARED_TRACES}")


def ingest(store: Path) -> None:
    """The small real trace (job one, rank 0) and the 2-rank set (job two), by the CLI."""
    for args in ([ONE_RANK, "--job", "one", "--rank", "0"], [TWO_RANKS, "--job", "two"]):
        code, out, err = run("ingest", *args, "--store", store, "--json")
        assert code == 0, err
        assert all(json.loads(line)["status"] == "ingested" for line in out.splitlines()), out


def sql(store: Path, query: str) -> list[dict]:
    code, out, err = run("sql", store, query, "--json")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def command(*args: str | Path) -> dict:
    """A command's --json output (report: without its output file names)."""
    code, out, err = run(*args, "--json")
    assert code == 0, err
    doc = json.loads(out)
    doc.pop("files", None)
    return doc


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not ONE_RANK.is_file() or not TWO_RANKS.is_dir():
        pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
    store = tmp_path_factory.mktemp("plain") / "store"
    ingest(store)
    return store


@pytest.fixture(scope="module")
def reference(plain: Path) -> dict[str, list[dict]]:
    return {"counts": sql(plain, COUNTS), "breakdown": sql(plain, BREAKDOWN)}


def test_sqltext_quotes_once_and_escapes_globs(tmp_path: Path) -> None:
    assert literal("it's") == "'it''s'"
    assert literal(Path("a\\b")) == "'a\\b'"  # a backslash is an ordinary character in SQL
    assert exact_path("/s/run[1]*?/p.parquet") == "/s/run[[]1][*][?]/p.parquet"
    assert exact_path("/s/plain {x}/p.parquet") == "/s/plain {x}/p.parquet"
    with pytest.raises(ValueError):
        literal("a\0b")
    # DuckDB reads each listed file as exactly itself, even beside files its glob would match
    con = duckdb.connect()
    for name, value in (("run[1].parquet", 1), ("run1.parquet", 2), ("run*.parquet", 3),
                        ("a\\b[1].parquet", 4), ("a'b?.parquet", 5)):
        con.execute(f"COPY (SELECT {value} AS v) TO {literal(tmp_path / name)}")
    for name, value in (("run[1].parquet", 1), ("run*.parquet", 3), ("a\\b[1].parquet", 4),
                        ("a'b?.parquet", 5)):
        got = con.execute(f"SELECT list(v) FROM read_parquet({path_list([tmp_path / name])})")
        assert got.fetchone()[0] == [value], name


@needs_corpus
@pytest.mark.parametrize("name", [f"st{c}re" for c in CHARS.values()] + ["run[1]*?"],
                         ids=[*CHARS, "glob_class"])
def test_ingest_and_sql_at_a_path_with(name: str, tmp_path: Path,
                                       reference: dict[str, list[dict]]) -> None:
    """One character per store; for run[1]*? also a sibling store run1-x, which the path
    read as a glob would match instead: it is never read."""
    if name == "run[1]*?":
        code, _, err = run("ingest", ONE_RANK, "--job", "decoy", "--rank", "0",
                           "--store", tmp_path / "run1-x")
        assert code == 0, err
    store = tmp_path / name
    ingest(store)
    assert sql(store, COUNTS) == reference["counts"]
    assert sql(store, BREAKDOWN) == reference["breakdown"]


@needs_corpus
def test_every_command_at_a_path_with_every_character(tmp_path: Path, plain: Path,
                                                      reference: dict[str, list[dict]]) -> None:
    """Ingest, sql, report, critical-path and replay at a path holding every character at
    once: the numbers of the plain store."""
    store = tmp_path / EVERY
    ingest(store)
    assert sql(store, COUNTS) == reference["counts"]
    assert sql(store, BREAKDOWN) == reference["breakdown"]
    for job in ("one", "two"):
        for cmd in ("critical-path", "replay"):
            assert command(cmd, store, "--job", job) == command(cmd, plain, "--job", job), cmd
    assert (command("report", store, "--job", "two", "--out", tmp_path / "r1")
            == command("report", plain, "--job", "two", "--out", tmp_path / "r2"))
