"""How much a second process helps on this machine, for the kinds of work ingest does.

Ingest decodes pieces on a process pool, so its speed-up from N cores is bounded by how well
the machine runs N processes at once. This prints, for a memory-bound job (large array copies),
a CPU-bound Python loop and a JSON decode (msgspec), the seconds of one job alone and of two
at once, and the throughput ratio two processes give (2.0 = perfect scaling).

    python benchmarks/machine.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

import msgspec
import numpy as np


def copy_job(_: int) -> float:
    a = np.ones(50_000_000, dtype=np.uint8)
    b = np.empty_like(a)
    t = time.perf_counter()
    for _ in range(40):
        np.copyto(b, a)
    return time.perf_counter() - t


def loop_job(_: int) -> float:
    t = time.perf_counter()
    s = 0
    for i in range(15_000_000):
        s += i * i
    return time.perf_counter() - t


_DOC = json.dumps([{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7,
                    "ts": 4458676983543.183 + i, "dur": 41.407,
                    "args": {"correlation": i, "grid": [512, 1, 1]}} for i in range(200_000)]
                  ).encode()


def decode_job(_: int) -> float:
    t = time.perf_counter()
    for _ in range(5):
        msgspec.json.decode(_DOC)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    print(f"{'job':8} {'1 process s':>12} {'2 at once s':>12} {'throughput x':>13}")
    with ctx.Pool(2) as pool:
        for job in (copy_job, loop_job, decode_job):
            one = statistics.median(job(0) for _ in range(a.runs))
            two = statistics.median(max(pool.map(job, [0, 1])) for _ in range(a.runs))
            print(f"{job.__name__[:-4]:8} {one:12.2f} {two:12.2f} {2 * one / two:13.2f}")


if __name__ == "__main__":
    main()
