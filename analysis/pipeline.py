"""A job's pipeline as the what-ifs need it: its stages in order, and per complete step each
stage's forward and backward chunk times, its work before and after the pipeline, and the
transfers between stages (docs/pipeline.md).

The views (analysis/sql/70_pipeline.sql) find the stages and each point-to-point call's
place; this module cuts each stage's step at its calls into compute segments and says which
chunks each segment holds: a forward chunk ends at its activation's send (the last stage's
starts at its activation's receive), a backward chunk ends at its gradient's send (the first
stage's starts at its gradient's receive). Segments that hold one kind of chunk give the
stage's forward and backward times (least squares); the first and the last segment of the
step hold the work outside the pipeline (data, the optimizer) besides their chunks. Each
stage's busy time is kept whole: what the chunks do not explain stays in the work before
and after, and the rest is shared among its chunks in the measured forward : backward ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from tracetool.errors import InputError

# backward : forward time of a chunk when a stage's trace cannot tell them apart (every
# segment holds both, or neither alone): the usual 2 (a backward pass computes the gradients
# of the inputs and of the weights, each about a forward's work); docs/pipeline.md
DEFAULT_BWD_RATIO = 2.0


class NoPipeline(InputError):
    """The job has no pipeline the what-ifs can model (one line: why)."""


@dataclass
class StageStep:
    """One stage in one step: times in ns."""

    rank: int
    start_ns: int  # the rank's step (steps.start_ns)
    dur_ns: int
    pre_ns: float  # work before its pipeline chunks (in the step's first segment)
    post_ns: float  # work after them (the optimizer)
    fwd_ns: float  # one forward chunk (mean)
    bwd_ns: float  # one backward chunk (mean)
    order: str  # chunk_order of pipeline_bubbles
    blocking_sends: int  # sends that held the stage until their transfer ended
    sends: int


@dataclass
class Pipeline:
    job: str
    ranks: list[int]  # by stage
    microbatches: int
    schedule: str  # pipeline_bubbles.schedule, the same in every step
    backend: str  # gloo (CPU ranks) or nccl
    steps: list[int]  # complete job steps with the pipeline on every stage
    measured_ns: dict[int, int]  # job_steps.dur_ns
    stages: dict[int, list[StageStep]]  # per step, by stage
    # per link s -> s + 1: bytes of one activation / one gradient (None: unknown); per step
    # and link, the transfer measured (ns, the median message's), forward and backward
    act_bytes: list[float | None] = field(default_factory=list)
    grad_bytes: list[float | None] = field(default_factory=list)
    act_ns: dict[int, list[float]] = field(default_factory=dict)
    grad_ns: dict[int, list[float]] = field(default_factory=dict)

    @property
    def n_stages(self) -> int:
        return len(self.ranks)

    @property
    def blocking(self) -> bool:
        """Do its sends hold their stage until the transfer ends (dist.send), rather than
        return at once (dist.isend)? Most of them, over every step and stage."""
        n = sum(x.sends for v in self.stages.values() for x in v)
        b = sum(x.blocking_sends for v in self.stages.values() for x in v)
        return n > 0 and 2 * b > n


def find_pipeline(con: duckdb.DuckDBPyConnection, job: str, include_incomplete: bool = False
                  ) -> Pipeline:
    """``job``'s pipeline (``NoPipeline`` when it has none the what-ifs can model: no
    point-to-point chain, several pipelines, microbatch counts or schedules that differ
    between steps or stages)."""
    stages = con.execute("""SELECT pipeline, rank, stage, n_stages FROM pipeline_stages
                            WHERE job = ? ORDER BY pipeline, stage""", [job]).fetchall()
    if not stages:
        raise NoPipeline(f"job {job} has no pipeline: no chain of ranks linked by "
                         "point-to-point send/recv whose first stage begins each step with a "
                         "send (docs/pipeline.md)")
    heads = sorted({p for p, *_ in stages})
    if len(heads) > 1:
        raise NoPipeline(f"job {job} has {len(heads)} pipelines (first stages: ranks "
                         f"{', '.join(map(str, heads))}); the pipeline what-ifs model one")
    ranks = [r for _, r, _, _ in stages]
    n = len(ranks)
    bub = con.execute("""
        SELECT b.step, b.stage, b.rank, b.dur_ns, b.microbatches, b.chunk_order, b.schedule,
               s.start_ns, j.dur_ns, j.complete
        FROM pipeline_bubbles b
        JOIN steps s ON s.job = b.job AND s.rank = b.rank AND s.step = b.step
        JOIN job_steps j ON j.job = b.job AND j.step = b.step
        WHERE b.job = ? ORDER BY b.step, b.stage""", [job]).fetchall()
    by_step: dict[int, list] = {}
    for row in bub:
        by_step.setdefault(row[0], []).append(row)
    steps = [s for s, rows in by_step.items()
             if len(rows) == n and (include_incomplete or rows[0][9])]
    if not steps:
        raise NoPipeline(f"job {job}: no complete step has a point-to-point call on every "
                         "stage of its pipeline")
    mbs = {r[4] for s in steps for r in by_step[s]}
    if len(mbs) != 1:
        raise NoPipeline(f"job {job}: its pipeline's stages or steps ran different numbers of "
                         f"microbatches ({', '.join(map(str, sorted(mbs)))}), so no one count "
                         "can be changed")
    scheds = {by_step[s][0][6] for s in steps}
    m = mbs.pop()
    if m < 1:
        raise NoPipeline(f"job {job}: its pipeline's first stage sends no activation")
    calls = con.execute("""
        SELECT step, stage, kind, direction, microbatch, bytes, block_start_ns, block_end_ns,
               transfer_start_ns, transfer_end_ns, call_end_ns
        FROM pipeline_calls WHERE job = ? ORDER BY step, stage, block_start_ns, eid""",
                        [job]).fetchall()
    backend = "nccl" if con.execute(
        "SELECT count(*) FROM gpu_ops WHERE job = ?", [job]).fetchone()[0] else "gloo"
    per: dict[tuple[int, int], list] = {}
    for c in calls:
        per.setdefault((c[0], c[1]), []).append(c)
    held: dict[tuple[int, int], list] = {}  # other collectives: not the stage's work
    for step, rank, a, b in con.execute(
            "SELECT step, rank, s_ns, e_ns FROM pipeline_waits WHERE job = ? AND "
            "source = 'collective' ORDER BY s_ns", [job]).fetchall():
        held.setdefault((step, rank), []).append((a, b))
    p = Pipeline(job=job, ranks=ranks, microbatches=m,
                 schedule=scheds.pop() if len(scheds) == 1 else "other", backend=backend,
                 steps=sorted(steps), measured_ns={s: by_step[s][0][8] for s in steps},
                 stages={})
    act_b: list[list[float]] = [[] for _ in range(n - 1)]
    grad_b: list[list[float]] = [[] for _ in range(n - 1)]
    for s in p.steps:
        p.stages[s] = []
        p.act_ns[s] = [np.inf] * (n - 1)
        p.grad_ns[s] = [np.inf] * (n - 1)
        for st in range(n):
            row = by_step[s][st]
            cs = per.get((s, st), [])
            p.stages[s].append(_stage_step(st, n, m, row[2], row[7], row[3], row[5], cs,
                                           held.get((s, row[2]), [])))
        # each message: from the later of its send's and its receive's posts to the
        # receive's transfer end (the rendezvous' transfer); per link and direction the
        # median of the step's
        sends = {(st, c[3], c[4]): c[6] for st in range(n) for c in per.get((s, st), [])
                 if c[2] == "send"}
        xfer: dict[tuple[int, str], list[float]] = {}
        for st in range(n):
            for c in per.get((s, st), []):
                if c[2] != "recv" or c[9] is None:
                    continue
                fwd = c[3] == "forward"
                peer = st - 1 if fwd else st + 1
                link = st - 1 if fwd else st
                post = max(c[6], sends.get((peer, c[3], c[4]), c[6]))
                xfer.setdefault((link, c[3]), []).append(max(0.0, c[9] - post))
                if c[5] is not None:
                    (act_b if fwd else grad_b)[link].append(c[5])
        for (link, d), v in xfer.items():
            (p.act_ns if d == "forward" else p.grad_ns)[s][link] = float(np.median(v))
        for v in (p.act_ns[s], p.grad_ns[s]):
            for i, x in enumerate(v):
                v[i] = 0.0 if not np.isfinite(x) else float(x)
    p.act_bytes = [float(np.median(b)) if b else None for b in act_b]
    p.grad_bytes = [float(np.median(b)) if b else None for b in grad_b]
    return p


def _stage_step(stage: int, n: int, m: int, rank: int, start: int, dur: int, order: str,
                calls: list, held: list[tuple[int, int]]) -> StageStep:
    """Cut one stage's step at its point-to-point calls (``calls``: pipeline_calls rows,
    by block start) and time its chunks (module docstring); the time ``held`` in other
    collectives is no segment's work."""
    end = start + dur
    k = len(calls)
    seg = np.zeros(k + 1)
    comp = np.zeros((k + 1, 2))  # forward, backward chunks in each segment

    def work(a: float, b: float) -> float:
        return max(0.0, b - a) - sum(max(0.0, min(b, y) - max(a, x)) for x, y in held)

    t = start
    for i, c in enumerate(calls):
        seg[i] = work(t, min(c[6], end))
        t = max(t, min(c[7], end))
        fwd = c[3] == "forward"
        if c[2] == "send":  # the chunk that produced what it sends ends here
            comp[i, 0 if fwd else 1] += 1
        elif (fwd and stage == n - 1) or (not fwd and stage == 0):
            comp[i + 1, 0 if fwd else 1] += 1  # the chunk it feeds, with nothing to send
    seg[k] = work(t, end)
    busy = float(seg.sum())
    inner = slice(1, k)  # the segments between calls: chunks and the time around the calls
    f_hat, b_hat = _fit(comp[inner], seg[inner])
    pre_chunks = comp[0] @ (f_hat, b_hat)
    post_chunks = comp[k] @ (f_hat, b_hat)
    pre = max(0.0, seg[0] - pre_chunks)
    post = max(0.0, seg[k] - post_chunks)
    chunks = max(0.0, busy - pre - post)
    has_b = comp[:, 1].sum() > 0
    ratio = b_hat / f_hat if f_hat > 0 and has_b else (DEFAULT_BWD_RATIO if has_b else 0.0)
    fwd_ns = chunks / m / (1 + ratio)
    # sends the stage waited for: held until their transfer's end (pipeline_calls)
    blocking = sum(1 for c in calls if c[2] == "send" and c[9] is not None and c[7] >= c[9])
    return StageStep(rank=rank, start_ns=start, dur_ns=dur, pre_ns=pre, post_ns=post,
                     fwd_ns=fwd_ns, bwd_ns=fwd_ns * ratio, order=order or "",
                     blocking_sends=blocking, sends=sum(1 for c in calls if c[2] == "send"))


def _fit(comp: np.ndarray, dur: np.ndarray) -> tuple[float, float]:
    """Forward and backward chunk times (ns) that best explain the segments holding chunks:
    least squares (not negative) when the segments tell the two kinds apart; else (every
    segment holds them in the same proportion, e.g. a last stage that always runs a
    microbatch's forward and backward back to back) their total split at
    DEFAULT_BWD_RATIO. A kind no segment holds gets 0."""
    keep = comp.sum(axis=1) > 0
    a, y = comp[keep], dur[keep]
    if not len(a):
        return 0.0, 0.0
    if np.linalg.matrix_rank(a) == 2:
        x, *_ = np.linalg.lstsq(a, y, rcond=None)
        return max(0.0, float(x[0])), max(0.0, float(x[1]))
    nf, nb = a.sum(axis=0)
    ratio = DEFAULT_BWD_RATIO if nf > 0 else 0.0
    per = float(y.sum()) / float(nf + ratio * nb) if nf > 0 else 0.0
    if nf == 0:  # backward chunks only
        return 0.0, float(y.sum()) / float(nb)
    return per, ratio * per if nb > 0 else 0.0
