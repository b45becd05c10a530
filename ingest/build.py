"""Build one trace file's partition (every table) in a work directory.

Runs in the main process for large files (decoding their pieces on the worker pool) or as a
whole in a worker process for small ones. It reads, decodes, joins pieces, resolves the rank,
runs the derivation stage and checks conservation; committing into the store is the caller's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa

from tracetool import __version__
from tracetool.schema import MAX_RANK, TRACE_FILES
from tracetool.signals import raise_if_interrupted
from tracetool.text import path_text

from . import derive as derive_mod
from .budget import BudgetExceeded, TmpBudget, default_budget
from .decode import Issue, PieceResult, issues_table
from .metadata import (
    base_time_ns,
    distributed_rank,
    parse_members,
    rank_from_file_name,
)
from .options import ET_NAME, FileResult, Options
from .source import Piece, SourceInfo, TraceFileError, is_gzip, pieces, sha256_of
from .store import StoredFile
from .workers import Workers, decode_all, in_worker


class FileFailed(Exception):
    """The file cannot be ingested; the message is one line naming the problem."""


@dataclass
class _Decoded:
    """A file decoded and staged, waiting for the derivation stage."""

    res: FileResult
    member: derive_mod.Member
    budget: TmpBudget
    info: SourceInfo
    issues: list[Issue]
    issue_eids: list[int | None]
    quarantined: int
    keys: dict
    rank_source: str
    stats: list[PieceResult]
    hashing: Future | None
    t0: float


def build_file(
    path: Path,
    opts: Options,
    workdir: Path,
    stored: list[StoredFile],
    workers: Workers | None = None,
    progress: Callable[[int], None] | None = None,
) -> FileResult:
    """Build ``path``'s partition under ``workdir/0/built``; status 'built', 'skipped' or
    'error'. ``stored`` (what the store holds) makes re-ingesting identical bytes a no-op."""
    return build_files([path], opts, workdir, stored, workers, progress)[0]


def build_files(
    paths: list[Path],
    opts: Options,
    workdir: Path,
    stored: list[StoredFile],
    workers: Workers | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[FileResult]:
    """Build the partitions of ``paths`` (file i under ``workdir/i/built``), one result per
    file, deriving them together in one batch (``derive.py``): a small file's derivation
    is mostly DuckDB planning its statements, which a batch pays once. A file that fails
    fails alone: when the batch's derivation fails, each file is derived again by itself."""
    own = workers is None
    workers = workers or Workers(1)
    try:
        out = [_decode(p, opts, workers, workdir / str(i), i, stored, progress)
               for i, p in enumerate(paths)]
        decoded = [d for d in out if isinstance(d, _Decoded)]
        if decoded:
            _derive_all(decoded, opts, workers, workdir)
    finally:
        if own:
            workers.close()
    results = []
    for d in out:
        if isinstance(d, _Decoded):
            d.res.seconds = time.perf_counter() - d.t0
            d = d.res
        results.append(d)
    return results


def _failure(err: BaseException) -> str:
    """The one-line message of a file's failure while building it; re-raises what is not
    one (an interrupt DuckDB reported as an error, a bug)."""
    if isinstance(err, (TraceFileError, FileFailed, BudgetExceeded)):
        return str(err)
    if isinstance(err, RuntimeError):  # DuckDB reports a signal during a query like this
        raise_if_interrupted()
        raise err
    if isinstance(err, duckdb.Error):  # e.g. out of memory or disk in the derivation stage
        raise_if_interrupted()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"derivation stage failed: {first}"
    if isinstance(err, OSError):  # writing the work files (reading the trace: TraceFileError)
        why = os.strerror(err.errno) if err.errno else str(err).strip().splitlines()[0]
        return f"writing the store failed: {why}"
    raise err


_FAILURES = (TraceFileError, FileFailed, BudgetExceeded, RuntimeError, duckdb.Error, OSError)


def _decode(path: Path, opts: Options, workers: Workers, work: Path, index: int,
            stored: list[StoredFile], progress: Callable[[int], None] | None
            ) -> _Decoded | FileResult:
    """Read, decode and stage one file, and resolve its rank; a FileResult when it is done
    already (skipped, or failed)."""
    t0 = time.perf_counter()
    res = FileResult(str(path), "error", job=opts.job, store=str(opts.store))
    if ET_NAME.search(path.name):
        res.status = "skipped"
        res.message = "PyTorch execution trace (_et.json), not a Kineto trace; skipped"
        return res
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        res.message = "no such file"
        return res
    except OSError as err:
        res.message = f"cannot read: {err.strerror or err}"
        return res
    if path.is_dir():
        res.message = "is a directory"
        return res
    # identical bytes already stored in this job: a no-op (hash only when a same-size file
    # is there)
    mine = [s for s in stored if s.job == opts.job]
    if not opts.force and any(s.bytes == size for s in mine):
        try:
            digest = sha256_of(path)
        except TraceFileError as err:
            res.message = str(err)
            return res
        same = [s for s in mine if s.sha256 == digest]
        if same:
            res.status, res.job, res.rank = "skipped", same[0].job, same[0].rank
            res.message = (f"already ingested as job {same[0].job} rank {same[0].rank} "
                           "(same sha256); use --force to re-ingest")
            return res
    work.mkdir(parents=True, exist_ok=True)
    budget = TmpBudget(work, opts.tmp_budget or default_budget(size, is_gzip(path)),
                       explicit=opts.tmp_budget is not None)
    try:
        return _decode_staged(path, opts, workers, work, index, res, progress, budget, t0)
    except _FAILURES as err:
        res.status, res.message = "error", _failure(err)
    res.seconds = time.perf_counter() - t0
    return res


def _decode_staged(
    path: Path, opts: Options, workers: Workers, work: Path, index: int, res: FileResult,
    progress: Callable[[int], None] | None, budget: TmpBudget, t0: float,
) -> _Decoded:
    stage = work / "stage"
    built = work / "built"
    stage.mkdir()
    built.mkdir()
    info = SourceInfo(path=path)

    def reported(it: Iterator[Piece]) -> Iterator[Piece]:
        for p in it:
            budget.check()
            if progress:
                progress(info.bytes_on_disk)
            yield p

    cut = pieces(info, opts.piece_bytes, opts.max_event_bytes)
    results = decode_all(workers, reported(cut), stage)
    res.timings["read_decode_s"] = round(time.perf_counter() - t0, 3)
    # A plain file is hashed now, in a thread beside the derivation stage, which leaves a
    # core partly idle; hashing while the workers decoded took CPU from them.
    hashing = None
    if not info.sha256:
        thread = ThreadPoolExecutor(1)
        hashing = thread.submit(sha256_of, path)
        thread.shutdown(wait=False)
    if progress:
        progress(info.bytes_on_disk)

    offsets: dict[int, int] = {}
    issues: list[Issue] = []
    issue_eids: list[int | None] = []
    total = 0
    quarantined = 0
    trailer: bytes | None = None
    closed = False
    truncated_tail = b""
    for part, pr, is_last in results:
        offsets[part] = total
        _collect(pr, total, issues, issue_eids)
        total += pr.n_read
        quarantined += pr.n_quarantined
        if is_last:
            trailer, closed = pr.trailer, pr.array_closed
            truncated_tail = pr.tail_fragment
    salvaged = not closed or info.gzip_truncated
    if truncated_tail:
        issues.append(Issue(None, None, "truncated",
                            "file ends inside this event (writer crashed?); event not stored",
                            True, truncated_tail[:200].decode("utf-8", "replace")))
        issue_eids.append(total)
        total += 1
        quarantined += 1
    res.json_bytes = info.json_bytes
    res.salvaged = salvaged
    if total == 0:
        raise FileFailed("no events: traceEvents is empty")
    if salvaged:
        why = "gzip stream ends early" if info.gzip_truncated else "no closing ] for traceEvents"
        msg = f"truncated ({why}): kept the {total - quarantined} complete events before the cut"
        if opts.strict:
            raise FileFailed(msg + "; --strict makes this an error")
        res.warnings.append(msg)

    # top-level keys from before and after the event array
    head = parse_members(info.preamble, "top-level keys before traceEvents")
    tail = parse_members(trailer or b"", "top-level keys after traceEvents", closes_object=True)
    keys = {**head.keys, **tail.keys}
    for prob in head.problems + tail.problems:
        issues.append(Issue(None, None, "bad_top_level", prob, False))
        issue_eids.append(None)

    # rank: distributedInfo, then --rank, then the file name; --rank wins when given
    rank, source = None, None
    if opts.rank is not None:
        rank, source = opts.rank, "option"
    elif (r := distributed_rank(keys)) is not None:
        rank, source = r, "distributedInfo"
    elif (r := rank_from_file_name(path)) is not None:
        rank, source = r, "file_name"
    elif opts.single_file:  # what every peer tool does with one trace
        rank, source = 0, "single_file"
        res.warnings.append("no rank in the trace (distributedInfo) or its file name: "
                            "stored as rank 0 (a single file); --rank N chooses another")
    if rank is None:
        raise FileFailed("no rank: the trace has no distributedInfo.rank and the file name "
                         "has no rank/worker number; pass --rank N (one file at a time), or "
                         "--job-per-file to ingest each file as a job of its own")
    if rank > MAX_RANK:  # the store's rank (a hive partition) is a 32-bit integer
        raise FileFailed(f"rank {rank} (from {source}) is outside 0..{MAX_RANK}")
    res.rank = rank

    base = base_time_ns(keys)
    _check_base(base, max((pr.max_abs_ts_us for _, pr, _ in results), default=0.0))
    di = keys.get("distributedInfo") if isinstance(keys.get("distributedInfo"), dict) else None
    member = derive_mod.Member(index, stage, built, offsets, total, base, _pg_ranks(di),
                               comm=opts.comm_registry())
    return _Decoded(res, member, budget, info, issues, issue_eids, quarantined, keys, source,
                    [pr for _, pr, _ in results], hashing, t0)


def _derive_all(decoded: list[_Decoded], opts: Options, workers: Workers, work: Path) -> None:
    """The derivation stage of the decoded files, in one batch; when it fails and the batch
    holds several files, each is derived again alone, so the error is its file's. The work
    directory holds every file's staged pieces, so its disk budget is the sum of theirs."""
    budget = TmpBudget(work, sum(d.budget.limit for d in decoded),
                       explicit=opts.tmp_budget is not None)
    try:
        _derive_batch(decoded, opts, workers, work, budget)
        return
    except _FAILURES as err:
        message = _failure(err)
        if len(decoded) == 1:
            decoded[0].res.status, decoded[0].res.message = "error", message
            return
    for d in decoded:
        for sub in (d.member.out, work / "derived"):
            shutil.rmtree(sub, ignore_errors=True)
        d.member.out.mkdir()
        try:
            _derive_batch([d], opts, workers, work, budget)
        except _FAILURES as err:
            d.res.status, d.res.message = "error", _failure(err)


def _derive_batch(decoded: list[_Decoded], opts: Options, workers: Workers, work: Path,
                  budget: TmpBudget) -> None:
    t0 = time.perf_counter()
    budget.check(force=True)
    key = (workers.workers, opts.memory_limit)
    con = _derive_connection(work, key)
    kept = False
    try:
        con.execute(f"SET max_temp_directory_size = '{budget.remaining()}B'")
        derived = derive_mod.derive(con, [d.member for d in decoded], work / "derived",
                                    workers.run)
        kept = _keep_connection(con, key)
    finally:
        if not kept:
            con.close()
    share = (time.perf_counter() - t0) / len(decoded)
    for d, r in zip(decoded, derived, strict=True):
        d.res.timings["derive_s"] = round(share, 3)  # the batch's time, evenly shared
        d.res.timings["graph_s"] = round(r.graph_s, 3)  # part of derive_s
        if len(decoded) > 1:
            d.res.timings["batch_files"] = len(decoded)
        try:
            _complete(d, r)
        except _FAILURES as err:
            d.res.status, d.res.message = "error", _failure(err)


def _complete(d: _Decoded, derived: derive_mod.Derived) -> None:
    """Check a derived file's conservation and write its ingest_issues and trace_files."""
    res, info, keys, built = d.res, d.info, d.keys, d.member.out
    issues, issue_eids, quarantined, total = d.issues, d.issue_eids, d.quarantined, d.member.total
    for eid, off, issue, detail, q, snip in derived.issues:
        issues.append(Issue(None, off, issue, detail, q, snip))
        issue_eids.append(eid)  # absolute eid already
        if q:
            quarantined += 1
    stored_n = derived.events_stored
    if stored_n + quarantined != total:
        raise FileFailed(f"internal error: conservation failed (read {total}, stored "
                         f"{stored_n}, quarantined {quarantined}); please report")
    it = issues_table(issues)
    it = it.drop_columns(["ord"]).add_column(0, "eid", pa.array(issue_eids, pa.int64()))
    derive_mod.write_arrow(it, built, "ingest_issues")

    stats, base = d.stats, d.member.base_ns
    res.events_read, res.events_stored, res.events_quarantined = total, stored_n, quarantined
    if d.hashing is not None:
        info.sha256 = d.hashing.result()
    di = keys.get("distributedInfo") if isinstance(keys.get("distributedInfo"), dict) else None
    row = {
        # as text: a name that is not UTF-8 has its bytes as \xNN (tracetool.text.path_text)
        "path": path_text(Path(res.path).resolve()), "file_name": path_text(Path(res.path).name),
        "sha256": info.sha256,
        "bytes": info.bytes_on_disk, "json_bytes": info.json_bytes,
        "compression": info.compression, "container": info.container,
        "ts_convention": _ts_convention(stats, base),
        "base_time_ns": base,
        "schema_version": None if keys.get("schemaVersion") is None
        else str(keys.get("schemaVersion")),
        "device_names": [str(dp.get("name", "")) for dp in keys.get("deviceProperties", [])
                         if isinstance(dp, dict)]
        if isinstance(keys.get("deviceProperties"), list) else [],
        "device_properties": json.dumps(keys.get("deviceProperties"))
        if "deviceProperties" in keys else None,
        "distributed_info": json.dumps(di) if di is not None else None,
        "world_size": _small_int(di.get("world_size")) if di else None,
        "backend": str(di.get("backend")) if di and di.get("backend") is not None else None,
        "rank_source": d.rank_source,
        "metadata": json.dumps({k: v for k, v in keys.items()
                                if k not in ("deviceProperties", "distributedInfo")}),
        "events_read": total, "events_stored": stored_n, "events_quarantined": quarantined,
        "salvaged": res.salvaged, "ingested_at": datetime.now(UTC),
        "tracetool_version": __version__,
    }
    tf = pa.table({c.name: pa.array([row[c.name]], type=c.type) for c in TRACE_FILES.columns})
    derive_mod.write_arrow(tf, built, "trace_files")
    res.sha256 = info.sha256
    res.built = str(built)
    res.status = "built"
    res.message = f"{total} events read, {stored_n} stored, {quarantined} quarantined"


# A pool worker's DuckDB connection, kept between the files it builds: opening one and
# setting it up is ~30 ms, a tenth of a small (2 MB) file's whole build.
_KEPT: dict[tuple[int, str], duckdb.DuckDBPyConnection] = {}


def _derive_connection(work: Path, key: tuple[int, str]) -> duckdb.DuckDBPyConnection:
    """The derivation stage's connection: the worker's kept one when it can spill into this
    file's work directory, else a new one."""
    con = _KEPT.pop(key, None)
    if con is not None:
        if derive_mod.reuse(con, work):
            return con
        con.close()
    return derive_mod.connect(work, key[0], key[1])


def _keep_connection(con: duckdb.DuckDBPyConnection, key: tuple[int, str]) -> bool:
    """Keep a connection for the worker's next file (only in pool workers: the main process
    forks workers, and must hold no DuckDB connection when it does); False: close it."""
    if not in_worker() or _KEPT:
        return False
    try:
        derive_mod.reset(con)
    except duckdb.Error:
        return False
    _KEPT[key] = con
    return True


INT64_MAX = 2**63 - 1


def _check_base(base: int, max_abs_ts_us: float) -> None:
    """Every time is ts + baseTimeNanoseconds: a base that puts the file's times outside
    int64 ns breaks the whole file's clock, so the file is refused (FileFailed) instead of
    failing deep in the derivation stage."""
    if abs(base) + max_abs_ts_us * 1000 > INT64_MAX:
        raise FileFailed(f"baseTimeNanoseconds {base} plus ts up to {max_abs_ts_us:.0f} us "
                         "is outside the int64 ns range")


def _collect(pr: PieceResult, base: int, issues: list[Issue], offs: list[int | None]) -> None:
    for iss in pr.issues:
        issues.append(iss)
        offs.append(None if iss.ordinal is None else base + iss.ordinal)


def _small_int(v: object) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31:
        return v
    return None


def _pg_ranks(di: dict | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    if not di:
        return out
    for pg in di.get("pg_config") or []:
        if not isinstance(pg, dict):
            continue
        ranks = pg.get("ranks")
        if isinstance(ranks, str):
            ranks = [int(x) for x in re.findall(r"-?\d+", ranks)]
        if isinstance(ranks, list) and pg.get("pg_name") is not None:
            out[str(pg["pg_name"])] = [int(x) for x in ranks if isinstance(x, int)]
    return out


def _ts_convention(stats: list[PieceResult], base: int) -> str:
    if not stats or max((s.max_abs_ts_us for s in stats), default=0.0) == 0.0:
        return "none"
    if base:
        return "rel_base"
    frac = any(s.has_fraction for s in stats)
    epoch = max(s.max_abs_ts_us for s in stats) >= 1e14
    if epoch:
        return "abs_us_frac" if frac else "abs_us_int"
    return "rel_unknown_base"
