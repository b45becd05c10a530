"""The file's top-level keys (before and after traceEvents), the rank and the job name."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from .decode import _repair, repair_utf8

_decoder = msgspec.json.Decoder()
RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
KEY_VALUE = re.compile(
    rb'"(baseTimeNanoseconds|traceName|displayTimeUnit|schemaVersion)"\s*:\s*'
    rb'("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?)'
)


@dataclass
class TopLevel:
    keys: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def parse_members(text: bytes, where: str, closes_object: bool = False) -> TopLevel:
    """Members of the top-level object found in a text like ``"a": 1, "b": [..]`` (no braces).

    ``closes_object``: the text is the file's tail and ends with the object's closing brace.
    Broken JSON is repaired the way events are; when that fails, the well-known scalar keys
    are still pulled out with a pattern so the base time and trace name are never lost.
    """
    out = TopLevel()
    body = text.strip().strip(b",").strip()
    if closes_object and body.endswith(b"}"):
        body = body[:-1].rstrip().rstrip(b",")
    if not body:
        return out
    doc = repair_utf8(b"{" + body + b"}")[0]
    for _ in range(50):
        try:
            obj = _decoder.decode(doc)
            if isinstance(obj, dict):
                out.keys = obj
            return out
        except RecursionError:
            out.problems.append(f"{where}: nested too deep to decode")
            break
        except msgspec.DecodeError as err:
            fixed = _repair(doc, err)
            if fixed is None:
                out.problems.append(f"{where}: {err}")
                break
            doc = fixed
    for m in KEY_VALUE.finditer(body):
        try:
            out.keys[m.group(1).decode()] = _decoder.decode(repair_utf8(m.group(2))[0])
        except msgspec.DecodeError:
            continue
    return out


def rank_from_file_name(path: Path) -> int | None:
    m = RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def distributed_rank(keys: dict) -> int | None:
    di = keys.get("distributedInfo")
    if isinstance(di, dict):
        r = di.get("rank")
        if isinstance(r, int) and not isinstance(r, bool) and r >= 0:
            return r
        if isinstance(r, str) and r.isdigit():
            return int(r)
    return None


def base_time_ns(keys: dict) -> int:
    v = keys.get("baseTimeNanoseconds")
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return 0
