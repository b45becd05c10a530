"""Ingest benchmark: how fast `tracetool ingest` turns Kineto JSON into the Parquet store.

Why: ingest speed is a headline requirement, so it is measured the way users run it (a
subprocess of the real CLI, median of several runs, peak memory of the whole process tree)
on generated traces of realistic shape, next to two reference points on the same file:
HolisticTraceAnalysis 0.5.0's load and a bare in-process ``json.load``.

Inputs are generated once and cached in ``benchmarks/.work/``: 200 MB and 1 GB ``.json``
and a ``.json.gz`` of 200 MB uncompressed, all with 129 ProfilerSteps.

    python benchmarks/ingest.py                 # everything, 3 runs each
    python benchmarks/ingest.py --quick         # 200 MB cases only, no HTA
    python benchmarks/ingest.py --runs 5 --workers 2 --json

Contract used: ``python -m tracetool ingest PATH --store DIR --force --json [--workers N]``
prints one JSON object per file with at least ``events_read``, ``events_stored``,
``events_quarantined``, ``path``, ``job``, ``rank``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / ".work"
sys.path.insert(0, str(HERE))

import gen_trace  # noqa: E402  (sibling scripts, not a package)
import hta_baseline  # noqa: E402

STEPS = 129


def _label(size: str) -> str:
    return size.replace(" ", "").upper()


def cached_trace(size: str, steps: int = STEPS, seed: int = 0, gz: bool = False) -> Path:
    """Path of a generated trace, generating it only if missing or from an older generator."""
    WORK.mkdir(parents=True, exist_ok=True)
    stem = f"trace-{_label(size)}-s{steps}-seed{seed}-v{gen_trace.GEN_VERSION}"
    path = WORK / (stem + (".json.gz" if gz else ".json"))
    meta = path.with_name(path.name + ".meta.json")
    if path.exists() and meta.exists():
        try:
            if json.loads(meta.read_text()).get("gen_version") == gen_trace.GEN_VERSION:
                return path
        except (OSError, ValueError):
            pass
    print(f"generating {path.name} ...", file=sys.stderr, flush=True)
    st = gen_trace.generate(path, gen_trace.parse_size(size), steps, seed, use_gzip=gz)
    meta.write_text(json.dumps(asdict(st)))
    print(f"  {st.bytes / 1e6:.1f} MB, {st.events} events in {st.seconds:.1f} s "
          f"({st.mb_per_s:.0f} MB/s)", file=sys.stderr, flush=True)
    return path


def trace_meta(path: Path) -> dict:
    """Generator stats of a cached trace (uncompressed bytes, events, ...)."""
    return json.loads(path.with_name(path.name + ".meta.json").read_text())


def _json_objects(text: str) -> list[dict]:
    """All top-level JSON objects in `text` (one per line or pretty-printed, log lines ok)."""
    dec, objs, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(obj, dict):
            objs.append(obj)
        i = end
    return objs


@dataclass
class CaseResult:
    """All runs of one input file."""

    case: str
    path: str
    uncompressed_bytes: int
    file_bytes: int
    gen_events: int
    seconds: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0  # summed RSS of the process tree (the sampled run)
    peak_pss_mb: float = 0.0  # summed PSS (shared pages counted once; the sampled run)
    max_process_rss_mb: float = 0.0  # largest single process, max over runs
    events_read: int | None = None
    events_stored: int | None = None
    events_quarantined: int | None = None
    json_load_seconds: float | None = None
    hta: dict | None = None  # HTA's load of the same (uncompressed) trace
    error: str = ""
    stage_seconds: dict[str, list[float]] = field(default_factory=dict)  # from --json timings

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.uncompressed_bytes / 1e6 / self.median if self.median else 0.0

    @property
    def events_per_s(self) -> float:
        return (self.events_read or 0) / self.median if self.median else 0.0

    def summary(self) -> dict:
        """Flat dict for --json output."""
        hta_mb_s = self.hta["mb_per_s"] if self.hta else None
        d = asdict(self)
        d.update(
            median_seconds=self.median,
            mb_per_s=self.mb_per_s,
            events_per_s=self.events_per_s,
            vs_hta=(self.mb_per_s / hta_mb_s) if hta_mb_s and self.mb_per_s else None,
            vs_json_load=(self.json_load_seconds / self.median)
            if self.json_load_seconds and self.median else None,
        )
        return d


def run_ingest(cmd: list[str], path: Path, workers: int | None, timeout: float,
               sample_memory: bool) -> tuple:
    """One `tracetool ingest` run into a fresh store: (RunResult, report dict or None).
    Timed runs go unsampled; the memory sampler slows the run it watches."""
    store = Path(tempfile.mkdtemp(prefix="store-", dir=WORK))
    try:
        argv = [*cmd, "ingest", str(path), "--store", str(store), "--force", "--json"]
        if workers:
            argv += ["--workers", str(workers)]
        r = hta_baseline.run_measured(argv, timeout=timeout,
                                      sample_interval=0.1 if sample_memory else None)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    reports = [o for o in _json_objects(r.stdout) if "events_read" in o]
    return r, (reports[0] if reports else None)


_JSON_LOAD = """
import gzip, json, sys, time
path = sys.argv[1]
t = time.perf_counter()
with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
    json.load(f)
print(time.perf_counter() - t)
"""


def time_json_load(path: Path, runs: int) -> float:
    """Median seconds of a plain json.load of the file (the floor any pure-Python approach
    starts from). It runs in a child process: loading 200 MB of JSON here would raise this
    process's RSS, which Linux hands down to every later child as its ru_maxrss."""
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _JSON_LOAD, str(path)], check=True,
                             capture_output=True, text=True).stdout
        times.append(float(out.strip().splitlines()[-1]))
    return statistics.median(times)


def hta_reference(size: str, seed: int, rerun: bool, timeout: float) -> dict | None:
    """HTA load on the file of this size, cached per trace file (~40 s for 200 MB, ~4 min
    for 1 GB). If HTA is too slow there (timeout), fall back to a 50 MB file of the same
    shape and say so."""
    for sz in (size, "50MB"):
        trace = cached_trace(sz, STEPS, seed, gz=False)
        cache = trace.with_name(trace.name + ".hta.json")
        if cache.exists() and not rerun:
            return json.loads(cache.read_text())
        print(f"measuring HTA 0.5.0 on {trace.name} (timeout {timeout:.0f} s) ...",
              file=sys.stderr, flush=True)
        res = hta_baseline.measure_hta(trace, timeout=timeout)
        d = {**asdict(res), "mb_per_s": res.mb_per_s, "size_label": sz,
             "note": "" if sz == size else f"HTA too slow on {size}; measured on {sz}"}
        if res.ok:
            cache.write_text(json.dumps(d))
            return d
        print(f"  HTA failed: {res.error}", file=sys.stderr)
    return None


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(
    results: list[CaseResult], runs: int, out: TextIO = sys.stdout
) -> None:
    """Readable summary table."""
    cols = ("case", "MB", "events_read", "median s", "MB/s", "Mev/s", "peak RSS MB",
            "peak PSS MB", "vs HTA", "vs json.load")
    rows = []
    for r in results:
        s = r.summary()
        rows.append((
            r.case, f"{r.uncompressed_bytes / 1e6:.0f}",
            "-" if r.events_read is None else str(r.events_read),
            _fmt(r.median or None, ".2f"), _fmt(r.mb_per_s or None, ".1f"),
            _fmt(r.events_per_s / 1e6 if r.events_per_s else None, ".2f"),
            _fmt(r.peak_rss_mb or None, ".0f"), _fmt(r.peak_pss_mb or None, ".0f"),
            _fmt(s["vs_hta"], ".1f") + ("x" if s["vs_hta"] else ""),
            _fmt(s["vs_json_load"], ".2f") + ("x" if s["vs_json_load"] else ""),
        ))
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]

    def fmt_row(row: tuple) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    line = fmt_row(cols)
    print(f"\ntracetool ingest, median of {runs} run(s)", file=out)
    print(line, file=out)
    print("-" * len(line), file=out)
    for row in rows:
        print(fmt_row(row), file=out)
    for r in results:
        if r.error:
            print(f"  ! {r.case}: {r.error}", file=out)
        elif r.events_read is not None and r.events_read != r.gen_events:
            print(f"  note {r.case}: events_read {r.events_read} != generated {r.gen_events}",
                  file=out)
        if r.stage_seconds:
            split = ", ".join(f"{k} {statistics.median(v):.2f}"
                              for k, v in r.stage_seconds.items())
            print(f"  stages {r.case} (median s): {split}", file=out)
        if r.json_load_seconds:
            print(f"  json.load {r.case}: {r.json_load_seconds:.2f} s "
                  f"({r.uncompressed_bytes / 1e6 / r.json_load_seconds:.1f} MB/s)", file=out)
    htas = {r.hta["path"]: r.hta for r in results if r.hta}
    for hta in htas.values():
        print(f"  HTA 0.5.0 TraceAnalysis load of {Path(hta['path']).name}: "
              f"{hta['load_seconds']:.1f} s = {hta['mb_per_s']:.2f} MB/s, peak RSS "
              f"{hta['peak_rss_mb']:.0f} MB, {hta['rows']} rows, {hta['iterations']} iterations"
              + (f" ({hta['note']})" if hta.get("note") else ""), file=out)
    if not htas:
        print("  HTA baseline: skipped", file=out)
    print("  'vs HTA' = MB/s ratio; 'vs json.load' = json.load seconds / ingest seconds "
          "(same file)", file=out)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per case (median reported)")
    ap.add_argument("--quick", action="store_true", help="skip the 1 GB case and HTA")
    ap.add_argument("--no-1gb", action="store_true", help="skip the 1 GB case")
    ap.add_argument("--no-hta", action="store_true", help="skip the HTA baseline")
    ap.add_argument("--no-json-load", action="store_true", help="skip the json.load reference")
    ap.add_argument("--rerun-hta", action="store_true", help="ignore the cached HTA result")
    ap.add_argument("--workers", type=int, default=None, help="passed to tracetool ingest")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per ingest run, seconds")
    ap.add_argument("--hta-timeout", type=float, default=600.0)
    ap.add_argument("--cmd", default=None,
                    help="command prefix instead of 'PYTHON -m tracetool' (shell-quoted)")
    ap.add_argument("--json", action="store_true",
                    help="print results as JSON on stdout (table goes to stderr)")
    a = ap.parse_args(argv)
    skip_1gb = a.quick or a.no_1gb
    skip_hta = a.quick or a.no_hta
    cmd = shlex.split(a.cmd) if a.cmd else [sys.executable, "-m", "tracetool"]

    cases = [("200MB.json", "200MB", False), ("200MB.json.gz", "200MB", True)]
    if not skip_1gb:
        cases.append(("1GB.json", "1GB", False))
    paths = {name: cached_trace(size, STEPS, a.seed, gz) for name, size, gz in cases}
    hta = {} if skip_hta else {size: hta_reference(size, a.seed, a.rerun_hta, a.hta_timeout)
                               for size in dict.fromkeys(size for _, size, _ in cases)}

    results: list[CaseResult] = []
    for name, size, _gz in cases:
        path = paths[name]
        meta = trace_meta(path)
        res = CaseResult(name, str(path), meta["bytes"], path.stat().st_size, meta["events"],
                         hta=hta.get(size))
        # the timed runs, then one run sampled for the tree's peak RSS / PSS
        for i in range(a.runs + 1):
            sampled = i == a.runs
            what = "memory run" if sampled else f"run {i + 1}/{a.runs}"
            print(f"{name}: {what} ...", file=sys.stderr, flush=True)
            r, rep = run_ingest(cmd, path, a.workers, a.timeout, sample_memory=sampled)
            if r.returncode != 0 or rep is None:
                tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-4:])
                res.error = f"exit {r.returncode}" + (
                    "" if rep or r.returncode else ", no JSON report") + (f": {tail}" if tail
                                                                          else "")
                break
            res.max_process_rss_mb = max(res.max_process_rss_mb, r.maxrss_mb)
            if sampled:
                res.peak_rss_mb, res.peak_pss_mb = r.tree_peak_rss_mb, r.tree_peak_pss_mb
                continue
            res.seconds.append(r.seconds)
            res.events_read = rep.get("events_read")
            res.events_stored = rep.get("events_stored")
            res.events_quarantined = rep.get("events_quarantined")
            for stage, sec in (rep.get("timings") or {}).items():
                res.stage_seconds.setdefault(stage, []).append(sec)
        if not a.no_json_load and name.startswith("200MB"):
            res.json_load_seconds = time_json_load(path, max(1, min(a.runs, 3)))
        results.append(res)

    doc = {
        "runs": a.runs, "workers": a.workers, "command": cmd,
        "cases": [r.summary() for r in results], "hta": hta,
    }
    (WORK / "last-ingest-results.json").write_text(json.dumps(doc, indent=1))
    print_table(results, a.runs, out=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps(doc))
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
