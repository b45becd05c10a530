"""Replay accuracy: the figures README.md quotes, printed from the traces themselves.

1. Network ground truth (sample_traces/netlab): per job (2-rank DDP, 4-rank DDP,
   all-to-all), each setting's trace projected onto every other setting's network; mean
   projected step vs the mean step measured there, the worst error, and which sources have
   collective calls the model cannot price.
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


def _mean(values: list[float]) -> float:
    return float(np.mean(values))


def netlab_families() -> dict[str, list[str]]:
    """The netlab settings by job (traces that replay onto each other's networks), in
    measured.json's order: the 2-rank DDP job, the 4-rank DDP job, the all-to-all job."""
    settings = json.loads((NETLAB / "measured.json").read_text())["settings"]
    out: dict[str, list[str]] = {}
    for name, s in settings.items():
        out.setdefault(f"{s['pattern']}, {s['world_size']} ranks", []).append(name)
    return out


def unmatched_collectives(con: object, job: str) -> int:
    """Collective calls of ``job`` the replay graph cannot price: not matched across ranks
    (instance NULL), or with no linked transfer span (kernel or gloo span): they keep their
    measured time under any network."""
    return con.execute(  # type: ignore[attr-defined]
        """SELECT count(*) FROM collective_ranks WHERE job = ? AND (instance IS NULL
           OR coalesce(kernel_eid, gloo_eid) IS NULL)""", [job]).fetchone()[0]


def network_matrix(store: Path) -> None:
    settings = json.loads((NETLAB / "measured.json").read_text())["settings"]
    for name, s in settings.items():
        ingest([NETLAB / s["dir"]], Options(store=store, job=f"netlab_{name}"))
    con = tracetool.connect(store)
    print("network ground truth (sample_traces/netlab): rows traced under, columns projected "
          "onto; error of the mean projected step against the mean step measured there")
    for family, names in netlab_families().items():
        replayers = {s: Replayer.from_store(con, f"netlab_{s}") for s in names}
        measured = {s: _mean([x.measured_ns for x in r.run(critical_path=False).steps])
                    for s, r in replayers.items()}
        unmatched = {s: unmatched_collectives(con, f"netlab_{s}") for s in names}
        width = max(len(s) for s in names) + 2
        print(f"\n{family}:")
        print(" " * width + "".join(f"{s:>{width}}" for s in names))
        worst = {True: 0.0, False: 0.0}  # by: the source's collectives all priced
        covered, widths = 0, []  # the band (replay/band.py) against the measured mean step
        for src in names:
            row = []
            for dst in names:
                res = replayers[src].run(
                    Scenario(source_network=parse_network(settings[src]["network_spec"]),
                             network=parse_network(settings[dst]["network_spec"])),
                    critical_path=False)
                err = _mean([x.projected_ns for x in res.steps]) / measured[dst] - 1
                ok = not unmatched[src]
                worst[ok] = max(worst[ok], abs(err))
                lo, hi = (_mean([getattr(x, k) for x in res.steps]) for k in ("low_ns",
                                                                              "high_ns"))
                inside = lo <= measured[dst] <= hi
                covered += inside
                widths.append((hi - lo) / measured[dst])
                row.append(f"{100 * err:+{width - 2}.1f}%{' ' if inside else '!'}")
            print(f"{src:{width}}" + "".join(row))
        print("measured mean steps, ms: " + ", ".join(f"{s} {measured[s] / 1e6:.1f}"
                                                      for s in names))
        bad = {s: n for s, n in unmatched.items() if n}
        line = f"worst |error|: {100 * max(worst.values()):.2f}%"
        if bad and len(bad) < len(names):
            line += f"; {100 * worst[True]:.1f}% from sources whose collectives are all priced"
        if bad:
            line += ("; collective calls not priced (unmatched across ranks, or no transfer "
                     "span: kept as measured): " + ", ".join(f"{s} {n}" for s, n in bad.items()))
        print(line)
        print(f"band coverage: {covered} of {len(names) ** 2} ('!': the measured step is "
              f"outside the band), mean band width {100 * _mean(widths):.1f}% of the step")


def kernel_classes(src: Replayer, dst: Replayer, target: str) -> None:
    """Per kernel class: the source's time, projected onto the target, and measured there."""
    from tracetool.replay.model import op_factors

    g, gd = src.graph, dst.graph
    f, _ = op_factors(g, Scenario(gpu=resolve_gpu(target)))
    cat, dur = g.ops["category"].astype(str), g.ops["dur"]
    catd, durd = gd.ops["category"].astype(str), gd.ops["dur"]
    print(f"    {'class':12}{'kernels':>8}{'source us':>11}{'projected':>11}{'measured':>10}"
          f"{'error':>8}")
    for c in sorted(set(cat) | set(catd)):
        s_, d_ = cat == c, catd == c
        proj, meas = float((dur[s_] * f[s_]).sum()), float(durd[d_].sum())
        err = f"{100 * (proj / meas - 1):+.0f}%" if meas else "-"
        print(f"    {c:12}{int(s_.sum()):>8}{dur[s_].sum() / 1e3:>11.1f}{proj / 1e3:>11.1f}"
              f"{meas / 1e3:>10.1f}{err:>8}")


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
        inside = p.low_ns <= m.measured_ns <= p.high_ns
        print(f"  {src} -> {dst}: step {p.projected_ns / 1e6:.3f} ms vs {m.measured_ns / 1e6:.3f}"
              f" ({100 * (p.projected_ns / m.measured_ns - 1):+.1f}%), band "
              f"[{p.low_ns / 1e6:.3f}, {p.high_ns / 1e6:.3f}] "
              f"({'covers' if inside else 'MISSES'} the measured step, width "
              f"{100 * (p.high_ns - p.low_ns) / m.measured_ns:.1f}%); GPU compute "
              f"{p.projected['compute'] / 1e6:.3f} ms vs {m.measured['compute'] / 1e6:.3f} "
              f"({100 * (p.projected['compute'] / m.measured['compute'] - 1):+.0f}%)")
        kernel_classes(r[src], r[dst], dst)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        network_matrix(Path(tmp) / "netlab")
        cross_gpu(Path(tmp) / "bert")
    return 0


if __name__ == "__main__":
    sys.exit(main())
