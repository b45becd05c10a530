"""Names from traces are hostile text: the one escaping every text output applies to them.

A kernel or op name is whatever the traced program wrote: newlines, terminal escape sequences
(an OSC sequence can retitle or hijack a terminal), Markdown. Terminal and table outputs show
control characters as escapes (``printable``); Markdown cells also escape what Markdown would
read as markup (``markdown_cell``). CSV, JSON and HTML outputs escape by their own rules.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with every non-printable character (control characters, DEL, C1, line and
    paragraph separators) shown as an escape: ``\\n``, ``\\x1b``, ``\\u2028``."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _NAMED.get(ch) or (
        f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}") for ch in text)


def path_text(path: Path | str) -> str:
    """A file's path as valid UTF-8 text, as the store keeps it (``trace_files.path`` and
    ``file_name``) and outputs show it: a name that is not valid UTF-8 (on POSIX a name is
    bytes; Python holds the undecodable ones as surrogates, which Parquet, DuckDB and JSON
    cannot take) has each such byte written ``\\xNN`` (``b"bad\\xff.json"`` ->
    ``bad\\xff.json``, Python's ``backslashreplace``). Other names are unchanged."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return os.fsencode(text).decode("utf-8", "backslashreplace")


def markdown_cell(text: str) -> str:
    """``printable(text)`` safe in a Markdown table cell or paragraph: C++ names hold |, *,
    _, ` and <...> (read as HTML), and [..](..) would be a link."""
    text = printable(text)
    for ch in "\\|*_`[]":
        text = text.replace(ch, "\\" + ch)
    return text.replace("<", "&lt;")


# a C++ symbol (a return type, a qualified name, template arguments or a parameter list), as
# kernel names are; other names ("Memcpy HtoD (Pageable -> Device)", "aten::mm") stay whole
_CPP = re.compile(r"^\s*(void\s+)?[\w:~]+(<|\()")


_WRAPPERS = {"Kernel", "Kernel2", "kernel", "device_kernel", "cutlass_kernel"}


def _strip_templates(name: str) -> tuple[str, list[str]]:
    """``name`` without its template arguments, and the top-level arguments removed."""
    out, args, depth, cur = [], [], 0, []
    for ch in name:
        if ch == "<":
            depth += 1
            if depth == 1:
                cur = []
                continue
        elif ch == ">" and depth:
            depth -= 1
            if depth == 0:
                args.append("".join(cur))
                continue
        if depth:
            cur.append(ch)
        else:
            out.append(ch)
    return "".join(out), args


def _base_name(name: str) -> tuple[str, list[str]]:
    """A C++ kernel name reduced as TensorBoard's profiler does: no return type, no template
    arguments, no parameter list, no namespaces (``void at::native::foo<4, F>(int, F)`` ->
    ``foo``); and the words of its template arguments, to tell same-named kernels apart."""
    bare, args = _strip_templates(name.strip().replace("(anonymous namespace)::", ""))
    bare = bare.split("(", 1)[0].strip()
    bare = bare.rsplit(" ", 1)[-1]  # the return type
    base = bare.rsplit("::", 1)[-1] or bare
    words = []
    for a in args:
        for w in "".join(c if c.isalnum() or c == "_" else " " for c in a).split():
            if not w.isdigit() and w not in ("c10", "at", "native", "std", "void", "const",
                                             "char", "array", "int", "long", "unsigned",
                                             "float", "bool", "anonymous", "namespace",
                                             "operator", "lambda", "detail", "cuda"):
                words.append(w)
    return base, words


def short_names(names: list[str], width: int = 60) -> list[str]:
    """Labels for ``names`` that fit ``width`` and stay distinct: each kernel's base name
    (``_base_name``; a wrapper such as ``cutlass::Kernel2<k>`` is named after ``k``), and
    where several share it, the first word of their template arguments that tells them
    apart (``vectorized_elementwise_kernel<CUDAFunctor_add>``); labels still equal get
    ``#2``, ``#3``. Names that are not C++ symbols stay whole (cut to ``width``)."""
    parts = []
    for n in names:
        base, words = _base_name(printable(n))
        if not (base and _CPP.match(n)):
            base, words = printable(n), []
        elif base in _WRAPPERS and words:
            base, words = words[0], words[1:]
        parts.append((base, words))
    count: dict[str, int] = {}
    for base, _ in parts:
        count[base] = count.get(base, 0) + 1
    out = []
    for i, (base, words) in enumerate(parts):
        label = base
        if count[base] > 1:
            others = {w for j, (b, ws) in enumerate(parts) if b == base and j != i for w in ws}
            tell = next((w for w in words if w not in others), None)
            if tell:
                label = f"{base}<{tell}>"
        out.append(label if len(label) <= width else label[:width - 1] + "…")
    seen: dict[str, int] = {}
    for i, label in enumerate(out):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            out[i] = f"{label} #{seen[label]}"
    return out


def number_ranges(values: list[int], sep: str = ",") -> str:
    """Sorted whole numbers as runs: [0, 1, 2, 5] -> '0-2,5' (ranks, steps)."""
    out, start = [], None
    for i, n in enumerate(values):
        start = n if start is None else start
        if i + 1 == len(values) or values[i + 1] != n + 1:
            out.append(str(n) if start == n else f"{start}-{n}")
            start = None
    return sep.join(out)
