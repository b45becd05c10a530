"""Analysis views on real traces, checked against independent computations from the raw JSON."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

import tracetool
from tracetool.ingest.pipeline import Options, ingest

from ._util import SAMPLES, SHARED_TRACES, independent_steps

HTA = "facebookresearch__HolisticTraceAnalysis/tests/data"
BREAKDOWN_TRACES = {
    "nccl": f"{HTA}/nccl_parser_config/nccl_data.json.gz",
    "mi300": "AMD-AGI__TraceLens/tests/traces/mi300/resnet_act_checkpoint.json.gz",
    "h100": "AMD-AGI__TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "dlrm0": "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto/"
             "worker0_step_12.1694128201545.pt.trace.json",
    "resnet2021": "pytorch__kineto/tb_plugin/samples/resnet50_num_workers_0/"
                  "worker0.1623143089861.pt.trace.json.gz",
    "v100": f"{HTA}/df_index_resolver/df_index_resolver.json.gz",
}
DLRM_DIR = "facebookresearch__param/et_replay/tests/inputs/dlrm_kineto/dlrm_kineto"
GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
            "gpu_memset": "memcpy", "Memset": "memcpy"}
LAUNCH_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}
COMM = re.compile(r"^nccl|rccl|multimem|all_?reduce.*kernel", re.IGNORECASE)

pytestmark = pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                                reason=f"real trace corpus not found at {SHARED_TRACES}")


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The breakdown traces (one job each), the DLRM 8 ranks and the gloo samples."""
    s = tmp_path_factory.mktemp("analysis") / "store"
    for job, rel in BREAKDOWN_TRACES.items():
        r = ingest([SHARED_TRACES / rel], Options(store=s, job=job, rank=0, workers=2))
        assert r[0].status == "ingested", r[0].message
    r = ingest([SHARED_TRACES / DLRM_DIR], Options(store=s, job="dlrm", workers=2))
    assert [x.status for x in r] == ["ingested"] * 8
    r = ingest([SAMPLES], Options(store=s, job="gloo", workers=2))
    assert [x.status for x in r] == ["ingested"] * 2
    return s


def _us(v: object) -> int:
    return int(Decimal(str(v)) * 1000)


def _union(iv: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def independent_breakdown(path: Path) -> dict[int, dict[str, int]]:
    """Per step: compute/comm/memcpy/busy union lengths, computed from the raw JSON alone."""
    text = (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")).read()
    doc = json.loads(text, strict=False, parse_float=Decimal)
    evs = doc["traceEvents"] if isinstance(doc, dict) else doc
    base = int(doc.get("baseTimeNanoseconds", 0)) if isinstance(doc, dict) else 0
    steps, launches, gpu, marks = {}, {}, [], {}
    for e in evs:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        cat, name, args = e.get("cat"), e.get("name") or "", e.get("args") or {}
        ts = base + _us(e["ts"])
        end = ts + _us(e.get("dur", 0))
        m = re.fullmatch(r"ProfilerStep#(\d+)", name)
        if m and cat in ("user_annotation", "Operator", "cpu_op"):
            steps.setdefault(int(m.group(1)), (ts, end))
        if m and cat == "gpu_user_annotation":
            marks.setdefault(int(m.group(1)), (ts, e.get("pid")))
        if cat in LAUNCH_CATS and "correlation" in args:
            launches.setdefault(args["correlation"], ts)
        if cat in GPU_CATS:
            what = GPU_CATS[cat]
            if what == "kernel":
                comm = bool(COMM.search(name)) or "Collective name" in args
                what = "comm" if comm else "compute"
            gpu.append((ts, end, what, args.get("correlation"), e.get("pid")))
    if not steps:
        return {}
    launched = {n: [g for g in gpu if cs <= launches.get(g[3], g[0]) < ce]
                for n, (cs, ce) in steps.items()}
    out = {}
    for n, (start, end) in independent_steps(steps, launched, marks, gpu).items():
        clip = [(max(s, start), min(e, end), w) for s, e, w, _, _ in gpu
                if s < end and e > start]
        u = {w: _union([(s, e) for s, e, x in clip if x == w])
             for w in ("compute", "comm", "memcpy")}
        u["busy"] = _union([(s, e) for s, e, _ in clip])
        u["compute_comm"] = _union([(s, e) for s, e, x in clip if x != "memcpy"])
        u["dur"] = end - start
        out[n] = u
    return out


@pytest.mark.parametrize("job", list(BREAKDOWN_TRACES))
def test_step_breakdown_matches_independent_interval_union(store: Path, job: str) -> None:
    want = independent_breakdown(SHARED_TRACES / BREAKDOWN_TRACES[job])
    assert want, "trace has ProfilerSteps"
    con = tracetool.connect(store)
    got = {r[0]: r[1:] for r in con.execute(
        "SELECT step, dur_ns, compute_ns, comm_ns, memcpy_ns, overlap_ns, idle_ns "
        "FROM step_breakdown WHERE job = ? ORDER BY step", [job]).fetchall()}
    assert sorted(got) == sorted(want)
    for n, w in want.items():
        dur, compute, comm, memcpy, overlap, idle = got[n]
        tol = max(1, w["dur"] // 1000)  # 0.1% of the step
        assert abs(dur - w["dur"]) <= tol, (n, dur, w["dur"])
        assert abs(compute - w["compute"]) <= tol, (n, "compute", compute, w["compute"])
        assert abs(comm - w["comm"]) <= tol, (n, "comm", comm, w["comm"])
        assert abs(memcpy - w["memcpy"]) <= tol, (n, "memcpy", memcpy, w["memcpy"])
        assert abs(overlap - (w["compute"] + w["comm"] - w["compute_comm"])) <= tol
        assert abs(idle - (w["dur"] - w["busy"])) <= tol, (n, "idle", idle)


def test_breakdown_columns_add_up(store: Path) -> None:
    con = tracetool.connect(store)
    bad = con.execute("""
        SELECT job, rank, step FROM step_breakdown
        WHERE idle_ns < 0 OR overlap_ns < 0 OR exposed_comm_ns <> comm_ns - overlap_ns
           OR compute_ns + comm_ns - overlap_ns > dur_ns
           OR (cpu_bound_ns IS NOT NULL AND (cpu_bound_ns < 0 OR cpu_bound_ns > idle_ns))
    """).fetchall()
    assert bad == []
    # every GPU trace has some compute; the gloo ranks have comm from their gloo spans
    assert con.execute("SELECT min(comm_ns) FROM step_breakdown WHERE job = 'gloo'"
                       ).fetchone()[0] > 0


def test_gloo_collectives_matched_across_ranks(store: Path) -> None:
    con = tracetool.connect(store)
    rows = con.execute("""
        SELECT instance, count(*), min(n_ranks), max(skew_ns), min(wait_ns),
               count(DISTINCT bytes), any_value(last_rank)
        FROM collective_instances WHERE job = 'gloo' GROUP BY instance ORDER BY instance
    """).fetchall()
    assert len(rows) == 9
    for _inst, n, n_ranks, skew, min_wait, n_sizes, _last in rows:
        assert (n, n_ranks, n_sizes, min_wait) == (2, 2, 1, 0)
        assert skew >= 0
    # the last rank's wait is 0 and the other's equals the skew
    assert con.execute("""
        SELECT count(*) FROM collective_instances WHERE job = 'gloo'
          AND ((rank = last_rank AND wait_ns <> 0) OR (rank <> last_rank AND wait_ns <> skew_ns))
    """).fetchone()[0] == 0
    assert con.execute("SELECT offset_ns FROM rank_clock_offsets WHERE job = 'gloo' AND rank = 0"
                       ).fetchone()[0] == 0


def test_dlrm_collectives_span_all_eight_ranks(store: Path) -> None:
    con = tracetool.connect(store)
    per_rank = con.execute("SELECT rank, count(*) FROM collectives WHERE job = 'dlrm' "
                           "GROUP BY rank ORDER BY rank").fetchall()
    assert [r for r, _ in per_rank] == list(range(8))
    counts = {n for _, n in per_rank}
    assert len(counts) == 1, per_rank  # every rank issued the same calls
    n_inst = con.execute("SELECT count(DISTINCT instance), min(n_ranks), max(n_ranks) "
                         "FROM collective_instances WHERE job = 'dlrm'").fetchone()
    assert n_inst == (counts.pop(), 8, 8)
    busbw = con.execute("SELECT min(busbw_gbps) FROM collective_instances "
                        "WHERE job = 'dlrm' AND bytes > 1000000").fetchone()[0]
    assert busbw is not None and busbw > 0
    stragglers = con.execute("SELECT sum(times_last), count(*) FROM stragglers "
                             "WHERE job = 'dlrm'").fetchone()
    assert stragglers[1] == 8 and stragglers[0] >= n_inst[0]  # ties may count twice


def test_kernel_summary_counts_match_raw(store: Path) -> None:
    path = SHARED_TRACES / BREAKDOWN_TRACES["h100"]
    evs = json.loads(gzip.open(path).read(), strict=False)["traceEvents"]
    want: dict[str, int] = {}
    for e in evs:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            want[e["name"]] = want.get(e["name"], 0) + 1
    con = tracetool.connect(store)
    got = dict(con.execute("SELECT name, count FROM kernel_summary WHERE job = 'h100'"
                           ).fetchall())
    assert got == want


def test_every_view_is_documented_and_queryable(store: Path) -> None:
    from tracetool.analysis.connect import view_files

    con = tracetool.connect(store)
    for name, sql in view_files():
        for view in re.findall(r"CREATE OR REPLACE VIEW (\w+)", sql):
            assert f"-- @view {view}:" in sql, f"{name}: {view} has no doc header"
            cols = [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()]
            doc = sql[sql.index(f"-- @view {view}:"):sql.index(f"CREATE OR REPLACE VIEW {view} ")]
            # "All columns of T" documents T's columns (the schema module has them)
            inherited = set()
            for base in re.findall(r"All columns of (\w+)", doc):
                inherited |= {r[0] for r in con.execute(f"DESCRIBE {base}").fetchall()}
            missing = [c for c in cols if c not in doc and c not in inherited]
            assert not missing, f"{view}: undocumented columns {missing}"


def test_sql_cli(store: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tracetool", "sql", str(store), *args],
                              capture_output=True, text=True, timeout=120)

    r = run("SELECT rank, count(*) AS n FROM collective_instances WHERE job = 'gloo' "
            "GROUP BY rank ORDER BY rank", "--json")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [{"rank": 0, "n": 9},
                                                              {"rank": 1, "n": 9}]
    r = run("SELECT step FROM steps WHERE job = 'gloo' AND rank = 0 ORDER BY step",
            "--format", "csv")
    assert r.stdout == "step\n2\n3\n4\n"
    out = tmp_path / "b.parquet"
    r = run("SELECT * FROM step_breakdown", "--format", "parquet", "--output", str(out))
    assert r.returncode == 0 and out.stat().st_size > 0
    r = run("SELECT * FROM no_such_view")
    assert r.returncode == 1 and r.stderr.startswith("tracetool: error: Catalog Error")
    assert r.stderr.count("\n") == 1
    r = run("--print-setup")
    assert "CREATE OR REPLACE VIEW step_breakdown" in r.stdout
    # the printed setup works in a fresh DuckDB
    import duckdb

    fresh = duckdb.connect()
    fresh.execute(r.stdout)
    assert fresh.execute("SELECT count(*) FROM steps WHERE job = 'gloo'").fetchone() == (6,)


def test_polars_from_the_python_api(store: Path) -> None:
    df = tracetool.connect(store).sql("SELECT * FROM kernel_summary WHERE job = 'nccl'").pl()
    assert df.height > 0 and {"name", "count", "p99_ns"} <= set(df.columns)
