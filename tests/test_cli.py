"""The CLI as a user runs it: a real subprocess, plus the schema reference staying current."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tracetool import __version__
from tracetool.analysis import schema_doc
from tracetool.schema import TABLES
from tracetool.store_views import STORE_FORMAT

from ._util import REPO, SAMPLES, con


def tracetool(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracetool", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_version_and_help() -> None:
    r = tracetool("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tracetool, version {__version__}"
    top = tracetool("--help").stdout
    for cmd in ([], ["ingest"], ["sql"], ["report"], ["critical-path"], ["diff"]):
        r = tracetool(*cmd, "--help")
        assert r.returncode == 0 and "Usage:" in r.stdout
        assert not cmd or cmd[0] in top
        assert not cmd or "--json" in r.stdout  # every command has machine-readable output
    assert "--strict" in tracetool("ingest", "--help").stdout


def test_ingest_samples_subprocess_json(tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = tracetool("ingest", SAMPLES, "--store", store, "--json", "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # not a TTY: no progress bar, nothing else
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["job"], x["rank"], x["status"]) for x in rows] == [
        ("ddp_gloo_2rank", 0, "ingested"), ("ddp_gloo_2rank", 1, "ingested")]
    for x in rows:
        assert x["events_read"] == x["events_stored"] + x["events_quarantined"]
        assert x["store"] == str(store)
    c = con(store)
    # the sample job: 3 profiled steps, 3 gloo allreduces per step per rank
    assert c.execute("SELECT rank, count(*) FROM profiler_steps GROUP BY rank ORDER BY rank"
                     ).fetchall() == [(0, 3), (1, 3)]
    assert c.execute("SELECT rank, count(*), count(gloo_eid) FROM collectives "
                     "GROUP BY rank ORDER BY rank").fetchall() == [(0, 9, 9), (1, 9, 9)]
    # matched in order, both ranks agree on what each call moved
    sizes = c.execute("SELECT rank, list(in_bytes ORDER BY call_index) FROM collectives "
                      "GROUP BY rank ORDER BY rank").fetchall()
    assert sizes[0][1] == sizes[1][1]
    assert sizes[0][1][:3] == [1059850 * 4, 525312 * 4, 4]


def test_bad_input_subprocess_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    r = tracetool("ingest", bad, "--store", tmp_path / "s")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(bad) in r.stderr and "corrupt gzip" in r.stderr


def test_schema_doc_is_generated_from_the_schema_module() -> None:
    doc = (REPO / "docs" / "schema.md").read_text()
    assert doc == schema_doc.render(), f"run: {schema_doc.COMMAND}"
    for t in TABLES:
        assert f"## {t.name}" in doc
        for c in t.columns:
            assert c.doc, f"{t.name}.{c.name} is undocumented"


def test_store_columns_match_the_schema(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert tracetool("ingest", SAMPLES, "--store", store).returncode == 0
    c = con(store)
    for t in TABLES:
        cols = [r[0] for r in c.execute(f"DESCRIBE {t.name}").fetchall()]
        assert cols == [*t.column_names(), "job", "rank"], t.name


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    """On a TTY stderr shows a rich progress bar naming the file; piped, stderr stays empty
    (checked in test_ingest_samples_subprocess_json)."""
    import os
    import pty

    master, slave = pty.openpty()
    f = SAMPLES / "rank0.pt.trace.json.gz"
    p = subprocess.Popen([sys.executable, "-m", "tracetool", "ingest", str(f), "--store",
                          str(tmp_path / "s")], stdout=subprocess.PIPE, stderr=slave,
                         env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=120)
    os.close(master)
    tty_err = b"".join(chunks).decode("utf-8", "replace")
    assert p.returncode == 0
    assert "rank0.pt.trace.json.gz" in tty_err  # the progress bar's label


def test_store_of_another_format_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert tracetool("ingest", SAMPLES, "--store", store).returncode == 0
    assert json.loads((store / "format.json").read_text()) == {"format": STORE_FORMAT}
    (store / "format.json").write_text('{"format": 0}')
    for args in (["sql", store, "SELECT 1"], ["ingest", SAMPLES, "--store", store, "--force"],
                 ["report", store, "--out", tmp_path / "r"], ["critical-path", store]):
        r = tracetool(*args)
        assert r.returncode == 1, args
        assert r.stderr.count("\n") == 1 and "store format 0" in r.stderr, (args, r.stderr)
    (store / "format.json").unlink()
    r = tracetool("sql", store, "SELECT 1")
    assert r.returncode == 1 and "from before format.json" in r.stderr
