"""The critical path's summaries and chart, aggregated in DuckDB (issue 11), against plain
Python over the same segments: ``tracetool critical-path``'s per-step summary, the report's
``summarize_path``, and the chart's per-pixel bars (``critical_path_bars``)."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import duckdb
import numpy as np
import pytest

from tracetool.analysis.connect import connect
from tracetool.analysis.critical_path import SEGMENT_KINDS, critical_path
from tracetool.analysis.report import chart_critical_path, critical_path_bars, summarize_path
from tracetool.cli.critical_path import summarize
from tracetool.ingest.pipeline import Options, ingest

from ._util import SAMPLES

COLUMNS = ("job", "step", "seq", "rank", "kind", "start_ns", "end_ns", "dur_ns")


def python_step_summary(job: str, segs: list[dict]) -> dict:
    """The per-step summary as the CLI computed it before it moved into SQL: one pass over
    the segments in (step, seq) order."""
    steps: dict = {}
    for s in segs:
        st = steps.setdefault(s["step"], {"step": s["step"], "start_ns": s["start_ns"],
                                          "end_ns": s["end_ns"], "segments": 0,
                                          "rank_changes": 0, "by_kind": {}, "by_rank": {},
                                          "_last": s["rank"]})
        st["start_ns"] = min(st["start_ns"], s["start_ns"])
        st["end_ns"] = max(st["end_ns"], s["end_ns"])
        st["segments"] += 1
        st["by_kind"][s["kind"]] = st["by_kind"].get(s["kind"], 0) + s["dur_ns"]
        key = str(s["rank"])
        st["by_rank"][key] = st["by_rank"].get(key, 0) + s["dur_ns"]
        if s["rank"] is not None and st["_last"] is not None and s["rank"] != st["_last"]:
            st["rank_changes"] += 1
        st["_last"] = s["rank"] if s["rank"] is not None else st["_last"]
    out = []
    for st in steps.values():
        st.pop("_last")
        st["dur_ns"] = st["end_ns"] - st["start_ns"]
        out.append(st)
    return {"job": job, "steps": out}


def python_path_summary(segs: list[dict]) -> dict:
    by_kind: dict[str, int] = {}
    for s in segs:
        by_kind[str(s["kind"])] = by_kind.get(str(s["kind"]), 0) + s["end_ns"] - s["start_ns"]
    return {"segments": len(segs),
            "steps": sorted({s["step"] for s in segs if s["step"] is not None}),
            "dur_ns": sum(by_kind.values()),
            "by_kind": [{"kind": k, "dur_ns": v}
                        for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]}


def random_path(n_steps: int, n_segs: int, ranks: list[int | None], seed: int) -> list[dict]:
    """Contiguous segments per step, random ranks (None = idle filler) and kinds, with
    durations from 1 ns to a few ms (many far narrower than a chart pixel)."""
    rng = random.Random(seed)
    segs, t = [], 1_700_000_000_000_000_000
    for step in range(n_steps):
        for seq in range(n_segs):
            d = rng.choice([1, 7, 300, 5_000, 80_000, 2_000_000])
            segs.append({"job": "j", "step": step, "seq": seq, "rank": rng.choice(ranks),
                         "kind": rng.choice(SEGMENT_KINDS), "start_ns": t, "end_ns": t + d,
                         "dur_ns": d})
            t += d
    return segs


def as_relation(con: duckdb.DuckDBPyConnection, segs: list[dict]) -> duckdb.DuckDBPyRelation:
    import pyarrow as pa

    return con.from_arrow(pa.Table.from_pylist(segs))


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("cp_summary") / "store"
    res = ingest([SAMPLES], Options(store=store, workers=2))
    assert all(r.status == "ingested" for r in res), res
    return store


@pytest.fixture(scope="module")
def sample(sample_store: Path) -> duckdb.DuckDBPyConnection:
    return connect(sample_store)


def test_cli_summary_equals_python_on_the_gloo_sample(sample: duckdb.DuckDBPyConnection
                                                      ) -> None:
    job = "ddp_gloo_2rank"
    rel = critical_path(sample, job)
    segs = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    got = summarize(job, rel)
    assert got == python_step_summary(job, segs)
    assert [list(s["by_kind"]) for s in got["steps"]] == [
        list(s["by_kind"]) for s in python_step_summary(job, segs)["steps"]]  # key order too
    assert sum(s["rank_changes"] for s in got["steps"]) > 0  # the path crosses ranks
    assert summarize_path(rel) == python_path_summary(segs)


@pytest.mark.parametrize("ranks", [[0, 1, 2], [3, None, 5], [None]])
def test_summaries_equal_python_on_random_paths(ranks: list[int | None]) -> None:
    con = duckdb.connect()
    segs = random_path(4, 500, ranks, seed=len(ranks))
    rel = as_relation(con, segs)
    want = python_step_summary("j", segs)
    got = summarize("j", rel)
    assert got == want
    assert [list(s["by_rank"]) for s in got["steps"]] == [
        list(s["by_rank"]) for s in want["steps"]]
    assert summarize_path(rel) == python_path_summary(segs)


@pytest.mark.parametrize("ranks", [[0, 1], [0, None, 7]])
def test_chart_bars_keep_every_kind_time_per_lane(ranks: list[int | None],
                                                  tmp_path: Path) -> None:
    """Narrow segments are merged per pixel column, rank and kind: each kind's time on each
    lane is exact, each merged bar lies within two columns of its segments, the bar count is
    bounded by the picture (lanes x columns x kinds, plus the wide segments), and every rank
    and kind present gets its lane and colour."""
    con = duckdb.connect()
    segs = random_path(3, 50_000, ranks, seed=1)
    columns = 1200
    b = critical_path_bars(as_relation(con, segs), columns)
    t0 = min(s["start_ns"] for s in segs)
    span = max(s["end_ns"] for s in segs) - t0
    assert (b["t0_ns"], b["span_ns"]) == (t0, span)
    w = b["column_ns"]
    assert w * columns >= span > w * (columns - 1)
    assert b["ranks"] == sorted(r for r in set(ranks) if r is not None) + (
        [None] if None in ranks else [])
    assert b["kinds"] == sorted({s["kind"] for s in segs})

    want: dict = defaultdict(int)
    cols_of: dict = defaultdict(set)
    for s in segs:
        want[s["rank"], s["kind"]] += s["dur_ns"]
        if s["dur_ns"] < w:
            cols_of[s["rank"], s["kind"]].add((s["start_ns"] - t0) // w)
    got: dict = defaultdict(int)
    for lane, k, d in zip(b["lane"], b["kind"], b["dur_ns"], strict=True):
        got[b["ranks"][lane], b["kinds"][k]] += int(d)
    assert got == want

    merged = b["merged"]
    wide = sum(s["dur_ns"] >= w for s in segs)
    assert int((~merged).sum()) == wide
    assert merged.sum() <= len(b["ranks"]) * len(b["kinds"]) * (columns + 1)
    assert len(b["lane"]) < len(segs) / 5
    for lane, k, s0, d in zip(b["lane"][merged], b["kind"][merged], b["start_ns"][merged],
                              b["dur_ns"][merged], strict=True):
        cols = cols_of[b["ranks"][lane], b["kinds"][k]]
        col = int(s0) // w
        assert any(c <= col < c + 2 for c in cols), (lane, k, s0, d)
        assert int(s0) + int(d) <= span + 2 * w
    assert np.all(b["start_ns"] >= 0)

    out = tmp_path / "cp.png"
    chart_critical_path(as_relation(con, segs), "j", out)
    assert out.stat().st_size > 5_000


def test_sql_and_json_segments_are_the_path(sample_store: Path) -> None:
    """``tracetool sql`` computes the view critical_path when a query names it, and
    ``critical-path --json --segments`` lists the same segments, names included, as the
    Python API's relation."""
    import json

    from click.testing import CliRunner

    from tracetool.cli import cli

    store = sample_store
    want = critical_path(connect(store), "ddp_gloo_2rank").fetchall()
    assert len(want) > 100
    run = CliRunner().invoke
    res = run(cli, ["sql", str(store), "SELECT * FROM critical_path ORDER BY step, seq",
                    "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [tuple(r.values()) for r in rows] == want
    res = run(cli, ["critical-path", str(store), "--json", "--segments"])
    assert res.exit_code == 0, res.output
    steps = json.loads(res.stdout)["steps"]
    got = [("ddp_gloo_2rank", s["step"], *seg.values()) for s in steps for seg in s["path"]]
    assert got == want and all(len(s["path"]) == s["segments"] for s in steps)
    res = run(cli, ["critical-path", str(store), "--segments"])
    assert res.exit_code == 2 and "--segments needs --json" in res.output
