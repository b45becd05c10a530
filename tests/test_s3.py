"""The store on object storage (issue 14, item 2), against a real S3-compatible server: moto's
server mode on 127.0.0.1. Ingest, query, report, critical path and replay on s3://, compared
with the same files in a local store; a writer killed mid-upload (SIGKILL) or failing between
uploads publishes nothing; racing commits of one rank: one wins, the other fails in one line;
racing commits of other ranks merge; the requests per rank and per reader open, counted."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

import tracetool
from tracetool import objstore
from tracetool.ingest import store as writer_store
from tracetool.ingest.lock import owner_tag
from tracetool.ingest.pipeline import Options, ingest
from tracetool.store_views import store_files

from ._util import REPO, SAMPLES, run

RANK0, RANK1 = SAMPLES / "rank0.pt.trace.json.gz", SAMPLES / "rank1.pt.trace.json.gz"
TABLES_PER_RANK = 12


@pytest.fixture(scope="module")
def s3_server():
    """An S3-compatible server on 127.0.0.1 (a free port), for this module's tests."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket, the standard AWS settings pointing at the test server, and a cache of
    this test's own."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("TRACETOOL_CACHE_DIR", str(tmp_path / "cache"))
    name = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


def client():
    return boto3.client("s3")


def keys(bucket: str, prefix: str = "") -> list[str]:
    pages = client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


def pointer(bucket: str, prefix: str = "st") -> tuple[bytes, str]:
    r = client().get_object(Bucket=bucket, Key=f"{prefix}/{objstore.POINTER}")
    return r["Body"].read(), r["ETag"]


def table_rows(store: Path | str) -> dict[str, list[tuple]]:
    """Every table's rows (all columns but the ingest time), sorted."""
    con = tracetool.connect(store)
    out = {}
    for t in store_files(store):
        cols = [c for c in con.table(t).columns if c not in ("ingested_at",)]
        out[t] = sorted(con.execute(f"SELECT {', '.join(cols)} FROM {t}").fetchall(), key=repr)
    con.close()
    return out


def error_line(stderr: str) -> str:
    """The one line an error must be (no traceback)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracetool: error: "), stderr
    return lines[0]


def test_the_server_honours_conditional_puts(bucket: str) -> None:
    """What the commit rests on: If-None-Match: * and If-Match on PutObject."""
    c = client()
    etag = c.put_object(Bucket=bucket, Key="k", Body=b"1", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError, match="PreconditionFailed"):
        c.put_object(Bucket=bucket, Key="k", Body=b"2", IfNoneMatch="*")
    c.put_object(Bucket=bucket, Key="k", Body=b"3", IfMatch=etag)
    with pytest.raises(ClientError, match="PreconditionFailed"):
        c.put_object(Bucket=bucket, Key="k", Body=b"4", IfMatch=etag)
    assert c.get_object(Bucket=bucket, Key="k")["Body"].read() == b"3"


def test_ingest_query_report_critical_path_replay(bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/st"
    code, out, err = run("ingest", SAMPLES, "--store", url)
    assert code == 0, err
    assert out.count("ingested") == 2
    local = tmp_path / "local"
    assert run("ingest", SAMPLES, "--store", local)[0] == 0
    assert table_rows(url) == table_rows(local)
    # one object per table per rank, under data/job=J/rank=R/, plus the pointer and manifest
    data = keys(bucket, "st/data/")
    assert len(data) == 2 * TABLES_PER_RANK
    assert keys(bucket, "st/_tracetool/") == sorted(
        [f"st/{objstore.POINTER}"] + [k for k in keys(bucket, "st/_tracetool/manifests/")])
    assert len(keys(bucket, "st/_tracetool/manifests/")) == 1  # superseded ones deleted

    q = "SELECT rank, step, dur_ns FROM step_breakdown ORDER BY rank, step"
    assert run("sql", url, q, "--json")[1] == run("sql", local, q, "--json")[1]
    code, out, err = run("report", url, "--out", tmp_path / "rep", "--json")
    assert code == 0, err
    s3_report, local_report = json.loads(out), json.loads(
        run("report", local, "--out", tmp_path / "rep2", "--json")[1])
    for key in ("steps", "job_steps", "breakdown"):
        if key in local_report:
            assert s3_report[key] == local_report[key], key
    assert (tmp_path / "rep" / "report.html").is_file()
    cp = json.loads(run("critical-path", url, "--json")[1])
    assert cp == json.loads(run("critical-path", local, "--json")[1])
    code, out, err = run("replay", url, "--json")
    assert code == 0, err
    assert json.loads(out)["steps"] == json.loads(run("replay", local, "--json")[1])["steps"]
    # the same files again: skipped, as in a local store
    code, out, _ = run("ingest", SAMPLES, "--store", url)
    assert code == 0 and out.count("skipped") == 2


def counting(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Count the S3 API calls of every client tracetool makes from now on."""
    calls: Counter = Counter()
    real = objstore._new_client

    def counted():
        c = real()
        c.meta.events.register("before-call.s3",
                               lambda model, **_: calls.update([model.name]))
        return c

    monkeypatch.setattr(objstore, "_new_client", counted)
    monkeypatch.setattr(objstore, "_CLIENTS", {})  # clients made from now on count
    return calls


def test_requests_per_rank_and_per_reader_open(bucket: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{bucket}/st"
    calls = counting(monkeypatch)
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    first = dict(calls)
    calls.clear()
    assert run("ingest", RANK1, "--store", url, "--job", "j", "--rank", "1")[0] == 0
    second = dict(calls)
    # a rank: the writer's record, its 12 files, the job's new manifest, the pointer swap
    # (3 GETs of the pointer: the bucket check, what the store holds at the start, and
    # again before the commit; one GET of the job's manifest; one delete of the manifest it
    # superseded and the record); a run: one LIST of the writers' records
    assert second == {"PutObject": 1 + TABLES_PER_RANK + 2, "GetObject": 4,
                      "DeleteObjects": 1, "ListObjectsV2": 1}
    assert first == {"PutObject": 1 + TABLES_PER_RANK + 2, "GetObject": 3,  # pointer: 404
                     "DeleteObjects": 1, "ListObjectsV2": 1}
    calls.clear()
    assert run("ingest", SAMPLES, "--store", f"s3://{bucket}/two")[0] == 0  # 2 ranks, 1 run
    assert calls == {"PutObject": 2 * (1 + TABLES_PER_RANK + 2), "GetObject": 2 + 2,
                     "DeleteObjects": 2, "ListObjectsV2": 1}
    calls.clear()
    files = store_files(url)  # a reader open, cold cache: pointer, manifest, every file
    assert calls == {"GetObject": 2 + 2 * TABLES_PER_RANK}
    assert sum(len(v) for v in files.values()) == 2 * TABLES_PER_RANK
    calls.clear()
    con = tracetool.connect(url)  # warm cache: the pointer and the job's manifest
    assert calls == {"GetObject": 2}
    assert con.execute("SELECT count(DISTINCT rank) FROM events").fetchone() == (2,)
    con.close()
    print(f"\nper rank: {second}; reader open: cold {2 + 2 * TABLES_PER_RANK}, warm 2")


def test_many_parts_become_one_object_per_table(bucket: str, tmp_path: Path) -> None:
    """A rank decoded in pieces has several events/flows parts locally; on S3 one each,
    with the same rows in the same order."""
    url, local = f"s3://{bucket}/st", tmp_path / "local"
    for store in (url, local):
        (r,) = ingest([RANK0], Options(store=store, job="j", rank=0, piece_bytes=4000,
                                       workers=1))
        assert r.status == "ingested", r.message
    assert len([f for f in store_files(local)["events"]]) > 1
    assert len(store_files(url)["events"]) == 1
    assert len(keys(bucket, "st/data/")) == TABLES_PER_RANK
    con_a, con_b = tracetool.connect(url), tracetool.connect(local)
    q = "SELECT eid, name, ts_ns FROM events"  # file order, no ORDER BY
    assert con_a.execute(q).fetchall() == con_b.execute(q).fetchall()


def _stalled_upload(url: str, tmp_path: Path, n: int) -> subprocess.Popen:
    """A real ``tracetool ingest`` of rank 1 into ``url``, stopped (asleep) right after its
    ``n``-th object upload, for a test to kill there."""
    marker = tmp_path / f"uploaded-{n}"
    script = (
        "import sys, time\n"
        "import tracetool.objstore as o\n"
        "real, n = o.ObjectStore.upload, [0]\n"
        "def upload(self, path, rel):\n"
        "    real(self, path, rel); n[0] += 1\n"
        f"    if n[0] == {n}:\n"
        "        open(sys.argv[1], 'w').close(); time.sleep(120)\n"
        "o.ObjectStore.upload = upload\n"
        "from tracetool.cli import cli\n"
        "cli(sys.argv[2:])\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(marker), "ingest", str(RANK1),
                             "--store", url, "--job", "j", "--rank", "1", "--workers", "1"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        proc.kill()
        raise AssertionError(proc.stderr.read().decode() if proc.poll() is not None else
                             "the upload never reached the stop")
    return proc


def test_a_writer_killed_mid_upload_changes_nothing(bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/st"
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    before, rows = pointer(bucket), table_rows(url)
    proc = _stalled_upload(url, tmp_path, 3)
    try:
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    assert pointer(bucket) == before
    assert table_rows(url) == rows
    orphans = objstore.ObjectStore(objstore.parse_location(url)).orphans(min_age_s=0)
    assert len(orphans) == 3 and all("/rank=1/" in k for k in orphans)
    # the next ingest of that rank commits normally, and collects what the killed one left
    assert run("ingest", RANK1, "--store", url, "--job", "j", "--rank", "1")[0] == 0
    assert sorted(table_rows(url)["trace_files"], key=repr) != sorted(rows["trace_files"],
                                                                       key=repr)
    assert objstore.ObjectStore(objstore.parse_location(url)).orphans(min_age_s=0) == []
    assert keys(bucket, f"st/{objstore.WRITERS}/") == []


def test_a_failure_between_uploads_publishes_nothing(bucket: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{bucket}/st"
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    before, rows = pointer(bucket), table_rows(url)
    real, n = objstore.ObjectStore.upload, [0]

    def upload(self, path, rel):
        n[0] += 1
        if n[0] == 4:
            raise objstore.StoreError(f"{url}: writing {rel} failed: injected")
        real(self, path, rel)

    monkeypatch.setattr(objstore.ObjectStore, "upload", upload)
    code, _, err = run("ingest", RANK1, "--store", url, "--job", "j", "--rank", "1")
    assert code == 1 and "injected" in error_line(err)
    assert pointer(bucket) == before
    assert table_rows(url) == rows
    assert objstore.ObjectStore(objstore.parse_location(url)).orphans(min_age_s=0) == []
    assert keys(bucket, f"st/{objstore.WRITERS}/") == []  # the failed writer's record too


def race(monkeypatch: pytest.MonkeyPatch, other: callable) -> None:
    """Run ``other`` (a whole commit) just before this process's first pointer swap."""
    real, done = objstore.ObjectStore.put, []

    def put(self, rel, body, *, if_match=None):
        if rel == objstore.POINTER and not done:
            done.append(True)
            other()
        return real(self, rel, body, if_match=if_match)

    monkeypatch.setattr(objstore.ObjectStore, "put", put)


def test_racing_commits_of_one_rank_one_wins(bucket: str, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    url = f"s3://{bucket}/st"
    won = []
    race(monkeypatch, lambda: won.extend(
        ingest([RANK1], Options(store=url, job="j", rank=0, workers=1))))
    code, _, err = run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0",
                       "--force")
    assert [r.status for r in won] == ["ingested"]
    assert code == 1
    assert "job j rank 0 was committed by another writer" in error_line(err)
    con = tracetool.connect(url)
    assert con.execute("SELECT rank, file_name FROM trace_files").fetchall() == [
        (0, RANK1.name)]
    con.close()
    store = objstore.ObjectStore(objstore.parse_location(url))
    assert store.orphans(min_age_s=0) == []  # the loser deleted what it uploaded


def test_racing_commits_of_other_ranks_merge(bucket: str, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    url = f"s3://{bucket}/st"
    race(monkeypatch, lambda: ingest([RANK1], Options(store=url, job="j", rank=1, workers=1)))
    code, _, err = run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")
    assert code == 0, err
    con = tracetool.connect(url)
    assert con.execute("SELECT rank, file_name FROM trace_files ORDER BY rank").fetchall() == [
        (0, RANK0.name), (1, RANK1.name)]
    con.close()


def test_two_processes_racing_for_one_rank(bucket: str) -> None:
    """Two real ingests of different files as the same rank, at once: whichever order the
    server sees, one is published and the other fails with one line."""
    url = f"s3://{bucket}/st"
    procs = [subprocess.Popen([sys.executable, "-m", "tracetool", "ingest", str(f), "--store",
                               url, "--job", "j", "--rank", "0", "--workers", "1"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for f in (RANK0, RANK1)]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    loser = next(err for p, (_, err) in zip(procs, outs, strict=True) if p.returncode)
    assert "job j rank 0" in error_line(loser)
    con = tracetool.connect(url)
    assert con.execute("SELECT count(*) FROM trace_files").fetchone() == (1,)
    con.close()


def test_force_replaces_a_rank(bucket: str) -> None:
    url = f"s3://{bucket}/st"
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    old = keys(bucket, "st/data/")
    code, _, err = run("ingest", RANK1, "--store", url, "--job", "j", "--rank", "0")
    assert code == 1 and "already holds" in error_line(err)
    assert run("ingest", RANK1, "--store", url, "--job", "j", "--rank", "0", "--force")[0] == 0
    new = keys(bucket, "st/data/")
    assert len(new) == TABLES_PER_RANK and not set(new) & set(old)  # old ones deleted
    con = tracetool.connect(url)
    assert con.execute("SELECT file_name FROM trace_files").fetchall() == [(RANK1.name,)]
    con.close()


def test_queries_read_only_the_store(bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/st"
    assert run("ingest", SAMPLES, "--store", url)[0] == 0
    client().put_object(Bucket=bucket, Key="st/other.parquet", Body=b"x")
    for query in (f"SELECT * FROM read_parquet('s3://{bucket}/st/other.parquet')",
                  f"SELECT * FROM read_csv('{tmp_path}/x.csv')",
                  f"COPY (SELECT 1) TO '{tmp_path}/out.csv'"):
        code, _, err = run("sql", url, query)
        assert code == 1, query
        error_line(err)
    # the cache of local copies is the store's directory for --allow-writes and --output
    cache = Path(os.environ["TRACETOOL_CACHE_DIR"])
    code, _, err = run("sql", url, "SELECT 1", "--allow-writes", cache)
    assert code == 2 and "store" in err
    con = tracetool.connect(url)
    with pytest.raises(Exception, match="disabled|Permission"):
        con.execute(f"SELECT * FROM read_parquet('s3://{bucket}/st/other.parquet')")
    con.close()


def test_errors_are_one_line(bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                             ) -> None:
    code, _, err = run("sql", "s3://no-such-bucket-x/st", "SELECT 1")
    assert code == 1 and "bucket 'no-such-bucket-x' does not exist" in error_line(err)
    code, _, err = run("ingest", RANK0, "--store", "s3://no-such-bucket-x/st")
    assert code == 1 and "does not exist" in error_line(err)
    code, _, err = run("sql", f"s3://{bucket}/empty", "SELECT 1")
    assert code == 1 and "not a tracetool store" in error_line(err)
    code, _, err = run("report", f"s3://{bucket}/empty", "--out", tmp_path / "r")
    assert code == 1 and "not a tracetool store" in error_line(err)
    code, _, err = run("ingest", RANK0, "--store", f"s3://{bucket}/st", "--shard", "0/2")
    assert code == 1 and "--shard" in error_line(err)
    code, _, err = run("commit", f"s3://{bucket}/st", "--job", "j")
    assert code == 1 and "object store" in error_line(err)
    code, _, err = run("sql", "gs://b/st", "SELECT 1")
    assert code == 2 and "not supported" in err
    # a store of another format
    client().put_object(Bucket=bucket, Key=f"old/{objstore.POINTER}",
                        Body=json.dumps({"format": 1, "jobs": {}}).encode())
    code, _, err = run("sql", f"s3://{bucket}/old", "SELECT 1")
    assert code == 1 and "store format 1" in error_line(err)
    code, _, err = run("ingest", RANK0, "--store", f"s3://{bucket}/old")
    assert code == 1 and "store format 1" in error_line(err)
    # no credentials
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, _, err = run("sql", f"s3://{bucket}/st", "SELECT 1")
    assert code == 1 and "no AWS credentials" in error_line(err)
    # no server there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    code, _, err = run("ingest", RANK0, "--store", f"s3://{bucket}/st")
    assert code == 1 and "cannot reach the object store" in error_line(err)
    assert time.monotonic() - t0 < 60


def test_urls_and_paths() -> None:
    loc = objstore.parse_location("s3://bkt/a/b/")
    assert (loc.bucket, loc.prefix, loc.url) == ("bkt", "a/b", "s3://bkt/a/b")
    assert objstore.parse_location(Path("s3://bkt/a")) == objstore.parse_location("s3://bkt/a")
    assert objstore.parse_location("s3://bkt").key("x") == "x"
    assert objstore.parse_location("out/store") == Path("out/store")
    for bad in ("s3://", "s3://bkt/a/../b", "gs://bkt/a"):
        with pytest.raises(objstore.StoreError):
            objstore.parse_location(bad)


def test_cache_is_bounded(bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/st"
    assert run("ingest", SAMPLES, "--store", url)[0] == 0
    files = [f for fs in store_files(url).values() for f in fs]
    root = Path(os.environ["TRACETOOL_CACHE_DIR"])
    old = time.time() - 2 * objstore.CACHE_KEEP_S
    for f in root.glob("objects/*/*/job=*/rank=*/*"):  # the copies and their marks
        os.utime(f, (old, old))
    objstore.trim_cache(root, keep=set(files[:3]), limit=0)
    assert [f for f in files if f.exists()] == files[:3]
    assert len(store_files(url)["events"]) == 2  # fetched again
    (events, _) = store_files(url)["events"]
    events.chmod(0o644)
    events.write_bytes(b"damaged")  # say, by a COPY ... (USE_TMP_FILE false) from Python
    con = tracetool.connect(url)  # fetched again: its size is not the manifest's
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] > 0
    con.close()


def test_concurrent_readers_and_writer(bucket: str) -> None:
    """Readers opening the store while ranks are committed see whole ranks only."""
    url = f"s3://{bucket}/st"
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    seen, stop = [], threading.Event()

    def read() -> None:
        while not stop.is_set() and len(seen) < 50:
            files = store_files(url)
            seen.append({t: len(v) for t, v in files.items()})

    t = threading.Thread(target=read)
    t.start()
    try:
        for rank in (1, 2):
            (r,) = ingest([RANK1 if rank == 1 else RANK0],
                          Options(store=url, job=f"j{rank}", rank=0, workers=1))
            assert r.status == "ingested", r.message
    finally:
        stop.set()
        t.join(60)
    assert seen and all(len(set(s.values())) == 1 for s in seen)  # every table: n ranks


def test_identical_ingests_at_once_one_ingested_the_others_skipped(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three ingests of one file as one rank, each reaching its pointer swap while the next
    commits (the last wins the swap): one ingested, two skipped, as a local store says under
    its lock; the losers' uploads deleted."""
    url = f"s3://{bucket}/st"
    results = []
    real = objstore.ObjectStore.put
    later = [lambda: results.extend(ingest([RANK0], Options(store=url, job="j", rank=0,
                                                            workers=1)))] * 2

    def put(self, rel, body, *, if_match=None):
        if rel == objstore.POINTER and later:
            later.pop()()  # another identical ingest commits before this swap
        return real(self, rel, body, if_match=if_match)

    monkeypatch.setattr(objstore.ObjectStore, "put", put)
    code, out, err = run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0",
                         "--json")
    assert code == 0, err
    first = json.loads(out)
    assert [r.status for r in results] == ["ingested", "skipped"]  # the last, the middle
    assert (first["status"], first["rank"]) == ("skipped", 0)
    assert "already ingested as job j rank 0" in first["message"]
    assert len(keys(bucket, "st/data/")) == TABLES_PER_RANK
    assert objstore.ObjectStore(objstore.parse_location(url)).orphans(min_age_s=0) == []
    assert keys(bucket, f"st/{objstore.WRITERS}/") == []  # every writer's record deleted
    con = tracetool.connect(url)
    assert con.execute("SELECT rank, file_name FROM trace_files").fetchall() == [
        (0, RANK0.name)]
    con.close()


def test_a_deleted_object_or_manifest_is_named(bucket: str) -> None:
    """An object the current pointer leads to, deleted outside tracetool: one line naming
    it (reading again cannot help), not "the store keeps changing"; --force repairs a rank."""
    url = f"s3://{bucket}/st"
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    (events,) = [k for k in keys(bucket, "st/data/") if "/events/" in k]
    client().delete_object(Bucket=bucket, Key=events)
    code, _, err = run("sql", url, "SELECT count(*) FROM events")
    assert code == 1
    assert error_line(err) == (
        f"tracetool: error: {url}: {events.removeprefix('st/')}, job j rank 0's events file, "
        "is missing (deleted outside tracetool?): ingest that rank again with --force")
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0", "--force")[0] == 0
    assert run("sql", url, "SELECT count(*) > 0 FROM events", "--json")[0] == 0
    (manifest,) = keys(bucket, "st/_tracetool/manifests/")
    client().delete_object(Bucket=bucket, Key=manifest)
    for args in (("sql", url, "SELECT 1"), ("ingest", RANK1, "--store", url, "--job", "k")):
        code, _, err = run(*args)
        assert code == 1
        rel = manifest.removeprefix("st/")
        assert error_line(err) == (
            f"tracetool: error: {url}: {rel}, the manifest of job j that "
            f"{objstore.POINTER} names, is missing (deleted outside tracetool?): restore it, "
            f"or remove job j from {objstore.POINTER}")


def test_a_cached_copy_damaged_in_place_is_fetched_again(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached copy changed in place with its size kept: hashed again (its signature no
    longer matches its mark), found wrong and fetched again, so the query's answer is the
    store's; a warm open hashes nothing (the marks are one stat each)."""
    url = f"s3://{bucket}/st"
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    q = "SELECT count(*), sum(hash(e)) FROM events e"  # every column of every row
    code, want, err = run("sql", url, q, "--json")  # a cold cache: every copy fetched
    assert code == 0, err
    hashed = []
    real = objstore.sha256_file
    monkeypatch.setattr(objstore, "sha256_file", lambda p: hashed.append(p) or real(p))
    calls = counting(monkeypatch)
    assert run("sql", url, q, "--json")[1] == want
    assert hashed == [] and calls == {"GetObject": 2}  # warm: the pointer, the manifest
    (events,) = store_files(url)["events"]
    events.chmod(0o644)
    body = bytearray(events.read_bytes())
    mid = len(body) // 2
    body[mid:mid + 4096] = bytes(b ^ 0xFF for b in body[mid:mid + 4096])
    with events.open("r+b") as f:  # in place: the same inode, the same size
        f.write(body)
    calls.clear()
    code, out, err = run("sql", url, q, "--json")
    assert (code, out) == (0, want), err
    root = Path(os.environ["TRACETOOL_CACHE_DIR"])
    assert hashed[0] == events and hashed[1].parent == root / "tmp"  # the copy, the download
    assert len(hashed) == 2 and calls == {"GetObject": 3}  # pointer, manifest, the copy
    snap = objstore.ObjectStore(objstore.parse_location(url)).snapshot()
    (entry,) = [f for f in snap.rank("j", 0)["files"] if f["table"] == "events"]
    assert real(events) == entry["sha256"]
    calls.clear()
    hashed.clear()
    assert run("sql", url, q, "--json")[1] == want  # marked again: warm
    assert hashed == [] and calls == {"GetObject": 2}


def test_orphans_of_a_writer_killed_mid_upload_are_collected_by_the_next(
        bucket: str, tmp_path: Path) -> None:
    """SIGTERM after 5 of a rank's 12 uploads: exit 143, nothing published, 5 unreferenced
    objects and the writer's record left; the next writer (of another job) deletes exactly
    those 6 and nothing the store references."""
    url = f"s3://{bucket}/st"
    assert run("ingest", RANK0, "--store", url, "--job", "j", "--rank", "0")[0] == 0
    proc = _stalled_upload(url, tmp_path, 5)
    try:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 143
    finally:
        proc.kill()
        proc.wait(30)
    store = objstore.ObjectStore(objstore.parse_location(url))
    before = set(keys(bucket, "st/"))
    left = set(keys(bucket, "st/data/job=j/rank=1/")) | set(
        keys(bucket, f"st/{objstore.WRITERS}/"))
    assert len(left) == 5 + 1
    assert {f"st/{k}" for k in store.orphans(min_age_s=0)} == left - set(
        keys(bucket, f"st/{objstore.WRITERS}/"))
    # the record of a dead writer of this host killed after its swap (what it names is
    # referenced: kept), and a live one of another host's (kept, with what it names)
    live = sorted(objstore._referenced(store.snapshot()))
    host = owner_tag().split("-")[0]
    for name, named in ((f"{host}-999999999-1-a", live), ("elsewhere-1-1-b", ["data/x"])):
        client().put_object(Bucket=bucket, Key=f"st/{objstore.WRITERS}/{name}.json",
                            Body=json.dumps({"keys": named}).encode())
    client().put_object(Bucket=bucket, Key="st/data/x", Body=b"x")
    before = set(keys(bucket, "st/"))
    assert run("ingest", RANK1, "--store", url, "--job", "k")[0] == 0
    snap = store.snapshot()
    added = {f"st/{snap.pointer['jobs']['k']}"} | {
        f"st/{f['key']}" for f in snap.rank("k", 1)["files"]}
    assert set(keys(bucket, "st/")) == (before - left - {
        f"st/{objstore.WRITERS}/{host}-999999999-1-a.json"}) | added
    assert store.orphans(min_age_s=0) == ["data/x"]
    con = tracetool.connect(url)
    assert con.execute("SELECT job, rank, file_name FROM trace_files ORDER BY job").fetchall() \
        == [("j", 0, RANK0.name), ("k", 1, RANK1.name)]
    con.close()


def test_which_writers_are_dead() -> None:
    """A record's writer: on this host, dead when its process is; on another host (whose
    processes this one cannot see), when its record is over WRITER_STALE_S old."""
    me, stale = owner_tag(), writer_store.WRITER_STALE_S
    host = me.split("-")[0]
    assert not writer_store.writer_dead(f"{me}-a.json", 10 * stale)  # alive: never
    assert writer_store.writer_dead(f"{host}-999999999-1-a.json", 0)  # gone: at once
    assert not writer_store.writer_dead("elsewhere-1-1-a.json", stale - 1)
    assert writer_store.writer_dead("elsewhere-1-1-a.json", stale + 1)
    assert not writer_store.writer_dead("not-a-tag.json", 10 * stale)
