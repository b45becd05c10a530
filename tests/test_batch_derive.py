"""Small files derived together (``build.build_files``, issue 14: ingest of 1,024 rank files).

A small file's derivation is ~45 DuckDB statements whose planning outweighs their execution,
so the ingest derives batches of small files in one pass, every query keyed by the file. The
batch must not change a single stored value: files of every era and backend, built in one
batch, give exactly the tables each gives built alone; a file that fails, fails alone; and an
ingest through the pool writes the same store batched or not."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracetool.ingest import derive as derive_mod
from tracetool.ingest.build import build_files
from tracetool.ingest.options import Options
from tracetool.ingest.pipeline import batches, ingest
from tracetool.schema import COLLECTIVES, TABLES

from ._util import REPO, SHARED_TRACES, kineto_text, write, x
from .test_shard import DLRM, tables

HTA = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data"
# one file of each kind the derivation treats differently: gloo (c10d ops and gloo spans,
# all_to_all), NCCL with record_param_comms (2023), 2021 NCCL kernels without CPU records,
# CUDA event and stream syncs, B/E pairs, GPU step annotations, 64-bit ids, AMD, Triton
CORPUS = [
    REPO / "sample_traces/ddp_gloo_2rank/rank0.pt.trace.json.gz",
    REPO / "sample_traces/netlab/a2a_1gbit/rank1.pt.trace.json.gz",
    DLRM / "worker3_step_12.1694128201557.pt.trace.json",
    SHARED_TRACES / "gaoteng-git__kineto/tb_plugin/test/data/tracing/bert_newAPI_fp16_ddp/"
    "worker1_round1.pt.trace.json.gz",
    HTA / "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    HTA / "call_stack/backward_thread.json",
    HTA / "with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    HTA / "large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    HTA / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    HTA / "triton_example/triton_example.json.gz",
]
needs_corpus = pytest.mark.skipif(not all(p.is_file() for p in CORPUS),
                                  reason=f"corpus not found under {SHARED_TRACES}")
OPTS = Options(store=Path("unused"), job="j", single_file=True)


def _built_rows(built: str) -> dict[str, list[tuple]]:
    """Every table of a built partition, rows sorted, minus when it was ingested."""
    con = duckdb.connect()
    out = {}
    for t in TABLES:
        cols = ", ".join(c.name for c in t.columns if c.name != "ingested_at")
        files = [str(p) for p in sorted((Path(built) / t.name).glob("*.parquet"))]
        out[t.name] = con.execute(f"SELECT {cols} FROM read_parquet({files}) ORDER BY ALL"
                                  ).fetchall()
    return out


def _begin_end_trace(tmp_path: Path) -> Path:
    """B/E pairs on two threads, an E with no B (quarantined), and a flow."""
    evs = [{"ph": "B", "name": "outer", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10},
           {"ph": "B", "name": "inner", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 12},
           {"ph": "E", "pid": 1, "tid": 1, "ts": 15}, {"ph": "E", "pid": 1, "tid": 1, "ts": 30},
           {"ph": "E", "pid": 1, "tid": 2, "ts": 5}, x("op", 40, 5, tid=2),
           {"ph": "s", "id": 7, "name": "fl", "cat": "ac2g", "pid": 1, "tid": 2, "ts": 41},
           {"ph": "f", "id": 7, "name": "fl", "cat": "ac2g", "pid": 1, "tid": 1, "ts": 50,
            "bp": "e"}, x("late", 49, 3)]
    return write(tmp_path / "begin_end.json", kineto_text(evs))


@needs_corpus
def test_a_batch_stores_what_each_file_stores_alone(tmp_path: Path) -> None:
    empty = write(tmp_path / "empty.json", '{"traceEvents": []}')  # fails before deriving
    cut = write(tmp_path / "cut.json", '{"traceEvents": [{"ph": "X", "name": ')  # salvaged
    files = [*CORPUS[:5], empty, _begin_end_trace(tmp_path), cut, *CORPUS[5:]]
    batch = build_files(files, OPTS, tmp_path / "batch", [])
    assert all(r.timings.get("batch_files") == len(files) - 1 for r in batch
               if r.status == "built")
    for i, (f, b) in enumerate(zip(files, batch, strict=True)):
        alone = build_files([f], OPTS, tmp_path / f"alone{i}", [])[0]
        assert (b.status, b.message, b.events_stored) == \
            (alone.status, alone.message, alone.events_stored), f
        if f is empty:
            assert b.status == "error" and b.message == "no events: traceEvents is empty"
            continue
        assert b.status == "built", (f, b.message)
        got, want = _built_rows(b.built), _built_rows(alone.built)
        assert got == want, (f, [t for t in got if got[t] != want[t]])
    rows = {f.name: _built_rows(b.built) for f, b in zip(files, batch, strict=True)
            if b.status == "built"}
    # the batch held what makes each path run, so the comparison covered them
    assert rows["begin_end.json"]["ingest_issues"][0][2] == "unmatched_end"
    assert [r.events_quarantined for r in batch if r.path == str(cut)] == [1]
    backend = [c.name for c in COLLECTIVES.columns].index("backend")
    assert {r[backend] for r in rows["rank0.pt.trace.json.gz"]["collectives"]} == {"gloo"}
    assert sum(len(r["rank_edges"]) for r in rows.values()) > 50_000


def test_a_failing_batch_is_derived_file_by_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    files = [write(tmp_path / f"rank{r}.json", kineto_text([x("op", 10 + r, 5)], rank=r))
             for r in range(3)]
    real = derive_mod.derive
    calls: list[int] = []

    def derive(con: duckdb.DuckDBPyConnection, members: list, *args: object) -> list:
        calls.append(len(members))
        if len(members) > 1 or members[0].index == 1:
            raise duckdb.OutOfMemoryException("failed to allocate 1.0 GiB")
        return real(con, members, *args)

    monkeypatch.setattr(derive_mod, "derive", derive)
    got = build_files(files, OPTS, tmp_path / "work", [])
    assert calls == [3, 1, 1, 1]
    assert [r.status for r in got] == ["built", "error", "built"]
    assert got[1].message == "derivation stage failed: failed to allocate 1.0 GiB"
    assert [len(_built_rows(got[i].built)["events"]) for i in (0, 2)] == [1, 1]


@pytest.mark.skipif(not DLRM.is_dir(), reason=f"corpus not found: {DLRM}")
def test_the_pool_writes_the_same_store_batched_or_not(tmp_path: Path) -> None:
    stores = {}
    for n in (1, 16):
        store = tmp_path / f"batch{n}"
        res = ingest([DLRM], Options(store=store, job="dlrm", workers=2, batch_files=n))
        assert {r.status for r in res} == {"ingested"}
        assert {r.timings.get("batch_files") for r in res} == ({None} if n == 1 else {2})
        stores[n] = tables(store)
    assert len(stores[1]["rank_edges"]) > 10_000
    for name in stores[1]:
        assert stores[1][name] == stores[16][name], name


def test_batches_keep_order_and_bounds(tmp_path: Path) -> None:
    files = [write(tmp_path / f"f{i}.json", "x" * (900 if i == 5 else 100)) for i in range(40)]
    small = set(files)
    for workers, max_bytes, sizes in [
        (2, 10_000, [10, 10, 10, 10]),  # two batches per worker at least
        (1, 10_000, [16, 16, 8]),  # at most 16 files
        (1, 1000, [5, 2, 10, 10, 10, 3]),  # at most 1000 bytes of JSON: f5 has 900
    ]:
        got = batches(files, small, 16, max_bytes, workers)
        assert [f for b in got for f in b] == files  # consecutive, all of them, once
        assert [len(b) for b in got] == sizes
    # a large file (built alone) ends a batch: commits stay in input order
    got = batches(files, small - {files[3], files[4]}, 16, 10_000, 1)
    assert [len(b) for b in got] == [3, 16, 16, 3]
    assert batches(files, set(), 16, 1000, 2) == []
