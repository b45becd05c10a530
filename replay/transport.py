"""gloo's collectives as messages over TCP: what a CPU (gloo) collective costs on a network.

gloo (github.com/facebookincubator/gloo, which PyTorch's ProcessGroupGloo calls for CPU
tensors) moves data with a rendezvous per message: a send leaves only once the receiver has
posted the matching receive and told the sender so (``gloo/transport/tcp/pair.cc``: "sends
cannot execute until the remote side is ready to receive"), so every message costs a one-way
notification, its bytes over the connection, and a one-way trip for the data. Per collective:

- allreduce (``gloo/allreduce.cc``, ``ring``; ProcessGroupGloo's dense CPU allreduce): the
  buffer is cut into ``max(ceil(S / 1 MiB), 2n)`` segments (rounded up to a multiple of n;
  ``AllreduceOptions::kMaxSegmentSize`` = 1 MiB), a reduce-scatter then an allgather around
  the ring, each rank sending ``(n - 1) * segments / n`` segments to its left neighbour and
  receiving as many from its right, at most two in flight: iteration i waits for the
  receive and the send of iteration i - 2 before posting its own;
- all_to_all (``gloo/alltoall.cc``): every rank posts its n - 1 sends and receives at once
  (one rendezvous) and they share its link;
- allgather, reduce_scatter: n - 1 ring steps of S / n, one message in flight; broadcast,
  reduce: a binomial tree, ceil(log2 n) rounds of S; send/recv: one message.

TCP decides the rate of a message on a connection: ``min(link bandwidth x payload share,
window / RTT)``. The payload share is 1448 / 1514 (a full-size segment with timestamps in an
Ethernet frame, which is what a rate limiter counts); the window is Linux's ``tcp_wmem`` max
(4 MiB, the ranks' setting in sample_traces/netlab/measured.json ``rank_sysctls``; the
kernel's default too). After an idle longer than the retransmission timeout (RFC 5681 section
4.1, Linux ``tcp_slow_start_after_idle=1``, RTO >= 200 ms, RFC 6298 / ``TCP_RTO_MIN``) the
window restarts at 10 segments (RFC 6928) and doubles per round trip (slow start).

The host: every byte a rank sends or receives also costs its CPU (gloo's runloop thread
copies it into and out of the socket, reduces it, and the kernel runs TCP for it; on one
machine both ends' TCP run on the same cores). Segments stream, so the host's work on one
overlaps the link's on the next: a segment goes at ``min(TCP rate, host rate)`` (the slower
of the two sets the pace; measured on the rig: the 2-rank job at 1 Gbit/s is at its link's
time, at 10 Gbit/s its one 16.8 MB bucket takes 26.8 ms where the link alone would take 14:
``max``, not a sum, which would give 167 ms at 1 Gbit/s against 144 measured). The host rate
is GLOO_HOST_RATE, what one core moves, times the share of a core a rank's gloo thread gets:
1 unless the network says the ranks share ``host_cpus`` cores, then ``host_cpus / (ranks x
(1 + busy))``, ``busy`` the share of the collective's span the rank's own CPU work ran beside
it (from the trace: a bucket overlapping backward competes with it; ``host_share``).

Latencies are one-way, the same input as the NCCL model's per-step latency: the link's
``*_latency`` of ``Network``. Everything above is from the sources named; the fitted constants
are SHARED_FILL and GLOO_HOST_RATE (their fit sets and fits, ``fit_minimax``: below). Measured
errors, in and out of sample: ``benchmarks/replay_accuracy.py`` (README.md, "Network model").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .network import Network

GLOO_MAX_SEGMENT = 1 << 20  # bytes, gloo/allreduce.h AllreduceOptions::kMaxSegmentSize
GLOO_IN_FLIGHT = 2  # segments per direction, gloo/allreduce.cc ring
SIM_PER_RANK = 8  # segments per rank simulated one by one; beyond, the steady state
# How much of a second collective's in-flight segments fill this one's waits when the two
# share the connections (0: none, 1: as if one collective had twice the segments in flight).
# The model's one fitted constant. Fit set: SHARED_FILL_FIT_SET; fitted by fit_shared_fill
# over SHARED_FILL_GRID (benchmarks/replay_accuracy.py runs the fit, on all the fit set and
# leaving each job family out in turn, and records the result with a hash of this value and
# of the data in benchmarks/accuracy_record.json; tests/test_accuracy_record.py fails when
# they disagree).
SHARED_FILL = 0.35
SHARED_FILL_FIT_SET = ("sample_traces/netlab: the settings of the 2026-12-01 capture (none is "
                       "listed in validation.json), all job families")
SHARED_FILL_GRID = tuple(round(0.05 * i, 2) for i in range(13))  # 0 to 0.6
ELEMENT = 4  # bytes per element gloo rounds segments to (float32: DDP's gradients)
TCP_PAYLOAD = 1448 / 1514  # payload share of a full Ethernet frame (TCP with timestamps)
TCP_WINDOW = 4 << 20  # bytes, Linux net.ipv4.tcp_wmem max (4 MiB)
TCP_INIT_CWND = 10 * 1448  # bytes, RFC 6928 initial window, 10 segments of MSS 1448
TCP_MIN_RTO = 0.2  # s, RFC 6298 / Linux TCP_RTO_MIN
# Payload bytes/s one core moves through a gloo collective (copy in and out of the socket,
# the reduction, both ends' TCP on the same machine): the host's rate, which caps a segment's
# beside the link's (module docstring). Fitted (fit_minimax over GLOO_HOST_RATE_GRID, run by
# benchmarks/replay_accuracy.py like SHARED_FILL's) on GLOO_HOST_RATE_FIT_SET: the only
# settings where the host, not the link, sets the pace are the 10 Gbit/s ones, so it rests on
# the fit set's two (bs_10gbit, m2_10gbit, 2 ranks on the rig's 2-core VM) and is a property
# of that VM's cores: another host's CPU may move more or less.
GLOO_HOST_RATE = 8.5e8
GLOO_HOST_RATE_FIT_SET = ("sample_traces/netlab: every setting of measured.json not listed in "
                          "validation.json (both captures), all job families")
GLOO_HOST_RATE_GRID = tuple(float(x) for x in range(int(3e8), int(9e8) + 1, int(0.5e8)))


def fit_minimax(worst: Mapping[float, float]) -> float:
    """A constant fitted on a set of netlab jobs: ``worst`` maps each grid value (its
    ``*_GRID``) to the worst |error| of the mean projected step over the fit set's pairs (each
    setting's trace projected onto every other setting of its job) with the constant at that
    value. The fit is the value whose worst error is least (minimax: the band is sized by
    worst errors); among equal ones the smallest, so a fit set that does not depend on
    SHARED_FILL (no collective shares a connection, or no job at all) gives 0, the model with
    no fitted effect."""
    if not worst:
        return 0.0
    return min(worst, key=lambda f: (worst[f], f))


fit_shared_fill = fit_minimax  # SHARED_FILL's fit (its name in the benchmark and tests)


@contextmanager
def host_rate(value: float) -> Iterator[None]:
    """Replay with GLOO_HOST_RATE at ``value`` bytes/s (a fit's rotations); restored on exit."""
    global GLOO_HOST_RATE
    if not value > 0:
        raise ValueError(f"host rate {value} not > 0")
    old, GLOO_HOST_RATE = GLOO_HOST_RATE, value
    try:
        yield
    finally:
        GLOO_HOST_RATE = old


def host_share(net: Network, n: int, busy: float = 0.0) -> float:
    """The share of a core a rank's gloo thread gets during a collective over ``n`` ranks:
    1 when the network does not say the ranks share cores (``host_cpus`` unset: a host per
    rank, its gloo thread on a core of its own); else the host's ``host_cpus`` cores over
    the threads that want them, each rank's gloo thread and, for the share ``busy`` of the
    span its own CPU work ran beside it, that work's thread too (at most 1)."""
    cpus = net.host_cpus
    if cpus is None:
        return 1.0
    return min(1.0, cpus / (n * (1 + min(max(busy, 0.0), 1.0))))


def gloo_host_rate(net: Network, n: int, busy: float = 0.0) -> float:
    """Payload bytes/s a rank's CPU moves through a gloo collective over ``n`` ranks."""
    return GLOO_HOST_RATE * host_share(net, n, busy)


@contextmanager
def shared_fill(value: float) -> Iterator[None]:
    """Replay with SHARED_FILL at ``value`` (a fit's rotations); restored on exit."""
    global SHARED_FILL
    if not 0 <= value <= 1:
        raise ValueError(f"shared fill {value} outside [0, 1]")
    old, SHARED_FILL = SHARED_FILL, value
    try:
        yield
    finally:
        SHARED_FILL = old


def path(net: Network, a: int, b: int) -> tuple[float, float]:
    """(one-way latency s, bandwidth bytes/s) of the slowest link between ranks a and b."""
    level = net.level(a, b)
    if level == "intra":
        return net.intra_node_latency, net.intra_node_bw
    if level == "inter":
        return net.inter_node_latency, net.inter_node_bw
    bw = net.dc_bw if net.dc_bw is not None else net.inter_node_bw
    return net.inter_node_latency + net.dc_latency, bw


def tcp_rate(bandwidth: float, rtt: float, window: float = TCP_WINDOW) -> float:
    """Payload bytes/s of one warm connection: the link's, or the window's per round trip."""
    rate = bandwidth * TCP_PAYLOAD
    return min(rate, window / rtt) if rtt > 0 else rate


def slow_start_extra(nbytes: float, rate: float, rtt: float, idle_s: float) -> float:
    """Seconds slow start after idle adds to sending ``nbytes`` (0 if the connection was idle
    for less than its RTO): rounds of one RTT while the window, from 10 segments doubling
    per round, is below the bandwidth-delay product."""
    if idle_s <= max(TCP_MIN_RTO, 2 * rtt) or rtt <= 0 or nbytes <= 0:
        return 0.0
    cwnd, left, t = TCP_INIT_CWND, nbytes, 0.0
    while cwnd < rate * rtt and left > cwnd:
        left -= cwnd
        cwnd *= 2
        t += rtt
    return t + left / rate - nbytes / rate


def ring_allreduce(nbytes: float, lat: np.ndarray, rate: np.ndarray,
                   extra: np.ndarray | None = None, sharing: float = 1.0) -> float:
    """gloo's ring allreduce (``_ring``) with ``sharing`` collectives on the connections at
    once: their segments fill each other's waits, as if GLOO_IN_FLIGHT x sharing segments
    were in flight (interpolated between whole numbers)."""
    window = GLOO_IN_FLIGHT * (1 + SHARED_FILL * (max(sharing, 1.0) - 1))
    lo = math.floor(window)
    t_lo = _ring(nbytes, lat, rate, extra, lo)
    if window == lo:
        return t_lo
    return t_lo + (window - lo) * (_ring(nbytes, lat, rate, extra, lo + 1) - t_lo)


def _ring(nbytes: float, lat: np.ndarray, rate: np.ndarray, extra: np.ndarray | None,
          in_flight: int) -> float:
    """Seconds of gloo's ring allreduce when every rank starts at 0: the shortest rank's
    span (what a trace's transfer is: the last rank to join waits least). ``lat[q]``,
    ``rate[q]``: the connection from rank q to its left neighbour q - 1; ``extra[q]``: time
    slow start adds to q's first segment. Past SIM_PER_RANK segments per rank the pipeline
    is in its steady state, so the time is extrapolated linearly in the bytes."""
    n = len(lat)
    full = SIM_PER_RANK * n * GLOO_MAX_SEGMENT
    if nbytes > full:
        t_full = _ring(full, lat, rate, extra, in_flight)
        t_half = _ring(full / 2, lat, rate, extra, in_flight)
        return t_full + (nbytes - full) * (t_full - t_half) / (full / 2)
    segments = -(-max(math.ceil(nbytes / GLOO_MAX_SEGMENT), 2 * n) // n) * n
    per_rank = segments // n
    seg = -(-math.ceil(nbytes / segments) // ELEMENT) * ELEMENT  # whole elements
    ranks = np.arange(n)
    left, right = (ranks - 1) % n, (ranks + 1) % n
    free = np.zeros(n)  # when each rank's outgoing connection is free
    extra = np.zeros(n) if extra is None else extra.copy()
    start = np.zeros(n)  # when each rank starts the phase
    for first in (1, 0):  # reduce-scatter sends chunk r + 1 onwards, allgather chunk r
        post = start
        done_at = []  # per iteration: (segment in at rank r, rank r's send done), or -inf
        for i in range((n - 1) * per_rank):
            if i >= in_flight:  # wait for the receive and the send of i - in_flight
                post = np.maximum.reduce([post, *done_at[i - in_flight]])
            index = ((ranks + first) * per_rank + i) % segments  # the segment rank r sends
            size = np.clip(nbytes - index * seg, 0, seg)
            go = size > 0  # rank q sends to q - 1 once q - 1's recv-ready notice arrived
            begin = np.maximum.reduce([post, post[left] + lat, free])
            done = begin + extra + size / rate
            free = np.where(go, done, free)
            extra = np.where(go, 0.0, extra)
            # rank r receives what its right neighbour sends
            done_at.append((np.where(go[right], done[right] + lat[right], -math.inf),
                            np.where(go, done, -math.inf)))
        start = np.maximum.reduce([post, *(x for pair in done_at[-in_flight:] for x in pair)])
    return float(start.min())


def gloo_time(net: Network, kind: str, nbytes: float, ranks: list[int],
              idle_s: float = 0.0, sharing: float = 1.0, busy: float = 0.0) -> float:
    """Seconds of one gloo collective over global ``ranks`` (sorted, >= 2) on ``net``;
    ``sharing``: collectives in flight on the same connections at once (>= 1); ``busy``:
    the share of its span its ranks' own CPU work ran beside it (``host_share``)."""
    n = len(ranks)
    host = gloo_host_rate(net, n, busy)
    paths = [path(net, q, ranks[(k - 1) % n]) for k, q in enumerate(ranks)]
    lat = np.array([d for d, _ in paths])
    link = np.array([tcp_rate(bw, 2 * d) for d, bw in paths])
    rate = np.minimum(link, host)
    extra = np.array([slow_start_extra(min(nbytes / n, GLOO_MAX_SEGMENT), r, 2 * d, idle_s)
                      for d, r in zip(lat, link, strict=True)])
    first = float(extra.max())
    if kind == "allreduce":
        return ring_allreduce(nbytes, lat, rate, extra, sharing)
    if kind == "all_to_all":  # one rendezvous; n - 1 connections share the rank's link
        peers = [path(net, ranks[0], r) for r in ranks[1:]]
        d, bw = max(p[0] for p in peers), min(p[1] for p in peers)
        r = min(tcp_rate(bw, 2 * d, (n - 1) * TCP_WINDOW), host)
        return 2 * d + first + (n - 1) * (nbytes / n) / r
    d, r = float(lat.max()), float(rate.min())
    message = 2 * d  # rendezvous: the notice one way, the data the other
    if kind in ("allgather", "reduce_scatter"):
        return first + (n - 1) * (message + nbytes / n / r)
    if kind in ("broadcast", "reduce"):
        return first + math.ceil(math.log2(n)) * (message + nbytes / r)
    return first + message + nbytes / r  # send / recv


def host_bound(net: Network, kind: str, ranks: list[int], busy: float = 0.0
               ) -> tuple[float, float] | None:
    """(host rate, link rate), payload bytes/s per rank, when a gloo collective over
    ``ranks`` on ``net`` moves its bytes at the host's rate, below its slowest connection's
    TCP rate (``gloo_time``); None when the link sets the pace."""
    n = len(ranks)
    if n < 2:
        return None
    host = gloo_host_rate(net, n, busy)
    if kind == "all_to_all":
        peers = [path(net, ranks[0], r) for r in ranks[1:]]
        d, bw = max(p[0] for p in peers), min(p[1] for p in peers)
        link = tcp_rate(bw, 2 * d, (n - 1) * TCP_WINDOW)
    else:
        link = min(tcp_rate(bw, 2 * d) for d, bw in
                   (path(net, q, ranks[(k - 1) % n]) for k, q in enumerate(ranks)))
    return (host, link) if host < link else None
