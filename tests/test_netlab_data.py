"""The netlab ground truth of the second capture (issues 27 and 28: gradient buckets, a smaller
model on 2 threads, 8 ranks, skewed all-to-all, pipeline send/recv): every setting it added
ingests, and its traces hold what ``measured.json`` records about the job. The facts are
read here from the raw trace JSON, not through make_netlab.py's summaries: ranks and world
size, the six ProfilerSteps and their durations, the gradient allreduce sizes per step, the
all-to-all split sizes (consistent across ranks: what src sends to dst is what dst receives
from src), and the pipeline's sends and receives per stage and step with their peers, tags
and sizes."""

from __future__ import annotations

import gzip
import json
import re
from functools import cache

import duckdb
import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import REPO

NETLAB = REPO / "sample_traces" / "netlab"
MEASURED = json.loads((NETLAB / "measured.json").read_text())
SETTINGS = MEASURED["settings"]
NEW = [name for name, s in SETTINGS.items() if s.get("capture", 0) >= 1]
VALIDATION = json.loads((NETLAB / "validation.json").read_text())
STEPS = 6


@cache
def events(setting: str, rank: int) -> tuple[dict, list[dict]]:
    """(distributedInfo, the complete events in time order) of one rank's trace."""
    path = NETLAB / SETTINGS[setting]["dir"] / f"rank{rank}.pt.trace.json.gz"
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    evs = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    return trace.get("distributedInfo") or {}, evs


def by_step(evs: list[dict], name: str | re.Pattern) -> list[list[dict]]:
    """The events called ``name`` (or matching it) inside each ProfilerStep, in order."""
    steps = [e for e in evs if e["name"].startswith("ProfilerStep#")]
    match = (lambda n: n == name) if isinstance(name, str) else name.fullmatch
    return [[e for e in evs if match(e["name"]) and s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
            for s in steps]


def numel(e: dict) -> int:
    n = 1
    for d in e["args"]["Input Dims"][0]:
        n *= d
    return n


def test_the_second_capture_is_there_and_its_split_was_committed_first() -> None:
    assert len(NEW) == 22
    assert {"10gbit", "b1_1gbit", "bs_1gbit", "m2_1gbit", "w8_1gbit", "skew1_1gbit",
            "skew2_200mbit", "pp1f1b4_1gbit", "pp1f1b8_1gbit", "ppgpipe4_1gbit",
            "pp1f1b4_1gbit_5ms_2dc"} <= set(NEW)
    assert sorted(VALIDATION["chosen_from"]) == sorted(NEW)
    held = set(VALIDATION["held_out_settings"])
    assert held <= set(NEW) and held.isdisjoint(VALIDATION["fit_settings"])
    assert held | set(VALIDATION["fit_settings"]) == set(NEW)
    assert VALIDATION["pipeline_source"] not in held
    # every DDP family of the capture has 10 Gbit/s and a >= 5 ms one-way setting
    for pattern in ("ddp_one_bucket", "ddp_small_buckets", "ddp_small_model_2threads"):
        mine = [s for s in SETTINGS.values() if s["pattern"] == pattern]
        assert any(s["rate_bits_per_s"] == 10e9 for s in mine)
        assert any(s["one_way_delay_us"] >= 5000 for s in mine)


@pytest.mark.parametrize("setting", NEW)
def test_ranks_steps_and_gradient_allreduces_agree_with_measured(setting: str) -> None:
    s = SETTINGS[setting]
    for rank in range(s["world_size"]):
        info, evs = events(setting, rank)
        assert (info["rank"], info["world_size"]) == (rank, s["world_size"])
        steps = [e for e in evs if e["name"].startswith("ProfilerStep#")]
        assert [e["name"] for e in steps] == s["traces"]["profiler_step_names"]
        assert len(steps) == STEPS
        assert [round(e["dur"] * 1000) for e in steps] == \
            s["traces"]["profiler_step_ns"][f"rank{rank}"]
        grads = [[numel(e) * 4 for e in st if numel(e) > 1]
                 for st in by_step(evs, "gloo:all_reduce")]
        assert grads == [s["bucket_bytes"]] * STEPS  # every step, in order
        losses = [[e for e in st if numel(e) == 1] for st in by_step(evs, "gloo:all_reduce")]
        assert [len(x) for x in losses] == [1] * STEPS  # the loss allreduce ends every step
    if s["kind"] == "ddp":
        assert sum(s["bucket_bytes"]) == s["grad_bytes"]
        assert len(s["bucket_bytes"]) == s["num_buckets"]


def test_bucket_structure_of_the_ddp_variants() -> None:
    assert SETTINGS["b1_1gbit"]["bucket_bytes"] == [16_834_600]  # one bucket: every gradient
    small = SETTINGS["bs_1gbit"]["bucket_bytes"]
    assert len(small) == 16 and max(small) < 1.1e6  # ~1 MiB per layer (the head joins one)
    assert SETTINGS["10gbit"]["bucket_bytes"] == [4_239_400, 8_392_704, 4_202_496]  # original
    assert SETTINGS["m2_1gbit"]["grad_bytes"] == 1_055_242 * 4
    assert SETTINGS["w8_1gbit"]["bucket_bytes"] == SETTINGS["10gbit"]["bucket_bytes"]


@pytest.mark.parametrize("setting", [n for n in NEW if SETTINGS[n]["kind"] == "moe"])
def test_skewed_all_to_all_split_sizes(setting: str) -> None:
    s = SETTINGS[setting]
    a2a, n = s["all_to_all"], s["world_size"]
    counts = a2a["split_counts"]
    splits = {}  # rank -> per step, the 4 all-to-alls' (out, in) split sizes
    for rank in range(n):
        _, evs = events(setting, rank)
        per_step = by_step(evs, "c10d::alltoall_base_")
        assert [len(x) for x in per_step] == [4] * STEPS
        splits[rank] = [[(json.loads(e["args"]["Concrete Inputs"][3]),
                          json.loads(e["args"]["Concrete Inputs"][4])) for e in st]
                        for st in per_step]
        assert all(st == splits[rank][0] for st in splits[rank])  # the same every step
        for e in (e for st in per_step for e in st):  # the tensors' rows are the splits' sums
            out_rows, in_rows = e["args"]["Input Dims"][0][0], e["args"]["Input Dims"][1][0]
            ci = e["args"]["Concrete Inputs"]
            assert (out_rows, in_rows) == (sum(json.loads(ci[3])), sum(json.loads(ci[4])))
        gloo = by_step(evs, "gloo:all_to_all")
        assert [len(x) for x in gloo] == [4] * STEPS
    for rank in range(n):
        (out, inp), combine, bwd1, bwd2 = splits[rank][0]
        assert inp == counts[rank] and sum(inp) == 1024  # dispatch: this rank's tokens
        assert out == [splits[src][0][0][1][rank] for src in range(n)]  # what src sent here
        # combine sends the tokens back; backward repeats both, the combine's gradient first
        assert combine == (inp, out) and bwd1 == (out, inp) and bwd2 == (inp, out)
    tokens = [sum(counts[src][r] for src in range(n)) for r in range(n)]
    assert tokens == a2a["expert_tokens_per_rank"]
    shares = MEASURED["job"]["patterns"][s["pattern"]]["expert_shares"]
    assert tokens.index(max(tokens)) == shares.index(max(shares))  # the hot expert is hot
    assert max(tokens) > 1.5 * 1024  # skewed: the hot rank gets far more than its share


def test_the_two_skews_differ_and_each_is_the_same_at_both_link_settings() -> None:
    c = {n: SETTINGS[n]["all_to_all"]["split_counts"] for n in
         ("skew1_1gbit", "skew1_200mbit", "skew2_1gbit", "skew2_200mbit")}
    assert c["skew1_1gbit"] == c["skew1_200mbit"] and c["skew2_1gbit"] == c["skew2_200mbit"]
    hot = [max(sum(row[r] for row in c[n]) for r in range(4)) for n in ("skew1_1gbit",
                                                                        "skew2_1gbit")]
    assert hot[0] < hot[1]  # Zipf 2 concentrates more tokens on the hot expert than Zipf 1


@pytest.mark.parametrize("setting", [n for n in NEW if SETTINGS[n]["kind"] == "pipeline"])
def test_pipeline_sends_and_receives_identify_stage_and_microbatch(setting: str) -> None:
    s = SETTINGS[setting]
    pipe, n = s["pipeline"], s["world_size"]
    mbs = pipe["microbatches"]
    for rank in range(n):
        _, evs = events(setting, rank)
        sends = by_step(evs, "c10d::send")
        recvs = by_step(evs, "c10d::recv_")
        st = pipe["per_stage"][rank]
        assert [len(x) for x in sends] == st["sends_per_step"] * STEPS
        assert [len(x) for x in recvs] == st["recvs_per_step"] * STEPS
        for step_sends, step_recvs in zip(sends, recvs, strict=True):
            def peer_tags(ops: list[dict], peer: int) -> list[int]:
                return [int(e["args"]["Concrete Inputs"][3]) for e in ops
                        if int(e["args"]["Concrete Inputs"][2]) == peer]
            # activations forward, gradients back, each microbatch once, tagged with it
            fwd_out = peer_tags(step_sends, rank + 1)
            bwd_out = peer_tags(step_sends, rank - 1)
            fwd_in, bwd_in = peer_tags(step_recvs, rank - 1), peer_tags(step_recvs, rank + 1)
            last, first = rank == n - 1, rank == 0
            assert fwd_out == ([] if last else list(range(mbs)))
            assert bwd_in == ([] if last else list(range(mbs)))
            assert fwd_in == ([] if first else list(range(mbs)))
            assert bwd_out == ([] if first else list(range(mbs)))
            assert len(step_sends) + len(step_recvs) == len(fwd_out + bwd_out + fwd_in + bwd_in)
        sizes = {numel(e) * 4 for e in evs if e["name"] in ("gloo:send", "gloo:recv")}
        assert sizes == {pipe["message_bytes"]} == {64 * 1024 * 4}
        fwd = by_step(evs, re.compile(r"fwd_mb\d+"))
        bwd = by_step(evs, re.compile(r"bwd_mb\d+"))
        want = [f"mb{i}" for i in range(mbs)]
        assert all([e["name"][4:] for e in x] == want for x in fwd)
        assert all([e["name"][4:] for e in x] == want for x in bwd)
        if pipe["schedule"] == "gpipe":  # every forward before any backward
            assert all(max(e["ts"] for e in f) < min(e["ts"] for e in b)
                       for f, b in zip(fwd, bwd, strict=True))
        elif rank == n - 1:  # 1F1B's last stage: each forward straight followed by its backward
            assert all(f[i]["ts"] < b[i]["ts"] < f[i + 1]["ts"] for f, b in zip(fwd, bwd,
                                                                              strict=True)
                       for i in range(mbs - 1))


def test_the_split_pipeline_delays_only_across_the_split() -> None:
    s = SETTINGS["pp1f1b4_1gbit_5ms_2dc"]
    assert s["dc_split"] == 2 and "ranks_per_dc=2" in s["network_spec"]
    assert "-s <address" in s["delay_rule"]
    across, within = s["tcp_pingpong"], s["tcp_pingpong_within"]
    assert across["added_rtt_us"] == pytest.approx(10_000, abs=across["tolerance_us"])
    assert within["rtt_us_median"] < within["base_rtt_us_median"] + 300


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    """Rank 1 of every new setting, each file its own job, in one ingest (batched: ~1/20 of
    ingesting every rank of every setting apart; tests/test_replay.py ingests them all and
    replays each job's identity). Rank 1 is a middle stage of the pipeline: it both sends
    and receives in each direction."""
    path = tmp_path_factory.mktemp("netlab_data") / "store"
    files = [NETLAB / SETTINGS[name]["dir"] / "rank1.pt.trace.json.gz" for name in NEW]
    results = ingest(files, Options(store=path, job_per_file=True))
    assert [r.status for r in results] == ["ingested"] * len(NEW)
    return tracetool.connect(path)


def test_every_new_setting_ingests_with_its_steps_and_collectives(
        store: duckdb.DuckDBPyConnection) -> None:
    jobs = {job: f"{SETTINGS[name]['dir']}_rank1" for name in NEW for job in [name]}
    for name, job in jobs.items():
        steps = store.execute("SELECT count(*) FROM steps WHERE job = ?", [job]).fetchone()
        assert steps == (STEPS,), name
        got = dict(store.execute("SELECT collective, count(*) FROM collectives WHERE job = ? "
                                 "AND step IS NOT NULL GROUP BY 1", [job]).fetchall())
        _, evs = events(name, 1)
        raw = {op: sum(len(x) for x in by_step(evs, f"c10d::{op}"))
               for op in ("allreduce_", "alltoall_base_", "send", "recv_")}
        want = {k.rstrip("_"): v for k, v in raw.items() if v}
        assert got == want, (name, got, raw)
