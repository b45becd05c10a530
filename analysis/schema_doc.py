"""docs/schema.md: the store's tables (``tracetool.schema``) and the analysis views, each view
documented where it is defined (its ``-- @view NAME:`` header in analysis/sql, the
Perfetto standard library's way), collected here so one page lists both.

``python -m tracetool.analysis.schema_doc > docs/schema.md``; a test keeps the two equal.
"""

from __future__ import annotations

import re

from tracetool.analysis.connect import view_files
from tracetool.schema import render_markdown

COMMAND = "python -m tracetool.analysis.schema_doc > docs/schema.md"
_HEADER = re.compile(r"^-- @view (\w+): ?(.*)$")


def view_docs() -> list[tuple[str, str, list[str]]]:
    """(file, view, doc paragraphs) for every ``@view`` header, in load order: a header's
    comment lines up to its CREATE statement; a line indented by ``--   `` continues the
    paragraph above it."""
    out = []
    for name, sql in view_files():
        lines = sql.splitlines()
        for i, line in enumerate(lines):
            m = _HEADER.match(line)
            if not m:
                continue
            paras = [m.group(2).strip()]
            for follow in lines[i + 1:]:
                if not follow.startswith("--"):
                    break
                text = follow[2:]
                if text.startswith("   ") and paras:
                    paras[-1] += " " + text.strip()
                else:
                    paras.append(text.strip())
            out.append((name, m.group(1), [p for p in paras if p]))
    return out


def render() -> str:
    """docs/schema.md: the tables, then the views."""
    tables = render_markdown().replace(
        "Generated from `tracetool/schema.py` by `python -m tracetool.schema > docs/schema.md`",
        f"Generated from `tracetool/schema.py` (tables) and the `-- @view` headers of "
        f"`analysis/sql/*.sql` (views) by `{COMMAND}`")
    lines = [tables.rstrip("\n"), "", "# Analysis views", "",
             "Defined on every connection `tracetool.connect` / `tracetool sql` opens, in file "
             "order; each documented, column by column, where it is defined.", ""]
    for file, view, paras in view_docs():
        first = paras[0][:1].upper() + paras[0][1:]
        lines += [f"## {view}", "", f"`analysis/sql/{file}`. {first}", ""]
        lines += [f"- {p}" for p in paras[1:]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
