"""Right on traces from the field (issue 26): self time that is never negative, device ops of
accelerators that are not GPUs, and a job that holds one rank of many.

Synthetic traces give exact expectations; the corpus (../shared/traces) gives the real cases:
HTA's MTIA inference trace, the lone rank 0 of a 16-rank A100 job and rank 0 of an 8-rank B200
job (one module-scoped store, ingested once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracetool

from ._util import kineto_text, run, write, x

# --- self time -----------------------------------------------------------------------------

# one thread: c10d::alltoall_base_ [0, 100) us holds aten::_copy_from [10, 30) and the start of
# an hccl:all_to_all annotation [50, 2550) that outlives it (out of spec: Kineto writes such
# annotations); aten::mul [200, 300) starts inside the annotation, so it nests there
OVERLAP = [
    x("c10d::alltoall_base_", 0, 100),
    x("aten::_copy_from", 10, 20),
    x("hccl:all_to_all", 50, 2500, cat="user_annotation"),
    x("aten::mul", 200, 100),
    x("aten::add", 3000, 40),
    x("aten::empty", 3010, 5),
]


def _self_times(events: list[dict]) -> dict[str, int]:
    """Self time of each cpu_op in ns, from the rule written out: dur minus the direct
    children's time inside the op (a child that ends after its parent counts up to the
    parent's end). Nesting by a stack over (ts, longer first), half-open intervals."""
    evs = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    stack: list[dict] = []
    kids: dict[str, list[dict]] = {e["name"]: [] for e in evs}
    for e in evs:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            kids[stack[-1]["name"]].append(e)
        stack.append(e)
    out = {}
    for e in evs:
        if e["cat"] != "cpu_op":
            continue
        end = e["ts"] + e["dur"]
        inside = sum(min(k["ts"] + k["dur"], end) - k["ts"] for k in kids[e["name"]])
        out[e["name"]] = (e["dur"] - inside) * 1000
    return out


@pytest.fixture(scope="module")
def overlap_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("selftime")
    trace = write(d / "overlap.json", kineto_text(OVERLAP, rank=None))
    store = d / "store"
    code, _, err = run("ingest", trace, "--store", store, "--job", "ov", "--rank", "0")
    assert code == 0, err
    return store


def test_a_child_that_outlives_its_parent_is_clipped_to_it(overlap_store: Path) -> None:
    con = tracetool.connect(overlap_store)
    got = dict(con.sql("SELECT name, self_ns FROM cpu_ops").fetchall())
    want = _self_times(OVERLAP)
    assert want == {"c10d::alltoall_base_": 30_000, "aten::_copy_from": 20_000,
                    "aten::mul": 100_000, "aten::add": 35_000, "aten::empty": 5_000}
    assert got == want
    # the flag the clipping follows: only the annotation overlaps its parent
    assert con.sql("SELECT name FROM events WHERE overlaps_parent").fetchall() == [
        ("hccl:all_to_all",)]


def test_cpu_op_shares_never_exceed_100_percent(overlap_store: Path, tmp_path: Path) -> None:
    code, out, err = run("report", overlap_store, "--out", tmp_path / "r", "--json")
    assert code == 0, err
    rows = json.loads(out)["top"]["rows"]
    want = _self_times(OVERLAP)
    total = sum(want.values())
    assert {r["name"]: r["self_ns"] for r in rows} == want
    assert {r["name"]: round(r["share"], 12) for r in rows} == {
        n: round(v / total, 12) for n, v in want.items()}
    assert all(0 <= r["share"] <= 1 for r in rows)
