"""Shared fixtures: the real trace corpus, running ``tracetool ingest`` in-process, and the
stores built once per session and shared by every test (and both xdist workers) that reads
them (``shared_store``)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tracetool.cli import cli

from ._util import BERT_DDP, DLRM, REPO, SAMPLES, SHARED_TRACES

REPO_ROOT = REPO
TRACES_DIR = SHARED_TRACES  # the shared, read-only corpus of real traces (tests/_util.py)
# PyTorch execution traces (not Kineto); ingest must report them as skipped.
ET_NAME = re.compile(r"_et\.json(\.gz)?$")


def corpus_files() -> list[Path]:
    """Every trace file of the corpus (.json / .json.gz), sorted; [] when it is absent."""
    if not TRACES_DIR.is_dir():
        return []
    return sorted(p for p in TRACES_DIR.rglob("*")
                  if p.is_file() and p.name.endswith((".json", ".json.gz")))


def rel(path: Path) -> str:
    return path.relative_to(TRACES_DIR).as_posix()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``kineto_file`` / ``et_file`` arguments: one test per corpus file (ids = relative path)."""
    files = corpus_files()
    if "kineto_file" in metafunc.fixturenames:
        kin = [rel(f) for f in files if not ET_NAME.search(f.name)]
        metafunc.parametrize("kineto_file", kin, ids=kin)
    if "et_file" in metafunc.fixturenames:
        et = [rel(f) for f in files if ET_NAME.search(f.name)]
        metafunc.parametrize("et_file", et, ids=et)


@dataclass
class IngestRun:
    """One ``tracetool ingest --json`` invocation: exit code, per-file results, output."""

    exit_code: int
    results: list[dict] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""


def run_ingest(paths: list[Path], store: Path, *options: str) -> IngestRun:
    """Run the real CLI through click's CliRunner with ``--json`` (one JSON line per file)."""
    args = ["ingest", *map(str, paths), "--store", str(store), "--json", *options]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    results = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return IngestRun(res.exit_code, results, res.stdout, res.stderr)


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES_DIR.is_dir():
        pytest.skip(f"real trace corpus not found at {TRACES_DIR}")
    return TRACES_DIR


@pytest.fixture(scope="session")
def duck():
    con = duckdb.connect()
    yield con
    con.close()


@pytest.fixture(scope="session")
def ingest_cli():
    """``run_ingest(paths, store, *options) -> IngestRun``."""
    return run_ingest


# --------------------------------------------------------------------------- shared stores


@dataclass(frozen=True)
class StoreJob:
    """One ``ingest`` into a shared store: these paths as one job."""

    paths: tuple[Path, ...]
    job: str
    corpus: bool = True  # from ../shared/traces: the store is skipped without the corpus


# Stores several modules read, each built once per session: name -> its jobs, in ingest order.
# A test that changes a store (ingest, pack, force) copies it first (``copy_store``).
SHARED_STORES: dict[str, tuple[StoreJob, ...]] = {
    "gloo": (StoreJob((SAMPLES,), "gloo", corpus=False),),
    "dlrm": (StoreJob((DLRM,), "dlrm"),),
    "gloo_dlrm": (StoreJob((SAMPLES,), "gloo", corpus=False), StoreJob((DLRM,), "dlrm")),
    "bert_ddp": (StoreJob((BERT_DDP,), "bert"),),
}


def _shared_root(factory: pytest.TempPathFactory) -> Path:
    """A directory every process of this session sees: under xdist the workers' base temps'
    parent (one per session), else the session's base temp."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _fingerprint(store: Path) -> list[tuple[str, int, int]]:
    """Every file of a store with its size and modification time: what a read leaves alone."""
    return sorted((p.relative_to(store).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in store.rglob("*") if p.is_file() and p.name != ".lock")


def _build_shared(root: Path, name: str) -> Path:
    """The store ``name`` under ``root``, built by the first process to ask (the others wait
    on its lock): built in a work directory and renamed into place, so a store that exists
    is complete."""
    from tracetool.ingest.pipeline import Options, ingest

    final = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not final.is_dir():
            work = root / f"shared-{name}.building-{os.getpid()}"
            shutil.rmtree(work, ignore_errors=True)
            for j in SHARED_STORES[name]:
                res = ingest(list(j.paths), Options(store=work / "store", job=j.job, workers=2))
                assert res and all(r.status == "ingested" for r in res), (name, j.job, res)
            (work / "store").rename(final)
            work.rmdir()
    return final


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """``shared_store(name) -> Path``: the store ``SHARED_STORES[name]``, built once per
    session for every process; the test is skipped without the corpus it needs. Read-only:
    at the end of the session every file must be as it was built (a test that wrote into it
    fails the session's teardown, naming the store)."""
    root = _shared_root(tmp_path_factory)
    seen: dict[str, list] = {}

    def get(name: str) -> Path:
        if any(j.corpus for j in SHARED_STORES[name]) and not SHARED_TRACES.is_dir():
            pytest.skip(f"real trace corpus not found at {SHARED_TRACES}")
        path = _build_shared(root, name)
        seen.setdefault(name, _fingerprint(path))
        return path

    yield get
    changed = [n for n, fp in seen.items() if _fingerprint(root / f"shared-{n}") != fp]
    assert not changed, f"tests wrote into the shared stores {changed}: use copy_store"


def copy_store(store: Path, dest: Path) -> Path:
    """A private copy of a (shared) store, for a test that changes it."""
    shutil.copytree(store, dest, ignore=shutil.ignore_patterns(".lock"))
    return dest


@pytest.fixture(scope="session")
def dlrm_store(shared_store: Callable[[str], Path]) -> Path:
    """The 8-rank DLRM job of the corpus as job ``dlrm``, alone in its store (read-only)."""
    return shared_store("dlrm")


# --------------------------------------------------------------------------- scheduling

# The slowest files, slowest first (per-file totals of a full run's junit XML, main at
# 215343d, 2026-12-03: test_s3 8% of the suite, then test_door, test_steps, ...): run first,
# so that under ``-n 2 --dist loadfile`` (a file's tests on one worker) no long file starts
# last and sets the end while the other worker idles. scripts/test.sh passes
# --no-loadscope-reorder, else xdist orders files by their number of tests (the one-test
# fuzz file, 3% of the suite, went last).
SLOW_FIRST = ("test_s3.py", "test_door.py", "test_steps.py", "test_report_diff.py",
              "test_store_safety.py", "test_ray.py", "test_replay_bounds.py",
              "test_store_paths.py", "test_real_traces.py", "test_pipeline.py",
              "test_analysis.py", "test_packs.py", "test_whatif_inputs.py",
              "test_fuzz_ingest.py", "test_replay.py", "test_shard.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The SLOW_FIRST files' tests first, in that order; the rest keep theirs (stable)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))


@pytest.fixture
def no_host_bound():
    """gloo's host rate (replay/transport.GLOO_HOST_RATE) out of the way, for a test that
    checks the link's pricing alone (an infinite link would otherwise leave the host's CPU
    pacing the bytes; tests/test_host_bound.py checks that term)."""
    from tracetool.replay import transport

    with transport.host_rate(float("inf")):
        yield


@pytest.fixture(scope="module")
def link_pricing_only():
    """``no_host_bound`` for a whole module whose synthetic traces are laid out with the
    link's price (their module fixtures and tests alike): ``pytestmark =
    pytest.mark.usefixtures("link_pricing_only")``."""
    from tracetool.replay import transport

    with transport.host_rate(float("inf")):
        yield
