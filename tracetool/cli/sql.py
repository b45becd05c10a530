"""``tracetool sql``: run SQL over a trace store with every analysis view defined."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import duckdb

from tracetool.analysis.connect import connect, setup_sql
from tracetool.text import printable

FORMATS = ("table", "csv", "json", "parquet")


@click.command("sql")
@click.argument("store", type=click.Path(path_type=Path, file_okay=False))
@click.argument("query", required=False)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format (parquet needs --output).")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the result to this file instead of stdout.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--print-setup", is_flag=True,
              help="Print the SQL that defines every view over STORE (for the DuckDB CLI).")
def sql_command(store: Path, query: str | None, fmt: str, output: Path | None, as_json: bool,
                print_setup: bool) -> None:
    """Run QUERY over STORE, where the store's tables (events, gpu_ops, steps, ...) and the
    analysis views (step_breakdown, kernel_summary, collective_instances, ...) are defined.

    Exit code 0 on success, 1 when the query fails (one line on stderr)."""
    if print_setup:
        click.echo(setup_sql(store))
        return
    if not query:
        raise click.UsageError("give a QUERY, or --print-setup")
    fmt = "json" if as_json else fmt
    if fmt == "parquet" and output is None:
        raise click.UsageError("--format parquet needs --output FILE")
    try:
        con = connect(store)
        rel = con.sql(query)
        if rel is None:  # a statement without a result (CREATE, SET, ...)
            return
        if fmt == "parquet":
            rel.write_parquet(str(output))
            return
        text = _render(rel, fmt)
    except (duckdb.Error, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        click.echo(f"tracetool: error: {first}", err=True)
        sys.exit(1)
    if output is not None:
        output.write_text(text)
    else:
        click.echo(text, nl=not text.endswith("\n"))


def _render(rel: duckdb.DuckDBPyRelation, fmt: str) -> str:
    cols = rel.columns
    rows = rel.fetchall()
    if fmt == "json":
        return "".join(json.dumps(dict(zip(cols, r, strict=True)), default=_jsonable) + "\n"
                       for r in rows)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        w.writerows(rows)
        return buf.getvalue()
    return _table(cols, rows)


def _jsonable(v: object) -> object:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _table(cols: list[str], rows: list[tuple]) -> str:
    """A plain aligned text table (all rows, no truncation: this is for shells and logs);
    control characters shown as escapes (tracetool.text.printable)."""
    cols = [printable(c) for c in cols]
    cells = [[("NULL" if v is None else printable(str(v))) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    for r in cells:
        out.append("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w)
                             for v, w in zip(r, widths, strict=True)).rstrip())
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def _numeric(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False
