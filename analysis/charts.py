"""The report's charts, drawn from plain data (numbers, lists, numpy arrays), never from
DuckDB, so that a report draws them in a second process (``ChartDrawer``).

Why a process: drawing is Python that holds the GIL, and so are the critical path's walk and
numpy's indexing; on two threads of one process they take turns, on two processes they run
side by side (a report's charts cost about as much as its critical path). Each chart is
drawn on matplotlib's Agg canvas directly rather than through pyplot: no display is needed
and no global figure state is shared between reports.
"""

from __future__ import annotations

import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tracetool.outputs import save_png
from tracetool.palette import colour
from tracetool.text import printable, short_names

BREAKDOWN_PARTS = (  # (summary key, label, colour): they add up to the step's duration
    ("compute_ns", "compute", colour("compute")),
    ("exposed_comm_ns", "exposed comm", colour("exposed_comm")),
    ("exposed_memcpy_ns", "memcpy (not overlapped)", colour("exposed_memcpy")),
    ("idle_ns", "idle", colour("idle")),  # less its unexplained gap, stacked on its own
    ("unexplained_gap_ns", "unexplained gap (GPU idle, work queued)", colour("unexplained_gap")),
)


def breakdown_part_ns(row: dict[str, Any], key: str) -> float:
    """A bar's part in ns: idle less its unexplained gap (step_breakdown's idle_ns includes
    it), the rest as the row has them. Keys with or without ``_ns`` (the report's rows,
    replay's breakdowns); the gap is always ``unexplained_gap_ns``."""
    gap = row.get("unexplained_gap_ns") or 0
    if key.removesuffix("_ns") == "unexplained_gap":
        return gap
    value = row.get(key) or 0
    return value - gap if key.removesuffix("_ns") == "idle" else value


def import_charting() -> None:
    """Import what the charts use (~0.4 s): the drawing process does it while the report's
    first queries run."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.collections  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import matplotlib.patches  # noqa: F401


class ChartError(RuntimeError):
    """A chart could not be drawn (the message says which and why)."""


def drawing_command() -> list[str]:
    """The drawing process's command line (``ChartDrawer`` says why it is this one)."""
    return [sys.executable, "-P", __file__]


class ChartDrawer:
    """Draws charts in one child process (``python -P .../analysis/charts.py``), in the
    order given; ``wait`` returns when all are drawn and raises ChartError for the first
    that failed. Where no process can be started, each chart is drawn here, at once.

    The child runs this file as a script rather than ``-m tracetool.analysis.charts``: a
    module of a package imports the package first, and ``tracetool.analysis`` imports
    DuckDB and pyarrow (0.1 s of a core the report's queries need); ``-P`` keeps this
    file's directory off ``sys.path``, so its siblings cannot shadow other modules.

    A plain subprocess rather than multiprocessing: a spawned multiprocessing child runs
    the caller's main script again (a user's script without a ``__main__`` guard would
    run twice). The charts' data goes through a pipe from a feeder thread, so a chart
    whose data is larger than the pipe's buffer never holds up the report's queries."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[str, tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._sent = 0
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                drawing_command(), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE)
        except OSError:
            self._proc = None
            return
        self._feeder = threading.Thread(target=self._feed, name="tracetool-charts-feed",
                                        daemon=True)
        self._feeder.start()

    def _feed(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            while (job := self._jobs.get()) is not None:
                pickle.dump(job, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                self._proc.stdin.flush()
            self._proc.stdin.close()
        except OSError:  # the child is gone: wait() says so
            pass

    def draw(self, chart: Callable[..., None], *args: Any) -> None:
        """Draw ``chart(*args)`` (one of DRAWINGS), in the child when there is one."""
        if self._proc is None:
            chart(*args)
            return
        if chart.__name__ not in DRAWINGS:
            raise ValueError(f"{chart.__name__} is not one of the charts {DRAWINGS}")
        self._jobs.put((chart.__name__, args))
        self._sent += 1

    def wait(self) -> None:
        """Return when every chart is drawn; ChartError for the first that failed."""
        if self._proc is None:
            return
        assert self._proc.stdout is not None
        self._jobs.put(None)
        self._feeder.join()
        errors = []
        for _ in range(self._sent):
            try:
                error = pickle.load(self._proc.stdout)
            except EOFError:
                code = self._proc.wait()
                self._proc = None
                raise ChartError(f"the chart-drawing process ended early (exit code {code})"
                                 ) from None
            if error is not None:
                errors.append(error)
        self._proc.wait()
        self._proc = None
        if errors:
            raise ChartError(errors[0])

    def close(self) -> None:
        """Stop the child if it still runs (after an error or an interrupt)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> ChartDrawer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve() -> None:
    """The drawing process: draw each (chart name, args) read from stdin; answer None or
    the error's message on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the report stops this process
    import_charting()
    charts = {name: globals()[name] for name in DRAWINGS}
    while True:
        try:
            name, args = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        try:
            charts[name](*args)
            error = None
        except Exception as err:  # noqa: BLE001  (sent to the report, which raises it)
            error = f"{name}: {type(err).__name__}: {err}"
        pickle.dump(error, sys.stdout.buffer)
        sys.stdout.buffer.flush()


def figure(width: float, height: float) -> Any:
    """A matplotlib figure on the Agg canvas (no pyplot state, safe in threads)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


MOST_LABELS = 40  # tick labels on an axis of ranks; more would overlap (1,024-rank jobs)
MOST_INCHES = 14.0  # a chart's height: beyond it, lanes get thinner rather than the PNG taller


def _every(n: int, most: int = MOST_LABELS) -> list[int]:
    """Positions 0..n-1 to label: all of them, or every k-th so that at most ``most``."""
    return list(range(0, n, max(1, -(-n // most))))


def draw_breakdown(job: str, breakdown: list[dict[str, Any]], cpu_only: bool,
                   path: Path) -> None:
    """Stacked bar per rank: mean step split into compute / exposed comm / memcpy / idle
    (one polygon collection per part: a bar per patch would take seconds at 1,024 ranks)."""
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    n = len(breakdown)
    fig = figure(min(20, max(7, 0.6 * n + 3)), 5)
    ax = fig.add_subplot()
    x = np.arange(n, dtype=float)
    bottom = np.zeros(n)
    half = 0.35 if n <= 100 else 0.5  # many ranks: bars that touch, no sub-pixel gaps
    for key, label, fill in BREAKDOWN_PARTS:
        ms = np.array([max(0, breakdown_part_ns(r, key)) / 1e6 for r in breakdown])
        ax.add_collection(PolyCollection(_rectangles(x - half, x + half, bottom, bottom + ms),
                                         facecolors=fill, linewidths=0, label=label))
        bottom = bottom + ms
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, max(float(bottom.max(initial=0)), 1e-9) * 1.05)
    shown = _every(n)
    ax.set_xticks(shown, [f"rank {breakdown[i]['rank']}" for i in shown],
                  rotation=45 if len(shown) > 12 else 0)
    ax.set_ylabel("ms per step (mean)")
    ax.set_title(f"{job}: where a step goes"
                 + (" (CPU-only: compute = CPU ops, comm = gloo)" if cpu_only else ""))
    ax.legend(handles=[Patch(color=fill, label=label) for _, label, fill in BREAKDOWN_PARTS],
              loc="upper left", bbox_to_anchor=(1.01, 1))
    save_png(fig, path)


def draw_top(job: str, top: dict[str, Any], path: Path) -> None:
    """Horizontal bars of the top kernels (total time) or CPU ops (self time)."""
    kernels = top["what"] == "kernels"
    key = "total_ns" if kernels else "self_ns"
    rs = top["rows"]
    fig = figure(11, max(3, 0.35 * len(rs) + 1.5))
    ax = fig.add_subplot()
    y = list(range(len(rs)))
    cats = [r.get("category") or "other" for r in rs] if kernels else ["cpu"] * len(rs)
    ax.barh(y, [r[key] / 1e6 for r in rs], color=[colour(c) for c in cats])
    # names shortened as TensorBoard does, kept distinct (the tables keep them whole)
    ax.set_yticks(y, short_names([r["name"] for r in rs]), fontsize=8)
    ax.invert_yaxis()
    if kernels:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=colour(c), label=printable(c))
                           for c in dict.fromkeys(cats)],
                  loc="lower right", fontsize=8)
        ax.set_xlabel("total time over all ranks (ms)")
        ax.set_title(f"{job}: top kernels by total time")
    else:
        ax.set_xlabel("self time over all ranks (ms)")
        ax.set_title(f"{job}: top CPU ops by self time (no GPU kernels)")
    save_png(fig, path)


def draw_memory(job: str, mem: dict[str, Any], path: Path) -> None:
    """Allocated (solid) and reserved (dashed) memory over one step of one rank, a line per
    device: a step function, as the allocator's levels hold until its next event."""
    fig = figure(11, 4.5)
    ax = fig.add_subplot()
    for s in mem["series"]:
        line, = ax.step(s["ms"], s["allocated_mb"], where="post",
                        label=f"{printable(s['device'])} allocated")
        if any(v is not None for v in s["reserved_mb"]):
            ax.step(s["ms"], [np.nan if v is None else v for v in s["reserved_mb"]],
                    where="post", linestyle="--", color=line.get_color(),
                    label=f"{printable(s['device'])} reserved")
    ax.set_xlabel(f"ms from the start of step {mem['step']}")
    ax.set_ylabel("MB" + (" (relative: no allocator totals)" if mem["relative"] else ""))
    ax.set_title(f"{job}: memory over step {mem['step']} of rank {mem['rank']} "
                 "(the step of its highest peak)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    save_png(fig, path)


def draw_skew(job: str, ranks: list[int], grid: np.ndarray, path: Path) -> None:
    """Heatmap of ranks x collective instances (in time order); colour = how long the rank
    waited for the last one to arrive (ms; NaN where the rank has no call)."""
    fig = figure(min(20, max(7, 0.25 * grid.shape[1] + 3)),
                  min(MOST_INCHES, max(3, 0.35 * len(ranks) + 2)))
    ax = fig.add_subplot()
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis",
                   interpolation="nearest")
    shown = _every(len(ranks))
    ax.set_yticks(shown, [f"rank {ranks[i]}" for i in shown])
    ax.set_xlabel("collective instance, in order of first arrival")
    ax.set_title(f"{job}: wait at collectives (last arrival - own arrival)")
    fig.colorbar(im, ax=ax, label="wait (ms)")
    save_png(fig, path)


def _rectangles(x0: np.ndarray, x1: np.ndarray, y0: np.ndarray, y1: np.ndarray
                ) -> np.ndarray:
    """The corners of axis-aligned bars, as PolyCollection takes them."""
    return np.stack([np.stack([x0, y0], 1), np.stack([x0, y1], 1), np.stack([x1, y1], 1),
                     np.stack([x1, y0], 1)], 1)


def draw_critical_path(bars: dict[str, Any], job: str, out: Path) -> None:
    """Timeline of the critical path: one lane per rank, segments coloured by kind; one
    polygon collection per kind over the bars of ``report.critical_path_bars`` (at most a
    few per pixel column and lane, however long the path)."""
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    ranks, kinds = bars["ranks"], bars["kinds"]
    fig = figure(12, min(MOST_INCHES, max(3, 0.5 * len(ranks) + 2)))
    ax = fig.add_subplot()
    colours = [colour(k) for k in kinds]  # one palette: a kind's colour never moves
    x0, x1 = bars["start_ns"] / 1e6, (bars["start_ns"] + bars["dur_ns"]) / 1e6
    verts = _rectangles(x0, x1, bars["lane"] - 0.4, bars["lane"] + 0.4)
    for i, fill in enumerate(colours):
        mine = bars["kind"] == i
        if mine.any():
            # faces only: an outline would paint a sub-pixel bar a pixel wide, so a kind
            # with many short segments would cover the lane; each kind's area is its time
            ax.add_collection(PolyCollection(verts[mine], facecolors=fill, linewidths=0))
    ax.autoscale_view()
    for start in bars["steps_ns"][1:]:
        ax.axvline(start / 1e6, color="black", linestyle=":", linewidth=0.8)
    shown = _every(len(ranks))
    ax.set_yticks(shown, ["no rank" if ranks[i] is None else f"rank {ranks[i]}"
                          for i in shown])
    ax.set_xlabel("ms since the path's start (dotted: a new step begins)")
    ax.set_title(f"{job}: critical path")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in zip(kinds, colours, strict=True)],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    save_png(fig, out)


def draw_step_timeline(t: dict[str, Any], out: Path) -> None:
    """The step's lanes (``step_timeline.timeline_data``): bars by category, CPU ops of the
    outer level full height and what they call half height below, the critical path as a
    black line under the lane it ran on."""
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.patches import Patch

    lanes, span_ms = t["lanes"], t["span_ms"]
    fig = figure(13, max(3.0, 0.42 * len(lanes) + 1.6))
    ax = fig.add_subplot()
    lane, x0, x1, what = t["lane"], t["x0"], t["x1"], t["what"]
    h = np.where((what == "cpu") & (t["depth"] > 0), 0.35, 0.7)
    y0 = np.where(h < 0.7, lane, lane - 0.35)
    # CPU ops (and GPU annotations) first, underneath: a kernel is never hidden by them
    whats = sorted(set(what.tolist()), key=lambda w: (w != "cpu", w))
    for w in whats:
        m = what == w
        ax.add_collection(PolyCollection(_rectangles(x0[m], x1[m], y0[m], y0[m] + h[m]),
                                         facecolors=colour(w), linewidths=0,
                                         alpha=0.55 if w == "cpu" else 1.0))
    handles = [Patch(color=colour(w), label=printable(w)) for w in whats]
    if len(t["path_lane"]):  # the path: a black line under the lane it ran on
        y = t["path_lane"] + 0.42
        ax.add_collection(LineCollection(
            np.stack([np.stack([t["path_x0"], y], 1), np.stack([t["path_x1"], y], 1)], 1),
            colors="black", linewidths=2.2, capstyle="butt"))
        handles.append(Patch(color="black", label="critical path"))
    ax.set_xlim(0, span_ms)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(lanes)), [f"rank {r} · {printable(n)}"[:48] for r, n in lanes],
                  fontsize=8)  # thread names are hostile text: escapes, not missing glyphs
    ax.set_xlabel(t["xlabel"])
    ax.set_title(printable(t["title"]), fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    save_png(fig, out)


def draw_roofline(job: str, eff: dict[str, Any], path: Path) -> None:
    """Achieved TFLOP/s against arithmetic intensity, one point per op and shape (area by
    its kernel time, colour by op class), under the GPU's roofline for the dtype with most
    time: the peak (solid) and the achievable fractions replay's roofline uses (dashed)."""
    roof, pts = eff["roofline"], eff["points"]
    fig = figure(10, 6)
    ax = fig.add_subplot()
    xs = np.array([p["intensity"] for p in pts])
    grid = np.logspace(np.log10(min(xs.min(), roof["ridge"]) / 4),
                       np.log10(max(xs.max(), roof["ridge"]) * 4), 200)
    ax.loglog(grid, np.minimum(roof["peak_tflops"], grid * roof["peak_tbps"]), color="black",
              lw=1.2, label=f"peak ({roof['runs_at'].upper()}, HBM)")
    ax.loglog(grid, np.minimum(roof["achievable_tflops"], grid * roof["achievable_tbps"]),
              color="black", lw=1, ls="--", label="achievable (replay's roofline)")
    most = max(p["total_ns"] for p in pts)
    for cat in dict.fromkeys(p["category"] or "other" for p in pts):
        mine = [p for p in pts if (p["category"] or "other") == cat]
        ax.scatter([p["intensity"] for p in mine], [p["achieved_tflops"] for p in mine],
                   s=[20 + 300 * p["total_ns"] / most for p in mine], color=colour(cat),
                   alpha=0.75, edgecolors="white", linewidths=0.5, label=printable(cat))
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(printable(f"{job}: ops against the {eff['gpu_name']} roofline "
                           f"({roof['dtype'].upper()}; area: kernel time)"))
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    save_png(fig, path)


DRAWINGS = ("draw_breakdown", "draw_top", "draw_skew", "draw_memory", "draw_critical_path",
            "draw_step_timeline", "draw_roofline")

if __name__ == "__main__":
    _serve()
