"""Point-to-point calls (docs/collectives.md, "Point-to-point pairs"): a send on rank a to
peer b is one instance with the receive on rank b from peer a, the k-th with the k-th of the
ordered pair in each ProfilerStep; collective_instances, stragglers, clock offsets and the
replay graph use those pairs, so a network what-if prices each message on its own link.
Checked on synthetic 4-stage 1F1B jobs laid out from the schedule (tests/test_pipeline.py:
every message completes at max(send post, receive post) + its link's transfer time), and on
the rig's 4-stage gloo pipeline."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import tracetool
from tests._util import REPO, run, write
from tests.test_pipeline import AR_US, ORDERS, STAGE_RANKS, lay_out, write_job
from tracetool.analysis.collectives import collective_warnings
from tracetool.replay.network import collective_time, parse_network

PP = REPO / "sample_traces" / "netlab" / "pp1f1b4_1gbit"
PP_NET = "gpus_per_node=1,inter_node_bw=1Gbit/s,inter_node_latency=51us"
SRC = "gpus_per_node=1,inter_node_bw=inf,inter_node_latency=50us"
MSG = 64 * 1024 * 4  # one activation / gradient of the synthetic jobs (bytes)
REFUSAL = ("tracetool: error: network what-if: job {job} has {n} point-to-point calls "
           "(send/recv) that the replay matches as group-wide collectives, not "
           "sender-receiver pairs, so it would price their transfers wrong; it does not "
           "project them onto another network yet (docs/collectives.md)\n")

# the link's pricing alone, in the module's traces and projections (conftest)
pytestmark = pytest.mark.usefixtures("link_pricing_only")


def _price(spec: str) -> float:
    """The network model's time of one synthetic message on ``spec``, in us."""
    return collective_time(parse_network(spec), "send", MSG, [0, 1], "gloo") * 1e6


def _step_us(events: dict) -> float:
    """The laid-out job's step (2 steps from t = 1 s), in us."""
    return (max(e["ts"] + e["dur"] for evs in events.values() for e in evs) - 1_000_000) / 2


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """f1b: the synthetic 1F1B job, each message taking the source network's price; crop:
    the same with stage 0's (rank 2's) first step cut off by its trace window; nopeer: the
    same with no peer recorded (no Concrete Inputs); pair: a 2-rank job, one send/recv a
    step."""
    root = tmp_path_factory.mktemp("p2p")
    st = root / "store"
    events, _ = lay_out(ORDERS["1f1b"], t_us=_price(SRC))
    crop = copy.deepcopy(events)
    step2 = next(e["ts"] for e in crop[2] if e["name"] == "ProfilerStep#2")
    crop[2] = [e for e in crop[2] if e["ts"] >= step2]
    nopeer = copy.deepcopy(events)
    for evs in nopeer.values():
        for e in evs:
            e.get("args", {}).pop("Concrete Inputs", None)
    for job, evs in (("f1b", events), ("crop", crop), ("nopeer", nopeer)):
        code, _, err = run("ingest", write_job(root / job, evs), "--store", st, "--job", job)
        assert code == 0, err
    pair = root / "pair"
    pair.mkdir()
    for rank in (0, 1):
        evs = []
        for step in (1, 2):
            t0 = step * 10_000
            evs += [_x(f"ProfilerStep#{step}", t0, 10_000, rank, cat="user_annotation"),
                    _x("aten::mm", t0, 2_000, rank)]
            ci = ["", "", str(1 - rank), "0"]
            name = "send" if rank == 0 else "recv_"
            evs += [_x(f"c10d::{name}", t0 + 2_000, 10, rank,
                       **{"Concrete Inputs": ci, "Input Dims": [[[64, 1024]], [], [], []],
                          "Input type": ["TensorList", "", "Scalar", "Scalar"]}),
                    _x(f"gloo:{'send' if rank == 0 else 'recv'}", t0 + 2_005, 3_000, rank,
                       cat="user_annotation", **{"Input Dims": [[64, 1024]],
                                                 "Input type": ["float"]})]
        head = {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {
            "backend": "gloo", "rank": rank, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2,
                           "ranks": [0, 1]}]},
            "traceEvents": sorted(evs, key=lambda e: (e["ts"], -e["dur"]))}
        write(pair / f"rank{rank}.json", json.dumps(head))
    code, _, err = run("ingest", pair, "--store", st, "--job", "pair")
    assert code == 0, err
    return st


def _x(name: str, ts: float, dur: float, rank: int, *, cat: str = "cpu_op",
       **args: object) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": 1, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _pairs(con: object, job: str) -> dict[str, list[tuple]]:
    """instance -> its (rank, kind, peer_rank, step) rows, of the job's send/recv calls."""
    out: dict[str, list[tuple]] = {}
    for inst, rank, kind, peer, step in con.execute(
            """SELECT instance, rank, kind, peer_rank, step FROM collective_ranks
               WHERE job = ? AND kind IN ('send', 'recv') AND instance IS NOT NULL
               ORDER BY instance, kind""", [job]).fetchall():
        out.setdefault(inst, []).append((rank, kind, peer, step))
    return out


def test_each_send_is_paired_with_its_receive(store: Path) -> None:
    """2 steps x 3 links x 2 directions x 4 microbatches = 48 messages, each one send on
    rank a to b and one receive on b from a in the same step; every pair's transfer is the
    laid-out one (receive end - the later post); the loss allreduces, no longer shifted by
    the pipeline's calls, match on all 4 ranks."""
    con = tracetool.connect(store)
    pairs = _pairs(con, "f1b")
    assert len(pairs) == 48
    for inst, rows in pairs.items():
        (r_rank, r_kind, r_peer, r_step), (s_rank, s_kind, s_peer, s_step) = rows
        assert (r_kind, s_kind) == ("recv", "send")
        assert (s_peer, r_peer, s_step) == (r_rank, s_rank, r_step)
        assert inst.startswith(f"p2p:0:{s_rank}>{r_rank}:step:{s_step}:")
    links = {frozenset((r[0][0], r[1][0])) for r in pairs.values()}
    assert links == {frozenset(STAGE_RANKS[s:s + 2]) for s in range(3)}
    xfer = {t for (t,) in con.execute(
        """SELECT DISTINCT transfer_ns FROM collective_instances
           WHERE job = 'f1b' AND kind IN ('send', 'recv')""").fetchall()}
    assert xfer == {round(_price(SRC) * 1000)}
    assert con.execute(
        """SELECT count(DISTINCT instance), count(*) FROM collective_instances
           WHERE job = 'f1b' AND kind = 'allreduce' AND n_ranks = 4""").fetchone() == (2, 8)
    # pairs set no clock offset (a send and its receive do not end together)
    assert con.execute("""SELECT DISTINCT n_samples FROM rank_clock_offsets
                          WHERE job = 'f1b'""").fetchall() == [(2,)]


def test_a_cropped_window_pairs_by_step(store: Path) -> None:
    """Stage 0 (rank 2) traced from step 2 on: its step-2 messages pair as in the whole job
    (its k-th send of the step with rank 0's k-th receive of the step, not the k-th of the
    trace); rank 0's step-1 calls with it stay unmatched. The warning counts the calls
    aligned across the group (the loss allreduces: rank 2 has one), not the pairs, which
    differ by stage in every pipeline."""
    con = tracetool.connect(store)
    whole, crop = _pairs(con, "f1b"), _pairs(con, "crop")
    assert len(crop) == 48 - 8
    assert crop == {i: rows for i, rows in whole.items()
                    if not (rows[0][3] == 1 and 2 in (rows[0][0], rows[1][0]))}
    assert con.execute(
        """SELECT rank, count(*) FROM collective_ranks WHERE job = 'crop'
           AND kind IN ('send', 'recv') AND instance IS NULL GROUP BY rank""").fetchall() \
        == [(0, 8)]
    assert collective_warnings(con, "crop")[0] == (
        "collectives of process group 0: ranks have different call counts (rank 0: 2, "
        "rank 1: 2, rank 2: 1, rank 3: 2): their trace windows start or stop at different "
        "collectives; 15 calls found on only some ranks left unmatched")
    assert collective_warnings(con, "f1b") == []


def test_network_whatif_prices_each_message(store: Path) -> None:
    """Traced at 50 us one way, projected onto 500 us: every message then takes the
    model's price on 500 us, so the projection is the job laid out with that transfer time,
    plus the loss allreduce's change (its own listing line)."""
    code, out, err = run("replay", store, "--job", "f1b", "--source-network", SRC,
                         "--network", "inter_node_latency=500us", "--json")
    assert code == 0, err
    r = json.loads(out)
    lines = {(c["kind"], tuple(c["group"])): c for c in r["collectives"]}
    assert {k for k in lines if k[0] == "send"} == {
        ("send", tuple(sorted(STAGE_RANKS[s:s + 2]))) for s in range(3)}
    assert all(c["instances"] == 16 for k, c in lines.items() if k[0] == "send")
    ar = lines[("allreduce", (0, 1, 2, 3))]
    assert ar["measured_transfer_ns"] == 2 * AR_US * 1000
    ar_delta_us = (ar["projected_transfer_ns"] - ar["measured_transfer_ns"]) / 2 / 1000
    events, _ = lay_out(ORDERS["1f1b"], t_us=_price("gpus_per_node=1,inter_node_bw=inf,"
                                                     "inter_node_latency=500us"))
    want = (_step_us(events) + ar_delta_us) * 1000
    assert [s["projected_step_ns"] for s in r["steps"]] == pytest.approx([want, want], abs=2)


def test_placement_prices_each_link(store: Path, tmp_path: Path) -> None:
    """Stages 0-1 (ranks 2, 0) in one datacenter, stages 2-3 (ranks 3, 1) in another, 5 ms
    apart: only the messages between stages 1 and 2 cross, and the projection is the job
    laid out with 5 ms-priced messages on that link alone."""
    place = tmp_path / "place.csv"
    write(place, "rank,node,datacenter\n0,n0,east\n1,n1,west\n2,n2,east\n3,n3,west\n")
    dst = "dc_bw=inf,dc_latency=5ms"
    code, out, err = run("replay", store, "--job", "f1b", "--source-network", SRC,
                         "--network", dst, "--placement", place, "--json")
    assert code == 0, err
    r = json.loads(out)
    links = {tuple(c["group"]): c["links"] for c in r["collectives"] if c["kind"] == "send"}
    assert links == {(0, 2): ["inter"], (0, 3): ["inter", "dc"], (1, 3): ["inter"]}
    far = collective_time(parse_network(f"{SRC},{dst},ranks_per_dc=2"), "send", MSG, [0, 2],
                          "gloo") * 1e6
    assert far > 10_000  # the 5 ms each way of gloo's rendezvous

    def link_us(a: int, b: int) -> float:
        return far if {a, b} == {0, 3} else _price(SRC)

    events, _ = lay_out(ORDERS["1f1b"], link_us=link_us)
    ar = next(c for c in r["collectives"] if c["kind"] == "allreduce")
    ar_delta_us = (ar["projected_transfer_ns"] - ar["measured_transfer_ns"]) / 2 / 1000
    want = (_step_us(events) + ar_delta_us) * 1000
    assert [s["projected_step_ns"] for s in r["steps"]] == pytest.approx([want, want], abs=2)


def test_identity_replay_still_exact(store: Path) -> None:
    code, out, err = run("replay", store, "--job", "f1b", "--json")
    assert code == 0, err
    steps = json.loads(out)["steps"]
    assert steps and all(s["projected_step_ns"] == s["measured_step_ns"]
                         and s["projected_breakdown_ns"] == s["measured_breakdown_ns"]
                         and sum(s["critical_path_ns"].values()) == s["measured_step_ns"]
                         for s in steps)


def test_unpaired_p2p_still_refused(store: Path) -> None:
    """With no peer recorded the calls cannot be paired: matched by position on every rank
    of the group (instances of 4 ranks), a network what-if is refused in one line."""
    con = tracetool.connect(store)
    rows = con.execute(
        "SELECT DISTINCT count(*) OVER (PARTITION BY instance) FROM collective_ranks "
        "WHERE job = 'nopeer' AND kind IN ('send', 'recv') AND instance IS NOT NULL").fetchall()
    assert rows == [(4,)]
    (n,) = con.execute(
        "SELECT count(DISTINCT instance) FROM collective_ranks WHERE job = 'nopeer' "
        "AND kind IN ('send', 'recv') AND instance IS NOT NULL").fetchone()
    code, out, err = run("replay", store, "--job", "nopeer", "--source-network", SRC,
                         "--network", "inter_node_latency=500us")
    assert (code, out, err) == (2, "", REFUSAL.format(job="nopeer", n=n))


def test_a_pair_is_priced(store: Path) -> None:
    assert len(_pairs(tracetool.connect(store), "pair")) == 2
    code, _, err = run("replay", store, "--job", "pair", "--source-network", SRC,
                       "--network", "inter_node_bw=10Gbit/s")
    assert code == 0, err


@pytest.mark.skipif(not PP.is_dir(), reason="the rig's pipeline traces "
                    "(sample_traces/netlab/pp1f1b4_1gbit) are not in this checkout")
def test_rig_pipeline_pairs(tmp_path: Path) -> None:
    """The rig's 1F1B job (4 stages, 4 microbatches, 6 steps): 6 x 3 x 2 x 4 = 144 messages
    of 262,144 bytes, each a send and its receive (the tags, the microbatches, agree with
    the order); the 6 loss allreduces on all 4 ranks (none matched before: the pipeline's
    calls shifted them); a network what-if runs."""
    code, _, err = run("ingest", PP, "--store", tmp_path / "s", "--job", "pp")
    assert code == 0, err
    con = tracetool.connect(tmp_path / "s")
    pairs = _pairs(con, "pp")
    assert len(pairs) == 144
    assert all(len(rows) == 2 and rows[1][2] == rows[0][0] and rows[0][2] == rows[1][0]
               and abs(rows[0][0] - rows[1][0]) == 1 for rows in pairs.values())
    assert con.execute(
        """SELECT count(DISTINCT instance), count(*), min(n_ranks) FROM collective_instances
           WHERE job = 'pp' AND kind = 'allreduce'""").fetchone() == (6, 24, 4)
    tags = con.execute(
        """SELECT count(*) FILTER (c.instance IS NOT NULL AND split_part(c.instance, ':', 6)
                                   = (e.args->'Concrete Inputs'->>3)), count(*)
           FROM collective_ranks c JOIN events e USING (job, rank, eid)
           WHERE c.job = 'pp' AND c.kind IN ('send', 'recv')""").fetchone()
    assert tags == (288, 288)  # the k-th of a step is microbatch k: its tag
    # a pair's transfer: the receive's end after the later post (aligned clocks), computed
    # here from the calls; not the shorter span (a buffered send's: 16 us and up)
    got = dict(con.execute(
        "SELECT DISTINCT instance, transfer_ns FROM collective_instances WHERE job = 'pp' "
        "AND kind IN ('send', 'recv')").fetchall())
    off = dict(con.execute("SELECT rank, offset_ns FROM rank_clock_offsets WHERE job = 'pp'")
               .fetchall())
    calls = con.execute("SELECT instance, rank, kind, ts_ns, end_ns FROM collective_ranks "
                        "WHERE job = 'pp' AND kind IN ('send', 'recv')").fetchall()
    want: dict[str, list] = {}
    for inst, rank, kind, ts, end in calls:
        w = want.setdefault(inst, [0, 0])
        w[0] = max(w[0], ts - off[rank])
        if kind == "recv":
            w[1] = end - off[rank]
    assert got == {i: max(0, e - t) for i, (t, e) in want.items()}
    shortest = con.execute(
        "SELECT count(*) FILTER (min_dur < 100000) FROM (SELECT min(dur_ns) AS min_dur "
        "FROM collective_ranks WHERE job = 'pp' AND kind = 'send' GROUP BY instance)").fetchone()
    assert shortest[0] == 68  # sends done in < 100 us (buffered): their span is no transfer
    code, out, err = run("replay", tmp_path / "s", "--job", "pp", "--source-network", PP_NET,
                         "--network", f"{PP_NET},ranks_per_dc=2,dc_bw=1Gbit/s,"
                         "dc_latency=5129us", "--json")
    assert code == 0, err
    links = {tuple(c["group"]): c["links"] for c in json.loads(out)["collectives"]
             if c["kind"] == "send"}
    assert links == {(0, 1): ["inter"], (1, 2): ["inter", "dc"], (2, 3): ["inter"]}
