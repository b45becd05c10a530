"""Replay accuracy: the figures README.md quotes, printed from the traces themselves.

1. Network ground truth (sample_traces/netlab): each setting's trace projected onto every
   other setting's network; mean projected step vs the mean step measured there.
2. Cross-GPU (needs ../shared/traces): the bert-small trace of an H100 projected onto an
   MI300X against the MI300X's own trace of the same model, and back; step time and GPU
   kernel time (the mean projected compute of the breakdown).

    python benchmarks/replay_accuracy.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import tracetool
from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay import Replayer, Scenario, parse_network, resolve_gpu

REPO = Path(__file__).resolve().parent.parent
NETLAB = REPO / "sample_traces" / "netlab"
BERT = REPO.parent / "shared/traces/AMD-AGI__TraceLens/tests/traces"
SETTINGS = ("2gbit", "1gbit", "500mbit", "200mbit")


def _mean(values: list[float]) -> float:
    return float(np.mean(values))


def network_matrix(store: Path) -> None:
    for s in SETTINGS:
        ingest([NETLAB / f"bw_{s}"], Options(store=store, job=f"netlab_{s}"))
    con = tracetool.connect(store)
    spec = {k: v["network_spec"] for k, v in
            json.loads((NETLAB / "measured.json").read_text())["settings"].items()}
    replayers = {s: Replayer.from_store(con, f"netlab_{s}") for s in SETTINGS}
    measured = {s: _mean([x.measured_ns for x in replayers[s].run(critical_path=False).steps])
                for s in SETTINGS}
    print("network ground truth: rows traced under, columns projected onto (error of the "
          "mean step)")
    print(f"{'':10}" + "".join(f"{s:>10}" for s in SETTINGS))
    worst = 0.0
    for src in SETTINGS:
        row = []
        for dst in SETTINGS:
            res = replayers[src].run(Scenario(source_network=parse_network(spec[src]),
                                              network=parse_network(spec[dst])),
                                     critical_path=False)
            err = _mean([x.projected_ns for x in res.steps]) / measured[dst] - 1
            worst = max(worst, abs(err))
            row.append(f"{100 * err:+9.1f}%")
        print(f"{src:10}" + "".join(row))
    print("measured mean steps, ms: " + ", ".join(f"{s} {measured[s] / 1e6:.1f}"
                                                  for s in SETTINGS))
    print(f"worst |error|: {100 * worst:.1f}%")


def cross_gpu(store: Path) -> None:
    files = {"h100": BERT / "h100/gaunernst_bert-small-uncased__1016001.json.gz",
             "mi300x": BERT / "mi300/gaunernst_bert-small-uncased__1016001.json.gz"}
    if not all(f.is_file() for f in files.values()):
        print("cross-GPU: skipped (../shared/traces not found)")
        return
    for key, f in files.items():
        ingest([f], Options(store=store, job=f"bert_{key}", rank=0))
    con = tracetool.connect(store)
    r = {k: Replayer.from_store(con, f"bert_{k}") for k in files}
    own = {k: r[k].run().steps[0] for k in files}
    print("cross-GPU, bert-small (one step):")
    for src, dst in (("h100", "mi300x"), ("mi300x", "h100")):
        p = r[src].run(Scenario(gpu=resolve_gpu(dst))).steps[0]
        m = own[dst]
        print(f"  {src} -> {dst}: step {p.projected_ns / 1e6:.3f} ms vs {m.measured_ns / 1e6:.3f}"
              f" ({100 * (p.projected_ns / m.measured_ns - 1):+.1f}%); GPU compute "
              f"{p.projected['compute'] / 1e6:.3f} ms vs {m.measured['compute'] / 1e6:.3f} "
              f"({100 * (p.projected['compute'] / m.measured['compute'] - 1):+.0f}%)")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        network_matrix(Path(tmp) / "netlab")
        cross_gpu(Path(tmp) / "bert")
    return 0


if __name__ == "__main__":
    sys.exit(main())
