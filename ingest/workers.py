"""Where decoding runs: inline, or on a pool of forked worker processes.

Pieces of one file are decoded in file order with a bounded number in flight; a piece whose
cut fell inside an event is joined with the next piece and decoded again.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

from .decode import PieceResult, decode_piece, too_large
from .finish import DICTIONARY_COLUMNS
from .source import Piece

# The staged events: the columns the derivation stage reads (Parquet, in stage/events/), and
# every column for the final parts (Arrow IPC, in stage/events_full/).
STAGED_EVENT_COLUMNS = ["ord", "piece", "ph", "kind", "ts_ns", "dur_ns", "pid_raw", "tid_raw"]
FULL_EVENTS = "events_full"


def _stage_dir(stage: str, name: str) -> Path:
    d = Path(stage) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def full_events_part(stage_part: Path) -> Path:
    """The whole-row staged file of the piece whose light events part is ``stage_part``."""
    return stage_part.parent.parent / FULL_EVENTS / (stage_part.stem + ".arrow")


def decode_to_parts(piece: Piece, stage: str, part: int) -> PieceResult:
    """Worker entry point: decode one piece and write its tables as staged parts."""
    if piece.too_large:  # one event over --max-event-bytes: quarantined, never read
        return too_large(piece.offset, piece.length, piece.too_large, piece.head)
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
        table = table.append_column("piece", pa.array([part] * table.num_rows, pa.int32()))
        if name == "events":
            # whole rows for the finishing workers as uncompressed Arrow IPC (memory-mapped
            # back: 5x faster to read than Parquet; against lz4, 4% faster ingest and 10%
            # less peak RSS at ~2.5x the temporary disk), the light columns the derivation
            # stage queries as Parquet for DuckDB
            feather.write_feather(table, _stage_dir(stage, FULL_EVENTS) / f"{part:08d}.arrow",
                                  compression="uncompressed")
            table = table.select(STAGED_EVENT_COLUMNS)
        pq.write_table(table, _stage_dir(stage, name) / f"{part:08d}.parquet",
                       compression="lz4",
                       use_dictionary=[c for c in DICTIONARY_COLUMNS if c in table.column_names])
    res.tables = {}
    pa.default_memory_pool().release_unused()
    return res


# decoding is CPU-bound: past this many processes per core, more only add memory, start-up
# and DuckDB threads (the derivation stage's thread count follows the workers), so a larger
# --workers is capped here, with a warning
WORKERS_PER_CORE = 4


def capped_workers(asked: int, cores: int | None = None) -> tuple[int, str | None]:
    """(the worker count to run, a note when ``asked`` was capped at WORKERS_PER_CORE x the
    machine's cores)."""
    cores = cores or os.cpu_count() or 1
    cap = WORKERS_PER_CORE * cores
    if asked <= cap:
        return asked, None
    return cap, (f"--workers {asked}: capped at {cap} ({WORKERS_PER_CORE} per core on "
                 f"{cores} cores)")


_PR_SET_PDEATHSIG = 1
_IN_WORKER = False  # set in pool workers (_worker_init)


def in_worker() -> bool:
    """True in a forked pool worker: a process that only builds and decodes, so it may keep
    state between tasks (a DuckDB connection, the compiled scanner) and never forks."""
    return _IN_WORKER


def _worker_init(parent: int) -> None:
    """In each worker: die with the parent (even by kill -9, which runs no clean-up there),
    and leave SIGINT to the parent (a Ctrl-C reaches the whole process group), which stops
    the pool itself."""
    global _IN_WORKER
    _IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        ok = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):  # not Linux: watch the parent instead
        ok = False
    if not ok:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


class Workers:
    """Runs decoding (and other per-piece or per-file work) inline or on a process pool,
    created on first need."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def pool(self) -> ProcessPoolExecutor:
        """Forked workers (cheap to start, no re-import of __main__), all started at once
        by the first submit; ``ingest`` starts them before any DuckDB thread exists."""
        if self._pool is None:
            # Collect garbage first and freeze what is left: a child must never run the
            # finalizer of a parent's object (an unclosed DuckDB connection segfaults there).
            gc.collect()
            gc.freeze()
            try:
                self._pool = ProcessPoolExecutor(self.workers,
                                                 mp_context=mp.get_context("fork"),
                                                 initializer=_worker_init,
                                                 initargs=(os.getpid(),))
                self._pool.submit(int).result()
            finally:
                gc.unfreeze()
        return self._pool

    def map(self, items: Iterator[Piece], stage: Path) -> Iterator[tuple[Piece, PieceResult]]:
        """Decode pieces in order, at most workers + 1 in flight (bounded memory)."""
        first = next(items, None)
        if first is None:
            return
        if self.workers <= 1 or first.is_last:
            yield first, decode_to_parts(first, str(stage), first.seq)
            for p in items:
                yield p, decode_to_parts(p, str(stage), p.seq)
            return
        pool = self.pool()
        window: deque[tuple[Piece, Future]] = deque()

        def submit(p: Piece) -> None:
            window.append((p, pool.submit(decode_to_parts, p, str(stage), p.seq)))

        try:
            submit(first)
            for p in items:
                # release the piece text once submitted; keep only its position
                submit(p)
                while len(window) > self.workers:
                    q, fut = window.popleft()
                    yield q, fut.result()
            while window:
                q, fut = window.popleft()
                yield q, fut.result()
        finally:
            # on an error, let no worker still write into a work dir about to be removed
            for _, fut in window:
                fut.cancel()
            wait([fut for _, fut in window])

    def run(self, fn: Callable, items: Iterable) -> list:
        """fn over items, on the pool when there is one and more than one item. All calls
        finish before an error is raised (none may still write when the caller cleans up)."""
        items = list(items)
        if self.workers <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        futures = [self.pool().submit(fn, x) for x in items]
        wait(futures)
        return [f.result() for f in futures]

    def submit(self, fn: Callable, *args: object) -> Future:
        return self.pool().submit(fn, *args)

    def close(self, kill: bool = False) -> None:
        """Stop the pool once its running tasks end; ``kill``: at once (an interrupt: their
        work directories are about to be removed)."""
        if self._pool is None:
            return
        if kill:
            for proc in list(getattr(self._pool, "_processes", {}).values()):
                proc.kill()
        self._pool.shutdown(cancel_futures=True)
        self._pool = None


def remove_parts(stage: Path, part: int) -> None:
    for f in [*stage.glob(f"*/{part:08d}.parquet"), *stage.glob(f"*/{part:08d}.arrow")]:
        f.unlink()


def decode_all(workers: Workers, items: Iterator[Piece], stage: Path
                ) -> list[tuple[int, PieceResult, bool]]:
    """Decode every piece; a piece whose cut fell inside an event is joined with the next
    one and decoded again (rare: only events larger than a piece, or a cut at a "}, {"
    inside nested args). Joining stops at a piece never read (an event over the limit) and
    once the event being joined is over the limit: the carried piece is decoded alone, its
    broken last event quarantined. Returns (part number, result, is last) in file order."""
    out: list[tuple[int, PieceResult, bool]] = []
    carry: Piece | None = None
    for piece, pr in workers.map(items, stage):
        # (a carry over twice the limit holds an event over it: pieces are at most the limit)
        if carry is not None and (piece.too_large
                                  or len(carry.load()) > 2 * carry.max_event_bytes):
            alone = replace(carry, join_edges=False)
            out.append((carry.seq, decode_to_parts(alone, str(stage), carry.seq), False))
            carry = None
            if pr.cut_inside_event:  # the rest of that event: a broken head, not joined
                remove_parts(stage, piece.seq)
                piece = replace(piece, text=piece.load(), is_first=True)
                pr = decode_to_parts(piece, str(stage), piece.seq)
        if carry is not None:
            remove_parts(stage, piece.seq)
            piece = Piece(carry.seq, carry.load() + piece.gap + piece.load(), carry.offset,
                          carry.is_first, piece.is_last, gap=carry.gap,
                          max_event_bytes=carry.max_event_bytes)
            pr = decode_to_parts(piece, str(stage), piece.seq)
            carry = None
        if pr.cut_inside_event:
            if not piece.is_last:
                carry = Piece(piece.seq, piece.load(), piece.offset, piece.is_first, False,
                              gap=piece.gap, max_event_bytes=piece.max_event_bytes)
                continue
            # nothing to join with: decode it alone, its broken edges quarantined
            piece = Piece(piece.seq, piece.load(), piece.offset, piece.is_first,
                          piece.is_last, join_edges=False)
            pr = decode_to_parts(piece, str(stage), piece.seq)
        out.append((piece.seq, pr, piece.is_last))
    return out
