"""Small helpers for the tests: write minimal trace files, run the CLI, read the store."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
from click.testing import CliRunner

from tracetool.cli import cli
from tracetool.store_views import connect_store

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLES = REPO / "sample_traces" / "ddp_gloo_2rank"


def kineto_text(events: list[dict], *, rank: int | None = 0, base: int | None = None,
                extra_after: str = "") -> str:
    """An object-form trace; events are dicts (json-encoded) or raw JSON strings."""
    head = {"schemaVersion": 1, "deviceProperties": []}
    if rank is not None:
        head["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    if base is not None:
        head["baseTimeNanoseconds"] = base
    evs = ",\n".join(e if isinstance(e, str) else json.dumps(e) for e in events)
    body = json.dumps(head)[:-1]
    return f'{body}, "traceEvents": [\n{evs}\n]{extra_after}, "traceName": "x.json"}}\n'


def write(path: Path, text: str | bytes, gz: bool = False) -> Path:
    data = text.encode() if isinstance(text, str) else text
    if gz:
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def run(*args: str | Path) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    r = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def con(store: Path) -> duckdb.DuckDBPyConnection:
    return connect_store(store)


def x(name: str, ts: float | str, dur: float | str, *, cat: str = "cpu_op", pid: int | str = 1,
      tid: int | str = 1, **args: object) -> dict:
    e: dict = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e
