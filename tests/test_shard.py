"""Shard ingests (``tracetool ingest --shard I/N``) and ``tracetool commit`` (issue 14, item 1).

The 8-rank DLRM job of ../shared/traces built as three shards, in separate processes as a
SLURM array would run them, then committed, gives the same tables as one plain ingest; a
commit with a shard missing, or a rank staged twice, publishes nothing and says why."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import tracetool
from tracetool.schema import TABLES

from ._util import DLRM, kineto_text, run, write, x

needs_corpus = pytest.mark.skipif(not DLRM.is_dir(), reason=f"corpus not found: {DLRM}")


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    """The CLI in its own process, as a shard of an array job runs it."""
    return subprocess.run([sys.executable, "-m", "tracetool", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def tables(store: Path) -> dict[str, list[tuple]]:
    """Every table of the store, rows sorted, minus when it was ingested."""
    con = tracetool.connect(store)
    out = {}
    for t in TABLES:
        cols = [c.name for c in t.columns if c.name != "ingested_at"]
        out[t.name] = con.execute(f"SELECT job, rank, {', '.join(cols)} FROM {t.name} "
                                  "ORDER BY ALL").fetchall()
    return out


@needs_corpus
def test_three_shards_then_commit_equal_one_ingest(tmp_path: Path, dlrm_store: Path) -> None:
    sharded = tmp_path / "sharded"
    for i in range(3):
        r = cli("ingest", DLRM, "--store", sharded, "--job", "dlrm", "--shard", f"{i}/3",
                "--workers", "1")
        assert r.returncode == 0, r.stderr
        staged = [line for line in r.stdout.splitlines() if line.startswith("staged ")]
        assert len(staged) == len(range(i, 8, 3))  # every 3rd of the 8 sorted files
    assert not (sharded / "data").exists()  # nothing published before the commit
    r = cli("commit", sharded, "--job", "dlrm")
    assert r.returncode == 0, r.stderr
    assert sorted(int(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines()
                  if line.startswith("ingested ")) == list(range(8))
    assert not (sharded / "staging" / "job=dlrm").exists()
    a, b = tables(sharded), tables(dlrm_store)  # one plain ingest (the shared store)
    assert len(a["trace_files"]) == 8 and len(a["rank_edges"]) > 10_000
    for name in a:
        assert a[name] == b[name], name
    # committing again: nothing staged any more
    r = cli("commit", sharded, "--job", "dlrm")
    assert r.returncode == 1 and "nothing staged" in r.stderr


def _single(tmp_path: Path, name: str, rank: int, ts: int) -> Path:
    return write(tmp_path / name, kineto_text([x("op", ts, 5)], rank=rank))


def test_a_missing_shard_publishes_nothing(tmp_path: Path) -> None:
    files = [_single(tmp_path, f"rank{r}.json", r, 10 + r) for r in range(4)]
    store = tmp_path / "store"
    for i in (0, 2):  # shard 1 of 3 never ran (or was killed before it staged)
        code, out, err = run("ingest", *files, "--store", store, "--job", "j",
                             "--shard", f"{i}/3", "--workers", "1")
        assert code == 0, err
    code, out, err = run("commit", store, "--job", "j")
    assert code == 1 and out == ""
    assert err == f"tracetool: error: {store}: job j: shard 1 of 3 not staged (not run, still " \
                  "running or killed): run them, then commit\n"
    assert not (store / "data").exists()
    # the missing shard, run again later: then the commit publishes all four ranks
    assert run("ingest", *files, "--store", store, "--job", "j", "--shard", "1/3",
               "--workers", "1")[0] == 0
    code, out, err = run("commit", store, "--job", "j")
    assert code == 0, err
    assert sorted(p.name for p in (store / "data" / "job=j").iterdir()) == \
        [f"rank={r}" for r in range(4)]


def test_a_rank_staged_twice_publishes_nothing(tmp_path: Path) -> None:
    a, b = _single(tmp_path, "a.json", 0, 10), _single(tmp_path, "b.json", 0, 20)
    store = tmp_path / "store"
    for i in range(2):  # each shard sees one rank-0 file: only the commit can tell
        assert run("ingest", a, b, "--store", store, "--job", "j", "--shard", f"{i}/2",
                   "--workers", "1")[0] == 0
    code, out, err = run("commit", store, "--job", "j")
    assert code == 1
    assert err == (f"tracetool: error: {store}: job j: rank 0 staged by a.json and b.json: give "
                   "those files other --job names or ranks\n")
    assert not (store / "data").exists()
    assert len(list((store / "staging" / "job=j").iterdir())) == 2  # kept for a fix


def test_running_a_shard_again_replaces_its_staged_copy(tmp_path: Path) -> None:
    f = _single(tmp_path, "rank0.json", 0, 10)
    store = tmp_path / "store"
    for _ in range(2):
        assert run("ingest", f, "--store", store, "--job", "j", "--shard", "0/1")[0] == 0
    assert [p.name for p in (store / "staging" / "job=j").iterdir()] == ["shard-0-of-1"]
    assert not list((store / ".tmp").iterdir())  # no stage left behind
    assert run("commit", store, "--job", "j")[0] == 0


@pytest.mark.parametrize("shard", ["3/3", "0/0", "1", "a/b", "-1/2"])
def test_bad_shard_is_a_usage_error(tmp_path: Path, shard: str) -> None:
    f = _single(tmp_path, "rank0.json", 0, 10)
    code, _, err = run("ingest", f, "--store", tmp_path / "s", "--shard", shard)
    assert code == 2 and f"bad --shard {shard!r}: give I/N with 0 <= I < N" in err


def test_rank_and_shard_do_not_go_together(tmp_path: Path) -> None:
    f = _single(tmp_path, "rank0.json", 0, 10)
    code, _, err = run("ingest", f, "--store", tmp_path / "s", "--rank", "0", "--shard", "0/2")
    assert code == 2 and "--rank and --shard do not go together" in err


def test_commit_of_a_store_with_nothing_staged(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    code, out, err = run("commit", tmp_path / "s", "--job", "j")
    assert code == 1 and "nothing staged (no staging/ directory)" in err
    shutil.rmtree(tmp_path / "s")


# ------------------------------------------ shards agree (issue 32, items 3, 4 and 8)

def _list_id(files: list[Path]) -> str:
    """The first 12 hex digits of the sha256 of a shard's list: its files' resolved
    absolute paths, sorted, NUL-separated (written out here, not taken from shard.py)."""
    keys = sorted(str(f.resolve()).encode() for f in files)
    return hashlib.sha256(b"\0".join(keys)).hexdigest()[:12]


def _ranks_dir(tmp_path: Path, n: int = 4) -> list[Path]:
    d = tmp_path / "tr"
    d.mkdir()
    return [_single(d, f"rank{r}.json", r, 10 + r) for r in range(n)]


def test_shards_given_different_file_lists_publish_nothing(tmp_path: Path) -> None:
    """Shard 0 of 2 given the directory (4 files), shard 1 given two of its files: each
    slice is right for its own list, so together they stage ranks 0, 1 and 2, and rank 3
    would be silently missing; the commit refuses, naming both, and publishes nothing."""
    files = _ranks_dir(tmp_path)
    store = tmp_path / "store"
    assert run("ingest", tmp_path / "tr", "--store", store, "--job", "j", "--shard", "0/2",
               "--workers", "1")[0] == 0
    assert run("ingest", *files[:2], "--store", store, "--job", "j", "--shard", "1/2",
               "--workers", "1")[0] == 0
    code, out, err = run("commit", store, "--job", "j")
    assert (code, out) == (1, "")
    assert err == (f"tracetool: error: {store}: job j: the shards were given different file "
                   "lists, so their slices need not cover the job: shard 0 of 2 got 4 files "
                   f"(list {_list_id(files)}); shard 1 of 2 got 2 files (list "
                   f"{_list_id(files[:2])}); run every shard with the same paths, then "
                   "commit\n")
    assert not (store / "data").exists()
    assert len(list((store / "staging" / "job=j").iterdir())) == 2  # kept for a fix
    # shard 1 again, given the same files by another route (a symlinked directory, named
    # file by file): the lists agree, and the commit publishes all four ranks
    (tmp_path / "link").symlink_to(tmp_path / "tr")
    assert run("ingest", *[tmp_path / "link" / f.name for f in files], "--store", store,
               "--job", "j", "--shard", "1/2", "--workers", "1")[0] == 0
    code, out, err = run("commit", store, "--job", "j")
    assert code == 0, err
    assert sorted(p.name for p in (store / "data" / "job=j").iterdir()) == \
        [f"rank={r}" for r in range(4)]


def test_a_shard_staged_without_its_file_list_is_refused(tmp_path: Path) -> None:
    files = _ranks_dir(tmp_path, 2)
    store = tmp_path / "store"
    for i in range(2):
        assert run("ingest", *files, "--store", store, "--job", "j", "--shard", f"{i}/2",
                   "--workers", "1")[0] == 0
    manifest = store / "staging" / "job=j" / "shard-1-of-2" / "shard.json"
    doc = json.loads(manifest.read_text())
    del doc["given"]  # as a tracetool before the lists were recorded wrote it
    manifest.write_text(json.dumps(doc))
    code, _, err = run("commit", store, "--job", "j")
    assert code == 1 and not (store / "data").exists()
    assert err == (f"tracetool: error: {store}: job j: shard 1 of 2 was staged by an older "
                   "tracetool, which did not record its file list: run it again, then "
                   "commit\n")


def test_commit_removes_staging_once_empty(tmp_path: Path) -> None:
    files = _ranks_dir(tmp_path, 2)
    store = tmp_path / "store"
    for job in ("a", "b"):
        assert run("ingest", *files, "--store", store, "--job", job, "--shard", "0/1",
                   "--workers", "1")[0] == 0
    assert run("commit", store, "--job", "a")[0] == 0
    assert [p.name for p in (store / "staging").iterdir()] == ["job=b"]  # b's still staged
    assert run("commit", store, "--job", "b")[0] == 0
    assert sorted(os.listdir(store)) == [".lock", ".tmp", "data", "format.json"]
    assert os.listdir(store / ".tmp") == []


def _signal_after(monkeypatch: pytest.MonkeyPatch, moved_to: Callable[[Path], bool]) -> list:
    """SIGTERM to this process right after the first os.rename onto a path ``moved_to``
    accepts (the CLI's handler turns it into the interrupt)."""
    real, sent = os.rename, []

    def rename(a: object, b: object, **kw: object) -> None:
        real(a, b, **kw)
        if not sent and moved_to(Path(b)):
            sent.append(Path(b))
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "rename", rename)
    return sent


def test_an_interrupted_commit_reports_the_ranks_it_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM the instant the commit put its second rank in place (rank 2: shard 0's files
    come first): ranks 0 and 2 are reported and in the store, 1 and 3 still staged; a second
    commit publishes those."""
    files = _ranks_dir(tmp_path)
    store = tmp_path / "store"
    for i in range(2):
        assert run("ingest", tmp_path / "tr", "--store", store, "--job", "j", "--shard",
                   f"{i}/2", "--workers", "1")[0] == 0
    sent = _signal_after(monkeypatch, lambda b: b == store / "data" / "job=j" / "rank=2")
    code, out, err = run("commit", store, "--job", "j")
    monkeypatch.undo()
    assert sent and code == 143, (code, out, err)
    assert out == "".join(f"ingested {files[r]} -> job j rank {r}\n" for r in (0, 2))
    assert err == ("tracetool: error: interrupted by SIGTERM; the ranks reported above are in "
                   "the store, the others are still staged: commit again\n")
    assert sorted(p.name for p in (store / "data" / "job=j").iterdir()) == ["rank=0", "rank=2"]
    code, out, err = run("commit", store, "--job", "j")
    assert code == 0, err
    assert out == "".join(
        f"skipped {files[r]} -> job j rank {r}: published by an earlier commit (interrupted "
        f"before it ended)\n" if r in (0, 2) else f"ingested {files[r]} -> job j rank {r}\n"
        for r in (0, 2, 1, 3))
    assert sorted(p.name for p in (store / "data" / "job=j").iterdir()) == \
        [f"rank={r}" for r in range(4)]
    assert not (store / "staging").exists() and os.listdir(store / ".tmp") == []


def test_an_interrupted_shard_reports_staged_only_what_it_staged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's files are staged together when the shard is: SIGTERM after its first file
    was built reports none of them staged, and leaves no work file."""
    _ranks_dir(tmp_path)
    store = tmp_path / "store"
    sent = _signal_after(monkeypatch, lambda b: b.name == "rank=0" and "-shard-" in str(b))
    code, out, err = run("ingest", tmp_path / "tr", "--store", store, "--job", "j",
                         "--shard", "0/2", "--workers", "1")
    monkeypatch.undo()
    assert sent and (code, out) == (143, ""), (code, out, err)
    assert err == ("tracetool: error: interrupted by SIGTERM; the files reported staged above "
                   "are staged, the others are not\n")
    assert not (store / "staging").exists() and os.listdir(store / ".tmp") == []
    code, out, err = run("ingest", tmp_path / "tr", "--store", store, "--job", "j",
                         "--shard", "0/2", "--workers", "1")  # uninterrupted: both staged
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()] == ["staged", "staged"]


def test_an_interrupt_in_the_grace_of_a_forced_commit_leaves_no_work_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``commit --force`` replacing two ranks sleeps out their grace before deleting the old
    partitions: SIGTERM then lets the deletion finish."""
    files = _ranks_dir(tmp_path, 2)
    store = tmp_path / "store"
    for version in (1, 2):
        for r, f in enumerate(files):
            _single(f.parent, f.name, r, 100 * version + r)
        assert run("ingest", *files, "--store", store, "--job", "j", "--shard", "0/1",
                   "--workers", "1", "--force")[0] == 0
        if version == 1:
            assert run("commit", store, "--job", "j")[0] == 0
    real_sleep, sent = time.sleep, []

    def sleep(seconds: float) -> None:
        if not sent:
            sent.append(seconds)
            os.kill(os.getpid(), signal.SIGTERM)
        real_sleep(seconds)

    monkeypatch.setattr("time.sleep", sleep)
    code, out, err = run("commit", store, "--job", "j", "--force")
    monkeypatch.undo()
    assert sent and code == 143, (code, out, err)
    assert out == "".join(f"ingested {files[r]} -> job j rank {r}\n" for r in (0, 1))
    assert os.listdir(store / ".tmp") == [] and not (store / "staging").exists()
    c = tracetool.connect(store)
    assert c.execute("SELECT rank, sha256 FROM trace_files ORDER BY rank").fetchall() == [
        (r, hashlib.sha256(f.read_bytes()).hexdigest()) for r, f in enumerate(files)]
