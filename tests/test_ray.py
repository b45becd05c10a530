"""``tracetool ingest --executor ray`` (issue 14, item 1) against a real local Ray cluster.

Ray's servers listen on every interface, so each test runs its cluster and the CLI inside a
network namespace of its own (``unshare --net``) with only the loopback interface up: the
cluster is reachable from 127.0.0.1 only, and nothing outside the namespace can reach it.
The 8-rank DLRM job of ../shared/traces ingested on Ray gives the same tables as the local
executor."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._util import kineto_text, run, write, x
from .test_shard import DLRM, tables

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None or shutil.which("unshare") is None
    or os.geteuid() != 0,
    reason="needs Ray (pip install 'tracetool[ray]'), unshare and root for a network namespace")

BIN = Path(sys.executable).parent


def in_netns(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a shell script in a new network namespace whose only interface is loopback."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0",
           # Ray's token authentication, with a token of this test's own
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(["unshare", "--net", "sh", "-c", "ip link set lo up\n" + script],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.skipif(not DLRM.is_dir(), reason=f"corpus not found: {DLRM}")
def test_ray_executor_writes_the_same_tables_as_the_local_one(tmp_path: Path,
                                                              dlrm_store: Path) -> None:
    on_ray = tmp_path / "ray"
    q = shlex.quote
    r = in_netns(f"""
        ray start --head --node-ip-address=127.0.0.1 --port=6399 --num-cpus=2 \\
            --include-dashboard=false --disable-usage-stats > /dev/null 2>&1 || exit 9
        RAY_ADDRESS=127.0.0.1:6399 tracetool ingest {q(str(DLRM))} --store {q(str(on_ray))} \\
            --job dlrm --executor ray --json
        code=$?
        ray stop > /dev/null 2>&1
        exit $code""")
    assert r.returncode == 0, r.stderr[-2000:]
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert sorted(x["rank"] for x in results) == list(range(8))
    assert {x["status"] for x in results} == {"ingested"}
    a, b = tables(on_ray), tables(dlrm_store)  # the local executor's (the shared store)
    assert len(a["events"]) > 10_000 and len(a["trace_files"]) == 8
    for name in a:
        assert a[name] == b[name], name


def test_ray_with_no_cluster_starts_its_own_and_reports_a_bad_file(tmp_path: Path) -> None:
    good = write(tmp_path / "rank0.json", kineto_text([x("op", 10, 5)], rank=0))
    bad = write(tmp_path / "mystery.json", kineto_text([x("op", 10, 5)], rank=None))  # no rank
    store = tmp_path / "store"
    r = in_netns(f"tracetool ingest {good} {bad} --store {store} --job j --executor ray")
    assert r.returncode == 1, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if line.startswith("tracetool: error:")] \
        == [line for line in run("ingest", good, bad, "--store", tmp_path / "s2", "--job",
                                 "j")[2].splitlines() if line.startswith("tracetool: error:")]
    assert "ingested" in r.stdout and (store / "data" / "job=j" / "rank=0").is_dir()
    assert [p.name for p in (store / "data" / "job=j").iterdir()] == ["rank=0"]


def test_ray_missing_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write(tmp_path / "rank0.json", kineto_text([x("op", 10, 5)], rank=0))
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code, _, err = run("ingest", f, "--store", tmp_path / "s", "--executor", "ray")
    assert code == 2 and "--executor ray needs Ray: pip install 'tracetool[ray]'" in err
    assert not (tmp_path / "s" / "data").exists()


def test_report_per_rank_tasks_on_ray_give_the_same_report(dlrm_store: Path,
                                                           tmp_path: Path) -> None:
    """``report --executor ray``: step breakdown, kernel and op summaries as one Ray task per
    rank (analysis/per_rank.py), gathered on the driver: the same report, number for number,
    as the plain views give, on a cluster the test starts."""
    store = dlrm_store
    q = shlex.quote
    r = in_netns(f"""
        ray start --head --node-ip-address=127.0.0.1 --port=6399 --num-cpus=2 \\
            --include-dashboard=false --disable-usage-stats > /dev/null 2>&1 || exit 9
        RAY_ADDRESS=127.0.0.1:6399 tracetool report {q(str(store))} --out {q(str(tmp_path))}/r \\
            --executor ray --json
        code=$?
        ray stop > /dev/null 2>&1
        exit $code""")
    assert r.returncode == 0, r.stderr[-2000:]
    code, local, err = run("report", store, "--out", tmp_path / "l", "--json")
    assert code == 0, err
    on_ray, local = json.loads(r.stdout), json.loads(local)
    assert len(on_ray["breakdown"]) == 8 and on_ray["top"]["what"] == "kernels"
    assert on_ray.pop("per_rank_tasks") == 8 and local.pop("per_rank_tasks") is None
    for doc in (on_ray, local):
        doc.pop("files")
    assert on_ray == local


def test_per_rank_rows_equal_the_views(dlrm_store: Path) -> None:
    """What one task returns is exactly the view's rows of its rank (no Ray needed)."""
    import duckdb

    from tracetool.analysis.connect import connect
    from tracetool.analysis.per_rank import PER_RANK_VIEWS, rank_views
    from tracetool.analysis.windows import Windows

    store = dlrm_store
    con = connect(store, duckdb.connect())
    for rank in (0, 5):
        got = rank_views(str(store), "dlrm", rank, Windows())
        for v in PER_RANK_VIEWS:
            want = con.sql(f"SELECT * FROM {v} WHERE job = 'dlrm' AND rank = {rank}")
            assert got[v].num_rows == len(want.fetchall()) > 0, v
            assert sorted(got[v].to_pylist(), key=str) == sorted(
                want.to_arrow_table().to_pylist(), key=str), v
