"""The replay graph: a job's dependency graph as flat arrays, ready to be scheduled again.

It is the graph the critical path walks (each rank's ``cp_nodes`` and ``rank_edges``, built at
ingest: nodes are the start and end points of CPU events and GPU ops, an edge says which point
waited for which; ``tracetool.ingest.graph``), turned into something a simulator can re-time:

- every GPU op gets an explicit **duration edge** start -> end (the quantity the hardware
  model changes);
- every collective instance (one call matched across ranks) gets a **barrier node**: each
  rank's transfer (NCCL kernel or gloo span) start -> barrier (an *arrival* edge, weight 0),
  and barrier -> each rank's transfer end (a *transfer* edge). So a collective starts on each
  rank when that rank issues it and ends at (last arrival + transfer), as NCCL's do;
- every other edge keeps its measured lag when it is the **binding** dependency of its point
  (the one satisfied last, smallest lag), and otherwise shrinks to the typical binding lag of
  its kind on its rank (a queued kernel's launch edge to the usual launch latency, a sync's
  return to the usual wake-up, a gap on a stream to the usual kernel-to-kernel gap; CPU
  program order to 0 where something else held the point back). CPU time between ops on a
  thread is binding, so it stays as work; GPU idle time is never work, it comes from the
  edges.

With no change, every point's time is the max over its in-edges of (source time + weight),
the binding edge gives exactly the measured time and no other edge exceeds it, so identity
replay reproduces the trace exactly (``tests/test_replay.py`` checks every step of every
multi-rank set).

Nodes have a topological order (``order``); the edges are grouped by destination in that
order, as a CSR over positions (``ptr``: node ``order[i]``'s in-edges are ``ptr[i]:ptr[i +
1]``, ``src`` and ``dst`` per edge), so ``tracetool.replay.simulate`` schedules them in one
compiled pass that reads the edges front to back. Every column is read from
the store as Arrow and stays a numpy array: no Python object per node or edge.

**Bounds** (``Bounds``: ``--steps A:B``, ``--ranks``) limit what is read, in the SQL: the
events of the chosen ranks that overlap the chosen steps' span, and the edges into them. The
points just outside that the chosen ones waited for (a kernel of step A-1 whose end a step A
launch waited on) are kept as fixed points at their measured times: the outside runs as
measured. A collective whose last arrival is outside the chosen ranks (or steps) keeps its
measured wait: the barrier follows the last arrival inside, plus the measured gap to the
real last arrival, as a fixed delay (``ReplayGraph.partial``; the result's notes say how
many). A collective's transfer time is always the job's (the shortest over all its ranks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from tracetool.analysis.collectives import missing_ranks_note
from tracetool.analysis.critical_path import GAP_FLOOR_NS
from tracetool.errors import InputError
from tracetool.graph import CLASSES, KIND_NAMES
from tracetool.schema import MAX_RANK, MAX_STEP
from tracetool.text import number_ranges

from .alltoall import pair_bytes

# roles of an edge in the replay: what a scenario may change about it
FIXED, OP_DURATION, COMM_DURATION, TRANSFER, ARRIVAL = range(5)
_COLLECTIVE = KIND_NAMES.index("collective")
_CPU_ORDER = KIND_NAMES.index("cpu_order")
_GPU_ORDER = KIND_NAMES.index("gpu_order")
NO_STEP = -1  # ReplayGraph.steps of a job without ProfilerStep: one window, the whole trace
# a process group that data parallelism runs over (its description, pg_desc)
DP_GROUP_DESC = re.compile(r"(^|[^a-z])dp([^a-z]|$)|data|default_pg", re.IGNORECASE)
# collectives data parallelism is made of (DDP, FSDP, ZeRO): a job whose every collective
# spans all ranks and is one of these is data-parallel only, one rank a replica
_DP_KINDS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier")


class NoSuchSteps(InputError):
    """A --steps range (or --step) with no ProfilerStep of the job in it."""




@dataclass(frozen=True)
class RankRanges:
    """``--ranks`` as the inclusive ranges it names, sorted and merged: never expanded into
    a list before they are checked against the job's ranks (``0-99999999999`` names 10^11
    ranks; the job has a few), so a huge range costs nothing."""

    ranges: tuple[tuple[int, int], ...]

    def pick(self, have: list[int]) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
        """(the ranks of ``have`` (sorted) inside the ranges, the ranges' parts that are
        not in ``have``)."""
        inside = tuple(r for r in have if any(a <= r <= b for a, b in self.ranges))
        missing, pos = [], 0
        for a, b in self.ranges:
            nxt = a
            while pos < len(inside) and inside[pos] <= b:
                if inside[pos] > nxt:
                    missing.append((nxt, inside[pos] - 1))
                nxt = inside[pos] + 1
                pos += 1
            if nxt <= b:
                missing.append((nxt, b))
        return inside, missing


@dataclass(frozen=True)
class Bounds:
    """The part of a job a replay reads: ProfilerSteps ``steps`` (first, last; inclusive)
    and ``ranks`` (sorted, or ``RankRanges`` / 'replica' until ``resolve_ranks``), None
    meaning all."""

    steps: tuple[int, int] | None = None
    ranks: tuple[int, ...] | RankRanges | str | None = None

    @property
    def bounded(self) -> bool:
        return self.steps is not None or self.ranks is not None


def parse_steps(text: str) -> tuple[int, int]:
    """'A:B' (or 'N') -> (A, B), ProfilerStep numbers 0 <= A <= B <= MAX_STEP; InputError
    for anything else."""
    a, sep, b = text.strip().partition(":")
    try:
        first, last = int(a), int(b if sep else a)
    except ValueError:
        raise InputError(f"bad --steps {text!r}: give A:B (ProfilerStep numbers, e.g. "
                         "3:5) or N") from None
    if not 0 <= first <= MAX_STEP or not 0 <= last <= MAX_STEP:
        raise InputError(f"bad --steps {text!r}: ProfilerStep numbers are 0 to {MAX_STEP}")
    if first > last:
        raise InputError(f"bad --steps {text!r}: the first step {first} is after the "
                         f"last {last}")
    return first, last


def parse_ranks(text: str) -> RankRanges | str:
    """'0,2-5' -> RankRanges(((0, 0), (2, 5))), ranks 0 to MAX_RANK; 'replica' stays a word
    (``resolve_ranks``). InputError for anything else."""
    if text.strip().lower() == "replica":
        return "replica"
    ranges: list[tuple[int, int]] = []
    for part in (p.strip() for p in text.split(",")):
        lo, dash, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi if dash else lo)
        except ValueError:
            raise InputError(f"bad --ranks {text!r}: give ranks and ranges (0,2-5) or "
                             "'replica'") from None
        if a > b or a < 0:
            raise InputError(f"bad --ranks {text!r}: range {part!r} is empty")
        if b > MAX_RANK:
            raise InputError(f"bad --ranks {text!r}: ranks are 0 to {MAX_RANK}")
        ranges.append((a, b))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return RankRanges(tuple(merged))


def job_ranks(con: duckdb.DuckDBPyConnection, job: str) -> list[int]:
    """The job's ranks, sorted (from trace_files: no event is read)."""
    return [r for (r,) in con.execute(
        "SELECT DISTINCT rank FROM trace_files WHERE job = ? ORDER BY 1", [job]).fetchall()]


def resolve_ranks(con: duckdb.DuckDBPyConnection, job: str,
                  ranks: tuple[int, ...] | RankRanges | str) -> tuple[int, ...]:
    """The ranks ``--ranks`` names, checked against the job's (InputError naming the
    missing ones); 'replica': one data-parallel replica (``replica_ranks``)."""
    have = job_ranks(con, job)
    if ranks == "replica":
        return replica_ranks(con, job, have)
    if not isinstance(ranks, RankRanges):
        ranks = RankRanges(tuple((r, r) for r in sorted(set(ranks))))
    inside, missing = ranks.pick(have)
    if missing:
        gaps = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in missing)
        raise InputError(f"--ranks: job {job} has no rank {gaps} (ranks: {number_ranges(have)})")
    return inside


def replica_ranks(con: duckdb.DuckDBPyConnection, job: str, have: list[int]
                  ) -> tuple[int, ...]:
    """One data-parallel replica of the job: the first rank of each data-parallel process
    group (groups whose description says dp / data / default_pg, when other groups exist
    too); a job whose every collective is a data-parallel kind over all its ranks is data
    parallel only, and its replica is its first rank. Anything else (model-parallel
    collectives with no data-parallel group named, all-to-alls) cannot be told: InputError."""
    if len(have) == 1:
        return tuple(have)
    rows = con.execute(
        """SELECT DISTINCT pg_desc, group_ranks, group_size, kind FROM collective_ranks
           WHERE job = ? AND NOT coalesce(group_ranks_truncated, FALSE)""", [job]).fetchall()
    world = len(have)
    groups = [(desc, tuple(sorted(g)) if g else None, size, kind)
              for desc, g, size, kind in rows]
    spans = [g is None and (size or world) >= world or g is not None and len(g) >= world
             for _, g, size, _ in groups]
    named = {g for (desc, g, _, _), whole in zip(groups, spans, strict=True)
             if g and not whole and desc and DP_GROUP_DESC.search(str(desc))}
    if named:
        return tuple(sorted({min(g) for g in named}))
    if groups and all(spans) and all(k in _DP_KINDS for _, _, _, k in groups):
        return (min(have),)
    why = ("it has no collectives" if not groups else
           "its process groups name no data-parallel group and not all its collectives are "
           f"data-parallel ones over all {world} ranks")
    raise InputError(f"--ranks replica: cannot tell job {job}'s data-parallel replica "
                     f"({why}); give the ranks, e.g. --ranks 0,1")



class Lazy(Mapping):
    """Columns (or a mapping) read from the store on first use: the op details only a GPU
    model or a speedup needs, the gradients only unsized collectives need (on a cursor of
    the graph's connection, which must still be open then)."""

    def __init__(self, eager: dict, load: Callable[[], dict]) -> None:
        self._data, self._load = dict(eager), load

    def _all(self) -> dict:
        if self._load is not None:
            try:
                self._data.update(self._load())
            except duckdb.ConnectionException as err:
                raise ValueError("the replay graph reads op details from its store on "
                                 "first use: keep the connection open") from err
            self._load = None
        return self._data

    def __getitem__(self, key: object) -> object:
        if key in self._data:
            return self._data[key]
        return self._all()[key]

    def __iter__(self) -> Iterator:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


@dataclass
class ReplayGraph:
    """One job's replay graph. Node n is point (n & 1: 0 start, 1 end) of slot n >> 1; slots
    are the replayed events in (rank, eid) order, then one per collective barrier."""

    job: str
    origin_ns: int  # times below are ns after this
    t0: np.ndarray  # float64 per node: measured time
    order: np.ndarray  # int64: nodes in topological order
    ptr: np.ndarray  # int64, n_nodes + 1: in-edges of node order[i] are ptr[i]:ptr[i + 1]
    src: np.ndarray  # int64 per edge: source node
    dst: np.ndarray  # int64 per edge: destination node (order repeated by ptr; the build has it)
    lag: np.ndarray  # float64 per edge: measured lag (dst time - src time)
    base_w: np.ndarray  # float64 per edge: the identity weight (lag, or relaxed)
    kind: np.ndarray  # int8 per edge: index into KIND_NAMES
    role: np.ndarray  # int8 per edge: FIXED, OP_DURATION, COMM_DURATION, TRANSFER, ARRIVAL
    op: np.ndarray  # int64 per edge: GPU op index (OP_DURATION), else -1
    inst: np.ndarray  # int64 per edge: collective instance (COMM_DURATION/TRANSFER), else -1
    cycle_breaks: int  # edges ignored to break zero-lag cycles (0 on every trace seen)
    # per slot
    rank: np.ndarray
    eid: np.ndarray
    track: np.ndarray
    cls: np.ndarray  # index into CLASSES (compute, comm, memcpy, cpu); barriers: comm
    parent: np.ndarray
    is_gpu: np.ndarray
    n_event_slots: int  # slots below this are events; the rest are barriers
    # GPU ops (duration edges): rank, eid, slot, dur, is_comm; kind, name, category,
    # op_name, dims, types, concrete read on first use
    ops: Mapping
    # collective instances
    insts: dict  # instance, collective, kind, bytes, group_ranks (list), pg_desc, transfer_ns
    # steps (tracetool.replay.run.step_windows tiles them as the steps/job_steps views do)
    steps: np.ndarray  # job step numbers, sorted ([NO_STEP] without ProfilerStep)
    step_complete: np.ndarray  # bool per job step (job_steps.complete)
    # per (rank, step) row in (rank, step) order (_rank_steps): rank, step_idx (into steps),
    # tiled, start_node (its time + start_off starts the step; -1 when none), start_fixed
    # (measured start when there is no such node, else NaN); end_row/end_node/end_off: the
    # nodes whose latest time (+ end_off) ends a row, where the rules need them
    rank_steps: dict
    breakdown: dict  # slot, what (CLASSES index): breakdown_events of the GPU/CPU work
    ranks: np.ndarray  # ranks of the job (all of them, replayed or not)
    devices: list[str]  # deviceProperties names of the job
    # job step -> elements of the gradients autograd accumulated in it (the model's
    # parameters, from AccumulateGrad's Input Dims; empty without record_shapes)
    grad_numel: Mapping[int, int] = field(default_factory=dict)
    # what was read: the bounds, the ranks replayed, the steps reported (False: a step
    # next to the range, kept only so the range's steps tile as in the whole job)
    bounds: Bounds = field(default_factory=Bounds)
    replayed_ranks: np.ndarray | None = None
    step_reported: np.ndarray | None = None
    partial: int = 0  # collective instances whose last arrival is not replayed
    frontier: int = 0  # events outside the bounds kept as fixed points
    world_size: int | None = None  # the job's size as its traces name it (view job_world)
    # per slot: True for a GPU op whose wait before its start is an unexplained gap (view
    # gpu_wait_gaps, read as the critical path reads it); None when none is
    waited: np.ndarray | None = None
    wait_ns: np.ndarray | None = None  # per slot: that wait's measured length (view's wait_ns)
    # what the models derive from the graph alone, computed once (model.overlap_share, ...)
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_nodes(self) -> int:
        return len(self.t0)

    @property
    def n_edges(self) -> int:
        return len(self.src)

    @property
    def notes(self) -> list[str]:
        """What the bounds left out, in a sentence each (the result's notes)."""
        out = []
        missing = missing_ranks_note(self.job, self.ranks.tolist(), self.world_size)
        if missing:
            out.append(f"{missing}; each collective is priced over its process group's size "
                       "(collective_ranks.group_size: pg_config, else the world size for a "
                       "call that names no group), the untraced ranks assumed to run as the "
                       "traced ones do (symmetric peers)")
        if self.bounds.ranks is not None:
            out.append(f"replayed ranks {number_ranges(self.replayed_ranks.tolist())} of "
                       f"{len(self.ranks)}")
        if self.partial:
            out.append(f"{self.partial} collective(s) wait for ranks or steps outside the "
                       "replay: their measured wait for the last arrival is kept as a fixed "
                       "delay")
        return out


class SlotIndex:
    """(rank, eid) -> slot. Slots are the replayed events in (rank, eid) order, each rank's
    contiguous (``base``, ``sizes``). Unbounded, slot = base[rank] + eid (eids are dense in
    a rank), and ``is_node`` marks the eids that are nodes; bounded, the slots are the
    selected events alone, so arrays scale with the selection: looked up in a table over
    each rank's span of selected eids when those spans hold at most SPAN_FACTOR times the
    events (a step's events lie close together in the file), else by binary search."""

    SPAN_FACTOR = 4  # a lookup table at most this many times the selection's size

    def __init__(self, rank: np.ndarray, eid: np.ndarray, dense: bool) -> None:
        self.ranks = np.flatnonzero(np.bincount(rank)) if len(rank) else np.zeros(0, np.int64)
        self._lut = np.full(int(self.ranks.max()) + 2 if len(rank) else 1, -1, dtype=np.int64)
        self._lut[self.ranks] = np.arange(len(self.ranks))  # rank -> its index (ranks >= 0)
        ri = self._lut[rank]
        eid = np.asarray(eid, dtype=np.int64)
        self.dense = dense
        self.keys = self._span = None
        if dense:
            self.sizes = np.zeros(len(self.ranks), dtype=np.int64)
            np.maximum.at(self.sizes, ri, eid + 1)
        else:
            self.sizes = np.bincount(ri, minlength=len(self.ranks)).astype(np.int64)
            self.keys = np.sort((ri.astype(np.int64) << 40) | eid)
            self._span = self._span_table(ri, eid)
        self.base = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.n = int(self.sizes.sum())

    def _span_table(self, ri: np.ndarray, eid: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """(lo, hi, start, table): per rank index its lowest and highest selected eid and
        where its part of ``table`` starts; table[start + eid - lo] is the slot, -1 where the
        eid is not selected. None when the spans would be too large for the selection."""
        if not len(eid):
            return None
        lo = np.full(len(self.ranks), np.iinfo(np.int64).max)
        hi = np.full(len(self.ranks), -1, dtype=np.int64)
        np.minimum.at(lo, ri, eid)
        np.maximum.at(hi, ri, eid)
        width = np.where(hi >= lo, hi - lo + 1, 0)
        if width.sum() > self.SPAN_FACTOR * len(eid) + 1024:
            return None
        start = np.concatenate([[0], np.cumsum(width)[:-1]]).astype(np.int64)
        table = np.full(int(width.sum()), -1, dtype=np.int64)
        k_ri, k_eid = self.keys >> 40, self.keys & ((1 << 40) - 1)
        table[start[k_ri] + k_eid - lo[k_ri]] = np.arange(len(self.keys))
        return lo, hi, start, table

    def __call__(self, rank: np.ndarray, eid: np.ndarray) -> np.ndarray:
        """Slots, -1 where (rank, eid) is no event of the index."""
        rank = np.asarray(rank)
        eid = np.asarray(eid, dtype=np.int64)
        if len(self.ranks) == 0:
            return np.full(len(eid), -1, dtype=np.int64)
        ri = self._lut[np.clip(rank, -1, len(self._lut) - 1)]
        ok = (ri >= 0) & (eid >= 0)
        ri = np.maximum(ri, 0)
        if self.dense:
            ok &= eid < self.sizes[ri]
            return np.where(ok, self.base[ri] + eid, -1)
        if self._span is not None:
            lo, hi, start, table = self._span
            ok &= (eid >= lo[ri]) & (eid <= hi[ri])
            at = np.where(ok, start[ri] + eid - lo[ri], 0)
            return np.where(ok, table[at], -1)
        key = (ri.astype(np.int64) << 40) | np.maximum(eid, 0)
        pos = np.minimum(np.searchsorted(self.keys, key), max(self.n - 1, 0))
        ok &= self.keys[pos] == key if self.n else False
        return np.where(ok, pos, -1)


def _fetch(con: duckdb.DuckDBPyConnection, sql: str, params: dict | list | None = None
           ) -> dict[str, np.ndarray]:
    """A query's columns as numpy arrays, through Arrow (no Python object per row for
    numbers; strings become object arrays)."""
    tbl = con.sql(sql, params=params or None).to_arrow_table()
    return {name: tbl.column(name).to_numpy(zero_copy_only=False) for name in tbl.column_names}


def _case(column: str, names: list[str] | tuple[str, ...]) -> str:
    """SQL mapping a text column to its index in ``names`` (-1 for others), as TINYINT."""
    whens = " ".join(f"WHEN '{n}' THEN {i}" for i, n in enumerate(names))
    return f"(CASE {column} {whens} ELSE -1 END)::TINYINT"


@dataclass
class _Selection:
    """The part of a job to read, as SQL filters, and the steps it covers."""

    job: str
    ranks: tuple[int, ...] | None  # None: every rank
    lo: int | None  # events overlapping [lo, hi] (ns), None: all
    hi: int | None
    steps: tuple[int, int] | None

    def where(self, alias: str = "", times: bool = True) -> str:
        a = f"{alias}." if alias else ""
        out = [f"{a}job = $job"]
        if self.ranks is not None:
            out.append(f"{a}rank IN ({', '.join(map(str, self.ranks))})")
        if times and self.lo is not None:
            out.append(f"{a}end_ns >= {self.lo} AND {a}ts_ns <= {self.hi}")
        return " AND ".join(out)

    @property
    def params(self) -> dict:
        return {"job": self.job}


def _select(con: duckdb.DuckDBPyConnection, job: str, bounds: Bounds) -> _Selection:
    """The SQL filters of ``bounds`` (InputError for steps the job does not have)."""
    ranks = None if bounds.ranks is None else resolve_ranks(con, job, bounds.ranks)
    if bounds.steps is None:
        return _Selection(job, ranks, None, None, None)
    a, b = bounds.steps
    rank_sql = "" if ranks is None else f" AND rank IN ({', '.join(map(str, ranks))})"
    lo, hi, n = con.execute(
        f"""SELECT min(start_ns), max(end_ns), count(DISTINCT step) FROM steps
            WHERE job = $job AND step BETWEEN $a AND $b{rank_sql}""",
        {"job": job, "a": a, "b": b}).fetchall()[0]
    if not n:
        have = [s for (s,) in con.execute(
            f"SELECT DISTINCT step FROM steps WHERE job = $job{rank_sql} ORDER BY 1",
            {"job": job}).fetchall()]
        span = f"steps {have[0]}-{have[-1]}" if have else "no steps"
        what = f"step {a}" if a == b else f"steps {a}:{b}"
        raise NoSuchSteps(f"job {job} has no ProfilerStep in {what} ({span})")
    hi = max(hi, con.execute(
        "SELECT max(end_ns) FROM job_steps WHERE job = $job AND step BETWEEN $a AND $b",
        {"job": job, "a": a, "b": b}).fetchall()[0][0] or hi)
    return _Selection(job, ranks, int(lo), int(hi), (a, b))


_OPS_DETAIL_SQL = """
SELECT g.rank, g.eid, g.kind, g.name, coalesce(k.category, g.kind) AS category, g.op_name,
       o.args->>'Input Dims' AS dims, o.args->>'Input type' AS types,
       o.args->>'Concrete Inputs' AS concrete
FROM gpu_ops g
LEFT JOIN kernels k ON k.job = g.job AND k.rank = g.rank AND k.eid = g.eid
LEFT JOIN events o ON o.job = g.job AND o.rank = g.rank AND o.eid = g.op_eid
WHERE {where}"""

# one instance = one collective call on every rank of its group: collective_ranks.instance,
# the key the critical path and collective_instances use (analysis/sql/40_collectives.sql);
# calls it could not match (instance NULL) are no barrier. Read for every rank (a small
# table): an instance's last arrival and transfer time are the job's, replayed ranks or not
_INSTANCES_SQL = """
SELECT c.rank, c.instance, coalesce(c.kernel_eid, c.gloo_eid) AS x_eid, c.ts_ns, c.end_ns,
       c.collective, c.kind, c.pg_desc, c.group_size,
       CASE WHEN coalesce(c.group_ranks_truncated, FALSE) THEN NULL ELSE c.group_ranks END
           AS group_ranks, c.bytes, c.step, c.elem_bytes, c.in_split_sizes, c.in_bytes
FROM collective_ranks c
WHERE c.job = $job AND c.instance IS NOT NULL
  AND coalesce(c.kernel_eid, c.gloo_eid) IS NOT NULL
ORDER BY c.instance, c.rank"""

# the parameters whose gradient autograd accumulated in each step, on the lowest rank that
# records their shapes (record_shapes): one AccumulateGrad per parameter and backward pass
_GRADS_SQL = """
WITH g AS (
    SELECT e.rank, s.step, coalesce(e.args->>'Input Dims', e.args->>'Input dims') AS dims
    FROM events e JOIN steps s ON s.job = e.job AND s.rank = e.rank
     AND e.ts_ns >= s.start_ns AND e.ts_ns < s.end_ns
    WHERE e.job = ? AND e.name = 'torch::autograd::AccumulateGrad')
SELECT step, dims FROM g WHERE dims IS NOT NULL
 AND rank = (SELECT min(rank) FROM g WHERE dims IS NOT NULL)"""


def build_graph(con: duckdb.DuckDBPyConnection, job: str, bounds: Bounds | None = None
                ) -> ReplayGraph:
    """The replay graph of ``job`` (``con`` from ``tracetool.connect``), from the graph its
    ranks' ingest stored; ``bounds`` limit it to some steps and ranks (module docstring).
    Op details and gradients are read from ``con`` on first use."""
    cur = con.cursor()  # its own results: a caller's unfinished one on con is not touched
    try:
        return _build(cur, con, job, bounds or Bounds())
    finally:
        cur.close()


def _build(con: duckdb.DuckDBPyConnection, owner: duckdb.DuckDBPyConnection, job: str,
           bounds: Bounds) -> ReplayGraph:
    """build_graph on cursor ``con`` of ``owner`` (which the lazy parts read later)."""
    sel = _select(con, job, bounds)
    nodes, e, slot_of, frontier = _read_graph(con, sel)
    slot = slot_of(nodes["rank"], nodes["eid"])
    n_ev_slots = slot_of.n
    origin = int(min(nodes["ts_ns"].min(), nodes["end_ns"].min()))
    is_node_ev = np.zeros(n_ev_slots, dtype=bool)
    is_node_ev[slot] = True
    inside = np.zeros(n_ev_slots, dtype=bool)  # events replayed (not fixed frontier points)
    inside[slot[~nodes["frontier"]]] = True

    # -- collective instances of the replayed events: one barrier slot each
    ci = _fetch(con, _INSTANCES_SQL, {"job": job})
    ci_slot = slot_of(ci["rank"], ci["x_eid"])
    ci_in = ci_slot >= 0
    ci_in[ci_in] = inside[ci_slot[ci_in]]
    names_all, idx_all = np.unique(ci["instance"].astype(str), return_inverse=True)
    used = np.unique(idx_all[ci_in])  # instances with a replayed rank
    n_inst = len(used)
    renum = np.full(len(names_all), -1, dtype=np.int64)
    renum[used] = np.arange(n_inst)
    inst_all = renum[idx_all]  # per row of ci: its instance, -1 if not replayed at all
    inst_idx, x_slot = inst_all[ci_in], ci_slot[ci_in]
    n_slots = n_ev_slots + n_inst
    is_node = np.concatenate([is_node_ev, np.ones(n_inst, dtype=bool)])

    t0 = np.zeros(2 * n_slots, dtype=np.float64)
    t0[2 * slot] = nodes["ts_ns"] - origin
    t0[2 * slot + 1] = nodes["end_ns"] - origin

    # -- GPU ops of the replayed events and their duration edges
    ops = _fetch(con, f"""SELECT rank, eid, coalesce(is_comm, FALSE) AS is_comm FROM gpu_ops
                          WHERE {sel.where(times=True)}""", sel.params)
    op_slot = slot_of(ops["rank"], ops["eid"])
    keep_op = op_slot >= 0
    keep_op[keep_op] = inside[op_slot[keep_op]]
    ops = {k: v[keep_op] for k, v in ops.items()}
    op_slot = op_slot[keep_op]
    x_inst = np.full(n_slots, -1, dtype=np.int64)
    x_inst[x_slot] = inst_idx
    barrier_slot = n_ev_slots + np.arange(n_inst)
    arrive = np.full(n_inst, -np.inf)  # the last replayed arrival
    np.maximum.at(arrive, inst_idx, t0[2 * x_slot])
    ci_rel = (ci["ts_ns"] - origin).astype(np.float64)
    last_all = np.full(n_inst, -np.inf)  # the job's last arrival (every rank's clock)
    np.maximum.at(last_all, inst_all[inst_all >= 0], ci_rel[inst_all >= 0])
    b_time = np.maximum(arrive, last_all)
    t0[2 * barrier_slot] = b_time
    t0[2 * barrier_slot + 1] = b_time
    partial = b_time > arrive  # the last arrival is outside: its wait stays, as measured
    # point-to-point pairs (collective_ranks' 'p2p:' instances: a send and its receive): the
    # receive ends after the later post + the transfer; the send's own span is its CPU's
    # (FIXED), and it waits for the barrier only when it ended after it (a rendezvous, or a
    # send waited for with a receive): one that ended before the receive was posted was
    # buffered and depends on nothing of its peer
    pair = np.char.startswith(names_all[used].astype(str), "p2p:")
    x_send = pair[inst_idx] & (ci["kind"][ci_in].astype(str) == "send")
    buffered = x_send & (t0[2 * x_slot + 1] < b_time[inst_idx])
    own_fixed = np.zeros(n_slots, dtype=bool)
    own_fixed[x_slot[x_send]] = True

    # -- recorded edges, minus the ones replaced: the start -> end order edge of a GPU op
    # or a transfer (by its duration edge); cross-rank 'collective' ones are not stored
    e_src = 2 * slot_of(e["rank"], e["src_eid"]) + e["sp"]
    e_dst = 2 * slot_of(e["rank"], e["dst_eid"]) + e["dp"]
    timed = np.zeros(n_slots, dtype=bool)
    timed[op_slot] = True
    timed[x_slot] = True
    keep = ~((e["src_eid"] == e["dst_eid"]) & (e["sp"] == 0) & (e["dp"] == 1)
             & timed[e_src >> 1]) & (e_src >= 0)
    n_keep = int(keep.sum())
    parts = [(e_src[keep], e_dst[keep], e["kind"][keep], np.full(n_keep, FIXED, np.int8),
              -1, -1)]
    # duration edges: compute/memcpy ops scale with the GPU model; transfers with the network
    is_x = x_inst[op_slot] >= 0
    fx = own_fixed[op_slot]
    parts.append((2 * op_slot, 2 * op_slot + 1, _GPU_ORDER,
                  np.where(fx, FIXED, np.where(is_x, COMM_DURATION, OP_DURATION)).astype(
                      np.int8),
                  np.arange(len(op_slot), dtype=np.int64),
                  np.where(is_x & ~fx, x_inst[op_slot], -1)))
    gloo_x = np.unique(x_slot[~np.isin(x_slot, op_slot)])  # transfers on CPU threads (gloo)
    fx = own_fixed[gloo_x]
    parts.append((2 * gloo_x, 2 * gloo_x + 1, _CPU_ORDER,
                  np.where(fx, FIXED, COMM_DURATION).astype(np.int8), -1,
                  np.where(fx, -1, x_inst[gloo_x])))
    # barriers: arrival (every rank's transfer start -> barrier), transfer (-> every end
    # but a buffered send's)
    parts.append((2 * x_slot, 2 * barrier_slot[inst_idx], _COLLECTIVE, ARRIVAL, -1, inst_idx))
    tied = ~buffered
    parts.append((2 * barrier_slot[inst_idx[tied]], 2 * x_slot[tied] + 1, _COLLECTIVE,
                  TRANSFER, -1, inst_idx[tied]))
    src, dst, kind, role, op, inst = _concat(parts)
    from .simulate import csr_by_destination, edges_in_order, topological_order

    # -- the order, then every edge column once, grouped by destination in that order
    by_dst, indptr = csr_by_destination(dst, kind, src, 2 * n_slots)
    order, breaks = topological_order(indptr, src[by_dst], t0)
    in_order, ptr = edges_in_order(order, indptr)
    by_dst = by_dst[in_order]
    src, dst, kind, role, op, inst = (a[by_dst] for a in (src, dst, kind, role, op, inst))
    lag = t0[dst] - t0[src]
    del by_dst, in_order, indptr, e

    # -- identity weights: binding edges keep their lag, the others shrink (module docstring)
    slot_rank = np.full(n_slots, -1, dtype=np.int64)
    slot_rank[slot] = nodes["rank"]
    base_w = _identity_weights(ptr, dst, lag, kind, role, slot_rank, slot_of.ranks)
    # a collective whose last arrival is not replayed: the barrier waits, after the last
    # replayed arrival, the measured rest (the edge from that arrival carries it as a delay)
    arrival = np.flatnonzero(role == ARRIVAL)
    arrival = arrival[partial[inst[arrival]]]
    if len(arrival):
        best = np.full(n_inst, np.inf)
        np.minimum.at(best, inst[arrival], lag[arrival])
        hit = arrival[lag[arrival] == best[inst[arrival]]]
        one = np.full(n_inst, -1, dtype=np.int64)
        one[inst[hit[::-1]]] = hit[::-1]  # the first such edge of each instance
        carry = one[one >= 0]
        base_w[carry] = lag[carry]

    # -- per-slot attributes
    def per_slot(values: np.ndarray, fill: int, dtype: type) -> np.ndarray:
        out = np.full(n_slots, fill, dtype=dtype)
        out[slot] = values
        return out

    parent = slot_of(nodes["rank"], nodes["parent_eid"])
    parent = np.where(parent >= 0, parent, -1)
    parent = np.where(is_node[np.maximum(parent, 0)] & (parent >= 0), parent, -1)
    cls = per_slot(nodes["cls"], CLASSES.index("cpu"), np.int8)
    cls[n_ev_slots:] = CLASSES.index("comm")
    rank_col = per_slot(nodes["rank"], -1, np.int32)
    rank_col[:n_ev_slots][~inside] = -1  # fixed points are no events of the replay

    # -- steps (the analysis views' definition, docs/steps.md)
    steps, complete, reported, rank_steps = _steps(con, sel, slot_of, inside, t0, origin)
    bd = _fetch(con, f"""SELECT b.rank, b.eid, {_case('b.what', CLASSES)} AS what
                         FROM breakdown_events b
                         WHERE {sel.where('b')} AND b.what <> 'cpu'""", sel.params)
    bd_slot = slot_of(bd["rank"], bd["eid"])
    ok = bd_slot >= 0
    ok[ok] = inside[bd_slot[ok]]
    breakdown = {"slot": bd_slot[ok], "what": bd["what"][ok]}

    # -- what the models need: GPU op details (on first use), instance sizes and groups
    op_info = Lazy({"rank": ops["rank"], "eid": ops["eid"], "slot": op_slot,
                    "is_comm": ops["is_comm"], "dur": t0[2 * op_slot + 1] - t0[2 * op_slot]},
                   lambda: _op_details(owner.cursor(), sel, slot_of, op_slot))
    insts = _instances(ci, inst_all, used, names_all, n_inst, inst_idx, ci_rel)
    # a transfer's own duration edge is the transfer alone (the last arrival's duration)
    comm_dur = role == COMM_DURATION
    base_w[comm_dur] = insts["transfer_ns"][inst[comm_dur]]
    devices = [d for (d,) in con.execute(
        "SELECT DISTINCT unnest(device_names) FROM trace_files WHERE job = ? ORDER BY 1",
        [job]).fetchall() if d]
    job_ranks = np.array([r for (r,) in con.execute(
        "SELECT DISTINCT rank FROM trace_files WHERE job = ? ORDER BY 1", [job]).fetchall()],
        dtype=np.int64)
    replayed = np.unique(nodes["rank"][~nodes["frontier"]]).astype(np.int64)
    (world,) = con.execute("SELECT max(world_size) FROM job_world WHERE job = ?",
                           [job]).fetchone()
    return ReplayGraph(
        job=job, origin_ns=origin, t0=t0, order=order, ptr=ptr, src=src, dst=dst, lag=lag,
        base_w=base_w, kind=kind, role=role, op=op, inst=inst, cycle_breaks=int(breaks),
        rank=rank_col, eid=per_slot(nodes["eid"], -1, np.int64),
        track=per_slot(nodes["track_id"], -1, np.int32), cls=cls,
        parent=per_slot(parent, -1, np.int64), is_gpu=per_slot(nodes["is_gpu"], False, bool),
        n_event_slots=n_ev_slots, ops=op_info, insts=insts, steps=steps,
        step_complete=complete, rank_steps=rank_steps, breakdown=breakdown, ranks=job_ranks,
        devices=devices, grad_numel=Lazy({}, lambda: _grad_numel(owner.cursor(), job)),
        bounds=Bounds(sel.steps, sel.ranks), replayed_ranks=replayed,
        step_reported=reported, partial=int(partial.sum()), frontier=frontier,
        world_size=world, **_waited(con, job, slot_of, n_slots, op_slot, dst, lag))


def _waited(con: duckdb.DuckDBPyConnection, job: str, slot_of: SlotIndex, n_slots: int,
            op_slot: np.ndarray, dst: np.ndarray, lag: np.ndarray) -> dict:
    """ReplayGraph.waited and wait_ns: per slot, is it a GPU op of view gpu_wait_gaps, the
    one definition of an unexplained gap (analysis/sql/62_unexplained_gaps.sql), so the
    projected path marks the same waits the measured one does
    (``analysis.critical_path._waited``), and its wait. None when none is; the view is read
    only when some GPU op's start waited longer than GAP_FLOOR_NS on every edge into it
    (rarely, on most traces)."""
    start = np.zeros(2 * n_slots, dtype=bool)
    start[2 * op_slot] = True
    cand = np.unique(dst[start[dst] & (lag > GAP_FLOOR_NS)])
    if not len(cand):
        return {}
    into = np.isin(dst, cand)
    least = np.full(2 * n_slots, np.inf)
    np.minimum.at(least, dst[into], lag[into])
    if not (least[cand] > GAP_FLOOR_NS).any():
        return {}
    w = con.execute("SELECT rank, eid, wait_ns FROM gpu_wait_gaps WHERE job = ?",
                    [job]).fetchnumpy()
    s = slot_of(w["rank"], w["eid"])
    if not (s >= 0).any():
        return {}
    waited = np.zeros(n_slots, dtype=bool)
    waited[s[s >= 0]] = True
    wait_ns = np.zeros(n_slots)
    wait_ns[s[s >= 0]] = w["wait_ns"][s >= 0]
    return {"waited": waited, "wait_ns": wait_ns}


def _read_graph(con: duckdb.DuckDBPyConnection, sel: _Selection
                ) -> tuple[dict, dict, SlotIndex, int]:
    """The selection's nodes (cp_nodes; plus the fixed points outside it that edges into it
    start from, ``frontier`` True), its edges (rank_edges into its nodes; point and kind as
    small integers), the slot index, and how many fixed points there are."""
    cols = ("rank, eid, ts_ns, end_ns, coalesce(track_id, -1) AS track_id, "
            "coalesce(parent_eid, -1) AS parent_eid, coalesce(is_gpu, FALSE) AS is_gpu, "
            f"{_case('cls', CLASSES)} AS cls")
    nodes = _fetch(con, f"SELECT {cols} FROM cp_nodes WHERE {sel.where()}", sel.params)
    if len(nodes["eid"]) == 0:
        raise ValueError(f"job {sel.job!r} has no events on CPU threads or GPU streams"
                         + (" in the bounds given" if sel.lo is not None else ""))
    edge_cols = (f"e.rank, e.src_eid, (e.src_point = 'end')::TINYINT AS sp, e.dst_eid, "
                 f"(e.dst_point = 'end')::TINYINT AS dp, {_case('e.kind', KIND_NAMES)} AS kind")
    nodes["frontier"] = np.zeros(len(nodes["eid"]), dtype=bool)
    if sel.lo is None:  # whole ranks: every edge of them
        e = _fetch(con, f"SELECT {edge_cols} FROM rank_edges e WHERE {sel.where('e')}",
                   sel.params)
        return nodes, e, SlotIndex(nodes["rank"], nodes["eid"], dense=True), 0
    e = _fetch(con, f"""SELECT {edge_cols} FROM rank_edges e
                        SEMI JOIN (SELECT rank, eid FROM cp_nodes WHERE {sel.where()}) n
                          ON n.rank = e.rank AND n.eid = e.dst_eid
                        WHERE {sel.where('e', times=False)}""", sel.params)
    inner = SlotIndex(nodes["rank"], nodes["eid"], dense=False)
    out = inner(e["rank"], e["src_eid"]) < 0
    if out.any():  # sources outside: fixed points at their measured times
        key = np.unique((e["rank"][out].astype(np.int64) << 40) | e["src_eid"][out])
        con.register("_frontier", pa.table({"rank": (key >> 40).astype(np.int32),
                                            "eid": key & ((1 << 40) - 1)}))
        try:
            fr = _fetch(con, f"""SELECT {cols} FROM cp_nodes SEMI JOIN _frontier f
                                 ON f.rank = cp_nodes.rank AND f.eid = cp_nodes.eid
                                 WHERE {sel.where(times=False)}""", sel.params)
        finally:
            con.unregister("_frontier")
        fr["frontier"] = np.ones(len(fr["eid"]), dtype=bool)
        nodes = {k: np.concatenate([nodes[k], fr[k]]) for k in nodes}
    n_front = int(nodes["frontier"].sum())
    return nodes, e, SlotIndex(nodes["rank"], nodes["eid"], dense=False), n_front


def _concat(parts: list[tuple]) -> tuple[np.ndarray, ...]:
    """Edge columns (src, dst, kind, role, op, inst) from parts whose scalars broadcast."""
    n = [len(p[0]) for p in parts]
    dtypes = (np.int64, np.int64, np.int8, np.int8, np.int64, np.int64)
    out = []
    for c, dt in enumerate(dtypes):
        out.append(np.concatenate([np.broadcast_to(np.asarray(p[c], dtype=dt), (k,))
                                   for p, k in zip(parts, n, strict=True)]))
    return tuple(out)


def _identity_weights(ptr: np.ndarray, dst: np.ndarray, lag: np.ndarray, kind: np.ndarray,
                      role: np.ndarray, slot_rank: np.ndarray, ranks: np.ndarray
                      ) -> np.ndarray:
    """Per edge (grouped by destination, ``ptr``): its lag when it is its point's binding
    edge (the smallest lag into it) or not FIXED, else the median binding lag of its kind on
    its rank (0 for CPU program order); arrival edges 0 (a barrier waits for the last
    arrival)."""
    from .simulate import smallest_in_edges

    binding = smallest_in_edges(ptr, lag)
    base_w = lag.copy()
    fixed = role == FIXED
    relax = fixed & ~binding
    cpu = kind == _CPU_ORDER
    held = np.flatnonzero(relax & cpu)  # program order held back by something else: no work
    base_w[held] = np.minimum(lag[held], 0.0)
    other = np.flatnonzero(relax & ~cpu)
    if len(other):
        ref = np.flatnonzero(binding & fixed & ~cpu)

        def key(e: np.ndarray) -> np.ndarray:
            return (kind[e].astype(np.int64) * (len(ranks) + 1)
                    + np.searchsorted(ranks, slot_rank[dst[e] >> 1]))

        floor = _group_median(key(other), key(ref), lag[ref])
        base_w[other] = np.minimum(lag[other], floor)
    base_w[role == ARRIVAL] = 0.0
    return base_w


def _instances(ci: dict, inst_all: np.ndarray, used: np.ndarray, names_all: np.ndarray,
               n_inst: int, inst_idx: np.ndarray, ci_rel: np.ndarray) -> dict:
    """ReplayGraph.insts, per replayed instance, from its rows on every rank of the job.
    A point-to-point pair's group is its two ranks, its transfer the receive's end after
    the later of the two posts (``_pair_transfer_ns``)."""
    rows = inst_all >= 0
    ii = inst_all[rows]
    first = np.full(n_inst, -1, dtype=np.int64)
    first[ii[::-1]] = np.flatnonzero(rows)[::-1]
    dur = (ci["end_ns"] - ci["ts_ns"]).astype(np.float64)
    transfer = _transfer_ns(dur[rows], ii, n_inst)
    pair = np.char.startswith(names_all[used].astype(str), "p2p:")
    if pair.any():
        recv = ci["kind"][rows].astype(str) == "recv"
        xfer = _pair_transfer_ns(ci_rel[rows], (ci["end_ns"][rows] - ci["ts_ns"][rows]
                                                + ci_rel[rows]), recv, ii, n_inst)
        transfer = np.where(pair, xfer, transfer)
    members: list[list[int]] = [[] for _ in range(n_inst)]
    for i, r in zip(ii.tolist(), ci["rank"][rows].tolist(), strict=True):
        members[i].append(int(r))
    group_ranks = []
    for i in range(n_inst):
        g, size = ci["group_ranks"][first[i]], ci["group_size"][first[i]]
        if pair[i]:  # a send and its receive: the two ranks' link
            group_ranks.append(sorted(members[i]))
        elif g is not None and len(g):
            group_ranks.append(sorted(int(r) for r in g))
        elif size is not None and not np.isnan(size) and int(size) > len(members[i]):
            group_ranks.append(list(range(int(size))))
        else:
            group_ranks.append(sorted(members[i]))

    def num(col: str) -> np.ndarray:
        v = ci[col][first]
        return np.array([np.nan if x is None else float(x) for x in v.tolist()])

    step = num("step")
    # an all-to-all's bytes per pair of ranks, from each rank's split sizes (alltoall.py)
    splits: dict[int, dict[int, tuple]] = {}
    kinds = ci["kind"].astype(str)
    for row in np.flatnonzero(rows & (kinds == "all_to_all")).tolist():
        splits.setdefault(int(inst_all[row]), {})[int(ci["rank"][row])] = (
            ci["in_split_sizes"][row], ci["in_bytes"][row])
    pairs = [pair_bytes(len(group_ranks[i]), splits[i], sorted(splits[i]))
             if i in splits and sorted(splits[i]) == group_ranks[i] else None
             for i in range(n_inst)]
    return {
        "instance": names_all[used],
        "collective": ci["collective"][first].astype(str),
        # collective_ranks.kind; a pair is one message: 'send' from both of its ends
        "kind": np.where(pair, "send", ci["kind"][first].astype(str)),
        "bytes": num("bytes"),
        "pg_desc": ci["pg_desc"][first],
        "group_ranks": group_ranks,
        "transfer_ns": transfer,
        "n_ranks": np.bincount(inst_idx, minlength=n_inst),  # replayed ranks in it
        "step": np.where(np.isnan(step), -1, step).astype(np.int64),  # on its first rank
        "elem_bytes": num("elem_bytes"),
        "pair_bytes": pairs,  # n x n bytes group rank i sends to j, None: uniform (S / n)
    }


def unpaired_p2p(graph: ReplayGraph) -> int:
    """How many of the graph's collective instances are point-to-point calls (send / recv)
    that collective_ranks could not pair (no peer recorded, or the peer not traced) in a
    group of more than two ranks: matched by position on every rank of the group, such an
    instance ties a send to every rank of the group (not to its peer) and its transfer
    starts at the group's last arrival. The identity replay is still exact (the measured
    waits are kept); a network what-if would price it wrong, so it is refused
    (docs/collectives.md). Paired calls ('p2p:' instances) are two-rank dependencies."""
    ins = graph.insts
    p2p = np.isin(ins["kind"], ("send", "recv"))
    p2p &= ~np.char.startswith(ins["instance"].astype(str), "p2p:")
    wide = np.array([len(g) > 2 for g in ins["group_ranks"]], dtype=bool)
    return int((p2p & wide).sum())


def _pair_transfer_ns(start: np.ndarray, end: np.ndarray, recv: np.ndarray,
                      inst_idx: np.ndarray, n_inst: int) -> np.ndarray:
    """Per point-to-point pair, its transfer: the receive's end - the later of the two posts
    (0 at least). Not the shortest span, as for a collective: a send that was buffered ends
    before its receive is posted, and says nothing of the link."""
    post = np.full(n_inst, -np.inf)
    np.maximum.at(post, inst_idx, start)
    got = np.full(n_inst, -np.inf)
    np.maximum.at(got, inst_idx[recv], end[recv])
    out = got - post
    return np.where(np.isfinite(out), np.maximum(out, 0.0), 0.0)


def _op_details(con: duckdb.DuckDBPyConnection, sel: _Selection, slot_of: SlotIndex,
                op_slot: np.ndarray) -> dict:
    """The GPU ops' kind, name, category, op_name and shapes, aligned with ``op_slot``."""
    d = _fetch(con, _OPS_DETAIL_SQL.format(where=sel.where("g")), sel.params)
    where = np.full(slot_of.n, -1, dtype=np.int64)
    s = slot_of(d["rank"], d["eid"])
    ok = s >= 0
    where[s[ok]] = np.flatnonzero(ok)
    row = where[op_slot]
    return {k: d[k][row] for k in ("kind", "name", "category", "op_name", "dims", "types",
                                   "concrete")}


def _transfer_ns(x_dur: np.ndarray, inst_idx: np.ndarray, n_inst: int) -> np.ndarray:
    """Per instance, the transfer without the waiting: the shortest of its ranks' own times
    in the collective (kernel or gloo span), i.e. the last arrival's. A collective ends
    together on every rank, so a rank that arrived earlier spent the difference waiting for
    the last; the last one's time is end minus last arrival, measured on one rank's clock
    (no clock offset enters it, where end and arrival on two ranks' aligned clocks would
    carry the offsets' error: up to 0.9 ms on the 2021 BERT pair). It never exceeds any
    rank's own time, so a transfer's duration edge never binds in the identity replay, and
    it is what sizes a collective the trace does not (``model.effective_bytes``). When a
    group's ranks are not all traced the shortest traced one may still include waiting.
    Taken over every rank of the job, replayed or not (``_instances``)."""
    transfer = np.full(n_inst, np.inf)
    np.minimum.at(transfer, inst_idx, x_dur)
    return transfer


def _grad_numel(con: duckdb.DuckDBPyConnection, job: str) -> dict[int, int]:
    """ReplayGraph.grad_numel: per step, the elements of the gradients accumulated (the sum
    over AccumulateGrad calls of their gradient's shape, the first Input Dims entry)."""
    out: dict[int, int] = {}
    for step, dims in con.execute(_GRADS_SQL, [job]).fetchall():
        try:
            shape = json.loads(dims)[0]
            n = int(np.prod([int(d) for d in shape]))
        except (ValueError, TypeError, IndexError):
            continue
        out[int(step)] = out.get(int(step), 0) + n
    return out


def _steps(con: duckdb.DuckDBPyConnection, sel: _Selection, slot_of: SlotIndex,
           inside: np.ndarray, t0: np.ndarray, origin: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """(steps, complete, reported, rank_steps) of the replay: the job steps (job_steps),
    whether each is reported (False for the neighbours of a --steps range, read so that the
    range's steps tile as in the whole job: the step before starts no earlier than its
    measured start, the step after starts where the range ends), and ReplayGraph.rank_steps:
    per (rank, step) row of the steps view, the point whose time starts it (start_node +
    start_off) and the points whose latest time ends it (end_node + end_off per end_row),
    where the view's rules need them: a tiled rank's last step (its annotation and the GPU
    ops launched in it), every window that is not tiled. A time window (--window) starts at
    its first event's start and ends at the latest end of the events inside it, each kept at
    its distance to the window's bound, so the identity gives its bounds."""
    rank_sql = "" if sel.ranks is None else f" AND rank IN ({', '.join(map(str, sel.ranks))})"
    if sel.steps is None:
        in_range, cond = "TRUE", "TRUE"
    else:
        a, b = sel.steps
        in_range = f"step BETWEEN {a} AND {b}"
        cond = (f"{in_range} OR (tiled AND (next_step BETWEEN {a} AND {b} "
                f"OR prev_step BETWEEN {a} AND {b}))")
    st = _fetch(con, f"""
        WITH s AS (
            SELECT rank, step, coalesce(start_eid, -1) AS start_eid, coalesce(eid, -1) AS eid,
                   tiled, side = 'window' AS is_window, start_ns - $o AS start_t,
                   end_ns - $o AS end_t, step = max(step) OVER (PARTITION BY rank) AS last,
                   lead(step) OVER (PARTITION BY rank ORDER BY step) AS next_step,
                   lag(step) OVER (PARTITION BY rank ORDER BY step) AS prev_step
            FROM steps WHERE job = $job{rank_sql})
        SELECT rank, step, start_eid, eid, tiled, is_window, start_t, end_t, last,
               {in_range} AS reported
        FROM s WHERE {cond} ORDER BY rank, step""", {"job": sel.job, "o": origin})
    js = _fetch(con, "SELECT step, complete FROM job_steps WHERE job = $job ORDER BY step",
                {"job": sel.job})
    keep = np.isin(js["step"], st["step"]) if sel.steps is not None else slice(None)
    steps = np.asarray(js["step"][keep], dtype=np.int64)
    complete = np.asarray(js["complete"][keep], dtype=bool)
    reported = (np.ones(len(steps), dtype=bool) if sel.steps is None
                else (steps >= sel.steps[0]) & (steps <= sel.steps[1]))
    if len(steps) == 0:  # no ProfilerStep (inference, a custom loop): the whole trace, as
        # the critical path does; step number NO_STEP
        steps, complete = np.array([NO_STEP], dtype=np.int64), np.array([True])
        reported = np.array([True])
    n = len(st["rank"])
    rank = np.asarray(st["rank"], dtype=np.int64)
    ctx = ~np.asarray(st["reported"], dtype=bool)  # a neighbour of the range
    start_slot = slot_of(rank, st["start_eid"])
    start_ok = (start_slot >= 0) & ~ctx
    start_ok[start_ok] = inside[start_slot[start_ok]]
    start_node = np.where(start_ok, 2 * start_slot, -1)
    start_off = np.zeros(n)
    fixed = np.where(start_ok, np.nan, st["start_t"]).astype(np.float64)
    ends = (st["last"] | ~st["tiled"]) & ~ctx  # rows whose end is their latest point
    ps_slot = slot_of(rank, st["eid"])
    ps_ok = ends & (ps_slot >= 0)
    ps_ok[ps_ok] = inside[ps_slot[ps_ok]]
    ps = np.flatnonzero(ps_ok)
    step_sql = "" if sel.steps is None else f" AND step BETWEEN {sel.steps[0]} AND {sel.steps[1]}"
    ops = _fetch(con, f"SELECT rank, eid, step FROM step_gpu_ops WHERE job = $job{rank_sql}"
                      f"{step_sql}", {"job": sel.job})
    op_slot = slot_of(ops["rank"], ops["eid"])
    ok = op_slot >= 0
    ok[ok] = inside[op_slot[ok]]
    ops = {k: v[ok] for k, v in ops.items()}
    op_slot = op_slot[ok]
    # each op's row: rows are sorted by (rank, step), so one searchsorted on a packed key
    row_key = (rank << 32) + np.asarray(st["step"], dtype=np.int64)
    op_key = (ops["rank"].astype(np.int64) << 32) + ops["step"].astype(np.int64)
    op_row = np.full(len(op_key), -1, dtype=np.int64)
    if n:
        pos = np.minimum(np.searchsorted(row_key, op_key), n - 1)
        op_row = np.where(row_key[pos] == op_key, pos, -1)
    op_end = op_row >= 0
    op_end[op_end] = ends[op_row[op_end]]
    end_row = [ps, ps, op_row[op_end]]
    end_node = [2 * ps_slot[ps], 2 * ps_slot[ps] + 1, 2 * op_slot[op_end] + 1]
    end_off = [np.zeros(len(ps)), np.zeros(len(ps)), np.zeros(int(op_end.sum()))]
    for i in np.flatnonzero(st["is_window"] & ~ctx):  # the window's first and last event
        r = np.searchsorted(slot_of.ranks, rank[i])
        if r >= len(slot_of.ranks) or slot_of.ranks[r] != rank[i]:
            continue
        lo = slot_of.base[r]
        sl = lo + np.flatnonzero(inside[lo:lo + slot_of.sizes[r]])
        s_t, e_t = t0[2 * sl], t0[2 * sl + 1]
        within = (s_t >= st["start_t"][i]) & (e_t <= st["end_t"][i])
        if not within.any():
            continue
        first = sl[within][np.argmin(s_t[within])]
        start_node[i], fixed[i] = 2 * first, np.nan
        start_off[i] = st["start_t"][i] - t0[2 * first]
        # the end: the latest end of the work inside, kept at its distance to the bound
        end_row.append(np.full(int(within.sum()), i))
        end_node.append(2 * sl[within] + 1)
        end_off.append(np.full(int(within.sum()), st["end_t"][i] - e_t[within].max()))
    rank_steps = {
        "rank": rank, "step_idx": np.searchsorted(steps, st["step"]),
        "tiled": np.asarray(st["tiled"], dtype=bool),
        "start_node": start_node, "start_off": start_off, "start_fixed": fixed,
        "end_row": np.concatenate(end_row).astype(np.int64),
        "end_node": np.concatenate(end_node).astype(np.int64),
        "end_off": np.concatenate(end_off).astype(np.float64)}
    return steps, complete, reported, rank_steps


def _group_median(key: np.ndarray, ref_key: np.ndarray, ref_value: np.ndarray) -> np.ndarray:
    """Per element of ``key``: the median of ``ref_value`` over the reference elements with
    the same key (0 where the key has none)."""
    out = np.zeros(len(key))
    if not len(ref_key):
        return out
    o = np.lexsort((ref_value, ref_key))
    k, v = ref_key[o], ref_value[o]
    uniq, start, count = np.unique(k, return_index=True, return_counts=True)
    med = (v[start + (count - 1) // 2] + v[start + count // 2]) / 2
    pos = np.minimum(np.searchsorted(uniq, key), len(uniq) - 1)
    hit = uniq[pos] == key
    out[hit] = med[pos[hit]]
    return out
