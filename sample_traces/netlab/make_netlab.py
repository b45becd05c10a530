"""Network ground truth for the replayer: gloo (CPU) training jobs under shaped networks.

What it builds
    Network namespaces ``netlab-r0`` .. ``netlab-r<N-1>`` (one per rank; N = 2, or 4 when a
    4-rank setting is asked for) and ``netlab-sw`` (the switch). Each rank namespace holds one
    end of a veth pair, ``veth0``, with address ``198.18.0.<rank+1>/24``; the other end,
    ``port<rank>``, is a port of the bridge ``br0`` in the switch namespace. 198.18.0.0/24
    exists only inside these namespaces (no route out; the root namespace is never touched
    except to run ``ip``/``tc``).

    Bandwidth: each setting replaces the root qdisc of BOTH ends of every veth with ``tc qdisc
    replace dev IF root tbf rate <R> burst 125000 limit 8388608``, so each direction of each
    link is capped at R.

    Latency: netem is not in this kernel (shared/docs/network-lab.md). A setting with an added
    one-way delay D runs one delay line per rank namespace: ``delayline.c`` (next to this
    script, compiled with gcc into a temporary directory at run time, against libnetfilter_queue
    and libmnl) bound to NFQUEUE queue <rank>, behind ``iptables-legacy -t mangle -A PREROUTING
    -i veth0 -j NFQUEUE --queue-num <rank>`` in that namespace. It holds every packet a rank
    receives for D (from the kernel's receive timestamp, on CLOCK_MONOTONIC; see delayline.c)
    and accepts it, so each direction of each path gets +D and a TCP round trip +2D. Checked
    under every setting with a 1-byte TCP ping-pong between ranks 0 and 1 (the round trip must
    grow by 2D within a tolerance), and the delay lines report what they held, how late they
    released (mean/max) and that nothing was dropped (ENOBUFS, the kernel queue's drop
    counters).

What it runs
    Settings are named ``<rate>`` (2 ranks, DDP, no delay: the original ``bw_<rate>/``),
    ``lat_<rate>_<delay>`` (the same job with an added one-way delay, e.g. ``lat_1gbit_5ms``),
    ``w4_<rate>[_<delay>]`` (the same DDP job on 4 ranks) and ``a2a_<rate>[_<delay>]`` (a
    4-rank mixture-of-experts step with all-to-all). Every rank is a process started with
    ``ip netns exec netlab-r<R> [taskset -c <R mod ncpu>] <python> make_netlab.py --worker R``,
    ``GLOO_SOCKET_IFNAME=veth0``, ``MASTER_ADDR=198.18.0.1``, ``MASTER_PORT=29500``, gloo
    backend, ``torch.set_num_threads(1)``; 4-rank jobs are pinned (taskset) two ranks per core,
    2-rank jobs are not (as in the original data).

    ``ddp_allreduce``: the same MLP (512 -> 2048 -> 1024 -> 1024 -> 10, 4,208,650 float32
    parameters, 16.8 MB of gradients) in ``DistributedDataParallel`` with ``bucket_cap_mb=4``,
    three gradient buckets per backward pass (4,239,400, 8,392,704 and 4,202,496 bytes), SGD +
    momentum, synthetic batches from per-rank seeded generators; a global batch of 256 (128 per
    rank on 2 ranks, 64 on 4).

    ``moe_all_to_all``: per rank 1024 tokens of width 256; a shared Linear(256, 256) + ReLU, a
    dispatch ``dist.all_to_all_single`` (an equal share of every rank's tokens to every rank's
    expert: fixed-capacity routing), this rank's expert (Linear 256 -> 512, ReLU, 512 -> 256,
    not synchronised), a combine all-to-all back, a residual and a shared Linear(256, 10) head.
    Backward runs the two all-to-alls again (an autograd function around
    ``dist.all_to_all_single``), then the shared parameters' gradients are averaged with one
    flat ``dist.all_reduce`` (as DDP would, without overlap). 4 all-to-alls of 1 MiB per rank
    per step.

    Both jobs average the loss across ranks with an explicit ``dist.all_reduce`` after each
    optimizer step. Phase 1 (profiled): ``torch.profiler.profile(activities=[CPU],
    schedule=schedule(wait=1, warmup=1, active=6, repeat=1), record_shapes=True,
    with_stack=False)`` around 9 iterations, so the trace holds ``ProfilerStep#2`` ..
    ``ProfilerStep#7``. Phase 2 (unprofiled): after a ``dist.barrier()``, 10 more iterations
    with no profiler. Every iteration is timed on each rank with ``time.perf_counter()`` from
    ``zero_grad`` to the loss ``.item()`` that follows the loss allreduce (``prof.step()`` is
    outside the timed span, since at the end of the active window it exports the trace) - as a
    training loop would time itself, no barrier.

    The whole sweep is repeated ``--repeats`` times (default 3), settings interleaved (repeat 0
    of every setting, then repeat 1, ...) so slow drifts in the machine's load hit all settings
    alike. For each setting the traces of the repeat whose profiled median step time is the
    median over repeats are gzipped (no file name, mtime 0) into ``<dir>/rank<R>.pt.trace.json.gz``;
    everything measured goes to ``measured.json``. Delay lines are stopped and namespaces
    deleted at the end, also on error, Ctrl-C, SIGTERM or SIGHUP (try/finally); stale
    ``netlab-*`` namespaces of an interrupted run (and any process left in them) are removed
    at the start.

How to run
    As root, with the pinned CPU torch in a separate venv (never an unpinned ``torch``, which
    would pull a multi-GB CUDA build), and for delay settings gcc, iptables and the
    libnetfilter-queue headers; run nothing else meanwhile (2 cores)::

        apt-get install -y gcc iptables libnetfilter-queue-dev libmnl-dev
        python3 -m venv /tmp/torchvenv
        /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
        /tmp/torchvenv/bin/python sample_traces/netlab/make_netlab.py      # the full sweep
        /tmp/torchvenv/bin/python sample_traces/netlab/make_netlab.py \\
            --settings lat_1gbit_5ms,w4_1gbit,a2a_1gbit_2ms --repeats 1 --out /tmp/netlab

    The default ``--out`` is the directory of this script; ``--tables measured.json`` prints
    the README's tables of a run. The full default run (17 settings x 3 repeats) is estimated
    at 10-12 minutes on an idle 2-core machine. Seeds make the model, data
    and op sequence repeatable; timings, timestamps, pids/tids naturally differ from run to run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEED = 1234
LAYERS = (512, 2048, 1024, 1024, 10)
DDP_GLOBAL_BATCH = 256  # 128 per rank on 2 ranks (the original job), 64 on 4
BUCKET_CAP_MB = 4
MOE_TOKENS, MOE_HIDDEN, MOE_FFN, MOE_CLASSES = 1024, 256, 512, 10  # per rank
WAIT, WARMUP, ACTIVE = 1, 1, 6
PROFILED_ITERS = WAIT + WARMUP + ACTIVE + 1  # one extra step after the active window closes
UNPROFILED_ITERS = 10
DDP, MOE = "ddp_allreduce", "moe_all_to_all"
DEFAULT_SETTINGS = ",".join([
    "2gbit", "1gbit", "500mbit", "200mbit",  # bandwidth, 2 ranks (bw_<rate>/)
    "lat_1gbit_1ms", "lat_1gbit_2ms", "lat_1gbit_5ms", "lat_1gbit_10ms",  # + one-way delay
    "lat_200mbit_5ms", "lat_2gbit_5ms",  # bandwidth x latency
    "w4_1gbit", "w4_500mbit", "w4_1gbit_5ms",  # 4 ranks
    "a2a_1gbit", "a2a_500mbit", "a2a_1gbit_2ms", "a2a_1gbit_5ms",  # all-to-all, 4 ranks
])
DEFAULT_REPEATS = 3
DEFAULT_OUT = Path(__file__).resolve().parent
HERE = Path(__file__).resolve().parent

MAX_WORLD = 4
NS_SWITCH = "netlab-sw"
NS_RANK = [f"netlab-r{r}" for r in range(MAX_WORLD)]
RANK_IF = "veth0"
SUBNET_PREFIX = "198.18.0."  # 198.18.0.0/24: benchmarking range, only inside the namespaces
MASTER_PORT = 29500
PINGPONG_PORT = 29600
PINGPONG = {"plain": (3000, 300), "delayed": (200, 20)}  # (rounds, warm-up rounds)
TBF = ["burst", "125000", "limit", "8388608"]
WIRE = 1514 / 1448  # Ethernet frame bytes per TCP payload byte for full segments
RUN_TIMEOUT_S = 300
IPTABLES = "iptables-legacy"
DELAY_MAXLEN, DELAY_RCVBUF = 65536, 64 << 20
# the TCP ping-pong round trip with delay D must be base + 2D, within -RTT_SHORT_US and
# +(RTT_TOLERANCE_US + RTT_TOLERANCE_SHARE * 2D) (the endpoints wake from idle after each
# delayed packet, which costs tens of us on this VM); the delay lines must release packets
# DELAY_LATE_MAX_US late at most on average
RTT_SHORT_US, RTT_TOLERANCE_US, RTT_TOLERANCE_SHARE = 50.0, 300.0, 0.05
DELAY_LATE_MAX_US = 50.0
SYSCTLS = ["net.ipv4.tcp_congestion_control", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
           "net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_slow_start_after_idle"]
INSTALL_HINT = "apt-get install -y gcc iptables libnetfilter-queue-dev libmnl-dev"


def rank_addr(rank: int) -> str:
    return f"{SUBNET_PREFIX}{rank + 1}"


# --------------------------------------------------------------------------------------------
# settings and units


@dataclass(frozen=True)
class Setting:
    name: str  # the key in measured.json["settings"]
    dir: str  # where its traces go, relative to --out
    rate: str  # tc rate
    delay_us: float  # added one-way delay
    world: int
    pattern: str  # DDP or MOE

    @property
    def family(self) -> tuple[str, int]:
        """Settings of one family run the same job, so their traces replay onto each other."""
        return self.pattern, self.world


_SETTING = re.compile(r"^(?:(bw|lat|w4|a2a)_)?(\d+(?:\.\d+)?[kmg]?bit)"
                      r"(?:_(\d+(?:\.\d+)?)(ms|us))?$")


def parse_setting(text: str) -> Setting:
    """'1gbit' / 'bw_1gbit' (2 ranks, DDP, no delay: dir bw_1gbit), 'lat_1gbit_5ms', 'w4_1gbit',
    'w4_1gbit_5ms', 'a2a_1gbit_2ms' (4 ranks, all-to-all)."""
    m = _SETTING.match(text.strip().lower())
    if not m:
        raise ValueError(f"bad setting {text!r}: use e.g. 1gbit, lat_1gbit_5ms, w4_1gbit, "
                         "a2a_1gbit_2ms")
    kind, rate, num, unit = m.groups()
    delay_us = float(num) * (1000.0 if unit == "ms" else 1.0) if num else 0.0
    rate_bits(rate)
    if kind in (None, "bw", "lat") and delay_us == 0:
        return Setting(rate, f"bw_{rate}", rate, 0.0, 2, DDP)
    if kind in (None, "bw", "lat"):
        name = f"lat_{rate}_{num}{unit}"
        return Setting(name, name, rate, delay_us, 2, DDP)
    name = f"{kind}_{rate}" + (f"_{num}{unit}" if delay_us else "")
    return Setting(name, name, rate, delay_us, 4, MOE if kind == "a2a" else DDP)


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


def network_spec(bits: float, one_way_us: float) -> str:
    """The tracetool network spec of a setting (replay/network.py parse_network syntax)."""
    return (f"gpus_per_node=1,inter_node_bw={spec_bandwidth(bits)},"
            f"inter_node_latency={round(one_way_us)}us")


# --------------------------------------------------------------------------------------------
# the network


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def in_ns(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


def existing_netns() -> set[str]:
    out = sh("ip", "netns", "list").stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def ours() -> set[str]:
    return existing_netns() & {*NS_RANK, NS_SWITCH}


def teardown() -> None:
    """Kill what still runs in our namespaces (only processes this script started run there),
    then delete the namespaces (their veths, bridge and iptables rules go with them)."""
    DelayLines.stop_all()
    for ns in sorted(ours()):
        pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "netns", "del", ns, check=False)


def setup(world: int) -> None:
    stale = ours()
    if stale:
        print(f"removing stale namespaces from an earlier run: {sorted(stale)}", flush=True)
        teardown()
    for ns in [NS_SWITCH, *NS_RANK[:world]]:
        sh("ip", "netns", "add", ns)
    sh("ip", "-n", NS_SWITCH, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", NS_SWITCH, "link", "set", "lo", "up")
    sh("ip", "-n", NS_SWITCH, "link", "set", "br0", "up")
    for rank, ns in enumerate(NS_RANK[:world]):
        port = f"port{rank}"
        # create both ends directly inside their namespaces (nothing lands in the root one)
        sh("ip", "-n", ns, "link", "add", RANK_IF, "type", "veth", "peer", "name", port,
           "netns", NS_SWITCH)
        sh("ip", "-n", NS_SWITCH, "link", "set", port, "master", "br0")
        sh("ip", "-n", NS_SWITCH, "link", "set", port, "up")
        sh("ip", "-n", ns, "addr", "add", f"{rank_addr(rank)}/24", "dev", RANK_IF)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", RANK_IF, "up")


def shape(rate: str, world: int) -> list[str]:
    """Replace the root qdisc of both ends of every veth with tbf at ``rate``; return the
    resulting qdisc lines (for the record)."""
    shown = []
    ends = ([(ns, RANK_IF) for ns in NS_RANK[:world]]
            + [(NS_SWITCH, f"port{r}") for r in range(world)])
    for ns, dev in ends:
        sh(*in_ns(ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, *TBF))
        line = sh(*in_ns(ns, "tc", "qdisc", "show", "dev", dev)).stdout.strip()
        shown.append(f"{ns}/{dev}: {line}")
    return shown


def rank_sysctls() -> dict[str, str]:
    """The TCP settings the ranks run with (a new namespace's defaults; none are changed)."""
    out = sh(*in_ns(NS_RANK[0], "sysctl", *SYSCTLS), check=False).stdout
    return dict(line.replace("\t", " ").split(" = ", 1) for line in out.splitlines()
                if " = " in line)


# --------------------------------------------------------------------------------------------
# the delay line (delayline.c behind an NFQUEUE rule in each rank namespace)


def delay_prerequisites() -> list[str]:
    """What is missing to build and run the delay line (empty if nothing)."""
    missing = []
    if shutil.which("gcc") is None:
        missing.append("gcc")
    if shutil.which(IPTABLES) is None:
        missing.append(f"{IPTABLES} (Debian package iptables)")
    if not Path("/usr/include/libnetfilter_queue/libnetfilter_queue.h").exists():
        missing.append("libnetfilter_queue headers (libnetfilter-queue-dev)")
    if not Path("/usr/include/libmnl/libmnl.h").exists():
        missing.append("libmnl headers (libmnl-dev)")
    return missing


def build_delayline(tmp: Path) -> Path:
    """Compile delayline.c into ``tmp`` (never into the repository)."""
    exe = tmp / "delayline"
    cmd = ["gcc", "-O2", "-Wall", "-Wextra", "-o", str(exe), str(HERE / "delayline.c"),
           "-lnetfilter_queue", "-lmnl"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building the delay line failed ({' '.join(cmd)}):\n{res.stderr}\n"
                           f"install the build dependencies with: {INSTALL_HINT}")
    return exe


def nfqueue_counters(ns: str, queue: int) -> dict | None:
    """The kernel's counters of one NFQUEUE queue in a namespace."""
    out = sh(*in_ns(ns, "cat", "/proc/net/netfilter/nfnetlink_queue"), check=False).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 8 and int(f[0]) == queue:
            return {"queue_total": int(f[2]), "queue_dropped": int(f[5]),
                    "user_dropped": int(f[6]), "id_sequence": int(f[7])}
    return None


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class DelayLines:
    """One delay line per rank namespace, each on queue <rank> behind a PREROUTING rule."""

    running: list[DelayLines] = []  # so teardown() can stop them on any exit

    def __init__(self, exe: Path, delay_us: float, world: int, log_dir: Path) -> None:
        self.exe, self.delay_us, self.world, self.log_dir = exe, delay_us, world, log_dir
        self.procs: list[subprocess.Popen] = []
        self.rules: list[str] = []

    def rule(self, rank: int, op: str) -> list[str]:
        return in_ns(NS_RANK[rank], IPTABLES, "-t", "mangle", op, "PREROUTING", "-i", RANK_IF,
                     "-j", "NFQUEUE", "--queue-num", str(rank))

    def start(self) -> DelayLines:
        DelayLines.running.append(self)
        for rank in range(self.world):
            err = open(self.log_dir / f"delayline{rank}.err", "w")  # noqa: SIM115 - Popen owns it
            p = subprocess.Popen(
                in_ns(NS_RANK[rank], str(self.exe), str(rank), f"{self.delay_us:g}",
                      str(DELAY_MAXLEN), str(DELAY_RCVBUF)),
                stdout=subprocess.PIPE, stderr=err, text=True)
            err.close()
            self.procs.append(p)
            ready, _, _ = select.select([p.stdout], [], [], 10)
            line = p.stdout.readline() if ready else ""
            if not line.startswith("ready"):
                raise RuntimeError(f"delay line of rank {rank} did not start: {line!r} "
                                   f"{(self.log_dir / f'delayline{rank}.err').read_text()}")
            res = sh(*self.rule(rank, "-A"), check=False)
            if res.returncode != 0:
                raise RuntimeError(f"{IPTABLES} NFQUEUE rule failed in {NS_RANK[rank]}: "
                                   f"{res.stderr.strip()} (install: {INSTALL_HINT})")
            self.rules.append(NS_RANK[rank])
        return self

    def cpu_s(self) -> float:
        return sum(proc_cpu_s(p.pid) for p in self.procs if p.poll() is None)

    def check_alive(self) -> None:
        dead = [r for r, p in enumerate(self.procs) if p.poll() is not None]
        if dead:
            raise RuntimeError(f"delay line(s) of rank(s) {dead} died during the run")

    def stop(self) -> list[dict]:
        """Remove the rules, stop the delay lines; their statistics and the kernel's."""
        kernel = [nfqueue_counters(NS_RANK[r], r) for r in range(len(self.procs))]
        cpu = [proc_cpu_s(p.pid) for p in self.procs]
        for rank in range(len(self.rules)):
            sh(*self.rule(rank, "-D"), check=False)
        self.rules = []
        stats = []
        for rank, p in enumerate(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                out, _ = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            last = (out or "").strip().splitlines()[-1:] or ["{}"]
            try:
                s = json.loads(last[0])
            except json.JSONDecodeError:
                s = {"error": f"no statistics: {last[0]!r}"}
            s.update(rank=rank, exit_code=p.returncode, cpu_s=round(cpu[rank], 3),
                     kernel=kernel[rank])
            stats.append(s)
        self.procs = []
        if self in DelayLines.running:
            DelayLines.running.remove(self)
        return stats

    @classmethod
    def stop_all(cls) -> None:
        for dl in list(cls.running):
            try:
                dl.stop()
            except Exception as err:  # cleaning up: keep going
                print(f"stopping a delay line: {err}", file=sys.stderr)


def delay_drops(stats: list[dict]) -> int:
    """Packets lost by the delay lines (socket overruns, kernel queue drops, overflow)."""
    lost = 0
    for s in stats:
        lost += s.get("enobufs", 0) + s.get("fifo_overflow", 0) + s.get("netlink_errors", 0)
        k = s.get("kernel") or {}
        lost += k.get("queue_dropped", 0) + k.get("user_dropped", 0)
        if "error" in s or s.get("exit_code") != 0:
            lost += 1
    return lost


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


def pingpong_client(addr: str, port: int, rounds: int, warmup: int) -> None:
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
        for i in range(rounds + warmup):
            t = time.perf_counter_ns()
            conn.sendall(b"x")
            if conn.recv(1) != b"x":
                raise RuntimeError("ping-pong: bad echo")
            if i >= warmup:
                rtts.append(time.perf_counter_ns() - t)
    rtts.sort()
    print(json.dumps({"rounds": len(rtts), "rtt_ns_median": statistics.median(rtts),
                      "rtt_ns_p10": rtts[len(rtts) // 10],
                      "rtt_ns_p90": rtts[9 * len(rtts) // 10]}))


def pingpong(script: str, server_ns: str, client_ns: str, addr: str, port: int,
             rounds: int, warmup: int) -> dict:
    server = subprocess.Popen(in_ns(server_ns, sys.executable, script, "--pingpong-server",
                                    str(port)))
    try:
        out = subprocess.run(in_ns(client_ns, sys.executable, script, "--pingpong-client", addr,
                                   str(port), str(rounds), str(warmup)),
                             check=True, capture_output=True, text=True, timeout=120).stdout
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return json.loads(out)


def measure_rtt(script: str, delayed: bool) -> dict:
    """1-byte TCP ping-pong from rank 0's namespace to rank 1's, through the bridge, and the
    same over rank 0's own loopback (the Python + TCP stack cost; never delayed)."""
    rounds, warmup = PINGPONG["delayed" if delayed else "plain"]
    res = pingpong(script, NS_RANK[1], NS_RANK[0], rank_addr(1), PINGPONG_PORT, rounds, warmup)
    lo = pingpong(script, NS_RANK[0], NS_RANK[0], "127.0.0.1", PINGPONG_PORT + 1,
                  *PINGPONG["plain"])
    res["loopback_rtt_ns_median"] = lo["rtt_ns_median"]
    return res


# --------------------------------------------------------------------------------------------
# the jobs (one rank; runs inside its namespace)


def build_mlp():
    from torch import nn

    mods = []
    for i, (a, b) in enumerate(zip(LAYERS, LAYERS[1:], strict=False)):
        mods.append(nn.Linear(a, b))
        if i < len(LAYERS) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def ddp_job(rank: int, world: int, iters: int):
    """DDP over the MLP: returns (step(i) -> local loss tensor, parameters, info)."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    batch = DDP_GLOBAL_BATCH // world
    model = DDP(build_mlp(), bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED + rank)
    batches = [(torch.randn(batch, LAYERS[0], generator=gen),
                torch.randint(0, LAYERS[-1], (batch,), generator=gen)) for _ in range(iters)]

    def step(i: int):
        x, y = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    nparams = sum(p.numel() for p in model.parameters())
    return step, {"nparams": nparams, "grad_bytes": nparams * 4, "batch_per_rank": batch}


def moe_job(rank: int, world: int, iters: int):
    """A mixture-of-experts layer with expert parallelism: dispatch and combine all-to-alls
    around this rank's expert, shared layers averaged with one flat allreduce."""
    import torch
    import torch.distributed as dist
    from torch import nn

    class AllToAll(torch.autograd.Function):
        """Equal-split all_to_all_single; its gradient is the same exchange backwards."""

        @staticmethod
        def forward(ctx, x):
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x.contiguous())
            return out

        @staticmethod
        def backward(ctx, g):
            out = torch.empty_like(g)
            dist.all_to_all_single(out, g.contiguous())
            return out

    class MoE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(SEED)  # shared layers: the same on every rank
            self.inp = nn.Linear(MOE_HIDDEN, MOE_HIDDEN)
            self.head = nn.Linear(MOE_HIDDEN, MOE_CLASSES)
            torch.manual_seed(SEED + 100 + rank)  # this rank's expert
            self.expert = nn.Sequential(nn.Linear(MOE_HIDDEN, MOE_FFN), nn.ReLU(),
                                        nn.Linear(MOE_FFN, MOE_HIDDEN))

        def forward(self, x):
            h = torch.relu(self.inp(x))
            routed = AllToAll.apply(h)  # dispatch: tokens [j*T/n, (j+1)*T/n) to rank j
            back = AllToAll.apply(self.expert(routed))  # combine
            return self.head(h + back)

    model = MoE()
    shared = [*model.inp.parameters(), *model.head.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED + rank)
    batches = [(torch.randn(MOE_TOKENS, MOE_HIDDEN, generator=gen),
                torch.randint(0, MOE_CLASSES, (MOE_TOKENS,), generator=gen))
               for _ in range(iters)]

    def step(i: int):
        x, y = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in shared])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in shared:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        opt.step()
        return loss

    nshared = sum(p.numel() for p in shared)
    return step, {"nparams": sum(p.numel() for p in model.parameters()),
                  "shared_params": nshared, "grad_bytes": nshared * 4,
                  "a2a_bytes": MOE_TOKENS * MOE_HIDDEN * 4, "tokens_per_rank": MOE_TOKENS}


def run_worker(rank: int, world: int, pattern: str, tmp_dir: Path) -> None:
    marks = {"start": time.time()}  # wall clock at each phase's end, for the run's breakdown
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.set_num_threads(1)  # one core's worth per rank at most: keep pools from fighting
    torch.manual_seed(SEED)
    marks["imported"] = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=RUN_TIMEOUT_S))
    marks["initialised"] = time.time()
    job = {DDP: ddp_job, MOE: moe_job}[pattern]
    step, info = job(rank, world, PROFILED_ITERS + UNPROFILED_ITERS)
    trace_json = tmp_dir / f"rank{rank}.pt.trace.json"
    losses: list[float] = []

    def train_step(i: int) -> float:
        t0 = time.perf_counter()
        loss = step(i)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world
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
        for i in range(PROFILED_ITERS):
            profiled.append(train_step(i))
            prof.step()
    dist.barrier()
    marks["profiled"] = time.time()
    unprofiled = [train_step(i) for i in range(PROFILED_ITERS, PROFILED_ITERS + UNPROFILED_ITERS)]
    dist.barrier()
    marks["unprofiled"] = time.time()
    dist.destroy_process_group()
    marks["end"] = time.time()
    (tmp_dir / f"rank{rank}.times.json").write_text(json.dumps({
        "rank": rank, "profiled_s": profiled, "unprofiled_s": unprofiled, "losses": losses,
        **info, "torch": torch.__version__, "marks": marks,
    }))


def cpu_usage(extra_s: float = 0.0) -> tuple[float, float, float]:
    """(wall s, whole-machine user+nice+system CPU s, CPU s of our waited-for children plus
    ``extra_s`` for our still running ones)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    busy = sum(int(v) for v in fields[:3]) / os.sysconf("SC_CLK_TCK")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic(), busy, ru.ru_utime + ru.ru_stime + extra_s


def foreign_cpu(before: tuple, after: tuple) -> float:
    """Share of the machine's CPU capacity used by processes other than ours (ranks, delay
    lines) during a run (irq/softirq time, where veth traffic is mostly processed, is not
    counted)."""
    wall = after[0] - before[0]
    other = (after[1] - before[1]) - (after[2] - before[2])
    return round(max(0.0, other) / (wall * (os.cpu_count() or 1)), 3)


def run_job(script: str, run_dir: Path, s: Setting,
            watch: Callable[[], None] | None = None) -> list[dict]:
    """Start every rank in its namespace and wait, calling ``watch`` (which raises if
    something the job needs is gone) meanwhile; returns each rank's times.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GLOO_SOCKET_IFNAME=RANK_IF, MASTER_ADDR=rank_addr(0),
               MASTER_PORT=str(MASTER_PORT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    ncpu = os.cpu_count() or 1
    procs = []
    try:
        for rank in range(s.world):
            pin = ["taskset", "-c", str(rank % ncpu)] if s.world > ncpu else []
            log = open(run_dir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(
                in_ns(NS_RANK[rank], *pin, sys.executable, script, "--worker", str(rank),
                      "--world", str(s.world), "--pattern", s.pattern, "--tmp", str(run_dir)),
                env=env, stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while any(p.poll() is None for p, _ in procs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{s.name}: the ranks did not finish in {RUN_TIMEOUT_S} s")
            if any(p.returncode not in (None, 0) for p, _ in procs):
                break  # one rank failed: the others would wait for it until gloo's timeout
            if watch:
                watch()
            time.sleep(0.2)
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
    return [json.loads((run_dir / f"rank{r}.times.json").read_text()) for r in range(s.world)]


# --------------------------------------------------------------------------------------------
# reading traces back


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def ns(us: float) -> int:
    return round(us * 1000)


def union_ns(spans: list[dict]) -> float:
    """Length of the union of spans (ts/dur in us), in us."""
    busy, end = 0.0, None
    for a in sorted(spans, key=lambda a: a["ts"]):
        a_end = a["ts"] + a["dur"]
        if end is None or a["ts"] >= end:
            busy += a["dur"]
            end = a_end
        elif a_end > end:
            busy += a_end - end
            end = a_end
    return busy


def overlap_shares(spans: list[dict]) -> list[float]:
    """Per span, the share of it during which another of the spans also ran."""
    shares = []
    for a in spans:
        a_end = a["ts"] + a["dur"]
        cover = sorted((max(a["ts"], o["ts"]), min(a_end, o["ts"] + o["dur"]))
                       for o in spans if o is not a)
        covered, upto = 0.0, a["ts"]
        for lo, hi in cover:
            lo = max(lo, upto)
            if hi > lo:
                covered += hi - lo
                upto = hi
        shares.append(covered / a["dur"] if a["dur"] else 0.0)
    return shares


def gloo_spans(trace: dict, name: str) -> list[dict]:
    spans = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("name") == name:
            numel = 1
            for d in e["args"]["Input Dims"][0]:
                numel *= d
            spans.append({"ts": e["ts"], "dur": e["dur"], "numel": numel,
                          "bytes": numel * 4 if e["args"]["Input type"][0] == "float" else None})
    return sorted(spans, key=lambda a: a["ts"])


def trace_summary(trace: dict) -> dict:
    """ProfilerStep durations, and per step the gloo:all_reduce spans of gradients (more than
    one element; the loss allreduce is left out) and the gloo:all_to_all spans (ns)."""
    steps = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                    and e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
    ars, a2as = gloo_spans(trace, "gloo:all_reduce"), gloo_spans(trace, "gloo:all_to_all")
    per_step = []
    for s in steps:
        def inside(spans, s=s):
            return [a for a in spans if s["ts"] <= a["ts"] < s["ts"] + s["dur"]]
        grads = [a for a in inside(ars) if a["numel"] > 1]
        a2a = inside(a2as)
        per_step.append({"name": s["name"], "dur_ns": ns(s["dur"]),
                         "grad_allreduce_ns": [ns(a["dur"]) for a in grads],
                         "grad_allreduce_overlap": overlap_shares(grads),
                         "grad_allreduce_bytes": [a["bytes"] for a in grads],
                         "grad_allreduce_busy_ns": ns(union_ns(grads)),
                         "a2a_ns": [ns(a["dur"]) for a in a2a],
                         "a2a_bytes": [a["bytes"] for a in a2a],
                         "a2a_busy_ns": ns(union_ns(a2a))})
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


def pct(xs, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# --------------------------------------------------------------------------------------------
# summarising one setting

ACTIVE_ITERS = slice(WAIT + WARMUP, WAIT + WARMUP + ACTIVE)  # iterations inside the trace window


def prof_med(run: dict) -> float:
    return med([t for r in run["times"] for t in r["profiled_s"][ACTIVE_ITERS]])


def wall_summary(runs: list[dict], world: int) -> dict:
    prof_all = [t for run in runs for r in run["times"] for t in r["profiled_s"][ACTIVE_ITERS]]
    unprof_all = [t for run in runs for r in run["times"] for t in r["unprofiled_s"]]
    return {
        "profiled": [{f"rank{r}": ms(run["times"][r]["profiled_s"]) for r in range(world)}
                     for run in runs],
        "unprofiled": [{f"rank{r}": ms(run["times"][r]["unprofiled_s"]) for r in range(world)}
                       for run in runs],
        "profiled_median": round(med(prof_all) * 1e3, 3),
        "unprofiled_median": round(med(unprof_all) * 1e3, 3),
        "profiled_median_per_rank": {
            f"rank{r}": round(med([t for run in runs
                                   for t in run["times"][r]["profiled_s"][ACTIVE_ITERS]]) * 1e3, 3)
            for r in range(world)},
        "unprofiled_median_per_rank": {
            f"rank{r}": round(med([t for run in runs
                                   for t in run["times"][r]["unprofiled_s"]]) * 1e3, 3)
            for r in range(world)},
    }


def spread_summary(runs: list[dict]) -> dict:
    """How much the step time varies: between repeats (each repeat's median) and between
    iterations (pooled percentiles)."""
    out: dict = {"repetitions": len(runs)}
    for phase, sl in (("profiled", ACTIVE_ITERS), ("unprofiled", slice(None))):
        per_rep = [med([t for r in run["times"] for t in r[f"{phase}_s"][sl]]) for run in runs]
        pooled = [t for run in runs for r in run["times"] for t in r[f"{phase}_s"][sl]]
        out[phase] = {
            "per_repeat_median_ms": ms(per_rep),
            "repeat_range_ms": round((max(per_rep) - min(per_rep)) * 1e3, 3),
            "repeat_range_share": round((max(per_rep) - min(per_rep)) / med(per_rep), 4),
            "samples": len(pooled),
            "p10_ms": round(pct(pooled, 0.1) * 1e3, 3),
            "p90_ms": round(pct(pooled, 0.9) * 1e3, 3),
        }
    return out


def allreduce_summary(every: list[list[dict]], world: int, rate_bytes: float
                      ) -> tuple[dict, list[int]]:
    """Per gradient allreduce (DDP bucket, or the MoE job's one flat allreduce): the same
    collective's span on every rank; the rank that joins last waits least, so the min over
    ranks is the closest to the transfer time itself."""
    ring = 2 * (world - 1) / world
    per_bucket: dict[int, dict[str, list]] = {}
    busy_min = []
    bucket_bytes: list[int] = []
    for run_tr in every:
        for steps in zip(*[t["steps"] for t in run_tr], strict=True):
            bucket_bytes = steps[0]["grad_allreduce_bytes"]
            for i, b in enumerate(bucket_bytes):
                durs = [s["grad_allreduce_ns"][i] for s in steps]
                slot = per_bucket.setdefault(i, {"bytes": b, "all": [], "min": [], "ovl": []})
                slot["all"] += durs
                slot["ovl"] += [s["grad_allreduce_overlap"][i] for s in steps]
                slot["min"].append(min(durs))
            busy_min.append(min(s["grad_allreduce_busy_ns"] for s in steps))
    buckets = [{
        "bucket": i, "bytes": b["bytes"],
        "measured_ms_median_all_spans": round(med(b["all"]) / 1e6, 3),
        "measured_ms_median_min_over_ranks": round(med(b["min"]) / 1e6, 3),
        "theory_ms": round(ring * b["bytes"] / rate_bytes * 1e3, 3),
        "theory_ms_with_headers": round(ring * b["bytes"] * WIRE / rate_bytes * 1e3, 3),
        "concurrent_share_median": round(med(b["ovl"]), 3),
    } for i, b in sorted(per_bucket.items())]
    total = sum(bucket_bytes)
    return {
        "buckets": buckets,
        "grad_busy_ms_median": round(med(busy_min) / 1e6, 3),
        "grad_theory_ms": round(ring * total / rate_bytes * 1e3, 3),
        "grad_theory_ms_with_headers": round(ring * total * WIRE / rate_bytes * 1e3, 3),
        "theory_formula": f"2*(n-1)/n * bytes / (rate/8), n={world}; bandwidth only, no "
                          "latency term",
        "with_headers": f"the same times {WIRE:.4f} = 1514/1448: tbf counts whole Ethernet "
                        "frames, a full TCP segment carries 1448 payload bytes (MTU 1500, "
                        "IPv4 + TCP with timestamps) in a 1514-byte frame",
        "notes": "measured_ms_median_min_over_ranks: per collective, the shortest of the "
                 "ranks' gloo:all_reduce spans (the rank that joins last waits least); "
                 "concurrent_share_median: share of a bucket's span during which another "
                 "gradient allreduce ran too (gloo has 2 runloop threads, so buckets share "
                 "the link); grad_busy_ms_median: union of a step's gradient allreduce "
                 "spans, min over ranks, median over steps; all over every repeat's traces",
    }, bucket_bytes


def a2a_summary(every: list[list[dict]], world: int, rate_bytes: float) -> dict:
    """Per all-to-all of a step (forward dispatch, forward combine, then backward's two):
    the shortest span over ranks, against (n-1)/n of the buffer over one link."""
    share = (world - 1) / world
    per_call: dict[int, dict[str, list]] = {}
    busy = []
    for run_tr in every:
        for steps in zip(*[t["steps"] for t in run_tr], strict=True):
            for i, b in enumerate(steps[0]["a2a_bytes"]):
                durs = [s["a2a_ns"][i] for s in steps]
                slot = per_call.setdefault(i, {"bytes": b, "all": [], "min": []})
                slot["all"] += durs
                slot["min"].append(min(durs))
            busy.append(min(s["a2a_busy_ns"] for s in steps))
    calls = [{
        "call": i, "bytes": c["bytes"],
        "measured_ms_median_all_spans": round(med(c["all"]) / 1e6, 3),
        "measured_ms_median_min_over_ranks": round(med(c["min"]) / 1e6, 3),
        "theory_ms": round(share * c["bytes"] / rate_bytes * 1e3, 3),
        "theory_ms_with_headers": round(share * c["bytes"] * WIRE / rate_bytes * 1e3, 3),
    } for i, c in sorted(per_call.items())]
    return {
        "calls_per_step": len(calls),
        "calls": calls,
        "busy_ms_median": round(med(busy) / 1e6, 3),
        "theory_ms_per_step": round(sum(c["theory_ms"] for c in calls), 3),
        "theory_formula": f"(n-1)/n * bytes / (rate/8), n={world}: every rank sends and "
                          "receives (n-1)/n of its buffer over its own link (full duplex); "
                          "bandwidth only, no latency term",
        "notes": "equal splits (fixed-capacity routing); busy_ms_median: union of a step's "
                 "gloo:all_to_all spans, min over ranks, median over steps",
    }


def pingpong_summary(rtt: dict, s: Setting, base_rtt_ns: float) -> dict:
    out = {
        "rtt_us_median": round(rtt["rtt_ns_median"] / 1e3, 1),
        "rtt_us_p10": round(rtt["rtt_ns_p10"] / 1e3, 1),
        "rtt_us_p90": round(rtt["rtt_ns_p90"] / 1e3, 1),
        "one_way_us": round(rtt["rtt_ns_median"] / 2 / 1e3, 1),
        "loopback_rtt_us_median": round(rtt["loopback_rtt_ns_median"] / 1e3, 1),
        "rounds": rtt["rounds"],
    }
    if s.delay_us:
        added = (rtt["rtt_ns_median"] - base_rtt_ns) / 1e3
        out.update({
            "base_rtt_us_median": round(base_rtt_ns / 1e3, 1),
            "added_rtt_us": round(added, 1),
            "expected_added_rtt_us": 2 * s.delay_us,
            "excess_us": round(added - 2 * s.delay_us, 1),
            "tolerance_us": rtt_tolerance_us(s.delay_us),
        })
    return out


def rtt_tolerance_us(delay_us: float) -> float:
    return round(RTT_TOLERANCE_US + RTT_TOLERANCE_SHARE * 2 * delay_us, 1)


def summarize_setting(s: Setting, r: dict, out_dir: Path, base_lat_us: float,
                      base_rtt_ns: float) -> dict:
    runs = r["runs"]
    bits = rate_bits(s.rate)
    rate_bytes = bits / 8

    # commit the traces of the repeat whose profiled median is the median over repeats
    order = sorted(range(len(runs)), key=lambda i: prof_med(runs[i]))
    chosen = order[(len(order) - 1) // 2]
    for rank in range(s.world):
        gzip_deterministic(runs[chosen]["dir"] / f"rank{rank}.pt.trace.json",
                           out_dir / s.dir / f"rank{rank}.pt.trace.json.gz")
    committed = [trace_summary(load_trace(out_dir / s.dir / f"rank{q}.pt.trace.json.gz"))
                 for q in range(s.world)]
    every = [[trace_summary(load_trace(run["dir"] / f"rank{q}.pt.trace.json"))
              for q in range(s.world)] for run in runs]
    t0 = runs[0]["times"][0]
    allreduce, bucket_bytes = allreduce_summary(every, s.world, rate_bytes)
    one_way_us = base_lat_us if not s.delay_us else r["rtt"]["rtt_ns_median"] / 2 / 1e3
    out = {
        "dir": s.dir,
        "pattern": s.pattern,
        "world_size": s.world,
        "tc_rate": s.rate,
        "rate_bits_per_s": bits,
        "one_way_delay_us": s.delay_us,
        "tc_qdiscs": r["qdiscs"],
        "network_spec": network_spec(bits, one_way_us),
        "tcp_pingpong": pingpong_summary(r["rtt"], s, base_rtt_ns),
        "delay_line": None if not s.delay_us else {
            "per_repeat": [run["delay_line"] for run in runs],
            "lateness_us_mean_max": max((d["lateness_us_mean"] for run in runs
                                         for d in run["delay_line"] if "lateness_us_mean" in d),
                                        default=None),
            "dropped": sum(delay_drops(run["delay_line"]) for run in runs),
        },
        "pinning": ("taskset -c <rank mod ncpu>" if s.world > (os.cpu_count() or 1)
                    else "none"),
        "batch_per_rank": t0.get("batch_per_rank", t0.get("tokens_per_rank")),
        "grad_bytes": t0["grad_bytes"],
        "num_buckets": len(bucket_bytes),
        "bucket_bytes": bucket_bytes,
        "traces": {
            "files": [f"{s.dir}/rank{q}.pt.trace.json.gz" for q in range(s.world)],
            "from_repeat": chosen,
            "profiler_step_ns": {f"rank{q}": [st["dur_ns"] for st in committed[q]["steps"]]
                                 for q in range(s.world)},
            "profiler_step_names": [st["name"] for st in committed[0]["steps"]],
            "profiler_step_ms_median": round(
                med([st["dur_ns"] for c in committed for st in c["steps"]]) / 1e6, 3),
        },
        "wall_ms": wall_summary(runs, s.world),
        "spread": spread_summary(runs),
        "allreduce": allreduce,
        "other_cpu_share_per_repeat": [run["foreign"] for run in runs],
        "run_phases_s": [run["phases"] for run in runs],
        "losses_rank0": [run["times"][0]["losses"] for run in runs],
    }
    if s.pattern == MOE:
        out["all_to_all"] = a2a_summary(every, s.world, rate_bytes)
    return out


# --------------------------------------------------------------------------------------------
# the sweep


def run_once(script: str, s: Setting, rep: int, tmp: Path, exe: Path | None, world: int,
             result: dict) -> None:
    """One repeat of one setting: shape every link (``world`` rank namespaces exist), start
    the delay lines, (ping-pong on the first repeat), the job, stop the delay lines."""
    qdiscs = shape(s.rate, world)
    run_dir = tmp / f"{s.name}-rep{rep}"
    run_dir.mkdir(parents=True)
    delay = DelayLines(exe, s.delay_us, s.world, run_dir).start() if s.delay_us else None
    try:
        if rep == 0:
            result["qdiscs"] = qdiscs
            result["rtt"] = measure_rtt(script, bool(s.delay_us))
        t, launched = time.monotonic(), time.time()
        cpu0 = cpu_usage(delay.cpu_s() if delay else 0.0)
        times = run_job(script, run_dir, s, delay.check_alive if delay else None)
        if delay:
            delay.check_alive()
        cpu1 = cpu_usage(delay.cpu_s() if delay else 0.0)
    finally:
        stats = delay.stop() if delay else None
    # seconds from launch until the last rank finished each phase (imports, gloo init, ...)
    phases = {k: round(max(r["marks"][k] for r in times) - launched, 2)
              for k in times[0]["marks"] if k != "start"}
    phases["total"] = round(time.monotonic() - t, 2)
    result["runs"].append({"dir": run_dir, "times": times, "foreign": foreign_cpu(cpu0, cpu1),
                           "delay_line": stats, "phases": phases})
    prof = med([x for r in times for x in r["profiled_s"][ACTIVE_ITERS]])
    extra = ""
    if rep == 0:
        extra = f", ping-pong RTT {result['rtt']['rtt_ns_median'] / 1e3:8.1f} us"
    if stats:
        extra += (f", delay line late {max(d.get('lateness_us_mean', 0) for d in stats):.1f} us "
                  f"mean, dropped {delay_drops(stats)}")
    print(f"repeat {rep} {s.name:>16}: profiled median step {prof * 1e3:7.1f} ms, run "
          f"{phases['total']:5.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()
                                                    if k != "total")
          + f"), other CPU {result['runs'][-1]['foreign']:.0%}{extra}", flush=True)


def sweep(settings: list[Setting], repeats: int, out_dir: Path) -> dict:
    script = str(Path(__file__).resolve())
    results: dict[str, dict] = {s.name: {"runs": []} for s in settings}
    world = max(s.world for s in settings)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracetool-netlab-") as tmp_s:
        tmp = Path(tmp_s)
        exe = build_delayline(tmp) if any(s.delay_us for s in settings) else None
        setup(world)
        try:
            sysctls = rank_sysctls()
            shape(settings[0].rate, world)
            base = measure_rtt(script, delayed=False)  # no delay line: the link's own latency
            for rep in range(repeats):
                for s in settings:
                    run_once(script, s, rep, tmp, exe, world, results[s.name])
        finally:
            teardown()
        if ours():
            raise RuntimeError(f"namespaces left behind: {sorted(ours())}")
        # one latency for every undelayed spec: tbf does not delay an idle link, so their
        # ping-pong medians differ only by noise; use their median, half the round trip
        plain = [results[s.name]["rtt"]["rtt_ns_median"] for s in settings if not s.delay_us]
        base_lat_us = med(plain or [base["rtt_ns_median"]]) / 2 / 1e3
        # what a delay adds is measured against every undelayed round trip of the run (it
        # varies with the machine's load: fewer idle wake-ups on a busy machine)
        base_rtt_ns = med([base["rtt_ns_median"], *plain])
        out = {s.name: summarize_setting(s, results[s.name], out_dir, base_lat_us, base_rtt_ns)
               for s in settings}
    return describe(settings, repeats, results, base, base_lat_us, sysctls, started, out)


def describe(settings: list[Setting], repeats: int, results: dict, base: dict,
             base_lat_us: float, sysctls: dict, started: float, out: dict) -> dict:
    """The top-level measured.json: how everything was made and measured, then the settings."""
    ddp = next((results[s.name]["runs"][0]["times"][0] for s in settings
                if s.pattern == DDP and s.world == 2), None)
    first = results[settings[0].name]["runs"][0]["times"][0]
    moe = next((results[s.name]["runs"][0]["times"][0] for s in settings if s.pattern == MOE),
               None)
    return {
        "generator": "sample_traces/netlab/make_netlab.py",
        "job": {
            "world_size": 2, "backend": "gloo", "model": f"MLP {LAYERS}",
            "nparams": ddp["nparams"] if ddp else None,
            "batch": DDP_GLOBAL_BATCH // 2, "bucket_cap_mb": BUCKET_CAP_MB,
            "profiler_schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE},
            "profiled_iters": PROFILED_ITERS, "unprofiled_iters": UNPROFILED_ITERS,
            "repeats": repeats,
            "profiled_median_uses": f"iterations {WAIT + WARMUP}..{WAIT + WARMUP + ACTIVE - 1} "
                                    "(the profiled ones), pooled over ranks and repeats",
            "unprofiled_median_uses": "all unprofiled iterations, pooled over ranks and repeats",
            "wall_time_span": "perf_counter from zero_grad to loss.item() after the loss "
                              "allreduce, per rank, no barrier; prof.step() excluded",
            "spread": "settings.<s>.spread: each repeat's median (a fresh set of processes per "
                      "repeat, settings interleaved) and their range, and the 10th/90th "
                      "percentiles of all iterations pooled over ranks and repeats",
            "note": "world_size, model, nparams, batch describe the 2-rank DDP job of the "
                    "bw_<rate> and lat_* settings; settings.<s>.pattern / world_size give each "
                    "setting's job, described under patterns",
            "patterns": {
                DDP: {"model": f"MLP {LAYERS}, DistributedDataParallel, bucket_cap_mb="
                               f"{BUCKET_CAP_MB}",
                      "global_batch": DDP_GLOBAL_BATCH,
                      "batch_per_rank": {"2": DDP_GLOBAL_BATCH // 2, "4": DDP_GLOBAL_BATCH // 4},
                      "collectives": "per step: the gradient buckets' allreduces (overlapping "
                                     "backward), then the loss allreduce"},
                MOE: {"model": f"Linear({MOE_HIDDEN},{MOE_HIDDEN}) + ReLU (shared) -> "
                               f"all_to_all -> expert Linear({MOE_HIDDEN},{MOE_FFN}), ReLU, "
                               f"Linear({MOE_FFN},{MOE_HIDDEN}) (one per rank) -> all_to_all "
                               f"-> residual -> Linear({MOE_HIDDEN},{MOE_CLASSES}) (shared)",
                      "tokens_per_rank": MOE_TOKENS,
                      "nparams_per_rank": moe["nparams"] if moe else None,
                      "shared_params": moe["shared_params"] if moe else None,
                      "a2a_bytes": MOE_TOKENS * MOE_HIDDEN * 4,
                      "collectives": "per step: 2 all_to_all_single forward (dispatch, "
                                     "combine), 2 in backward, one flat allreduce of the shared "
                                     "gradients after backward, the loss allreduce"},
            },
            "threads": "torch.set_num_threads(1), OMP_NUM_THREADS=1; 4-rank jobs pinned with "
                       "taskset -c <rank mod ncpu> (two ranks per core), 2-rank jobs not",
        },
        "network": {
            "latency_us_in_specs": round(base_lat_us),
            "latency_note": "inter_node_latency in the specs of undelayed settings is half the "
                            "median round trip of a 1-byte TCP ping-pong (Python, TCP_NODELAY) "
                            "between the rank namespaces, pooled over those settings. It is an "
                            "upper bound for the link: the same ping-pong over one namespace's "
                            "loopback (tcp_pingpong.loopback_rtt_us_median) costs nearly as "
                            "much. For a setting with an added delay it is half that setting's "
                            "own measured round trip (base + 2D + what the endpoints add).",
            "base_tcp_pingpong_rtt_us_median": round(base["rtt_ns_median"] / 1e3, 1),
            "base_note": "base_tcp_pingpong_rtt_us_median: measured once at the start, before "
                         "any delay line; tcp_pingpong.base_rtt_us_median of a delayed setting: "
                         "the median of it and every undelayed setting's round trip",
            "topology": "each rank in its own netns, one veth to a bridge in a switch netns",
            "addresses": [rank_addr(r) for r in range(max(s.world for s in settings))],
            "shaping": "tc qdisc replace dev IF root tbf rate <R> " + " ".join(TBF)
                       + " on both ends of every veth",
            "delay": f"{IPTABLES} -t mangle -A PREROUTING -i {RANK_IF} -j NFQUEUE --queue-num "
                     "<rank> in every rank namespace, and delayline.c (gcc, libnetfilter_queue) "
                     "holding each packet for the setting's one_way_delay_us from its kernel "
                     f"receive timestamp (FIFO, batch verdicts, queue maxlen {DELAY_MAXLEN}, "
                     f"receive buffer {DELAY_RCVBUF} bytes, SCHED_FIFO): +D each way, +2D per "
                     "TCP round trip; settings.<s>.delay_line holds its statistics",
            "delay_check": f"TCP ping-pong round trip = base + 2D, from {RTT_SHORT_US:g} us "
                           f"short to {RTT_TOLERANCE_US:g} us + {RTT_TOLERANCE_SHARE:.0%} of 2D "
                           "long (tcp_pingpong.excess_us; the endpoints wake from idle after "
                           "every delayed packet); delay lines' mean lateness at most "
                           f"{DELAY_LATE_MAX_US:g} us; no packet dropped",
            "rank_sysctls": sysctls,
        },
        "environment": {
            "torch": first["torch"], "python": platform.python_version(),
            "kernel": platform.release(), "cpus": os.cpu_count(),
        },
        "elapsed_s": round(time.monotonic() - started, 1),
        "settings": out,
    }


# --------------------------------------------------------------------------------------------
# report and checks


def print_table(measured: dict) -> None:
    print(f"{'setting':>16} {'n':>2} {'D us':>6} {'RTT us':>8} {'prof ms':>8} {'unprof ms':>9} "
          f"{'PS# ms':>8} {'ar busy':>8} {'ar thy':>7} {'a2a busy':>8} {'a2a thy':>7}  spread")
    for name, s in measured["settings"].items():
        w, a = s["wall_ms"], s["allreduce"]
        a2a = s.get("all_to_all") or {}
        sp = s["spread"]["unprofiled"]
        print(f"{name:>16} {s['world_size']:2d} {s['one_way_delay_us']:6.0f} "
              f"{s['tcp_pingpong']['rtt_us_median']:8.1f} {w['profiled_median']:8.1f} "
              f"{w['unprofiled_median']:9.1f} {s['traces']['profiler_step_ms_median']:8.1f} "
              f"{a['grad_busy_ms_median']:8.1f} {a['grad_theory_ms']:7.1f} "
              f"{a2a.get('busy_ms_median', float('nan')):8.1f} "
              f"{a2a.get('theory_ms_per_step', float('nan')):7.1f}  "
              f"p10-p90 {sp['p10_ms']:.1f}-{sp['p90_ms']:.1f}, repeats "
              f"{', '.join(f'{x:.1f}' for x in sp['per_repeat_median_ms'])}")


def markdown_tables(measured: dict) -> str:
    """README tables of a measured.json, one per job (--tables)."""
    lines = []
    titles = {(DDP, 2): "DDP, 2 ranks", (DDP, 4): "DDP, 4 ranks", (MOE, 4): "all-to-all (MoE), "
              "4 ranks"}
    fams: dict[tuple, list[tuple[str, dict]]] = {}
    for name, s in measured["settings"].items():
        fams.setdefault((s.get("pattern", DDP), s.get("world_size", 2)), []).append((name, s))
    for fam, members in fams.items():
        moe = fam[0] == MOE
        comm = "all-to-all busy / theory" if moe else "gradient allreduce busy / theory"
        lines += [f"{titles.get(fam, fam)}:", "",
                  f"| setting | network spec | RTT us | step, profiled | step, unprofiled | "
                  f"ProfilerStep | {comm} | repeats (unprofiled medians) |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for name, s in members:
            w, sp = s["wall_ms"], s.get("spread", {}).get("unprofiled", {})
            c = s["all_to_all"] if moe else s["allreduce"]
            busy, thy = ((c["busy_ms_median"], c["theory_ms_per_step"]) if moe
                         else (c["grad_busy_ms_median"], c["grad_theory_ms"]))
            reps = ", ".join(f"{x:.1f}" for x in sp.get("per_repeat_median_ms", []))
            lines.append(f"| {s.get('dir', 'bw_' + name)} | `{s['network_spec']}` | "
                         f"{s['tcp_pingpong']['rtt_us_median']:.0f} | "
                         f"{w['profiled_median']:.1f} | {w['unprofiled_median']:.1f} | "
                         f"{s['traces']['profiler_step_ms_median']:.1f} | {busy:.1f} / {thy:.1f} "
                         f"| {reps} |")
        lines.append("")
    return "\n".join(lines)


def check_outputs(measured: dict, out_dir: Path) -> list[str]:
    """Every trace is there and complete; the delay was what was asked; nothing dropped."""
    problems = []
    for name, s in measured["settings"].items():
        for rank in range(s["world_size"]):
            path = out_dir / s["dir"] / f"rank{rank}.pt.trace.json.gz"
            trace = load_trace(path)
            info = trace.get("distributedInfo") or {}
            names = {e.get("name") for e in trace.get("traceEvents", [])}
            if not trace.get("traceEvents"):
                problems.append(f"{path}: no traceEvents")
            if info.get("rank") != rank or info.get("world_size") != s["world_size"]:
                problems.append(f"{path}: missing or wrong distributedInfo: {info!r}")
            if len(s["traces"]["profiler_step_ns"][f"rank{rank}"]) != ACTIVE:
                problems.append(f"{path}: expected {ACTIVE} ProfilerStep events")
            want = ["gloo:all_reduce"] + (["gloo:all_to_all"] if s["pattern"] == MOE else [])
            problems += [f"{path}: no {w} span" for w in want if w not in names]
            print(f"{path.relative_to(out_dir)}: {path.stat().st_size} bytes, "
                  f"{len(trace['traceEvents'])} events")
        pp, dl = s["tcp_pingpong"], s["delay_line"]
        if s["one_way_delay_us"] and not -RTT_SHORT_US <= pp["excess_us"] <= pp["tolerance_us"]:
            problems.append(f"{name}: ping-pong round trip grew by {pp['added_rtt_us']} us, "
                            f"expected {pp['expected_added_rtt_us']} (-{RTT_SHORT_US:g}, "
                            f"+{pp['tolerance_us']})")
        if dl and dl["dropped"]:
            problems.append(f"{name}: the delay lines dropped {dl['dropped']} packet(s) or "
                            "failed (see delay_line.per_repeat)")
        if dl and (dl["lateness_us_mean_max"] or 0) > DELAY_LATE_MAX_US:
            problems.append(f"{name}: a delay line released packets {dl['lateness_us_mean_max']} "
                            f"us late on average (> {DELAY_LATE_MAX_US:g}): a busy machine?")
    return problems


def check_trends(settings: list[Setting], measured: dict) -> list[str]:
    """Within a family (same job), the unprofiled median step grows as bandwidth shrinks (at
    equal delay) and as the delay grows (at equal bandwidth)."""
    problems = []
    groups: dict[tuple, list[Setting]] = {}
    for s in settings:
        groups.setdefault(("delay", *s.family, s.delay_us), []).append(s)
        groups.setdefault(("rate", *s.family, s.rate), []).append(s)
    for key, members in groups.items():
        if len(members) < 2:
            continue
        order = sorted(members, key=lambda s: -rate_bits(s.rate) if key[0] == "delay"
                       else s.delay_us)
        meds = [measured["settings"][s.name]["wall_ms"]["unprofiled_median"] for s in order]
        if any(b < a for a, b in zip(meds, meds[1:], strict=False)):
            what = "bandwidth shrinks" if key[0] == "delay" else "delay grows"
            problems.append(f"unprofiled median step does not grow as {what}: "
                            f"{dict(zip([s.name for s in order], meds, strict=True))}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--settings", default=DEFAULT_SETTINGS,
                        help="comma-separated settings: <rate> (2 ranks, DDP), lat_<rate>_<delay>,"
                             " w4_<rate>[_<delay>], a2a_<rate>[_<delay>]; rates as tc "
                             "(1gbit, 500mbit), delays 5ms or 500us one way "
                             f"(default: {DEFAULT_SETTINGS})")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"runs per setting (default: {DEFAULT_REPEATS})")
    parser.add_argument("--tables", type=Path, metavar="MEASURED_JSON",
                        help="print the README's markdown tables of a measured.json and exit")
    # internal modes, used inside the namespaces
    parser.add_argument("--worker", type=int, metavar="RANK", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--pattern", default=DDP, choices=[DDP, MOE], help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pingpong-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--pingpong-client", nargs=4,
                        metavar=("ADDR", "PORT", "ROUNDS", "WARMUP"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.tables is not None:
        print(markdown_tables(json.loads(args.tables.read_text())))
        return 0
    if args.worker is not None:
        run_worker(args.worker, args.world, args.pattern, args.tmp)
        # everything is written: skip torch's interpreter teardown (seconds with 4 ranks on
        # 2 cores, and it is in the run's wall time)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if args.pingpong_server is not None:
        pingpong_server(args.pingpong_server)
        return 0
    if args.pingpong_client is not None:
        addr, port, rounds, warmup = args.pingpong_client
        pingpong_client(addr, int(port), int(rounds), int(warmup))
        return 0

    if os.geteuid() != 0:
        print("needs root (ip netns, tc, iptables)", file=sys.stderr)
        return 2
    try:  # validate before touching the network
        settings = [parse_setting(s) for s in args.settings.split(",") if s.strip()]
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    if len({s.name for s in settings}) != len(settings) or not settings:
        print("no settings, or a setting given twice", file=sys.stderr)
        return 2
    missing = delay_prerequisites() if any(s.delay_us for s in settings) else []
    if missing:
        print(f"settings with an added delay need {', '.join(missing)}; install with:\n"
              f"    {INSTALL_HINT}", file=sys.stderr)
        return 2
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: 1-minute load average is {load:.2f}; other work on this machine "
              "inflates the step times (see other_cpu_share_per_repeat in measured.json)",
              file=sys.stderr, flush=True)
    # SIGTERM / SIGHUP also unwind through the try/finally that stops the delay lines and
    # deletes the namespaces (Ctrl-C does so as KeyboardInterrupt)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    try:
        measured = sweep(settings, args.repeats, out_dir)
    except (KeyboardInterrupt, SystemExit):
        print(f"interrupted; delay lines stopped, namespaces left: {sorted(ours()) or 'none'}",
              file=sys.stderr)
        raise
    (out_dir / "measured.json").write_text(json.dumps(measured, indent=1) + "\n")
    print_table(measured)
    problems = check_outputs(measured, out_dir) + check_trends(settings, measured)
    print(f"total {measured['elapsed_s']} s; namespaces left: {sorted(ours()) or 'none'}")
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
