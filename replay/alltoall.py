"""Expert-parallel all-to-alls: per-pair bytes, priced by the busiest link, and routing skew.

An MoE layer's dispatch all-to-all sends each token to the rank of its expert, and the combine
sends it back; with skewed routing the pairs carry different bytes, and the all-to-all is paced
by the most loaded rank's link, not by the average ``S / n`` the uniform model
(``network.collective_time``) prices. Here:

- **Per-pair bytes** (``pair_bytes``): ``M[i, j]``, the bytes group rank i sends to group rank
  j, from the split sizes the trace records (``collectives.in_split_sizes``: NCCL's ``In split
  size``, gloo's ``c10d::alltoall_base_`` Concrete Inputs; rows, each ``in_bytes / sum(splits)``
  bytes). Without them (equal splits, ``[]``, or a rank that records none) the instance is
  uniform (``S / n`` per pair) and priced as before.
- **Pricing** (``alltoall_time``): every rank's link carries, per link class (intra-node,
  inter-node, across datacenters: the placement's, ``Network.levels``), the bytes it sends to
  and receives from the peers of that class; the busier direction paces it. NCCL: the model of
  ``network._all_to_all`` (grouped send/recv, batches of P2P_PER_BATCH peers, each class on its
  own link) with each rank's own load; gloo: ``transport.gloo_time``'s all-to-all (one
  rendezvous, the n - 1 connections sharing the rank's link) with each rank's own load per
  class, the inter-node and cross-datacenter bytes also sharing the rank's NIC. The slowest
  rank sets the time. A uniform matrix prices exactly as the uniform model for NCCL, and for
  gloo where a rank's peers are all of one link class (the uniform gloo model puts all of a
  rank's bytes on its slowest peer's rate; tests/test_expert_skew.py). An instance priced per
  pair on either side (recorded splits, or a skew's target) is priced so on both, so the
  source and the target use one model.
- **Routing skew** (``ExpertSkew``, ``--expert-skew``): expert e (one per rank of the group,
  as the job maps them) gets a share of every source rank's tokens proportional to ``1 / k^s``,
  k its popularity rank (1 = the hottest), s the Zipf exponent (0: uniform). The popularity
  order is given (``--expert-order r1,r2,...``, the ranks hottest first), else the trace's:
  the ranks by the tokens their experts received, most first (ties: the lower rank). Each
  source rank keeps the tokens it sent in the trace. ``skew_plan`` pairs a group's
  all-to-alls in each step as (dispatch, combine), in time order: an MoE layer's forward runs
  dispatch then combine, its backward the combine's gradient (which goes to the experts, like
  a dispatch) then the dispatch's. A dispatch's target is ``M'[s, e] = sent_s p_e``, a
  combine's ``M'[s, d] = received_d p_s``. The expert compute is the work on rank e between
  the end of its dispatch and the start of its combine; it is scaled by the tokens the expert
  receives, target over traced (per-token work: a grouped GEMM's rows).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import numpy as np

from .compute import WhatIfError
from .network import BASE_US, LEVELS, P2P_PER_BATCH, Network
from .transport import GLOO_MAX_SEGMENT, TCP_WINDOW, path, slow_start_extra, tcp_rate

# --expert-skew's Zipf exponent: 0 (uniform) to this (at 8 the hottest of 2 experts takes
# 99.6%: beyond, every expert but one gets nothing that can be told from it)
MAX_ZIPF = 8.0


def parse_splits(text: str | None) -> list[int] | None:
    """Split sizes as ingest stores them ('[248, 117, 180, 479]'); None for none or '[]'."""
    if not text:
        return None
    try:
        v = json.loads(text)
    except ValueError:
        return None
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and x >= 0 for x in v):
        return None
    return v


def pair_bytes(n: int, splits: dict[int, tuple[str | None, float | None]],
               members: list[int]) -> np.ndarray | None:
    """``M[i, j]``: bytes group rank ``members[i]`` sends to ``members[j]``, from each member's
    (in_split_sizes, in_bytes) in ``splits``; None when a member is missing, records no split
    sizes or they do not have one entry per member (the instance is then uniform)."""
    if len(members) != n or n < 2:
        return None
    out = np.zeros((n, n))
    for i, r in enumerate(members):
        text, nbytes = splits.get(r, (None, None))
        rows = parse_splits(text)
        if rows is None or len(rows) != n or not nbytes or not nbytes > 0 or not sum(rows):
            return None
        out[i] = np.asarray(rows, dtype=float) * (float(nbytes) / sum(rows))
    return out


def uniform(nbytes: float, n: int) -> np.ndarray:
    """The uniform all-to-all of ``nbytes`` per rank: ``nbytes / n`` per pair."""
    return np.full((n, n), float(nbytes) / n)


def _loads(net: Network, m: np.ndarray, ranks: list[int]) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """(peers, sent, received), each n x 3: per rank and link class (LEVELS), how many of its
    peers are of that class and the bytes it sends to and receives from them."""
    a = np.asarray(ranks)
    lv = net.levels(a[:, None], a[None, :])
    off = ~np.eye(len(a), dtype=bool)
    peers = np.stack([((lv == k) & off).sum(axis=1) for k in range(3)], axis=1)
    sent = np.stack([np.where((lv == k) & off, m, 0).sum(axis=1) for k in range(3)], axis=1)
    recv = np.stack([np.where((lv == k) & off, m, 0).sum(axis=0) for k in range(3)], axis=1)
    return peers, sent, recv


def _nccl(net: Network, m: np.ndarray, ranks: list[int], proto: str) -> float:
    """``network._all_to_all`` with each rank's own load per link class."""
    peers, sent, recv = _loads(net, m, ranks)
    load = np.maximum(sent, recv)
    total = 0.0
    for i in range(len(ranks)):
        for k, level in enumerate(LEVELS):
            p = int(peers[i, k])
            if not p:
                continue
            lat, bw = net.link(level, proto, p2p=True)
            if level != "intra":
                bw = min(bw * p, net.link(level, proto, window=False)[1])
            total = max(total, math.ceil(p / P2P_PER_BATCH) * lat
                        + (load[i, k] / bw if bw != math.inf else 0.0))
    return total


def _gloo(net: Network, m: np.ndarray, ranks: list[int], idle_s: float) -> float:
    """``transport.gloo_time``'s all-to-all with each rank's own load: one rendezvous (2 x
    the slowest peer's one-way latency), slow start on the largest pair's first segment, then
    the rank's bytes over its connections, each link class at its own rate, the inter-node
    and cross-datacenter ones through the rank's one NIC too."""
    n = len(ranks)
    peers, sent, recv = _loads(net, m, ranks)
    load = np.maximum(sent, recv)
    nic = np.maximum(sent[:, 1:].sum(axis=1), recv[:, 1:].sum(axis=1))
    window = (n - 1) * TCP_WINDOW
    biggest = float(np.where(~np.eye(n, dtype=bool), m, 0).max())
    first = 0.0
    times = []
    for i, q in enumerate(ranks):
        paths = {LEVELS[k]: path(net, q, r) for k in range(3) for r in ranks
                 if r != q and net.level(q, r) == LEVELS[k]}
        d = max(p[0] for p in paths.values())
        t = 0.0
        for k, level in enumerate(LEVELS):
            if peers[i, k]:
                rate = tcp_rate(paths[level][1], 2 * d, window)
                t = max(t, load[i, k] / rate)
                first = max(first, slow_start_extra(min(biggest, GLOO_MAX_SEGMENT),
                                                    tcp_rate(paths[level][1], 2 * d), 2 * d,
                                                    idle_s))
        if nic[i] > 0:
            t = max(t, nic[i] / tcp_rate(net.inter_node_bw, 2 * d, window))
        times.append(2 * d + t)
    return max(times) + first


def alltoall_time(net: Network, m: np.ndarray, ranks: list[int], backend: str = "nccl",
                  idle_s: float = 0.0) -> float:
    """Seconds of an all-to-all whose group rank i sends ``m[i, j]`` bytes to group rank j
    (``ranks`` sorted, the matrix in their order) on ``net``: the busiest rank's link."""
    if len(ranks) < 2 or not (m > 0).any():
        return 0.0
    if backend == "gloo":
        return _gloo(net, m, ranks, idle_s)
    return min(BASE_US[p] * 1e-6 + _nccl(net, m, ranks, p) for p in BASE_US)


def costs(src: Network, dst: Network, m_src: np.ndarray, m_dst: np.ndarray,
          ranks: list[int], backend: str, idle_s: float) -> tuple[float, float, float, float]:
    """(time, added latency) on the source network with ``m_src``, then on the target with
    ``m_dst``: ``model._costs`` for an all-to-all priced per pair."""
    out = []
    for net, m in ((src, m_src), (dst, m_dst)):
        flat = replace(net, intra_node_latency=0.0, inter_node_latency=0.0, dc_latency=0.0)
        t = alltoall_time(net, m, ranks, backend, idle_s)
        out += [t, t - alltoall_time(flat, m, ranks, backend, idle_s)]
    return out[0], out[1], out[2], out[3]


# ---- routing skew -------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpertSkew:
    """``--expert-skew``: Zipf exponent ``zipf`` over the experts (one per rank of an
    all-to-all group), hottest first in ``order`` (ranks; None: the trace's order)."""

    zipf: float
    order: tuple[int, ...] | None = None

    def __str__(self) -> str:
        return f"{self.zipf:g}" + (f" (order {','.join(map(str, self.order))})"
                                   if self.order else "")


def parse_expert_skew(text: str, order: str | None = None) -> ExpertSkew:
    """``--expert-skew`` (a Zipf exponent, 0 to MAX_ZIPF) and ``--expert-order`` (the ranks
    hottest first, comma-separated; None: the trace's order) -> ExpertSkew; WhatIfError (one
    line) for a value that is not a number in range, or an order that is not distinct ranks."""
    try:
        z = float(text)
    except (TypeError, ValueError):
        z = math.nan
    if not 0 <= z <= MAX_ZIPF:
        raise WhatIfError(f"bad --expert-skew {text!r}: give a Zipf exponent from 0 "
                          f"(uniform routing) to {MAX_ZIPF:g}, e.g. 1.2")
    if order is None:
        return ExpertSkew(z)
    parts = [x.strip() for x in order.split(",")]
    if not all(x.isascii() and x.isdigit() and len(x) <= 9 for x in parts):
        raise WhatIfError(f"bad --expert-order {order!r}: give the ranks hottest first, "
                          "comma-separated, e.g. 3,0,2,1")
    ranks = tuple(int(x) for x in parts)
    if len(set(ranks)) != len(ranks):
        raise WhatIfError(f"bad --expert-order {order!r}: a rank is given twice")
    return ExpertSkew(z, ranks)


def zipf_shares(zipf: float, n: int) -> np.ndarray:
    """Shares of the experts by popularity rank (index 0 the hottest): 1 / k^zipf, summing
    to 1."""
    w = 1.0 / np.arange(1, n + 1, dtype=float) ** zipf
    return w / w.sum()


@dataclass
class SkewPlan:
    """What a skew changes: per all-to-all instance its target pair bytes, and per rank the
    windows of expert compute with the factor on their work."""

    target: dict[int, np.ndarray] = field(default_factory=dict)
    windows: list[tuple[int, float, float, float]] = field(default_factory=list)  # rank,t0,t1,f
    tokens: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def changes(self, source: dict[int, np.ndarray]) -> bool:
        return any(not np.allclose(m, source[i], rtol=1e-9, atol=1e-6)
                   for i, m in self.target.items()) \
            or any(abs(f - 1) > 1e-12 for *_, f in self.windows)


def source_matrix(insts: dict, i: int) -> np.ndarray:
    """Instance i's traced pair bytes: recorded, else uniform."""
    m = insts["pair_bytes"][i]
    return m if m is not None else uniform(insts["bytes"][i], len(insts["group_ranks"][i]))


def skew_plan(insts: dict, spans: tuple[np.ndarray, ...], skew: ExpertSkew, job: str
              ) -> tuple[SkewPlan, dict[int, np.ndarray]]:
    """The skew's plan for a job's collective instances (``insts``: ReplayGraph.insts;
    ``spans``: (rank, instance, start, end) of each rank's part, ``model._comm_spans``), and
    the traced matrices of the all-to-alls. WhatIfError (one line) for a job with no
    all-to-all across ranks, all-to-alls that are not in (dispatch, combine) pairs, or an
    order that does not name every rank of a group."""
    sel = [i for i, (k, g) in enumerate(zip(insts["kind"], insts["group_ranks"], strict=True))
           if k == "all_to_all" and len(g) >= 2
           and (insts["pair_bytes"][i] is not None or insts["bytes"][i] > 0)]
    if not sel:
        raise WhatIfError(f"--expert-skew {skew}: job {job} has no all-to-all across ranks "
                          "(no expert-parallel layer) whose routing it could skew")
    rank, inst, t0, t1 = spans
    start = {i: float(t0[inst == i].min()) if (inst == i).any() else math.inf for i in sel}
    groups: dict[tuple[int, ...], dict[int, list[int]]] = {}
    for i in sel:
        groups.setdefault(tuple(insts["group_ranks"][i]), {}).setdefault(
            int(insts["step"][i]), []).append(i)
    source = {i: source_matrix(insts, i) for i in sel}
    stray = sorted(set(skew.order or ()) - {r for g in groups for r in g})
    if stray:
        raise WhatIfError(f"--expert-skew {skew}: rank(s) {stray} of its order are in no "
                          f"all-to-all group of job {job}")
    plan = SkewPlan()
    for g, steps in groups.items():
        pairs = []
        for step, ids in sorted(steps.items()):
            ids.sort(key=lambda i: start[i])
            if len(ids) % 2:
                where = f"step {step}" if step >= 0 else "its trace"
                raise WhatIfError(f"--expert-skew {skew}: the all-to-alls of group "
                                  f"{list(g)} in {where} of job {job} are {len(ids)}, not "
                                  "(dispatch, combine) pairs, so the expert compute between "
                                  "them cannot be told")
            pairs += [(ids[k], ids[k + 1]) for k in range(0, len(ids), 2)]
        received = sum(source[d].sum(axis=0) for d, _ in pairs)
        if skew.order is not None:
            missing = sorted(set(g) - set(skew.order))
            if missing:
                raise WhatIfError(f"--expert-skew {skew}: its order does not name rank(s) "
                                  f"{missing} of the all-to-all group {list(g)}")
            order = [g.index(r) for r in skew.order if r in g]
        else:
            order = sorted(range(len(g)), key=lambda j: (-round(received[j], 6), j))
        share = np.zeros(len(g))
        share[order] = zipf_shares(skew.zipf, len(g))
        traced, target = np.zeros(len(g)), np.zeros(len(g))
        for d, c in pairs:
            md = source[d].sum(axis=1)[:, None] * share[None, :]
            plan.target[d] = md
            plan.target[c] = share[:, None] * source[c].sum(axis=0)[None, :]
            f = np.divide(md.sum(axis=0), source[d].sum(axis=0),
                          out=np.ones(len(g)), where=source[d].sum(axis=0) > 0)
            traced += source[d].sum(axis=0)
            target += md.sum(axis=0)
            for j, r in enumerate(g):
                a = t1[(inst == d) & (rank == r)]
                b = t0[(inst == c) & (rank == r)]
                if len(a) and len(b) and b[0] >= a[0]:
                    plan.windows.append((r, float(a[0]), float(b[0]), float(f[j])))
        plan.tokens[g] = (traced, target)
    return plan, source
