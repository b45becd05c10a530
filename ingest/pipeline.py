"""Ingest trace files into the store: read, decode in parallel, derive, commit.

One file at a time flows through: the main process streams the (decompressed) text and cuts
the event array into pieces; a process pool decodes pieces into Parquet parts; the main
process stitches any event split across two pieces, resolves the rank, runs the DuckDB
derivation stage into a temporary partition and renames it into the store. Every event read
is either stored or quarantined with a reason, and the counts are checked before commit.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracetool import __version__
from tracetool.schema import TRACE_FILES

from . import derive as derive_mod
from .decode import Issue, PieceResult, decode_piece, issues_table
from .metadata import base_time_ns, distributed_rank, parse_members, rank_from_file_name
from .source import Piece, SourceInfo, TraceFileError, pieces
from .store import JOB_NAME, Store

TRACE_SUFFIXES = (".json", ".json.gz")
ET_NAME = re.compile(r"_et\.json(\.gz)?$")


@dataclass
class Options:
    store: Path
    job: str | None = None
    rank: int | None = None
    force: bool = False
    strict: bool = False
    workers: int = 0
    piece_bytes: int = 32 << 20
    memory_limit: str = "512MB"


@dataclass
class FileResult:
    path: str
    status: str  # ingested | skipped | error
    message: str = ""
    job: str | None = None
    rank: int | None = None
    events_read: int = 0
    events_stored: int = 0
    events_quarantined: int = 0
    salvaged: bool = False
    json_bytes: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    store: str = ""

    def as_json(self) -> dict:
        return {
            "path": self.path, "status": self.status, "message": self.message,
            "job": self.job, "rank": self.rank, "store": self.store,
            "events_read": self.events_read, "events_stored": self.events_stored,
            "events_quarantined": self.events_quarantined, "salvaged": self.salvaged,
            "json_bytes": self.json_bytes, "seconds": round(self.seconds, 3),
            "warnings": self.warnings,
        }


# --------------------------------------------------------------------------- inputs


def expand_inputs(paths: Iterable[Path]) -> tuple[list[Path], list[FileResult]]:
    """Files named directly, plus every trace file inside named directories (sorted)."""
    files: list[Path] = []
    errors: list[FileResult] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and
                           f.name.endswith(TRACE_SUFFIXES))
            if not found:
                errors.append(FileResult(str(p), "error", "directory holds no .json or "
                                         ".json.gz trace files"))
            files += found
        else:
            files.append(p)
    return files, errors


def default_job(paths: list[Path], files: list[Path]) -> str:
    """--job default: the directory named on the command line, else the files' folder."""
    dirs = [p for p in paths if p.is_dir()]
    base = dirs[0] if dirs else (files[0].resolve().parent if files else Path.cwd())
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", base.resolve().name) or "job"
    return name if JOB_NAME.match(name) else "job_" + name


# --------------------------------------------------------------------------- workers


def _decode_to_parts(piece: Piece, stage: str, part: int) -> PieceResult:
    """Worker entry point: decode one piece and write its tables as Parquet parts."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        res = decode_piece(piece.load(), piece.offset, piece.is_first, piece.is_last,
                           piece.join_edges)
    finally:
        if gc_was:
            gc.enable()
    for name, table in res.tables.items():
        if res.cut_inside_event:
            break
        d = Path(stage) / name
        d.mkdir(parents=True, exist_ok=True)
        table = table.append_column("piece", pa.array([part] * table.num_rows, pa.int32()))
        pq.write_table(table, d / f"{part:08d}.parquet", compression="lz4")
    res.tables = {}
    return res


class Decoder:
    """Runs piece decoding inline or on a process pool (created on first need)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def pool(self) -> ProcessPoolExecutor:
        """Forked workers (cheap to start, no re-import of __main__), all started at once
        by the first submit; ``ingest`` starts them before any DuckDB thread exists."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("fork"))
            self._pool.submit(int).result()
        return self._pool

    def map(self, items: Iterator[Piece], stage: Path) -> Iterator[tuple[Piece, PieceResult]]:
        """Decode pieces in order, at most 2 x workers in flight (bounded memory)."""
        first = next(items, None)
        if first is None:
            return
        if self.workers <= 1 or first.is_last:
            yield first, _decode_to_parts(first, str(stage), first.seq)
            for p in items:
                yield p, _decode_to_parts(p, str(stage), p.seq)
            return
        pool = self.pool()
        window: deque[tuple[Piece, Future]] = deque()

        def submit(p: Piece) -> None:
            window.append((p, pool.submit(_decode_to_parts, p, str(stage), p.seq)))

        submit(first)
        for p in items:
            # release the piece text once submitted; keep only its position
            submit(p)
            while len(window) >= 2 * self.workers:
                q, fut = window.popleft()
                yield q, fut.result()
        while window:
            q, fut = window.popleft()
            yield q, fut.result()

    def run(self, fn: Callable, items: Iterable) -> list:
        """fn over items, on the pool when there is one and more than one item."""
        items = list(items)
        if self.workers <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        return list(self.pool().map(fn, items))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _remove_parts(stage: Path, part: int) -> None:
    for f in stage.glob(f"*/{part:08d}.parquet"):
        f.unlink()


def _decode_all(decoder: Decoder, items: Iterator[Piece], stage: Path
                ) -> list[tuple[int, PieceResult, bool]]:
    """Decode every piece; a piece whose cut fell inside an event is joined with the next
    one and decoded again (rare: only events larger than a piece, or a cut at a "}, {"
    inside nested args). Returns (part number, result, is last) in file order."""
    out: list[tuple[int, PieceResult, bool]] = []
    carry: Piece | None = None
    for piece, pr in decoder.map(items, stage):
        if carry is not None:
            _remove_parts(stage, piece.seq)
            piece = Piece(carry.seq, carry.load() + piece.gap + piece.load(), carry.offset,
                          carry.is_first, piece.is_last, gap=carry.gap)
            pr = _decode_to_parts(piece, str(stage), piece.seq)
            carry = None
        if pr.cut_inside_event:
            if not piece.is_last:
                carry = Piece(piece.seq, piece.load(), piece.offset, piece.is_first, False,
                              gap=piece.gap)
                continue
            # nothing to join with: decode it alone, its broken edges quarantined
            piece = Piece(piece.seq, piece.load(), piece.offset, piece.is_first,
                          piece.is_last, join_edges=False)
            pr = _decode_to_parts(piece, str(stage), piece.seq)
        out.append((piece.seq, pr, piece.is_last))
    return out


# --------------------------------------------------------------------------- one file


class FileFailed(Exception):
    pass


class UsageProblem(ValueError):
    """Options that cannot work together (reported as a usage error by the CLI)."""


def ingest_file(
    path: Path,
    opts: Options,
    store: Store,
    decoder: Decoder,
    job: str,
    rank_option: int | None,
    progress: Callable[[int], None] | None = None,
) -> FileResult:
    t0 = time.perf_counter()
    res = FileResult(str(path), "error", job=job, store=str(store.root))
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
    # Re-ingest of identical bytes is a no-op (by sha256); only hash when a candidate exists.
    stored = store.stored_files()
    if any(s.bytes == size for s in stored) and not opts.force:
        import hashlib

        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(8 << 20):
                h.update(block)
        digest = h.hexdigest()
        same = [s for s in stored if s.sha256 == digest]
        if same:
            res.status, res.job, res.rank = "skipped", same[0].job, same[0].rank
            res.message = (f"already ingested as job {same[0].job} rank {same[0].rank} "
                           "(same sha256); use --force to re-ingest")
            return res
    work = store.new_workdir()
    try:
        _ingest_into(path, opts, store, decoder, job, rank_option, work, res, stored, progress)
    except TraceFileError as err:
        res.status, res.message = "error", str(err)
    except FileFailed as err:
        res.status, res.message = "error", str(err)
    finally:
        store.cleanup(work)
    res.seconds = time.perf_counter() - t0
    return res


def _ingest_into(
    path: Path, opts: Options, store: Store, decoder: Decoder, job: str,
    rank_option: int | None, work: Path, res: FileResult, stored: list,
    progress: Callable[[int], None] | None,
) -> None:
    stage = work / "stage"
    built = work / "built"
    stage.mkdir()
    built.mkdir()
    info = SourceInfo(path=path)

    def reported(it: Iterator[Piece]) -> Iterator[Piece]:
        for p in it:
            if progress:
                progress(info.bytes_on_disk)
            yield p

    results = _decode_all(decoder, reported(pieces(info, opts.piece_bytes)), stage)
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
    if rank_option is not None:
        rank, source = rank_option, "option"
    elif (r := distributed_rank(keys)) is not None:
        rank, source = r, "distributedInfo"
    elif (r := rank_from_file_name(path)) is not None:
        rank, source = r, "file_name"
    if rank is None:
        raise FileFailed("no rank: the trace has no distributedInfo.rank and the file name "
                         "has no rank/worker number; pass --rank N")
    res.rank = rank
    clash = [s for s in stored if s.job == job and s.rank == rank]
    if clash and not opts.force:
        raise FileFailed(f"job {job} rank {rank} already holds {clash[0].file_name} "
                         f"(different content); use --force to replace it, or --job")

    base = base_time_ns(keys)
    di = keys.get("distributedInfo") if isinstance(keys.get("distributedInfo"), dict) else None
    pg_ranks = _pg_ranks(di)
    threads = max(1, opts.workers or os.cpu_count() or 1)
    con = derive_mod.connect(work, threads, opts.memory_limit)
    try:
        d = derive_mod.derive(con, stage, built, offsets, total, base, pg_ranks, decoder.run)
    finally:
        con.close()
    for eid, off, issue, detail, q, snip in d.issues:
        issues.append(Issue(None, off, issue, detail, q, snip))
        issue_eids.append(eid)  # absolute eid already
        if q:
            quarantined += 1
    stored_n = d.events_stored
    if stored_n + quarantined != total:
        raise FileFailed(f"internal error: conservation failed (read {total}, stored "
                         f"{stored_n}, quarantined {quarantined}); please report")
    it = issues_table(issues)
    it = it.drop_columns(["ord"]).add_column(0, "eid", pa.array(issue_eids, pa.int64()))
    derive_mod.write_arrow(it, built, "ingest_issues")

    stats = [pr for _, pr, _ in results]
    res.events_read, res.events_stored, res.events_quarantined = total, stored_n, quarantined
    row = {
        "path": str(path.resolve()), "file_name": path.name, "sha256": info.sha256,
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
        "rank_source": source,
        "metadata": json.dumps({k: v for k, v in keys.items()
                                if k not in ("deviceProperties", "distributedInfo")}),
        "events_read": total, "events_stored": stored_n, "events_quarantined": quarantined,
        "salvaged": salvaged, "ingested_at": datetime.now(UTC),
        "tracetool_version": __version__,
    }
    tf = pa.table({c.name: pa.array([row[c.name]], type=c.type) for c in TRACE_FILES.columns})
    derive_mod.write_arrow(tf, built, "trace_files")
    store.commit(job, rank, built)
    res.status = "ingested"
    res.message = f"{total} events read, {stored_n} stored, {quarantined} quarantined"


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


# --------------------------------------------------------------------------- many files


def ingest(
    paths: list[Path],
    opts: Options,
    on_result: Callable[[FileResult], None] | None = None,
    progress_factory: Callable[[Path, int], Callable[[int], None]] | None = None,
) -> list[FileResult]:
    """Ingest files and directories into one job; returns one result per file."""
    files, results = expand_inputs(paths)
    for r in results:
        if on_result:
            on_result(r)
    job = opts.job or default_job(paths, files)
    if not JOB_NAME.match(job):
        raise UsageProblem(f"invalid job name {job!r}: use letters, digits, '.', '_', '+', '-'")
    if opts.rank is not None and len(files) > 1:
        raise UsageProblem("--rank applies to a single trace file, but several were given")
    store = Store(opts.store)
    workers = opts.workers or os.cpu_count() or 1
    decoder = Decoder(workers)
    sizes = [f.stat().st_size for f in files if f.is_file()]
    if workers > 1 and any(s > opts.piece_bytes // 4 for s in sizes):
        decoder.pool()
    try:
        for f in files:
            size = f.stat().st_size if f.exists() and f.is_file() else 0
            prog = progress_factory(f, size) if progress_factory else None
            r = ingest_file(f, opts, store, decoder, job, opts.rank, prog)
            results.append(r)
            if on_result:
                on_result(r)
    finally:
        decoder.close()
    return results


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
