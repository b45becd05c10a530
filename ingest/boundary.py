"""Where the event array may be cut: at a ``}, {`` separator that is not inside a string.

A pattern finds candidate separators, and one may sit inside a string (a name holding
``}, {``). Scanning from the array's start would settle it, but costs a pass over the whole
text in the process that cuts it, so a candidate is judged by the text after it instead,
under both hypotheses: outside a string, or inside one. Each is followed until the text
contradicts it: a string ends at its first unescaped quote and is followed by ``:``, ``,``,
``}`` or ``]``; a string starts after ``{``, ``[``, ``,`` or ``:``; outside strings only
structure, numbers and literals appear. In a real trace the wrong hypothesis dies within a
few bytes (at the next key, ``"ph"``); a separator inside a 17 MB string is settled at the
string's end. Text that is broken both ways is taken as a cut (the decoder copes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

BOUNDARY = re.compile(rb"\}\s*,\s*\{")
# Bytes JSON allows outside strings (structure, numbers, true/false/null, NaN, Infinity)
_OUTSIDE = re.compile(rb"[ \t\r\n{}\[\],:0-9+\-.eEtrufalsnNIiy]*")
# A string's content from inside it: stops at its closing quote, or at the text's end (or at
# a final lone backslash)
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.S)
_WS = b" \t\r\n"
_AFTER_STRING = frozenset(b":,}]")
_BEFORE_STRING = frozenset(b"{[,:")
QUOTE = 0x22

OUTSIDE, INSIDE, UNDECIDED = 0, 1, 2


def _contradicted(text: bytes, i: int, inside: bool, n: int) -> bool | None:
    """Follow one hypothesis from text[i] up to text[n]: True when the text contradicts it,
    None when it ends first."""
    last = None  # the last non-whitespace byte outside strings, when known
    while True:
        if inside:
            e = _STRING_BODY.match(text, i, n).end()
            if e >= n or text[e] != QUOTE:
                return None
            j = e + 1
            while j < n and text[j] in _WS:
                j += 1
            if j >= n:
                return None
            if text[j] not in _AFTER_STRING:
                return True
            inside, i, last = False, j, None
        else:
            e = _OUTSIDE.match(text, i, n).end()
            if e >= n:
                return None
            if text[e] != QUOTE:
                return True
            seg = text[i:e].rstrip(_WS)
            before = seg[-1] if seg else last
            if before is not None and before not in _BEFORE_STRING:
                return True
            inside, i = True, e + 1


def judge(text: bytes, at: int, eof: bool) -> int:
    """Whether the candidate separator at ``text[at]`` is OUTSIDE or INSIDE a string, or
    UNDECIDED when ``text`` ends (and is not the end of the file) before it is settled.
    Both hypotheses are followed over a growing span, so the cost is that of reaching the
    point where the wrong one dies, not of following the right one to the text's end."""
    span = 256
    while True:
        n = min(len(text), at + span)
        if _contradicted(text, at, True, n):
            return OUTSIDE
        if _contradicted(text, at, False, n):
            return INSIDE
        if n == len(text):
            return OUTSIDE if eof else UNDECIDED
        span *= 4


def string_end(text: bytes, i: int) -> tuple[int, bool]:
    """From inside a string at ``text[i]``: (the index after its closing quote, True), or
    (where the text ran out, False): its end, or a final backslash that starts an escape."""
    e = _STRING_BODY.match(text, i).end()
    return (e + 1, True) if e < len(text) and text[e] == QUOTE else (e, False)


def boundaries(text: bytes, pos: int = 0) -> Iterator[re.Match]:
    """The separators of a whole text (a piece) that are outside strings, in order."""
    while (m := BOUNDARY.search(text, pos)) is not None:
        if judge(text, m.start(), eof=True) == OUTSIDE:
            yield m
            pos = m.end() - 1
            continue
        pos, closed = string_end(text, m.start())
        if not closed:
            return
