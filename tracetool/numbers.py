"""How averaged times become the integer nanoseconds every command prints.

One rounding for all (half away from zero, as DuckDB's ``round``), so a mean printed by
``tracetool replay`` equals the same mean taken in SQL (``round(avg(...))``) and by
``tracetool report``; Python's ``round`` rounds halves to even and would differ by 1 ns.
"""

from __future__ import annotations

import math


def round_ns(value: float) -> int:
    """``value`` rounded half away from zero to an int."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))
