"""Read-only SQL by default (issue 12, item 8): no query of ``tracetool sql`` or
``tracetool.connect()`` writes a file, changes the store, reads a file outside it, loads an
extension or unlocks DuckDB's settings; each refusal is one line saying why, and the store is
byte for byte as before. ``--allow-writes DIR`` (``allow_writes=[DIR]``) opens DIR, and only
DIR, to writes; ``--output`` is written from Python."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import SAMPLES, run

PART = "data/job=ddp_gloo_2rank/rank=0/events"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("safety") / "store"
    assert {r.status for r in ingest([SAMPLES], Options(store=s))} == {"ingested"}
    return s


def snapshot(store: Path) -> dict[str, str]:
    """Every file under the store with a hash of its bytes (format.json's text as is)."""
    out = {p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(store.rglob("*")) if p.is_file()}
    out["format.json"] = (store / "format.json").read_text()
    return out


def refused(store: Path, query: str, *options: str | Path) -> str:
    """Run a query that must be refused: exit 1, one line on stderr; the store unchanged."""
    before = snapshot(store)
    code, out, err = run("sql", store, query, *options)
    assert code == 1, (query, out, err)
    assert err.startswith("tracetool: error: ") and err.count("\n") == 1, err
    assert snapshot(store) == before, query
    return err


def reproducers(store: Path, elsewhere: Path) -> dict[str, tuple[str, str]]:
    """query -> (what the CLI's message says, what its Python error says)."""
    part = store / PART / "part-99999.parquet"
    return {
        f"COPY (SELECT 2 AS format) TO '{store / 'format.json'}'":
            ("writing files is disabled", "Cannot access"),
        f"COPY (SELECT * FROM events LIMIT 3) TO '{part}'":
            ("writing files is disabled", "Cannot access"),
        f"COPY (SELECT 1 AS x) TO '{elsewhere / 'x.csv'}'":
            ("writing files is disabled", "Cannot access"),
        f"EXPORT DATABASE '{elsewhere / 'export'}'":
            ("writing files is disabled", "Cannot access"),
        f"ATTACH '{elsewhere / 'x.db'}' AS x": ("Cannot access file", "Cannot access"),
        "SELECT * FROM read_text('/etc/passwd')": ("Cannot access file", "Cannot access"),
        f"SELECT * FROM read_csv('{elsewhere / 'x.csv'}')":
            ("Cannot access file", "Cannot access"),
        "INSTALL httpfs": ("extensions is disabled", "disabled"),
        "LOAD httpfs": ("extensions is disabled", "disabled"),
        "SET enable_external_access = true": ("configuration has been locked", "locked"),
        "RESET enable_external_access": ("configuration has been locked", "locked"),
        "SET lock_configuration = false": ("configuration has been locked", "locked"),
        "SET allowed_directories = ['/']": ("configuration has been locked", "locked"),
    }


def test_every_reproducer_is_refused_by_tracetool_sql(store: Path, tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("x\n1\n")
    for query, (why, _) in reproducers(store, tmp_path).items():
        err = refused(store, query)
        assert why in err, (query, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]


def test_tracetool_connect_is_read_only_too(store: Path, tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("x\n1\n")
    before = snapshot(store)
    con = tracetool.connect(store)
    for query, (_, why) in reproducers(store, tmp_path).items():
        with pytest.raises(duckdb.Error, match=why):
            con.execute(query)
    assert snapshot(store) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]
    # what analysis needs still works: views, temporary tables, registered frames
    con.execute("CREATE TEMP TABLE t AS SELECT rank, count(*) AS n FROM events GROUP BY rank")
    assert con.execute("SELECT sum(n) FROM t").fetchall() == [(1632,)]
    con.register("frame", pa.table({"one": [1]}))
    assert con.execute("SELECT one FROM frame").fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM step_breakdown").fetchall() == [(6,)]


def test_a_query_may_still_compute_and_make_temporary_tables(store: Path) -> None:
    code, out, err = run("sql", store, "CREATE TEMP TABLE t AS SELECT * FROM kernels; "
                         "SELECT count(*) AS n FROM step_breakdown", "--format", "csv")
    assert (code, out) == (0, "n\n6\n"), err


def test_allow_writes_opens_one_directory(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(store)
    code, _, err = run("sql", store, f"COPY (SELECT rank, count(*) AS n FROM events GROUP BY "
                       f"rank ORDER BY rank) TO '{out / 'n.csv'}'", "--allow-writes", out)
    assert code == 0, err
    assert (out / "n.csv").read_text() == "rank,n\n0,816\n1,816\n"
    # still nothing anywhere else, and nothing into the store
    err = refused(store, f"COPY (SELECT 1 AS x) TO '{tmp_path / 'x.csv'}'", "--allow-writes", out)
    assert "Cannot access file" in err and not (tmp_path / "x.csv").exists()
    err = refused(store, f"COPY (SELECT 2 AS format) TO '{store / 'format.json'}'",
                  "--allow-writes", out)
    assert "Cannot access file" in err
    # a COPY in place could replace or delete a file DuckDB may read: one of the store's own
    existing = next((store / PART).glob("*.parquet"))
    for options in ("USE_TMP_FILE false", "PER_THREAD_OUTPUT, OVERWRITE",
                    "FILE_SIZE_BYTES 1000, overwrite_or_ignore"):
        copy = f"COPY (SELECT 1 AS x) TO '{existing}' ({options})"
        for query in (copy, f"EXPLAIN ANALYZE {copy}", f"PREPARE p AS {copy}; EXECUTE p"):
            for writes in ((), ("--allow-writes", out)):
                err = refused(store, query, *writes)
                assert "USE_TMP_FILE or OVERWRITE is disabled" in err or (
                    not writes and "writing files is disabled" in err), (query, err)
    assert snapshot(store) == before
    # a directory holding the store, or inside it, is a usage error
    for bad in (store, store / "data", store.parent):
        code, _, err = run("sql", store, "SELECT 1", "--allow-writes", bad)
        assert code == 2 and "--allow-writes" in err, (bad, err)
    # the Python API's keyword
    con = tracetool.connect(store, allow_writes=[out])
    con.execute(f"COPY (SELECT 1 AS x) TO '{out / 'py.parquet'}'")
    assert (out / "py.parquet").is_file()
    with pytest.raises(duckdb.PermissionException):
        con.execute(f"COPY (SELECT 1 AS x) TO '{store / PART / 'part-99999.parquet'}'")
    with pytest.raises(ValueError, match="holds the store"):
        tracetool.connect(store, allow_writes=[store.parent])
    assert snapshot(store) == before


def test_output_is_written_from_python(store: Path, tmp_path: Path) -> None:
    before = snapshot(store)
    pq, csv = tmp_path / "b.parquet", tmp_path / "b.csv"
    code, _, err = run("sql", store, "SELECT rank, step, dur_ns FROM step_breakdown",
                       "--format", "parquet", "--output", pq)
    assert code == 0, err
    code, _, err = run("sql", store, "SELECT rank, step, dur_ns FROM step_breakdown",
                       "--format", "csv", "--output", csv)
    assert code == 0, err
    assert csv.read_text().splitlines()[0] == "rank,step,dur_ns"
    got = duckdb.connect().execute(f"SELECT count(*), sum(dur_ns) FROM '{pq}'").fetchall()
    want = tracetool.connect(store).execute("SELECT count(*), sum(dur_ns) FROM step_breakdown")
    assert got == want.fetchall()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.csv", "b.parquet"]  # no temp left
    code, _, err = run("sql", store, "SELECT 1", "--output", store / "format.json")
    assert code == 2 and "inside the store" in err
    assert snapshot(store) == before


def test_print_setup_opens_the_store_read_only(store: Path, tmp_path: Path) -> None:
    code, setup, err = run("sql", store, "--print-setup")
    assert code == 0, err
    assert "SET enable_external_access = false;" in setup
    assert "SET lock_configuration = true;" in setup
    fresh = duckdb.connect()
    fresh.execute(setup)
    assert fresh.execute("SELECT count(*) FROM events").fetchall() == [(1632,)]
    with pytest.raises(duckdb.PermissionException):
        fresh.execute(f"COPY (SELECT 1 AS x) TO '{tmp_path / 'x.csv'}'")
    code, setup, err = run("sql", store, "--print-setup", "--allow-writes", tmp_path)
    assert code == 0 and f"SET allowed_directories = ['{tmp_path}'" in setup, err
