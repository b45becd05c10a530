"""The replayer's network model: units, topology specs, NCCL-style collective costs, and gloo's
messages over TCP (replay/transport.py), checked against hand computations."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from tracetool.replay.network import (
    BASE_US,
    STEP_US,
    Network,
    collective_time,
    parse_bandwidth,
    parse_network,
    parse_time,
)


@pytest.mark.parametrize(("text", "value"), [
    ("400Gbit/s", 50e9), ("50GB/s", 50e9), ("25Gbps", 3.125e9), ("200Mbit/s", 25e6),
    ("1.5TB/s", 1.5e12), ("inf", math.inf)])
def test_bandwidth_units(text: str, value: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "value"), [("5us", 5e-6), ("10ms", 1e-2), ("936ns", 936e-9),
                                             ("2s", 2.0), ("0", 0.0)])
def test_time_units(text: str, value: float) -> None:
    assert parse_time(text) == pytest.approx(value)


def test_bad_specs_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="bad bandwidth '400 furlongs'"):
        parse_bandwidth("400 furlongs")
    with pytest.raises(ValueError, match="unknown network setting"):
        parse_network("nic_speed=400Gbit/s")
    with pytest.raises(ValueError, match="use key=value"):
        parse_network("gpus_per_node")


def test_inline_and_toml_specs_agree() -> None:
    inline = parse_network("gpus_per_node=4, inter_node_bw=200Gbit/s, inter_node_latency=5us,"
                           "ranks_per_dc=8, dc_bw=100Gbit/s, dc_latency=10ms")
    toml = parse_network('gpus_per_node = 4\ninter_node_bw = "200Gbit/s"\n'
                         'inter_node_latency = "5us"\nranks_per_dc = 8\n'
                         'dc_bw = "100Gbit/s"\ndc_latency = "10ms"\n')
    assert inline == toml
    assert inline.inter_node_bw == 25e9 and inline.dc_latency == 1e-2
    assert inline.intra_node_bw == Network().intra_node_bw  # unset keys keep the defaults


def test_single_node_ring_allreduce_is_the_textbook_formula() -> None:
    net = Network(gpus_per_node=8, intra_node_bw=150e9)
    n, size = 8, 1 << 30
    want = BASE_US["simple"] * 1e-6 + 2 * (n - 1) * (STEP_US["nvlink"]["simple"] * 1e-6
                                                    + size / n / 150e9)
    assert collective_time(net, "allreduce", size, list(range(n))) == pytest.approx(want)
    # busbw of the result is close to the link bandwidth for a large message
    busbw = size / collective_time(net, "allreduce", size, list(range(n))) * 2 * (n - 1) / n
    assert 0.95 * 150e9 < busbw < 150e9


KINDS = ["allreduce", "allgather", "reduce_scatter", "all_to_all", "broadcast", "send"]
GROUPS = [list(range(8)), list(range(16)), list(range(0, 64, 8)), list(range(32)), [3, 12]]


@pytest.mark.parametrize("kind", KINDS)
def test_halving_bandwidth_never_speeds_a_collective_up(kind: str) -> None:
    base = Network(gpus_per_node=8, ranks_per_dc=16, dc_bw=5e9, dc_latency=1e-3)
    for group, size in itertools.product(GROUPS, [1e3, 1e6, 1e8, 1e10]):
        t = collective_time(base, kind, size, group)
        for key in ("intra_node_bw", "inter_node_bw", "dc_bw"):
            slower = Network(**{**base.__dict__, key: getattr(base, key) / 2})
            assert collective_time(slower, kind, size, group) >= t * (1 - 1e-12), (key, group)


@pytest.mark.parametrize("kind", KINDS)
def test_infinite_bandwidth_leaves_only_latency(kind: str) -> None:
    net = Network(intra_node_bw=math.inf, inter_node_bw=math.inf)
    small = collective_time(net, kind, 1e3, list(range(32)))
    large = collective_time(net, kind, 1e12, list(range(32)))
    assert small == large and 0 < large < 1e-3


def test_cross_dc_placement_slows_only_groups_that_span_datacenters() -> None:
    one_dc = Network(gpus_per_node=8)
    two_dc = Network(gpus_per_node=8, ranks_per_dc=16, dc_bw=1e9, dc_latency=5e-3)
    inside = list(range(16))  # all in DC 0
    across = list(range(32))  # DCs 0 and 1
    for kind in ("allreduce", "allgather", "all_to_all"):
        assert collective_time(two_dc, kind, 1e8, inside) == collective_time(
            one_dc, kind, 1e8, inside)
        assert collective_time(two_dc, kind, 1e8, across) > 2 * collective_time(
            one_dc, kind, 1e8, across)


def test_degenerate_groups_cost_nothing() -> None:
    assert collective_time(Network(), "allreduce", 1e9, [5]) == 0.0
    assert collective_time(Network(), "allreduce", 0, [0, 1]) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        collective_time(Network(), "gossip", 1e6, [0, 1])


def test_collective_names_have_one_normalisation(tmp_path) -> None:
    """collective_kind (analysis/sql/40_collectives.sql) maps PyTorch's names onto the kinds
    the network model prices (KINDS) or the unpriced ones; nothing else, and no other code
    renames collectives."""
    import tracetool
    from tracetool.ingest.pipeline import Options, ingest
    from tracetool.replay.network import KINDS

    from ._util import SAMPLES

    ingest([SAMPLES], Options(store=tmp_path / "s", job="j"))
    con = tracetool.connect(tmp_path / "s")
    names = {"all_reduce": "allreduce", "allreduce": "allreduce",
             "allreduce_coalesced": "allreduce", "_allgather_base": "allgather",
             "all_gather_into_tensor": "allgather", "allgather": "allgather",
             "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
             "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
             "all_to_allv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
             "send": "send", "recv": "recv", "barrier": "barrier", "gather": "gather",
             "scatter": "scatter", "gossip": "other"}
    got = dict(con.execute("SELECT x, collective_kind(x) FROM unnest(?) t(x)",
                           [list(names)]).fetchall())
    assert got == names
    assert set(got.values()) - set(KINDS) == {"barrier", "gather", "scatter", "other"}
    for kind in KINDS:
        collective_time(Network(), kind, 1e6, [0, 1])  # every kind is priced
    # the views read the normalised kind, the replay graph too
    assert con.execute("SELECT DISTINCT kind FROM collective_instances").fetchall() == [
        ("allreduce",)]


# -- gloo over TCP (replay/transport.py): hand computations -------------------------------

def _gloo_net(latency: str, payload_rate: float = 1e8) -> Network:
    """Two nodes whose TCP payload rate is ``payload_rate`` bytes/s (the link's bandwidth
    times TCP_PAYLOAD)."""
    from tracetool.replay.transport import TCP_PAYLOAD
    return parse_network(f"gpus_per_node=1,inter_node_bw={payload_rate / TCP_PAYLOAD}B/s,"
                         f"inter_node_latency={latency}")


def test_gloo_ring_of_two_is_four_messages_of_a_segment_each() -> None:
    """4 MiB on 2 ranks: 4 segments of 1 MiB, each rank sends 2 per phase, both in flight at
    once. Each phase: the first segment leaves when the peer's recv-ready notice arrived (D),
    the second right behind it (link busy), the last lands D later: D + 2T + D."""
    d, t = 5e-3, (1 << 20) / 1e8
    got = collective_time(_gloo_net("5ms"), "allreduce", 4 << 20, [0, 1], backend="gloo")
    assert got == pytest.approx(2 * (2 * d + 2 * t))


def test_gloo_ring_waits_for_the_rendezvous_when_the_delay_exceeds_a_segment() -> None:
    """8 MiB on 2 ranks, D = 10 ms > T: per phase segments 0 and 1 leave at D and D + T;
    segment 2 is posted when segment 0 lands (2D + T) and leaves when that notice reaches
    the peer (3D + T), segment 3 behind it; the last lands at 4D + 3T."""
    d, t = 10e-3, (1 << 20) / 1e8
    got = collective_time(_gloo_net("10ms"), "allreduce", 8 << 20, [0, 1], backend="gloo")
    assert got == pytest.approx(2 * (4 * d + 3 * t))
    # another collective on the same connections fills the waits: less latency, same bytes
    shared = collective_time(_gloo_net("10ms"), "allreduce", 8 << 20, [0, 1], backend="gloo",
                             sharing=2.0)
    assert 2 * (d + 4 * t) < shared < got


def test_gloo_tiny_allreduce_is_one_round_trip_per_two_ranks() -> None:
    """A 4-byte allreduce: one element, one message each phase (1 -> 0, then 0 -> 1); rank 0
    finishes once its reply is written: 2D on 2 ranks, 4D on 4 (the trace's transfer is the
    shortest rank's span)."""
    for n, hops in ((2, 2), (4, 4)):
        got = collective_time(_gloo_net("5ms"), "allreduce", 4, list(range(n)), "gloo")
        assert got == pytest.approx(hops * 5e-3, rel=1e-4)


def test_gloo_all_to_all_is_one_rendezvous_then_the_bytes() -> None:
    got = collective_time(_gloo_net("2ms"), "all_to_all", 4 << 20, [0, 1, 2, 3], "gloo")
    assert got == pytest.approx(2 * 2e-3 + 3 * (1 << 20) / 1e8)


def test_tcp_window_and_slow_start_after_idle() -> None:
    from tracetool.replay.transport import TCP_PAYLOAD, slow_start_extra, tcp_rate
    assert tcp_rate(1e9, 0.0) == pytest.approx(1e9 * TCP_PAYLOAD)
    assert tcp_rate(1e9, 0.02) == pytest.approx((4 << 20) / 0.02)  # window-bound: 210 MB/s
    # 1 MiB at 1e8 B/s over a 100 ms round trip, after 1 s idle (> RTO): windows of 10, 20,
    # .. 320 segments (63 x 14480 bytes) take a round trip each, the rest goes at the rate
    left = (1 << 20) - 63 * 14480
    assert slow_start_extra(1 << 20, 1e8, 0.1, idle_s=1.0) == pytest.approx(
        6 * 0.1 + left / 1e8 - (1 << 20) / 1e8)
    assert slow_start_extra(1 << 20, 1e8, 0.1, idle_s=0.1) == 0  # idle < RTO: window kept


def test_added_latency_replaces_the_measured_latency_and_scales_the_rest() -> None:
    from tracetool.replay.model import transfer_factor
    assert transfer_factor(0.3, 0.2, 0.05, 0.2, 0.05) == 1.0  # identity
    # 0.3 s measured, 0.05 s of it latency: the 0.25 s rest doubles, latency 0.05 -> 0.5
    # (model: 0.15 s of bytes + 0.05 s latency -> 0.3 s of bytes + 0.5 s latency)
    assert transfer_factor(0.3, 0.2, 0.05, 0.8, 0.5) == pytest.approx((0.25 * 2 + 0.5) / 0.3)
    assert transfer_factor(0.3, 0.2, 0.0, 0.4, 0.0) == pytest.approx(2.0)  # ratio, as NCCL's


def test_gloo_across_datacenters_pays_the_crossing_links() -> None:
    """4 ranks, 2 per datacenter: the ring 0-1-2-3 crosses on 2 of its 4 links, which pace
    it; the ring lies between the all-near and the all-far one. An all-to-all waits for its
    farthest peer: one rendezvous over the datacenter latency."""
    near = _gloo_net("1ms")
    split = replace(near, ranks_per_dc=2, dc_latency=9e-3)  # 1 + 9 = 10 ms across
    far = _gloo_net("10ms")
    args = ("allreduce", 8 << 20, [0, 1, 2, 3], "gloo")
    assert (collective_time(near, *args) < collective_time(split, *args)
            <= collective_time(far, *args))
    got = collective_time(split, "all_to_all", 4 << 20, [0, 1, 2, 3], "gloo")
    assert got == pytest.approx(2 * 10e-3 + 3 * (1 << 20) / 1e8)


def test_nccl_window_per_round_trip_caps_a_link_across_datacenters() -> None:
    """Two GPUs in two datacenters, 5 ms apart one way, 100 Gbit/s across: each of NCCL's 2
    channels keeps at most its 8 slots of the 4 MiB Simple buffer in flight per 10 ms round
    trip, so the ring moves 2 x 4 MiB / 10 ms = 839 MB/s, not 12.5 GB/s (hand computation,
    constants from NCCL's src/init.cc and src/graph/connect.cc)."""
    net = parse_network("gpus_per_node=1,inter_node_bw=100Gbit/s,ranks_per_dc=1,"
                        "dc_latency=5ms")
    s = 1e9
    rate = 2 * (4 << 20) / 10e-3
    step = STEP_US["net"]["simple"] * 1e-6 + 5e-3
    want = BASE_US["simple"] * 1e-6 + 2 * (step + s / 2 / rate)
    assert collective_time(net, "allreduce", s, [0, 1]) == pytest.approx(want)
    # a faster link across changes nothing: the window binds
    faster = replace(net, dc_bw=parse_bandwidth("400Gbit/s"))
    assert collective_time(faster, "allreduce", s, [0, 1]) == pytest.approx(want)
    # send/recv: 2 channels x 8 slots of 128 KiB per round trip
    p2p = BASE_US["simple"] * 1e-6 + step + s / (2 * 8 * (128 << 10) / 10e-3)
    assert collective_time(net, "send", s, [0, 1]) == pytest.approx(p2p)


def test_nccl_window_does_not_bind_inside_a_datacenter() -> None:
    """At 2 us one way the window allows 2 x 4 MiB / 4 us = 2 TB/s: the NIC's 50 GB/s is the
    rate, and the ring is the plain alpha-beta sum."""
    net = parse_network("gpus_per_node=1,inter_node_bw=400Gbit/s,inter_node_latency=2us")
    s = 1e9
    step = STEP_US["net"]["simple"] * 1e-6 + 2e-6
    want = BASE_US["simple"] * 1e-6 + 2 * (step + s / 2 / 50e9)
    assert collective_time(net, "allreduce", s, [0, 1]) == pytest.approx(want)


def test_nccl_all_to_all_moves_up_to_eight_peers_at_once() -> None:
    """16 ranks, one per node: 15 peers over the network in two batches of NCCL's 8 p2p
    transfers, so two steps' latency, and every peer's share over the rank's link."""
    net = parse_network("gpus_per_node=1,inter_node_bw=400Gbit/s,inter_node_latency=1ms")
    s = 1.6e9
    step = STEP_US["net"]["simple"] * 1e-6 + 1e-3
    rate = min(50e9, 15 * 2 * 8 * (128 << 10) / 2e-3)  # 15 connections' windows, or the NIC
    want = BASE_US["simple"] * 1e-6 + 2 * step + 15 * (s / 16) / rate
    assert collective_time(net, "all_to_all", s, list(range(16))) == pytest.approx(want)


def test_a_node_cannot_span_datacenters() -> None:
    with pytest.raises(ValueError, match="ranks_per_dc=4 splits a node of gpus_per_node=8"):
        parse_network("ranks_per_dc=4")
    assert parse_network("gpus_per_node=4,ranks_per_dc=4").ranks_per_dc == 4
