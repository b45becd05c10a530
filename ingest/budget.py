"""The disk budget of one file's work directory under ``STORE/.tmp``.

A trace's decoded events are staged on disk (about 1.2x its JSON text), so a small gzip file
that inflates to many GB (a "bomb") would otherwise fill the disk. Each file gets a budget,
by default a multiple of its expected JSON size, and the ingest stops, with the file's error,
when its work directory grows past it or the file system's free space falls below a margin.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

TMP_BUDGET_FACTOR = 4  # x the expected JSON text (staging needs ~1.2x)
GZIP_INFLATION = 10  # expected JSON bytes per gzip byte (real traces: 10-22)
MIN_TMP_BUDGET = 1 << 30
FREE_MARGIN_BYTES = 512 << 20  # never fill the store's file system past this
_CHECK_EVERY_S = 0.2


class BudgetExceeded(Exception):
    """The work directory outgrew its budget (the message is one line)."""


def default_budget(bytes_on_disk: int, gzip: bool) -> int:
    """The default --tmp-budget for a file of this size."""
    json_bytes = bytes_on_disk * (GZIP_INFLATION if gzip else 1)
    return max(MIN_TMP_BUDGET, TMP_BUDGET_FACTOR * json_bytes)


def dir_bytes(d: Path) -> int:
    """Bytes of the files under ``d`` (files vanishing meanwhile are skipped)."""
    total = 0
    stack = [str(d)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            total += e.stat(follow_symlinks=False).st_blocks * 512
                    except FileNotFoundError:
                        pass
        except FileNotFoundError:
            pass
    return total


class TmpBudget:
    """Checks one work directory against its budget, at most every 0.2 s."""

    def __init__(self, workdir: Path, limit: int, explicit: bool) -> None:
        self.workdir = workdir
        self.limit = limit
        self.explicit = explicit  # given as --tmp-budget (else the default for the file)
        self._last = 0.0

    def remaining(self) -> int:
        """Bytes the work directory may still grow by (for DuckDB's spill limit)."""
        return max(0, min(self.limit - dir_bytes(self.workdir), self._free() - FREE_MARGIN_BYTES))

    def check(self, force: bool = False) -> None:
        """BudgetExceeded when the work directory is over budget or the disk nearly full."""
        now = time.monotonic()
        if not force and now - self._last < _CHECK_EVERY_S:
            return
        self._last = now
        used = dir_bytes(self.workdir)
        if used > self.limit:
            how = "--tmp-budget" if self.explicit else (
                f"default budget ({TMP_BUDGET_FACTOR}x the expected JSON size; raise it "
                "with --tmp-budget)")
            raise BudgetExceeded(f"stopped: its work files in the store's .tmp grew past "
                                 f"{_size(self.limit)}, the {how}")
        free = self._free()
        if free < FREE_MARGIN_BYTES:
            raise BudgetExceeded(f"stopped: the store's file system has only {_size(free)} "
                                 f"free (tracetool keeps {_size(FREE_MARGIN_BYTES)})")

    def _free(self) -> int:
        try:
            return shutil.disk_usage(self.workdir).free
        except OSError:
            return FREE_MARGIN_BYTES * 2  # cannot tell: the budget alone applies


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """'64MB', '2GiB', '500k', '1048576' -> bytes (ValueError for anything else)."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(t[-1:], 1)
    number = t[:-1] if scale > 1 else t
    value = float(number)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(text)
    return int(value * scale)
