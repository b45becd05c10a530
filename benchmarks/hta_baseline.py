"""Baseline: how fast HolisticTraceAnalysis (HTA) 0.5.0 loads one Kineto trace file.

Why: tracetool's ingest speed is only meaningful next to the tool people use today. HTA is
installed in its own cached venv (``benchmarks/.work/hta-venv``; ``pandas<3`` because HTA
0.5.0 crashes on pandas 3) so it never touches the project's environment, and each load runs
in a fresh subprocess so its time and peak memory are isolated.

    python benchmarks/hta_baseline.py TRACE.json [--json]
    python benchmarks/hta_baseline.py --generate 200MB --steps 129   # make + measure

``run_measured`` is shared with ``benchmarks/ingest.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
HTA_VENV = WORK / "hta-venv"
HTA_REQS = ["HolisticTraceAnalysis==0.5.0", "pandas<3"]
_MARKER = ".tracetool-hta-installed"

# Runs inside the HTA venv: time only the TraceAnalysis(...) constructor (imports excluded) and
# report what HTA actually loaded, so a silently empty load can't pass for a fast one.
_CHILD = r"""
import json, resource, sys, time, logging
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
ranks = a.t.get_ranks()
df = a.t.get_trace(ranks[0])
its = sorted(int(i) for i in df["iteration"].unique() if i >= 0) if "iteration" in df else []
print("HTA_RESULT " + json.dumps({
    "import_seconds": t1 - t0, "load_seconds": t2 - t1, "ranks": ranks,
    "rows": int(len(df)), "iterations": len(its),
    "self_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""


@dataclass
class RunResult:
    """Outcome of one measured subprocess."""

    returncode: int
    seconds: float  # wall clock of the whole subprocess
    maxrss_mb: float  # largest single process in the tree (wait4 ru_maxrss)
    tree_peak_rss_mb: float  # peak of the summed RSS of the process tree (sampled /proc)
    tree_peak_pss_mb: float  # the same with PSS: shared and copy-on-write pages counted once
    stdout: str
    stderr: str


def _tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc (Linux only)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _tree_rss_pss_kb(root: int) -> tuple[int, int]:
    """Summed RSS and PSS (kB) of `root` and its descendants. RSS counts a page once per
    process that maps it, so forked workers sharing their parent's pages inflate it; PSS
    splits each shared page between its sharers, so the sum is the tree's real footprint."""
    rss = pss = 0
    for p in _tree(root):
        try:
            with open(f"/proc/{p}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith(b"Pss:"):
                        pss += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return rss, pss


def run_measured(
    cmd: list[str], timeout: float | None = None, env: dict[str, str] | None = None,
    sample_interval: float | None = 0.1,
) -> RunResult:
    """Run `cmd`, returning wall time and peak RSS of it and its descendants.

    wait4() gives the kernel's exact per-process peak (max over the tree); a sampler thread adds
    the summed RSS of the whole tree, which is what matters with parallel workers. The sampler
    slows what it measures (reading smaps_rollup walks each process's page tables under its
    memory-map lock: ingest of 1 GB took ~8% longer sampled), so ``sample_interval=None``
    runs without it, for timing."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        peak = [0, 0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                rss, pss = _tree_rss_pss_kb(p.pid)
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
                stop.wait(sample_interval)

        th = threading.Thread(target=sample, daemon=True)
        if sample_interval is not None:
            th.start()
        deadline = None if timeout is None else t0 + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.perf_counter() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.01)
        seconds = time.perf_counter() - t0
        stop.set()
        if th.is_alive():
            th.join()
        p.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from re-waiting
        out.seek(0)
        err.seek(0)
        return RunResult(
            returncode=p.returncode,
            seconds=seconds,
            maxrss_mb=(ru.ru_maxrss / 1024) if ru else 0.0,
            tree_peak_rss_mb=max(peak[0], ru.ru_maxrss if ru else 0) / 1024,
            tree_peak_pss_mb=peak[1] / 1024,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
        )


def ensure_hta_venv(quiet: bool = True) -> Path:
    """Create (once) the isolated HTA venv; returns its python. Cached by a marker file that
    records the requirement list, so changing HTA_REQS rebuilds it."""
    py = HTA_VENV / "bin" / "python"
    marker = HTA_VENV / _MARKER
    want = json.dumps(HTA_REQS)
    if py.exists() and marker.exists() and marker.read_text() == want:
        return py
    WORK.mkdir(parents=True, exist_ok=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    if quiet:
        pip.append("-q")
    print(f"installing {' '.join(HTA_REQS)} into {HTA_VENV} ...", file=sys.stderr)
    subprocess.run(pip + HTA_REQS, check=True)
    marker.write_text(want)
    return py


@dataclass
class HtaResult:
    """One HTA load of one trace file."""

    path: str
    file_bytes: int  # on disk
    uncompressed_bytes: int
    load_seconds: float  # TraceAnalysis(trace_dir=...) constructor only
    wall_seconds: float  # whole subprocess, incl. interpreter start + pandas/HTA import
    peak_rss_mb: float
    rows: int  # events in HTA's dataframe for the rank
    iterations: int  # ProfilerStep iterations HTA recognised
    ok: bool
    error: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float:
        """Uncompressed MB per second of load time."""
        return self.uncompressed_bytes / 1e6 / self.load_seconds if self.load_seconds else 0.0


def uncompressed_size(path: Path) -> int:
    """Size of the JSON text (streams through gzip files without holding them)."""
    if path.suffix != ".gz":
        return path.stat().st_size
    import gzip

    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            n += len(chunk)
    return n


def measure_hta(trace: str | Path, timeout: float = 1800.0) -> HtaResult:
    """Time HTA's TraceAnalysis load of `trace`, placed alone (symlinked as rank-0.json[.gz])
    in a temp dir because HTA loads every trace file of a directory."""
    trace = Path(trace).resolve()
    py = ensure_hta_venv()
    size = trace.stat().st_size
    raw = uncompressed_size(trace)
    with tempfile.TemporaryDirectory(prefix="hta-") as d:
        link = Path(d) / ("rank-0.json.gz" if trace.suffix == ".gz" else "rank-0.json")
        link.symlink_to(trace)
        r = run_measured([str(py), "-c", _CHILD, d], timeout=timeout)
    line = next((s for s in r.stdout.splitlines() if s.startswith("HTA_RESULT ")), None)
    if r.returncode != 0 or line is None:
        tail = (r.stderr or r.stdout).strip().splitlines()[-5:]
        return HtaResult(str(trace), size, raw, 0.0, r.seconds, r.maxrss_mb, 0, 0, False,
                         f"exit {r.returncode}: " + " | ".join(tail))
    info = json.loads(line.split(" ", 1)[1])
    ok = info["rows"] > 0 and info["iterations"] > 0
    return HtaResult(
        str(trace), size, raw, info["load_seconds"], r.seconds,
        max(r.maxrss_mb, info["self_maxrss_kb"] / 1024), info["rows"], info["iterations"], ok,
        "" if ok else "HTA loaded no events/iterations",
        {"import_seconds": info["import_seconds"], "ranks": info["ranks"]},
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: measure one file, or generate one (cached in benchmarks/.work) and measure it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", help="trace file (.json or .json.gz)")
    ap.add_argument("--generate", metavar="SIZE", help="generate a trace of SIZE (e.g. 200MB)")
    ap.add_argument("--steps", type=int, default=129)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    if bool(a.trace) == bool(a.generate):
        ap.error("give a trace file or --generate SIZE")
    trace = Path(a.trace) if a.trace else None
    if a.generate:
        sys.path.insert(0, str(HERE))
        from ingest import cached_trace  # sibling script, not a package

        trace = cached_trace(a.generate, a.steps, a.seed, gz=False)
    assert trace is not None
    res = measure_hta(trace, a.timeout)
    if a.json:
        print(json.dumps({**asdict(res), "mb_per_s": res.mb_per_s}))
    elif res.ok:
        print(f"HTA 0.5.0 load of {res.path}\n"
              f"  {res.uncompressed_bytes / 1e6:.1f} MB, {res.rows} rows, "
              f"{res.iterations} iterations\n"
              f"  load {res.load_seconds:.1f} s -> {res.mb_per_s:.2f} MB/s "
              f"(subprocess wall {res.wall_seconds:.1f} s), peak RSS {res.peak_rss_mb:.0f} MB")
    else:
        print(f"HTA failed on {res.path}: {res.error}", file=sys.stderr)
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
