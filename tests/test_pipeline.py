"""Pipeline parallelism (docs/pipeline.md): stages and microbatches found from the
point-to-point pattern, the pipeline_bubbles view, and the microbatch / schedule what-ifs, on
synthetic gloo pipeline jobs whose timeline is laid out here from the schedule (so every
bubble and every step is known exactly)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import tracetool
from tests._util import SAMPLES, run, write

US = 1000  # ns
# the canonical chunk orders of 4 stages and 4 microbatches, written out (not generated)
ORDERS = {"gpipe": ["FFFFBBBB"] * 4,
          "1f1b": ["FFFFBBBB", "FFFBFBBB", "FFBFBFBB", "FBFBFBFB"]}
STAGE_RANKS = [2, 0, 3, 1]  # stage -> rank: the stage order is not the rank order
F_US, B_US, PRE_US, POST_US, AR_US = 1000, 2000, 500, 500, 10
SHAPE = {"Input Dims": [[64, 1024]], "Input type": ["float"]}

# the link's pricing alone, in the module's traces and projections (conftest)
pytestmark = pytest.mark.usefixtures("link_pricing_only")


def lay_out(orders: list[str], steps: int = 2, t_us: float = 0,
            link_us: Callable[[int, int], float] | None = None) -> tuple[dict, dict]:
    """Each rank's events, and per (step, stage) its bubble in ns, of a pipeline whose
    stages run ``orders``: between two chunks a stage posts the sends of the chunk it ended
    and the receive of its next one at once and waits for all (Megatron's batched p2p,
    like the rig's job); a message completes at max(send post, receive post) + t_us (or
    ``link_us(rank, peer rank)``: each link its own transfer time). After
    its chunks: the optimizer, then a loss allreduce over every rank that ends the step."""
    n = len(orders)
    events: dict[int, list[dict]] = {r: [] for r in STAGE_RANKS}
    bubbles: dict[tuple[int, int], int] = {}
    t0 = 1_000_000
    for step in range(1, steps + 1):
        progs = []
        for s, order in enumerate(orders):  # ('g', [(send?, key, peer)]) / ('c', F or B)
            ops, group, nf, nb = [], [], 0, 0
            for c in order:
                if c == "F":
                    if s > 0:
                        group.append((False, ("F", s - 1, nf), s - 1))
                    ops += [("g", group), ("c", "F")]
                    group = [(True, ("F", s, nf), s + 1)] if s < n - 1 else []
                    nf += 1
                else:
                    if s < n - 1:
                        group.append((False, ("B", s + 1, nb), s + 1))
                    ops += [("g", group), ("c", "B")]
                    group = [(True, ("B", s, nb), s - 1)] if s > 0 else []
                    nb += 1
            progs.append(ops + [("g", group)])
        t = [t0 + PRE_US] * n
        pc = [0] * n
        posts: dict[tuple, float] = {}  # (key, is_send) -> post time (us)
        bubble = [0] * n
        while any(pc[s] < len(progs[s]) for s in range(n)):
            for s in range(n):
                while pc[s] < len(progs[s]):
                    kind, what = progs[s][pc[s]]
                    rank = STAGE_RANKS[s]
                    if kind == "c":
                        d = F_US if what == "F" else B_US
                        events[rank].append(_x("aten::mm", t[s], d, rank))
                        t[s] += d
                        pc[s] += 1
                        continue
                    for send, key, _ in what:
                        posts.setdefault((key, send), t[s])
                    if any((key, not send) not in posts for send, key, _ in what):
                        break
                    done = t[s]
                    for send, key, peer in what:
                        end = max(t[s], posts[(key, not send)]) + (
                            t_us if link_us is None else link_us(rank, STAGE_RANKS[peer]))
                        done = max(done, end)
                        name = "send" if send else "recv_"
                        ci = ["", "", str(STAGE_RANKS[peer]), "0"]
                        events[rank].append(_x(f"c10d::{name}", t[s], 0, rank,
                                               **{"Concrete Inputs": ci,
                                                  "Input Dims": [[[64, 1024]], [], [], []],
                                                  "Input type": ["TensorList", "", "Scalar",
                                                                 "Scalar"]}))
                        events[rank].append(_x(f"gloo:{'send' if send else 'recv'}", t[s],
                                               end - t[s], rank, cat="user_annotation",
                                               **SHAPE))
                    bubble[s] += done - t[s]
                    t[s] = done
                    pc[s] += 1
        ends = [x + POST_US for x in t]
        e_all = max(ends) + AR_US
        for s, rank in enumerate(STAGE_RANKS):
            ev = events[rank]
            ev.append(_x(f"ProfilerStep#{step}", t0, e_all - t0, rank, cat="user_annotation"))
            ev.append(_x("aten::zero_", t0, PRE_US, rank))
            ev.append(_x("Optimizer.step#SGD.step", t[s], POST_US, rank))
            ev.append(_x("c10d::allreduce_", ends[s], 0, rank,
                         **{"Input Dims": [[[1]]], "Input type": ["TensorList"]}))
            ev.append(_x("gloo:all_reduce", ends[s], e_all - ends[s], rank, tid=2,
                         cat="user_annotation", **{"Input Dims": [[1]],
                                                   "Input type": ["float"]}))
            bubbles[(step, s)] = (bubble[s] + e_all - ends[s]) * US
        t0 = e_all
    return events, bubbles


def _x(name: str, ts: float, dur: float, rank: int, *, cat: str = "cpu_op", tid: int = 1,
       **args: object) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def write_job(d: Path, events: dict) -> Path:
    d.mkdir()
    for rank, evs in events.items():
        head = {"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {
            "backend": "gloo", "rank": rank, "world_size": 4,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4,
                           "ranks": [0, 1, 2, 3]}]},
            "traceEvents": sorted(evs, key=lambda e: (e["ts"], -e["dur"])) + [
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": 2,
                 "args": {"name": "pt_gloo_runloop"}}]}
        write(d / f"rank{rank}.json", json.dumps(head))
    return d


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One store: the GPipe and 1F1B jobs (4 stages, 4 microbatches, no transfer time),
    and 1F1B with 300 us per transfer; with each job's bubbles as laid out."""
    root = tmp_path_factory.mktemp("pipe")
    st = root / "store"
    truth = {}
    for job, orders, t_us in (("gpipe", ORDERS["gpipe"], 0), ("f1b", ORDERS["1f1b"], 0),
                              ("f1b_t", ORDERS["1f1b"], 300)):
        events, bubbles = lay_out(orders, t_us=t_us)
        code, _, err = run("ingest", write_job(root / job, events), "--store", st,
                           "--job", job)
        assert code == 0, err
        truth[job] = bubbles
    return st, truth


def test_stages_found_from_the_send_pattern(store: tuple[Path, dict]) -> None:
    st, _ = store
    c = tracetool.connect(st)
    for job in ("gpipe", "f1b"):
        rows = c.execute("SELECT rank, pipeline, stage, n_stages, prev_rank, next_rank FROM "
                         "pipeline_stages WHERE job = ? ORDER BY stage", [job]).fetchall()
        assert rows == [(2, 2, 0, 4, None, 0), (0, 2, 1, 4, 2, 3), (3, 2, 2, 4, 0, 1),
                        (1, 2, 3, 4, 3, None)]
    mb = c.execute("SELECT job, direction, kind, list(DISTINCT microbatch ORDER BY "
                   "microbatch) FROM pipeline_calls WHERE step = 2 GROUP BY ALL").fetchall()
    assert {r[3] == [0, 1, 2, 3] for r in mb} == {True} and len(mb) == 12


def test_bubbles_against_the_laid_out_timeline(store: tuple[Path, dict]) -> None:
    st, truth = store
    orders = {"gpipe": (ORDERS["gpipe"], "gpipe"), "f1b": (ORDERS["1f1b"], "1f1b"),
              "f1b_t": (ORDERS["1f1b"], "1f1b")}
    rows = tracetool.connect(st).execute("""
        SELECT job, step, stage, dur_ns, busy_ns, bubble_ns, bubble_share, microbatches,
               chunk_order, schedule FROM pipeline_bubbles""").fetchall()
    assert len(rows) == 3 * 2 * 4
    for job, step, stage, dur, busy, bubble, share, mbs, order, schedule in rows:
        assert bubble == truth[job][(step, stage)], (job, step, stage)
        assert busy == dur - bubble and share == pytest.approx(bubble / dur)
        assert (mbs, order, schedule) == (4, orders[job][0][stage], orders[job][1])
        if job != "f1b_t":  # by hand: every stage works (4 + 4) x 3 ms + 1 ms of its
            # (4 + 3) x 3 + 1 ms step (+ 10 us of allreduce) in either schedule
            assert (dur, busy) == (22_010 * US, 13_000 * US)


def test_schedule_orders() -> None:
    from tracetool.replay.pipeline import program

    for sched, orders in ORDERS.items():
        assert [program(sched, s, 4, 4) for s in range(4)] == orders
    # 8 microbatches: 1F1B's warm-up is S - s - 1 forwards, whatever M
    assert [program("1f1b", s, 4, 8) for s in range(4)] == [
        "FFF" + "FB" * 5 + "BBB", "FF" + "FB" * 6 + "BB", "F" + "FB" * 7 + "B", "FB" * 8]
    assert program("1f1b", 0, 4, 2) == "FFBB" and program("gpipe", 3, 4, 1) == "FB"


def test_microbatch_whatif_recomposes_the_chunks(store: tuple[Path, dict]) -> None:
    from tracetool.analysis.pipeline import find_pipeline
    from tracetool.replay.pipeline import replay_pipeline

    st, _ = store
    c = tracetool.connect(st)
    # GPipe, 4 microbatches of F 1 ms, B 2 ms on 4 stages, 1 ms of other work: a step is
    # (4 + 3) x 3 + 1 = 22 ms (+ 10 us of allreduce). 8 microbatches of half the size:
    # (8 + 3) x 1.5 + 1 = 17.5 ms; 2 of twice the size: (2 + 3) x 6 + 1 = 31 ms; 1F1B's
    # step is GPipe's (the same bubble, (S - 1) x (F + B)), so is every projection from it
    pipes = {job: find_pipeline(c, job) for job in ("gpipe", "f1b")}
    p = pipes["f1b"]
    assert (p.ranks, p.microbatches, p.schedule, p.blocking) == (STAGE_RANKS, 4, "1f1b", True)
    for x in p.stages[2]:
        assert (x.fwd_ns, x.bwd_ns, x.pre_ns, x.post_ns) == pytest.approx(
            (F_US * US, B_US * US, PRE_US * US, POST_US * US), abs=1e-6)  # lstsq's float
    assert p.act_ns[2] == p.grad_ns[2] == [0.0] * 3
    for job, mbs, sched, want in (("gpipe", 8, None, 17_510), ("gpipe", 2, None, 31_010),
                                  ("gpipe", 8, "1f1b", 17_510), ("f1b", 2, "gpipe", 31_010),
                                  ("f1b", None, "gpipe", 22_010)):
        r = replay_pipeline(pipes[job], mbs, sched)
        assert [s.step for s in r.steps] == [1, 2]
        for s in r.steps:
            assert s.measured_ns == 22_010 * US
            assert s.projected_ns == want * US, (job, mbs, sched)
            assert s.low_ns <= s.projected_ns <= s.high_ns
    # 8 microbatches of the traced size (the global batch doubles): (8 + 3) x 3 + 1 = 34 ms
    r = replay_pipeline(pipes["gpipe"], 8, None, keep_size=True)
    assert [s.projected_ns for s in r.steps] == [34_010 * US] * 2
    code, out, err = run("replay", st, "--job", "gpipe", "--microbatches", "8", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert [s["projected_step_ns"] for s in r["steps"]] == [17_510 * US] * 2
    assert r["pipeline"] == {"ranks": STAGE_RANKS, "traced_schedule": "gpipe",
                             "traced_microbatches": 4, "schedule": "gpipe", "microbatches": 8,
                             "keep_microbatch_size": False, "blocking_sends": True,
                             "transfers": "measured"}


def test_transfers_priced_by_the_network(store: tuple[Path, dict]) -> None:
    from tracetool.replay.network import collective_time, parse_network

    st, _ = store
    # the 1F1B job traced with free transfers (a source network that prices a send at 0),
    # projected onto one with 0.5 ms one way between stages: each message then costs what
    # the model prices (gloo's rendezvous, 2 x 0.5 ms, and 256 KiB under TCP's window),
    # and the projection is the same job laid out with that transfer time
    src = "gpus_per_node=1,inter_node_bw=inf,inter_node_latency=0us"
    dst = parse_network("gpus_per_node=1,inter_node_bw=inf,inter_node_latency=500us")
    t_s = collective_time(dst, "send", 64 * 1024 * 4, [0, 1], "gloo")
    assert 1.05e-3 < t_s < 1.1e-3
    code, out, err = run("replay", st, "--job", "f1b", "--source-network", src,
                         "--network", "inter_node_latency=500us", "--microbatches", "4",
                         "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["pipeline"]["transfers"] == "network model"
    events, _ = lay_out(ORDERS["1f1b"], steps=1, t_us=t_s * 1e6)
    step_us = max(e["ts"] + e["dur"] for evs in events.values() for e in evs) - 1_000_000
    for s in r["steps"]:
        assert abs(s["projected_step_ns"] - step_us * US) <= 2
        assert s["projected_step_ns"] > 22_010 * US + 6 * t_s * 1e9  # 6 hops at least


def test_placement_moves_one_link(store: tuple[Path, dict], tmp_path: Path) -> None:
    """--placement with the pipeline what-if: stages 0-1 (ranks 2, 0) in one datacenter,
    stages 2-3 (ranks 3, 1) in another 0.5 ms away; only the link between stages 1 and 2
    then costs the model's price across it, and the projection is the job laid out so."""
    from tracetool.replay.network import collective_time, parse_network

    st, _ = store
    place = tmp_path / "place.csv"
    write(place, "rank,node,datacenter\n0,n0,east\n1,n1,west\n2,n2,east\n3,n3,west\n")
    src = "gpus_per_node=1,inter_node_bw=inf,inter_node_latency=0us"
    dst = "dc_bw=inf,dc_latency=500us"
    far = collective_time(parse_network(f"{src},{dst},ranks_per_dc=2"), "send", 64 * 1024 * 4,
                          [0, 2], "gloo")
    assert far > 1e-3
    code, out, err = run("replay", st, "--job", "f1b", "--source-network", src, "--network",
                         dst, "--placement", place, "--microbatches", "4", "--json")
    assert code == 0, err
    events, _ = lay_out(ORDERS["1f1b"], steps=1,
                        link_us=lambda a, b: far * 1e6 if {a, b} == {0, 3} else 0.0)
    step_us = max(e["ts"] + e["dur"] for evs in events.values() for e in evs) - 1_000_000
    steps = json.loads(out)["steps"]
    assert steps and all(abs(s["projected_step_ns"] - step_us * US) <= 2 for s in steps)
    assert step_us > 22_010 + 4 * far * 1e6  # the far link is crossed 8 times, 4 in series


@pytest.mark.parametrize(("args", "message", "code"), [
    (["--pipeline-schedule", "1f1b"], "tracetool: error: job f1b ran 1F1B with 4 microbatches "
     "already: the pipeline what-if changes nothing", 2),
    (["--microbatches", "4"], "tracetool: error: job f1b ran 1F1B with 4 microbatches "
     "already: the pipeline what-if changes nothing", 2),
    (["--keep-microbatch-size"], "tracetool: error: --keep-microbatch-size goes with "
     "--microbatches", 2),
    (["--pipeline-schedule", "zb"], "tracetool: error: --pipeline-schedule 'zb': give one of "
     "gpipe, 1f1b", 2),
    (["--microbatches", "2", "--speedup", "gemm=2"], "tracetool: error: --speedup cannot be "
     "combined with a pipeline what-if (--microbatches, --pipeline-schedule), which "
     "re-composes the measured chunks: run them apart", 2),
    (["--microbatches", "2", "--network", "inter_node_bw=1Gbit/s"], "tracetool: error: job "
     "f1b: give --source-network, the network the trace ran on, to price its transfers on "
     "another", 2),
    (["--microbatches", "2", "--steps", "1:2"], "tracetool: error: a pipeline what-if "
     "(--microbatches, --pipeline-schedule) takes no --chrome-trace, --plot, --steps, "
     "--step, --ranks, --annotation, --window, --cpu-speedup or --expert-skew",
     2),
    (["--microbatches", "2", "--cpu-speedup", "2"], "tracetool: error: a pipeline what-if "
     "(--microbatches, --pipeline-schedule) takes no --chrome-trace, --plot, --steps, "
     "--step, --ranks, --annotation, --window, --cpu-speedup or --expert-skew",
     2),
])
def test_whatif_errors(store: tuple[Path, dict], args: list[str], message: str,
                       code: int) -> None:
    st, _ = store
    got, out, err = run("replay", st, "--job", "f1b", *args)
    assert (got, out, err.strip()) == (code, "", message)


def test_a_job_without_a_pipeline_is_refused(tmp_path: Path) -> None:
    st = tmp_path / "store"
    assert run("ingest", SAMPLES, "--store", st)[0] == 0
    code, out, err = run("replay", st, "--microbatches", "2")
    assert (code, out) == (2, "")
    assert err.strip().endswith("has no pipeline: no chain of ranks linked by point-to-point "
                                "send/recv whose first stage begins each step with a send "
                                "(docs/pipeline.md)")
    assert tracetool.connect(st).execute("SELECT count(*) FROM pipeline_bubbles").fetchone() == (0,)
