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

Arrays are in topological order (``order``), with in-edges as CSR (``indptr``, ``src``), so
``tracetool.replay.simulate`` schedules them in one compiled pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import duckdb
import numpy as np

from tracetool.analysis.critical_path import Slots
from tracetool.graph import CLASSES, KIND_NAMES

# roles of an edge in the replay: what a scenario may change about it
FIXED, OP_DURATION, COMM_DURATION, TRANSFER, ARRIVAL = range(5)
_COLLECTIVE = KIND_NAMES.index("collective")
_CPU_ORDER = KIND_NAMES.index("cpu_order")
_GPU_ORDER = KIND_NAMES.index("gpu_order")
NO_STEP = -1  # ReplayGraph.steps of a job without ProfilerStep: one window, the whole trace


@dataclass
class ReplayGraph:
    """One job's replay graph. Node n is point (n & 1: 0 start, 1 end) of slot n >> 1; slots
    are (rank, eid) of the events, then one per collective barrier."""

    job: str
    origin_ns: int  # times below are ns after this
    t0: np.ndarray  # float64 per node: measured time
    order: np.ndarray  # int64: nodes in topological order
    indptr: np.ndarray  # int64, n_nodes + 1: in-edges of node n are indptr[n]:indptr[n + 1]
    src: np.ndarray  # int64 per edge: source node
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
    # GPU ops (duration edges)
    ops: dict  # rank, eid, slot, kind, name, category, op_name, dims, types, dur
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
    ranks: np.ndarray  # ranks of the job
    devices: list[str]  # deviceProperties names of the job
    # job step -> elements of the gradients autograd accumulated in it (the model's
    # parameters, from AccumulateGrad's Input Dims; empty without record_shapes)
    grad_numel: dict[int, int] = field(default_factory=dict)

    @property
    def n_nodes(self) -> int:
        return len(self.t0)

    @property
    def n_edges(self) -> int:
        return len(self.src)


_NODES_SQL = """
SELECT rank, eid, ts_ns, end_ns, track_id, coalesce(parent_eid, -1) AS parent_eid, is_gpu,
       list_position(?, cls) - 1 AS cls
FROM cp_nodes WHERE job = ?"""

# the edges within each rank (the cross-rank 'collective' ones are replaced by barriers)
_EDGES_SQL = """
SELECT rank AS rank_src, src_eid, (src_point = 'end')::TINYINT AS sp, rank AS rank_dst,
       dst_eid, (dst_point = 'end')::TINYINT AS dp,
       (list_position(?, kind) - 1)::TINYINT AS kind, lag_ns
FROM rank_edges WHERE job = ?"""

_OPS_SQL = """
SELECT g.rank, g.eid, g.kind, g.name, coalesce(k.category, g.kind) AS category,
       coalesce(g.is_comm, FALSE) AS is_comm, g.op_name,
       o.args->>'Input Dims' AS dims, o.args->>'Input type' AS types
FROM gpu_ops g JOIN cp_nodes n ON n.job = g.job AND n.rank = g.rank AND n.eid = g.eid
LEFT JOIN kernels k ON k.job = g.job AND k.rank = g.rank AND k.eid = g.eid
LEFT JOIN events o ON o.job = g.job AND o.rank = g.rank AND o.eid = g.op_eid
WHERE g.job = ?"""

# one instance = one collective call on every rank of its group: collective_ranks.instance,
# the key the critical path and collective_instances use (analysis/sql/40_collectives.sql);
# calls it could not match (instance NULL) are no barrier
_INSTANCES_SQL = """
SELECT c.rank, c.instance, coalesce(c.kernel_eid, c.gloo_eid) AS x_eid, c.collective,
       c.kind, c.pg_desc, c.group_size,
       CASE WHEN coalesce(c.group_ranks_truncated, FALSE) THEN NULL ELSE c.group_ranks END
           AS group_ranks, c.bytes, c.step, c.elem_bytes
FROM collective_ranks c JOIN cp_nodes n ON n.job = c.job AND n.rank = c.rank
 AND n.eid = coalesce(c.kernel_eid, c.gloo_eid)
WHERE c.job = ? AND c.instance IS NOT NULL"""

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


def build_graph(con: duckdb.DuckDBPyConnection, job: str) -> ReplayGraph:
    """The replay graph of ``job`` (``con`` from ``tracetool.connect``), from the graph its
    ranks' ingest stored."""
    ev = con.execute(_NODES_SQL, [list(CLASSES), job]).fetchnumpy()
    if len(ev["eid"]) == 0:
        raise ValueError(f"job {job!r} has no events on CPU threads or GPU streams")
    slot_of = Slots.of(ev["rank"], ev["eid"])
    ranks, sizes, n_ev_slots = slot_of.ranks, slot_of.sizes, slot_of.n
    slot = slot_of(ev["rank"], ev["eid"])
    origin = int(min(ev["ts_ns"].min(), ev["end_ns"].min()))

    # -- collective instances: one barrier slot each
    ci = _columns(con.execute(_INSTANCES_SQL, [job]))
    ci["rank"] = ci["rank"].astype(np.int64)
    ci["x_eid"] = ci["x_eid"].astype(np.int64)
    inst_names, inst_idx = np.unique(ci["instance"].astype(str), return_inverse=True)
    n_inst = len(inst_names)
    n_slots = n_ev_slots + n_inst
    is_node = np.zeros(n_slots, dtype=bool)
    is_node[slot] = True
    is_node[n_ev_slots:] = True

    t0 = np.zeros(2 * n_slots, dtype=np.float64)
    t0[2 * slot] = ev["ts_ns"] - origin
    t0[2 * slot + 1] = ev["end_ns"] - origin

    # -- GPU ops and their duration edges
    ops = {c: _unmasked(a) for c, a in con.execute(_OPS_SQL, [job]).fetchnumpy().items()}
    op_slot = slot_of(ops["rank"], ops["eid"])
    x_slot = slot_of(ci["rank"], ci["x_eid"])
    x_inst = np.full(n_slots, -1, dtype=np.int64)
    x_inst[x_slot] = inst_idx
    barrier_slot = n_ev_slots + np.arange(n_inst)
    b_time = np.full(n_inst, -np.inf)
    np.maximum.at(b_time, inst_idx, t0[2 * x_slot])
    t0[2 * barrier_slot] = b_time
    t0[2 * barrier_slot + 1] = b_time

    # -- recorded edges, minus the ones replaced: cross-rank 'collective' edges (by barriers)
    # and the start -> end order edge of a GPU op or a transfer (by its duration edge)
    e = con.execute(_EDGES_SQL, [KIND_NAMES, job]).fetchnumpy()
    e_src = 2 * slot_of(e["rank_src"], e["src_eid"]) + e["sp"]
    e_dst = 2 * slot_of(e["rank_dst"], e["dst_eid"]) + e["dp"]
    timed = np.zeros(n_slots, dtype=bool)
    timed[op_slot] = True
    timed[x_slot] = True
    self_edge = (e_src >> 1 == e_dst >> 1) & (e["sp"] == 0) & (e["dp"] == 1) & timed[e_src >> 1]
    keep = ~self_edge
    src_parts = [e_src[keep]]
    dst_parts = [e_dst[keep]]
    kind_parts = [e["kind"][keep].astype(np.int8)]
    role_parts = [np.full(int(keep.sum()), FIXED, dtype=np.int8)]
    op_parts = [np.full(int(keep.sum()), -1, dtype=np.int64)]
    inst_parts = [np.full(int(keep.sum()), -1, dtype=np.int64)]

    # duration edges: compute/memcpy ops scale with the GPU model; transfers with the network
    is_x = x_inst[op_slot] >= 0
    n_ops = len(op_slot)
    src_parts.append(2 * op_slot)
    dst_parts.append(2 * op_slot + 1)
    kind_parts.append(np.full(n_ops, _GPU_ORDER, dtype=np.int8))
    role_parts.append(np.where(is_x, COMM_DURATION, OP_DURATION).astype(np.int8))
    op_parts.append(np.arange(n_ops, dtype=np.int64))
    inst_parts.append(np.where(is_x, x_inst[op_slot], -1))
    gloo_x = x_slot[~np.isin(x_slot, op_slot)]  # transfers on CPU threads (gloo spans)
    gloo_x = np.unique(gloo_x)
    src_parts.append(2 * gloo_x)
    dst_parts.append(2 * gloo_x + 1)
    kind_parts.append(np.full(len(gloo_x), _CPU_ORDER, dtype=np.int8))
    role_parts.append(np.full(len(gloo_x), COMM_DURATION, dtype=np.int8))
    op_parts.append(np.full(len(gloo_x), -1, dtype=np.int64))
    inst_parts.append(x_inst[gloo_x])
    # barriers: arrival (every rank's transfer start -> barrier), transfer (-> every end)
    for a, b, role in ((2 * x_slot, 2 * barrier_slot[inst_idx], ARRIVAL),
                       (2 * barrier_slot[inst_idx], 2 * x_slot + 1, TRANSFER)):
        src_parts.append(a)
        dst_parts.append(b)
        kind_parts.append(np.full(len(a), _COLLECTIVE, dtype=np.int8))
        role_parts.append(np.full(len(a), role, dtype=np.int8))
        op_parts.append(np.full(len(a), -1, dtype=np.int64))
        inst_parts.append(inst_idx.astype(np.int64))

    src = np.concatenate(src_parts)
    dst = np.concatenate(dst_parts)
    kind = np.concatenate(kind_parts)
    role = np.concatenate(role_parts)
    op = np.concatenate(op_parts)
    inst = np.concatenate(inst_parts)
    lag = t0[dst] - t0[src]

    # -- identity weights: binding edges keep their lag, the others shrink (module docstring)
    edge_rank = np.zeros(n_slots, dtype=np.int64)
    edge_rank[slot] = ev["rank"]
    dst_rank = edge_rank[dst >> 1]
    best = np.full(2 * n_slots, np.inf)
    np.minimum.at(best, dst, lag)
    binding = lag == best[dst]
    base_w = lag.copy()
    relax = (role == FIXED) & ~binding
    floor = _group_median(kind.astype(np.int64) * (len(ranks) + 1)
                          + np.searchsorted(ranks, dst_rank), lag,
                          binding & (role == FIXED))
    floor[kind == _CPU_ORDER] = 0.0  # program order held back by something else: no work
    base_w[relax] = np.minimum(lag[relax], floor[relax])
    base_w[role == ARRIVAL] = 0.0  # a barrier waits for the last arrival, not a fixed lag

    # -- CSR by destination (deterministic whatever order DuckDB returned the rows in),
    # nodes in topological order
    by_dst = np.lexsort((src, kind, dst))  # ties between in-edges go to the earlier kind
    src, dst, kind, role, op, inst, lag, base_w = (
        a[by_dst] for a in (src, dst, kind, role, op, inst, lag, base_w))
    n_nodes = 2 * n_slots
    indptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.add.at(indptr, dst + 1, 1)
    indptr = np.cumsum(indptr)
    from .simulate import topological_order

    order, breaks = topological_order(indptr, src, t0)

    # -- per-slot attributes
    def per_slot(values: np.ndarray, fill: int, dtype: type) -> np.ndarray:
        out = np.full(n_slots, fill, dtype=dtype)
        out[slot] = values
        return out

    pe = ev["parent_eid"]
    parent = np.where((pe >= 0) & (pe < sizes[np.searchsorted(ranks, ev["rank"])]),
                      slot_of(ev["rank"], np.maximum(pe, 0)), -1)
    parent = np.where(is_node[np.maximum(parent, 0)], parent, -1)
    cls = per_slot(ev["cls"], CLASSES.index("cpu"), np.int8)
    cls[n_ev_slots:] = CLASSES.index("comm")

    # -- steps (the analysis views' definition, docs/steps.md)
    js = con.execute("SELECT step, complete FROM job_steps WHERE job = ? ORDER BY step",
                     [job]).fetchnumpy()
    steps = np.asarray(js["step"], dtype=np.int64)
    rank_steps = _rank_steps(con, job, steps, slot_of, is_node, t0, origin)
    complete = np.asarray(js["complete"], dtype=bool)
    if len(steps) == 0:  # no ProfilerStep (inference, a custom loop): the whole trace, as
        # the critical path does; step number NO_STEP
        steps, complete = np.array([NO_STEP], dtype=np.int64), np.array([True])
    bd = con.execute(
        """SELECT b.rank, b.eid, b.what FROM breakdown_events b JOIN cp_nodes n
           ON n.job = b.job AND n.rank = b.rank AND n.eid = b.eid
           WHERE b.job = ? AND b.what <> 'cpu'""", [job]).fetchnumpy()
    breakdown = {"slot": slot_of(bd["rank"], bd["eid"]),
                 "what": np.array([CLASSES.index(w) for w in bd["what"].tolist()],
                                  dtype=np.int8)}

    # -- what the models need: GPU op details, instance sizes and groups
    dims, types = ops["dims"], ops["types"]
    op_info = {
        "rank": ops["rank"], "eid": ops["eid"], "slot": op_slot, "kind": ops["kind"],
        "name": ops["name"], "category": ops["category"], "op_name": ops["op_name"],
        "dims": dims, "types": types,
        "dur": t0[2 * op_slot + 1] - t0[2 * op_slot],
    }
    transfer = _transfer_ns(t0[2 * x_slot + 1] - t0[2 * x_slot], inst_idx, n_inst)
    first = np.full(n_inst, -1, dtype=np.int64)
    first[inst_idx[::-1]] = np.arange(len(inst_idx))[::-1]
    members: list[list[int]] = [[] for _ in range(n_inst)]
    for i, r in zip(inst_idx.tolist(), ci["rank"].tolist(), strict=True):
        members[i].append(int(r))
    group_ranks = []
    for i in range(n_inst):
        g, size = ci["group_ranks"][first[i]], ci["group_size"][first[i]]
        if g:
            group_ranks.append(sorted(int(r) for r in g))
        elif size is not None and int(size) > len(members[i]):
            group_ranks.append(list(range(int(size))))
        else:
            group_ranks.append(sorted(members[i]))
    nbytes = np.array([np.nan if b is None else float(b) for b in ci["bytes"]])
    # a transfer's own duration edge is the transfer alone (the last arrival's duration)
    comm_dur = role == COMM_DURATION
    base_w[comm_dur] = transfer[inst[comm_dur]]
    insts = {
        "instance": inst_names,
        "collective": ci["collective"][first].astype(str),
        "kind": ci["kind"][first].astype(str),  # collective_ranks.kind
        "bytes": nbytes[first],
        "pg_desc": ci["pg_desc"][first],
        "group_ranks": group_ranks,
        "transfer_ns": transfer,
        "n_ranks": np.bincount(inst_idx, minlength=n_inst),
        "step": np.array([-1 if s is None else int(s) for s in ci["step"][first]],
                         dtype=np.int64),  # the step of the call on its first rank
        "elem_bytes": np.array([np.nan if b is None else float(b)
                                for b in ci["elem_bytes"][first]]),
    }
    devices = [d for (d,) in con.execute(
        "SELECT DISTINCT unnest(device_names) FROM trace_files WHERE job = ? ORDER BY 1",
        [job]).fetchall() if d]
    return ReplayGraph(
        job=job, origin_ns=origin, t0=t0, order=order, indptr=indptr, src=src, lag=lag,
        base_w=base_w, kind=kind, role=role, op=op, inst=inst, cycle_breaks=int(breaks),
        rank=per_slot(ev["rank"], -1, np.int32),
        eid=per_slot(ev["eid"], -1, np.int64), track=per_slot(ev["track_id"], -1, np.int32),
        cls=cls, parent=per_slot(parent, -1, np.int64),
        is_gpu=per_slot(ev["is_gpu"], False, bool), n_event_slots=n_ev_slots,
        ops=op_info, insts=insts, steps=steps, step_complete=complete,
        rank_steps=rank_steps, breakdown=breakdown, ranks=ranks, devices=devices,
        grad_numel=_grad_numel(con, job))


def _transfer_ns(x_dur: np.ndarray, inst_idx: np.ndarray, n_inst: int) -> np.ndarray:
    """Per instance, the transfer without the waiting: the shortest of its ranks' own times
    in the collective (kernel or gloo span), i.e. the last arrival's. A collective ends
    together on every rank, so a rank that arrived earlier spent the difference waiting for
    the last; the last one's time is end minus last arrival, measured on one rank's clock
    (no clock offset enters it, where end and arrival on two ranks' aligned clocks would
    carry the offsets' error: up to 0.9 ms on the 2021 BERT pair). It never exceeds any
    rank's own time, so a transfer's duration edge never binds in the identity replay, and
    it is what sizes a collective the trace does not (``model.effective_bytes``). When a
    group's ranks are not all traced the shortest traced one may still include waiting."""
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


def _rank_steps(con: duckdb.DuckDBPyConnection, job: str, steps: np.ndarray, slot_of: Slots,
                is_node: np.ndarray, t0: np.ndarray, origin: int) -> dict:
    """ReplayGraph.rank_steps: per (rank, step) row of the steps view, the point whose time
    starts it (start_node + start_off) and the points whose latest time ends it (end_node +
    end_off per end_row), where the view's rules need them: a tiled rank's last step (its
    annotation and the GPU ops launched in it), every window that is not tiled. A time
    window (--window) starts at its first event's start and ends at the latest end of the
    events inside it, each kept at its distance to the window's bound, so the identity gives
    its bounds."""
    st = {k: _unmasked(v) for k, v in con.execute(
        """SELECT rank, step, coalesce(start_eid, -1) AS start_eid, coalesce(eid, -1) AS eid,
                  tiled, side = 'window' AS is_window, start_ns - $o AS start_t,
                  end_ns - $o AS end_t,
                  step = max(step) OVER (PARTITION BY rank) AS last
           FROM steps WHERE job = $job ORDER BY rank, step""",
        {"job": job, "o": origin}).fetchnumpy().items()}
    n = len(st["rank"])
    rank = np.asarray(st["rank"], dtype=np.int64)
    start_slot = np.where(st["start_eid"] >= 0, slot_of(rank, np.maximum(st["start_eid"], 0)),
                          -1)
    start_ok = (start_slot >= 0) & is_node[np.maximum(start_slot, 0)]
    start_node = np.where(start_ok, 2 * start_slot, -1)
    start_off = np.zeros(n)
    fixed = np.where(start_ok, np.nan, st["start_t"]).astype(np.float64)
    ends = st["last"] | ~st["tiled"]  # rows whose end is their latest point
    ps_slot = np.where(st["eid"] >= 0, slot_of(rank, np.maximum(st["eid"], 0)), -1)
    ps = np.flatnonzero(ends & (ps_slot >= 0) & is_node[np.maximum(ps_slot, 0)])
    ops = con.execute(
        """SELECT o.rank, o.eid, o.step FROM step_gpu_ops o JOIN cp_nodes n ON n.job = o.job
           AND n.rank = o.rank AND n.eid = o.eid WHERE o.job = ?""", [job]).fetchnumpy()
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
    end_node = [2 * ps_slot[ps], 2 * ps_slot[ps] + 1,
                2 * slot_of(ops["rank"][op_end], ops["eid"][op_end]) + 1]
    end_off = [np.zeros(len(ps)), np.zeros(len(ps)), np.zeros(int(op_end.sum()))]
    for i in np.flatnonzero(st["is_window"]):  # the window's first and last event on the rank
        lo, hi = slot_of.base[np.searchsorted(slot_of.ranks, rank[i])] + np.array(
            [0, slot_of.sizes[np.searchsorted(slot_of.ranks, rank[i])]])
        sl = np.arange(lo, hi)[is_node[lo:hi]]
        s_t, e_t = t0[2 * sl], t0[2 * sl + 1]
        inside = (s_t >= st["start_t"][i]) & (e_t <= st["end_t"][i])
        if not inside.any():
            continue
        first = sl[inside][np.argmin(s_t[inside])]
        start_node[i], fixed[i] = 2 * first, np.nan
        start_off[i] = st["start_t"][i] - t0[2 * first]
        # the end: the latest end of the work inside, kept at its distance to the bound
        end_row.append(np.full(int(inside.sum()), i))
        end_node.append(2 * sl[inside] + 1)
        end_off.append(np.full(int(inside.sum()), st["end_t"][i] - e_t[inside].max()))
    return {
        "rank": rank, "step_idx": np.searchsorted(steps, st["step"]),
        "tiled": np.asarray(st["tiled"], dtype=bool),
        "start_node": start_node, "start_off": start_off, "start_fixed": fixed,
        "end_row": np.concatenate(end_row).astype(np.int64),
        "end_node": np.concatenate(end_node).astype(np.int64),
        "end_off": np.concatenate(end_off).astype(np.float64)}


def _unmasked(a: np.ndarray) -> np.ndarray:
    """A fetched column without numpy's mask: NULL text becomes None (hashable, falsy)."""
    if not np.ma.isMaskedArray(a):
        return a
    if a.dtype == object:
        out = np.asarray(a.data, dtype=object).copy()
        out[np.ma.getmaskarray(a)] = None
        return out
    return a.filled(-1)


def _group_median(key: np.ndarray, value: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per element: the median of ``value`` over the ``ref`` elements with the same ``key``
    (0 where the key has none)."""
    out = np.zeros(len(key))
    if not ref.any():
        return out
    k, v = key[ref], value[ref]
    o = np.lexsort((v, k))
    k, v = k[o], v[o]
    uniq, start, count = np.unique(k, return_index=True, return_counts=True)
    med = (v[start + (count - 1) // 2] + v[start + count // 2]) / 2
    pos = np.searchsorted(uniq, key)
    hit = (pos < len(uniq)) & (uniq[np.minimum(pos, len(uniq) - 1)] == key)
    out[hit] = med[pos[hit]]
    return out


def _columns(cur: duckdb.DuckDBPyConnection) -> dict[str, np.ndarray]:
    """A small result as one object array per column (lists stay lists)."""
    rows = cur.fetchall()
    out = {}
    for i, d in enumerate(cur.description):
        col = np.empty(len(rows), dtype=object)
        col[:] = [r[i] for r in rows]
        out[d[0]] = col
    return out


def parse_shapes(dims: str | None, types: str | None) -> tuple[list, list] | None:
    """Input Dims / Input type of an op from their JSON text, None when absent."""
    if not dims or not types:
        return None
    try:
        d, t = json.loads(dims), json.loads(types)
    except ValueError:
        return None
    return (d, t) if isinstance(d, list) and isinstance(t, list) else None
