"""The replayer's network model: units, topology specs and NCCL-style collective costs."""

from __future__ import annotations

import itertools
import math

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
