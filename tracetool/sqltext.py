"""Values pasted into SQL text: the one place a path (or any string) becomes DuckDB SQL.

A store may live at any path (a quote, brackets, a backslash, a space, non-ASCII): quoting
it by hand in an f-string breaks on the first ``'``, and DuckDB's file readers treat ``*``,
``?`` and ``[`` in a path as a glob. So paths meet SQL only through these functions, and
directories are never globbed by DuckDB: callers list the files in Python and pass the list.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

# What DuckDB's readers take for a glob (LocalFileSystem's HasGlob); `]` and `{` are literal.
GLOB_CHARS = frozenset("*?[")


def literal(value: str | os.PathLike[str]) -> str:
    """A SQL string literal of ``value``: DuckDB's '...' strings have no escapes other than
    a doubled quote (a backslash is an ordinary character)."""
    text = os.fspath(value)
    if "\0" in text:
        raise ValueError(f"{text!r}: a NUL character cannot be in SQL text")
    return "'" + text.replace("'", "''") + "'"


def exact_path(path: str | os.PathLike[str]) -> str:
    """The absolute spelling of ``path`` that DuckDB's readers (read_parquet, ...) open as
    exactly that one file.

    A path with ``*``, ``?`` or ``[`` is globbed first and read literally only when the glob
    matches nothing (so ``run[1]`` would read ``run1``); bracketing each of them (``[[]``)
    makes the glob match only the path itself. DuckDB's glob also splits on ``\\`` (any OS),
    so a path with a backslash never matches as a glob: it is left as written and read by
    DuckDB's literal fallback."""
    text = os.path.abspath(os.fspath(path))
    if "\\" in text or not GLOB_CHARS.intersection(text):
        return text
    return "".join(f"[{c}]" if c in GLOB_CHARS else c for c in text)


def path_list(paths: Iterable[str | os.PathLike[str]]) -> str:
    """A DuckDB list literal of files for ``read_parquet(...)``, each read as exactly itself
    (``exact_path``); pass what Python listed instead of a glob over a directory."""
    return "[" + ", ".join(literal(exact_path(p)) for p in paths) + "]"


def list_literal(values: Iterable[str | os.PathLike[str]]) -> str:
    """A DuckDB list literal of strings as written (e.g. for ``SET allowed_paths``)."""
    return "[" + ", ".join(literal(v) for v in values) + "]"
