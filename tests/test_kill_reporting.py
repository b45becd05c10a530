"""A kill that cannot misreport (issue 32, item 3): the line that reports a committed file
is printed by the commit that makes it visible, so whenever SIGINT or SIGTERM lands, the
files an interrupted ``ingest --force`` reported are exactly those the store holds the new
bytes of, and no work file is left (the 2 s grace of a replaced rank included).

A signal sent at a chosen instant from inside the commit (in-process, deterministic), and
a real ``python -m tracetool ingest --force`` killed at seeded random points."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tracetool.ingest import store as store_mod

from ._util import REPO, kineto_text, run, write, x

RANKS = 3
INTERRUPTED = ("tracetool: error: interrupted by SIGTERM; the files reported above are in "
               "the store, the others are not\n")
LINE = re.compile(r"^ingested (\S+) -> job j rank (\d+): 20 events read, 20 stored, "
                  r"0 quarantined$")


def _traces(d: Path, version: int) -> list[Path]:
    """One small file per rank; each version's bytes differ (its ops start later)."""
    d.mkdir(parents=True, exist_ok=True)
    return [write(d / f"rank{r}.json", kineto_text(
        [x("op", 10 + 100 * version + i, 5) for i in range(20)], rank=r))
        for r in range(RANKS)]


def _sha(f: Path) -> str:
    return hashlib.sha256(f.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], list[Path]]:
    """(a store holding version 1 of ranks 0-2, version 1's files, version 2's files)."""
    d = tmp_path_factory.mktemp("kills")
    v1, v2 = _traces(d / "v1", 1), _traces(d / "v2", 2)
    assert {_sha(a) for a in v1}.isdisjoint(_sha(b) for b in v2)
    store = d / "base"
    code, _, err = run("ingest", *v1, "--store", store, "--job", "j", "--workers", "1")
    assert code == 0, err
    return store, v1, v2


def _held(store: Path) -> dict[int, str]:
    """rank -> the sha256 its trace_files row holds, read from the Parquet files."""
    out = {}
    for part in sorted((store / "data" / "job=j").iterdir()):
        rows = [r for f in sorted((part / "trace_files").glob("*.parquet"))
                for r in pq.read_table(f, columns=["sha256"]).to_pylist()]
        assert len(rows) == 1, (part, rows)
        out[int(part.name.removeprefix("rank="))] = rows[0]["sha256"]
    return out


def _work_files(store: Path) -> list[str]:
    """Whatever an ingest may leave besides the store's own files: .tmp entries, staging."""
    left = sorted(os.listdir(store / ".tmp"))
    return left + (["staging"] if (store / "staging").exists() else [])


def _check(store: Path, v1: list[Path], v2: list[Path], out: str) -> set[int]:
    """The ranks ``out`` reports ingested are exactly those holding version 2; the rest
    hold version 1. Returns the reported ranks."""
    reported = {}
    for line in out.splitlines():
        if line.startswith("{"):  # --json
            doc = json.loads(line)
            assert (doc["status"], doc["job"], doc["events_stored"]) == ("ingested", "j", 20)
            reported[doc["rank"]] = doc["path"]
            continue
        m = LINE.match(line)
        assert m, line
        reported[int(m.group(2))] = m.group(1)
    assert {r: Path(p) for r, p in reported.items()} == {r: v2[r] for r in reported}
    assert _held(store) == {r: _sha(v2[r] if r in reported else v1[r]) for r in range(RANKS)}
    assert _work_files(store) == []
    return set(reported)


def _fresh(base: Path, to: Path) -> Path:
    shutil.copytree(base, to)
    return to


# ------------------------------------------------- a signal at the instant of a commit

@pytest.mark.parametrize("how", ["exchange", "two_renames"])
def test_a_signal_just_after_a_rank_is_replaced_is_reported_with_it(
        tmp_path: Path, versions: tuple, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """SIGTERM lands the instant rank 1's new partition is in place (by the exchange, or the
    second of the fallback's two renames): rank 1 is reported, and rank 2 is not ingested."""
    base, v1, v2 = versions
    store = _fresh(base, tmp_path / "s")
    monkeypatch.setattr(store_mod, "RETIRE_GRACE_S", 0.0)  # not the subject: no 2 s wait
    real_exchange, real_rename, sent = store_mod.exchange, os.rename, []

    def kill_after(done: None = None) -> None:
        if not sent and (store / "data" / "job=j" / "rank=1" / "trace_files").is_dir() \
                and _held(store)[1] == _sha(v2[1]):
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    if how == "exchange":
        monkeypatch.setattr(store_mod, "exchange",
                            lambda a, b: kill_after(real_exchange(a, b)))
    else:
        def no_exchange(a: Path, b: Path) -> None:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(store_mod, "exchange", no_exchange)
        monkeypatch.setattr(os, "rename", lambda a, b, **kw: kill_after(real_rename(a, b, **kw)))
    code, out, err = run("ingest", *v2, "--store", store, "--job", "j", "--force",
                         "--workers", "1")
    monkeypatch.undo()
    assert sent == [1]
    assert (code, err) == (143, INTERRUPTED), (code, out, err)
    assert _check(store, v1, v2, out) == {0, 1}


@pytest.mark.parametrize("as_json", [False, True], ids=["lines", "json"])
def test_a_signal_just_after_a_new_rank_is_renamed_in_is_reported_with_it(
        tmp_path: Path, versions: tuple, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    base, v1, v2 = versions
    store = _fresh(base, tmp_path / "s")
    shutil.rmtree(store / "data" / "job=j" / "rank=2")  # rank 2 is new to the store
    monkeypatch.setattr(store_mod, "RETIRE_GRACE_S", 0.0)
    real_rename, sent = os.rename, []

    def rename(a: Path, b: Path, **kw: object) -> None:
        real_rename(a, b, **kw)
        if not sent and Path(b) == store / "data" / "job=j" / "rank=2":
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "rename", rename)
    code, out, err = run("ingest", *v2, "--store", store, "--job", "j", "--force",
                         "--workers", "1", *(["--json"] if as_json else []))
    monkeypatch.undo()
    assert sent == [1]
    assert (code, err) == (143, INTERRUPTED), (code, out, err)
    assert out.startswith("{") == as_json
    assert _check(store, v1, v2, out) == {0, 1, 2}


def test_a_signal_in_the_grace_of_the_replaced_ranks_leaves_no_work_file(
        tmp_path: Path, versions: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingest sleeps out the 2 s grace of the replaced partitions before deleting them:
    a signal then lets the deletion finish."""
    base, v1, v2 = versions
    store = _fresh(base, tmp_path / "s")
    real_sleep, sent = time.sleep, []

    def sleep(seconds: float) -> None:
        if not sent:
            sent.append(seconds)
            os.kill(os.getpid(), signal.SIGTERM)
        real_sleep(seconds)

    monkeypatch.setattr(store_mod.time, "sleep", sleep)
    code, out, err = run("ingest", *v2, "--store", store, "--job", "j", "--force",
                         "--workers", "1")
    monkeypatch.undo()
    assert len(sent) == 1 and 0 < sent[0] <= store_mod.RETIRE_GRACE_S
    assert (code, err) == (143, INTERRUPTED), (code, out, err)
    assert _check(store, v1, v2, out) == {0, 1, 2}


def test_a_signal_while_a_replaced_rank_is_deleted_leaves_no_work_file(
        tmp_path: Path, versions: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit deletes the replaced partitions already past their grace (here: at once):
    SIGTERM as it starts deleting rank 0's lets the deletion finish."""
    base, v1, v2 = versions
    store = _fresh(base, tmp_path / "s")
    monkeypatch.setattr(store_mod, "RETIRE_GRACE_S", 0.0)
    real_rmtree, sent = shutil.rmtree, []

    def rmtree(path: object, *a: object, **kw: object) -> None:
        if not sent and "-old-" in Path(path).name:
            sent.append(path)
            os.kill(os.getpid(), signal.SIGTERM)
        real_rmtree(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    code, out, err = run("ingest", *v2, "--store", store, "--job", "j", "--force",
                         "--workers", "1")
    monkeypatch.undo()
    assert len(sent) == 1
    assert (code, err) == (143, INTERRUPTED), (code, out, err)
    assert _check(store, v1, v2, out) == {0}


# ------------------------------------------------------------- real kills, at random

KILLS = 12


def _kill_at(proc: subprocess.Popen, store: Path, rng: random.Random, lines: list[str],
             seen: threading.Condition) -> None:
    """SIGTERM at a seeded random point: a time into the building (once a work directory
    appeared), or a time after the k-th result line (then often within the commits of the
    next ranks, or the grace of the replaced ones)."""
    k = rng.randrange(RANKS + 1)
    delay = rng.uniform(0, 0.4) if k == 0 else rng.choice([0, rng.uniform(0, 0.02),
                                                            rng.uniform(0, 2.2)])
    deadline = time.monotonic() + 60
    if k == 0:
        while not os.listdir(store / ".tmp") and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
    with seen:
        seen.wait_for(lambda: len(lines) >= k or proc.poll() is not None, timeout=60)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)


def _trial(base: Path, v1: list[Path], v2: list[Path], d: Path, seed: int
           ) -> tuple[int, set[int]]:
    """One killed ``ingest --force``: (its exit code, the ranks it reported), checked."""
    store = _fresh(base, d / "s")
    proc = subprocess.Popen([sys.executable, "-m", "tracetool", "ingest", *map(str, v2),
                             "--store", str(store), "--job", "j", "--force", "--workers",
                             "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    lines: list[str] = []
    seen = threading.Condition()

    def read() -> None:
        for line in proc.stdout:
            with seen:
                lines.append(line)
                seen.notify_all()
        with seen:
            seen.notify_all()

    reader = threading.Thread(target=read)
    reader.start()
    _kill_at(proc, store, random.Random(seed), lines, seen)
    err = proc.stderr.read()
    code = proc.wait(timeout=60)
    reader.join(timeout=60)
    out = "".join(lines)
    reported = _check(store, v1, v2, out)
    if code == 143:
        assert err == INTERRUPTED, (seed, out, err)
    else:  # done before the signal, or signalled before or after the ingest's own handler
        assert code in (0, -signal.SIGTERM) and err == "", (seed, code, out, err)
        assert reported in (set(), set(range(RANKS))) and (code != 0 or reported), seed
    return code, reported


def test_random_kills_of_a_force_reingest_report_what_the_store_holds(
        tmp_path: Path, versions: tuple) -> None:
    """Twelve real SIGTERMs at seeded random points, three trials at a time (much of a trial
    is the grace, asleep): every time, the
    files reported are those the store holds anew, the others hold their old bytes, and no
    work file is left."""
    base, v1, v2 = versions
    results: dict[int, tuple[int, set[int]] | BaseException] = {}

    def lane(seeds: range) -> None:
        for seed in seeds:
            try:
                results[seed] = _trial(base, v1, v2, tmp_path / str(seed), seed)
            except BaseException as e:  # noqa: BLE001  # re-raised below, with its seed
                results[seed] = e

    lanes = [threading.Thread(target=lane, args=(range(i, KILLS, 3),)) for i in range(3)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join(timeout=300)
    for seed in range(KILLS):
        if isinstance(results.get(seed), BaseException):
            raise AssertionError(f"seed {seed}") from results[seed]
    assert sorted(results) == list(range(KILLS))
    interrupted = [rep for code, rep in results.values() if code == 143]
    assert len(interrupted) >= KILLS // 2, results  # most signals land inside the run
    assert any(rep == set(range(RANKS)) for rep in interrupted), results  # in the grace
