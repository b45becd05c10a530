"""Expert-parallel all-to-alls (issue 28 deliverable 2): split sizes ingested from the trace,
per-pair bytes priced by the busiest link (replay/alltoall.py), and ``--expert-skew``. On the
rig's MoE traces (sample_traces/netlab a2a_*, skew1_*, skew2_*), checked against their raw
JSON, and on a synthetic matrix with known answers."""

from __future__ import annotations

import gzip
import json

import duckdb
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import REPO

NETLAB = REPO / "sample_traces" / "netlab"
SETTINGS = json.loads((NETLAB / "measured.json").read_text())["settings"]
JOBS = ("a2a_1gbit", "skew1_1gbit", "skew2_200mbit")


def raw_calls(setting: str, rank: int) -> list[dict]:
    """The rank's c10d::alltoall_base_ ops in time order, from the raw trace."""
    path = NETLAB / SETTINGS[setting]["dir"] / f"rank{rank}.pt.trace.json.gz"
    with gzip.open(path, "rt") as f:
        evs = json.load(f)["traceEvents"]
    return sorted((e for e in evs if e.get("name") == "c10d::alltoall_base_"),
                  key=lambda e: e["ts"])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    path = tmp_path_factory.mktemp("expert_skew") / "store"
    for name in JOBS:
        ingest([NETLAB / SETTINGS[name]["dir"]], Options(store=path, job=name))
    return tracetool.connect(path)


@pytest.mark.parametrize("setting", JOBS)
def test_split_sizes_and_sizes_are_ingested_from_the_c10d_op(
        store: duckdb.DuckDBPyConnection, setting: str) -> None:
    for rank in range(4):
        raw = raw_calls(setting, rank)
        got = store.execute(
            "SELECT in_split_sizes, out_split_sizes, in_bytes, out_bytes FROM collectives "
            "WHERE job = ? AND rank = ? AND collective = 'alltoall_base' ORDER BY cpu_ts_ns",
            [setting, rank]).fetchall()
        assert len(got) == len(raw) == 24  # 4 per step, 6 steps
        for (ins, outs, in_b, out_b), e in zip(got, raw, strict=True):
            ci, dims = e["args"]["Concrete Inputs"], e["args"]["Input Dims"]
            assert (ins, outs) == (ci[4], ci[3])  # input splits [4], output splits [3]
            assert in_b == dims[1][0] * dims[1][1] * 4  # float32: what this rank sends
            assert out_b == dims[0][0] * dims[0][1] * 4  # what it receives
            if setting.startswith("a2a"):
                assert ins == outs == "[]"  # equal splits
            else:
                assert sum(json.loads(ins)) * 256 * 4 == in_b
