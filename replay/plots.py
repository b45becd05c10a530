"""PNG charts of a replay and of a sweep (matplotlib's Agg canvas, no pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracetool.palette import colour

if TYPE_CHECKING:
    from .run import ReplayResult


PARTS = tuple((k, label, colour(k)) for k, label in (
    ("compute", "compute"), ("exposed_comm", "exposed comm"),
    ("exposed_memcpy", "memcpy (not overlapped)"), ("idle", "idle")))


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _stack(ax: Any, x: list[float], parts: list[dict[str, int]], width: float) -> None:
    bottom = [0.0] * len(x)
    for key, label, fill in PARTS:
        ms = [max(0, p.get(key, 0)) / 1e6 for p in parts]
        ax.bar(x, ms, width, bottom=bottom, color=fill, label=label)
        bottom = [b + m for b, m in zip(bottom, ms, strict=True)]


def plot_replay(result: ReplayResult, path: Path) -> None:
    """Per step: measured and projected step time side by side, split by breakdown, with
    the projection's uncertainty band."""
    steps = result.steps
    fig = _figure(max(6, 1.2 * len(steps) + 3), 4.5)
    ax = fig.add_subplot()
    xs = list(range(len(steps)))
    _stack(ax, [x - 0.2 for x in xs], [s.measured for s in steps], 0.38)
    ax.set_prop_cycle(None)
    bottom_colours = {label for _, label, _ in PARTS}
    _stack(ax, [x + 0.2 for x in xs], [s.projected for s in steps], 0.38)
    for x, s in zip(xs, steps, strict=True):
        ax.errorbar(x + 0.2, s.projected_ns / 1e6,
                    yerr=[[(s.projected_ns - s.low_ns) / 1e6], [(s.high_ns - s.projected_ns)
                                                                / 1e6]],
                    color="black", capsize=4)
    ax.set_xticks(xs, ["trace" if s.step is None else f"step {s.step}" for s in steps],
                  fontsize=8)
    ax.set_ylabel("ms")
    ax.set_title(f"{result.job}: {result.scenario}\n(each step: measured left, projected "
                 "right with its uncertainty band)", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    keep = {lab: h for h, lab in zip(handles, labels, strict=True) if lab in bottom_colours}
    ax.legend(keep.values(), keep.keys(), loc="upper left", bbox_to_anchor=(1, 1))
    fig.savefig(path, bbox_inches="tight")


def plot_sweep(rows: list[dict], axis: str, path: Path) -> None:
    """Projected step time (mean over steps) against the swept setting, stacked by
    compute / memcpy / exposed comm / idle, with the measured step time as a line."""
    fig = _figure(max(6, 0.8 * len(rows) + 3), 4.5)
    ax = fig.add_subplot()
    xs = list(range(len(rows)))
    _stack(ax, xs, [r["projected_breakdown_ns"] for r in rows], 0.7)
    ax.errorbar(xs, [r["projected_step_ns"] / 1e6 for r in rows],
                yerr=[[(r["projected_step_ns"] - r["low_ns"]) / 1e6 for r in rows],
                      [(r["high_ns"] - r["projected_step_ns"]) / 1e6 for r in rows]],
                fmt="none", color="black", capsize=3)
    ax.axhline(rows[0]["measured_step_ns"] / 1e6, color="black", linestyle="--",
               linewidth=1, label="measured")
    ax.set_xticks(xs, [r["setting"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_xlabel(axis)
    ax.set_ylabel("step time, ms (mean over steps)")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
    fig.savefig(path, bbox_inches="tight")
