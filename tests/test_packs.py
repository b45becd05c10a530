"""Packs (tracetool.packs, ingest/packs.py): a job's tables compacted into one file each are
read instead of its partitions only while they are a copy of exactly those partitions, and
every view answers the same from either."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import tracetool
from tracetool import packs
from tracetool.ingest import packs as build
from tracetool.ingest.lock import owner_tag
from tracetool.ingest.pipeline import Options, ingest
from tracetool.ingest.store import Store
from tracetool.replay import Replayer, Scenario, parse_network
from tracetool.schema import TABLES
from tracetool.store_views import store_files

from ._util import REPO

NETLAB = REPO / "sample_traces" / "netlab"
NET = "gpus_per_node=1,inter_node_bw=1Gbit/s,inter_node_latency=43us"
VIEWS = ("events", "gpu_ops", "collectives", "cp_nodes", "rank_edges", "trace_files",
         "steps", "collective_instances", "stragglers", "step_breakdown", "rank_clock_offsets")


@pytest.fixture
def few_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "PACK_MIN_RANKS", 2)  # the netlab jobs have 4 ranks


def _rows(store: Path) -> dict[str, list]:
    con = tracetool.connect(store)
    return {v: sorted(map(repr, con.execute(f"SELECT * EXCLUDE (job) FROM {v}").fetchall()))
            for v in VIEWS}


def _step_times(store: Path, job: str) -> list[int]:
    r = Replayer.from_store(tracetool.connect(store), job)
    sc = Scenario(source_network=parse_network(NET),
                  network=parse_network("gpus_per_node=1,inter_node_bw=200Mbit/s"))
    return [s.projected_ns for s in r.run(sc, critical_path=False).steps]


def test_a_pack_is_read_and_answers_as_the_partitions(tmp_path: Path, few_ranks: None) -> None:
    store = tmp_path / "store"
    ingest([NETLAB / "a2a_1gbit"], Options(store, job="a2a"))
    root = store.resolve()
    gen = packs.current_pack(root, "a2a")
    assert gen is not None
    files = store_files(store)
    for t in TABLES:  # one file per table, the pack's, when the table has rows
        assert all(gen in f.parents for f in files[t.name]) and len(files[t.name]) <= 1
    assert len(files["events"]) == 1
    packed, packed_steps = _rows(store), _step_times(store, "a2a")
    (root / "packs" / "job=a2a" / "current").unlink()  # now read from the partitions
    assert packs.current_pack(root, "a2a") is None
    assert len(store_files(store)["events"]) == 4
    assert _rows(store) == packed
    assert _step_times(store, "a2a") == packed_steps


def test_a_stale_pack_is_never_read_and_the_next_ingest_rebuilds_it(
        tmp_path: Path, few_ranks: None) -> None:
    store = tmp_path / "store"
    ingest([NETLAB / "a2a_1gbit"], Options(store, job="a2a"))
    root = store.resolve()
    first = packs.current_pack(root, "a2a")
    # another trace replaces rank 1 (as --force would): the pack no longer matches
    other = sorted((NETLAB / "a2a_500mbit").glob("*.json.gz"))[1]
    res = ingest([other], Options(store, job="a2a", rank=1, force=True))
    assert res[0].status == "ingested"
    second = packs.current_pack(root, "a2a")
    assert second is not None and second != first  # rebuilt at the end of that ingest
    assert first.exists()  # the one it replaced stays for queries under way
    con = tracetool.connect(store)
    names = {r[0] for r in con.execute("SELECT DISTINCT file_name FROM trace_files "
                                       "WHERE rank = 1").fetchall()}
    assert names == {other.name}
    # a partition put in place behind the pack's back (its directory is new): not read
    part = root / "data" / "job=a2a" / "rank=2"
    shutil.copytree(part, tmp_path / "copy")
    shutil.rmtree(part)
    (tmp_path / "copy").rename(part)
    assert packs.current_pack(root, "a2a") is None
    assert len(store_files(store)["events"]) == 4


def test_a_build_that_died_leaves_nothing_read_and_is_cleaned_up(
        tmp_path: Path, few_ranks: None) -> None:
    store = tmp_path / "store"
    ingest([NETLAB / "a2a_1gbit"], Options(store, job="a2a"))
    root = store.resolve()
    d = root / "packs" / "job=a2a"
    dead = d / "deadhost-4194399-1-0123456789abcdef"  # another host's tag: kept
    ours_dead = d / f"{_dead_local_tag()}-0123456789abcdef"
    for g in (dead, ours_dead):
        (g).mkdir()
        (g / "events.parquet").write_bytes(b"half")
    (d / ".current-0123").write_text("nothing\n")
    (d / "current").unlink()
    assert build.refresh_pack(Store(store), "a2a")[0] == "built"
    assert not ours_dead.exists() and not (d / ".current-0123").exists()
    assert dead.exists()
    assert packs.current_pack(root, "a2a") is not None


def test_small_jobs_are_not_packed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest([NETLAB / "a2a_1gbit"], Options(store, job="a2a"))  # 4 ranks < PACK_MIN_RANKS
    assert not (store / "packs").exists()
    assert len(store_files(store)["events"]) == 4


def _dead_local_tag() -> str:
    """An owner tag of this host whose process cannot exist (beyond pid_max)."""
    host = owner_tag().split("-")[0]
    return f"{host}-{2**22 + 12345}-1"


def test_a_few_changed_ranks_leave_the_pack_stale_and_say_so_until_tracetool_pack(
        tmp_path: Path, few_ranks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank of four replaced, with rebuilds only at half the ranks: the ingest leaves
    the pack (stale, so unread) and says so; `tracetool pack` rebuilds it."""
    from click.testing import CliRunner

    from tracetool.cli import cli

    monkeypatch.setattr(build, "REBUILD_SHARE", 0.5)
    store = tmp_path / "store"
    ingest([NETLAB / "a2a_1gbit"], Options(store, job="a2a"))
    root = store.resolve()
    first = packs.current_pack(root, "a2a")
    other = sorted((NETLAB / "a2a_500mbit").glob("*.json.gz"))[1]
    notes: list[str] = []
    ingest([other], Options(store, job="a2a", rank=1, force=True), on_note=notes.append)
    assert packs.current_pack(root, "a2a") is None and first.exists()
    assert len(notes) == 1 and "predates 1 of its 4 ranks" in notes[0]
    assert "tracetool pack" in notes[0]
    assert len(store_files(store)["events"]) == 4  # the partitions, not the stale pack
    res = CliRunner().invoke(cli, ["pack", str(store), "--job", "a2a"])
    assert res.exit_code == 0 and res.output.strip() == "job a2a: packed (4 ranks)"
    assert packs.current_pack(root, "a2a") is not None
    res = CliRunner().invoke(cli, ["pack", str(store), "--job", "nope"])
    assert res.exit_code == 1 and "no job 'nope' (the store holds a2a)" in res.output


def test_tables_copied_at_once_hold_the_partitions_rows_in_rank_order(
        tmp_path: Path, few_ranks: None) -> None:
    """Two copies at a time (threads=2, the ingest's default here): each pack file is its
    table's partition files read in rank order, row for row, and the build leaves only the
    tables' files (no spill directory) in the generation."""
    import duckdb

    store = tmp_path / "store"
    ingest([NETLAB / "w4_1gbit"], Options(store, job="w4", workers=2))
    root = store.resolve()
    gen = packs.current_pack(root, "w4")
    assert gen is not None
    assert {p.name for p in gen.iterdir()} - {packs.SOURCES} == {
        f"{t.name}.parquet" for t in TABLES if (gen / f"{t.name}.parquet").exists()}
    con = duckdb.connect()
    job_dir = root / "data" / "job=w4"
    for t in ("events", "rank_edges", "collectives", "trace_files"):
        parts = [f for r in sorted(packs.partition_ids(job_dir))
                 for f in sorted((job_dir / f"rank={r}" / t).glob("*.parquet"))]
        listed = ", ".join(f"'{f}'" for f in parts)
        want = con.execute(f"SELECT * EXCLUDE (job, rank) FROM read_parquet([{listed}], "
                           "hive_partitioning = true)").fetchall()
        got = con.execute(f"SELECT * EXCLUDE (job, rank) FROM read_parquet('{gen / t}.parquet')"
                          ).fetchall()
        assert got == want and len(got) > 0, t


def test_a_failed_copy_fails_the_build_and_leaves_no_generation(
        tmp_path: Path, few_ranks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    ingest([NETLAB / "w4_1gbit"], Options(store, job="w4", workers=2))
    root = store.resolve()
    (root / "packs" / "job=w4" / "current").unlink()  # no pack: the next refresh builds one
    before = sorted(p.name for p in (root / "packs" / "job=w4").iterdir())
    real = build.path_list

    def broken(files: list[Path]) -> str:  # the gpu_ops copy reads a file that is not there
        return real([*files, tmp_path / "gone.parquet"]) if "gpu_ops" in str(files[0]) \
            else real(files)

    monkeypatch.setattr(build, "path_list", broken)
    with pytest.raises(Exception, match="gone.parquet"):
        build.refresh_pack(Store(store), "w4", threads=2)
    assert sorted(p.name for p in (root / "packs" / "job=w4").iterdir()) == before
