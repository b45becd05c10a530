"""Collectives matched across ranks whose trace windows differ (analysis/sql/40_collectives.sql,
docs/collectives.md).

Real multi-rank jobs of ../shared/traces, with one rank's trace cropped at test time so that
it starts k = 1, 2, 3 collectives later than its peers (as when ranks start profiling at
different calls): the matching must recover the pairing a brute-force end-time check finds,
clock offsets between processes of one host stay under 1 ms, no rank waits longer than its
time in collectives, the warning is printed, and the critical path still crosses ranks. No
corpus trace of the 2021 BERT pair or the 2023 DLRM job records sequence numbers (nor does
any other multi-rank corpus trace), so the seq path is checked on DLRM with Seq written into
its record_param_comms args.
"""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

import tracetool
from tracetool.analysis.collectives import collective_warnings, warn_collectives
from tracetool.analysis.critical_path import critical_path
from tracetool.analysis.report import summarize
from tracetool.cli import cli

from ._util import SHARED_TRACES, kineto_text, run, write

BERT = SHARED_TRACES / "gaoteng-git__kineto/tb_plugin/test/data/tracing/bert_newAPI_fp16_ddp"
DLRM = SHARED_TRACES / "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
SAMPLED = SHARED_TRACES / "facebookresearch__HolisticTraceAnalysis/tests/data/trace_filter"
KS = (1, 2, 3)
# (job, source directory, cropped rank, k): the BERT pair cropped on either rank (rank 0 is
# the reference the others are aligned to), DLRM on rank 3 of 8
CROPS = [(f"bert_r1_k{k}", BERT, 1, k) for k in KS] + [("bert_r0_k2", BERT, 0, 2)] + \
        [(f"dlrm_r3_k{k}", DLRM, 3, k) for k in KS]
MS = 1_000_000

pytestmark = pytest.mark.skipif(not BERT.is_dir() or not DLRM.is_dir(),
                                reason=f"real trace corpus not found at {SHARED_TRACES}")


# ------------------------------------------------------------------------------ the traces

def load(path: Path) -> dict | list:
    with (gzip.open(path, "rt") if path.name.endswith(".gz") else path.open()) as f:
        return json.load(f)


def events_of(doc: dict | list) -> list[dict]:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def with_events(doc: dict | list, events: list[dict]) -> dict | list:
    return {**doc, "traceEvents": events} if isinstance(doc, dict) else events


def crop(doc: dict | list, cut_ns: int) -> dict | list:
    """The trace as if profiling had started at ``cut_ns``: every event starting earlier is
    dropped (so is a ProfilerStep annotation that began before it: that step was not
    recorded), metadata events are kept, and a flow whose start was dropped loses its end."""
    kept, dropped_flows = [], set()
    for e in events_of(doc):
        if e.get("ph") == "M" or "ts" not in e:
            kept.append(e)
        elif float(e["ts"]) * 1000 < cut_ns:
            if e.get("ph") == "s":
                dropped_flows.add((e.get("cat"), e.get("id")))
        elif e.get("ph") not in ("f", "t") or (e.get("cat"), e.get("id")) not in dropped_flows:
            kept.append(e)
    return with_events(doc, kept)


def trace_files(src: Path) -> list[Path]:
    return sorted(p for p in src.iterdir() if p.name.endswith((".json", ".json.gz")))


def ingest(paths: list[Path], store: Path, job: str) -> None:
    code, out, err = run("ingest", *paths, "--store", store, "--job", job)
    assert code == 0, err


def collectives_of(con: duckdb.DuckDBPyConnection, job: str, rank: int) -> list[tuple]:
    """(call_index, least(cpu start, transfer start), eid) of a rank's calls, in order."""
    return con.execute("""
        SELECT call_index, least(cpu_ts_ns, ts_ns), eid FROM collectives
        WHERE job = ? AND rank = ? ORDER BY call_index""", [job, rank]).fetchall()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store: the whole BERT and DLRM jobs, their crops (CROPS), and DLRM with Seq
    written in, whole ('dlrm_seq') and with rank 3 cropped by 2 ('dlrm_seq_r3_k2')."""
    tmp = tmp_path_factory.mktemp("matching")
    st = tmp / "store"
    ingest([BERT], st, "bert")
    ingest([DLRM], st, "dlrm")
    con = tracetool.connect(st)
    docs: dict[Path, dict | list] = {}
    for job, src, rank, k in CROPS:
        files = trace_files(src)
        # the start of the rank's k-th collective (0-based): its CPU call, or its kernel
        cut = collectives_of(con, "bert" if src == BERT else "dlrm", rank)[k][1]
        doc = docs.setdefault(files[rank], load(files[rank]))
        (tmp / job).mkdir()
        out = tmp / job / files[rank].name.removesuffix(".gz")
        out.write_text(json.dumps(crop(doc, cut)))
        ingest([f for i, f in enumerate(files) if i != rank] + [out], st, job)
    # DLRM with Seq: each call's record_param_comms gets its call index as sequence number
    files = trace_files(DLRM)
    for job, k in (("dlrm_seq", 0), ("dlrm_seq_r3_k2", 2)):
        (tmp / job).mkdir()
        for rank, f in enumerate(files):
            doc = load(f)
            evs = [dict(e) for e in events_of(doc)]
            for call_index, _, eid in collectives_of(con, "dlrm", rank):
                evs[eid]["args"] = {**evs[eid].get("args", {}), "Seq": call_index}
            doc = with_events(doc, evs)
            if rank == 3 and k:
                doc = crop(doc, collectives_of(con, "dlrm", rank)[k][1])
            (tmp / job / f.name).write_text(json.dumps(doc))
        ingest(trace_files(tmp / job), st, job)
    con.close()
    return st


@pytest.fixture(scope="module")
def con(store: Path) -> duckdb.DuckDBPyConnection:
    c = tracetool.connect(store)
    yield c
    c.close()


# ---------------------------------------------------------------------------- the reference

def brute_force(con: duckdb.DuckDBPyConnection, job: str, rank: int, peer: int
                ) -> dict[int, int]:
    """call_index on ``rank`` -> call_index on ``peer``: the peer's collective of the same
    kind whose end time is nearest (one host, one clock: no clock difference to remove)."""
    calls = con.execute("""
        SELECT rank, call_index, collective, end_ns FROM collectives
        WHERE job = ? AND rank IN (?, ?)""", [job, rank, peer]).fetchall()
    mine = [c for c in calls if c[0] == rank]
    theirs = [c for c in calls if c[0] == peer]
    return {c[1]: min((p for p in theirs if p[2] == c[2]), key=lambda p: abs(p[3] - c[3]))[1]
            for c in mine}


def matched(con: duckdb.DuckDBPyConnection, job: str, rank: int, peer: int) -> dict[int, int]:
    """call_index on ``rank`` -> call_index on ``peer`` of the same instance."""
    return dict(con.execute("""
        SELECT a.call_index, b.call_index FROM collective_ranks a
        JOIN collective_ranks b ON b.job = a.job AND b.instance = a.instance
        WHERE a.job = ? AND a.rank = ? AND b.rank = ?""", [job, rank, peer]).fetchall())


# -------------------------------------------------------------------------------- the tests

@pytest.mark.parametrize(("job", "src", "cropped", "k"), CROPS, ids=[c[0] for c in CROPS])
def test_matching_recovers_the_brute_force_pairing(con, job, src, cropped, k) -> None:
    ranks = [r for (r,) in con.execute(
        "SELECT DISTINCT rank FROM collectives WHERE job = ? ORDER BY rank", [job]).fetchall()]
    n_calls = dict(con.execute("SELECT rank, count(*) FROM collectives WHERE job = ? "
                               "GROUP BY rank", [job]).fetchall())
    for peer in (r for r in ranks if r != cropped):
        want = brute_force(con, job, cropped, peer)
        assert len(set(want.values())) == len(want)  # the reference is one-to-one
        assert matched(con, job, cropped, peer) == want
        assert all(p == c + k for c, p in want.items())  # the crop shifted calls by k
    # every call of the cropped rank is matched; each peer's first k calls are not
    assert con.execute("""
        SELECT rank, count(*) FILTER (instance IS NULL), min(call_index) FILTER (instance
               IS NOT NULL), count(DISTINCT match), any_value(match), bool_and(match_confident)
        FROM collective_ranks WHERE job = ? GROUP BY rank ORDER BY rank""", [job]).fetchall() \
        == [(r, 0 if r == cropped else k, 0 if r == cropped else k, 1, "aligned", True)
            for r in ranks]
    got = con.execute("""
        SELECT rank, n_calls, n_matched, n_unmatched, shift, ambiguous FROM collective_matching
        WHERE job = ? ORDER BY rank""", [job]).fetchall()
    ref = min(ranks)
    want_shift = {r: None if r == ref else (-k if r == cropped else k if ref == cropped else 0)
                  for r in ranks}
    assert got == [(r, n_calls[r], n_calls[cropped], n_calls[r] - n_calls[cropped],
                    want_shift[r], False) for r in ranks]


@pytest.mark.parametrize(("job", "src", "cropped", "k"), CROPS, ids=[c[0] for c in CROPS])
def test_a_crop_changes_no_instance_of_the_whole_job(con, job, src, cropped, k) -> None:
    """The same calls are paired, with the same skews (to the few us the clock offsets
    move by) and the same last rank, as in the uncropped job."""
    whole = "bert" if src == BERT else "dlrm"
    q = """SELECT list(i.rank || ':' || (c.call_index + CASE WHEN ? AND i.rank = ? THEN ?
                                                        ELSE 0 END) ORDER BY i.rank),
                  any_value(i.skew_ns), any_value(i.last_rank)
           FROM collective_instances i JOIN collective_ranks c USING (job, rank, eid)
           WHERE job = ? GROUP BY i.instance"""
    got = {tuple(calls): (skew, last) for calls, skew, last in
           con.execute(q, [True, cropped, k, job]).fetchall()}
    want = {tuple(calls): (skew, last) for calls, skew, last in
            con.execute(q, [False, cropped, k, whole]).fetchall()}
    assert got and set(got) <= set(want)  # every instance of the crop is one of the whole job
    assert len(want) - len(got) == k  # but the k it cut
    for calls, (skew, last) in got.items():
        assert abs(skew - want[calls][0]) <= 5_000, calls
        if abs(skew) > 10_000:  # a near tie may change hands by a microsecond
            assert last == want[calls][1], calls


def test_seq_matching_when_the_trace_records_it(con) -> None:
    rows = con.execute("""SELECT match, match_confident, count(*), count(instance)
                          FROM collective_ranks WHERE job LIKE 'dlrm_seq%'
                          GROUP BY ALL""").fetchall()
    assert rows == [("seq", True, 64 + 62, 64 + 48)]
    assert con.execute("SELECT min(instance), max(instance) FROM collective_ranks "
                       "WHERE job = 'dlrm_seq_r3_k2'").fetchone() == ("pg:?:seq:2", "pg:?:seq:7")
    for peer in (0, 1, 7):
        assert matched(con, "dlrm_seq_r3_k2", 3, peer) == \
            brute_force(con, "dlrm_seq_r3_k2", 3, peer)
    assert con.execute("""SELECT DISTINCT match FROM collective_matching
                          WHERE job LIKE 'dlrm_seq%'""").fetchall() == [("seq",)]
    assert collective_warnings(con, "dlrm_seq") == []
    assert collective_warnings(con, "dlrm_seq_r3_k2") == [
        "collectives (no process group recorded): ranks have different call counts (rank 0: "
        "8, rank 1: 8, rank 2: 8, rank 3: 6, rank 4: 8, rank 5: 8, rank 6: 8, rank 7: 8): "
        "their trace windows start or stop at different collectives; 14 calls found on only "
        "some ranks left unmatched"]


@pytest.mark.parametrize("job", ["bert"] + [c[0] for c in CROPS] + ["dlrm_seq_r3_k2"])
def test_clock_offsets_on_one_host_stay_under_a_millisecond(con, job) -> None:
    offsets = con.execute("SELECT rank, offset_ns, n_samples FROM rank_clock_offsets "
                          "WHERE job = ? ORDER BY rank", [job]).fetchall()
    n_instances = con.execute("SELECT count(DISTINCT instance) FROM collective_instances "
                              "WHERE job = ?", [job]).fetchone()[0]
    assert n_instances > 0
    for rank, offset, n in offsets:
        assert abs(offset) < MS, (rank, offset)
        assert n == n_instances  # every matched instance is a confident one here
    if job.startswith("bert"):  # one host: rank 1's kernels end 0.42 ms after rank 0's
        assert offsets[1][1] == 422_000


@pytest.mark.parametrize("job", ["bert", "dlrm"] + [c[0] for c in CROPS])
def test_no_rank_waits_longer_than_its_time_in_collectives(con, job) -> None:
    assert con.execute("""SELECT count(*) FROM collective_instances
                          WHERE job = ? AND (wait_ns < 0 OR wait_ns > dur_ns)""",
                       [job]).fetchone()[0] == 0
    per_rank = con.execute("""
        SELECT c.rank, sum(c.dur_ns), (SELECT sum(wait_ns) FROM collective_instances i
                                       WHERE i.job = c.job AND i.rank = c.rank)
        FROM collectives c WHERE c.job = ? GROUP BY c.job, c.rank""", [job]).fetchall()
    assert per_rank and all(wait <= total for _, total, wait in per_rank), per_rank
    # and the matched calls end together: within 1 ms (the BERT broadcasts' roots end early)
    assert con.execute("""SELECT count(*) FROM collective_instances
                          WHERE job = ? AND match_error_ns > ? AND collective <> 'broadcast'
                       """, [job, MS]).fetchone()[0] == 0


def test_stragglers_agree_with_the_whole_job(con) -> None:
    q = "SELECT rank, times_last FROM stragglers WHERE job = ? ORDER BY rank"
    whole = dict(con.execute(q, ["bert"]).fetchall())
    for k in KS:
        got = dict(con.execute(q, [f"bert_r1_k{k}"]).fetchall())
        assert sum(got.values()) == sum(whole.values()) - k  # the cut instances
        assert all(abs(got[r] - whole[r]) <= k for r in whole)


def test_the_warning_is_in_the_report_and_on_stderr(con, store: Path, tmp_path: Path) -> None:
    want = ("collectives (no process group recorded): ranks have different call counts "
            "(rank 0: 32, rank 1: 30): their trace windows start or stop at different "
            "collectives; 2 calls found on only some ranks left unmatched")
    assert collective_warnings(con, "bert_r1_k2") == [want]
    assert collective_warnings(con, "dlrm_r3_k1") == [
        "collectives (no process group recorded): ranks have different call counts (rank 0: "
        "8, rank 1: 8, rank 2: 8, rank 3: 7, rank 4: 8, rank 5: 8, rank 6: 8, rank 7: 8): "
        "their trace windows start or stop at different collectives; 7 calls found on only "
        "some ranks left unmatched"]
    for job in ("bert", "dlrm"):
        assert collective_warnings(con, job) == []
    res = CliRunner().invoke(cli, ["report", str(store), "--job", "bert_r1_k2",
                                   "--out", str(tmp_path / "report")], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    assert f"tracetool: warning: {want}\n" in res.stderr
    assert "Warnings\n--------\n" + want in res.stdout
    assert want in (tmp_path / "report" / "report.md").read_text()
    assert summarize(con, "bert_r1_k2")["warnings"] == [want]  # what --json prints
    err = io.StringIO()
    assert warn_collectives(con, "bert_r1_k2", file=err) == [want]
    assert err.getvalue() == f"tracetool: warning: {want}\n"


@pytest.mark.parametrize("job", [c[0] for c in CROPS if c[0].startswith("bert")])
def test_the_critical_path_still_crosses_ranks(con, job) -> None:
    segs = critical_path(con, job)
    ranks = Counter(r for (r,) in segs.project("rank").fetchall())
    assert len(ranks) > 1, ranks


def test_calls_that_differ_between_ranks_are_matched_by_call_order_only_where_kinds_agree(
        tmp_path: Path) -> None:
    """HTA's two sampled ranks of a 128-rank job: events were filtered, so the ranks' call
    sequences share no consistent shift; only the calls whose kind, dtype and size agree at
    the same position are paired (and those end within 0.1 ms: the right pairs)."""
    if not SAMPLED.is_dir():
        pytest.skip(f"{SAMPLED} not found")
    st = tmp_path / "store"
    ingest([SAMPLED], st, "sampled")
    c = tracetool.connect(st)
    assert c.execute("""SELECT rank, call_index, match, match_confident, instance
                        FROM collective_ranks WHERE instance IS NOT NULL AND pg_name IS NULL
                        ORDER BY ALL""").fetchall() == [
        (r, i, "call_order", False, f"pg:?:call:{i}") for r in (0, 1) for i in (2, 7)]
    # the two NCCL kernels of each rank whose record_param_comms were filtered out are
    # collectives of their own group, apart from the calls (which they would shift)
    assert c.execute("""SELECT rank, call_index, instance, cpu_dur_ns FROM collective_ranks
                        WHERE pg_name IS NOT NULL ORDER BY ALL""").fetchall() == [
        (r, i, f"pg:kernel:nccl:call:{i}", None) for r in (0, 1) for i in (0, 1)]
    assert c.execute("SELECT max(match_error_ns) FROM collective_instances "
                     "WHERE pg_name IS NULL").fetchone()[0] < 100_000
    assert c.execute("SELECT offset_ns, n_samples FROM rank_clock_offsets WHERE rank = 1"
                     ).fetchone() == (0, 0)
    assert collective_warnings(c, "sampled") == [
        "collectives (no process group recorded): 12 calls could not be matched across ranks "
        "(missing on some rank, or kind, dtype, size or stream differ)",
        "collectives (no process group recorded): the calls of rank 1 could not be aligned "
        "to rank 0's by kind and end time; they are matched by call order, where kinds "
        "agree, and do not set clock offsets"]


# ------------------------------------------------------------------ minimal synthetic jobs

def nccl_job(tmp_path: Path, ends_us: dict[int, list[int]], dur_us: int = 100) -> Path:
    """A job of 2021-style traces: NCCL allreduce kernels only (no record_param_comms), one
    list of kernel end times per rank."""
    for rank, ends in ends_us.items():
        evs = [{"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": e - dur_us, "dur": dur_us,
                "name": "ncclAllReduceRingLLKernel_sum_f32(ncclColl)",
                "args": {"device": 0, "stream": 7, "correlation": i + 1}}
               for i, e in enumerate(ends)]
        write(tmp_path / f"rank{rank}.json", kineto_text(evs, rank=rank))
    st = tmp_path / "store"
    ingest([tmp_path / f"rank{r}.json" for r in ends_us], st, "t")
    return st


def test_a_periodic_sequence_is_an_ambiguous_alignment(tmp_path: Path) -> None:
    """Identical calls at a fixed period: every shift explains the end times equally well.
    The one implying no clock offset is taken (here the truth: rank 1's window starts two
    calls later on the same clock), but its rivals need clocks only 1-2 ms apart, a skew
    hosts can have, so the alignment is flagged, warned about, and sets no clock offset."""
    ends = [1_000_000 + 1000 * i for i in range(12)]
    c = tracetool.connect(nccl_job(tmp_path, {0: ends, 1: ends[2:]}))
    assert c.execute("""SELECT rank, match, shift, spread_ns, margin, ambiguous
                        FROM collective_matching ORDER BY rank""").fetchall() == [
        (0, "aligned", None, None, None, False), (1, "aligned", -2, 0, 0.0, True)]
    assert c.execute("SELECT DISTINCT match_confident FROM collective_ranks").fetchall() == \
        [(False,)]
    assert c.execute("SELECT offset_ns, n_samples FROM rank_clock_offsets WHERE rank = 1"
                     ).fetchone() == (0, 0)
    w = collective_warnings(c, "t")
    assert len(w) == 2 and w[0].startswith("collectives (no process group recorded): ranks "
                                           "have different call counts (rank 0: 12, rank 1: 10)")
    assert w[1] == ("collectives (no process group recorded): the alignment of rank 1 to rank "
                    "0 is ambiguous (rank 1: shift -2 spreads end times by 0 us, the next best "
                    "shift by 0 us); those instances do not set clock offsets")


def test_an_offset_clock_and_a_late_window_are_both_recovered(tmp_path: Path) -> None:
    """Rank 1's clock runs 5 s ahead and its window starts 3 calls later; the calls' end
    times vary irregularly, so exactly one shift makes them consistent."""
    ends = [1_000_000 + 1000 * i + (i * i * 37) % 400 for i in range(20)]
    one = [e + 5_000_000 + (7 * i) % 5 for i, e in enumerate(ends)][3:]
    c = tracetool.connect(nccl_job(tmp_path, {0: ends, 1: one}))
    assert c.execute("SELECT shift, ambiguous FROM collective_matching WHERE rank = 1"
                     ).fetchone() == (-3, False)
    off, n = c.execute("SELECT offset_ns, n_samples FROM rank_clock_offsets WHERE rank = 1"
                       ).fetchone()
    assert n == 17 and abs(off - 5_000_000_000) <= 5_000
    assert matched(c, "t", 1, 0) == {i: i + 3 for i in range(17)}


def test_a_single_rank_job_matches_by_call_order_without_warnings(tmp_path: Path) -> None:
    c = tracetool.connect(nccl_job(tmp_path, {0: [1000, 2000, 3000]}))
    assert c.execute("SELECT instance, match, match_confident FROM collective_ranks "
                     "ORDER BY call_index").fetchall() == [
        (f"pg:?:call:{i}", "call_order", False) for i in range(3)]
    assert collective_warnings(c, "t") == []


@pytest.mark.parametrize("setting", ["lat_1gbit_10ms", "w4_1gbit_5ms", "bw_1gbit"])
def test_steps_that_repeat_do_not_shift_the_match_by_a_whole_step(tmp_path: Path,
                                                                  setting: str) -> None:
    """The project's netlab jobs (one host, one clock): each step's allreduces repeat, so a
    shift of one whole step fits the end times almost as well as the right one. The right
    one implies no clock offset, the other a step's worth (~300 ms): every call is matched
    at shift 0, with no ambiguity warning. The clock offsets (from end times) stay under
    1 ms without added delay; with it, gloo's ring ends a collective on each rank up to a
    one-way delay apart, and the offset estimate carries that (a known limit: the job ran
    on one clock), though never a step's worth."""
    from ._util import REPO

    d = REPO / "sample_traces" / "netlab" / setting
    store = tmp_path / "store"
    ingest(sorted(d.glob("*.json.gz")), store, "n")
    c = tracetool.connect(store)
    n_files = len(list(d.glob("*.json.gz")))
    assert c.execute("""SELECT count(*), count(instance), count(DISTINCT match_shift),
                               max(abs(match_shift)) FROM collective_ranks""").fetchone()[1:] \
        == (c.execute("SELECT count(*) FROM collective_ranks").fetchone()[0], 1, 0)
    assert collective_warnings(c, "n") == []
    offsets = [o for (o,) in c.execute("SELECT offset_ns FROM rank_clock_offsets").fetchall()]
    delay_ms = int(setting.rsplit("_", 1)[1][:-2]) if setting.endswith("ms") else 0
    assert len(offsets) == n_files
    assert max(abs(o) for o in offsets) < (1_000_000 if not delay_ms else delay_ms * 1_000_000)


def test_ingest_and_analysis_name_collectives_alike(tmp_path: Path) -> None:
    """ingest pairs a gloo call with its span by kind_key; the analysis names kinds with the
    collective_kind macro: the two agree on every name PyTorch records (and gloo spans)."""
    from tracetool.ingest.collectives import kind_key

    names = ["allreduce", "allreduce_", "all_reduce", "allreduce_coalesced", "_allgather_base",
             "all_gather_into_tensor", "allgather", "reduce_scatter_tensor_coalesced",
             "_reduce_scatter_base", "alltoall_base", "alltoall_base_", "all_to_all",
             "all_to_allv", "broadcast", "barrier", "gather", "scatter", "reduce", "send",
             "recv"]
    f = write(tmp_path / "rank0.json", kineto_text([x_event()], rank=0))
    ingest([f], tmp_path / "s", "j")
    con = tracetool.connect(tmp_path / "s")
    sql = {n: con.execute("SELECT collective_kind(?)", [n]).fetchone()[0] for n in names}
    assert {n: kind_key(n) for n in names} == {n: k.replace("_", "") for n, k in sql.items()}
    assert kind_key("alltoall_base") == kind_key("all_to_all") == "alltoall"  # c10d vs gloo


def x_event() -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
