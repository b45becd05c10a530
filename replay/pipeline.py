"""Pipeline what-ifs: another number of microbatches or another schedule (GPipe, 1F1B),
by re-composing each stage's measured chunks (docs/pipeline.md).

Each stage runs a program of chunks: a forward chunk of microbatch m receives its activation
from the previous stage (not on the first), computes, and sends it on (not on the last); a
backward chunk receives the gradient from the next stage (not on the last), computes, and
sends it back (not on the first). GPipe runs every forward, then every backward; 1F1B runs
min(S - s - 1, N) forwards, then one forward and one backward in turn, then the rest of the
backwards. Between two chunks a stage posts the sends of the one it finished and the
receive of the next at once (Megatron's batched point-to-point) and waits for them; messages
are rendezvous (gloo's, and NCCL's send/recv): one completes at max(the send's post, the
receive's post) + its transfer. Sends the trace shows waited for before the stage's next call
(a blocking send, or a batched isend) are waited for; isends waited for only at the step's
end are not.

The chunk times are the stage's measured ones (``tracetool.analysis.pipeline``); with N
microbatches instead of the traced M, the global batch is the same, so each chunk's work and
each activation's and gradient's bytes are M / N times the traced ones (time linear in the
microbatch's size: an assumption, optimistic for small microbatches, whose fixed per-chunk
costs do not shrink). A transfer is priced by the network model (``network.collective_time``,
a send between the two stages' ranks) when a source network is given, else it is the link's
measured one (per step and direction, the median message's time from the later of its two
posts to its arrival), scaled by the bytes. Work before and after the chunks (data,
the optimizer) and each stage's start in the step stay as measured.

The projected step is the measured step plus the change the model gives: simulated (what-
if) - simulated (the traced schedule and count, same chunks), so what the model does not
see (the CPU time around each call, noise) is kept as measured; the band spans that and the
ratio measured x what-if / traced, widened by the job's step-to-step variation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracetool.analysis.pipeline import Pipeline, find_pipeline
from tracetool.numbers import round_ns

from .band import step_variation, widen
from .compute import WhatIfError
from .model import Scenario
from .network import Network, collective_time

SCHEDULES = ("gpipe", "1f1b")
MAX_MICROBATCHES = 4096


def program(schedule: str, stage: int, n_stages: int, n: int) -> str:
    """The chunk order of ``stage`` under ``schedule`` with ``n`` microbatches: 'F' and 'B'
    (the k-th F is microbatch k's forward, the k-th B its backward)."""
    if schedule == "gpipe":
        return "F" * n + "B" * n
    if schedule == "1f1b":
        w = min(n_stages - stage - 1, n)
        return "F" * w + "FB" * (n - w) + "B" * w
    raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")


@dataclass
class StageModel:
    """One stage of one step, as the simulation takes it (ns)."""

    offset: float  # its step's start after the earliest stage's
    pre: float
    post: float
    fwd: float
    bwd: float


def simulate(orders: list[str], stages: list[StageModel], act: list[float],
             grad: list[float], blocking: bool) -> float:
    """The step's length (ns): from the earliest stage's start to the latest stage's end,
    each stage running its chunk order (``orders``; 'F'/'B'); ``act[s]`` / ``grad[s]``: one
    transfer from stage s to s + 1 / from s + 1 to s. Between two chunks a stage posts, at
    once, the sends of the chunk it finished and the receive of the one it starts next
    (Megatron's batched point-to-point), and waits for the receive, and for the sends too
    when they are ``blocking`` (waited before the next chunk) rather than isends waited at
    the step's end. A message completes at max(send post, receive post) + its transfer.
    WhatIfError when the programs deadlock."""
    n = len(stages)
    t = [s.offset + s.pre for s in stages]
    progs: list[list[tuple]] = []  # per stage: ('c', ns) and ('g', [(is_send, key, ns)])
    for s, (order, st) in enumerate(zip(orders, stages, strict=True)):
        ops: list[tuple] = []
        group: list[tuple] = []
        nf = nb = 0
        for c in order:
            if c == "F":
                if s > 0:
                    group.append((False, (s - 1, s, "F", nf), act[s - 1]))
                ops += [("g", group), ("c", st.fwd)]
                group = [(True, (s, s + 1, "F", nf), act[s])] if s < n - 1 else []
                nf += 1
            else:
                if s < n - 1:
                    group.append((False, (s + 1, s, "B", nb), grad[s]))
                ops += [("g", group), ("c", st.bwd)]
                group = [(True, (s, s - 1, "B", nb), grad[s - 1])] if s > 0 else []
                nb += 1
        ops.append(("g", group))
        progs.append(ops)
    pc = [0] * n
    sent: dict[tuple, float] = {}
    posted: dict[tuple, float] = {}  # receives' posts
    while True:
        moved = False
        for s in range(n):
            ops = progs[s]
            while pc[s] < len(ops):
                op = ops[pc[s]]
                if op[0] == "c":
                    t[s] += op[1]
                else:
                    for is_send, key, _ in op[1]:
                        (sent if is_send else posted).setdefault(key, t[s])
                    waits = [(key, ns, posted if is_send else sent)
                             for is_send, key, ns in op[1] if blocking or not is_send]
                    if any(key not in other for key, _, other in waits):
                        break
                    t[s] = max([t[s]] + [max(t[s], other[key]) + ns
                                         for key, ns, other in waits])
                pc[s] += 1
                moved = True
        if all(pc[s] == len(progs[s]) for s in range(n)):
            break
        if not moved:
            raise WhatIfError("the pipeline's programs deadlock under this schedule: each "
                              "stage waits for a neighbour that waits for it")
    start = min(s.offset for s in stages)
    return max(t[i] + stages[i].post for i in range(n)) - start


@dataclass
class PipelineStep:
    step: int
    measured_ns: int
    projected_ns: int
    low_ns: int
    high_ns: int
    simulated_traced_ns: int
    simulated_ns: int

    @property
    def error(self) -> float:
        return self.projected_ns / self.measured_ns - 1 if self.measured_ns else 0.0


@dataclass
class PipelineResult:
    job: str
    scenario: str
    steps: list[PipelineStep]
    pipeline: dict
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"job": self.job, "scenario": self.scenario, "notes": self.notes,
                "pipeline": self.pipeline,
                "steps": [{"step": s.step, "complete": True,
                           "measured_step_ns": s.measured_ns,
                           "projected_step_ns": s.projected_ns, "low_ns": s.low_ns,
                           "high_ns": s.high_ns, "error": s.error,
                           "simulated_traced_ns": s.simulated_traced_ns,
                           "simulated_ns": s.simulated_ns} for s in self.steps]}


def _title(schedule: str) -> str:
    return {"gpipe": "GPipe", "1f1b": "1F1B"}.get(schedule, schedule)


def check_pipeline_whatif(p: Pipeline, microbatches: int | None, schedule: str | None,
                          network: bool = False) -> tuple[int, str]:
    """The (microbatches, schedule) a what-if asks of pipeline ``p``; WhatIfError for one
    that changes nothing (the traced schedule and count, and no ``network``) or that the
    trace cannot support."""
    if schedule is not None and schedule not in SCHEDULES:
        raise WhatIfError(f"--pipeline-schedule {schedule!r}: give one of "
                          f"{', '.join(SCHEDULES)}")
    if microbatches is not None and not 1 <= microbatches <= MAX_MICROBATCHES:
        raise WhatIfError(f"--microbatches {microbatches}: give 1 to {MAX_MICROBATCHES}")
    traced = p.schedule
    if traced == "forward_only":
        raise WhatIfError(f"job {p.job}: its pipeline runs no backward chunk (inference); "
                          "the what-ifs re-compose training schedules")
    if schedule is None and traced not in SCHEDULES + ("both",):
        raise WhatIfError(f"job {p.job}: its pipeline's schedule is neither GPipe nor 1F1B "
                          f"(stage orders such as {p.stages[p.steps[0]][-1].order!r}); give "
                          "--pipeline-schedule")
    n = microbatches if microbatches is not None else p.microbatches
    sched = schedule if schedule is not None else ("gpipe" if traced == "both" else traced)
    same = traced == sched or (traced == "both" and all(
        program(sched, s, p.n_stages, n) == program("gpipe", s, p.n_stages, n)
        for s in range(p.n_stages)))
    if n == p.microbatches and same and not network:
        raise WhatIfError(f"job {p.job} ran {_title(sched)} with {n} microbatches already: "
                          "the pipeline what-if changes nothing")
    return n, sched


def replay_pipeline(p: Pipeline, microbatches: int | None = None, schedule: str | None = None,
                    source_network: Network | None = None, network: Network | None = None,
                    label: str = "", keep_size: bool = False) -> PipelineResult:
    """Project every complete step of ``p`` under another microbatch count and/or schedule
    (module docstring); ``network`` (needs ``source_network``) prices the transfers on
    another network too; ``keep_size``: N microbatches of the traced size (the global batch
    grows N / M times) instead of the traced batch split into N."""
    n, sched = check_pipeline_whatif(p, microbatches, schedule, network is not None)
    if network is not None and source_network is None:
        raise WhatIfError(f"job {p.job}: give --source-network, the network the trace ran "
                          "on, to price its transfers on another")
    if network is not None and network.placement is not None:
        network.placement.check_covers(len(p.ranks), p.job)
    m = p.microbatches
    k = 1.0 if keep_size else m / n  # each chunk's share of the traced one
    notes = [f"pipeline of {p.n_stages} stages (ranks {', '.join(map(str, p.ranks))}), "
             f"traced {_title(p.schedule)} with {m} microbatches; projected "
             f"{_title(sched)} with {n}"]
    if n != m and keep_size:
        notes.append(f"microbatches of the traced size: the global batch is {n}/{m} of the "
                     "traced one")
    elif n != m:
        notes.append(f"each chunk's time and each transfer's bytes scaled by {m}/{n}: the "
                     "global batch is kept, split into microbatches of M/N times the size "
                     "(time taken as linear in it)")
    priced = source_network is not None
    if priced and any(b is None for b in p.act_bytes + p.grad_bytes):
        raise WhatIfError(f"job {p.job}: some point-to-point call has no size (record_shapes "
                          "was off), so the network model cannot price it; leave out "
                          "--source-network / --network to use the measured transfers")
    notes.append("transfers priced by the network model (a send between the stages' ranks)"
                 if priced else "transfers: each link's measured transfer (the median "
                 "message's, from the later post to its arrival), scaled by its bytes")
    if p.blocking:
        notes.append("the trace's sends are waited for before the next chunk (dist.send, or "
                     "isends batched with a receive): simulated so")
    steps = []
    variation = step_variation(np.array([p.measured_ns[s] for s in p.steps], dtype=float))
    for s in p.steps:
        stages = p.stages[s]
        t0 = min(x.start_ns for x in stages)
        base = [StageModel(x.start_ns - t0, x.pre_ns, x.post_ns, x.fwd_ns, x.bwd_ns)
                for x in stages]
        new = [StageModel(b.offset, b.pre, b.post, b.fwd * k, b.bwd * k) for b in base]
        act0, grad0 = _transfers(p, s, 1.0, source_network)
        act1, grad1 = _transfers(p, s, k, network or source_network)
        traced_orders = [x.order for x in stages]
        sim0 = simulate(traced_orders, base, act0, grad0, p.blocking)
        sim1 = simulate([program(sched, i, p.n_stages, n) for i in range(p.n_stages)], new,
                        act1, grad1, p.blocking)
        meas = p.measured_ns[s]
        proj = meas + (sim1 - sim0)
        ratio = meas * sim1 / sim0 if sim0 > 0 else proj
        lo, hi = widen(np.array([min(proj, ratio)]), np.array([max(proj, ratio)]), variation)
        steps.append(PipelineStep(step=s, measured_ns=meas, projected_ns=round_ns(proj),
                                  low_ns=round_ns(float(lo[0])), high_ns=round_ns(float(hi[0])),
                                  simulated_traced_ns=round_ns(sim0),
                                  simulated_ns=round_ns(sim1)))
    info = {"ranks": p.ranks, "traced_schedule": p.schedule, "traced_microbatches": m,
            "schedule": sched, "microbatches": n, "keep_microbatch_size": keep_size,
            "blocking_sends": p.blocking,
            "transfers": "network model" if priced else "measured"}
    return PipelineResult(job=p.job, scenario=label or f"pipeline {sched} x{n}", steps=steps,
                          pipeline=info, notes=notes)


def _transfers(p: Pipeline, step: int, scale: float, net: Network | None
               ) -> tuple[list[float], list[float]]:
    """One activation's and one gradient's transfer per link (ns), for microbatches of
    ``scale`` times the traced size: the network model's on ``net``, else the measured."""
    if net is None:
        return ([x * scale for x in p.act_ns[step]], [x * scale for x in p.grad_ns[step]])
    act, grad = [], []
    for i in range(p.n_stages - 1):
        a, b = p.ranks[i], p.ranks[i + 1]
        act.append(1e9 * collective_time(net, "send", (p.act_bytes[i] or 0) * scale, [a, b],
                                         p.backend))
        grad.append(1e9 * collective_time(net, "send", (p.grad_bytes[i] or 0) * scale, [a, b],
                                          p.backend))
    return act, grad


def run_pipeline(con: object, job: str, scenario: Scenario,
                 include_incomplete: bool = False) -> PipelineResult:
    """The pipeline what-if of ``scenario`` (its ``microbatches`` / ``pipeline_schedule``,
    with ``network`` / ``source_network`` for the transfers) on ``job`` of the store open
    on ``con``. WhatIfError for a scenario that also changes what this model does not
    (the GPU, speedups, clocks, --dp-scale), a job without a pipeline, or a what-if that
    changes nothing."""
    others = [name for name, on in (
        ("--gpu", scenario.gpu is not None), ("--speedup", bool(scenario.speedups)),
        ("--gpu-clock / --power-cap", scenario.changes_clock),
        ("--dp-scale", scenario.dp_scale != 1)) if on]
    if others:
        raise WhatIfError(f"{', '.join(others)} cannot be combined with a pipeline what-if "
                          "(--microbatches, --pipeline-schedule), which re-composes the "
                          "measured chunks: run them apart")
    p = find_pipeline(con, job, include_incomplete)  # type: ignore[arg-type]
    return replay_pipeline(p, scenario.microbatches, scenario.pipeline_schedule,
                           scenario.source_network, scenario.network, scenario.label,
                           scenario.keep_microbatch_size)


def render(result: PipelineResult) -> list[str]:
    """The text lines ``tracetool replay`` prints for a pipeline what-if."""
    lines = [f"job {result.job}, scenario: {result.scenario}"]
    lines += [f"note: {n}" for n in result.notes]
    lines.append(f"{'step':>6} {'measured ms':>12} {'projected ms':>13} {'band ms':>22} "
                 f"{'change':>8}")
    for s in result.steps:
        band = f"[{s.low_ns / 1e6:.3f}, {s.high_ns / 1e6:.3f}]"
        lines.append(f"{s.step:>6} {s.measured_ns / 1e6:12.3f} {s.projected_ns / 1e6:13.3f} "
                     f"{band:>22} {100 * s.error:+7.1f}%")
    return lines
