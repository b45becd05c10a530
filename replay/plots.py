"""PNG charts of a replay and of a sweep (matplotlib's Agg canvas, no pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracetool.analysis.charts import breakdown_part_ns, figure
from tracetool.outputs import save_png
from tracetool.palette import colour

if TYPE_CHECKING:
    from .run import ReplayResult


PARTS = tuple((k, label, colour(k)) for k, label in (
    ("compute", "compute"), ("exposed_comm", "exposed comm"),
    ("exposed_memcpy", "memcpy (not overlapped)"), ("idle", "idle"),
    ("unexplained_gap", "unexplained gap (GPU idle, work queued)")))



def _stack(ax: Any, x: list[float], parts: list[dict[str, int]], width: float) -> None:
    bottom = [0.0] * len(x)
    for key, label, fill in PARTS:
        ms = [max(0, breakdown_part_ns(p, key)) / 1e6 for p in parts]
        if key == "unexplained_gap" and not any(ms):
            continue  # named only where there is one
        ax.bar(x, ms, width, bottom=bottom, color=fill, label=label)
        bottom = [b + m for b, m in zip(bottom, ms, strict=True)]


def plot_replay(result: ReplayResult, path: Path) -> Any:
    """Per step: measured and projected step time side by side, split by breakdown (idle's
    unexplained gap on its own where there is one), with the projection's uncertainty band;
    returns the figure (saved to ``path``)."""
    steps = result.steps
    fig = figure(max(6, 1.2 * len(steps) + 3), 4.5)
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
    save_png(fig, path)
    return fig


def plot_sweep(rows: list[dict], axis: str, path: Path) -> Any:
    """Projected step time (mean over steps, with its band) against the swept settings;
    returns the figure (saved to ``path``).

    A grid of one axis with few settings is a stacked bar per setting (compute / memcpy /
    exposed comm / idle); any larger grid is lines: the first axis that varies along x, one
    line per value of the second, one facet per value of the third (the rest, if any, in
    the line's label), so a 36-setting sweep reads as curves, not 36 crowded bars. With one
    axis the curve sits on the breakdown stacked as areas: where the time goes as the swept
    value grows."""
    varying = [k for k in (rows[0].get("axes") or {})
               if len({r["axes"][k] for r in rows}) > 1]
    if len(varying) <= 1 and len(rows) <= 12:
        return _sweep_bars(rows, axis, path)
    x_key, line_keys = varying[0], varying[1:2] + varying[3:]
    facet_key = varying[2] if len(varying) > 2 else None
    facets = list(dict.fromkeys(r["axes"][facet_key] for r in rows)) if facet_key else [None]
    xs = list(dict.fromkeys(r["axes"][x_key] for r in rows))
    fig = figure(min(6 * len(facets), 18), 4.5)
    axes = fig.subplots(1, len(facets), sharey=True, squeeze=False)[0]
    for ax, facet in zip(axes, facets, strict=True):
        mine = [r for r in rows if facet is None or r["axes"][facet_key] == facet]
        lines = dict.fromkeys(", ".join(f"{k}={r['axes'][k]}" for k in line_keys) for r in mine)
        for label in lines:
            pts = [r for r in mine
                   if ", ".join(f"{k}={r['axes'][k]}" for k in line_keys) == label]
            pos = [xs.index(r["axes"][x_key]) for r in pts]
            ms = [r["projected_step_ns"] / 1e6 for r in pts]
            if len(varying) == 1:  # one curve: the breakdown under it
                ax.stackplot(pos, *[[max(0, r["projected_breakdown_ns"].get(k, 0)) / 1e6
                                     for r in pts] for k, _, _ in PARTS],
                             colors=[c for _, _, c in PARTS],
                             labels=[lab for _, lab, _ in PARTS], alpha=0.6)
            line, = ax.plot(pos, ms, marker="o", label=label or "projected")
            ax.fill_between(pos, [r["low_ns"] / 1e6 for r in pts],
                            [r["high_ns"] / 1e6 for r in pts], color=line.get_color(),
                            alpha=0.15, linewidth=0)
        ax.axhline(rows[0]["measured_step_ns"] / 1e6, color="black", linestyle="--",
                   linewidth=1, label="measured")
        ax.set_xticks(range(len(xs)), xs, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel(x_key)
        if facet is not None:
            ax.set_title(f"{facet_key}={facet}", fontsize=9)
    axes[0].set_ylabel("step time, ms (mean over steps; shaded: band)")
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1, 1), fontsize=8)
    fig.suptitle(f"sweep over {axis}", fontsize=10)
    save_png(fig, path)
    return fig


def _sweep_bars(rows: list[dict], axis: str, path: Path) -> Any:
    """One stacked bar per setting, with its band, and the measured step time as a line."""
    fig = figure(max(6, 0.8 * len(rows) + 3), 4.5)
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
    save_png(fig, path)
    return fig
