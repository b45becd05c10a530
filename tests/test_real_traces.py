"""``tracetool ingest`` on the real traces of ../shared/traces, checked against the raw JSON.

Every expected value here is computed independently of tracetool: each file is gunzipped and
parsed with the standard library (``json.loads(text, strict=False)``; ``parse_float=Decimal``
for the exact-time checks), and the store is read back with DuckDB from the Parquet files the
real CLI wrote. Each file is ingested once per session (session fixtures); the tests only read.

Explicit handling: ROCm's ``matmul_result.json`` is a bare array whose first element is an empty
``{}`` sentinel (no ``ph``). It is counted as read (it is an element of the array) and must be
quarantined; all its ``ts``/``dur``/``pid``/``tid`` are strings, converted here with
``Decimal``/``int``. No file of the corpus needed ``strict=False`` when this was written (all parse
strictly too); the checks use it anyway, as the issue asks.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
import sys
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

# Phases stored in events (E closes a B and is merged into it, so it is not a row).
EVENT_PHASES = frozenset("XiIRbneB")
FLOW_PHASES = frozenset("stf")
GPU_OP_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy",
               "Memcpy": "memcpy", "gpu_memset": "memset", "Memset": "memset"}


def gpu_op_kind(cat: object, name: object) -> str | None:
    """The gpu_ops kind of a raw event, None if not a GPU op: MTIA's device ops
    (mtia_ccp_events) are copies when named dma*, not GPU ops when they are the device's
    event records and waits, else kernels (the schema's gpu_ops.kind)."""
    if cat in GPU_OP_CATS:
        return GPU_OP_CATS[cat]
    if cat != "mtia_ccp_events" or name in ("event_record", "event_wait"):
        return None
    return "memcpy" if str(name).lower().startswith("dma") else "kernel"
# Runtime/driver calls that launch GPU work ("Runtime" is the 2021 name of cuda_runtime).
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "mtia_runtime",
                         "xpu_runtime", "xpu_driver", "privateuse1_runtime",
                         "privateuse1_driver", "hpu_op"})
NOT_COLLECTIVES = frozenset({"wait", "monitored_barrier"})
# the registry of communication kernels is data (its patterns are the spec), read as such
COMM_KERNEL = re.compile("|".join(
    f"(?:{k['pattern']})" for k in tomllib.loads(
        (Path(__file__).parents[1] / "tracetool" / "comm_kernels.toml").read_text())["kernel"]),
    re.IGNORECASE)
COLLECTIVE_KEYS = frozenset({"Collective name", "Comms Id", "In msg nelems", "In msg size",
                             "Process Group Name", "Process Group ID", "Seq", "dtype"})
STEP_NAME = re.compile(r"ProfilerStep#(\d+)")
RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
DLRM_DIR = "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
DLRM_JOB = "dlrm_kineto"
SEP, REC, NUL = "\x1f", "\x1e", "\u2400"

# Traces named by the issue, across eras and vendors.
B200 = "AMD-AGI__TraceLens/tests/traces/b200/eager_trace.json.gz"
MI300 = "AMD-AGI__TraceLens/tests/traces/mi300/resnet_act_checkpoint.json.gz"
MATMUL = "ROCm__rocmProfileData/examples/rocm-profile-data/results/matmul_result.json"
HTA = "facebookresearch__HolisticTraceAnalysis/tests/data/"
DF_INDEX = HTA + "df_index_resolver/df_index_resolver.json.gz"
NCCL_CFG = HTA + "nccl_parser_config/nccl_data.json.gz"
NS_RES = HTA + "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
MTIA = HTA + "mtia_inference_trace/mtia_inference_rank_0.json.gz"
LARGE_INT = HTA + "large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"
TRITON = HTA + "triton_example/triton_example.json.gz"
NO_DI = HTA + "distributed_info_unavailable/distributed_info_not_found.json.gz"
NO_DI_RANK = HTA + "rank_unavailable/rank_not_found.json.gz"
RESNET50_2021 = ("pytorch__kineto/tb_plugin/samples/resnet50_num_workers_0/"
                 "worker0.1623143089861.pt.trace.json.gz")
GAOTENG = "gaoteng-git__kineto/tb_plugin/test/data/tracing/"
BERT_CPU_2021 = GAOTENG + "bert_newAPI_cpu/worker0_round1.pt.trace.json.gz"
BERT_DDP0_2021 = GAOTENG + "bert_newAPI_fp16_ddp/worker0_round1.pt.trace.json.gz"
BERT_DDP1_2021 = GAOTENG + "bert_newAPI_fp16_ddp/worker1_round1.pt.trace.json.gz"
DLRM0 = DLRM_DIR + "/worker0_step_12.1694128201545.pt.trace.json"


# --------------------------------------------------------------------------- raw JSON side


def read_json_text(path: Path) -> tuple[bytes, bytes]:
    """(bytes on disk, JSON text bytes): gunzipped when the file starts with the gzip magic."""
    raw = path.read_bytes()
    return raw, (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def load(path: Path, **kw) -> object:
    return json.loads(read_json_text(path)[1].decode("utf-8"), strict=False, **kw)


def elements(doc: object) -> list:
    return doc if isinstance(doc, list) else doc["traceEvents"]


def event_line(eid: int, ph: str, cat: object, name: object) -> str:
    """One event's identity as text, built the same way from the raw JSON and the store."""
    return SEP.join((str(eid), ph, NUL if cat is None else str(cat),
                     NUL if name is None else str(name))) + REC


@dataclass
class RawTrace:
    """What the issue's checks need from one Kineto file, computed with the stdlib only."""

    rel: str
    path: Path
    bytes: int
    sha256: str
    json_bytes: int
    compression: str
    container: str
    n: int
    ph: str  # one character per element ('?' when ph is missing or not one character)
    base_time_ns: int
    di: dict | None
    n_events: int = 0
    n_flows: int = 0
    n_meta: int = 0
    n_counter_events: int = 0
    n_merged_e: int = 0
    counter_rows: list[tuple] = field(default_factory=list)
    n_kernels: int = 0
    steps: set[int] = field(default_factory=set)  # ProfilerStep#N on the CPU (see below)
    n_comm_kernels: int = 0  # kernels named like NCCL/RCCL communication
    n_unclaimed_comm: int = 0  # of them, launched by no collective call (see summarize)
    steps_legacy: set[int] = field(default_factory=set)  # ProfilerStep#N, cat Operator
    rpc_collectives: Counter = field(default_factory=Counter)
    n_record_param_comms: int = 0
    c10d_collectives: Counter = field(default_factory=Counter)
    gpu_ops: dict[int, tuple[str, object]] = field(default_factory=dict)  # eid -> kind, corr
    launches: dict[object, list[tuple[int, str]]] = field(default_factory=dict)
    events_digest: str = ""

    @property
    def di_rank(self) -> int | None:
        r = (self.di or {}).get("rank")
        return r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else None


def summarize(path: Path, rel_path: str) -> RawTrace:
    raw, text = read_json_text(path)
    doc = json.loads(text.decode("utf-8"), strict=False)
    evs = elements(doc)
    top = doc if isinstance(doc, dict) else {}
    di = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else None
    t = RawTrace(rel_path, path, len(raw), hashlib.sha256(raw).hexdigest(), len(text),
                 "gzip" if raw[:2] == b"\x1f\x8b" else "none",
                 "array" if isinstance(doc, list) else "object", len(evs), "",
                 int(top.get("baseTimeNanoseconds") or 0), di)
    phs: list[str] = []
    digest = hashlib.sha256()
    launches: dict[object, list[tuple[int, str]]] = defaultdict(list)
    rpcs: list = []  # (pid, tid, ts, dur, args) of record_param_comms
    titles: list = []  # (pid, tid, ts, name) of nccl:<op> annotations
    comm: list = []  # (correlation, External id) of communication kernels
    launch_at: dict = {}  # correlation -> (pid, tid, ts) of its launch
    for k, e in enumerate(evs):
        ph = e.get("ph") if isinstance(e, dict) else None
        ph = ph if isinstance(ph, str) and len(ph) == 1 else "?"
        phs.append(ph)
        if ph in EVENT_PHASES:
            t.n_events += 1
            cat, name = e.get("cat"), e.get("name")
            digest.update(event_line(k, {"I": "i", "R": "i", "B": "X"}.get(ph, ph), cat,
                                     name).encode())
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if cat in ("kernel", "Kernel"):
                t.n_kernels += 1
                if COMM_KERNEL.search(name or "") or "Collective name" in args:
                    t.n_comm_kernels += 1
                    comm.append((args.get("correlation"), args.get("External id")))
            if gpu_op_kind(cat, name) is not None:
                t.gpu_ops[k] = (gpu_op_kind(cat, name), args.get("correlation"))
            if cat in LAUNCH_CATS and args.get("correlation") is not None:
                launches[args["correlation"]].append((k, name))
                launch_at.setdefault(args["correlation"], (e.get("pid"), e.get("tid"),
                                                           e.get("ts")))
            m = STEP_NAME.fullmatch(name or "")
            if m:
                # the CPU annotation: user_annotation, or Operator before that category
                # existed (2021); not the gpu_user_annotation copies on GPU streams
                if cat in ("user_annotation", "Operator", "cpu_op"):
                    t.steps.add(int(m.group(1)))
                if cat == "Operator":
                    t.steps_legacy.add(int(m.group(1)))
            if name == "record_param_comms":
                t.n_record_param_comms += 1
                rpcs.append((e.get("pid"), e.get("tid"), e.get("ts"), e.get("dur"), args))
            elif cat == "user_annotation" and isinstance(name, str) and \
                    name.startswith("nccl:"):
                titles.append((e.get("pid"), e.get("tid"), e.get("ts"), name))
            elif (cat in ("cpu_op", "Operator") and isinstance(name, str)
                  and name.startswith("c10d::")):
                coll = name.split("::", 1)[1].rstrip("_")
                if coll not in NOT_COLLECTIVES:
                    t.c10d_collectives[coll] += 1
        elif ph == "E":
            t.n_merged_e += 1
        elif ph in FLOW_PHASES:
            t.n_flows += 1
        elif ph == "M":
            t.n_meta += 1
        elif ph == "C":
            t.n_counter_events += 1
            for key, v in (e.get("args") or {}).items():
                if isinstance(v, bool) or not isinstance(v, int | float | str):
                    continue
                try:
                    t.counter_rows.append((k, e.get("name"), key, float(v)))
                except ValueError:
                    continue
    # A record_param_comms is a collective call when it carries collective args (2023-10+) or
    # wraps an nccl:<op> annotation (older traces name the op only there); one with neither
    # is a wait(). The name: the args' Collective name, else the annotation's <op>.
    calls: list = []  # (pid, tid, ts, dur, External id) of the collective calls
    for pid, tid, ts, dur, args in rpcs:
        coll = args.get("Collective name")
        if coll is None:
            inside = [n for p, d, s, n in titles if p == pid and d == tid and
                      s is not None and ts is not None and ts <= s <= ts + (dur or 0)]
            if inside:
                coll = inside[0].split(":", 1)[1]
            elif not COLLECTIVE_KEYS & args.keys():
                continue
        if coll not in NOT_COLLECTIVES:
            t.rpc_collectives[coll] += 1
            calls.append((pid, tid, ts, dur, args.get("External id")))
    # each call claims one comm kernel: the first unclaimed one launched inside it on its
    # thread, else the first unclaimed one with its External id; the rest are collectives
    # of their own (DeepEP, symmetric memory, custom all-reduce, 2021 traces)
    free = list(range(len(comm)))
    for pid, tid, ts, dur, ext in sorted(calls, key=lambda c: c[2] or 0):
        inside = [i for i in free if (at := launch_at.get(comm[i][0])) and at[:2] == (pid, tid)
                  and at[2] is not None and ts <= at[2] <= ts + (dur or 0)]
        same = [i for i in free if ext is not None and comm[i][1] == ext]
        if inside or same:
            free.remove(min(inside, key=lambda i: launch_at[comm[i][0]][2]) if inside
                        else same[0])
    t.n_unclaimed_comm = len(free)
    t.ph = "".join(phs)
    t.launches = dict(launches)
    t.events_digest = digest.hexdigest()
    return t


def rank_expectation(t: RawTrace) -> tuple[int, str]:
    """(rank, rank_source) the store should record; files with neither get --rank 0."""
    if t.di_rank is not None:
        return t.di_rank, "distributedInfo"
    m = RANK_IN_NAME.search(t.path.name)
    if m:
        return int(m.group(1)), "file_name"
    return 0, "option"


# --------------------------------------------------------------------------- session fixtures


@pytest.fixture(scope="session")
def raw(traces_dir: Path) -> dict[str, RawTrace]:
    """Independent summaries of every Kineto file of the corpus (parsed once)."""
    out = {}
    for p in sorted(traces_dir.rglob("*")):
        if p.is_file() and p.name.endswith((".json", ".json.gz")):
            r = p.relative_to(traces_dir).as_posix()
            if not re.search(r"_et\.json(\.gz)?$", p.name):
                out[r] = summarize(p, r)
    return out


def job_for(rel_path: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", rel_path)


@dataclass
class Corpus:
    store: Path
    data: Path
    results: dict[str, dict]  # rel path -> the CLI's --json result for that file
    exit_codes: dict[str, int]
    dlrm_run: object


@pytest.fixture(scope="session")
def corpus(traces_dir: Path, raw: dict[str, RawTrace], ingest_cli, tmp_path_factory) -> Corpus:
    """Ingest every file once: one job per file (``--rank 0`` only where the trace has no
    distributedInfo.rank and no rank/worker number in its name), the 8-rank DLRM directory
    as one job with one command, and the execution traces (which must be skipped)."""
    store = tmp_path_factory.mktemp("store")
    results: dict[str, dict] = {}
    codes: dict[str, int] = {}
    for p in sorted(traces_dir.rglob("*")):
        if not (p.is_file() and p.name.endswith((".json", ".json.gz"))):
            continue
        r = p.relative_to(traces_dir).as_posix()
        if r.startswith(DLRM_DIR + "/"):
            continue
        opts = ["--job", job_for(r), "--workers", "2"]
        if r in raw and rank_expectation(raw[r])[1] == "option":
            opts += ["--rank", "0"]
        run = ingest_cli([p], store, *opts)
        assert len(run.results) == 1, (r, run.stdout, run.stderr)
        results[r], codes[r] = run.results[0], run.exit_code
    dlrm = ingest_cli([traces_dir / DLRM_DIR], store, "--job", DLRM_JOB, "--workers", "2")
    for res in dlrm.results:
        r = Path(res["path"]).resolve().relative_to(traces_dir.resolve()).as_posix()
        results[r], codes[r] = res, dlrm.exit_code
    return Corpus(store, store / "data", results, codes, dlrm)


def partition(corpus: Corpus, rel_path: str) -> Path:
    res = corpus.results[rel_path]
    assert res["status"] == "ingested", res
    return corpus.data / f"job={res['job']}" / f"rank={res['rank']}"


def pq(part: Path, table: str) -> str:
    """One table of one (job, rank) partition: ``<table>.parquet`` or ``<table>/*.parquet``."""
    single = part / f"{table}.parquet"
    files = [single] if single.is_file() else sorted((part / table).glob("*.parquet"))
    assert files, f"{part}: no Parquet files for table {table}"
    listed = ", ".join(f"'{f}'" for f in files)
    return f"read_parquet([{listed}], hive_partitioning = false)"


def trace_file_row(duck, part: Path) -> dict:
    cur = duck.execute(f"SELECT * FROM {pq(part, 'trace_files')}")
    rows = cur.fetchall()
    assert len(rows) == 1
    return dict(zip([d[0] for d in cur.description], rows[0], strict=True))


def eids(duck, part: Path, table: str) -> np.ndarray:
    return duck.execute(f"SELECT DISTINCT eid FROM {pq(part, table)}").fetchnumpy()["eid"]


def ph_array(t: RawTrace) -> np.ndarray:
    return np.frombuffer(t.ph.encode("ascii", "replace"), dtype="S1")


# --------------------------------------------------------------------------- 1. every file


def test_execution_traces_are_skipped(et_file: str, traces_dir: Path, corpus: Corpus) -> None:
    doc = load(traces_dir / et_file)
    # independent premise: this really is an execution trace (nodes), not a Kineto trace
    assert isinstance(doc, dict) and "nodes" in doc and "traceEvents" not in doc
    res = corpus.results[et_file]
    assert corpus.exit_codes[et_file] == 0
    assert res["status"] == "skipped", res
    assert not (corpus.data / f"job={job_for(et_file)}").exists()


def test_kineto_file_ingests_and_conserves_events(
    kineto_file: str, raw: dict[str, RawTrace], corpus: Corpus, duck
) -> None:
    t = raw[kineto_file]
    res = corpus.results[kineto_file]
    assert corpus.exit_codes[kineto_file] == 0, res
    assert res["status"] == "ingested", res
    part = partition(corpus, kineto_file)
    tf = trace_file_row(duck, part)

    # conservation, and events_read against the independent element count
    assert tf["events_read"] == t.n
    assert tf["events_read"] == tf["events_stored"] + tf["events_quarantined"]
    assert (res["events_read"], res["events_stored"], res["events_quarantined"]) == (
        tf["events_read"], tf["events_stored"], tf["events_quarantined"])

    # every element is in exactly one place: its table (by phase) or the quarantine
    ph = ph_array(t)
    ev, fl = eids(duck, part, "events"), eids(duck, part, "flows")
    ct, md = eids(duck, part, "counters"), eids(duck, part, "metadata_events")
    q = duck.execute(f"SELECT eid FROM {pq(part, 'ingest_issues')} WHERE quarantined"
                     ).fetchnumpy()["eid"]
    assert len(q) == len(np.unique(q)) == tf["events_quarantined"]
    for got, allowed in ((ev, EVENT_PHASES), (fl, FLOW_PHASES), (ct, {"C"}), (md, {"M"})):
        assert set(ph[got].astype(str)) <= allowed
    placed = np.concatenate([ev, fl, ct, md, q])
    assert len(placed) == len(np.unique(placed)), "an element is in two places"
    assert placed.min(initial=0) >= 0 and placed.max(initial=-1) < t.n
    missing = np.setdiff1d(np.arange(t.n), placed)
    assert set(ph[missing].astype(str)) <= {"E"}, f"elements nowhere: {missing[:10]}"
    assert tf["events_stored"] == len(ev) + len(fl) + len(ct) + len(md) + len(missing)

    # file facts, each computed independently
    assert tf["path"] == str(t.path.resolve())
    assert tf["file_name"] == t.path.name
    assert (tf["bytes"], tf["sha256"]) == (t.bytes, t.sha256)
    assert (tf["json_bytes"], tf["compression"], tf["container"]) == (
        t.json_bytes, t.compression, t.container)
    assert tf["base_time_ns"] == t.base_time_ns
    di = t.di or {}
    assert tf["world_size"] == di.get("world_size")
    assert tf["backend"] == di.get("backend")
    rank, source = rank_expectation(t)
    assert (res["rank"], tf["rank_source"]) == (rank, source)


def test_trace_without_rank_is_rank_0_alone_and_an_error_with_others(
    traces_dir: Path, raw: dict[str, RawTrace], ingest_cli, tmp_path: Path
) -> None:
    for r in (NO_DI, NO_DI_RANK):
        assert rank_expectation(raw[r])[1] == "option"  # premise: no rank anywhere
        run = ingest_cli([traces_dir / r], tmp_path / r, "--workers", "2")
        assert run.exit_code == 0 and run.results[0]["rank"] == 0
        assert "stored as rank 0 (a single file)" in run.stderr
    run = ingest_cli([traces_dir / NO_DI, traces_dir / NO_DI_RANK], tmp_path / "both",
                     "--workers", "2")
    assert run.exit_code == 1
    assert [x["status"] for x in run.results] == ["error", "error"]
    assert all("no rank" in x["message"] and "--rank" in x["message"]
               and "--job-per-file" in x["message"] for x in run.results)
    assert not list((tmp_path / "both").glob("data/job=*/rank=*"))


def test_dlrm_eight_ranks_one_command(
    traces_dir: Path, raw: dict[str, RawTrace], corpus: Corpus, duck
) -> None:
    run = corpus.dlrm_run
    assert run.exit_code == 0, run.stderr
    assert len(run.results) == 8
    assert {r["status"] for r in run.results} == {"ingested"}
    assert {r["job"] for r in run.results} == {DLRM_JOB}
    by_rank = {}
    for res in run.results:
        t = raw[Path(res["path"]).resolve().relative_to(traces_dir.resolve()).as_posix()]
        assert res["rank"] == t.di_rank  # from distributedInfo, not the worker number
        by_rank[res["rank"]] = t
    assert sorted(by_rank) == list(range(8))
    parts = sorted(p.name for p in (corpus.data / f"job={DLRM_JOB}").iterdir())
    assert parts == [f"rank={r}" for r in range(8)]
    for rank, t in by_rank.items():
        tf = trace_file_row(duck, corpus.data / f"job={DLRM_JOB}" / f"rank={rank}")
        assert tf["file_name"] == t.path.name
        assert (tf["rank_source"], tf["world_size"], tf["backend"]) == (
            "distributedInfo", 8, "nccl")


# --------------------------------------------------------------------------- 2. exact counts


def test_exact_counts(kineto_file: str, raw: dict[str, RawTrace], corpus: Corpus, duck) -> None:
    t = raw[kineto_file]
    part = partition(corpus, kineto_file)

    def one(sql: str):
        return duck.execute(sql).fetchone()[0]

    got = {
        "events": one(f"SELECT count(*) FROM {pq(part, 'events')}"),
        "flows": one(f"SELECT count(*) FROM {pq(part, 'flows')}"),
        "metadata_events": one(f"SELECT count(*) FROM {pq(part, 'metadata_events')}"),
        "counter events": one(f"SELECT count(DISTINCT eid) FROM {pq(part, 'counters')}"),
        "kernels": one(f"SELECT count(*) FROM {pq(part, 'gpu_ops')} WHERE kind = 'kernel'"),
        "steps": one(f"SELECT count(*) FROM {pq(part, 'profiler_steps')}"),
        "collectives": one(f"SELECT count(*) FROM {pq(part, 'collectives')}"),
    }
    colls = t.rpc_collectives if t.n_record_param_comms else t.c10d_collectives
    from_kernels = not sum(colls.values())  # neither: one collective per comm kernel
    want = {
        "events": t.n_events, "flows": t.n_flows, "metadata_events": t.n_meta,
        "counter events": t.n_counter_events,
        "kernels": sum(kind == "kernel" for kind, _ in t.gpu_ops.values()), "steps": len(t.steps),
        "collectives": t.n_comm_kernels if from_kernels
        else sum(colls.values()) + t.n_unclaimed_comm,
    }
    assert got == want

    # the same events, at the same eids, with the same phase, category and name
    rows = duck.execute(f"SELECT eid, ph, cat, name FROM {pq(part, 'events')} ORDER BY eid"
                        ).fetchall()
    h = hashlib.sha256()
    for row in rows:
        h.update(event_line(*row).encode())
    if h.hexdigest() != t.events_digest:
        pytest.fail(f"events differ from the raw JSON; first difference: "
                    f"{first_event_difference(t, rows)}")

    counters = duck.execute(f"SELECT eid, name, series, value FROM {pq(part, 'counters')} "
                            "ORDER BY eid, series").fetchall()
    assert counters == sorted(t.counter_rows, key=lambda r: (r[0], r[2]))
    steps = duck.execute(f"SELECT step FROM {pq(part, 'profiler_steps')}").fetchnumpy()["step"]
    assert set(steps.tolist()) == t.steps
    names = duck.execute(f"SELECT collective, kernel_name, cpu_dur_ns IS NULL AND "
                         f"kernel_eid IS NOT NULL FROM {pq(part, 'collectives')}").fetchall()
    if from_kernels:  # the op comes from the NCCL kernel's name: it must be named in there
        assert all(n and n.replace("_", "") in k.lower().replace("_", "") for n, k, _ in names)
    else:  # the calls, and the comm kernels none claims (named by the kernel, if at all)
        assert Counter(n for n, _, kernel in names if not kernel) == colls
        own = [(n, k) for n, k, kernel in names if kernel]
        assert len(own) == t.n_unclaimed_comm
        assert all(n is None or n.replace("_", "") in k.lower().replace("_", "")
                   for n, k in own)


def first_event_difference(t: RawTrace, rows: list[tuple]) -> str:
    evs = elements(load(t.path))
    want = [(k, {"I": "i", "R": "i", "B": "X"}.get(e["ph"], e["ph"]), e.get("cat"),
             e.get("name")) for k, e in enumerate(evs)
            if isinstance(e, dict) and e.get("ph") in EVENT_PHASES]
    for w, g in zip(want, rows, strict=False):
        if tuple(w) != tuple(g):
            return f"raw {w} vs stored {g}"
    return f"{len(want)} raw events vs {len(rows)} stored"


def test_corpus_covers_the_issue_traces(traces_dir: Path, raw: dict[str, RawTrace]) -> None:
    """The traces the issue names are all here (so the per-file tests above cover them), with
    the features that make them worth testing; the independent element counts agree with
    the corpus MANIFEST."""
    for r in (BERT_CPU_2021, BERT_DDP0_2021, BERT_DDP1_2021, MATMUL):
        assert raw[r].container == "array", r
    for r in (BERT_DDP0_2021, RESNET50_2021):  # 2021 legacy categories (Kernel, Runtime)
        assert raw[r].n_kernels and any(calls for calls in raw[r].launches.values())
        assert "Operator" in {e.get("cat") for e in elements(load(raw[r].path))[:1000]}
    assert raw[NCCL_CFG].base_time_ns > 0 and raw[B200].base_time_ns > 0
    for r in (DF_INDEX, NCCL_CFG, MI300, B200, LARGE_INT, DLRM0):  # record_param_comms
        assert raw[r].n_record_param_comms > 0, r
    assert raw[MATMUL].n_counter_events == 319 and raw[MATMUL].ph[0] == "?"
    assert raw[MTIA].n_events and not raw[MTIA].n_kernels  # MTIA: no kernel category
    dlrm = [t for r, t in raw.items() if r.startswith(DLRM_DIR + "/")]
    assert sorted(t.di_rank for t in dlrm) == list(range(8))

    with open(traces_dir / "MANIFEST.tsv", newline="") as f:
        manifest = {row["local_path"]: row for row in csv.DictReader(f, delimiter="\t")}
    assert set(raw) <= set(manifest)
    for r, t in raw.items():
        assert int(manifest[r]["n_events"]) == t.n, r


def test_large_integer_comms_id_exact(raw: dict[str, RawTrace], corpus: Corpus, duck) -> None:
    doc = load(raw[LARGE_INT].path)
    rpc = [(k, e) for k, e in enumerate(elements(doc)) if e.get("name") == "record_param_comms"]
    assert len(rpc) == 1
    eid, e = rpc[0]
    comms_id = e["args"]["Comms Id"]
    assert isinstance(comms_id, int) and comms_id > 2**63 - 1  # premise: beyond int64
    part = partition(corpus, LARGE_INT)
    got = duck.execute(f"SELECT eid, comms_id FROM {pq(part, 'collectives')} ORDER BY eid"
                       ).fetchall()
    # the NCCL kernel ran before the call, so no call claims it: a collective of its own
    # (docs/collectives.md), with no comms id
    (kernel,) = [k for k, e in enumerate(elements(doc)) if e.get("cat") == "kernel"]
    assert got == sorted([(eid, comms_id), (kernel, None)])
    args = duck.execute(f"SELECT args FROM {pq(part, 'events')} WHERE eid = ?", [eid]
                        ).fetchone()[0]
    assert json.loads(args)["Comms Id"] == comms_id
    assert str(comms_id) in args


def test_report_names_a_collective_without_a_name(corpus: Corpus, tmp_path: Path) -> None:
    """The large-integer trace's record_param_comms has no Collective name: the report's
    collectives table says so (it raised on the missing name, found by the corpus audit)."""
    from click.testing import CliRunner

    from tracetool.cli import cli

    job = corpus.results[LARGE_INT]["job"]
    res = CliRunner().invoke(cli, ["report", str(corpus.store), "--job", job, "--out",
                                   str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "\nunnamed (no Collective name in the trace)  " in res.stdout
    assert "| unnamed (no Collective name in the trace) |" in (tmp_path / "report.md").read_text()


def test_matmul_rocm_profile_data(raw: dict[str, RawTrace], corpus: Corpus, duck) -> None:
    """rocmProfileData: bare array with a leading {} (quarantined), string ts/pid/tid/id."""
    t = raw[MATMUL]
    evs = elements(load(t.path))
    assert t.container == "array" and evs[0] == {}
    part = partition(corpus, MATMUL)
    q = duck.execute(f"SELECT eid, issue FROM {pq(part, 'ingest_issues')} WHERE quarantined"
                     ).fetchall()
    assert q == [(0, "empty_event")]
    rows = duck.execute(f"SELECT eid, pid, tid, pid_raw, tid_raw FROM {pq(part, 'events')}"
                        ).fetchall()
    assert rows
    for eid, pid, tid, pid_raw, tid_raw in rows:
        e = evs[eid]
        assert (pid_raw, tid_raw) == (e["pid"], e["tid"])
        assert (pid, tid) == (int(e["pid"]), int(e["tid"]))
    flows = duck.execute(f"SELECT eid, flow_id, flow_id_raw FROM {pq(part, 'flows')}").fetchall()
    assert len(flows) == t.n_flows
    for eid, flow_id, flow_id_raw in flows:
        assert (flow_id, flow_id_raw) == (int(evs[eid]["id"]), evs[eid]["id"])


# --------------------------------------------------------------------------- 3. exact times

EXACT_TIME_TRACES = {
    NS_RES: "abs_us_frac",  # 2024-03/04: absolute epoch us with ns decimals (19 digits)
    NCCL_CFG: "rel_base",  # relative ts + baseTimeNanoseconds
    B200: "rel_base",
    MI300: "rel_base",
    MTIA: "rel_base",
    MATMUL: "rel_unknown_base",  # string ts
    RESNET50_2021: "abs_us_int",
    BERT_DDP0_2021: "abs_us_int",  # bare array
    DLRM0: "abs_us_int",
}


def exact_ns(v: object) -> int:
    """A ts/dur value as written (Decimal, int or numeric string) -> ns; must be exact."""
    d = Decimal(v) * 1000 if not isinstance(v, str) else Decimal(v.strip()) * 1000
    assert d == d.to_integral_value(), f"{v!r} us is not a whole number of ns"
    return int(d)


@pytest.mark.parametrize("trace", list(EXACT_TIME_TRACES), ids=list(EXACT_TIME_TRACES))
def test_exact_timestamps(trace: str, raw: dict[str, RawTrace], corpus: Corpus, duck) -> None:
    t = raw[trace]
    doc = load(t.path, parse_float=Decimal)
    evs = elements(doc)
    base = int(doc.get("baseTimeNanoseconds", 0)) if isinstance(doc, dict) else 0
    part = partition(corpus, trace)
    tf = trace_file_row(duck, part)
    assert tf["ts_convention"] == EXACT_TIME_TRACES[trace]
    assert tf["base_time_ns"] == base
    if EXACT_TIME_TRACES[trace] == "rel_base":
        assert base > 0
    if EXACT_TIME_TRACES[trace] == "abs_us_frac":
        # premise: the era a double cannot hold; rounding floats would be wrong here
        ts = [e["ts"] for e in evs if isinstance(e.get("ts"), Decimal)]
        assert ts and max(ts) > Decimal(10) ** 15
        assert any(round(float(x) * 1000) != exact_ns(x) for x in ts)

    bad: list[tuple] = []
    checked = 0
    for eid, ts_ns, dur_ns, end_ns in duck.execute(
            f"SELECT eid, ts_ns, dur_ns, end_ns FROM {pq(part, 'events')}").fetchall():
        e = evs[eid]
        want_ts = base + exact_ns(e["ts"])
        want_dur = exact_ns(e["dur"]) if e["ph"] == "X" and "dur" in e else 0
        if (ts_ns, dur_ns, end_ns) != (want_ts, want_dur, want_ts + want_dur):
            bad.append(("events", eid, e.get("ts"), e.get("dur"), ts_ns, dur_ns, end_ns))
        checked += 1
    for table in ("flows", "counters"):
        for eid, ts_ns in duck.execute(
                f"SELECT DISTINCT eid, ts_ns FROM {pq(part, table)}").fetchall():
            if ts_ns != base + exact_ns(evs[eid]["ts"]):
                bad.append((table, eid, evs[eid]["ts"], ts_ns))
            checked += 1
    assert checked == t.n_events + t.n_flows + t.n_counter_events
    assert not bad, f"{len(bad)} wrong times, e.g. {bad[:5]}"


# --------------------------------------------------------------------------- 4. nesting


def test_nesting_sanity(kineto_file: str, corpus: Corpus, duck) -> None:
    part = partition(corpus, kineto_file)
    ev = pq(part, "events")
    bad = duck.execute(f"""
        SELECT c.eid, c.track_id, c.ts_ns, c.depth, p.eid, p.track_id, p.ts_ns, p.end_ns, p.depth
        FROM {ev} c LEFT JOIN {ev} p ON p.eid = c.parent_eid
        WHERE c.parent_eid IS NOT NULL AND (
              p.eid IS NULL                                   -- parent exists
           OR p.track_id <> c.track_id                        -- on the same track
           OR p.ts_ns > c.ts_ns                               -- starts no later
           OR c.depth <> p.depth + 1                          -- one level up
           OR NOT (c.ts_ns < p.end_ns OR c.ts_ns = p.ts_ns)   -- child starts inside it
           OR c.overlaps_parent <> (c.end_ns > p.end_ns))
        LIMIT 5""").fetchall()
    assert not bad, f"bad parent links (child..., parent...): {bad}"
    roots = duck.execute(f"""
        SELECT count(*) FILTER (WHERE depth IS NULL),
               count(*) FILTER (WHERE (depth = 0) <> (parent_eid IS NULL))
        FROM {ev} WHERE ph IN ('X', 'i')""").fetchone()
    assert roots == (0, 0)


# --------------------------------------------------------------------------- 5. launches


def test_gpu_ops_launch_eid(kineto_file: str, raw: dict[str, RawTrace], corpus: Corpus,
                            duck) -> None:
    """Every GPU op whose args.correlation matches a cuda_runtime/cuda_driver call (raw JSON)
    has that call as launch_eid; the others have none."""
    t = raw[kineto_file]
    part = partition(corpus, kineto_file)
    rows = duck.execute(f"SELECT eid, kind, launch_eid, launch_name FROM {pq(part, 'gpu_ops')}"
                        ).fetchall()
    assert {eid: kind for eid, kind, _, _ in rows} == {k: v[0] for k, v in t.gpu_ops.items()}
    bad = []
    for eid, _, launch_eid, launch_name in rows:
        calls = t.launches.get(t.gpu_ops[eid][1], [])
        ok = (launch_eid, launch_name) in calls if calls else launch_eid is None
        if not ok:
            bad.append((eid, t.gpu_ops[eid][1], calls[:2], launch_eid, launch_name))
    assert not bad, f"{len(bad)} GPU ops with a wrong launch_eid, e.g. {bad[:5]}"


@pytest.mark.parametrize("trace", [B200, NCCL_CFG, MI300, BERT_DDP0_2021, TRITON, DF_INDEX])
def test_launch_check_is_not_vacuous(trace: str, raw: dict[str, RawTrace]) -> None:
    """The launch check above really links kernels on the traces the issue names."""
    t = raw[trace]
    matched = [c for _, corr in t.gpu_ops.values() for c in t.launches.get(corr, [])]
    assert matched
    if trace == B200:  # launched through both the runtime and the driver API
        evs = elements(load(t.path))
        assert {evs[eid]["cat"] for eid, _ in matched} == {"cuda_runtime", "cuda_driver"}


# --------------------------------------------------------------------------- steps, 2021 era


@pytest.mark.parametrize("trace", [RESNET50_2021, BERT_CPU_2021, BERT_DDP0_2021, BERT_DDP1_2021])
def test_steps_found_in_2021_legacy_category_traces(trace: str, raw: dict[str, RawTrace],
                                                    corpus: Corpus, duck) -> None:
    """2021 traces predate the user_annotation category: ProfilerStep#N is written with
    cat "Operator" (like every CPU op of that era). They are still the profiler's step
    windows, so the steps table should hold them."""
    t = raw[trace]
    assert t.steps_legacy and t.steps_legacy == t.steps  # premise: all steps are Operator
    part = partition(corpus, trace)
    steps = duck.execute(f"SELECT step FROM {pq(part, 'profiler_steps')}").fetchnumpy()["step"]
    assert set(steps.tolist()) == t.steps


# --------------------------------------------------------------------------- 5. replay


@pytest.fixture(scope="session")
def corpus_con(corpus: Corpus):
    import tracetool

    con = tracetool.connect(corpus.store)
    yield con
    con.close()


def test_identity_replay_of_every_trace(kineto_file: str, corpus: Corpus, corpus_con) -> None:
    """Every trace replays (a job without ProfilerStep as one window) and identity gives its
    measured step times exactly; a projection onto another GPU runs on it too."""
    from tracetool.replay import Replayer, Scenario, resolve_gpu
    from tracetool.replay.compute import WhatIfError

    res = corpus.results[kineto_file]
    n_graph = corpus_con.execute("""
        SELECT count(*) FROM events e LEFT JOIN gpu_ops g USING (job, rank, eid)
        WHERE e.job = ? AND e.ph = 'X' AND e.dur_ns >= 0 AND (g.eid IS NOT NULL OR
              (e.track_kind = 'cpu_thread' AND e.kind NOT IN ('kernel', 'memcpy', 'memset')))
        """, [res["job"]]).fetchone()[0]
    if n_graph == 0:  # e.g. rocmProfileData's matmul: only counters and instants
        with pytest.raises(ValueError, match="no events on CPU threads or GPU streams"):
            Replayer.from_store(corpus_con, res["job"])
        return
    r = Replayer.from_store(corpus_con, res["job"])
    assert r.graph.cycle_breaks == 0
    expected = dict(corpus_con.execute(
        "SELECT step, dur_ns FROM job_steps WHERE job = ? AND complete",
        [res["job"]]).fetchall())
    steps = r.run().steps
    if expected:
        assert {s.step: s.measured_ns for s in steps} == expected
    else:
        (s,) = steps
        assert s.step is None
    assert all(s.projected_ns == s.measured_ns for s in steps)
    onto_b200 = Scenario(gpu=resolve_gpu("b200"), source_gpu=resolve_gpu("h100"))
    n_gpu_ops = corpus_con.execute("SELECT count(*) FROM gpu_ops WHERE job = ?",
                                   [res["job"]]).fetchone()[0]
    if n_gpu_ops == 0:  # a GPU changes nothing a CPU-only trace ran: refused
        with pytest.raises(WhatIfError, match="has no GPU ops"):
            r.run(onto_b200, critical_path=False)
        return
    if not corpus_con.execute("SELECT count(*) FROM gpu_ops WHERE job = ? AND NOT is_comm",
                              [res["job"]]).fetchone()[0]:  # only comm kernels: the same
        with pytest.raises(WhatIfError, match="is a communication kernel"):
            r.run(onto_b200, critical_path=False)
        return
    onto = r.run(onto_b200, critical_path=False)
    projected = onto.steps
    assert [s.step for s in projected] == [s.step for s in steps]
    # a what-if changes the projection, or says why not (or is refused, above): issue 26
    unchanged = [p.projected_ns for p in projected] == [s.measured_ns for s in steps]
    assert unchanged == any(n.startswith("no step time changed") for n in onto.notes)


def test_steps_tile_each_rank(kineto_file: str, corpus: Corpus, corpus_con) -> None:
    """docs/steps.md: per rank, steps do not overlap and their times add up to the span from
    the first step's start to the last step's end; job steps tile the job the same way."""
    job = corpus.results[kineto_file]["job"]
    for table, key in (("steps", "rank"), ("job_steps", "job")):
        rows = corpus_con.execute(
            f"SELECT {key}, step, start_ns, end_ns, dur_ns FROM {table} WHERE job = ? "
            f"ORDER BY {key}, step", [job]).fetchall()
        by: dict = defaultdict(list)
        for k, *r in rows:
            by[k].append(r)
        for tiles in by.values():
            assert all(d == e - s >= 0 for _, s, e, d in tiles)
            assert all(a[2] == b[1] for a, b in zip(tiles, tiles[1:], strict=False))
            assert sum(d for *_, d in tiles) == tiles[-1][2] - tiles[0][1]


def test_every_part_of_a_table_has_the_schemas_columns_and_types(corpus: Corpus) -> None:
    """The views read each table's parts without union_by_name (which reads every file's
    footer when a view is bound: 9 s at 1,024 ranks, 2.5 s without), so every part of a
    table, over every real trace, must have exactly the schema's columns and types."""
    import pyarrow.parquet as pq

    from tracetool.schema import TABLES
    from tracetool.store_views import table_files

    for t in TABLES:
        files = table_files(corpus.store, t.name)
        assert files, t.name
        for f in files:
            got = pq.read_schema(f).remove_metadata()
            assert got.names == t.schema.names, (t.name, f)
            assert got.types == t.schema.types, (t.name, f, got)


def _corpus_audit():
    """benchmarks/corpus_audit.py, whose invariants this suite checks on its corpus store."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "corpus_audit.py"
    spec = importlib.util.spec_from_file_location("corpus_audit", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_corpus_audit_invariants(corpus: Corpus, corpus_con) -> None:
    """Issue 26's audit over every job of the corpus: no negative self time, breakdown parts
    that add up to the step, comm time wherever kernels are communication, no
    launch_overhead segment over 10 ms (none on a job without GPU ops), job steps within
    their ranks' extent (benchmarks/corpus_audit.py runs the CLI on them too)."""
    audit = _corpus_audit()
    jobs = sorted({r["job"] for r in corpus.results.values() if r["status"] == "ingested"})
    assert len(jobs) >= 45
    checked = audit.check_jobs(corpus_con)
    assert sorted(checked) == jobs
    assert {j: a.broken for j, a in checked.items() if a.broken} == {}
