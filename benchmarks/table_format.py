"""Which table format should the store have (issue 29, deliverable 1's measurement): today's
store against Delta Lake (delta-rs, ``deltalake``) on the same data, in the same run.

Nothing here changes the store. The job is scale.py's (``job_ranks``: N ranks of ~2 MB, 3
ProfilerSteps each, generated once and cached under benchmarks/.work/scale/). Steps:

``ingest``  today's store through the real CLI (``tracetool ingest DIR --store S --job scale``,
            the pack included), wall time and CPU (user + sys of the whole process tree).
``pack``    ``tracetool pack`` alone (the job's current pack set aside), for the pack's share.
``layout``  the write path alone, from the same Arrow data (the ranks' tables read back from
            that store, not timed): (a) today's layout, one Parquet file per table per rank
            (pyarrow with ingest's settings: zstd, 128k-row groups, its dictionary columns) and
            one rename of the rank's directory into place; (b) Delta, one Parquet file per
            table per batch of ``--batch`` ranks (``job`` and ``rank`` columns, rows in rank
            order, one row group per rank) committed with delta-rs, in two shapes: ``tables``
            (a Delta table per store table: 12 commits per batch) and ``job`` (one Delta table
            per job, partitioned by ``table``, the union of the tables' columns as its schema:
            one commit per batch spans every table). CPU by ``time.process_time`` (delta-rs's
            threads included).
``jobbig``  the ``job`` shape again with the pack's 122,880-row groups in its batch files.
``compact`` the pack's counterpart: the ``job`` table with every store table rewritten into one
            file in one commit, with one row group per rank (``compact``), 122,880-row groups
            (``compactbig``), or those written by DuckDB's ``COPY`` as the pack is
            (``compactduck``).
``queries`` the store's heavy views (scale.py's four, and ``startup``) over today's packed
            store and over the Delta shapes (--formats), each in a fresh process: DuckDB reads the
            Parquet files of one Delta snapshot (``DeltaTable.file_uris`` / the add actions:
            DuckDB's delta extension cannot be installed offline, and its PyPI build is for
            DuckDB 1.4.4), behind the store's own lockdown and analysis views; row counts
            checked equal across formats.
``s3``      a local S3 server (moto, in its own process, counting every request it serves,
            with whether a PUT was conditional): today's CLI ingest of the first
            ``--s3-ranks`` ranks, and the same ranks as Delta batches; requests per commit and
            per reader open.
``race``    two processes committing to one job at once: today's store (two CLI ingests of
            different ranks, local and S3) and Delta (appends of different ranks; replaces of
            the same rank).
``kill``    a Delta writer SIGKILLed during its commits, ``--kill-trials`` times per shape:
            what a reader of the latest snapshot sees (every listed file there? every table
            holding the same ranks?).
``snapshot`` a reader pinned to a Delta snapshot while a writer replaces a rank, then after a
            vacuum.

Run it alone on the machine (other benchmarks take the same lock); each step can run apart
(``--steps``), reusing the cached today's store and Delta tables:

    flock /tmp/tracetool-bench.lock .venv/bin/python benchmarks/table_format.py \\
        [--ranks 1024] [--batch 16] [--s3-ranks 64] [--steps ingest,layout,queries,...] \\
        [--json FILE]

Needs ``pip install 'tracetool[bench]'`` (deltalake) and the test extra (moto, boto3).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

WORK = HERE / ".work" / "table_format"
JOB = "scale"
VIEWS = ("collective_instances", "stragglers", "rank_clock_offsets", "step_breakdown")
STEPS = ("ingest", "pack", "layout", "jobbig", "compact", "queries", "s3", "race", "kill",
         "snapshot")
# tables every rank of the generated job has rows in (a killed writer's reader checks these)
EVERY_RANK = ("trace_files", "events", "gpu_ops", "profiler_steps", "cp_nodes", "rank_edges")


# --------------------------------------------------------------------------- helpers


def tracetool_cmd() -> list[str]:
    exe = REPO / ".venv" / "bin" / "tracetool"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tracetool"]


def run_cli(argv: list[str], env: dict[str, str] | None = None, timeout: float = 1800
            ) -> dict[str, Any]:
    """A tracetool command as its own process: wall seconds, CPU seconds (user + sys of it
    and every process it waited for), exit code, output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([*tracetool_cmd(), *argv], capture_output=True, text=True,
                       env=env, timeout=timeout)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
            "sys_s": after.ru_stime - before.ru_stime,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def job_traces(ranks: int, size: str, steps: int) -> tuple[Path, dict[str, Any]]:
    import scale  # sibling script: its generator and cache of jobs

    d = scale.job_dir(ranks, size, steps)
    return d, json.loads(d.with_name(d.name + ".done.json").read_text())


def today_store(a: argparse.Namespace) -> Path:
    return WORK / f"today-{a.ranks}r-{a.size}"


def delta_root(a: argparse.Namespace, shape: str) -> Path:
    return WORK / f"delta-{shape}-{a.ranks}r-{a.size}-b{a.batch}"


def table_names() -> list[str]:
    from tracetool.schema import TABLES

    return [t.name for t in TABLES]


def rank_tables(store: Path, rank: int) -> dict[str, Any]:
    """One rank's tables (pyarrow) from a directory store's partition."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = store / "data" / f"job={JOB}" / f"rank={rank}"
    out = {}
    for t in table_names():
        files = sorted((part / t).glob("*.parquet"))
        tabs = [pq.ParquetFile(f).read() for f in files]
        out[t] = pa.concat_tables(tabs) if len(tabs) > 1 else tabs[0]
    return out


def ingest_dictionary(names: list[str]) -> list[str]:
    from tracetool.ingest.finish import DICTIONARY_COLUMNS

    return [c for c in DICTIONARY_COLUMNS if c in names]


# --------------------------------------------------------------------------- Delta shapes


def union_schema() -> tuple[Any, list[str]]:
    """The ``job`` shape's Delta schema: every table's columns (first type wins), ``job``,
    ``rank`` and the partition column ``table``; and the columns whose types differ between
    tables (those a real conversion must rename)."""
    import pyarrow as pa

    from tracetool.schema import TABLES

    fields: dict[str, Any] = {}
    clash = []
    for t in TABLES:
        for f in arrow_schema(t.name):
            if f.name in fields and fields[f.name].type != f.type:
                clash.append(f"{t.name}.{f.name}")
            fields.setdefault(f.name, f)
    fields["table"] = pa.field("table", pa.string())
    return pa.schema(list(fields.values())), clash


_ARROW: dict[str, Any] = {}


def arrow_schema(table: str) -> Any:
    """A table's Arrow schema as a batch file holds it (the rank partition's columns, then
    ``job`` and ``rank``), read from today's store once."""
    return _ARROW[table]


def learn_schemas(store: Path) -> None:
    import pyarrow as pa

    tabs = rank_tables(store, 0)
    for t, tab in tabs.items():
        _ARROW[t] = with_job_rank(tab, 0).schema if tab.num_columns else pa.schema([])


def with_job_rank(tab: Any, rank: int) -> Any:
    import pyarrow as pa

    n = tab.num_rows
    tab = tab.append_column("job", pa.array([JOB] * n, pa.string()))
    return tab.append_column("rank", pa.array([rank] * n, pa.int32()))


def write_batch_file(path: Path, per_rank: list[tuple[int, Any]],
                     group_rows: int | None = None) -> dict[str, Any] | None:
    """One Parquet file of a table for a batch of ranks: rows in rank order, one row group
    per rank (two when a rank has more than 1M rows), or with ``group_rows`` row groups of
    that many rows that ranks share; ingest's compression and dictionary columns. Returns
    its add-action facts, or None when the batch has no rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sum(t.num_rows for _, t in per_rank)
    if rows == 0:
        return None
    schema = with_job_rank(per_rank[0][1], per_rank[0][0]).schema
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, schema, compression="zstd",
                          use_dictionary=ingest_dictionary(schema.names)) as w:
        if group_rows is not None:
            w.write_table(pa.concat_tables([with_job_rank(t, r) for r, t in per_rank
                                            if t.num_rows]), row_group_size=group_rows)
        for rank, t in per_rank if group_rows is None else []:
            if t.num_rows:
                w.write_table(with_job_rank(t, rank), row_group_size=1 << 20)
    ranks = [r for r, t in per_rank if t.num_rows]
    return {"rows": rows, "size": path.stat().st_size, "min_rank": min(ranks),
            "max_rank": max(ranks)}


def add_action(rel: str, facts: dict[str, Any], partition: dict[str, str | None]) -> Any:
    from deltalake.transaction import AddAction

    stats = {"numRecords": facts["rows"], "minValues": {"rank": facts["min_rank"]},
             "maxValues": {"rank": facts["max_rank"]}, "nullCount": {"rank": 0}}
    return AddAction(rel, facts["size"], partition, int(time.time() * 1000), True,
                     json.dumps(stats))


class DeltaWriter:
    """Writes batches of ranks into one of the two Delta shapes, at a local path or an
    ``s3://`` URI (files uploaded create-if-absent with boto3, as today's writer does)."""

    def __init__(self, uri: str, shape: str, storage: dict[str, str] | None = None,
                 local_tmp: Path | None = None, group_rows: int | None = None) -> None:
        self.uri, self.shape, self.storage = uri, shape, storage
        self.group_rows = group_rows
        self.tmp = local_tmp or WORK / "writer-tmp"  # files leave it by put()
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.s3 = uri.startswith("s3://")
        self.tables: dict[str, Any] = {}

    def create(self) -> None:
        from deltalake import DeltaTable

        if self.shape == "job":
            schema, _ = union_schema()
            DeltaTable.create(self.uri, schema, partition_by=["table"], mode="ignore",
                              storage_options=self.storage)
        else:
            for t in table_names():
                DeltaTable.create(f"{self.uri}/{t}", arrow_schema(t), mode="ignore",
                                  storage_options=self.storage)

    def table(self, name: str) -> Any:
        from deltalake import DeltaTable

        if name not in self.tables:
            self.tables[name] = DeltaTable(name, storage_options=self.storage)
        else:
            self.tables[name].update_incremental()
        return self.tables[name]

    def put(self, local: Path, key_uri: str) -> None:
        if self.s3:
            import boto3

            bucket, key = key_uri[5:].split("/", 1)
            with open(local, "rb") as f:
                boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=f, IfNoneMatch="*")
            local.unlink()
        else:
            Path(key_uri).parent.mkdir(parents=True, exist_ok=True)
            os.replace(local, key_uri)

    def write_files(self, batch: dict[str, list[tuple[int, Any]]], tag: str
                    ) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every table's file of one batch, in place (not yet committed): table ->
        (path relative to its Delta table, facts)."""
        out = {}
        for t, per_rank in batch.items():
            local = self.tmp / f"{t}-{tag}.parquet"
            facts = write_batch_file(local, per_rank, self.group_rows)
            if facts is None:
                continue
            # a partition's directory named hive style: polars' scan_delta (2.1) takes
            # partition values from the path, not from the log's partitionValues
            rel = f"table={t}/{tag}.parquet" if self.shape == "job" else f"{tag}.parquet"
            base = self.uri if self.shape == "job" else f"{self.uri}/{t}"
            self.put(local, f"{base}/{rel}")
            out[t] = (rel, facts)
        return out

    def commit(self, files: dict[str, tuple[str, dict[str, Any]]], tag: str,
               before_each: Any = None) -> int:
        """Publish one batch: one commit (``job``) or one per table (``tables``). Returns
        the number of Delta commits made."""
        from deltalake.transaction import CommitProperties

        props = CommitProperties(custom_metadata={"tracetool_batch": tag})
        if self.shape == "job":
            dt = self.table(self.uri)
            dt.create_write_transaction(
                [add_action(rel, f, {"table": t}) for t, (rel, f) in files.items()],
                mode="append", schema=dt.schema(), partition_by=["table"],
                commit_properties=props)
            return 1
        for t, (rel, f) in files.items():
            if before_each is not None:
                before_each(t)
            dt = self.table(f"{self.uri}/{t}")
            dt.create_write_transaction([add_action(rel, f, {})], mode="append",
                                        schema=dt.schema(), commit_properties=props)
        return len(files)


def add_actions(dt: Any) -> dict[str, list[Any]]:
    """A Delta snapshot's add actions as columns (deltalake returns an arro3 table)."""
    import pyarrow as pa

    return pa.table(dt.get_add_actions(flatten=True)).to_pydict()


def snapshot_files(uri: str, shape: str, storage: dict[str, str] | None = None,
                   version: int | None = None) -> dict[str, list[str]]:
    """Each store table's data files in one Delta snapshot (the latest, or ``version``)."""
    from deltalake import DeltaTable

    out: dict[str, list[str]] = {t: [] for t in table_names()}
    if shape == "job":
        dt = DeltaTable(uri, storage_options=storage, version=version)
        acts = add_actions(dt)
        for p, t in zip(acts["path"], acts["partition.table"], strict=True):
            out[t].append(p if "://" in p else f"{uri}/{p}")
    else:
        for t in table_names():
            out[t] = DeltaTable(f"{uri}/{t}", storage_options=storage,
                                version=version).file_uris()
    # file order = rank order (batches are written in rank order; names sort by batch)
    return {t: sorted(v) for t, v in out.items()}


# --------------------------------------------------------------------------- step: ingest


def step_ingest(a: argparse.Namespace, res: dict[str, Any]) -> None:
    d, meta = job_traces(a.ranks, a.size, a.steps)
    store = today_store(a)
    shutil.rmtree(store, ignore_errors=True)
    r = run_cli(["ingest", str(d), "--store", str(store), "--job", JOB, "--json"])
    if r["rc"] != 0:
        raise SystemExit(f"ingest failed: {r['stderr'][-500:]}")
    mb = meta["bytes"] / 1e6
    res["ingest"] = {
        "ranks": a.ranks, "mb": mb, "events": meta["events"],
        "ingest": {k: r[k] for k in ("wall_s", "user_s", "sys_s", "cpu_s")},
        "cpu_s_per_gb": r["cpu_s"] / (mb / 1000), "mb_per_s": mb / r["wall_s"],
        "parquet_mb": sum(f.stat().st_size for f in (store / "data").rglob("*.parquet")) / 1e6,
        "pack_mb": sum(f.stat().st_size for f in (store / "packs").rglob("*.parquet")) / 1e6,
    }
    i = res["ingest"]
    print(f"ingest (today, CLI): {a.ranks} ranks, {mb:.0f} MB: {r['wall_s']:.1f} s wall, "
          f"CPU {r['user_s']:.1f} user + {r['sys_s']:.1f} sys = {r['cpu_s']:.1f} s "
          f"({i['cpu_s_per_gb']:.0f} CPU-s/GB, {i['mb_per_s']:.1f} MB/s); Parquet "
          f"{i['parquet_mb']:.0f} MB + pack {i['pack_mb']:.0f} MB", flush=True)


def step_pack(a: argparse.Namespace, res: dict[str, Any]) -> None:
    """The pack's share of the ingest: ``tracetool pack`` with the job's current pack
    unpublished (its ``current`` marker moved aside), so that it builds one; less the CLI's
    start-up (``tracetool sql S 'SELECT 1'``)."""
    store = today_store(a)
    marker = store / "packs" / f"job={JOB}" / "current"
    marker.rename(marker.with_name("current.bench-aside"))
    p = run_cli(["pack", str(store), "--job", JOB])
    if "packed" not in p["stdout"]:
        raise SystemExit(f"pack did not build: {p['stdout']} {p['stderr'][-300:]}")
    startup = run_cli(["sql", str(store), "SELECT 1"])
    marker.with_name("current.bench-aside").unlink()
    res["pack"] = {"wall_s": p["wall_s"], "cpu_s": p["cpu_s"],
                   "cli_startup_cpu_s": startup["cpu_s"]}
    print(f"`tracetool pack` ({a.ranks} ranks): {p['wall_s']:.1f} s wall, {p['cpu_s']:.1f} "
          f"CPU-s; CLI start-up {startup['cpu_s']:.1f} CPU-s", flush=True)


# --------------------------------------------------------------------------- step: layout


def step_layout(a: argparse.Namespace, res: dict[str, Any]) -> None:
    import pyarrow.parquet as pq

    src = today_store(a)
    learn_schemas(src)
    out_today = WORK / f"layout-today-{a.ranks}r"
    shutil.rmtree(out_today, ignore_errors=True)
    (out_today / "data" / f"job={JOB}").mkdir(parents=True)
    tmp = WORK / "layout-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    writers = {}
    for shape in ("tables", "job"):
        root = delta_root(a, shape)
        shutil.rmtree(root, ignore_errors=True)
        writers[shape] = DeltaWriter(str(root), shape, local_tmp=tmp)
        writers[shape].create()
    cpu = Counter()
    commits = Counter()
    files = Counter()
    for b0 in range(0, a.ranks, a.batch):
        ranks = list(range(b0, min(a.ranks, b0 + a.batch)))
        data = {r: rank_tables(src, r) for r in ranks}  # not timed: the derivation's output
        # (a) today's layout: a file per table per rank, the rank's directory renamed in
        t = time.process_time()
        for r in ranks:
            part = tmp / f"rank={r}"
            for name, tab in data[r].items():
                (part / name).mkdir(parents=True)
                pq.write_table(tab, part / name / "part-0.parquet", compression="zstd",
                               row_group_size=128 * 1024,
                               use_dictionary=ingest_dictionary(tab.column_names))
                files["today"] += 1
            part.rename(out_today / "data" / f"job={JOB}" / f"rank={r}")
        cpu["today"] += time.process_time() - t
        # (b) Delta: a file per table per batch, one commit (job) or one per table
        batch = {name: [(r, data[r][name]) for r in ranks] for name in table_names()}
        for shape, w in writers.items():
            tag = f"b{b0:07d}-{uuid.uuid4().hex[:12]}"
            t = time.process_time()
            written = w.write_files(batch, tag)
            t2 = time.process_time()
            commits[shape] += w.commit(written, tag)
            t3 = time.process_time()
            cpu[f"{shape}_files"] += t2 - t
            cpu[f"{shape}_commit"] += t3 - t2
            cpu[shape] += t3 - t
            files[shape] += len(written)
    shutil.rmtree(tmp, ignore_errors=True)
    n_batches = -(-a.ranks // a.batch)
    res["layout"] = {"ranks": a.ranks, "batch": a.batch, "batches": n_batches,
                     "cpu_s": dict(cpu), "files": dict(files), "commits": dict(commits),
                     "mb": {k: sum(f.stat().st_size for f in p.rglob("*.parquet")) / 1e6
                            for k, p in (("today", out_today),
                                         ("tables", delta_root(a, "tables")),
                                         ("job", delta_root(a, "job")))},
                     "union_clashes": union_schema()[1]}
    shutil.rmtree(out_today, ignore_errors=True)
    L = res["layout"]
    print(f"layout (write path, same Arrow data, {a.ranks} ranks, batches of {a.batch}):")
    print(f"  today  : {files['today']:6} files, CPU {cpu['today']:6.1f} s "
          f"({cpu['today'] / a.ranks * 1000:.1f} ms per rank), {L['mb']['today']:.0f} MB")
    for shape in ("tables", "job"):
        print(f"  delta {shape:6}: {files[shape]:5} files, {commits[shape]:5} commits, CPU "
              f"{cpu[shape]:6.1f} s (files {cpu[shape + '_files']:.1f}, commits "
              f"{cpu[shape + '_commit']:.1f}; {cpu[shape] / a.ranks * 1000:.1f} ms per rank), "
              f"{L['mb'][shape]:.0f} MB; today / delta = {cpu['today'] / cpu[shape]:.2f}x")
    if "ingest" in res and "pack" in res:
        pack = res["pack"]["cpu_s"] - res["pack"]["cli_startup_cpu_s"]
        base = res["ingest"]["ingest"]["cpu_s"] - cpu["today"] - pack
        gb = res["ingest"]["mb"] / 1000
        for shape in ("tables", "job"):
            est = base + cpu[shape]
            print(f"  estimate, whole ingest with delta {shape}: today's CLI ingest CPU "
                  f"{res['ingest']['ingest']['cpu_s']:.0f} s - its layout {cpu['today']:.0f} s"
                  f" - the pack {pack:.0f} s + delta {cpu[shape]:.0f} s = {est:.0f} CPU-s "
                  f"({est / gb:.0f} CPU-s/GB)")
            L[f"estimate_{shape}_cpu_s"] = est


# --------------------------------------------------------------------------- step: jobbig


def step_jobbig(a: argparse.Namespace, res: dict[str, Any]) -> None:
    """The ``job`` shape again with the pack's row groups (122,880 rows, ranks sharing
    them) in its batch files: uncompacted, so many files per table, big row groups."""
    src = today_store(a)
    learn_schemas(src)
    root = delta_root(a, "jobbig")
    shutil.rmtree(root, ignore_errors=True)
    tmp = WORK / "layout-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    w = DeltaWriter(str(root), "job", local_tmp=tmp, group_rows=122_880)
    w.create()
    cpu = 0.0
    for b0 in range(0, a.ranks, a.batch):
        ranks = list(range(b0, min(a.ranks, b0 + a.batch)))
        data = {r: rank_tables(src, r) for r in ranks}
        batch = {name: [(r, data[r][name]) for r in ranks] for name in table_names()}
        tag = f"b{b0:07d}-{uuid.uuid4().hex[:12]}"
        t = time.process_time()
        w.commit(w.write_files(batch, tag), tag)
        cpu += time.process_time() - t
    res["jobbig"] = {"cpu_s": cpu}
    print(f"jobbig (delta job, 122,880-row groups, {a.ranks} ranks): files and commits "
          f"{cpu:.1f} CPU-s", flush=True)


# --------------------------------------------------------------------------- step: compact


def step_compact(a: argparse.Namespace, res: dict[str, Any]) -> None:
    """The pack's counterpart in Delta: a copy of the ``job`` shape whose every table is
    rewritten into one file, rows in rank order, and committed as one transaction of removes
    and adds (``dataChange`` false); ``compact`` keeps one row group per rank,
    ``compactbig`` writes row groups of 122,880 rows as the pack does, ``compactduck`` the
    same with the pack's writer (DuckDB's ``COPY``, not pyarrow)."""
    for shape, group_rows in (("compact", None), ("compactbig", 122_880),
                              ("compactduck", 122_880)):
        compact_one(a, res, shape, group_rows)


def compact_one(a: argparse.Namespace, res: dict[str, Any], shape: str,
                group_rows: int | None) -> None:
    """``group_rows`` None: one row group per rank; else row groups of that many rows (as
    the pack's DuckDB COPY writes them), ranks sharing them."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties, RemoveAction

    src, dst = delta_root(a, "job"), delta_root(a, shape)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    t0 = time.process_time()
    dt = DeltaTable(str(dst))
    acts = add_actions(dt)
    by_table: dict[str, list[str]] = {}
    for p, t in zip(acts["path"], acts["partition.table"], strict=True):
        by_table.setdefault(t, []).append(p)
    actions: list[Any] = []
    tag = f"c-{uuid.uuid4().hex[:12]}"
    for t, paths in sorted(by_table.items()):
        paths.sort()
        rel = f"table={t}/{tag}.parquet"
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        if shape == "compactduck":
            import duckdb

            from tracetool.sqltext import literal, path_list

            con = duckdb.connect()
            con.execute(f"COPY (SELECT * FROM read_parquet({path_list([dst / p for p in paths])}"
                        f", hive_partitioning = false)) TO {literal(str(dst / rel))} "
                        "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)")
            out = literal(str(dst / rel))
            rows, lo, hi = con.execute(
                f"SELECT count(*), min(rank), max(rank) FROM read_parquet({out})").fetchone()
            con.close()
            facts = {"rows": rows, "size": (dst / rel).stat().st_size, "min_rank": lo,
                     "max_rank": hi}
            add = add_action(rel, facts, {"table": t})
            add.data_change = False
            actions.append(add)
            actions += [RemoveAction(p, False, int(time.time() * 1000), None, {"table": t})
                        for p in paths]
            continue
        first = pq.ParquetFile(dst / paths[0])
        names = first.schema_arrow.names
        rows, ranks = 0, []
        with pq.ParquetWriter(dst / rel, first.schema_arrow, compression="zstd",
                              use_dictionary=ingest_dictionary(names)) as w:
            groups = []
            for p in paths:
                f = pq.ParquetFile(dst / p)
                for i in range(f.num_row_groups):
                    g = f.read_row_group(i)
                    rows += g.num_rows
                    ranks += [g.column("rank")[0].as_py()]
                    if group_rows is None:
                        w.write_table(g, row_group_size=1 << 20)
                    else:
                        groups.append(g)
            if groups:
                w.write_table(pa.concat_tables(groups), row_group_size=group_rows)
        facts = {"rows": rows, "size": (dst / rel).stat().st_size, "min_rank": min(ranks),
                 "max_rank": max(ranks)}
        add = add_action(rel, facts, {"table": t})
        add.data_change = False
        actions.append(add)
        actions += [RemoveAction(p, False, int(time.time() * 1000), None, {"table": t})
                    for p in paths]
    dt.create_write_transaction(actions, mode="append", schema=dt.schema(),
                                partition_by=["table"],
                                commit_properties=CommitProperties(
                                    custom_metadata={"tracetool": "compact"}))
    cpu = time.process_time() - t0
    res[shape] = {"cpu_s": cpu, "tables": len(by_table), "row_group_rows": group_rows,
                  "files_before": sum(len(v) for v in by_table.values())}
    print(f"{shape} (delta job, {a.ranks} ranks, row groups "
          f"{'of one rank' if group_rows is None else f'of {group_rows:,} rows'}): "
          f"{res[shape]['files_before']} files -> {len(by_table)} in one commit, "
          f"{cpu:.1f} CPU-s", flush=True)


# --------------------------------------------------------------------------- step: queries


def query_child(fmt: str, root: str, view: str) -> dict[str, Any]:
    """In a fresh process: open the store (one format), run one query, time both."""
    t0, c0 = time.perf_counter(), time.process_time()
    if fmt == "today":
        import tracetool

        con = tracetool.connect(root)
    else:
        import duckdb

        from tracetool.analysis.connect import views_sql
        from tracetool.schema import TABLES
        from tracetool.sqltext import path_list
        from tracetool.store_views import lockdown_sql

        files = snapshot_files(root, "tables" if fmt == "tables" else "job")
        views = []
        for t in TABLES:
            fs = [Path(f) for f in files[t.name]]
            if fs:
                rel = f"read_parquet({path_list(fs)}, hive_partitioning = false)"
            else:
                cols = ", ".join(f"CAST(NULL AS {c.sql_type}) AS {c.name}" for c in t.columns)
                rel = f"(SELECT {cols}, NULL::VARCHAR AS job, NULL::INTEGER AS rank WHERE false)"
            views.append(f"CREATE OR REPLACE VIEW {t.name} WITH (DEFER_BINDING) AS "
                         f"SELECT * FROM {rel};")
        con = duckdb.connect()
        con.execute("\n".join([lockdown_sql(Path(f) for fs in files.values() for f in fs),
                               *views, views_sql()]))
    t1 = time.perf_counter()
    q = ("SELECT count(*) FROM trace_files" if view == "startup"
         else f"SELECT count(*) FROM (SELECT * FROM {view})")
    rows = con.execute(q).fetchone()[0]
    t2 = time.perf_counter()
    return {"open_s": t1 - t0, "query_s": t2 - t1, "total_s": t2 - t0,
            "cpu_s": time.process_time() - c0, "rows": rows}


def step_queries(a: argparse.Namespace, res: dict[str, Any]) -> None:
    roots = {"today": str(today_store(a)), "tables": str(delta_root(a, "tables")),
             "job": str(delta_root(a, "job")), "compact": str(delta_root(a, "compact")),
             "compactbig": str(delta_root(a, "compactbig")),
             "jobbig": str(delta_root(a, "jobbig")),
             "compactduck": str(delta_root(a, "compactduck"))}
    roots = {k: v for k, v in roots.items()
             if Path(v).is_dir() and k in a.formats.split(",")}
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rep in range(a.repeat):
        for view in ("startup", *VIEWS):
            order = list(roots) if rep % 2 == 0 else list(reversed(roots))
            for fmt in order:
                p = subprocess.run([sys.executable, __file__, "_query", fmt, roots[fmt], view],
                                   capture_output=True, text=True, timeout=600)
                if p.returncode != 0:
                    raise SystemExit(f"query {fmt} {view}: {p.stderr[-800:]}")
                out.setdefault(view, {}).setdefault(fmt, []).append(json.loads(p.stdout))
    res["queries"] = out
    print(f"queries at {a.ranks} ranks (fresh process each; open = the store and every view, "
          f"best of {a.repeat}; s):")
    fmts = list(roots)
    print("  " + f"{'view':22}" + "".join(f"{f + ' open+query (CPU)':>28}" for f in fmts)
          + f"{'job/today':>10}  rows")
    for view, by in out.items():
        best = {f: min(by[f], key=lambda r: r["total_s"]) for f in by}
        rows = {f: best[f]["rows"] for f in best}
        same = "same" if len(set(rows.values())) == 1 else f"DIFFER {rows}"
        cells = "".join(f"{best[f]['open_s']:9.2f} +{best[f]['query_s']:7.2f} "
                        f"({best[f]['cpu_s']:5.2f})  " for f in fmts)
        ratio = (f"{best['job']['total_s'] / best['today']['total_s']:8.2f}x"
                 if "job" in best and "today" in best else "")
        print(f"  {view:22}{cells}{ratio}  {rows['today']:,} {same}")


# --------------------------------------------------------------------------- S3 (moto)


def moto_child(port_file: str) -> None:
    """An S3 server (moto) that counts the requests it serves by kind; GET /__counts
    returns them and resets."""
    import logging

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)
    counts: Counter = Counter()

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == "/__counts":
            body = json.dumps(counts).encode()
            counts.clear()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        m, qs = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        if m == "GET" and ("list-type" in qs or "prefix=" in qs):
            kind = "LIST"
        elif m == "POST" and "delete" in qs:
            kind = "DeleteObjects"
        elif m == "PUT" and environ.get("HTTP_IF_NONE_MATCH"):
            kind = "PUT if-none-match"
        elif m == "PUT" and environ.get("HTTP_IF_MATCH"):
            kind = "PUT if-match"
        else:
            kind = m
        counts[kind] += 1
        return app(environ, start_response)

    srv = make_server("127.0.0.1", 0, counting, threaded=True)
    Path(port_file).write_text(str(srv.server_port))
    srv.serve_forever()


class Moto:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tf-moto-"))
        pf = self.dir / "port"
        self.proc = subprocess.Popen([sys.executable, __file__, "_moto", str(pf)])
        for _ in range(300):
            if pf.exists() and pf.read_text():
                break
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{pf.read_text()}"
        self.env = {**os.environ, "AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "t",
                    "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_SHARED_CREDENTIALS_FILE": str(self.dir / "none"),
                    "TRACETOOL_CACHE_DIR": str(self.dir / "cache")}
        os.environ.update({k: self.env[k] for k in (
            "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION", "AWS_SHARED_CREDENTIALS_FILE", "TRACETOOL_CACHE_DIR")})
        self.storage = {"AWS_ENDPOINT_URL": self.url, "AWS_ALLOW_HTTP": "true",
                        "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t",
                        "AWS_REGION": "us-east-1"}

    def bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3").create_bucket(Bucket=name)
        self.counts()
        return name

    def counts(self) -> dict[str, int]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/__counts") as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def per(c: dict[str, int], n: int) -> str:
    return (", ".join(f"{k} {v / n:g}" for k, v in sorted(c.items()))
            + f" (total {sum(c.values()) / n:g})")


def subset_dir(a: argparse.Namespace, n: int, first: int = 0) -> Path:
    """A directory of symlinks to ranks first..first+n-1 of the job's traces."""
    d, _ = job_traces(a.ranks, a.size, a.steps)
    sub = WORK / f"subset-{a.ranks}r-{first}-{n}"
    if not sub.is_dir():
        sub.mkdir(parents=True)
        for r in range(first, first + n):
            (sub / f"rank{r}.pt.trace.json").symlink_to(d / f"rank{r}.pt.trace.json")
    return sub


def step_s3(a: argparse.Namespace, res: dict[str, Any]) -> None:
    n = a.s3_ranks
    learn_schemas(today_store(a))
    m = Moto()
    try:
        out: dict[str, Any] = {"ranks": n, "batch": a.batch}
        # today's store: the CLI, one commit per rank
        b = m.bucket("today-store")
        r = run_cli(["ingest", str(subset_dir(a, n)), "--store", f"s3://{b}/st", "--job", JOB],
                    env=m.env)
        if r["rc"] != 0:
            raise SystemExit(f"s3 ingest failed: {r['stderr'][-500:]}")
        c = m.counts()
        out["today_ingest"] = {"requests": c, "cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
                               "commits": n}
        print(f"S3 (moto), {n} ranks: today's CLI ingest {r['wall_s']:.1f} s, {r['cpu_s']:.1f} "
              f"CPU-s; requests per commit (= per rank): {per(c, n)}")
        q = run_cli(["sql", f"s3://{b}/st", "SELECT count(*) FROM trace_files"], env=m.env)
        cold = m.counts()
        q = run_cli(["sql", f"s3://{b}/st", "SELECT count(*) FROM trace_files"], env=m.env)
        warm = m.counts()
        out["today_reader"] = {"cold": cold, "warm": warm, "rows": q["stdout"].strip()}
        print(f"  today's reader open: cold cache {per(cold, 1)}; warm {per(warm, 1)}")
        # Delta, both shapes: batches of a.batch ranks
        src = today_store(a)
        for shape in ("job", "tables"):
            b = m.bucket(f"delta-{shape}")
            uri = f"s3://{b}/st/job={JOB}"
            w = DeltaWriter(uri, shape, m.storage)
            w.create()
            created = m.counts()
            files_c: Counter = Counter()
            commit_c: Counter = Counter()
            cpu = 0.0
            nb = 0
            for b0 in range(0, n, a.batch):
                ranks = list(range(b0, min(n, b0 + a.batch)))
                data = {r: rank_tables(src, r) for r in ranks}
                batch = {t: [(r, data[r][t]) for r in ranks] for t in table_names()}
                tag = f"b{b0:07d}-{uuid.uuid4().hex[:12]}"
                t = time.process_time()
                written = w.write_files(batch, tag)
                files_c.update(m.counts())
                w.commit(written, tag)
                cpu += time.process_time() - t
                commit_c.update(m.counts())
                nb += 1
            snapshot_files(uri, shape, m.storage)
            reader = m.counts()
            out[f"delta_{shape}"] = {"create": created, "files": dict(files_c),
                                     "commit": dict(commit_c), "batches": nb,
                                     "reader_open": reader, "cpu_s": cpu}
            print(f"  delta {shape}: {nb} batches; per batch: data files {per(files_c, nb)}; "
                  f"commit {per(commit_c, nb)}; reader open (the snapshot's file list, "
                  f"{nb} commits in the log) {per(reader, 1)}; CPU {cpu:.1f} s")
        res["s3"] = out
    finally:
        m.stop()


# --------------------------------------------------------------------------- step: race


def race_child(uri: str, mode: str, who: str, n: int, go: str, storage_json: str) -> None:
    """One of two racing Delta writers (``job`` shape, tiny synthetic batches), each from a
    snapshot loaded before the start signal: ``append`` commits n batches of its own ranks;
    ``replace`` removes the file that holds rank 0 and adds a new one; ``new-same`` adds the
    same new rank (5) as the other writer, ``new-same-txn`` too with a Delta transaction
    identifier (``txn`` action, app id ``job/rank``) in its commit."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, RemoveAction, Transaction

    storage = json.loads(storage_json) or None
    dt = DeltaTable(uri, storage_options=storage)
    base = dt.version()
    Path(f"{go}.{who}.ready").touch()
    while not Path(go).exists():
        time.sleep(0.001)
    done, failed = 0, []
    for i in range(n):
        tag = f"{who}-{i}-{uuid.uuid4().hex[:8]}"
        rank = {"replace": 0, "new-same": 5, "new-same-txn": 5}.get(
            mode, (1000 if who == "B" else 0) + 1 + i)
        local = Path(tempfile.gettempdir()) / f"{tag}.parquet"
        pq.write_table(pa.table({"rank": pa.array([rank], pa.int32()),
                                 "job": [JOB], "writer": [who]}), local)
        w = DeltaWriter(uri, "job", storage)
        w.put(local, f"{uri}/table=trace_files/{tag}.parquet")
        facts = {"rows": 1, "size": 1000, "min_rank": rank, "max_rank": rank}
        acts: list[Any] = [add_action(f"table=trace_files/{tag}.parquet", facts,
                                      {"table": "trace_files"})]
        if mode == "replace":
            old = [p for p in add_actions(dt)["path"]
                   if p.endswith("seed.parquet")]
            acts += [RemoveAction(p, True, int(time.time() * 1000), None,
                                  {"table": "trace_files"}) for p in old]
        try:
            dt.create_write_transaction(acts, mode="append", schema=dt.schema(),
                                        partition_by=["table"],
                                        commit_properties=CommitProperties(
                                            custom_metadata={"writer": who},
                                            app_transactions=[Transaction(
                                                f"{JOB}/rank={rank}", 1)]
                                            if mode == "new-same-txn" else None))
            done += 1
        except CommitFailedError as err:
            failed.append(str(err).splitlines()[0][:160])
        except Exception as err:  # noqa: BLE001  (what the other format raised: reported)
            failed.append(f"{type(err).__name__}: {str(err).splitlines()[0][:160]}")
    print(json.dumps({"who": who, "base": base, "committed": done, "failed": failed}))


def step_race(a: argparse.Namespace, res: dict[str, Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    learn_schemas(today_store(a))
    out: dict[str, Any] = {}
    m = Moto()
    try:
        # today's store: two CLI ingests of different ranks of one job at once
        for where in ("local", "s3"):
            store = (str(WORK / "race-today") if where == "local"
                     else f"s3://{m.bucket('race-today')}/st")
            shutil.rmtree(WORK / "race-today", ignore_errors=True)
            procs = [subprocess.Popen(
                [*tracetool_cmd(), "ingest", str(subset_dir(a, 4, first)), "--store", store,
                 "--job", JOB, "--workers", "1"], env=m.env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True) for first in (0, 4)]
            outs = [p.communicate() for p in procs]
            q = subprocess.run([*tracetool_cmd(), "sql", store,
                                "SELECT count(DISTINCT rank) FROM trace_files", "--json"],
                               env=m.env, capture_output=True, text=True)
            out[f"today_{where}_different_ranks"] = {
                "exit": [p.returncode for p in procs],
                "ingested": [o.count("ingested") for o, _ in outs],
                "ranks_visible": q.stdout.strip(), "errors": [e.strip()[-200:] for _, e in outs]}
        # Delta (job shape): appends of different ranks; replaces of the same rank
        for where in ("local", "s3"):
            for mode, n in (("append", a.race_commits), ("replace", 1), ("new-same", 1),
                            ("new-same-txn", 1)):
                if where == "local":
                    uri = str(WORK / f"race-delta-{mode}")
                    shutil.rmtree(uri, ignore_errors=True)
                    storage: dict[str, str] | None = None
                else:
                    uri = f"s3://{m.bucket(f'race-delta-{mode}')}/st"
                    storage = m.storage
                w = DeltaWriter(uri, "job", storage)
                w.create()
                local = WORK / "writer-tmp" / "seed.parquet"
                pq.write_table(pa.table({"rank": pa.array([0], pa.int32()), "job": [JOB],
                                         "writer": ["seed"]}), local)
                w.put(local, f"{uri}/table=trace_files/seed.parquet")
                w.commit({"trace_files": ("table=trace_files/seed.parquet",
                                          {"rows": 1, "size": 1000, "min_rank": 0,
                                           "max_rank": 0})}, "seed")
                go = WORK / f"race-go-{uuid.uuid4().hex[:8]}"
                procs = [subprocess.Popen(
                    [sys.executable, __file__, "_race", uri, mode, who, str(n), str(go),
                     json.dumps(storage or {})], stdout=subprocess.PIPE, text=True, env=m.env)
                    for who in ("A", "B")]
                while not all(Path(f"{go}.{who}.ready").exists() for who in "AB"):
                    time.sleep(0.01)  # both have loaded the snapshot
                go.touch()
                got = [json.loads(p.communicate()[0]) for p in procs]
                for f in (go, Path(f"{go}.A.ready"), Path(f"{go}.B.ready")):
                    f.unlink()
                files = snapshot_files(uri, "job", storage)["trace_files"]
                from deltalake import DeltaTable

                out[f"delta_{where}_{mode}"] = {
                    "writers": got, "final_version": DeltaTable(uri, storage_options=storage
                                                                ).version(),
                    "files": len(files)}
        res["race"] = out
        print("racing writers (two processes, one job):")
        for k, v in out.items():
            print(f"  {k}: {json.dumps(v)}")
    finally:
        m.stop()


# --------------------------------------------------------------------------- step: kill


def kill_child(uri: str, shape: str, src: str, ranks: int, batch: int) -> None:
    """A Delta writer that writes one batch's files then commits them, printing 'commit'
    just before; the parent kills it with SIGKILL at a random moment of the commit."""
    learn_schemas(Path(src))
    w = DeltaWriter(uri, shape)
    rs = list(range(ranks - batch, ranks))
    data = {r: rank_tables(Path(src), r) for r in rs}
    tag = f"k-{uuid.uuid4().hex[:12]}"
    written = w.write_files({t: [(r, data[r][t]) for r in rs] for t in table_names()}, tag)
    w.table(uri if shape == "job" else f"{uri}/{table_names()[0]}")  # loaded before the signal
    print("commit", flush=True)
    w.commit(written, tag)
    print("done", flush=True)


def consistent(uri: str, shape: str) -> dict[str, Any]:
    """What a reader of the latest snapshot sees: files it lists that are missing, and
    the set of ranks per table (equal across EVERY_RANK tables = atomic)."""
    import duckdb

    files = snapshot_files(uri, shape)
    missing = [f for fs in files.values() for f in fs if not Path(f).exists()]
    ranks = {}
    con = duckdb.connect()
    for t in EVERY_RANK:
        fs = [f for f in files[t] if Path(f).exists()]
        ranks[t] = (con.execute(f"SELECT count(DISTINCT rank) FROM read_parquet({fs!r})")
                    .fetchone()[0] if fs else 0)
    return {"missing": len(missing), "ranks": ranks,
            "atomic": len(set(ranks.values())) == 1}


def step_kill(a: argparse.Namespace, res: dict[str, Any]) -> None:
    src = today_store(a)
    learn_schemas(src)
    n0 = a.batch  # one committed batch, then the killed writer's (ranks n0..2*n0-1)
    rng = random.Random(29)
    out: dict[str, Any] = {}
    for shape in ("job", "tables"):
        trials = []
        base = WORK / f"kill-{shape}-base"  # one committed batch (ranks 0..n0-1)
        shutil.rmtree(base, ignore_errors=True)
        w = DeltaWriter(str(base), shape)
        w.create()
        rs = list(range(n0))
        data = {r: rank_tables(src, r) for r in rs}
        w.commit(w.write_files({t: [(r, data[r][t]) for r in rs] for t in table_names()},
                               "b0"), "b0")
        for _ in range(a.kill_trials):
            uri = str(WORK / f"kill-{shape}")
            shutil.rmtree(uri, ignore_errors=True)
            shutil.copytree(base, uri)
            p = subprocess.Popen([sys.executable, __file__, "_kill", uri, shape, str(src),
                                  str(n0 + a.batch), str(a.batch)],
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "commit"
            delay = rng.uniform(0, 0.06 if shape == "tables" else 0.015)
            time.sleep(delay)
            p.send_signal(signal.SIGKILL)
            rest = p.communicate()[0]
            seen = consistent(uri, shape)
            seen.update(delay_ms=round(delay * 1000, 1), finished="done" in rest)
            trials.append(seen)
        out[shape] = trials
        seen = Counter(",".join(str(v) for v in t["ranks"].values()) for t in trials)
        partial = sum(1 for t in trials if not t["atomic"])
        missing = sum(t["missing"] for t in trials)
        print(f"killed delta {shape} writer, {len(trials)} trials (SIGKILL 0-"
              f"{60 if shape == 'tables' else 15} ms into its commit; {n0} ranks committed "
              f"before, {n0} in the killed commit): {partial} left a snapshot whose tables "
              f"hold different ranks; {missing} listed files missing; ranks per table "
              f"({', '.join(EVERY_RANK)}) -> trials: "
              + "; ".join(f"{k} -> {v}" for k, v in sorted(seen.items())))
    res["kill"] = out


# --------------------------------------------------------------------------- step: snapshot


def step_snapshot(a: argparse.Namespace, res: dict[str, Any]) -> None:
    import duckdb
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties, RemoveAction

    src = today_store(a)
    learn_schemas(src)
    uri = str(WORK / "snap-job")
    shutil.rmtree(uri, ignore_errors=True)
    w = DeltaWriter(uri, "job")
    w.create()
    rs = list(range(a.batch))
    data = {r: rank_tables(src, r) for r in rs}
    w.commit(w.write_files({t: [(r, data[r][t]) for r in rs] for t in table_names()}, "b0"),
             "b0")
    # a reader pins the snapshot: its file list, as the store's views would
    v0 = DeltaTable(uri).version()
    files = snapshot_files(uri, "job")["events"]
    con = duckdb.connect()
    q = f"SELECT count(*) FROM read_parquet({files!r})"
    before = con.execute(q).fetchone()[0]
    # a writer replaces rank 0 (copy-on-write of the batch file without it) and commits
    dt = DeltaTable(uri)
    old = [p for p in add_actions(dt)["path"]
           if p.startswith("table=events/")]
    t = time.process_time()
    keep = [(r, data[r]["events"]) for r in rs if r != 0]
    local = w.tmp / "events-r.parquet"
    facts = write_batch_file(local, keep)
    assert facts is not None
    w.put(local, f"{uri}/table=events/b0-r.parquet")
    dt.create_write_transaction(
        [add_action("table=events/b0-r.parquet", facts, {"table": "events"})]
        + [RemoveAction(p, True, int(time.time() * 1000), None, {"table": "events"})
           for p in old], mode="append", schema=dt.schema(), partition_by=["table"],
        commit_properties=CommitProperties(custom_metadata={"tracetool": "replace rank 0"}))
    rewrite_cpu = time.process_time() - t
    pinned = con.execute(q).fetchone()[0]
    latest = duckdb.connect().execute(
        f"SELECT count(*) FROM read_parquet({snapshot_files(uri, 'job')['events']!r})"
    ).fetchone()[0]
    old_rows = pq.ParquetFile(Path(uri) / old[0]).metadata.num_rows
    vac = DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False,
                                 dry_run=False)
    try:
        after_vacuum: Any = con.execute(q).fetchone()[0]
    except duckdb.Error as err:
        after_vacuum = f"error: {str(err).splitlines()[0][:120]}"
    res["snapshot"] = {"version_pinned": v0, "events_pinned_before": before,
                       "events_pinned_after_replace": pinned, "events_latest": latest,
                       "rank0_rows": data[0]["events"].num_rows, "old_file_rows": old_rows,
                       "replace_rewrite_cpu_s": rewrite_cpu, "vacuumed": len(vac),
                       "pinned_after_vacuum": after_vacuum}
    s = res["snapshot"]
    print(f"snapshot: a reader pinned at version {v0} counts {before:,} events; after a "
          f"writer replaced rank 0 (the batch's events file rewritten without it: "
          f"{rewrite_cpu:.2f} CPU-s for {a.batch - 1} other ranks' rows) the pinned reader "
          f"still counts {pinned:,}, a new one {latest:,} (rank 0 had {s['rank0_rows']:,}); "
          f"vacuum (retention 0) removed {len(vac)} file(s), then the pinned reader: "
          f"{after_vacuum}")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_query":
        print(json.dumps(query_child(*argv[1:4])))
        return 0
    if argv and argv[0] == "_moto":
        moto_child(argv[1])
        return 0
    if argv and argv[0] == "_race":
        race_child(argv[1], argv[2], argv[3], int(argv[4]), argv[5], argv[6])
        return 0
    if argv and argv[0] == "_kill":
        kill_child(argv[1], argv[2], argv[3], int(argv[4]), int(argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--size", default="2MB", help="uncompressed size per rank")
    ap.add_argument("--steps", dest="steps", type=int, default=3, help="ProfilerSteps per rank")
    ap.add_argument("--batch", type=int, default=16, help="ranks per Delta data file/commit")
    ap.add_argument("--only", default=",".join(STEPS), help=f"subset of: {', '.join(STEPS)}")
    ap.add_argument("--s3-ranks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each query per format")
    ap.add_argument("--formats",
                    default="today,tables,job,jobbig,compact,compactbig,compactduck",
                    help="the queries step's formats")
    ap.add_argument("--race-commits", type=int, default=10)
    ap.add_argument("--kill-trials", type=int, default=6)
    ap.add_argument("--json", type=Path, help="also write the results here (merged)")
    a = ap.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {}
    if a.json and a.json.exists():
        res = json.loads(a.json.read_text())
    import deltalake

    res["versions"] = {"deltalake": deltalake.__version__}
    funcs = {"ingest": step_ingest, "pack": step_pack, "layout": step_layout,
             "jobbig": step_jobbig, "compact": step_compact, "queries": step_queries,
             "s3": step_s3, "race": step_race, "kill": step_kill, "snapshot": step_snapshot}
    for step in a.only.split(","):
        t = time.perf_counter()
        funcs[step](a, res)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"[{step}: {time.perf_counter() - t:.0f} s; {time.strftime('%H:%M:%S')} UTC, "
              f"load average {load}]", file=sys.stderr, flush=True)
        res.setdefault("when", {})[step] = {"end": time.strftime("%Y-%m-%d %H:%M:%S"),
                                            "loadavg": os.getloadavg()}
        if a.json:
            a.json.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
