"""No output inside a store, and every output whole (issue 32, items 1 and 5): each option
that writes a file refuses, before any work, a path inside a store (the one read, or any
other; through symlinks) or one that cannot be written, with one line; and a write that
fails leaves the old file, never half a file, and no temporary file."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import duckdb
import pytest

from tracetool.ingest.pipeline import Options, ingest
from tracetool.outputs import atomic_write, check_output

from ._util import SAMPLES, run

EVENTS = "data/job=gloo/rank=0/events/part-00000.parquet"
CP_NODES = "data/job=gloo/rank=0/cp_nodes/part-0.parquet"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sample job in one store, and a copy of that store."""
    base = tmp_path_factory.mktemp("outputs")
    a, b = base / "store", base / "other"
    assert all(r.status == "ingested" for r in ingest([SAMPLES], Options(a, job="gloo")))
    shutil.copytree(a, b)
    return a, b


def snapshot(*dirs: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


# (command and options before the output option, the option): each run names a job the store
# does not have, so an output line (not "no job") shows the output was checked first
WRITERS = [
    (["replay", "--job", "nosuch", "--source-network", "gpus_per_node=1"], "--chrome-trace"),
    (["replay", "--job", "nosuch", "--source-network", "gpus_per_node=1"], "--plot"),
    (["critical-path", "--job", "nosuch"], "--chrome-trace"),
    (["sql", "SELECT count(*) FROM events"], "--output"),
    (["report", "--job", "nosuch"], "--out"),
    (["sweep", "--job", "nosuch", "--gpu", "h100"], "--out"),
]
FILE_OPTIONS = ("--chrome-trace", "--plot", "--output")


@pytest.mark.parametrize(("args", "option"), WRITERS, ids=lambda v: "-".join(v)
                         if isinstance(v, list) else v)
def test_no_output_inside_a_store(stores: tuple[Path, Path], tmp_path: Path,
                                  args: list[str], option: str) -> None:
    store, other = stores
    link = tmp_path / "link"
    link.symlink_to(store / "data")
    if option in FILE_OPTIONS:  # over the store's files, through a symlink, in another store
        targets = [(store / EVENTS, store), (store / CP_NODES, store),
                   (store / "format.json", store), (store / ".tmp" / "x.json", store),
                   (link / "x.json", store), (other / EVENTS, other)]
    else:  # the store itself, a directory in it, through a symlink, another store
        targets = [(store, store), (store / "data" / "report", store),
                   (link / "report", store), (other, other)]
    before = snapshot(store, other)
    for target, holder in targets:
        code, out, err = run(args[0], store, *args[1:], option, target)
        where = "is the store" if target == holder else "is inside the store"
        assert (code, out, err) == (2, "", f"tracetool: error: {option}: {target} {where} "
                                           f"{holder}: write it outside the store\n"), target
    assert snapshot(store, other) == before
    assert not (store / "data" / "report").exists() and not (store / ".tmp" / "x.json").exists()
    assert duckdb.connect().execute(
        f"SELECT count(*) FROM '{store / EVENTS}'").fetchone()[0] > 0


def test_the_object_store_cache_is_refused(stores: tuple[Path, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACETOOL_CACHE_DIR", str(cache))
    code, _, err = run("sql", stores[0], "SELECT 1", "--output", cache / "j" / "x.csv")
    assert code == 2 and err == (f"tracetool: error: --output: {cache / 'j' / 'x.csv'} is "
                                 f"inside tracetool's cache of object-store files ({cache}): "
                                 "write it elsewhere\n")
    assert not cache.exists()


@pytest.mark.parametrize(("target", "why"), [
    ("/proc/version", "cannot write in /proc (No such file or directory)"),
    ("/proc/nosuch/x.csv", "cannot make a directory in /proc (No such file or directory)"),
    ("/dev/null", "is not a regular file"),
])
def test_an_unwritable_output_is_one_line_before_the_query(stores: tuple[Path, Path],
                                                           target: str, why: str) -> None:
    if not Path("/proc/version").is_file():
        pytest.skip("no /proc")
    # the query would fail; the output's line comes first
    code, out, err = run("sql", stores[0], "SELECT * FROM no_such_table", "--output", target)
    sep = " " if why.startswith("is ") else ": "
    assert (code, out, err) == (1, "", f"tracetool: error: --output: {target}{sep}{why}\n")


def test_a_file_in_the_way_of_the_directory(stores: tuple[Path, Path], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    for args, option in WRITERS:
        target = blocker / "sub" / "x.json" if option in FILE_OPTIONS else blocker / "sub"
        code, out, err = run(args[0], stores[0], *args[1:], option, target)
        assert (code, out, err) == (1, "", f"tracetool: error: {option}: {target}: "
                                           "Not a directory\n"), option
    assert blocker.read_text() == "keep"


def test_sql_output_into_a_missing_directory_makes_it(stores: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "n.csv"
    code, _, err = run("sql", stores[0], "SELECT count(*) AS n FROM events", "--format", "csv",
                       "--output", out)
    want = duckdb.connect().execute(
        f"SELECT count(*) FROM read_parquet('{stores[0]}/data/*/*/events/*.parquet')"
    ).fetchone()[0]
    assert code == 0, err
    assert out.read_text() == f"n\n{want}\n"
    assert os.listdir(out.parent) == ["n.csv"]  # no temporary file left


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    f = tmp_path / "out.json"
    f.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(f) as w:
        w.write(b"half of the new")
        raise RuntimeError("disk full")
    assert f.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]
    with atomic_write(f, "w", encoding="utf-8") as w:
        w.write("new")
    assert f.read_text() == "new" and os.listdir(tmp_path) == ["out.json"]
    link = tmp_path / "link.json"  # a symlink is replaced, never written through
    link.symlink_to(f)
    with atomic_write(link) as w:
        w.write(b"via link")
    assert f.read_text() == "new" and link.read_text() == "via link" and not link.is_symlink()


def test_a_chrome_trace_that_fails_midway_leaves_the_old_file(
        stores: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracetool.analysis import chrome_trace

    out = tmp_path / "cp.json"
    out.write_text("old trace")
    real = chrome_trace.EventArray.query
    calls = []

    def fail_second(self, *a, **k):  # the events are written, then the path's query fails
        calls.append(1)
        if len(calls) == 2:
            raise duckdb.IOException("IO Error: No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(chrome_trace.EventArray, "query", fail_second)
    code, _, err = run("critical-path", stores[0], "--chrome-trace", out)
    assert code == 1 and err == (f"tracetool: error: {stores[0]}: IO Error: No space left "
                                 "on device\n")
    assert len(calls) == 2 and out.read_text() == "old trace"
    assert os.listdir(tmp_path) == ["cp.json"]


def test_check_output_accepts_ordinary_paths(stores: tuple[Path, Path], tmp_path: Path) -> None:
    # beside the store, a directory holding it, and a name starting like the store's
    for p in (stores[0].parent / "x.json", stores[0].parent / "store2" / "x.json"):
        check_output(p, "--x", [stores[0]])
    check_output(stores[0].parent, "--out", [stores[0]], directory=True)
    assert not (stores[0].parent / "store2").exists()  # checked, not made
    assert not [n for n in os.listdir(stores[0].parent) if n.startswith(".tracetool-probe")]
