"""Nothing lost (issue 12, items 2-5 and 7): a lock per store, atomic replace, killed and
interrupted ingests that leave no orphan process, no work files and the old data intact, and
a disk budget for the work files. Real processes (the CLI as a subprocess), real signals."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracetool.ingest import store as store_mod
from tracetool.ingest.budget import MIN_TMP_BUDGET, default_budget, parse_size
from tracetool.ingest.lock import StoreBusy, StoreLock, owner_gone, owner_tag
from tracetool.ingest.store import Store

from ._util import REPO, SAMPLES, con, run

CLI = [sys.executable, "-m", "tracetool"]
SMALL = SAMPLES / "rank0.pt.trace.json.gz"  # 888 events


def tracetool(*args: object, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, **kw)


def popen(*args: object) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def tmp_entries(store: Path) -> list[str]:
    return sorted(os.listdir(store / ".tmp")) if (store / ".tmp").exists() else []


def stored_rank(store: Path, job: str, rank: int) -> tuple[str, int]:
    """(sha256, events read) of one stored rank; its tables hold exactly what the file's
    complete ingest holds (the rows of every table, against ``SMALL`` ingested alone)."""
    c = con(store)
    rows = c.execute("SELECT sha256, events_read, events_stored FROM trace_files "
                     "WHERE job = ? AND rank = ?", [job, rank]).fetchall()
    assert len(rows) == 1, rows
    sha, read, stored = rows[0]
    n = c.execute("SELECT count(*) FROM events WHERE job = ? AND rank = ?",
                  [job, rank]).fetchone()[0]
    assert 0 < n <= stored == read, (n, stored, read)
    return sha, read


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated single-rank trace big enough (~120 MB) that each stage of its ingest
    lasts long enough to be interrupted."""
    out = tmp_path_factory.mktemp("big") / "big.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_trace.py"), "--size",
                    "120MB", "--steps", "8", "--out", str(out)], check=True,
                   capture_output=True, timeout=120)
    return out


# ------------------------------------------------------------------------------- the lock

def test_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from tracetool.ingest.lock import StoreLock\n"
        f"with StoreLock({str(tmp_path)!r}):\n"
        "    print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True,
        cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusy, match=rf"locked by pid {holder.pid} on .* for over 0 s"):
            with StoreLock(tmp_path, timeout_s=0.2):
                pass
    finally:
        holder.kill()  # kill -9: no clean-up runs in the holder
        holder.wait()
    t0 = time.monotonic()
    with StoreLock(tmp_path, timeout_s=5):  # the kernel released the dead holder's lock
        pass
    assert time.monotonic() - t0 < 1


def test_owner_tags() -> None:
    me = owner_tag()
    assert not owner_gone(me + "-x")
    host, pid, start = me.split("-")
    assert owner_gone(f"{host}-{2**22 + 12345}-{start}-x")  # beyond pid_max: no such process
    assert owner_gone(f"{host}-{pid}-{int(start) + 1}-x")  # my pid, reused: its owner is gone
    assert not owner_gone(f"otherhost-{2**22 + 12345}-1-x")  # another host's: never ours
    assert not owner_gone("0123456789abcdef")  # not a tag (left alone)


def test_two_ingests_of_different_files_for_one_rank_never_both_succeed(
        tmp_path: Path) -> None:
    a = tmp_path / "a.json.gz"
    b = tmp_path / "b.json.gz"
    shutil.copy(SMALL, a)
    b.write_bytes(gzip.compress(gzip.decompress(SMALL.read_bytes()) + b" ", mtime=0))
    for round_ in range(3):
        store = tmp_path / f"s{round_}"
        procs = [popen("ingest", f, "--store", store, "--job", "j", "--rank", "0")
                 for f in (a, b)]
        outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        codes = sorted(rc for rc, _, _ in outs)
        assert codes == [0, 1], outs
        loser = next(err for rc, _, err in outs if rc == 1)
        assert "job j rank 0 already holds" in loser and "(different content)" in loser
        winner = next(f for f, (rc, _, _) in zip((a, b), outs, strict=True) if rc == 0)
        sha, n = stored_rank(store, "j", 0)
        assert n == 888
        assert sha == __import__("hashlib").sha256(winner.read_bytes()).hexdigest()
        assert tmp_entries(store) == []


def test_the_same_file_three_times_at_once_is_ingested_once(tmp_path: Path) -> None:
    store = tmp_path / "s"
    procs = [popen("ingest", SMALL, "--store", store, "--job", "j") for _ in range(3)]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in outs] == [0, 0, 0], outs
    verbs = sorted(out.split()[0] for _, out, _ in outs)
    assert verbs == ["ingested", "skipped", "skipped"], outs
    assert all("already ingested as job j rank 0 (same sha256" in out
               for _, out, _ in outs if out.startswith("skipped"))
    assert stored_rank(store, "j", 0)[1] == 888
    assert tmp_entries(store) == []


# ------------------------------------------------------------------------ atomic replace

# argv: the partition, seconds to read, and "until-missing": stop as soon as the partition
# was seen missing (after 1,000 reads), so a loaded machine gets more time to catch the gap
READER = """
import json, os, sys, time
part, seconds, until_missing = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "until-missing"
seen = missing = 0
end = time.monotonic() + seconds
while time.monotonic() < end and not (until_missing and missing and seen > 1000):
    try:
        ok = bool(os.listdir(os.path.join(part, "trace_files")))
    except FileNotFoundError:
        ok = False
    seen += 1
    missing += not ok
print(json.dumps({"seen": seen, "missing": missing}))
"""


def _replace_many(store: Store, partition: Path, times: int, stop: threading.Event) -> int:
    done = 0
    while done < times and not stop.is_set():
        wd = store.new_workdir()
        shutil.copytree(partition, wd / "built")
        with store.lock():
            store.commit("j", 0, wd / "built")
        store.cleanup(wd)
        done += 1
    return done


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two_renames"])
def test_a_reader_never_sees_a_replaced_rank_missing(tmp_path: Path, exchange: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    s = tmp_path / "s"
    assert run("ingest", SMALL, "--store", s, "--job", "j")[0] == 0
    store = Store(s)
    copy = tmp_path / "partition"
    shutil.copytree(store.partition("j", 0), copy)
    if not exchange:  # a file system without RENAME_EXCHANGE: the fallback, for contrast
        def no_exchange(a: Path, b: Path) -> None:
            raise OSError(22, "Invalid argument")
        monkeypatch.setattr(store_mod, "exchange", no_exchange)
    # the exchange: 2.5 s of reads never see the rank missing; the two renames: the reader
    # catches the gap between them (within 20 s, however loaded the machine)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store.partition("j", 0)),
                               "2.5" if exchange else "20", "all" if exchange else "until-missing"],
                              stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    replaced = [0]
    writer = threading.Thread(target=lambda: replaced.__setitem__(
        0, _replace_many(store, copy, 100_000, stop)))
    writer.start()
    out = json.loads(reader.communicate(timeout=60)[0])
    stop.set()
    writer.join(timeout=60)
    store.remove_retired()
    if exchange:  # many replacements, many reads, never a gap
        assert replaced[0] > 100 and out["seen"] > 1000, (replaced, out)
        assert out["missing"] == 0, out
    else:  # the reader is quick enough to catch the gap the exchange closes
        assert replaced[0] >= 1 and out["seen"] > 1000 and out["missing"] > 0, (replaced, out)
    assert stored_rank(s, "j", 0)[1] == 888
    assert tmp_entries(s) == []


def test_a_crash_between_the_two_renames_is_repaired_by_the_next_ingest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = tmp_path / "s"
    assert run("ingest", SMALL, "--store", s, "--job", "j")[0] == 0
    old_sha, _ = stored_rank(s, "j", 0)
    store = Store(s)
    dead = f"{owner_tag().split('-')[0]}-{2**22 + 7}-1"  # a process of this host, gone
    monkeypatch.setattr(store_mod, "owner_tag", lambda: dead)
    monkeypatch.setattr(store_mod, "exchange",
                        lambda a, b: (_ for _ in ()).throw(OSError(38, "ENOSYS")))
    wd = store.new_workdir()
    shutil.copytree(store.partition("j", 0), wd / "built")
    real_rename = Path.rename

    def crash_on_second(self: Path, target: Path) -> Path:
        if self.name == "built":
            raise KeyboardInterrupt  # the process dies between the two renames
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        store.commit("j", 0, wd / "built")
    monkeypatch.undo()
    assert not store.partition("j", 0).exists()  # the crash window the fallback has
    code, out, err = run("ingest", SAMPLES / "rank1.pt.trace.json.gz", "--store", s,
                         "--job", "other")
    assert code == 0, err
    assert stored_rank(s, "j", 0)[0] == old_sha  # put back
    assert tmp_entries(s) == []


# -------------------------------------------------------------- killed and interrupted

def _wait_for_stage(store: Path, stage: str, proc: subprocess.Popen) -> None:
    """Poll the work directory until the ingest is in ``stage`` (bounded: 60 s)."""
    marker = {"decode": "0/stage/events", "derive": "derived"}[stage]  # build.py layout
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        work = [d for d in (store / ".tmp").glob("*") if d.is_dir()]
        if any((d / marker).exists() and any((d / marker).iterdir()) for d in work):
            if stage == "decode" and any((d / "derived").exists() for d in work):
                pytest.fail("missed the decode stage")
            return
        time.sleep(0.01)
    pytest.fail(f"the ingest never reached {stage}")


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited (its new parent reaps it)


@pytest.mark.parametrize("stage", ["decode", "derive"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=["KILL", "TERM", "INT"])
def test_a_killed_ingest_leaves_no_orphans_no_work_files_and_the_old_rank(
        tmp_path: Path, big_trace: Path, sig: signal.Signals, stage: str) -> None:
    s = tmp_path / "s"
    assert run("ingest", SMALL, "--store", s, "--job", "j")[0] == 0
    before = stored_rank(s, "j", 0)
    proc = popen("ingest", big_trace, "--store", s, "--job", "j", "--rank", "0", "--force",
                 "--workers", "2")
    _wait_for_stage(s, stage, proc)
    kids = _children(proc.pid)
    proc.send_signal(sig)
    rc = proc.wait(timeout=30)
    out, err = proc.communicate()
    deadline = time.monotonic() + 5
    while any(map(_running, kids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [k for k in kids if _running(k)], "orphaned workers"
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        assert tmp_entries(s)  # nothing could clean up; the next ingest does
        code, _, _ = run("ingest", SAMPLES / "rank1.pt.trace.json.gz", "--store", s,
                         "--job", "other")
        assert code == 0
    else:
        assert rc == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig], (rc, err)
        assert err == (f"tracetool: error: interrupted by {sig.name}; the files reported "
                       "above are in the store, the others are not\n"), err
        assert out == ""
    assert tmp_entries(s) == []
    assert stored_rank(s, "j", 0) == before


# ------------------------------------------------------------------------------ budgets

def test_default_budget_and_sizes() -> None:
    assert default_budget(10 << 20, gzip=False) == MIN_TMP_BUDGET
    assert default_budget(1 << 30, gzip=False) == 4 << 30
    assert default_budget(100 << 20, gzip=True) == 4 * 10 * (100 << 20)
    assert [parse_size(t) for t in ("64MB", "2GiB", "500k", "1048576", "1.5g")] == [
        64 << 20, 2 << 30, 500 << 10, 1 << 20, int(1.5 * (1 << 30))]
    for bad in ("0", "-1MB", "lots", "nan", "inf", ""):
        with pytest.raises(ValueError):
            parse_size(bad)


def _gzip_bomb(path: Path, events: int) -> Path:
    """A small .json.gz that inflates to ``events`` identical events."""
    ev = b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, ' \
         b'"ts": 5, "dur": 1},\n'
    chunk = ev * 10_000
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(b'{"distributedInfo": {"rank": 0}, "traceEvents": [\n')
        for _ in range(events // 10_000):
            f.write(chunk)
        f.write(ev.rstrip(b",\n") + b"]}\n")
    return path


def test_a_gzip_bomb_stops_at_the_tmp_budget(tmp_path: Path) -> None:
    bomb = _gzip_bomb(tmp_path / "bomb.json.gz", 3_000_000)  # ~250 MB of JSON
    assert bomb.stat().st_size < 5 << 20
    s = tmp_path / "s"
    t0 = time.monotonic()
    r = tracetool("ingest", bomb, "--store", s, "--tmp-budget", "48MB", "--workers", "2")
    assert time.monotonic() - t0 < 30
    assert r.returncode == 1, r
    assert r.stderr == (f"tracetool: error: {bomb}: stopped: its work files in the store's "
                        ".tmp grew past 48.0 MiB, the --tmp-budget\n")
    assert tmp_entries(s) == []
    assert not (s / "data").exists()


def test_tmp_budget_option_errors(tmp_path: Path) -> None:
    for bad in ("0", "lots"):
        code, _, err = run("ingest", SMALL, "--store", tmp_path / "s", "--tmp-budget", bad)
        assert code == 2 and f"{bad!r} is not a size" in err


# ------------------------------------------------------- stores and trees we cannot use

@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory other users can traverse (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="tracetool-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as_nobody(*args: object) -> subprocess.CompletedProcess:
    """The CLI as user nobody: permission checks apply even though the tests run as root."""
    if os.geteuid() != 0:
        return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True,
                              timeout=300, cwd=REPO)
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run the CLI as another user")
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           *CLI, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "HOME": "/tmp"})


def test_a_read_only_store_is_one_line(shared_tmp: Path) -> None:
    s = shared_tmp / "s"
    assert run("ingest", SMALL, "--store", s, "--job", "j")[0] == 0
    for d in (s, s / ".tmp"):
        d.chmod(0o555)  # not writable by its owner either
    r = _as_nobody("ingest", SAMPLES / "rank1.pt.trace.json.gz", "--store", s, "--job", "j")
    assert r.returncode == 1, r
    assert r.stderr == f"tracetool: error: {s}: cannot write to the store: Permission denied\n"
    for d in (s, s / ".tmp"):
        d.chmod(0o755)
    assert stored_rank(s, "j", 0)[1] == 888


def test_a_trace_in_an_untraversable_directory_is_one_line(shared_tmp: Path) -> None:
    d = shared_tmp / "locked"
    d.mkdir()
    shutil.copy(SMALL, d / "rank0.json.gz")
    d.chmod(0o700)  # its owner's only
    open_dir = shared_tmp / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    r = _as_nobody("ingest", d / "rank0.json.gz", "--store", open_dir / "s")
    assert r.returncode == 1, r
    assert r.stderr == (f"tracetool: error: {d / 'rank0.json.gz'}: cannot be looked up: "
                        "Permission denied\n"), r.stderr


def test_stored_files_sees_every_new_and_replaced_rank_of_a_cached_store(tmp_path: Path
                                                                         ) -> None:
    """``Store.stored_files`` reads a partition again only when its directory changed (a
    rename or an exchange gives the name another directory): a store object that cached
    ranks 0-2 sees rank 3 added and rank 1 replaced, by itself or by another process."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracetool.ingest.store import Store

    def built(name: str) -> Path:
        d = tmp_path / "built" / name
        (d / "trace_files").mkdir(parents=True)
        pq.write_table(pa.table({"path": [f"/t/{name}"], "file_name": [name],
                                 "sha256": [name * 4], "bytes": [len(name)]}),
                       d / "trace_files" / "part-0.parquet")
        return d

    store = Store(tmp_path / "store")
    store.create()
    for r in range(3):
        store.commit("j", r, built(f"r{r}"))
    assert [(s.rank, s.file_name) for s in store.stored_files()] == [(0, "r0"), (1, "r1"),
                                                                     (2, "r2")]
    store.commit("j", 3, built("r3"))
    other = Store(tmp_path / "store")  # another ingest replaces rank 1
    other.commit("j", 1, built("r1b"))
    assert [(s.rank, s.file_name) for s in store.stored_files()] == [
        (0, "r0"), (1, "r1b"), (2, "r2"), (3, "r3")]
    assert {s.sha256 for s in store.stored_files() if s.rank == 1} == {"r1b" * 4}
    other.remove_retired()
