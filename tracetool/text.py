"""Names from traces are hostile text: the one escaping every text output applies to them.

A kernel or op name is whatever the traced program wrote: newlines, terminal escape sequences
(an OSC sequence can retitle or hijack a terminal), Markdown. Terminal and table outputs show
control characters as escapes (``printable``); Markdown cells also escape what Markdown would
read as markup (``markdown_cell``). CSV, JSON and HTML outputs escape by their own rules.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with every non-printable character (control characters, DEL, C1, line and
    paragraph separators) shown as an escape: ``\\n``, ``\\x1b``, ``\\u2028``."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _NAMED.get(ch) or (
        f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}") for ch in text)


def markdown_cell(text: str) -> str:
    """``printable(text)`` safe in a Markdown table cell or paragraph: C++ names hold |, *,
    _, ` and <...> (read as HTML), and [..](..) would be a link."""
    text = printable(text)
    for ch in "\\|*_`[]":
        text = text.replace(ch, "\\" + ch)
    return text.replace("<", "&lt;")
