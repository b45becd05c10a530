"""Network topologies and collective costs: NCCL-style alpha-beta steps here, gloo's
messages over TCP in ``transport.py`` (``collective_time(..., backend="gloo")``).

A topology is GPUs grouped into nodes, and optionally nodes into datacenters: a placement
(``placement.py``: ``--placement FILE``, any rank -> node -> datacenter map) or its shorthand,
contiguous blocks: ranks ``[k * gpus_per_node, (k + 1) * gpus_per_node)`` share node k, ranks
``[k * ranks_per_dc, (k + 1) * ranks_per_dc)`` share datacenter k. Bandwidths are per GPU and per
direction, in bytes/s; latencies in seconds. Spec values carry units: ``400Gbit/s``,
``50GB/s``, ``5us``, ``10ms``.

Costs follow NCCL's tuning model (shared/docs/replay-models.md section 2): a collective is a
sequence of steps, each costing a per-step latency on the slowest link it crosses plus its
bytes over that link's bandwidth; NCCL picks the cheapest algorithm and protocol, so this
does too: ring (flat, bottlenecked by the slowest link), hierarchical (reduce-scatter within
nodes, the collective across nodes on 1/ppn of the data, all-gather within nodes, and the same
again across datacenters), each with the LL protocol (low latency, half bandwidth) and Simple.
Latencies (``*_latency``) are one-way and per link for both backends: for NCCL they add to
every step's constant, for gloo they are the links' propagation (a round trip is twice).

NCCL's flow control caps a connection's rate at its in-flight data per round trip: each
channel's connection to a peer has NCCL_STEPS = 8 slots of a buffer (``src/init.cc``:
Simple ``DEFAULT_BUFFSIZE`` 4 MiB; LL 512 KiB, half of it flags; point-to-point
``NCCL_P2P_NET_CHUNKSIZE`` 128 KiB per slot), and a slot is reused only after the receiver
has consumed it and said so, one round trip later. So a rank's rate over a network link is
at most ``channels x window / RTT``, with NET_CHANNELS channels per NIC (the topology search
finds one ring per NIC, which ``src/graph/connect.cc`` duplicates: ``nChannels * 2``) and RTT
twice the link's one-way ``*_latency``. Inside a datacenter (microseconds) this never binds;
across datacenters (milliseconds) it does: 2 x 4 MiB per 9.8 ms round trip is ~0.86 GB/s.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, fields, replace

import numpy as np

from tracetool.errors import InputError
from tracetool.hardware import Gpu

from .placement import Placement
from .transport import gloo_time

# NCCL constants, us (shared/docs/replay-models.md section 2): base latency and per-step
# latency by link, for the LL and Simple protocols; LL moves data at half the bandwidth.
BASE_US = {"ll": 6.6, "simple": 8.4}
STEP_US = {"nvlink": {"ll": 0.6, "simple": 3.4}, "net": {"ll": 2.7, "simple": 14.0}}
LL_BANDWIDTH = 0.5
# NCCL's in-flight data per channel and peer connection, bytes (module docstring): collective
# buffers by protocol (LL: data half of 8 lines x 512 threads x 8 steps x 16 B), and the
# point-to-point slots (8 x 128 KiB); channels per NIC on a network link
WINDOW = {"simple": 1 << 22, "ll": 8 * 512 * 8 * 16 // 2}
P2P_WINDOW = 8 * (1 << 17)
NET_CHANNELS = 2
P2P_PER_BATCH = 8  # peers NCCL moves at once (src/include/device.h NCCL_MAX_DEV_WORK_P2P_PER_BATCH)

_BW_UNITS = {"b/s": 1, "bps": 1 / 8, "bit/s": 1 / 8, "kb/s": 1e3, "kbit/s": 1e3 / 8,
             "mb/s": 1e6, "mbit/s": 1e6 / 8, "mbps": 1e6 / 8, "gb/s": 1e9, "gbit/s": 1e9 / 8,
             "gbps": 1e9 / 8, "tb/s": 1e12, "tbit/s": 1e12 / 8, "pb/s": 1e15,
             "pbit/s": 1e15 / 8}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*([a-zµ/]*)\s*$", re.IGNORECASE)

# The ranges a network spec's values must lie in (README "replay"; beyond them a value is a
# typo or an overflow, 1e400 being inf, and the costs it gives are not times): bandwidths
# from 1 Mbit/s to 1 Pbit/s, or 'inf' (given as the word); latencies from 0 to 10 s; ranks
# per node or datacenter from 1 to MAX_WORLD, also the most ranks a projection prices
# (``--dp-scale``'s projected job, model.check_dp_scale).
MIN_BW, MAX_BW = 1e6 / 8, 1e15 / 8  # bytes/s
MAX_LATENCY = 10.0  # s
MAX_WORLD = 131_072
COUNT_KEYS = ("gpus_per_node", "ranks_per_dc", "host_cpus")  # whole numbers, no unit
LEVELS = ("intra", "inter", "dc")  # link classes, slowest last


def parse_bandwidth(text: str | float) -> float:
    """'400Gbit/s', '50GB/s', '25Gbps', 'inf' -> bytes/s ('b' is bits only in bit/bps); a
    number is bytes/s. InputError outside 1 Mbit/s..1 Pbit/s (but for 'inf')."""
    if isinstance(text, str) and text.strip().lower() in ("inf", "infinite"):
        return math.inf
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise InputError(f"bad bandwidth {text!r}: use a number and a unit like 400Gbit/s, "
                         "50GB/s or 25Gbps")
    if isinstance(text, str):
        m = _NUM.match(text)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _BW_UNITS:
            raise InputError(f"bad bandwidth {text!r}: use a number and a unit like 400Gbit/s, "
                             "50GB/s or 25Gbps")
        value = float(m.group(1)) * _BW_UNITS[unit]
    else:
        value = float(text)
    if not MIN_BW <= value <= MAX_BW:  # NaN too
        raise InputError(f"bad bandwidth {text!r}: give 1Mbit/s to 1Pbit/s, or inf")
    return value


def parse_time(text: str | float) -> float:
    """'5us', '10ms', '936ns', '0' -> seconds (a number: seconds); InputError outside 0..10 s."""
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise InputError(f"bad time {text!r}: use a number and a unit like 5us or 10ms")
    if isinstance(text, str):
        m = _NUM.match(text)
        unit = (m.group(2).lower() or "s") if m else ""
        if not m or unit not in _TIME_UNITS:
            raise InputError(f"bad time {text!r}: use a number and a unit like 5us or 10ms")
        value = float(m.group(1)) * _TIME_UNITS[unit]
    else:
        value = float(text)
    if not 0 <= value <= MAX_LATENCY:  # NaN too
        raise InputError(f"bad time {text!r}: give 0 to {MAX_LATENCY:g}s")
    return value


def parse_count(key: str, value: object) -> int:
    """A spec's ``gpus_per_node`` / ``ranks_per_dc`` / ``host_cpus``: a whole number from 1
    to MAX_WORLD (InputError otherwise, naming the key)."""
    n = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,12}\s*", value):
        n = int(value)
    if n is None or not 1 <= n <= MAX_WORLD:
        raise InputError(f"bad {key} {value!r}: give a whole number from 1 to {MAX_WORLD}")
    return n


def parse_setting(key: str, value: object) -> object:
    """One network spec value, by its key (``_SPEC_KEYS``): a count, a bandwidth or a time,
    within its range (InputError otherwise, an unknown key included)."""
    if key not in _SPEC_KEYS:
        raise InputError(f"unknown network setting(s) {[key]}; known: {sorted(_SPEC_KEYS)}")
    if key in COUNT_KEYS:
        return parse_count(key, value)
    try:
        return parse_bandwidth(value) if key.endswith("_bw") else parse_time(value)
    except InputError as err:
        raise InputError(f"{key}: {err}") from None


@dataclass(frozen=True)
class Network:
    gpus_per_node: int = 8
    intra_node_bw: float = 300e9  # per GPU per direction (NVLink3-class)
    intra_node_latency: float = 0.0  # extra per-step latency on top of NCCL's
    inter_node_bw: float = 25e9  # per GPU per direction (200 Gbit/s NIC per GPU)
    inter_node_latency: float = 0.0
    ranks_per_dc: int | None = None  # None: one datacenter
    dc_bw: float | None = None  # per GPU per direction across datacenters
    dc_latency: float = 0.0  # one-way, added to every step that crosses datacenters
    # --placement FILE: where each rank runs; None: the gpus_per_node / ranks_per_dc blocks
    placement: Placement | None = None
    # gloo (CPU jobs) only: the job's ranks share one host's host_cpus cores, which move their
    # collectives' bytes (transport.host_share); None: a host per rank, a core for its gloo
    host_cpus: int | None = None

    @property
    def layout(self) -> Placement:
        """Where the ranks run: the placement file's map, else the contiguous blocks of
        gpus_per_node / ranks_per_dc (one object either way: all pricing reads this)."""
        return self.placement or Placement.blocks(self.gpus_per_node, self.ranks_per_dc)

    def levels(self, a: object, b: object) -> np.ndarray:
        """Per pair of ranks (array-likes a, b): the slowest link between them as an index
        into LEVELS (0 intra-node, 1 inter-node, 2 across datacenters)."""
        na, da = self.layout.where(a)
        nb, db = self.layout.where(b)
        return np.where(da != db, 2, np.where(na != nb, 1, 0))

    def level(self, a: int, b: int) -> str:
        """The slowest link between ranks a and b: 'intra', 'inter' or 'dc'."""
        return LEVELS[int(self.levels(a, b))]

    def link(self, level: str, proto: str, p2p: bool = False, window: bool = True
             ) -> tuple[float, float]:
        """(per-step latency s, data rate bytes/s) of a link level for a protocol: LL moves
        data at half the bandwidth, and on a network link NCCL's window per round trip caps
        it (``p2p``: send/recv and all-to-all connections, whose Simple slots are smaller;
        ``window=False``: the link's own rate, uncapped)."""
        if level == "intra":
            lat, bw = STEP_US["nvlink"][proto] * 1e-6 + self.intra_node_latency, self.intra_node_bw
            return lat, bw * (LL_BANDWIDTH if proto == "ll" else 1.0)
        one_way = self.inter_node_latency + (self.dc_latency if level == "dc" else 0.0)
        bw = self.dc_bw if level == "dc" and self.dc_bw is not None else self.inter_node_bw
        bw *= LL_BANDWIDTH if proto == "ll" else 1.0
        if window and one_way > 0:
            in_flight = P2P_WINDOW if p2p and proto == "simple" else WINDOW[proto]
            bw = min(bw, NET_CHANNELS * in_flight / (2 * one_way))
        return STEP_US["net"][proto] * 1e-6 + one_way, bw


_SPEC_KEYS = {f.name for f in fields(Network)} - {"placement"}


def parse_network(spec: str, base: Network | None = None) -> Network:
    """A topology from TOML text or an inline 'key=value,key=value' spec (unset keys keep
    ``base``'s values): ``parse_spec``, and InputError for a datacenter that splits a node."""
    settings = parse_spec(spec)
    net = replace(base or Network(), **settings)
    check_placement_spec(net.placement, settings)
    if net.ranks_per_dc and net.ranks_per_dc % net.gpus_per_node:
        raise InputError(f"ranks_per_dc={net.ranks_per_dc} splits a node of gpus_per_node="
                         f"{net.gpus_per_node} across datacenters: give ranks_per_dc as a "
                         "multiple of gpus_per_node (or set gpus_per_node)")
    return net


def check_placement_spec(placement: Placement | None, settings: dict | list) -> None:
    """InputError for a --placement given with a network spec that sets gpus_per_node or
    ranks_per_dc: both would say where the ranks run."""
    keys = [k for k in ("gpus_per_node", "ranks_per_dc") if k in settings]
    if placement is not None and keys:
        raise InputError(f"--placement {placement.source} places the ranks: give it or "
                         f"{'/'.join(keys)} in --network, not both")


def parse_spec(spec: str) -> dict[str, object]:
    """The settings of a spec (TOML text or inline 'key=value,...'), each value parsed and
    within its range (``parse_setting``); InputError for a spec that sets nothing, a key
    given twice or an unknown key. Needs no base: checked before a store is opened."""
    text = spec.strip()
    try:
        items = tomllib.loads(text) if "\n" in text or text.startswith("[") else None
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"bad network file: {err}") from None
    if items is None:
        items = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep:
                raise InputError(f"bad network setting {part!r}: use key=value")
            if key.strip() in items:
                raise InputError(f"network setting {key.strip()!r} given twice in {spec!r}")
            items[key.strip()] = value.strip()
    if not items:
        what = "network file" if "\n" in text else f"network spec {spec!r}"
        raise InputError(f"{what} sets nothing: give key=value,... (e.g. "
                         "inter_node_bw=400Gbit/s) or a TOML file")
    unknown = set(items) - _SPEC_KEYS
    if unknown:
        raise InputError(f"unknown network setting(s) {sorted(unknown)}; known: "
                         f"{sorted(_SPEC_KEYS)}")
    return {key: parse_setting(key, value) for key, value in items.items()}


def _steps_time(steps: int, bytes_per_step: float, lat: float, bw: float) -> float:
    return steps * (lat + (bytes_per_step / bw if bw != math.inf else 0.0))


def _ring(net: Network, kind: str, nbytes: float, ranks: list[int], proto: str) -> float:
    """Flat ring over all ranks: every step is paced by the slowest link of the ring."""
    n = len(ranks)
    lat, bw = net.link(_ring_level(net, ranks), proto)
    chunk = nbytes / n
    if kind == "allreduce":
        return _steps_time(2 * (n - 1), chunk, lat, bw)
    if kind in ("allgather", "reduce_scatter", "all_to_all"):
        return _steps_time(n - 1, chunk, lat, bw)
    if kind in ("broadcast", "reduce"):  # pipelined: n - 1 hops of latency, S once
        return (n - 1) * lat + (nbytes / bw if bw != math.inf else 0.0)
    raise ValueError(f"unknown collective {kind!r}")


def _ring_level(net: Network, ranks: list[int]) -> str:
    """The slowest link of the ring over ``ranks`` (each to the next, the last to the first):
    'dc', 'inter' or 'intra' (vectorized: rings of thousands of ranks are priced per
    collective instance). Any ring order gives the same: a ring over ranks on more than one
    node (datacenter) has a link between two of them, wherever they sit in it."""
    a = np.asarray(ranks)
    return LEVELS[int(net.levels(a, np.roll(a, -1)).max())]


def _nodes(net: Network, ranks: list[int]) -> list[list[int]]:
    """``ranks`` (sorted) grouped by node, the nodes in the order of their lowest rank."""
    a = np.asarray(ranks)
    node = net.layout.where(a)[0]
    order = np.argsort(node, kind="stable")
    cuts = np.flatnonzero(np.diff(node[order])) + 1
    groups = [g.tolist() for g in np.split(a[order], cuts)]
    return sorted(groups, key=lambda g: g[0])


def link_classes(net: Network, ranks: list[int]) -> frozenset[str]:
    """The link classes a collective over ``ranks`` crosses on ``net``'s placement: 'intra'
    (two of its ranks share a node), 'inter' (it spans nodes), 'dc' (it spans datacenters)."""
    node, dc = net.layout.where(sorted(ranks))
    out = set()
    if len(np.unique(node)) < len(node):
        out.add("intra")
    if len(np.unique(node)) > 1:
        out.add("inter")
    if len(np.unique(dc)) > 1:
        out.add("dc")
    return frozenset(out)


def priced_shape(net: Network, ranks: list[int], backend: str = "nccl") -> tuple:
    """What the pricing reads from the placement for a collective over ``ranks``: two
    placements with the same shape price it the same (``model._refuse_network_noop``: a
    placement that changes no shape changes no edge). Crossing datacenters counts as
    crossing nodes when the network sets no datacenter link (the links are then equal).
    NCCL's ring is paced by its slowest link, wherever it is; gloo's is simulated link by
    link in rank order, and its all-to-all from the lowest rank. Keep in step with
    ``_ring``, ``_hierarchical``, ``_all_to_all`` and transport.py."""
    a = np.asarray(sorted(ranks))
    node, dc = net.layout.where(a)
    lv, first = net.levels(a, np.roll(a, -1)), net.levels(a[0], a)
    if net.dc_bw is None and net.dc_latency == 0:
        lv, first, dc = np.minimum(lv, 1), np.minimum(first, 1), np.zeros_like(dc)
    if backend == "gloo":
        return tuple(lv.tolist()), tuple(first.tolist())
    nodes = _nodes(net, a.tolist())
    leaders = np.isin(a, [g[0] for g in nodes])
    return (int(lv.max()), tuple(len(g) for g in nodes), len(np.unique(dc[leaders])),
            tuple(sorted(map(tuple, _peer_counts(node, dc).tolist()))))


def _peer_counts(node: np.ndarray, dc: np.ndarray) -> np.ndarray:
    """Per rank of a group (its ranks' node and datacenter numbers): how many of the others
    are on its node, on other nodes of its datacenter, and in other datacenters (n x 3)."""
    _, ni, nc = np.unique(node, return_inverse=True, return_counts=True)
    _, di, dcount = np.unique(dc, return_inverse=True, return_counts=True)
    same_node, same_dc = nc[ni], dcount[di]
    return np.stack([same_node - 1, same_dc - same_node, len(node) - same_dc], axis=1)


def _hierarchical(net: Network, kind: str, nbytes: float, ranks: list[int], proto: str
                  ) -> float:
    """Reduce-scatter inside each node, the collective across nodes on each GPU's 1/ppn share
    (in parallel, one ring per local index), all-gather inside the node; across datacenters
    the inner step recurses with datacenters as the outer level."""
    nodes = _nodes(net, ranks)
    ppn = max(len(g) for g in nodes)
    if len(nodes) == 1 or ppn == 1 or kind not in ("allreduce", "allgather",
                                                   "reduce_scatter"):
        return _ring(net, kind, nbytes, ranks, proto)
    local = nodes[0]
    leaders = [g[0] for g in nodes]  # one GPU per node; the others run the same ring alongside
    inner = _ring(net, kind, nbytes / ppn, leaders, proto)
    if kind == "allreduce":
        return (_ring(net, "reduce_scatter", nbytes, local, proto) + inner
                + _ring(net, "allgather", nbytes, local, proto))
    if kind == "allgather":
        return inner + _ring(net, "allgather", nbytes, local, proto)
    return _ring(net, "reduce_scatter", nbytes, local, proto) + inner


def collective_time(net: Network, kind: str, nbytes: float, ranks: list[int],
                    backend: str = "nccl", idle_s: float = 0.0, sharing: float = 1.0,
                    busy: float = 0.0) -> float:
    """Seconds for one collective of ``nbytes`` (nccl-tests' S: the reduced buffer, or the
    gathered output) over global ``ranks``: for ``backend="nccl"`` the cheapest algorithm and
    protocol, for ``"gloo"`` gloo's algorithm over TCP (``transport.py``; ``idle_s``: how long
    the connections were idle before it, for TCP's slow start after idle; ``sharing``: how
    many collectives were in flight on them at once, whose messages fill each other's waits;
    ``busy``: the share of its span its ranks' own CPU work ran beside it, which competes for
    a shared host's cores: ``transport.host_share``).

    kind: one of KINDS, the names of collective_ranks.kind (analysis/sql/40_collectives.sql
    normalises what PyTorch records); ValueError for any other."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; priced: {', '.join(KINDS)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    ranks = sorted(set(ranks))
    if len(ranks) < 2 or nbytes <= 0:
        return 0.0
    if backend == "gloo":
        return gloo_time(net, kind, nbytes, ranks, idle_s, sharing, busy)
    if kind in ("send", "recv"):
        a, b = ranks[0], ranks[-1]
        return min(BASE_US[p] * 1e-6 + _steps_time(
            1, nbytes, *net.link(net.level(a, b), p, p2p=True)) for p in BASE_US)
    if kind == "all_to_all":  # every pair exchanges S/n; the slowest pairs set the pace
        return min(BASE_US[p] * 1e-6 + _all_to_all(net, nbytes, ranks, p) for p in BASE_US)
    return min(BASE_US[p] * 1e-6 + algo(net, kind, nbytes, ranks, p)
               for p in BASE_US for algo in (_ring, _hierarchical))


def _all_to_all(net: Network, nbytes: float, ranks: list[int], proto: str) -> float:
    """Grouped send/recv with every peer (how PyTorch runs NCCL's all-to-all): NCCL runs the
    peers' transfers in batches of P2P_PER_BATCH at once, each batch one step's latency; the
    rank's link carries all peers' bytes (each peer's connection also under its window)."""
    n = len(ranks)
    per_pair = nbytes / n
    total = 0.0
    # every rank's peers by link class: the rank with the most peers across the slowest
    # links paces it (with contiguous blocks every rank sees the same counts)
    for counts in np.unique(_peer_counts(*net.layout.where(ranks)), axis=0).tolist():
        for level, peers in zip(LEVELS, counts, strict=True):
            if peers:
                lat, bw = net.link(level, proto, p2p=True)  # each peer's connection its window
                if level != "intra":
                    bw = min(bw * peers, net.link(level, proto, window=False)[1])
                total = max(total, math.ceil(peers / P2P_PER_BATCH) * lat
                            + (peers * per_pair / bw if bw != math.inf else 0))
    return total


BACKENDS = ("nccl", "gloo")


def added_latency(net: Network, kind: str, nbytes: float, ranks: list[int],
                  backend: str = "nccl", idle_s: float = 0.0, sharing: float = 1.0,
                  busy: float = 0.0) -> float:
    """The part of ``collective_time`` the network's latencies add: the time minus the same
    collective on the same links with no added latency (``*_latency`` = 0). It does not
    scale with a measured transfer's efficiency (propagation is physics), the rest does."""
    flat = replace(net, intra_node_latency=0.0, inter_node_latency=0.0, dc_latency=0.0)
    return (collective_time(net, kind, nbytes, ranks, backend, idle_s, sharing, busy)
            - collective_time(flat, kind, nbytes, ranks, backend, idle_s, sharing, busy))


# the collective kinds the model prices: collective_ranks.kind values (the SQL macro
# collective_kind is the one normalisation of PyTorch's names; gather, scatter, barrier and
# other are not priced and keep their measured transfer)
KINDS = ("allreduce", "allgather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
         "send", "recv")


# NIC bandwidth per GPU of the usual cluster build of each GPU generation (one NIC per GPU):
# DGX-2 (V100) 100 Gbit/s EDR, DGX A100 200 Gbit/s HDR, DGX H100/H200/B200 and MI300X
# platforms 400 Gbit/s NDR, MI250X (Frontier-class) 200 Gbit/s Slingshot.
NIC_GBIT_PER_GPU = {"v100": 100, "a100": 200, "h100": 400, "h200": 400, "b200": 400,
                    "mi250x": 200, "mi300x": 400}


def default_network(gpu: Gpu) -> Network:
    """The network a trace of ``gpu`` most likely ran on: 8 GPUs per node on the GPU's
    scale-up links (at their achievable fraction), one NIC per GPU between nodes."""
    return Network(
        gpus_per_node=8,
        intra_node_bw=gpu.scale_up_gbps * 1e9 * gpu.achievable.get("scale_up", 1.0),
        inter_node_bw=NIC_GBIT_PER_GPU.get(gpu.key, 400) * 1e9 / 8)
