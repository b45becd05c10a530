"""``tracetool sql``: run SQL over a trace store with every analysis view defined.

Queries are read-only: the store is opened by ``tracetool.connect`` (DuckDB reads only the
store's files and writes none, its settings locked), and statements that write files (COPY,
EXPORT) or load extensions are refused up front with the reason; ``--allow-writes DIR``
permits writes under DIR, and ``--output`` is written here, from Python.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click
import duckdb

from tracetool.analysis.connect import connect, setup_sql
from tracetool.cli._errors import fail_line
from tracetool.cli._store import store_arg
from tracetool.errors import InputError, one_line
from tracetool.outputs import OutputError, atomic_write, check_output, write_text
from tracetool.store_views import writable_dirs
from tracetool.text import printable

FORMATS = ("table", "csv", "json", "parquet")
WRITES_HINT = "use --allow-writes DIR to write under DIR, or --output FILE for the result"
# DuckDB's allow-list cannot tell a read from a write, and the store's files are on it: a COPY
# onto one of them is stopped only by DuckDB's temporary file (tmp_<name> is not allowed), so
# the options that skip it (writing in place) or delete the target first are refused.
IN_PLACE = re.compile(r"\b(use_tmp_file|overwrite|overwrite_or_ignore)\b", re.IGNORECASE)
# the critical path is computed, not stored: a query naming it has it computed first
PATH_TABLES = re.compile(r"\bcritical_path(_segments)?\b", re.IGNORECASE)


class Refused(Exception):
    """A statement tracetool sql does not run (the message says why)."""


@click.command("sql")
@click.argument("store", type=store_arg(file_okay=False))
@click.argument("query", required=False)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format (parquet needs --output). On stdout, table and csv show "
                   "control characters in names as escapes (\\n, \\x1b); csv written with "
                   "--output keeps them as they are.")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the result to this file (outside the store) instead of stdout.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--allow-writes", "allow_writes", multiple=True, metavar="DIR",
              type=click.Path(path_type=Path, file_okay=False),
              help="Let the query write files (COPY ... TO, EXPORT) under DIR, which must be "
                   "outside the store; repeatable. Without it queries write no file.")
@click.option("--print-setup", is_flag=True,
              help="Print the SQL that opens STORE read-only and defines every view (for the "
                   "DuckDB CLI).")
def sql_command(store: Path | str, query: str | None, fmt: str, output: Path | None, as_json: bool,
                allow_writes: tuple[Path, ...], print_setup: bool) -> None:
    """Run QUERY over STORE, where the store's tables (events, gpu_ops, steps, ...) and the
    analysis views (step_breakdown, kernel_summary, collective_instances, ...) are defined.

    Queries cannot change the store: they read only its files and write no file unless
    --allow-writes DIR is given (then only under DIR).

    Exit code 0 on success, 1 when the query fails or is refused (one line on stderr)."""
    try:
        writable_dirs(store, allow_writes)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--allow-writes") from None
    if print_setup:
        click.echo(setup_sql(store, allow_writes))
        return
    if not query:
        raise click.UsageError("give a QUERY, or --print-setup")
    fmt = "json" if as_json else fmt
    if fmt == "parquet" and output is None:
        raise click.UsageError("--format parquet needs --output FILE")
    try:
        if output is not None:
            check_output(output, "--output", [store])
    except InputError as err:  # inside a store
        fail_line(one_line(err), code=2)
    except OutputError as err:
        fail_line(one_line(err))
    try:
        check_statements(query, writes_allowed=bool(allow_writes))
        con = connect(store, allow_writes=allow_writes)
        if PATH_TABLES.search(query):
            from tracetool.analysis.critical_path import critical_path_all_jobs

            for line in critical_path_all_jobs(con):
                click.echo(f"tracetool: warning: {line}", err=True)
        rel = con.sql(query)
        if rel is None:  # a statement without a result (CREATE, SET, ...)
            return
        if fmt == "parquet":
            _write_parquet(rel, output)
            return
        text = _render(rel, fmt, escape=output is None)
    except (duckdb.Error, OSError, Refused) as err:
        click.echo(f"tracetool: error: {_explain(err)}", err=True)
        sys.exit(1)
    if output is not None:
        try:
            write_text(output, text)
        except OSError as err:
            fail_line(f"--output: {output}: {err.strerror or one_line(err)}")
    else:
        click.echo(text, nl=not text.endswith("\n"))


def check_statements(query: str, writes_allowed: bool) -> None:
    """Raise Refused, before any of the query runs, for a statement that writes files (COPY,
    EXPORT: unless writes are allowed), installs or loads an extension, or carries a COPY
    (also inside EXPLAIN ANALYZE or PREPARE) with an option that writes in place or deletes
    its target. DuckDB's settings block all but the last; this names the reason."""
    st_ = duckdb.StatementType
    for st in duckdb.extract_statements(query):
        try:
            kind = st.type
        except ValueError:  # a statement type this duckdb module cannot name
            raise Refused(f"cannot check a statement of the query: {st.query.strip()[:60]}"
                          ) from None
        if kind == st_.LOAD:
            raise Refused("installing or loading DuckDB extensions is disabled")
        if kind in (st_.COPY, st_.EXPORT) and not writes_allowed:
            raise Refused(f"writing files is disabled ({kind.name}): {WRITES_HINT}")
        if kind in (st_.COPY, st_.EXPORT, st_.EXPLAIN, st_.PREPARE) and IN_PLACE.search(st.query):
            raise Refused("COPY with USE_TMP_FILE or OVERWRITE is disabled: writing in place "
                          "could replace or delete one of the store's files")


def _explain(err: BaseException) -> str:
    """The error's first line, with why tracetool sql blocked it when DuckDB's settings did."""
    first = one_line(err)
    if isinstance(err, duckdb.PermissionException):
        return (f"{first} (tracetool sql reads only the store's files and writes files only "
                "under --allow-writes DIR)")
    if "configuration has been locked" in first:
        return f"{first} (tracetool sql fixes DuckDB's settings so that queries stay read-only)"
    return first


def _write_parquet(rel: duckdb.DuckDBPyRelation, output: Path) -> None:
    """The result as a Parquet file, written from Python (queries cannot write files):
    streamed in batches to a temporary name beside it, then renamed into place."""
    import pyarrow.parquet as pq

    reader = rel.to_arrow_reader(1 << 17)
    with atomic_write(output) as f, pq.ParquetWriter(f, reader.schema, compression="zstd") as w:
        for batch in reader:
            w.write_batch(batch)


def _render(rel: duckdb.DuckDBPyRelation, fmt: str, escape: bool) -> str:
    """The result as text. Names from traces are hostile text (tracetool.text): the table
    shows control characters as escapes, and so does CSV when ``escape`` (it goes to
    stdout, often a terminal); CSV written to --output keeps every character as it is;
    JSON escapes them by its own rules."""
    cols = rel.columns
    rows = rel.fetchall()
    if fmt == "json":
        return "".join(json.dumps(dict(zip(cols, r, strict=True)), default=_jsonable) + "\n"
                       for r in rows)
    if fmt == "csv":
        import csv

        if escape:
            cols = [printable(c) for c in cols]
            rows = [[printable(v) if isinstance(v, str) else v for v in r] for r in rows]
        # csv quotes a field holding a character of its line terminator: with "\r\n" a field
        # with \r is quoted too (with "\n" alone it was not, and readers split the row
        # there); each record is then ended by "\n" (the writer writes one record a call)
        records: list[str] = []
        w = csv.writer(_Records(records), lineterminator="\r\n")
        w.writerow(cols)
        w.writerows(rows)
        return "".join(records)
    return _table(cols, rows)


class _Records:
    """A file for csv.writer that keeps each record, ended by "\\n" instead of "\\r\\n"."""

    def __init__(self, records: list[str]) -> None:
        self.records = records

    def write(self, record: str) -> int:
        self.records.append(record[:-2] + "\n")
        return len(record)


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
