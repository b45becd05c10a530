"""Network ground truth for the replayer: a 2-rank DDP (gloo, CPU) job under shaped networks.

What it builds
    Three network namespaces: ``netlab-r0`` and ``netlab-r1`` (one per rank) and
    ``netlab-sw`` (the switch). Each rank namespace holds one end of a veth pair, ``veth0``,
    with address ``198.18.0.<rank+1>/24``; the other end, ``port<rank>``, is enslaved to the
    bridge ``br0`` in the switch namespace. 198.18.0.0/24 exists only inside these namespaces
    (no route out; the root namespace is never touched except to run ``ip``/``tc``). Each
    bandwidth setting is applied with ``tc qdisc replace dev IF root tbf rate <R> burst 125000
    limit 8388608`` on BOTH ends of every veth (rank egress and switch egress), so each
    direction of each link is capped at R. There is no added delay (netem is not in this
    kernel, see shared/docs/network-lab.md); the base latency is measured with a TCP
    ping-pong between the two rank namespaces under every setting.

What it runs
    For each setting, two processes (ranks 0 and 1), each started with ``ip netns exec
    netlab-r<R> <this python> make_netlab.py --worker ...`` with ``GLOO_SOCKET_IFNAME=veth0``,
    ``MASTER_ADDR=198.18.0.1`` (rank 0's address) and ``MASTER_PORT=29500``, form a gloo
    process group. Each wraps the same MLP (512 -> 2048 -> 1024 -> 1024 -> 10, 4,208,650
    float32 parameters, 16.8 MB of gradients) in ``DistributedDataParallel`` with
    ``bucket_cap_mb=4``, which gives three gradient buckets per backward pass (DDP's rebuilt
    buckets, in backward order: 4,239,400, 8,392,704 and 4,202,496 bytes), and trains it
    with SGD + momentum on synthetic batches of 128 drawn from a per-rank seeded generator,
    ``torch.set_num_threads(1)``.
    After each optimizer step the loss is averaged across ranks with an explicit
    ``dist.all_reduce`` (a small user collective, as in ../make_samples.py).

    Phase 1 (profiled): ``torch.profiler.profile(activities=[CPU], schedule=schedule(wait=1,
    warmup=1, active=6, repeat=1), record_shapes=True, with_stack=False)`` around 9 iterations,
    so the trace holds ``ProfilerStep#2`` .. ``ProfilerStep#7``. Phase 2 (unprofiled): after a
    ``dist.barrier()``, 10 more iterations with no profiler. Every iteration is timed on each
    rank with ``time.perf_counter()`` from ``zero_grad`` to the loss ``.item()`` that follows
    the loss allreduce (``prof.step()`` is outside the timed span, since at the end of the
    active window it exports the trace) - as a training loop would time itself, no barrier.

    The whole sweep is repeated ``--repeats`` times (default 3), settings interleaved
    (repeat 0 of every setting, then repeat 1, ...) so slow drifts in the 2-core machine's
    load hit all settings alike. For each setting the traces of the repeat whose profiled
    median step time is the median over repeats are gzipped (no file name, mtime 0) into
    ``bw_<setting>/rank<R>.pt.trace.json.gz``; everything measured goes to ``measured.json``.
    The namespaces are deleted at the end, also on error, Ctrl-C or SIGTERM (try/finally).

How to run
    As root, with the pinned CPU torch in a separate venv (never an unpinned ``torch``, which
    would pull a multi-GB CUDA build); run nothing else heavy meanwhile (2 cores)::

        python3 -m venv /tmp/torchvenv
        /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
        /tmp/torchvenv/bin/python sample_traces/netlab/make_netlab.py
        /tmp/torchvenv/bin/python sample_traces/netlab/make_netlab.py \\
            --settings 1gbit,200mbit --repeats 1 --out /tmp/netlab

    The default ``--out`` is the directory of this script. A full default run (4 settings x 3
    repeats) takes about 2 minutes on an idle 2-core machine. Seeds make the model,
    data and op sequence repeatable; timings, timestamps, pids/tids naturally differ from run
    to run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD_SIZE = 2
SEED = 1234
BATCH = 128
LAYERS = (512, 2048, 1024, 1024, 10)
BUCKET_CAP_MB = 4
WAIT, WARMUP, ACTIVE = 1, 1, 6
PROFILED_ITERS = WAIT + WARMUP + ACTIVE + 1  # one extra step after the active window closes
UNPROFILED_ITERS = 10
DEFAULT_SETTINGS = "2gbit,1gbit,500mbit,200mbit"
DEFAULT_REPEATS = 3
DEFAULT_OUT = Path(__file__).resolve().parent

NS_SWITCH = "netlab-sw"
NS_RANK = [f"netlab-r{r}" for r in range(WORLD_SIZE)]
RANK_IF = "veth0"
SUBNET_PREFIX = "198.18.0."  # 198.18.0.0/24: benchmarking range, only inside the namespaces
MASTER_PORT = 29500
PINGPONG_PORT = 29600
PINGPONG_ROUNDS, PINGPONG_WARMUP = 3000, 300
TBF = ["burst", "125000", "limit", "8388608"]
WIRE = 1514 / 1448  # Ethernet frame bytes per TCP payload byte for full segments
RUN_TIMEOUT_S = 300


def rank_addr(rank: int) -> str:
    return f"{SUBNET_PREFIX}{rank + 1}"


# --------------------------------------------------------------------------------------------
# units


def rate_bits(setting: str) -> float:
    """tc rate '2gbit' / '500mbit' / '100kbit' -> bits/s (tc's units are powers of 10)."""
    s = setting.strip().lower()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * mult
    raise ValueError(f"bad tc rate {setting!r}: use e.g. 2gbit, 500mbit")


def spec_bandwidth(bits: float) -> str:
    """bits/s -> a tracetool bandwidth string ('1Gbit/s', '500Mbit/s')."""
    if bits >= 1e9 and (bits / 1e9).is_integer():
        return f"{int(bits / 1e9)}Gbit/s"
    return f"{bits / 1e6:g}Mbit/s"


# --------------------------------------------------------------------------------------------
# the network


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def existing_netns() -> set[str]:
    out = sh("ip", "netns", "list").stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def teardown() -> None:
    """Delete our namespaces (their veths and the bridge go with them)."""
    for ns in [*NS_RANK, NS_SWITCH]:
        if ns in existing_netns():
            sh("ip", "netns", "del", ns, check=False)


def setup() -> None:
    stale = existing_netns() & {*NS_RANK, NS_SWITCH}
    if stale:
        print(f"removing stale namespaces from an earlier run: {sorted(stale)}", flush=True)
        teardown()
    for ns in [NS_SWITCH, *NS_RANK]:
        sh("ip", "netns", "add", ns)
    sh("ip", "-n", NS_SWITCH, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", NS_SWITCH, "link", "set", "lo", "up")
    sh("ip", "-n", NS_SWITCH, "link", "set", "br0", "up")
    for rank, ns in enumerate(NS_RANK):
        port = f"port{rank}"
        # create both ends directly inside their namespaces (nothing lands in the root one)
        sh("ip", "-n", ns, "link", "add", RANK_IF, "type", "veth", "peer", "name", port,
           "netns", NS_SWITCH)
        sh("ip", "-n", NS_SWITCH, "link", "set", port, "master", "br0")
        sh("ip", "-n", NS_SWITCH, "link", "set", port, "up")
        sh("ip", "-n", ns, "addr", "add", f"{rank_addr(rank)}/24", "dev", RANK_IF)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", RANK_IF, "up")


def shape(rate: str) -> list[str]:
    """Replace the root qdisc of both ends of every veth with tbf at ``rate``; return the
    resulting qdisc lines (for the record)."""
    shown = []
    ends = [(ns, RANK_IF) for ns in NS_RANK] + [(NS_SWITCH, f"port{r}") for r in range(WORLD_SIZE)]
    for ns, dev in ends:
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
           "rate", rate, *TBF)
        line = sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev).stdout.strip()
        shown.append(f"{ns}/{dev}: {line}")
    return shown


# --------------------------------------------------------------------------------------------
# TCP ping-pong (latency), run inside the namespaces; no torch needed


def pingpong_server(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as srv:
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                b = conn.recv(1)
                if not b:
                    return
                conn.sendall(b)


def pingpong_client(addr: str, port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for i in range(PINGPONG_ROUNDS + PINGPONG_WARMUP):
            t = time.perf_counter_ns()
            conn.sendall(b"x")
            if conn.recv(1) != b"x":
                raise RuntimeError("ping-pong: bad echo")
            if i >= PINGPONG_WARMUP:
                rtts.append(time.perf_counter_ns() - t)
    rtts.sort()
    print(json.dumps({"rounds": len(rtts), "rtt_ns_median": statistics.median(rtts),
                      "rtt_ns_p10": rtts[len(rtts) // 10],
                      "rtt_ns_p90": rtts[9 * len(rtts) // 10]}))


def measure_rtt(script: str) -> dict:
    """1-byte TCP ping-pong from rank 0's namespace to rank 1's, through the bridge."""
    server = subprocess.Popen(["ip", "netns", "exec", NS_RANK[1], sys.executable, script,
                               "--pingpong-server", str(PINGPONG_PORT)])
    try:
        out = subprocess.run(["ip", "netns", "exec", NS_RANK[0], sys.executable, script,
                              "--pingpong-client", rank_addr(1), str(PINGPONG_PORT)],
                             check=True, capture_output=True, text=True, timeout=60).stdout
        # baseline: the same ping-pong over rank 0's own loopback (Python + TCP stack cost)
        lo_server = subprocess.Popen(["ip", "netns", "exec", NS_RANK[0], sys.executable,
                                      script, "--pingpong-server", str(PINGPONG_PORT + 1)])
        try:
            lo = subprocess.run(["ip", "netns", "exec", NS_RANK[0], sys.executable, script,
                                 "--pingpong-client", "127.0.0.1", str(PINGPONG_PORT + 1)],
                                check=True, capture_output=True, text=True, timeout=60).stdout
        finally:
            lo_server.wait(timeout=10)
    finally:
        server.wait(timeout=10)
    res = json.loads(out)
    res["loopback_rtt_ns_median"] = json.loads(lo)["rtt_ns_median"]
    return res


# --------------------------------------------------------------------------------------------
# the DDP job (one rank; runs inside its namespace)


def build_model():
    from torch import nn

    mods = []
    for i, (a, b) in enumerate(zip(LAYERS, LAYERS[1:], strict=False)):
        mods.append(nn.Linear(a, b))
        if i < len(LAYERS) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def run_worker(rank: int, tmp_dir: Path) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.set_num_threads(1)  # 2 ranks on 2 cores: keep intra-op pools from fighting
    torch.manual_seed(SEED)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE,
                            timeout=timedelta(seconds=RUN_TIMEOUT_S))

    model = DDP(build_model(), bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED + rank)
    batches = [
        (torch.randn(BATCH, LAYERS[0], generator=gen),
         torch.randint(0, LAYERS[-1], (BATCH,), generator=gen))
        for _ in range(PROFILED_ITERS + UNPROFILED_ITERS)
    ]
    trace_json = tmp_dir / f"rank{rank}.pt.trace.json"
    losses: list[float] = []

    def train_step(x, y) -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= WORLD_SIZE
        losses.append(round(mean_loss.item(), 4))
        return time.perf_counter() - t0

    dist.barrier()
    profiled = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace_json)),
        record_shapes=True,
        with_stack=False,
    ) as prof:
        for x, y in batches[:PROFILED_ITERS]:
            profiled.append(train_step(x, y))
            prof.step()
    dist.barrier()
    unprofiled = [train_step(x, y) for x, y in batches[PROFILED_ITERS:]]
    dist.barrier()
    dist.destroy_process_group()
    nparams = sum(p.numel() for p in model.parameters())
    (tmp_dir / f"rank{rank}.times.json").write_text(json.dumps({
        "rank": rank,
        "profiled_s": profiled,
        "unprofiled_s": unprofiled,
        "losses": losses,
        "nparams": nparams,
        "grad_bytes": nparams * 4,
        "torch": torch.__version__,
    }))


def cpu_usage() -> tuple[float, float, float]:
    """(wall s, whole-machine user+nice+system CPU s, CPU s of our waited-for children)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    busy = sum(int(v) for v in fields[:3]) / os.sysconf("SC_CLK_TCK")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic(), busy, ru.ru_utime + ru.ru_stime


def foreign_cpu(before: tuple, after: tuple) -> float:
    """Share of the machine's CPU capacity used by processes other than our ranks during a
    run (irq/softirq time, where veth traffic is mostly processed, is not counted)."""
    wall = after[0] - before[0]
    other = (after[1] - before[1]) - (after[2] - before[2])
    return round(max(0.0, other) / (wall * (os.cpu_count() or 1)), 3)


def run_job(script: str, run_dir: Path) -> list[dict]:
    """Start both ranks in their namespaces and wait; returns each rank's times.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GLOO_SOCKET_IFNAME=RANK_IF, MASTER_ADDR=rank_addr(0),
               MASTER_PORT=str(MASTER_PORT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = []
    try:
        for rank, ns in enumerate(NS_RANK):
            log = open(run_dir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, script, "--worker", str(rank),
                 "--tmp", str(run_dir)], env=env, stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for p, _ in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    for rank, (p, _) in enumerate(procs):
        if p.returncode != 0:
            tail = (run_dir / f"rank{rank}.log").read_text()[-3000:]
            raise RuntimeError(f"rank {rank} exited with {p.returncode}:\n{tail}")
    return [json.loads((run_dir / f"rank{r}.times.json").read_text()) for r in range(WORLD_SIZE)]


# --------------------------------------------------------------------------------------------
# reading traces back


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def ns(us: float) -> int:
    return round(us * 1000)


def trace_summary(trace: dict) -> dict:
    """ProfilerStep durations and the gloo:all_reduce spans (ns) of one rank's trace."""
    steps = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                    and e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
    ars = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("name") == "gloo:all_reduce":
            dims = e["args"]["Input Dims"][0]
            numel = 1
            for d in dims:
                numel *= d
            ars.append({"ts": e["ts"], "dur": e["dur"], "numel": numel,
                        "bytes": numel * 4 if e["args"]["Input type"][0] == "float" else None})
    ars.sort(key=lambda a: a["ts"])
    per_step = []
    for s in steps:
        inside = [a for a in ars if s["ts"] <= a["ts"] < s["ts"] + s["dur"]]
        grads = [a for a in inside if a["numel"] > 1]
        # union of the gradient allreduce spans: time the network was busy with gradients
        busy, end = 0.0, None
        for a in grads:
            a_end = a["ts"] + a["dur"]
            if end is None or a["ts"] >= end:
                busy += a["dur"]
                end = a_end
            elif a_end > end:
                busy += a_end - end
                end = a_end
        overlap = []  # share of each span during which another gradient allreduce also ran
        for a in grads:
            a_end = a["ts"] + a["dur"]
            cover = sorted((max(a["ts"], o["ts"]), min(a_end, o["ts"] + o["dur"]))
                           for o in grads if o is not a)
            covered, upto = 0.0, a["ts"]
            for lo, hi in cover:
                lo = max(lo, upto)
                if hi > lo:
                    covered += hi - lo
                    upto = hi
            overlap.append(covered / a["dur"] if a["dur"] else 0.0)
        per_step.append({"name": s["name"], "dur_ns": ns(s["dur"]),
                         "grad_allreduce_ns": [ns(a["dur"]) for a in grads],
                         "grad_allreduce_overlap": overlap,
                         "grad_allreduce_bytes": [a["bytes"] for a in grads],
                         "grad_allreduce_busy_ns": ns(busy)})
    return {"steps": per_step, "distributedInfo": trace.get("distributedInfo")}


def gzip_deterministic(src: Path, dst: Path) -> None:
    """gzip ``src`` to ``dst`` with no file name and mtime 0 in the header."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            shutil.copyfileobj(fin, gz)


def med(xs) -> float:
    return float(statistics.median(xs))


def ms(xs_s) -> list[float]:
    return [round(x * 1e3, 3) for x in xs_s]


# --------------------------------------------------------------------------------------------
# the sweep


def summarize_setting(setting: str, runs: list[dict], rtt: dict, qdiscs: list[str],
                      out_dir: Path, lat_us: float) -> dict:
    bits = rate_bits(setting)
    rate_bytes = bits / 8
    active = slice(WAIT + WARMUP, WAIT + WARMUP + ACTIVE)  # iterations inside the trace window

    def prof_med(run):
        return med([t for r in run["times"] for t in r["profiled_s"][active]])

    # commit the traces of the repeat whose profiled median is the median over repeats
    order = sorted(range(len(runs)), key=lambda i: prof_med(runs[i]))
    chosen = order[(len(order) - 1) // 2]
    bw_dir = out_dir / f"bw_{setting}"
    for rank in range(WORLD_SIZE):
        gzip_deterministic(runs[chosen]["dir"] / f"rank{rank}.pt.trace.json",
                           bw_dir / f"rank{rank}.pt.trace.json.gz")
    committed = [trace_summary(load_trace(bw_dir / f"rank{r}.pt.trace.json.gz"))
                 for r in range(WORLD_SIZE)]
    every = [[trace_summary(load_trace(run["dir"] / f"rank{r}.pt.trace.json"))
              for r in range(WORLD_SIZE)] for run in runs]

    t0 = runs[0]["times"][0]
    grad_bytes = t0["grad_bytes"]
    bucket_bytes = committed[0]["steps"][0]["grad_allreduce_bytes"]
    n = WORLD_SIZE
    ring = 2 * (n - 1) / n

    # per gradient allreduce: the same collective's span on both ranks; the rank that joins
    # last waits least, so min over ranks is the closest to the transfer time itself
    per_bucket: dict[int, dict[str, list[int]]] = {}
    busy_min = []
    for run_tr in every:
        for s0, s1 in zip(run_tr[0]["steps"], run_tr[1]["steps"], strict=True):
            for i, (d0, d1, b) in enumerate(zip(s0["grad_allreduce_ns"], s1["grad_allreduce_ns"],
                                                s0["grad_allreduce_bytes"], strict=True)):
                slot = per_bucket.setdefault(i, {"bytes": b, "all": [], "min": [], "ovl": []})
                slot["all"] += [d0, d1]
                slot["ovl"] += [s0["grad_allreduce_overlap"][i], s1["grad_allreduce_overlap"][i]]
                slot["min"].append(min(d0, d1))
            busy_min.append(min(s0["grad_allreduce_busy_ns"], s1["grad_allreduce_busy_ns"]))
    buckets = []
    for i in sorted(per_bucket):
        b = per_bucket[i]
        buckets.append({
            "bucket": i, "bytes": b["bytes"],
            "measured_ms_median_all_spans": round(med(b["all"]) / 1e6, 3),
            "measured_ms_median_min_over_ranks": round(med(b["min"]) / 1e6, 3),
            "theory_ms": round(ring * b["bytes"] / rate_bytes * 1e3, 3),
            "theory_ms_with_headers": round(ring * b["bytes"] * WIRE / rate_bytes * 1e3, 3),
            "concurrent_share_median": round(med(b["ovl"]), 3),
        })

    prof_all = [t for run in runs for r in run["times"] for t in r["profiled_s"][active]]
    unprof_all = [t for run in runs for r in run["times"] for t in r["unprofiled_s"]]
    return {
        "tc_rate": setting,
        "rate_bits_per_s": bits,
        "tc_qdiscs": qdiscs,
        "network_spec": (f"gpus_per_node=1,inter_node_bw={spec_bandwidth(bits)},"
                         f"inter_node_latency={round(lat_us)}us"),
        "tcp_pingpong": {
            "rtt_us_median": round(rtt["rtt_ns_median"] / 1e3, 1),
            "rtt_us_p10": round(rtt["rtt_ns_p10"] / 1e3, 1),
            "rtt_us_p90": round(rtt["rtt_ns_p90"] / 1e3, 1),
            "one_way_us": round(rtt["rtt_ns_median"] / 2 / 1e3, 1),
            "loopback_rtt_us_median": round(rtt["loopback_rtt_ns_median"] / 1e3, 1),
            "rounds": rtt["rounds"],
        },
        "grad_bytes": grad_bytes,
        "num_buckets": len(bucket_bytes),
        "bucket_bytes": bucket_bytes,
        "traces": {
            "files": [f"bw_{setting}/rank{r}.pt.trace.json.gz" for r in range(WORLD_SIZE)],
            "from_repeat": chosen,
            "profiler_step_ns": {f"rank{r}": [s["dur_ns"] for s in committed[r]["steps"]]
                                 for r in range(WORLD_SIZE)},
            "profiler_step_names": [s["name"] for s in committed[0]["steps"]],
            "profiler_step_ms_median": round(
                med([s["dur_ns"] for c in committed for s in c["steps"]]) / 1e6, 3),
        },
        "wall_ms": {
            "profiled": [{f"rank{r}": ms(run["times"][r]["profiled_s"])
                          for r in range(WORLD_SIZE)} for run in runs],
            "unprofiled": [{f"rank{r}": ms(run["times"][r]["unprofiled_s"])
                            for r in range(WORLD_SIZE)} for run in runs],
            "profiled_median": round(med(prof_all) * 1e3, 3),
            "unprofiled_median": round(med(unprof_all) * 1e3, 3),
            "profiled_median_per_rank": {
                f"rank{r}": round(med([t for run in runs
                                       for t in run["times"][r]["profiled_s"][active]]) * 1e3, 3)
                for r in range(WORLD_SIZE)},
            "unprofiled_median_per_rank": {
                f"rank{r}": round(med([t for run in runs
                                       for t in run["times"][r]["unprofiled_s"]]) * 1e3, 3)
                for r in range(WORLD_SIZE)},
        },
        "allreduce": {
            "buckets": buckets,
            "grad_busy_ms_median": round(med(busy_min) / 1e6, 3),
            "grad_theory_ms": round(ring * sum(bucket_bytes) / rate_bytes * 1e3, 3),
            "grad_theory_ms_with_headers": round(
                ring * sum(bucket_bytes) * WIRE / rate_bytes * 1e3, 3),
            "theory_formula": "2*(n-1)/n * bytes / (rate/8), n=2",
            "with_headers": f"the same times {WIRE:.4f} = 1514/1448: tbf counts whole Ethernet "
                            "frames, a full TCP segment carries 1448 payload bytes (MTU 1500, "
                            "IPv4 + TCP with timestamps) in a 1514-byte frame",
            "notes": "measured_ms_median_min_over_ranks: per collective, the shorter of the two "
                     "ranks' gloo:all_reduce spans (the rank that joins last waits least); "
                     "concurrent_share_median: share of a bucket's span during which another "
                     "gradient allreduce ran too (gloo has 2 runloop threads, so buckets share "
                     "the link); grad_busy_ms_median: union of a step's gradient allreduce "
                     "spans, min over ranks, median over steps; all over every repeat's traces",
        },
        "other_cpu_share_per_repeat": [run["foreign"] for run in runs],
        "losses_rank0": [run["times"][0]["losses"] for run in runs],
    }


def sweep(settings: list[str], repeats: int, out_dir: Path) -> dict:
    script = str(Path(__file__).resolve())
    results: dict[str, dict] = {s: {"runs": []} for s in settings}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracetool-netlab-") as tmp:
        setup()
        try:
            for rep in range(repeats):
                for setting in settings:
                    qdiscs = shape(setting)
                    if rep == 0:
                        results[setting]["qdiscs"] = qdiscs
                        results[setting]["rtt"] = measure_rtt(script)
                    run_dir = Path(tmp) / f"{setting}-rep{rep}"
                    t = time.monotonic()
                    cpu0 = cpu_usage()
                    times = run_job(script, run_dir)
                    results[setting]["runs"].append({"dir": run_dir, "times": times,
                                                     "foreign": foreign_cpu(cpu0, cpu_usage())})
                    prof = med([x for r in times for x in r["profiled_s"][WAIT + WARMUP:-1]])
                    print(f"repeat {rep} {setting:>8}: profiled median step "
                          f"{prof * 1e3:7.1f} ms, run {time.monotonic() - t:5.1f} s, other "
                          f"processes' CPU {results[setting]['runs'][-1]['foreign']:.0%}",
                          flush=True)
        finally:
            teardown()
        left = existing_netns() & {*NS_RANK, NS_SWITCH}
        if left:
            raise RuntimeError(f"namespaces left behind: {sorted(left)}")
        # one latency for every spec: tbf does not delay an idle link, so the per-setting
        # ping-pong medians differ only by noise; use their median, half the round trip
        lat_us = med([results[s]["rtt"]["rtt_ns_median"] for s in settings]) / 2 / 1e3
        out = {}
        for setting in settings:
            r = results[setting]
            out[setting] = summarize_setting(setting, r["runs"], r["rtt"], r["qdiscs"], out_dir,
                                             lat_us)
    first = results[settings[0]]["runs"][0]["times"][0]
    return {
        "generator": "sample_traces/netlab/make_netlab.py",
        "job": {
            "world_size": WORLD_SIZE, "backend": "gloo", "model": f"MLP {LAYERS}",
            "nparams": first["nparams"], "batch": BATCH, "bucket_cap_mb": BUCKET_CAP_MB,
            "profiler_schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE},
            "profiled_iters": PROFILED_ITERS, "unprofiled_iters": UNPROFILED_ITERS,
            "repeats": repeats,
            "profiled_median_uses": f"iterations {WAIT + WARMUP}..{WAIT + WARMUP + ACTIVE - 1} "
                                    "(the profiled ones), pooled over ranks and repeats",
            "unprofiled_median_uses": "all unprofiled iterations, pooled over ranks and repeats",
            "wall_time_span": "perf_counter from zero_grad to loss.item() after the loss "
                              "allreduce, per rank, no barrier; prof.step() excluded",
        },
        "network": {
            "latency_us_in_specs": round(lat_us),
            "latency_note": "inter_node_latency in the specs is half the median round trip of "
                            "a 1-byte TCP ping-pong (Python, TCP_NODELAY) between the rank "
                            "namespaces, pooled over settings. It is an upper bound for the "
                            "link: the same ping-pong over one namespace's loopback "
                            "(tcp_pingpong.loopback_rtt_us_median) costs nearly as much, so "
                            "the veth + bridge path itself adds only a few us each way.",
            "topology": "each rank in its own netns, one veth to a bridge in a switch netns",
            "addresses": [rank_addr(r) for r in range(WORLD_SIZE)],
            "shaping": "tc qdisc replace dev IF root tbf rate <R> " + " ".join(TBF)
                       + " on both ends of every veth; no added delay",
        },
        "environment": {
            "torch": first["torch"], "python": platform.python_version(),
            "kernel": platform.release(), "cpus": os.cpu_count(),
        },
        "elapsed_s": round(time.monotonic() - started, 1),
        "settings": out,
    }


def print_table(measured: dict) -> None:
    print(f"{'setting':>8} {'prof ms':>8} {'unprof ms':>9} {'PS# ms':>8} "
          f"{'busy ms':>8} {'theory':>8}  per-bucket min-over-ranks / theory (ms)")
    for setting, s in measured["settings"].items():
        w, a = s["wall_ms"], s["allreduce"]
        per = ", ".join(f"{b['measured_ms_median_min_over_ranks']:.1f}/{b['theory_ms']:.1f}"
                        for b in a["buckets"])
        print(f"{setting:>8} {w['profiled_median']:8.1f} {w['unprofiled_median']:9.1f} "
              f"{s['traces']['profiler_step_ms_median']:8.1f} {a['grad_busy_ms_median']:8.1f} "
              f"{a['grad_theory_ms']:8.1f}  {per}")


def check_outputs(measured: dict, out_dir: Path) -> list[str]:
    problems = []
    for setting, s in measured["settings"].items():
        for rank in range(WORLD_SIZE):
            path = out_dir / f"bw_{setting}" / f"rank{rank}.pt.trace.json.gz"
            trace = load_trace(path)
            info = trace.get("distributedInfo") or {}
            if not trace.get("traceEvents"):
                problems.append(f"{path}: no traceEvents")
            if info.get("rank") != rank or info.get("world_size") != WORLD_SIZE:
                problems.append(f"{path}: missing or wrong distributedInfo: {info!r}")
            if len(s["traces"]["profiler_step_ns"][f"rank{rank}"]) != ACTIVE:
                problems.append(f"{path}: expected {ACTIVE} ProfilerStep events")
            print(f"{path.relative_to(out_dir)}: {path.stat().st_size} bytes, "
                  f"{len(trace['traceEvents'])} events")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--settings", default=DEFAULT_SETTINGS,
                        help=f"comma-separated tc rates (default: {DEFAULT_SETTINGS})")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"runs per setting (default: {DEFAULT_REPEATS})")
    # internal modes, used inside the namespaces
    parser.add_argument("--worker", type=int, metavar="RANK", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pingpong-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--pingpong-client", nargs=2, metavar=("ADDR", "PORT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker is not None:
        run_worker(args.worker, args.tmp)
        return 0
    if args.pingpong_server is not None:
        pingpong_server(args.pingpong_server)
        return 0
    if args.pingpong_client is not None:
        pingpong_client(args.pingpong_client[0], int(args.pingpong_client[1]))
        return 0

    if os.geteuid() != 0:
        print("needs root (ip netns, tc)", file=sys.stderr)
        return 2
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in settings:
        rate_bits(s)  # validate before touching the network
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: 1-minute load average is {load:.2f}; other work on this machine "
              "inflates the step times (see other_cpu_share_per_repeat in measured.json)",
              file=sys.stderr, flush=True)
    # a SIGTERM also unwinds through the try/finally that deletes the namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    measured = sweep(settings, args.repeats, out_dir)
    (out_dir / "measured.json").write_text(json.dumps(measured, indent=1) + "\n")
    print_table(measured)
    problems = check_outputs(measured, out_dir)
    meds = [measured["settings"][s]["wall_ms"]["unprofiled_median"]
            for s in sorted(settings, key=rate_bits, reverse=True)]
    if any(b < a for a, b in zip(meds, meds[1:], strict=False)):
        problems.append(f"unprofiled median step time does not grow as bandwidth shrinks: {meds}")
    print(f"total {measured['elapsed_s']} s; namespaces left: "
          f"{sorted(existing_netns() & {*NS_RANK, NS_SWITCH}) or 'none'}")
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
