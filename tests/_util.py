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
SAMPLES = REPO / "sample_traces" / "ddp_gloo_2rank"

# The shared, read-only corpus of real traces (the repo root's sibling ../shared/traces) and
# the corpus paths several test modules read: one home each (relative forms: ``corpus_rel``).
SHARED_TRACES = REPO.parent / "shared" / "traces"
HTA_DATA = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data"
HTA_CP = HTA_DATA / "critical_path"
TRACELENS = SHARED_TRACES / "AMD-AGI__TraceLens/tests/traces"
# 8 ranks of DLRM on V100s (2023): the corpus's one multi-rank GPU job with collectives
DLRM = SHARED_TRACES / "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
# the 2021 BERT pair (DDP over NCCL, fp16), 2 ranks
BERT_DDP = SHARED_TRACES / "gaoteng-git__kineto/tb_plugin/test/data/tracing/bert_newAPI_fp16_ddp"
B200 = TRACELENS / "b200/eager_trace.json.gz"


def corpus_rel(path: Path) -> str:
    """A corpus path relative to SHARED_TRACES, as the tests that name files by it write it."""
    return path.relative_to(SHARED_TRACES).as_posix()


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


def independent_steps(steps: dict[int, tuple[int, int]], launched: dict[int, list[tuple]],
                      gpu_marks: dict[int, tuple[int, object]], gpu: list[tuple]
                      ) -> dict[int, tuple[int, int]]:
    """docs/steps.md's tiling of one rank, written out from its rules (not from the SQL):
    per step number its CPU annotation (start, end), the GPU ops it launched and its GPU
    annotation (start, pid) if any; GPU ops are tuples (start, end, ..., pid at [4]).
    Returns step -> (start, end)."""
    order = sorted(steps)
    first_gpu = {}
    for n in order:
        if n in gpu_marks:  # the first GPU op at or after the GPU annotation, same device
            t, pid = gpu_marks[n]
            after = [g[0] for g in gpu if g[4] == pid and g[0] >= t]
            if after:
                first_gpu[n] = min(after)
                continue
        if launched[n]:
            first_gpu[n] = min(g[0] for g in launched[n])
    gpu_end = {n: max(g[1] for g in launched[n]) for n in order if launched[n]}
    lags = any(gpu_end.get(a, -1) > steps[b][0] for a, b in zip(order, order[1:], strict=False))
    out, prev = {}, None
    for i, n in enumerate(order):
        cs = steps[n][0]
        s = first_gpu.get(n, cs) if lags else cs  # the first step too: one side per rank
        if i > 0:
            s = max(s, prev)
        out[n], prev = s, s
    windows = {}
    for a, b in zip(order, order[1:], strict=False):
        windows[a] = (out[a], out[b])
    last = order[-1]
    windows[last] = (out[last], max(out[last], steps[last][1], gpu_end.get(last, out[last])))
    return windows
