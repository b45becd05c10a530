"""--placement FILE (replay/placement.py): parsing and its errors, the gpus_per_node /
ranks_per_dc shorthand as the same placement, a placement no contiguous one gives, and the
collective listing (replay --json "collectives": links crossed, bytes, transfer, exposed) on
the 8-rank DLRM job of the corpus (one node of 8 V100s, 5 all-to-alls and 3 allreduces over
all 8 ranks in its one complete step)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import tracetool
from tests._util import run
from tests.conftest import run_ingest
from tracetool.errors import InputError
from tracetool.replay.model import (
    NetworkNoOp,
    Scenario,
    check_scenario,
    collective_factors,
    source_network,
)
from tracetool.replay.network import Network, collective_time, parse_network
from tracetool.replay.placement import Placement, read_placement
from tracetool.replay.run import Replayer, collective_listing

DC = "dc_latency=4.9ms,dc_bw=100Gbit/s"


def _csv(path: Path, rows: list[tuple[int, str, str]] | str) -> Path:
    text = rows if isinstance(rows, str) else "rank,node,datacenter\n" + "".join(
        f"{r},{n},{d}\n" for r, n, d in rows)
    path.write_text(text)
    return path


def _blocks_rows(per_node: int, per_dc: int, n: int = 8) -> list[tuple[int, str, str]]:
    return [(r, f"n{r // per_node}", f"dc{r // per_dc}") for r in range(n)]


# ---- parsing ----------------------------------------------------------------------------

def test_csv_and_toml_give_the_same_placement(tmp_path: Path) -> None:
    rows = [(0, "a", "east"), (1, "b", "west"), (2, "a", "east"), (3, "c", "west")]
    csv_p = read_placement(_csv(tmp_path / "p.csv", rows))
    toml = tmp_path / "p.toml"
    toml.write_text('[nodes]\na = [0, 2]\nb = [1]\nc = [3]\n'
                    '[datacenters]\neast = ["a"]\nwest = ["b", "c"]\n')
    toml_p = read_placement(toml)
    assert csv_p == toml_p
    node, dc = csv_p.where([0, 1, 2, 3])
    assert node.tolist() == [0, 1, 0, 2] and dc.tolist() == [0, 1, 0, 1]
    # past the table (--dp-scale's projected ranks): placed like rank % 4 on new nodes and
    # datacenters
    node, dc = csv_p.where([4, 5, 7])
    assert node.tolist() == [3, 4, 5] and dc.tolist() == [2, 3, 3]
    # rank,node alone: one datacenter, and so do projected ranks
    one = read_placement(_csv(tmp_path / "q.csv", "rank,node\n0,a\n1,a\n2,b\n3,b\n"))
    assert one == Placement.blocks(2, None)
    assert one.where([5])[1].tolist() == [0]


def test_the_shorthand_is_a_placement_of_blocks(tmp_path: Path) -> None:
    f = read_placement(_csv(tmp_path / "p.csv", _blocks_rows(4, 4)))
    b = Placement.blocks(4, 4)
    ranks = np.arange(64)
    assert [x.tolist() for x in f.where(ranks)] == [x.tolist() for x in b.where(ranks)]
    assert [x.tolist() for x in b.where(ranks)] == [(ranks // 4).tolist(),
                                                     (ranks // 4).tolist()]
    assert Network(gpus_per_node=4, ranks_per_dc=4).layout == b


ERRORS = [
    ("h.csv", "node,rank\n0,a\n",
     "placement {p}: the first line must be the header rank,node,datacenter (or rank,node), "
     "not 'node,rank'"),
    ("f.csv", "rank,node,datacenter\n0,a\n",
     "placement {p}: line 2 has 2 fields, the header 3"),
    ("r.csv", "rank,node\n0,a\nx,b\n",
     "placement {p}: line 3: rank 'x' is not a whole number from 0 to 131071"),
    ("big.csv", "rank,node\n131072,a\n",
     "placement {p}: line 2: rank '131072' is not a whole number from 0 to 131071"),
    ("neg.csv", "rank,node\n-1,a\n",
     "placement {p}: line 2: rank '-1' is not a whole number from 0 to 131071"),
    ("twice.csv", "rank,node\n0,a\n1,a\n0,b\n",
     "placement {p}: rank 0 placed twice (line 2 and line 4)"),
    ("gap.csv", "rank,node\n0,a\n2,a\n",
     "placement {p}: places 2 ranks but not rank 1: give ranks 0 to 1, each once"),
    ("split.csv", "rank,node,datacenter\n0,a,east\n1,a,west\n",
     "placement {p}: node 'a' is in two datacenters, 'east' (line 2) and 'west' (line 3)"),
    ("empty.csv", "rank,node,datacenter\n",
     "placement {p}: places no rank"),
    ("noname.csv", "rank,node\n0,\n",
     "placement {p}: line 2: give a node name of 1 to 256 characters"),
    ("long.csv", "rank,node\n0," + "n" * 257 + "\n",
     "placement {p}: line 2: give a node name of 1 to 256 characters"),
    ("bad.toml", "[nodes\n",
     "placement {p}: bad TOML: Expected ']' at the end of a table declaration (at line 1, "
     "column 7)"),
    ("none.toml", "a = 1\n",
     "placement {p}: give a [nodes] table (node = [ranks]) and optionally [datacenters] "
     "(datacenter = [nodes]); unknown: a"),
    ("ghost.toml", '[nodes]\na = [0]\n[datacenters]\neast = ["b"]\n',
     "placement {p}: datacenter 'east' lists node 'b', which [nodes] does not have"),
    ("two.toml", '[nodes]\na = [0]\n[datacenters]\neast = ["a"]\nwest = ["a"]\n',
     "placement {p}: node 'a' is in two datacenters, 'east' and 'west'"),
    ("lost.toml", '[nodes]\na = [0]\nb = [1]\n[datacenters]\neast = ["a"]\n',
     "placement {p}: node 'b' is in no datacenter"),
    ("notlist.toml", '[nodes]\na = 0\n',
     "placement {p}: node 'a' must list its ranks"),
    ("float.toml", '[nodes]\na = [0.5]\n',
     "placement {p}: node 'a': rank 0.5 is not a whole number from 0 to 131071"),
]


@pytest.mark.parametrize(("name", "text", "message"), ERRORS, ids=[e[0] for e in ERRORS])
def test_every_bad_file_is_one_line_naming_it(tmp_path: Path, name: str, text: str,
                                               message: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(InputError) as err:
        read_placement(p)
    assert str(err.value) == message.format(p=p)


def test_unreadable_and_oversized_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(InputError, match=r"^cannot read placement .*nope\.csv: No such file "
                                         r"or directory$"):
        read_placement(missing)
    monkeypatch.setattr("tracetool.replay.placement.MAX_FILE_BYTES", 10)
    with pytest.raises(InputError, match=r"^placement .*p\.csv: larger than 0 MiB$"):
        read_placement(_csv(tmp_path / "p.csv", "rank,node\n0,a\n1,a\n"))


def test_a_placement_and_the_shorthand_together_are_refused(tmp_path: Path) -> None:
    p = read_placement(_csv(tmp_path / "p.csv", _blocks_rows(4, 8)))
    with pytest.raises(InputError) as err:
        parse_network("gpus_per_node=4,dc_latency=1ms", base=Network(placement=p))
    assert str(err.value) == (f"--placement {tmp_path / 'p.csv'} places the ranks: give it "
                              "or gpus_per_node in --network, not both")


# ---- on the DLRM job ----------------------------------------------------------------------



@pytest.fixture(scope="module")
def dlrm(dlrm_store: Path) -> Iterator[tuple[Path, Replayer]]:
    store = dlrm_store  # read-only, shared by the session (tests/conftest.py)
    c = tracetool.connect(store)  # the graph reads op details on first use
    yield store, Replayer.from_store(c, "dlrm")
    c.close()


def _net(rp: Replayer, spec: str, placement: Placement | None = None) -> Network:
    base = source_network(rp.graph, Scenario())
    return parse_network(spec, base=replace(base, placement=placement))


def test_a_file_of_blocks_projects_exactly_as_the_shorthand(dlrm, tmp_path: Path) -> None:
    _, rp = dlrm
    p = read_placement(_csv(tmp_path / "p.csv", _blocks_rows(4, 4)))
    by_file = Scenario(network=_net(rp, DC, p))
    by_keys = Scenario(network=_net(rp, f"gpus_per_node=4,ranks_per_dc=4,{DC}"))
    a, b = rp.run(by_file).to_dict(), rp.run(by_keys).to_dict()
    assert a == b and a["steps"][0]["projected_step_ns"] != a["steps"][0]["measured_step_ns"]
    # and --dp-scale's projected ranks are placed alike
    ka = collective_factors(rp.graph, replace(by_file, dp_scale=2))
    kb = collective_factors(rp.graph, replace(by_keys, dp_scale=2))
    assert np.array_equal(ka[0], kb[0]) and np.array_equal(ka[3], kb[3])


def _contiguous_specs() -> list[str]:
    out = []
    for g in (1, 2, 4, 8):
        out.append(f"gpus_per_node={g}")
        out += [f"gpus_per_node={g},ranks_per_dc={d}" for d in (1, 2, 4, 8) if d % g == 0]
    return out


def test_a_non_contiguous_placement_differs_from_every_contiguous_one(dlrm, tmp_path: Path
                                                                      ) -> None:
    _, rp = dlrm
    # six ranks on node a in one datacenter, ranks 5 and 7 on node b in the other
    rows = [(r, "b" if r in (5, 7) else "a", "west" if r in (5, 7) else "east")
            for r in range(8)]
    p = read_placement(_csv(tmp_path / "p.csv", rows))
    sc = Scenario(network=_net(rp, DC, p))
    k = collective_factors(rp.graph, sc)[3]
    for spec in _contiguous_specs():
        other = collective_factors(rp.graph, Scenario(network=_net(rp, f"{spec},{DC}")))[3]
        assert not np.array_equal(k, other), spec
    # by hand: an 8 MB all-to-all over a short 10 Gbit/s link across (no window binds) is
    # paced by rank 5 / 7, whose 6 peers are across: one batch (P2P_PER_BATCH = 8) of 6 x
    # 1 MB over the link; rank 0 has 2 peers across and 5 on its node
    net = replace(sc.network, dc_latency=5e-6, dc_bw=10e9 / 8)
    per_pair = 1e6

    def across(peers: int) -> float:
        return min(base + net.link("dc", proto)[0] + peers * per_pair
                   / net.link("dc", proto, window=False)[1]
                   for proto, base in (("simple", 8.4e-6), ("ll", 6.6e-6)))
    t = collective_time(net, "all_to_all", 8 * per_pair, list(range(8)))
    assert t == pytest.approx(across(6), rel=1e-12) and t > 2.9 * across(2)
    rows_out = collective_listing(rp, sc, rp.run(sc, critical_path=False))
    assert {r["kind"]: r["links"] for r in rows_out} == {
        "allreduce": ["intra", "inter", "dc"], "all_to_all": ["intra", "inter", "dc"]}


@pytest.mark.parametrize(("rows", "links"), [
    ([(r, f"n{r}", "x") for r in range(8)], ["inter"]),  # a node per rank
    ([(r, f"n{r % 2}", "x") for r in range(8)], ["intra", "inter"]),  # 2 nodes, interleaved
    ([(r, f"n{r % 2}", f"d{r % 2}") for r in range(8)], ["intra", "inter", "dc"]),
])
def test_the_links_a_group_crosses(dlrm, tmp_path: Path, rows, links) -> None:
    _, rp = dlrm
    p = read_placement(_csv(tmp_path / "p.csv", rows))
    sc = Scenario(network=_net(rp, DC, p))
    listing = collective_listing(rp, sc, rp.run(sc, critical_path=False))
    assert [r["links"] for r in listing] == [links, links]


def test_the_listing_bytes_are_the_stores_and_exposed_adds_up_to_the_breakdown(dlrm) -> None:
    store, rp = dlrm
    c = tracetool.connect(store)
    sizes = dict(c.execute("""
        SELECT kind, sum(b) FROM (SELECT instance, any_value(kind) AS kind,
                                         max(bytes) AS b FROM collective_instances
                                  WHERE job = 'dlrm' AND step = 10 GROUP BY instance)
        GROUP BY kind""").fetchall())
    c.close()
    assert sizes == {"all_to_all": 64448, "allreduce": 2485252}
    sc = Scenario(network=_net(rp, f"gpus_per_node=4,ranks_per_dc=4,{DC}"))
    res = rp.run(sc)
    listing = collective_listing(rp, sc, res)
    assert {r["kind"]: r["bytes"] for r in listing} == sizes
    assert {r["kind"]: r["instances"] for r in listing} == {"all_to_all": 5, "allreduce": 3}
    assert all(r["group"] == list(range(8)) for r in listing)
    # no two collectives overlap on a rank here, so the per-collective exposed time adds up
    # to the breakdown's exposed comm (within a ns of rounding per row), measured and
    # projected
    (step,) = res.steps
    for which, bd in (("measured", step.measured), ("projected", step.projected)):
        total = sum(r[f"{which}_exposed_ns"] for r in listing)
        assert abs(total - bd["exposed_comm"]) <= 2, which
    measured_t = sum(r["measured_transfer_ns"] for r in listing)
    assert measured_t == int(rp.graph.insts["transfer_ns"].sum())
    assert sum(r["projected_transfer_ns"] for r in listing) > 100 * measured_t


def test_a_placement_that_changes_nothing_is_refused(dlrm, tmp_path: Path) -> None:
    _, rp = dlrm
    # the source network of a V100 trace: 8 GPUs per node, one datacenter
    p = read_placement(_csv(tmp_path / "one.csv", [(r, "a", "x") for r in range(8)]))
    sc = Scenario(network=replace(source_network(rp.graph, Scenario()), placement=p))
    with pytest.raises(NetworkNoOp) as err:
        check_scenario(rp.graph, sc)
    assert str(err.value) == (
        f"network setting(s) --placement {tmp_path / 'one.csv'} change nothing for job dlrm: "
        "every collective crosses the same links, the same way, as on the source network's "
        "placement (gpus_per_node=8)")
    # from 2 nodes of 4: the same nodes in two datacenters with no datacenter link set
    # cross the same links (a datacenter link is then a node's); with a dc_latency, not
    four = _net(rp, "gpus_per_node=4")
    two = read_placement(_csv(tmp_path / "two.csv", _blocks_rows(4, 4)))
    with pytest.raises(NetworkNoOp, match=r"^network setting\(s\) --placement .*two\.csv "
                                          r"change nothing for job dlrm: every collective"):
        check_scenario(rp.graph, Scenario(source_network=four,
                                          network=replace(four, placement=two)))
    assert check_scenario(rp.graph, Scenario(source_network=four, network=replace(
        four, placement=two, dc_latency=1e-3))) is None
    # the shorthand alike (it was accepted, and priced every collective the same)
    with pytest.raises(NetworkNoOp) as err:
        check_scenario(rp.graph, Scenario(source_network=four, network=parse_network(
            "ranks_per_dc=4", base=four)))
    assert str(err.value) == (
        "network setting(s) ranks_per_dc change nothing for job dlrm: with no dc_bw or "
        "dc_latency a link across datacenters is a node's link, so the datacenters move no "
        "collective onto another link")


def test_the_cli(dlrm, tmp_path: Path) -> None:
    store, _ = dlrm
    six = _csv(tmp_path / "six.csv", [(r, "a" if r < 6 else "b", "e" if r < 6 else "w")
                                      for r in range(8)])
    code, out, err = run("replay", store, "--network", DC, "--placement", six)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"job dlrm, scenario: network={DC}, placement={six}"
    i = lines.index(f"collectives by link (placement {six}; top 2 of 2 by projected exposed, "
                    "summed over the steps):")
    assert lines[i + 1].split() == ["kind", "group", "links", "n", "MB", "transfer", "ms",
                                    "projected", "ms", "exposed", "ms", "projected",
                                    "exposed", "ms"]
    assert lines[i + 3].split()[:5] == ["allreduce", "0-7", "intra+inter+dc", "3", "2.485"]
    # errors: one line, exit 2
    short = _csv(tmp_path / "short.csv", _blocks_rows(2, 4, n=6))
    for args, message in [
        (["--placement", short], f"placement {short}: places ranks 0-5, but job dlrm has 8 "
                                 "ranks (0-7): place each exactly once"),
        (["--placement", six, "--network", "ranks_per_dc=4"],
         f"--placement {six} places the ranks: give it or ranks_per_dc in --network, not "
         "both"),
        (["--placement", tmp_path / "missing.csv"],
         f"cannot read placement {tmp_path / 'missing.csv'}: No such file or directory"),
    ]:
        code, out, err = run("replay", store, *args)
        assert (code, err) == (2, f"tracetool: error: {message}\n"), args
    code, out, err = run("sweep", store, "--placement", six, "--network",
                         "dc_latency=1,5ms", "--out", tmp_path / "sw", "--json")
    assert code == 0, err
    steps = [r["projected_step_ns"] for r in json.loads(out)["rows"]]
    assert steps[0] < steps[1]
    code, out, err = run("sweep", store, "--placement", six, "--network",
                         "gpus_per_node=1,2", "--out", tmp_path / "sw")
    assert (code, err) == (2, f"tracetool: error: --placement {six} places the ranks: give "
                              "it or gpus_per_node in --network, not both\n")


# ---- a gloo job: its ring runs in rank order ------------------------------------------------

W4 = Path(__file__).resolve().parents[1] / "sample_traces" / "netlab" / "w4_1gbit"
W4_SRC = "gpus_per_node=1,inter_node_bw=1Gbit/s,inter_node_latency=43us"


@pytest.fixture(scope="module")
def w4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replayer]:
    store = tmp_path_factory.mktemp("w4") / "store"
    assert run_ingest([W4], store, "--job", "w4").exit_code == 0
    c = tracetool.connect(store)
    yield Replayer.from_store(c, "w4")
    c.close()


def test_gloo_pays_for_an_interleaved_placement_and_exposed_shares_add_up(w4, tmp_path: Path
                                                                         ) -> None:
    src = parse_network(W4_SRC)
    blocks = read_placement(_csv(tmp_path / "b.csv", _blocks_rows(1, 2, n=4)))
    inter = read_placement(_csv(tmp_path / "i.csv", [(r, f"n{r}", f"d{r % 2}")
                                                     for r in range(4)]))
    by_keys = Scenario(source_network=src, network=parse_network(
        "ranks_per_dc=2,dc_latency=4.9ms", base=src))
    results = {}
    for name, p in (("blocks", blocks), ("inter", inter)):
        sc = Scenario(source_network=src, network=replace(src, placement=p,
                                                          dc_latency=4.9e-3))
        results[name] = (sc, w4.run(sc, critical_path=False))
    keys = w4.run(by_keys, critical_path=False)
    assert [s.projected_ns for s in keys.steps] == [
        s.projected_ns for s in results["blocks"][1].steps]
    # gloo's ring sends rank -> rank + 1: 2 + 2 crosses on 2 of its 4 links, the
    # interleaved placement on all 4, and every step is slower
    assert all(i.projected_ns > b.projected_ns for i, b in zip(
        results["inter"][1].steps, results["blocks"][1].steps, strict=True))
    # two allreduces in flight at once (gloo's two threads) share the exposed time: the
    # shares add up to the measured breakdown's exposed comm, step by step summed
    sc, res = results["inter"]
    (row,) = collective_listing(w4, sc, res)
    assert row["links"] == ["inter", "dc"] and row["instances"] == 24
    total = sum(s.measured["exposed_comm"] for s in res.steps)
    assert abs(row["measured_exposed_ns"] - total) <= len(res.steps)


def test_a_long_sweep_charts_where_the_time_goes(tmp_path: Path) -> None:
    """One swept axis of more than 12 values (a curve, not bars): the breakdown is stacked
    as areas under it, so the chart shows exposed comm growing with the latency."""
    from tracetool.replay.plots import plot_sweep

    rows = [{"setting": f"dc_latency={i}ms", "axes": {"dc_latency": f"{i}ms"},
             "measured_step_ns": 20e6, "projected_step_ns": (20 + 3 * i) * 1e6,
             "low_ns": (19 + 3 * i) * 1e6, "high_ns": (22 + 3 * i) * 1e6,
             "projected_breakdown_ns": {"compute": 1e6, "exposed_comm": (5 + 3 * i) * 1e6,
                                        "exposed_memcpy": 0, "idle": 14e6, "comm_ns": 0}}
            for i in range(14)]
    ax = plot_sweep(rows, "dc_latency", tmp_path / "sweep.png").axes[0]
    areas = ax.collections[:4]  # the stacked breakdown, then the band
    assert [c.get_label() for c in areas] == ["compute", "exposed comm",
                                              "memcpy (not overlapped)", "idle"]
    # the top of the exposed comm area at the last setting: compute + exposed comm there
    top = max(v[1] for v in areas[1].get_paths()[0].vertices if v[0] == 13)
    assert top == pytest.approx(1 + 5 + 3 * 13)
