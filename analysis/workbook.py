"""The report's tables as an Excel workbook (``tracetool report --xlsx``), for the users who
share a spreadsheet (TraceLens writes one): a sheet per table of the report's summary, the
same records ``report --json`` prints, numbers as numbers with their unit in the header.

Times are converted from the summary's exact ns to ms (``median_ns`` -> ``median (ms)``, a
float: ns / 1e6), so a sheet reads like the report; every other value is written as it is.
Names come from the traced program (hostile text): control characters are written as escapes
(``tracetool.text.printable``; the format cannot hold them) and a name starting with ``=`` is
stored as text, never as a formula.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracetool.outputs import atomic_write
from tracetool.text import printable

# summary key -> sheet name (Excel: at most 31 characters); each value a list of records
SHEETS = {
    ("job_steps",): "job steps",
    ("steps",): "steps per rank",
    ("incomplete_steps",): "incomplete steps",
    ("breakdown",): "step breakdown",
    ("top", "rows"): "top",
    ("collectives", "by_type"): "collectives by type",
    ("collectives", "by_rank"): "collectives by rank",
    ("critical_path", "by_kind"): "critical path by kind",
    ("memory_peaks",): "memory peaks",
    ("cupti_counters",): "cupti counters",
    ("collective_links", "rows"): "collectives by link",
    ("op_efficiency", "rows"): "op efficiency",
}
# a key's unit suffix -> (unit for the header, divisor: ns / 1e6 = ms)
UNITS = {"_ns": ("ms", 1e6), "_bytes": ("bytes", None), "_gbps": ("GB/s", None),
         "_tflops": ("TFLOP/s", None), "_pct": ("%", None)}


def header(key: str) -> tuple[str, float | None]:
    """The column's header and the divisor of its values (None: as they are)."""
    for suffix, (unit, divisor) in UNITS.items():
        if key.endswith(suffix):
            return f"{key[:-len(suffix)]} ({unit})", divisor
    return key, None


def _cell(v: Any, divisor: float | None) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return v if divisor is None else v / divisor
    if isinstance(v, list):
        v = ", ".join(map(str, v))
    return printable(str(v))


def _lookup(summary: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def sheets(summary: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """Sheet name -> (headers, rows): the job's facts first, then every table of the
    summary that has records (an empty table gets no sheet)."""
    facts = [[k, _cell(v, None)] for k, v in summary.items()
             if not isinstance(v, dict | list) or (isinstance(v, list) and
                                                   all(not isinstance(x, dict) for x in v))]
    out: dict[str, tuple[list[str], list[list[Any]]]] = {"job": (["field", "value"], facts)}
    for path, name in SHEETS.items():
        records = _lookup(summary, path)
        if not isinstance(records, list) or not records or not all(
                isinstance(r, dict) for r in records):
            continue
        keys = list(dict.fromkeys(k for r in records for k in r))
        cols = [header(k) for k in keys]
        out[name] = ([h for h, _ in cols],
                     [[_cell(r.get(k), f) for k, (_, f) in zip(keys, cols, strict=True)]
                      for r in records])
    return out


def write_workbook(summary: dict[str, Any], path: Path) -> None:
    """Write ``path`` (atomically): one sheet per table of ``summary``, headers in bold,
    the header row frozen."""
    from openpyxl import Workbook
    from openpyxl.styles import Font

    wb = Workbook()
    wb.remove(wb.active)
    bold = Font(bold=True)
    for name, (headers, rows) in sheets(summary).items():
        ws = wb.create_sheet(name)
        ws.append(headers)
        for c in ws[1]:
            c.font = bold
        for r in rows:
            ws.append(r)
            for c in ws[ws.max_row]:
                if c.data_type == "f":  # a name starting with "=": text, not a formula
                    c.data_type = "s"
        ws.freeze_panes = "A2"
    with atomic_write(path) as f:
        wb.save(f)
