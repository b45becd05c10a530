"""Rough edges a new user hits (issue 15, "Rough edges seen"), each fixed and kept fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracetool
from tracetool.analysis.critical_path import critical_path_summary
from tracetool.ingest.pipeline import Options, ingest

from ._util import SAMPLES, SHARED_TRACES, run

DLRM = SHARED_TRACES / "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
BERT_DDP = SHARED_TRACES / "gaoteng-git__kineto/tb_plugin/test/data/tracing/bert_newAPI_fp16_ddp"


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("rough") / "store"
    assert all(r.status == "ingested" for r in ingest([SAMPLES], Options(store, job="gloo")))
    return store


def test_sql_keeps_duckdbs_did_you_mean(gloo: Path) -> None:
    code, out, err = run("sql", gloo, "SELECT * FROM step_breakdwn")
    assert code == 1 and out == ""
    assert err == ("tracetool: error: Catalog Error: Table with name step_breakdwn does not "
                   'exist! Did you mean "step_breakdown"?\n')


def test_chrome_trace_into_a_directory_not_made_yet(gloo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "deeper" / "path.json"
    code, stdout, err = run("critical-path", gloo, "--chrome-trace", out)
    assert code == 0, err
    events = json.loads(out.read_text())["traceEvents"]
    assert len(events) > 10 and f"wrote {out}" in stdout


def test_a_typo_in_the_job_names_the_jobs(gloo: Path) -> None:
    con = tracetool.connect(gloo)
    with pytest.raises(ValueError, match=r"^no job 'glo' in the store \(it holds 'gloo'\)$"):
        critical_path_summary(con, "glo")
    assert critical_path_summary(con, "gloo").fetchall()  # the connection is still usable


@pytest.mark.skipif(not DLRM.is_dir(), reason=f"corpus not found: {DLRM}")
def test_ns_columns_are_bigint_in_polars(tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest([DLRM], Options(store, job="dlrm"))
    con = tracetool.connect(store)
    frame = con.sql("SELECT * FROM kernel_summary WHERE job = 'dlrm'").pl()
    assert str(frame.schema["total_ns"]) == "Int64"
    assert str(con.sql("SELECT self_ns, total_ns FROM op_summary").pl().schema["self_ns"]) \
        == "Int64"
    # the totals are the kernels' own durations, summed independently
    want = {}
    for f in sorted(DLRM.glob("*.json")):
        rank = json.loads(f.read_text())["distributedInfo"]["rank"]
        for e in json.loads(f.read_text())["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "kernel":
                k = (rank, e["name"])
                want[k] = want.get(k, 0) + round(float(e["dur"]) * 1000)
    got = {(r, n): t for r, n, t in zip(frame["rank"], frame["name"], frame["total_ns"],
                                         strict=True)}
    assert got == want


@pytest.mark.skipif(not BERT_DDP.is_dir(), reason=f"corpus not found: {BERT_DDP}")
def test_unknown_collective_sizes_show_as_unknown(tmp_path: Path) -> None:
    """The 2021 BERT DDP pair records no message sizes: the report says unknown, not 0.0."""
    store = tmp_path / "store"
    ingest([BERT_DDP], Options(store, job="bert"))
    code, stdout, err = run("report", store, "--out", tmp_path / "report", "--json")
    assert code == 0, err
    by_type = json.loads(stdout)["collectives"]["by_type"]
    assert by_type and all(t["bytes"] is None and t["sized_instances"] == 0 for t in by_type)
    md = (tmp_path / "report" / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "allreduce" in line]
    assert rows and all("| unknown |" in line for line in rows) and "| 0.0 |" not in md
