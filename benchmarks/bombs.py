"""Hostile inputs against `tracetool ingest`: each must end in seconds, bounded in memory
and disk, with a one-line error or a correct store (issue 12's reproducers); and hostile
option values (issue 32): small command lines that once built a 10^11-rank list, a world of
10^12 x 2 ranks or 100,000 worker processes, each now one line (or a capped run) at once.

Why: the budgets (--tmp-budget, --max-event-bytes, the preamble bound) are promises about
time, RSS and disk that only a real run on a real bomb can check; too slow and too big for
the test suite (which runs scaled-down versions). Each case is generated once into
``benchmarks/.work/bombs/`` and ingested by the real CLI in a subprocess, with the peak RSS
of the largest process (wait4), the peak summed RSS of the process tree (sampled) and the
peak size of ``STORE/.tmp`` (sampled), next to a normal trace of similar input size as the
baseline, in the same run.

The option values run against a store of the 2-rank gloo sample built once in the same
directory (``cli_*`` cases; the default runs both kinds).

    python benchmarks/bombs.py [--only gzip_events] [--only cli_ranks_range] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from isal import igzip

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "bombs"
sys.path.insert(0, str(HERE))

import gen_trace  # noqa: E402  (sibling scripts, not a package)
import hta_baseline  # noqa: E402

EVENT = (b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, '
         b'"dur": 1}')
HEAD = b'{"distributedInfo": {"rank": 0}, "traceEvents": [\n'


def _gzip_events(path: Path) -> None:
    """107 M identical events (10 GB of JSON) in a ~50 MB .json.gz."""
    chunk = (EVENT + b",\n") * 100_000
    with igzip.open(path, "wb", compresslevel=3) as f:
        f.write(HEAD)
        for _ in range(1070):
            f.write(chunk)
        f.write(EVENT + b"]}\n")


def _huge_string(path: Path) -> None:
    """Normal events around one event holding a 500 MB string."""
    with open(path, "wb") as f:
        f.write(HEAD)
        for _ in range(1000):
            f.write(EVENT + b",\n")
        f.write(b'{"ph": "X", "cat": "cpu_op", "name": "big", "pid": 1, "tid": 1, "ts": 7, '
                b'"dur": 1, "args": {"s": "')
        block = b"x" * (1 << 20)
        for _ in range(500):
            f.write(block)
        f.write(b'"}},\n')
        for _ in range(1000):
            f.write(EVENT + b",\n")
        f.write(EVENT + b"]}\n")


def _leading_whitespace(path: Path) -> None:
    """10 GB of spaces before the object (in a .json.gz of ~10 MB)."""
    block = b" " * (64 << 20)
    with igzip.open(path, "wb", compresslevel=3) as f:
        for _ in range(160):
            f.write(block)
        f.write(HEAD + EVENT + b"]}\n")


def _punctuation_name(path: Path) -> None:
    """A name of 17 MB of '}, {' among 888 normal events."""
    with open(path, "wb") as f:
        f.write(HEAD)
        for _ in range(443):
            f.write(EVENT + b",\n")
        f.write(b'{"ph": "X", "cat": "cpu_op", "name": "' + b"}, {" * (17 << 18) +
                b'", "pid": 1, "tid": 1, "ts": 6, "dur": 1},\n')
        for _ in range(443):
            f.write(EVENT + b",\n")
        f.write(EVENT + b"]}\n")


def _normal(path: Path) -> None:
    """The baseline: a generated trace of realistic shape, 500 MB."""
    gen_trace.generate(path, gen_trace.parse_size("500MB"), steps=40)


CASES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "normal_500MB": ("normal.json", _normal),
    "gzip_events": ("gzip_events.json.gz", _gzip_events),
    "huge_string": ("huge_string.json", _huge_string),
    "leading_whitespace": ("leading_ws.json.gz", _leading_whitespace),
    "punctuation_name": ("punctuation.json", _punctuation_name),
}


SAMPLE = HERE.parent / "sample_traces" / "ddp_gloo_2rank"
GLOO = ["--source-network", "gpus_per_node=1,inter_node_bw=1Gbit/s"]
# option values: (command, its arguments after the store; "{new}" is a fresh store directory)
CLI_CASES: dict[str, tuple[str, list[str]]] = {
    "cli_ranks_range": ("replay", [*GLOO, "--ranks", "0-99999999999"]),
    "cli_ranks_2e31": ("replay", [*GLOO, "--ranks", "0-2147483647"]),
    "cli_dp_scale": ("replay", [*GLOO, "--dp-scale", "1000000000000"]),
    "cli_dp_scale_job": ("replay", [*GLOO, "--dp-scale", "100000"]),
    "cli_gpus_per_node": ("replay", [*GLOO, "--network", "gpus_per_node=1e30"]),
    "cli_bw_overflow": ("replay", [*GLOO, "--network", "inter_node_bw=1e400Gbit/s"]),
    "cli_latency_overflow": ("replay", [*GLOO, "--network", "inter_node_latency=1e400s"]),
    "cli_window_overflow": ("replay", [*GLOO, "--window", "0ms:" + "9" * 5000 + "ms"]),
    "cli_sweep_two_keys": ("sweep", [*GLOO, "--network",
                                     "gpus_per_node=1,inter_node_bw=1,10,100Gbit/s",
                                     "--out", "{new}"]),
    "cli_workers": ("ingest", ["--workers", "100000"]),
}


def _cli_store() -> Path:
    store = WORK / "cli_store"
    if not store.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        tmp = WORK / "cli_store.part"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "tracetool", "ingest", str(SAMPLE), "--store",
                        str(tmp), "--workers", "1"], check=True, capture_output=True)
        tmp.rename(store)
    return store


def run_cli_case(name: str) -> dict:
    command, args = CLI_CASES[name]
    WORK.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix="cli-", dir=WORK)) / "out"
    args = [a.replace("{new}", str(new)) for a in args]
    if command == "ingest":  # into a fresh store: the workers really start
        argv = ["ingest", str(SAMPLE), "--store", str(new), *args]
    else:
        argv = [command, str(_cli_store()), *args]
    try:
        r = hta_baseline.run_measured([sys.executable, "-m", "tracetool", *argv], timeout=600)
    finally:
        shutil.rmtree(new.parent, ignore_errors=True)
    lines = (r.stdout + r.stderr).strip().splitlines()
    return {"case": name, "input_MB": 0.0, "exit": r.returncode, "seconds": round(r.seconds, 2),
            "max_process_rss_MB": round(r.maxrss_mb), "tree_rss_MB": round(r.tree_peak_rss_mb),
            "tmp_peak_MB": 0, "outcome": lines[-1][:160] if lines else ""}


def _input(name: str) -> Path:
    file_name, make = CASES[name]
    path = WORK / file_name
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        make(tmp)
        tmp.rename(path)
    return path


def _tmp_peak(store: Path, stop: threading.Event, peak: list[int]) -> None:
    from tracetool.ingest.budget import dir_bytes

    while not stop.is_set():
        peak[0] = max(peak[0], dir_bytes(store / ".tmp"))
        stop.wait(0.1)


def run_case(name: str) -> dict:
    path = _input(name)
    store = Path(tempfile.mkdtemp(prefix="store-", dir=WORK))
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_tmp_peak, args=(store, stop, peak), daemon=True)
    watcher.start()
    try:
        r = hta_baseline.run_measured([sys.executable, "-m", "tracetool", "ingest", str(path),
                                       "--store", str(store), "--rank", "0"], timeout=600)
    finally:
        stop.set()
        watcher.join()
        shutil.rmtree(store, ignore_errors=True)
    lines = (r.stdout + r.stderr).strip().splitlines()
    return {"case": name, "input_MB": round(path.stat().st_size / 1e6, 1),
            "exit": r.returncode, "seconds": round(r.seconds, 2),
            "max_process_rss_MB": round(r.maxrss_mb), "tree_rss_MB": round(r.tree_peak_rss_mb),
            "tmp_peak_MB": round(peak[0] / 1e6), "outcome": lines[-1][:160] if lines else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=[*CASES, *CLI_CASES], action="append")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [run_cli_case(n) if n in CLI_CASES else run_case(n)
            for n in (args.only or [*CASES, *CLI_CASES])]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    base = next((r for r in rows if r["case"] == "normal_500MB"), None)
    for r in rows:
        ratio = f"  ({r['seconds'] / base['seconds']:.2f}x the normal trace's time)" if (
            base and r is not base) else ""
        print(f"{r['case']:20} {r['input_MB']:8.1f} MB in  exit {r['exit']}  {r['seconds']:6.2f} s"
              f"  max RSS {r['max_process_rss_MB']:5} MB  tree RSS {r['tree_rss_MB']:5} MB  "
              f".tmp peak {r['tmp_peak_MB']:6} MB{ratio}\n    {r['outcome']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
