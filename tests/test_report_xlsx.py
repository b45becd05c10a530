"""``tracetool report --xlsx`` (analysis/workbook.py): every sheet's rows are the summary's
records (what --json prints) with times in ms, the job steps are the job_steps view's, and
names from the trace stay text (no formula, control characters escaped)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import openpyxl

import tracetool
from tracetool.analysis.workbook import SHEETS, header

from ._util import SAMPLES, kineto_text, run, write, x


def _sheet_rows(ws) -> tuple[list, list[list]]:
    rows = [[c.value for c in r] for r in ws.iter_rows()]
    return rows[0], rows[1:]


def _expect(key: str, v: object) -> object:
    """A summary value as its cell: ns as ms, a list as its items joined."""
    if key.endswith("_ns") and isinstance(v, int | float):
        return v / 1e6
    return ", ".join(map(str, v)) if isinstance(v, list) else v


def _same(got: list, want: list) -> bool:
    """Equal row by row, floats to Excel's 15 significant digits."""
    return len(got) == len(want) and all(
        len(g) == len(w) and all(
            math.isclose(a, b, rel_tol=1e-14) if isinstance(b, float) else a == b
            for a, b in zip(g, w, strict=True)) for g, w in zip(got, want, strict=True))


def test_sheets_are_the_summary_in_ms_and_match_the_views(tmp_path: Path) -> None:
    store, out = tmp_path / "s", tmp_path / "rep"
    code, _, err = run("ingest", *sorted(SAMPLES.glob("*.json.gz")), "--store", store)
    assert code == 0, err
    code, stdout, err = run("report", store, "--out", out, "--xlsx", "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["files"]["xlsx"] == str(out / "report.xlsx")
    wb = openpyxl.load_workbook(out / "report.xlsx")
    want_names = ["job"]
    for path, name in SHEETS.items():
        node = summary
        for k in path:
            node = node.get(k) if isinstance(node, dict) else None
        if not node:
            continue
        want_names.append(name)
        heads, rows = _sheet_rows(wb[name])
        keys = list(node[0])
        assert heads == [header(k)[0] for k in keys]
        assert _same(rows, [[_expect(k, r[k]) for k in keys] for r in node]), name
    assert wb.sheetnames == want_names
    assert {"job steps", "steps per rank", "step breakdown", "top", "collectives by type",
            "collectives by rank"} <= set(wb.sheetnames)
    # the job steps sheet is the view, in ms
    view = tracetool.connect(store).execute(
        "SELECT step, n_ranks, dur_ns / 1e6, round(mean_rank_dur_ns) / 1e6, complete "
        "FROM job_steps "
        "WHERE complete ORDER BY step").fetchall()
    assert _same(_sheet_rows(wb["job steps"])[1], view) and len(view) == 3
    facts = dict(_sheet_rows(wb["job"])[1])
    assert facts["job"] == summary["job"] and facts["ranks"] == "0, 1"


def test_names_from_the_trace_stay_text(tmp_path: Path) -> None:
    """A CPU-only job whose top ops are named like a formula and with an escape character."""
    evil, ctrl = '=HYPERLINK("http://example.invalid","x")', "op\x1bname"
    ev = [x("ProfilerStep#1", 0, 1000, cat="user_annotation"), x(evil, 10, 500),
          x(ctrl, 600, 300), x("ProfilerStep#2", 1000, 1000, cat="user_annotation"),
          x(evil, 1010, 500), x(ctrl, 1600, 300)]
    path = write(tmp_path / "t.json", kineto_text(ev))
    code, _, err = run("ingest", path, "--store", tmp_path / "s")
    assert code == 0, err
    code, _, err = run("report", tmp_path / "s", "--out", tmp_path / "rep", "--xlsx")
    assert code == 0, err
    ws = openpyxl.load_workbook(tmp_path / "rep" / "report.xlsx")["top"]
    names = {r[0].value: r[0].data_type for r in ws.iter_rows(min_row=2)}
    assert names[evil] == "s" and names["op\\x1bname"] == "s"
