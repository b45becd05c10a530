"""One palette for every chart of the project: a kind of time has one colour everywhere.

The report's breakdown, its critical path and top-kernels charts, and the replay's plots
colour by these names, so compute is the same blue in every picture and a critical-path
kind keeps its colour from one report to the next, whichever kinds a path happens to have.
Colours from seaborn's "deep" palette (colour-blind tolerant), greys for waiting.
"""

from __future__ import annotations

COLOURS: dict[str, str] = {
    # where a step goes (step_breakdown, replay): they stack to the step
    "compute": "#4c72b0",
    "exposed_comm": "#dd8452",
    "exposed_memcpy": "#55a868",
    "idle": "#c7c7c7",
    # critical path segment kinds (compute as above)
    "comm": "#dd8452",
    "memcpy": "#55a868",
    "launch_overhead": "#8172b3",
    "cpu": "#937860",
    "idle_wait": "#a9a9a9",
    "unexplained_gap": "#e377c2",
    # kernel categories (kernels.category)
    "gemm": "#4c72b0",
    "conv": "#64b5cd",
    "attention": "#da8bc3",
    "norm": "#ccb974",
    "reduction": "#8c8c8c",
    "elementwise": "#c44e52",
    "other": "#7f7f7f",
}


def colour(kind: str) -> str:
    """The colour of ``kind``; KeyError for a kind the palette lacks (add it here)."""
    return COLOURS[kind]
