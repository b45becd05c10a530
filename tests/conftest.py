"""Shared fixtures: the real trace corpus, and running ``tracetool ingest`` in-process."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tracetool.cli import cli

REPO_ROOT = Path(__file__).resolve().parents[1]
# The shared, read-only corpus of real traces: the repo root's sibling ../shared/traces.
TRACES_DIR = REPO_ROOT.parent / "shared" / "traces"
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
