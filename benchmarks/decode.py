"""Decode benchmark: one core turning pieces of a trace into Arrow tables, both decoders.

Why: decoding is the per-byte hot path of ingest. The general decoder (msgspec into typed
Python objects, then columns) and the compiled scanner (``ingest/fastpath.py``: byte spans
and exact integers, then one gather per column) must build identical tables; this prints how
fast each does it on the same pieces, in this process, and the ratio. The compiled code is
loaded before timing (ingest does that once, before forking its workers).

    python benchmarks/decode.py                  # 200 MB generated trace, 16 MB pieces
    python benchmarks/decode.py --size 50MB --runs 3 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ingest import cached_trace  # noqa: E402  (sibling script)
from tracetool.ingest import decode, fastpath  # noqa: E402
from tracetool.ingest.source import SourceInfo, pieces  # noqa: E402


def _time(texts: list, fast: bool) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter()
        for text, is_first, is_last in texts:
            decode.decode_piece(text, 0, is_first, is_last, fast=fast)
        return time.perf_counter() - t0
    finally:
        gc.enable()


def _scan_split(texts: list) -> tuple[float, float]:
    """Seconds in the scanner kernel and in building the columns, over the scanned pieces."""
    scan_s = tables_s = 0.0
    gc.disable()
    try:
        for text, _, is_last in texts:
            t0 = time.perf_counter()
            sc, _, _ = fastpath.scan(text, is_last)
            t1 = time.perf_counter()
            if sc is not None:
                fastpath.fast_tables(sc)
            scan_s, tables_s = scan_s + t1 - t0, tables_s + time.perf_counter() - t1
    finally:
        gc.enable()
    return scan_s, tables_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="200MB")
    ap.add_argument("--piece-mb", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    path = cached_trace(a.size)
    info = SourceInfo(path=path)
    texts = [(p.load(), p.is_first, p.is_last) for p in pieces(info, a.piece_mb << 20)]
    mb = sum(len(t) for t, _, _ in texts) / 1e6
    n_fast = sum(fastpath.scan(t, last)[0] is not None for t, _, last in texts)
    fastpath.warm()
    general = [_time(texts, False) for _ in range(a.runs)]
    fast = [_time(texts, True) for _ in range(a.runs)]
    split = [_scan_split(texts) for _ in range(a.runs)]
    g, f = statistics.median(general), statistics.median(fast)
    scan_s = statistics.median(x for x, _ in split)
    tables_s = statistics.median(y for _, y in split)
    out = {"trace": path.name, "mb": round(mb, 1), "pieces": len(texts),
           "pieces_scanned": n_fast, "runs": a.runs,
           "general_s": round(g, 3), "fast_s": round(f, 3),
           "general_mb_s": round(mb / g, 1), "fast_mb_s": round(mb / f, 1),
           "speedup": round(g / f, 2),
           "scan_ms_per_piece": round(scan_s / len(texts) * 1000, 1),
           "columns_ms_per_piece": round(tables_s / len(texts) * 1000, 1)}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{out['trace']}: {mb:.0f} MB in {len(texts)} pieces ({n_fast} taken by the "
              f"scanner), one core, median of {a.runs}")
        print(f"  general (msgspec -> objects -> columns): {g:.3f} s  {mb / g:6.1f} MB/s")
        print(f"  fast (compiled scanner -> columns):      {f:.3f} s  {mb / f:6.1f} MB/s")
        print(f"  speedup: {g / f:.2f}x")
        print(f"  fast, per piece: scan {out['scan_ms_per_piece']} ms, columns "
              f"{out['columns_ms_per_piece']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
