"""gloo's host term (replay/transport.py GLOO_HOST_RATE, host_share): a gloo collective's
segments go at the slower of the link's TCP rate and the host's rate, the host's shared by the
ranks on ``host_cpus`` cores and by their own CPU work; a projection the host paces says so."""

from __future__ import annotations

import json

import pytest

from tracetool.ingest.pipeline import Options, ingest
from tracetool.replay import transport
from tracetool.replay.network import Network, collective_time, parse_network
from tracetool.replay.transport import TCP_PAYLOAD, host_bound, host_rate, host_share

from ._util import REPO, run

NETLAB = REPO / "sample_traces" / "netlab"


def _net(payload_rate: float, latency: str = "5ms", cpus: int | None = None) -> Network:
    spec = (f"gpus_per_node=1,inter_node_bw={payload_rate / TCP_PAYLOAD}B/s,"
            f"inter_node_latency={latency}")
    return parse_network(spec + (f",host_cpus={cpus}" if cpus else ""))


def test_the_host_paces_a_ring_on_a_fast_link() -> None:
    """4 MiB on 2 ranks over a 1e9 B/s link with the host at 2e8 B/s: as the ring of two at
    the link's rate (D + 2T + D per phase, tests/test_network.py), with T a segment at the
    host's rate; on 2 ranks sharing 1 core each gets half a core (T doubles), and with its
    own CPU work beside it half the span, a third of a core."""
    d, seg = 5e-3, 1 << 20
    with host_rate(2e8):
        for cpus, busy, share in ((None, 0.0, 1.0), (None, 1.0, 1.0), (1, 0.0, 0.5),
                                  (1, 0.5, 1 / 3), (4, 1.0, 1.0)):
            net = _net(1e9, cpus=cpus)
            assert host_share(net, 2, busy) == pytest.approx(share)
            got = collective_time(net, "allreduce", 4 << 20, [0, 1], "gloo", busy=busy)
            assert got == pytest.approx(2 * (2 * d + 2 * seg / (2e8 * share))), (cpus, busy)
        # the link slower than the host: the link's time, as before the host term
        assert collective_time(_net(1e8), "allreduce", 4 << 20, [0, 1], "gloo") == (
            pytest.approx(2 * (2 * d + 2 * seg / 1e8)))
        assert host_bound(_net(1e8), "allreduce", [0, 1]) is None
        # (host, link): the link's TCP rate here is its window per round trip, 4 MiB / 10 ms
        assert host_bound(_net(1e9, cpus=1), "allreduce", [0, 1]) == (
            pytest.approx(1e8), pytest.approx((4 << 20) / 0.01))


def test_host_cpus_is_a_count() -> None:
    code, _, err = run("replay", "nostore", "--network", "host_cpus=0")
    assert code == 2
    assert err.strip().splitlines()[-1].endswith(
        "bad host_cpus '0': give a whole number from 1 to 131072")


@pytest.fixture(scope="module")
def m2_store(tmp_path_factory: pytest.TempPathFactory):
    store = tmp_path_factory.mktemp("m2") / "store"
    ingest([NETLAB / "m2_1gbit"], Options(store=store, job="m2"))
    return store


def _replay(store, dst: str) -> dict:
    m = json.loads((NETLAB / "measured.json").read_text())["settings"]
    code, out, err = run("replay", store, "--job", "m2", "--json", "--source-network",
                         m["m2_1gbit"]["network_spec"] + ",host_cpus=2", "--network",
                         m[dst]["network_spec"] + ",host_cpus=2")
    assert code == 0, err
    return json.loads(out)


def test_a_host_bound_projection_says_so(m2_store) -> None:
    """The rig's small-model job traced at 1 Gbit/s, projected onto 10 Gbit/s: its 4.2 MB
    allreduce would take 3.5 ms at the link's rate, but the host's (GLOO_HOST_RATE on a core
    per rank) is below it, so the note says the projection is the CPU's; onto 1 Gbit/s + 5 ms
    the link paces it and there is no such note."""
    fast = _replay(m2_store, "m2_10gbit")
    notes = [n for n in fast["notes"] if n.startswith("gloo is host-bound at this bandwidth")]
    assert len(notes) == 1, fast["notes"]
    assert f"transport.GLOO_HOST_RATE {transport.GLOO_HOST_RATE / 1e6:.0f} MB/s" in notes[0]
    assert "net_host" in " ".join(fast["notes"])  # the band's host term
    slow = _replay(m2_store, "m2_1gbit_5ms")
    assert not [n for n in slow["notes"] if "host-bound" in n], slow["notes"]


def test_cpu_beside_a_collective(m2_store) -> None:
    """m2's one 4.2 MB gradient bucket is allreduced after backward, while its rank's main
    thread waits: no CPU work beside it. So in 3 of the 6 steps; in the others one rank's
    wait is untraced and not linked to the transfer (the thread resumes ~0.1 ms before the
    gloo span's recorded end, but went idle before the span began), so the graph keeps it
    as CPU work and that rank counts as busy throughout (0.5: one rank of two). When the
    graph links those waits this changes, on purpose visibly. Scale 1 is the measured span."""
    import numpy as np

    import tracetool
    from tracetool.replay import Replayer
    from tracetool.replay.model import cpu_busy_share

    g = Replayer.from_store(tracetool.connect(m2_store), "m2").graph
    busy = cpu_busy_share(g)
    grads = g.insts["bytes"] == 4_220_968
    assert grads.sum() == 6
    assert busy[grads] == pytest.approx([0, 0.5, 0, 0.5, 0.5, 0], abs=0.01)
    assert cpu_busy_share(g, np.ones(len(busy))) == pytest.approx(busy)
