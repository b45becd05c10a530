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
    ``w4_<rate>[_<delay>]`` / ``w8_...`` (the same DDP job on 4 / 8 ranks),
    ``a2a_<rate>[_<delay>]`` (a 4-rank mixture-of-experts step with all-to-all), and the
    jobs of the second capture (issues 27 and 28): ``b1_...`` (DDP, one 16.8 MB gradient
    bucket), ``bs_...`` (DDP over 16 layers of 1 MiB, ``bucket_cap_mb=1``: 17 buckets),
    ``m2_...`` (a 1.06 M-parameter MLP, batch 512 per rank, 2 intra-op threads),
    ``skew<z>_...`` (the all-to-all job with Zipf(z)-skewed routing and split sizes) and
    ``pp<1f1b|gpipe><M>_...[_2dc]`` (a 4-stage send/recv pipeline, schedule and microbatches;
    ``_2dc``: the delay only between ranks {0, 1} and {2, 3}). JOBS, skew_counts,
    pipe_schedule and pipe_job say exactly what each runs. Every rank is a process started
    with ``ip netns exec netlab-r<R> [taskset -c <R mod ncpu>] <python> make_netlab.py
    --worker R``, ``GLOO_SOCKET_IFNAME=veth0``, ``MASTER_ADDR=198.18.0.1``,
    ``MASTER_PORT=29500``, gloo backend, ``torch.set_num_threads(T)`` (T = 1 but for ``m2``);
    jobs with more ranks than cores are pinned (taskset) 2 or 4 ranks per core, 2-rank jobs
    are not (as in the original data).

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
    the README's tables of a run. The default settings are the second capture's 22
    (``--settings original`` the first's 17, ``default,original`` both); a run keeps the
    settings of an existing ``measured.json`` it does not capture (``--replace``: not), each
    with the capture it came from. See README.md for the run time. Seeds make the model, data
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
DEEP_LAYERS = (512,) * 17 + (10,)  # 16 Linear(512, 512) + a head: 16.8 MB, ~1 MiB per layer
SMALL_LAYERS = (1024, 512, 512, 512, 10)  # 1,055,242 parameters, 4.2 MB of gradients
DDP_GLOBAL_BATCH = 256  # 128 per rank on 2 ranks (the original job), 64 on 4, 32 on 8
BUCKET_CAP_MB = 4
MOE_TOKENS, MOE_HIDDEN, MOE_FFN, MOE_CLASSES = 1024, 256, 512, 10  # per rank
PIPE_WIDTH, PIPE_LAYERS, PIPE_MB_ROWS, PIPE_CLASSES = 1024, 2, 64, 10  # per stage / microbatch
WAIT, WARMUP, ACTIVE = 1, 1, 6
PROFILED_ITERS = WAIT + WARMUP + ACTIVE + 1  # one extra step after the active window closes
UNPROFILED_ITERS = 10
DDP, MOE = "ddp_allreduce", "moe_all_to_all"
KIND_DDP, KIND_MOE, KIND_PIPE = "ddp", "moe", "pipeline"  # the code path a job runs
# the jobs by setting prefix: (pattern, i.e. the job's name in measured.json; world size; code
# path; parameters, over the code path's defaults). '' is the original 2-rank DDP job (bw_*,
# lat_*); skew<z> and pp<schedule><M> take their parameter from the prefix.
JOBS: dict[str, tuple[str, int, str, dict]] = {
    "": (DDP, 2, KIND_DDP, {}),
    "w4": (DDP, 4, KIND_DDP, {}),
    "w8": (DDP, 8, KIND_DDP, {}),
    "a2a": (MOE, 4, KIND_MOE, {}),
    "b1": ("ddp_one_bucket", 2, KIND_DDP, {"bucket_cap_mb": 25}),
    "bs": ("ddp_small_buckets", 2, KIND_DDP, {"bucket_cap_mb": 1, "layers": DEEP_LAYERS}),
    "m2": ("ddp_small_model_2threads", 2, KIND_DDP,
           {"layers": SMALL_LAYERS, "global_batch": 1024, "threads": 2}),
}
# 2 ranks x 2 intra-op threads = 4 threads on 2 cores: with libgomp's default spin-waiting a
# parallel region waits for a descheduled thread; measured here (2 processes, the 2-thread
# job's MLP, batch 512, on a loaded machine): 2.3 s a step spinning, 0.25-0.36 s passive
OMP_WAIT_POLICY = "PASSIVE"
DDP_DEFAULTS = {"bucket_cap_mb": BUCKET_CAP_MB, "layers": LAYERS,
                "global_batch": DDP_GLOBAL_BATCH, "threads": 1}
# the settings of the original run (2026-12-01), kept in measured.json by later runs
ORIGINAL_SETTINGS = ",".join([
    "2gbit", "1gbit", "500mbit", "200mbit",  # bandwidth, 2 ranks (bw_<rate>/)
    "lat_1gbit_1ms", "lat_1gbit_2ms", "lat_1gbit_5ms", "lat_1gbit_10ms",  # + one-way delay
    "lat_200mbit_5ms", "lat_2gbit_5ms",  # bandwidth x latency
    "w4_1gbit", "w4_500mbit", "w4_1gbit_5ms",  # 4 ranks
    "a2a_1gbit", "a2a_500mbit", "a2a_1gbit_2ms", "a2a_1gbit_5ms",  # all-to-all, 4 ranks
])
# the settings of the second run (issues 27 and 28): new jobs, 10 Gbit/s and 5 ms one-way
DEFAULT_SETTINGS = ",".join([
    "10gbit", "w4_10gbit",  # 10 Gbit/s for the original DDP families
    "b1_1gbit", "b1_10gbit", "b1_1gbit_5ms",  # one 16.8 MB gradient bucket
    "bs_1gbit", "bs_10gbit", "bs_1gbit_5ms",  # 16 buckets of ~1 MiB
    "m2_1gbit", "m2_10gbit", "m2_1gbit_5ms",  # a smaller model, more compute, 2 threads
    "w8_1gbit", "w8_10gbit", "w8_1gbit_5ms",  # 8 ranks
    "skew1_1gbit", "skew1_200mbit", "skew2_1gbit", "skew2_200mbit",  # skewed all-to-all
    "pp1f1b4_1gbit", "pp1f1b8_1gbit", "ppgpipe4_1gbit", "pp1f1b4_1gbit_5ms_2dc",  # pipeline
])
DEFAULT_REPEATS = 3
DEFAULT_OUT = Path(__file__).resolve().parent
HERE = Path(__file__).resolve().parent

MAX_WORLD = 8
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
    pattern: str  # the job's name (DDP, MOE, or a name from JOBS)
    kind: str = KIND_DDP  # the code path: KIND_DDP, KIND_MOE or KIND_PIPE
    params: str = "{}"  # the job's parameters over its code path's defaults (JSON, sorted)
    dc_split: int = 0  # > 0: the delay only between ranks [0, dc_split) and [dc_split, world)

    @property
    def family(self) -> tuple[str, int]:
        """Settings of one family run the same job, so their traces replay onto each other
        (the pattern names the job: the same pattern and world size is the same code and
        parameters)."""
        return self.pattern, self.world

    @property
    def job(self) -> dict:
        return json.loads(self.params)


_SETTING = re.compile(r"^(?:(bw|lat|w4|w8|a2a|b1|bs|m2|skew\d+(?:\.\d+)?|pp(?:1f1b|gpipe)\d+)_)?"
                      r"(\d+(?:\.\d+)?[kmg]?bit)(?:_(\d+(?:\.\d+)?)(ms|us))?(_2dc)?$")


def parse_setting(text: str) -> Setting:
    """'1gbit' / 'bw_1gbit' (2 ranks, DDP, no delay: dir bw_1gbit), 'lat_1gbit_5ms', 'w4_1gbit',
    'w8_1gbit_5ms', 'a2a_1gbit_2ms' (4 ranks, all-to-all), 'b1_10gbit', 'bs_1gbit', 'm2_1gbit'
    (the DDP variants of JOBS), 'skew2_200mbit' (all-to-all with Zipf-skewed routing, exponent
    2), 'pp1f1b4_1gbit' / 'ppgpipe4_1gbit' (pipeline, schedule and microbatches), and a
    pipeline with '_2dc': the delay only between ranks {0, 1} and {2, 3}."""
    m = _SETTING.match(text.strip().lower())
    if not m:
        raise ValueError(f"bad setting {text!r}: use e.g. 1gbit, lat_1gbit_5ms, w4_1gbit, "
                         "a2a_1gbit_2ms, b1_10gbit, skew2_1gbit, pp1f1b4_1gbit_5ms_2dc")
    prefix, rate, num, unit, dc = m.groups()
    delay_us = float(num) * (1000.0 if unit == "ms" else 1.0) if num else 0.0
    rate_bits(rate)
    suffix = (f"_{num}{unit}" if delay_us else "") + (dc or "")
    if dc and not (prefix or "").startswith("pp"):
        raise ValueError(f"bad setting {text!r}: _2dc is for the pipeline jobs (pp...)")
    if dc and not delay_us:
        raise ValueError(f"bad setting {text!r}: _2dc needs a delay between the two halves")
    if prefix in (None, "bw", "lat"):
        if delay_us == 0:
            return Setting(rate, f"bw_{rate}", rate, 0.0, 2, DDP)
        name = f"lat_{rate}{suffix}"
        return Setting(name, name, rate, delay_us, 2, DDP)
    name = f"{prefix}_{rate}{suffix}"
    if prefix.startswith("skew"):
        zipf = float(prefix[4:])
        pattern, world, kind, params = f"moe_skewed_zipf{zipf:g}", 4, KIND_MOE, {"zipf": zipf}
    elif prefix.startswith("pp"):
        sched, mbs = re.match(r"pp(1f1b|gpipe)(\d+)", prefix).groups()
        if int(mbs) < 1:
            raise ValueError(f"bad setting {text!r}: at least one microbatch")
        pattern, world, kind = f"pipeline_{sched}_mb{mbs}", 4, KIND_PIPE
        params = {"schedule": sched, "microbatches": int(mbs)}
    else:
        pattern, world, kind, params = JOBS[prefix]
    return Setting(name, name, rate, delay_us, world, pattern, kind,
                   json.dumps(params, sort_keys=True), world // 2 if dc else 0)


def expand_settings(text: str) -> list[str]:
    """--settings: names, and 'default' / 'original' for those lists."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if part in ("default", "original"):
            out += (DEFAULT_SETTINGS if part == "default" else ORIGINAL_SETTINGS).split(",")
        elif part:
            out.append(part)
    return out


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


def network_spec(bits: float, one_way_us: float, dc_split: int = 0,
                 dc_one_way_us: float = 0.0) -> str:
    """The tracetool network spec of a setting (replay/network.py parse_network syntax); with
    a split, ranks [0, dc_split) and [dc_split, n) are two datacenters whose link adds
    dc_latency = its one-way latency minus the link's own (``one_way_us``)."""
    spec = (f"gpus_per_node=1,inter_node_bw={spec_bandwidth(bits)},"
            f"inter_node_latency={round(one_way_us)}us")
    if dc_split:
        spec += (f",ranks_per_dc={dc_split},dc_bw={spec_bandwidth(bits)},"
                 f"dc_latency={round(dc_one_way_us - one_way_us)}us")
    return spec


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

    def __init__(self, exe: Path, delay_us: float, world: int, log_dir: Path,
                 dc_split: int = 0) -> None:
        self.exe, self.delay_us, self.world, self.log_dir = exe, delay_us, world, log_dir
        self.dc_split = dc_split
        self.procs: list[subprocess.Popen] = []
        self.rules: list[str] = []

    def peers(self, rank: int) -> list[int | None]:
        """The ranks whose packets ``rank`` delays: every one ([None]: no source match), or
        with a split only those on the other side of it."""
        if not self.dc_split:
            return [None]
        mine = rank < self.dc_split
        return [q for q in range(self.world) if (q < self.dc_split) != mine]

    def rules_of(self, rank: int, op: str) -> list[list[str]]:
        return [in_ns(NS_RANK[rank], IPTABLES, "-t", "mangle", op, "PREROUTING", "-i", RANK_IF,
                      *(["-s", f"{rank_addr(q)}/32"] if q is not None else []),
                      "-j", "NFQUEUE", "--queue-num", str(rank))
                for q in self.peers(rank)]

    def rule_text(self) -> str:
        src = (" -s <address of each rank on the other side of the split>" if self.dc_split
               else "")
        return (f"{IPTABLES} -t mangle -A PREROUTING -i {RANK_IF}{src} -j NFQUEUE "
                "--queue-num <rank>")

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
            self.rules.append(NS_RANK[rank])
            for cmd in self.rules_of(rank, "-A"):
                res = sh(*cmd, check=False)
                if res.returncode != 0:
                    raise RuntimeError(f"{IPTABLES} NFQUEUE rule failed in {NS_RANK[rank]}: "
                                       f"{res.stderr.strip()} (install: {INSTALL_HINT})")
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
            for cmd in self.rules_of(rank, "-D"):
                sh(*cmd, check=False)
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


def measure_rtt(script: str, delayed: bool, peer: int = 1) -> dict:
    """1-byte TCP ping-pong from rank 0's namespace to rank ``peer``'s, through the bridge, and
    the same over rank 0's own loopback (the Python + TCP stack cost; never delayed)."""
    rounds, warmup = PINGPONG["delayed" if delayed else "plain"]
    res = pingpong(script, NS_RANK[peer], NS_RANK[0], rank_addr(peer), PINGPONG_PORT, rounds,
                   warmup)
    lo = pingpong(script, NS_RANK[0], NS_RANK[0], "127.0.0.1", PINGPONG_PORT + 1,
                  *PINGPONG["plain"])
    res["loopback_rtt_ns_median"] = lo["rtt_ns_median"]
    return res


# --------------------------------------------------------------------------------------------
# the jobs (one rank; runs inside its namespace)


def build_mlp(layers: tuple[int, ...] = LAYERS):
    from torch import nn

    mods = []
    for i, (a, b) in enumerate(zip(layers, layers[1:], strict=False)):
        mods.append(nn.Linear(a, b))
        if i < len(layers) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def ddp_job(rank: int, world: int, iters: int, params: dict):
    """DDP over an MLP: returns (step(i) -> local loss tensor, info). The original job is
    DDP_DEFAULTS; JOBS' variants change the bucket cap, the layers, the batch, the threads."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    p = {**DDP_DEFAULTS, **params}
    layers = tuple(p["layers"])
    batch = p["global_batch"] // world
    model = DDP(build_mlp(layers), bucket_cap_mb=p["bucket_cap_mb"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED + rank)
    batches = [(torch.randn(batch, layers[0], generator=gen),
                torch.randint(0, layers[-1], (batch,), generator=gen)) for _ in range(iters)]

    def step(i: int):
        x, y = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    nparams = sum(p.numel() for p in model.parameters())
    return step, {"nparams": nparams, "grad_bytes": nparams * 4, "batch_per_rank": batch}


def skew_shares(zipf: float, experts: int) -> list[float]:
    """Each expert's share of the tokens: Zipf over the experts' popularity ranks (1 = the
    hottest), the popularity order a seeded permutation of the experts."""
    import random

    order = random.Random(SEED).sample(range(experts), experts)  # order[0]: the hottest
    weight = {e: 1.0 / (k + 1) ** zipf for k, e in enumerate(order)}
    total = sum(weight.values())
    return [weight[e] / total for e in range(experts)]


def skew_counts(zipf: float, world: int, tokens: int = MOE_TOKENS) -> list[list[int]]:
    """counts[src][e]: tokens rank src routes to expert e (the expert on rank e): each of
    src's tokens draws its expert from skew_shares (random.Random(SEED * 1000 + src)), once:
    the routing is the same every step. Pure Python, so anyone can recompute it."""
    import random

    shares = skew_shares(zipf, world)
    out = []
    for src in range(world):
        picks = random.Random(SEED * 1000 + src).choices(range(world), weights=shares, k=tokens)
        out.append([picks.count(e) for e in range(world)])
    return out


def moe_job(rank: int, world: int, iters: int, params: dict):
    """A mixture-of-experts layer with expert parallelism: dispatch and combine all-to-alls
    around this rank's expert, shared layers averaged with one flat allreduce. With
    params['zipf'] the routing is skewed (skew_counts): the all-to-alls carry split sizes and
    each rank's expert computes on the tokens it received."""
    import torch
    import torch.distributed as dist
    from torch import nn

    zipf = params.get("zipf")
    counts = skew_counts(zipf, world) if zipf is not None else None

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

    class AllToAllSplit(torch.autograd.Function):
        """all_to_all_single with split sizes (rows); backward swaps them."""

        @staticmethod
        def forward(ctx, x, in_splits, out_splits):
            ctx.splits = (in_splits, out_splits)
            out = x.new_empty((sum(out_splits), x.shape[1]))
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
            return out

        @staticmethod
        def backward(ctx, g):
            in_splits, out_splits = ctx.splits
            out = g.new_empty((sum(in_splits), g.shape[1]))
            dist.all_to_all_single(out, g.contiguous(), in_splits, out_splits)
            return out, None, None

    send = counts[rank] if counts else None  # rows to each expert (tokens sorted by expert)
    recv = [counts[src][rank] for src in range(world)] if counts else None

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
            if counts is None:
                routed = AllToAll.apply(h)  # dispatch: tokens [j*T/n, (j+1)*T/n) to rank j
                back = AllToAll.apply(self.expert(routed))  # combine
            else:  # tokens [sum(send[:j]), sum(send[:j+1])) to rank j's expert
                routed = AllToAllSplit.apply(h, send, recv)
                back = AllToAllSplit.apply(self.expert(routed), recv, send)
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
    info = {"nparams": sum(p.numel() for p in model.parameters()),
            "shared_params": nshared, "grad_bytes": nshared * 4,
            "a2a_bytes": MOE_TOKENS * MOE_HIDDEN * 4, "tokens_per_rank": MOE_TOKENS}
    if counts:
        info.update(split_counts=counts, expert_tokens=sum(recv))
    return step, info


def pipe_schedule(schedule: str, stage: int, stages: int, mbs: int) -> list[tuple]:
    """A stage's actions in order: ('comm', sends, recvs) with sends / recvs lists of
    ('fwd'|'bwd', microbatch) (a forward activation goes to stage + 1, a gradient to stage - 1;
    sends and receives of one action are posted together and waited for together, as
    Megatron's batched p2p does), ('fwd', mb), ('bwd', mb). GPipe: every forward, then every
    backward (microbatches in order); 1F1B (PipeDream-flush, Megatron's non-interleaved
    schedule): stages - stage - 1 warm-up forwards, then one forward and one backward in
    turn, then the remaining backwards."""
    first, last = stage == 0, stage == stages - 1
    out: list[tuple] = []

    def comm(sends: list, recvs: list) -> None:
        sends = [s for s in sends if (s[0] == "fwd" and not last) or (s[0] == "bwd" and not first)]
        recvs = [r for r in recvs if (r[0] == "fwd" and not first) or (r[0] == "bwd" and not last)]
        if sends or recvs:
            out.append(("comm", sends, recvs))

    if schedule == "gpipe":
        for mb in range(mbs):
            comm([], [("fwd", mb)])
            out.append(("fwd", mb))
            comm([("fwd", mb)], [])
        for mb in range(mbs):
            comm([], [("bwd", mb)])
            out.append(("bwd", mb))
            comm([("bwd", mb)], [])
        return out
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}")
    warm = min(stages - stage - 1, mbs)
    steady = mbs - warm
    for mb in range(warm):
        comm([], [("fwd", mb)])
        out.append(("fwd", mb))
        comm([("fwd", mb)], [])
    if steady:
        comm([], [("fwd", warm)])
    for k in range(steady):
        f, b = warm + k, k
        out.append(("fwd", f))
        comm([("fwd", f)], [("bwd", b)])
        out.append(("bwd", b))
        if k == steady - 1:
            comm([("bwd", b)], [])
        else:
            comm([("bwd", b)], [("fwd", f + 1)])
    for b in range(steady, mbs):
        comm([], [("bwd", b)])
        out.append(("bwd", b))
        comm([("bwd", b)], [])
    return out


def pipe_job(rank: int, world: int, iters: int, params: dict):
    """Pipeline parallel: stage = rank, PIPE_LAYERS x (Linear(W, W), ReLU) per stage (the
    last adds a Linear(W, 10) head and the loss), microbatches of PIPE_MB_ROWS rows, moved
    between stages with gloo isend/irecv (tag = the microbatch); each microbatch's compute
    is in a record_function 'fwd_mb<i>' / 'bwd_mb<i>'."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.profiler import record_function

    schedule, mbs = params["schedule"], params["microbatches"]
    first, last = rank == 0, rank == world - 1
    torch.manual_seed(SEED + 200 + rank)
    mods: list = []
    for _ in range(PIPE_LAYERS):
        mods += [nn.Linear(PIPE_WIDTH, PIPE_WIDTH), nn.ReLU()]
    if last:
        mods.append(nn.Linear(PIPE_WIDTH, PIPE_CLASSES))
    stage = nn.Sequential(*mods)
    opt = torch.optim.SGD(stage.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)
    data = [[(torch.randn(PIPE_MB_ROWS, PIPE_WIDTH, generator=gen),
              torch.randint(0, PIPE_CLASSES, (PIPE_MB_ROWS,), generator=gen))
             for _ in range(mbs)] for _ in range(iters)]
    plan = pipe_schedule(schedule, rank, world, mbs)
    shape = (PIPE_MB_ROWS, PIPE_WIDTH)

    def step(i: int):
        opt.zero_grad(set_to_none=True)
        inbox: dict[tuple, torch.Tensor] = {}  # ('fwd'|'bwd', mb) -> received tensor
        saved: dict[int, tuple] = {}  # mb -> (input, output or loss)
        outbox: dict[tuple, torch.Tensor] = {}  # ('fwd'|'bwd', mb) -> tensor to send
        total = torch.zeros(())
        for action in plan:
            if action[0] == "comm":
                _, sends, recvs = action
                works = []
                for kind, mb in sends:
                    peer = rank + 1 if kind == "fwd" else rank - 1
                    works.append(dist.isend(outbox.pop((kind, mb)), peer, tag=mb))
                for kind, mb in recvs:
                    peer = rank - 1 if kind == "fwd" else rank + 1
                    inbox[(kind, mb)] = buf = torch.empty(shape)
                    works.append(dist.irecv(buf, peer, tag=mb))
                for w in works:
                    w.wait()
            elif action[0] == "fwd":
                mb = action[1]
                with record_function(f"fwd_mb{mb}"):
                    if first:
                        x = data[i][mb][0]
                    else:
                        x = inbox.pop(("fwd", mb)).requires_grad_()
                    y = stage(x)
                    if last:
                        y = loss_fn(y, data[i][mb][1]) / mbs
                        total = total + y.detach()
                    else:
                        outbox[("fwd", mb)] = y.detach()
                saved[mb] = (x, y)
            else:
                mb = action[1]
                with record_function(f"bwd_mb{mb}"):
                    x, y = saved.pop(mb)
                    if last:
                        y.backward()
                    else:
                        y.backward(inbox.pop(("bwd", mb)))
                    if not first:
                        outbox[("bwd", mb)] = x.grad
        opt.step()
        return total * world  # the loss allreduce's mean is then the last stage's loss

    nparams = sum(p.numel() for p in stage.parameters())
    sends = sum(len(a[1]) for a in plan if a[0] == "comm")
    recvs = sum(len(a[2]) for a in plan if a[0] == "comm")
    return step, {"nparams": nparams, "grad_bytes": 0, "batch_per_rank": PIPE_MB_ROWS * mbs,
                  "schedule": schedule, "microbatches": mbs, "sends_per_step": sends,
                  "recvs_per_step": recvs, "message_bytes": PIPE_MB_ROWS * PIPE_WIDTH * 4,
                  "plan": [list(a) if a[0] != "comm" else ["comm", a[1], a[2]] for a in plan]}


def run_worker(rank: int, world: int, kind: str, params: dict, tmp_dir: Path) -> None:
    marks = {"start": time.time()}  # wall clock at each phase's end, for the run's breakdown
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    # one core's worth per rank at most (the original jobs): keep pools from fighting
    torch.set_num_threads(params.get("threads", 1))
    torch.manual_seed(SEED)
    marks["imported"] = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=RUN_TIMEOUT_S))
    marks["initialised"] = time.time()
    job = {KIND_DDP: ddp_job, KIND_MOE: moe_job, KIND_PIPE: pipe_job}[kind]
    step, info = job(rank, world, PROFILED_ITERS + UNPROFILED_ITERS, params)
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
    threads = s.job.get("threads", 1)
    env = dict(os.environ, GLOO_SOCKET_IFNAME=RANK_IF, MASTER_ADDR=rank_addr(0),
               MASTER_PORT=str(MASTER_PORT), OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if threads > 1:  # more threads than cores: OpenMP threads must sleep, not spin, at a
        env["OMP_WAIT_POLICY"] = OMP_WAIT_POLICY  # barrier (see OMP_WAIT_POLICY's comment)
    ncpu = os.cpu_count() or 1
    procs = []
    try:
        for rank in range(s.world):
            pin = ["taskset", "-c", str(rank % ncpu)] if s.world > ncpu else []
            log = open(run_dir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(
                in_ns(NS_RANK[rank], *pin, sys.executable, script, "--worker", str(rank),
                      "--world", str(s.world), "--kind", s.kind, "--params", s.params,
                      "--tmp", str(run_dir)),
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
    one element; the loss allreduce is left out), the gloo:all_to_all spans (ns), the
    pipeline's gloo:send / gloo:recv spans (ns, bytes) and fwd_mb<i> / bwd_mb<i> chunks."""
    steps = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                    and e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
    ars, a2as = gloo_spans(trace, "gloo:all_reduce"), gloo_spans(trace, "gloo:all_to_all")
    sr = {"send": gloo_spans(trace, "gloo:send"), "recv": gloo_spans(trace, "gloo:recv")}
    chunks = {k: sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                         and re.fullmatch(rf"{k}_mb\d+", e.get("name", ""))),
                        key=lambda e: e["ts"]) for k in ("fwd", "bwd")}
    per_step = []
    for s in steps:
        def inside(spans, s=s):
            return [a for a in spans if s["ts"] <= a["ts"] < s["ts"] + s["dur"]]
        grads = [a for a in inside(ars) if a["numel"] > 1]
        a2a = inside(a2as)
        p2p = {k: [(ns(a["dur"]), a["bytes"]) for a in inside(v)] for k, v in sr.items()}
        chunk = {k: [ns(a["dur"]) for a in inside(v)] for k, v in chunks.items()}
        per_step.append({"name": s["name"], "dur_ns": ns(s["dur"]), "p2p": p2p,
                         "chunks_ns": chunk,
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


def busiest_link_bytes(counts: list[list[int]], row_bytes: int) -> int:
    """The most bytes any rank sends to, or receives from, the other ranks in one all-to-all
    with counts[src][dst] rows (full duplex: a rank's own link carries both ways at once)."""
    n = len(counts)
    send = [sum(counts[r][j] for j in range(n) if j != r) for r in range(n)]
    recv = [sum(counts[j][r] for j in range(n) if j != r) for r in range(n)]
    return max(max(send), max(recv)) * row_bytes


def a2a_summary(every: list[list[dict]], world: int, rate_bytes: float,
                counts: list[list[int]] | None = None) -> dict:
    """Per all-to-all of a step (forward dispatch, forward combine, then backward's two):
    the shortest span over ranks, against (n-1)/n of the buffer over one link (equal splits)
    or the busiest link's bytes (``counts``: the skewed job's rows per rank pair)."""
    share = (world - 1) / world
    row_bytes = MOE_HIDDEN * 4
    per_call: dict[int, dict[str, list]] = {}
    busy = []
    for run_tr in every:
        for steps in zip(*[t["steps"] for t in run_tr], strict=True):
            for i, b in enumerate(steps[0]["a2a_bytes"]):
                durs = [s["a2a_ns"][i] for s in steps]
                slot = per_call.setdefault(i, {"bytes": b, "all": [], "min": [],
                                               "per_rank": [s["a2a_bytes"][i] for s in steps]})
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
    if counts:
        link = busiest_link_bytes(counts, row_bytes)
        for c in calls:
            c.update(bytes=None, busiest_link_bytes=link,
                     theory_ms=round(link / rate_bytes * 1e3, 3),
                     theory_ms_with_headers=round(link * WIRE / rate_bytes * 1e3, 3))
        for c, (_, slot) in zip(calls, sorted(per_call.items()), strict=True):
            c["input_bytes_per_rank"] = slot["per_rank"]
    out = {
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
    if counts:
        n = len(counts)
        out.update({
            "split_counts": counts,
            "split_counts_note": "split_counts[src][dst]: rows (tokens of "
                                 f"{row_bytes} bytes) rank src sends to rank dst's expert in "
                                 "the dispatch all-to-all, every step; the combine sends them "
                                 "back (splits swapped), backward repeats both",
            "row_bytes": row_bytes,
            "expert_tokens_per_rank": [sum(counts[s][r] for s in range(n)) for r in range(n)],
            "splits_per_rank": {f"rank{r}": {
                "dispatch": {"in": counts[r], "out": [counts[s][r] for s in range(n)]},
                "combine": {"in": [counts[s][r] for s in range(n)], "out": counts[r]}}
                for r in range(n)},
            "theory_formula": "max over ranks of the bytes it sends to or receives from the "
                              "others / (rate/8), per all-to-all: the busiest link paces it; "
                              "bandwidth only, no latency term",
            "notes": "skewed splits (split_counts); busy_ms_median: union of a step's "
                     "gloo:all_to_all spans, min over ranks, median over steps",
        })
    return out


def pipeline_summary(every: list[list[dict]], world: int, rate_bytes: float,
                     info: dict) -> dict:
    """The pipeline job's structure and timing: per stage (= rank) the sends and receives of
    a step and their bytes (from the traces), the fwd_mb / bwd_mb chunk medians, and the
    step's time outside the chunks (the stage's bubble plus its communication waits)."""
    stages = []
    for q in range(world):
        steps = [st for run_tr in every for st in run_tr[q]["steps"]]
        sends = {len(st["p2p"]["send"]) for st in steps}
        recvs = {len(st["p2p"]["recv"]) for st in steps}
        fwd = [d for st in steps for d in st["chunks_ns"]["fwd"]]
        bwd = [d for st in steps for d in st["chunks_ns"]["bwd"]]
        outside = [st["dur_ns"] - sum(st["chunks_ns"]["fwd"]) - sum(st["chunks_ns"]["bwd"])
                   for st in steps]
        stages.append({
            "stage": q,
            "sends_per_step": sorted(sends), "recvs_per_step": sorted(recvs),
            "send_bytes": sorted({b for st in steps for _, b in st["p2p"]["send"]}),
            "recv_bytes": sorted({b for st in steps for _, b in st["p2p"]["recv"]}),
            "fwd_chunks_per_step": sorted({len(st["chunks_ns"]["fwd"]) for st in steps}),
            "bwd_chunks_per_step": sorted({len(st["chunks_ns"]["bwd"]) for st in steps}),
            "fwd_chunk_ms_median": round(med(fwd) / 1e6, 3) if fwd else None,
            "bwd_chunk_ms_median": round(med(bwd) / 1e6, 3) if bwd else None,
            "outside_chunks_ms_median": round(med(outside) / 1e6, 3),
            "outside_chunks_share_median": round(med([o / st["dur_ns"] for o, st
                                                      in zip(outside, steps, strict=True)]), 3),
            "send_span_ms_median": round(med([d for st in steps for d, _ in st["p2p"]["send"]])
                                         / 1e6, 3) if any(st["p2p"]["send"] for st in steps)
            else None,
            "recv_span_ms_median": round(med([d for st in steps for d, _ in st["p2p"]["recv"]])
                                         / 1e6, 3) if any(st["p2p"]["recv"] for st in steps)
            else None,
        })
    msg = info["message_bytes"]
    return {
        "schedule": info["schedule"], "microbatches": info["microbatches"], "stages": world,
        "microbatch_rows": PIPE_MB_ROWS, "width": PIPE_WIDTH, "layers_per_stage": PIPE_LAYERS,
        "message_bytes": msg,
        "message_theory_ms": round(msg / rate_bytes * 1e3, 3),
        "message_theory_ms_with_headers": round(msg * WIRE / rate_bytes * 1e3, 3),
        "per_stage": stages,
        "notes": "stage = rank; sends_per_step / recvs_per_step: gloo:send / gloo:recv spans "
                 "inside each ProfilerStep (every step, every repeat: one value if all agree); "
                 "a span runs from posting the isend/irecv to its wait's end, so it includes "
                 "waiting for the peer; outside_chunks: ProfilerStep minus the stage's fwd_mb "
                 "and bwd_mb chunks (pipeline bubble, communication waits, the optimizer step "
                 "and the loss allreduce), medians over every repeat's steps",
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
    allreduce, bucket_bytes = (allreduce_summary(every, s.world, rate_bytes)
                               if s.kind != KIND_PIPE else (None, []))
    measured_one_way_us = r["rtt"]["rtt_ns_median"] / 2 / 1e3
    one_way_us = base_lat_us if not s.delay_us or s.dc_split else measured_one_way_us
    out = {
        "dir": s.dir,
        "pattern": s.pattern,
        "kind": s.kind,
        "job": s.job,
        "world_size": s.world,
        "dc_split": s.dc_split or None,
        "tc_rate": s.rate,
        "rate_bits_per_s": bits,
        "one_way_delay_us": s.delay_us,
        "tc_qdiscs": r["qdiscs"],
        "network_spec": network_spec(bits, one_way_us, s.dc_split, measured_one_way_us),
        "delay_rule": r.get("delay_rule"),
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
        "captured_utc": [run["launched_utc"] for run in runs],
        "run_phases_s": [run["phases"] for run in runs],
        "losses_rank0": [run["times"][0]["losses"] for run in runs],
    }
    if s.dc_split:
        out["tcp_pingpong"]["across"] = f"rank 0 to rank {s.dc_split} (across the split)"
        out["tcp_pingpong_within"] = pingpong_summary(r["rtt_within"], Setting(
            s.name, s.dir, s.rate, 0.0, s.world, s.pattern), base_rtt_ns)
        out["tcp_pingpong_within"].update(between="rank 0 to rank 1 (same side: not delayed)",
                                          base_rtt_us_median=round(base_rtt_ns / 1e3, 1))
    if s.kind == KIND_MOE:
        out["all_to_all"] = a2a_summary(every, s.world, rate_bytes, t0.get("split_counts"))
    if s.kind == KIND_PIPE:
        out["pipeline"] = pipeline_summary(every, s.world, rate_bytes, t0)
        out["pipeline"]["plan_per_rank"] = {f"rank{q}": runs[0]["times"][q]["plan"]
                                            for q in range(s.world)}
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
    delay = (DelayLines(exe, s.delay_us, s.world, run_dir, s.dc_split).start() if s.delay_us
             else None)
    try:
        if rep == 0:
            result["qdiscs"] = qdiscs
            result["delay_rule"] = delay.rule_text() if delay else None
            # with a split, across it (rank 0 to the first rank of the other side), and
            # within rank 0's side too (never delayed)
            result["rtt"] = measure_rtt(script, bool(s.delay_us), s.dc_split or 1)
            if s.dc_split:
                result["rtt_within"] = measure_rtt(script, False, 1)
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
                           "launched_utc": time.strftime("%Y-%m-%d %H:%M:%S",
                                                         time.gmtime(launched)),
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


def pattern_description(s: Setting, info: dict) -> dict:
    """measured.json's job.patterns entry of a setting's job (``info``: its rank 0's info)."""
    p = s.job
    if s.kind == KIND_DDP:
        d = {**DDP_DEFAULTS, **p}
        return {"model": f"MLP {tuple(d['layers'])}, DistributedDataParallel, bucket_cap_mb="
                         f"{d['bucket_cap_mb']}",
                "nparams": info["nparams"], "grad_bytes": info["grad_bytes"],
                "global_batch": d["global_batch"], "threads": d["threads"],
                "batch_per_rank": {str(w): d["global_batch"] // w for w in (2, 4, 8)},
                "collectives": "per step: the gradient buckets' allreduces (overlapping "
                               "backward), then the loss allreduce"}
    if s.kind == KIND_MOE:
        d = {"model": f"Linear({MOE_HIDDEN},{MOE_HIDDEN}) + ReLU (shared) -> all_to_all -> "
                      f"expert Linear({MOE_HIDDEN},{MOE_FFN}), ReLU, Linear({MOE_FFN},"
                      f"{MOE_HIDDEN}) (one per rank) -> all_to_all -> residual -> "
                      f"Linear({MOE_HIDDEN},{MOE_CLASSES}) (shared)",
             "tokens_per_rank": MOE_TOKENS, "nparams_per_rank": info["nparams"],
             "shared_params": info["shared_params"], "a2a_bytes": MOE_TOKENS * MOE_HIDDEN * 4,
             "collectives": "per step: 2 all_to_all_single forward (dispatch, combine), 2 in "
                            "backward, one flat allreduce of the shared gradients after "
                            "backward, the loss allreduce"}
        if "zipf" in p:
            d.update(a2a_bytes=None, zipf=p["zipf"], split_counts=info["split_counts"],
                     expert_shares=[round(x, 4) for x in skew_shares(p["zipf"], s.world)],
                     routing="skew_counts: expert e's share is proportional to 1/k^zipf, k its "
                             "popularity rank (1 = hottest) in random.Random(SEED).sample("
                             "range(n), n); each source rank src draws its 1024 tokens' experts "
                             "once with random.Random(SEED * 1000 + src).choices (the same "
                             "every step) and sends them, sorted by expert, with "
                             "all_to_all_single(out, in, output_split_sizes, "
                             "input_split_sizes); expert e (on rank e) computes on every token "
                             "routed to it; the trace's c10d::alltoall_base_ holds the split "
                             "sizes (Concrete Inputs [3] output, [4] input, in rows)")
        return d
    return {"model": f"{PIPE_LAYERS} x (Linear({PIPE_WIDTH},{PIPE_WIDTH}), ReLU) per stage, "
                     f"the last stage adds Linear({PIPE_WIDTH},{PIPE_CLASSES}) and the loss",
            "stages": s.world, "stage_of_rank": "stage = rank",
            "schedule": p["schedule"], "microbatches": p["microbatches"],
            "microbatch_rows": PIPE_MB_ROWS, "message_bytes": info["message_bytes"],
            "nparams_stage0": info["nparams"],
            "sends_per_step_rank0": info["sends_per_step"],
            "schedule_rule": (pipe_schedule.__doc__ or "").split("\n", 1)[1].strip(),
            "communication": "dist.isend / dist.irecv (gloo) with tag = the microbatch; an "
                             "activation goes stage s -> s + 1, its gradient s + 1 -> s; the "
                             "trace has c10d::send / c10d::recv_ (Concrete Inputs [2] peer, [3] "
                             "tag) and gloo:send / gloo:recv spans on the main thread, from "
                             "posting to the wait's end",
            "annotations": "record_function fwd_mb<i> / bwd_mb<i> around each microbatch's "
                           "compute on every stage",
            "collectives": "per step: the schedule's sends and receives, then one loss "
                           "allreduce over all stages (1 element; nonzero on the last stage)"}


def describe(settings: list[Setting], repeats: int, results: dict, base: dict,
             base_lat_us: float, sysctls: dict, started: float, out: dict) -> dict:
    """The top-level measured.json: how everything was made and measured, then the settings."""
    ddp = next((results[s.name]["runs"][0]["times"][0] for s in settings
                if s.pattern == DDP and s.world == 2), None)
    first = results[settings[0].name]["runs"][0]["times"][0]
    patterns = {}
    for s in settings:
        patterns.setdefault(s.pattern, pattern_description(
            s, results[s.name]["runs"][0]["times"][0]))
    launched = [run["launched_utc"] for s in settings for run in results[s.name]["runs"]]
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
                    "setting's job, described under patterns (one pattern and world size = "
                    "one job: its settings replay onto each other's network specs)",
            "patterns": patterns,
            "threads": "torch.set_num_threads(T), OMP_NUM_THREADS=T, T = the pattern's threads "
                       "(1 but for ddp_small_model_2threads); jobs with more ranks than cores "
                       "(4 and 8 ranks) pinned with taskset -c <rank mod ncpu>, the 2-rank "
                       "jobs not",
        },
        "network": {
            "latency_us_in_specs": round(base_lat_us),
            "latency_note": "inter_node_latency in the specs of undelayed settings is half the "
                            "median round trip of a 1-byte TCP ping-pong (Python, TCP_NODELAY) "
                            "between the rank namespaces, pooled over those settings. It is an "
                            "upper bound for the link: the same ping-pong over one namespace's "
                            "loopback (tcp_pingpong.loopback_rtt_us_median) costs nearly as "
                            "much. For a setting with an added delay it is half that setting's "
                            "own measured round trip (base + 2D + what the endpoints add); with "
                            "a split (dc_split) the spec keeps the undelayed latency and puts "
                            "the rest of the measured round trip across the split in "
                            "dc_latency (ranks_per_dc = dc_split)",
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
                     "TCP round trip; settings.<s>.delay_line holds its statistics. With a "
                     "split (settings.<s>.dc_split = k) the rule matches only packets from the "
                     "ranks on the other side (-s <their address>/32, one rule each): ranks "
                     "[0, k) and [k, n) reach each other through +D, each side's own ranks "
                     "without (settings.<s>.delay_rule)",
            "delay_check": f"TCP ping-pong round trip = base + 2D, from {RTT_SHORT_US:g} us "
                           f"short to {RTT_TOLERANCE_US:g} us + {RTT_TOLERANCE_SHARE:.0%} of 2D "
                           "long (tcp_pingpong.excess_us; the endpoints wake from idle after "
                           "every delayed packet); delay lines' mean lateness at most "
                           f"{DELAY_LATE_MAX_US:g} us; no packet dropped; with a split the "
                           "ping-pong crosses it (rank 0 to rank k) and "
                           "tcp_pingpong_within (rank 0 to rank 1) must show no delay",
            "rank_sysctls": sysctls,
        },
        "environment": {
            "torch": first["torch"], "python": platform.python_version(),
            "kernel": platform.release(), "cpus": os.cpu_count(),
        },
        "elapsed_s": round(time.monotonic() - started, 1),
        "captures": [{
            "utc": f"{min(launched)} - {max(launched)} (launches of the first and last run)",
            "settings": [s.name for s in settings], "repeats": repeats,
            "elapsed_s": round(time.monotonic() - started, 1),
            "latency_us_in_specs": round(base_lat_us),
            "base_tcp_pingpong_rtt_us_median": round(base["rtt_ns_median"] / 1e3, 1),
            "environment": {"torch": first["torch"], "python": platform.python_version(),
                            "kernel": platform.release(), "cpus": os.cpu_count()},
        }],
        "settings": {name: {**s, "capture": 0} for name, s in out.items()},
    }


# the original run's capture, for a measured.json written before captures were recorded
ORIGINAL_CAPTURE_UTC = "2026-12-01 14:32 - 14:43"


def merge_measured(old: dict, new: dict) -> dict:
    """``new`` (this run) over ``old`` (the file already there): settings this run did not
    capture are kept as they were, with the capture they came from (``captures``: one entry
    per run, oldest first; a setting's ``capture`` indexes it); the run's descriptions of the
    network, the environment and the elapsed time are this run's, its patterns added to the
    old ones. Every setting's data still comes from one run."""
    captures = old.get("captures") or [{
        "utc": ORIGINAL_CAPTURE_UTC, "settings": list(old["settings"]),
        "repeats": old["job"].get("repeats"), "elapsed_s": old.get("elapsed_s"),
        "latency_us_in_specs": old["network"].get("latency_us_in_specs"),
        "base_tcp_pingpong_rtt_us_median": old["network"].get(
            "base_tcp_pingpong_rtt_us_median"),
        "environment": old.get("environment"),
    }]
    index = len(captures)
    kept = {name: {**s, "kind": s.get("kind") or (KIND_MOE if s["pattern"] == MOE
                                                  else KIND_DDP),
                   "job": s.get("job", {}), "capture": s.get("capture", 0)}
            for name, s in old["settings"].items() if name not in new["settings"]}
    merged = dict(new)
    merged["job"] = {**new["job"], "patterns": {**old["job"].get("patterns", {}),
                                                **new["job"]["patterns"]}}
    if new["job"].get("nparams") is None:
        merged["job"]["nparams"] = old["job"].get("nparams")
    merged["captures"] = captures + new["captures"]
    merged["settings"] = {**kept, **{name: {**s, "capture": index}
                                     for name, s in new["settings"].items()}}
    return merged


# --------------------------------------------------------------------------------------------
# report and checks


def print_table(measured: dict) -> None:
    print(f"{'setting':>16} {'n':>2} {'D us':>6} {'RTT us':>8} {'prof ms':>8} {'unprof ms':>9} "
          f"{'PS# ms':>8} {'ar busy':>8} {'ar thy':>7} {'a2a busy':>8} {'a2a thy':>7}  spread")
    for name, s in measured["settings"].items():
        w, a = s["wall_ms"], s["allreduce"] or {}
        a2a = s.get("all_to_all") or {}
        sp = s["spread"]["unprofiled"]
        print(f"{name:>16} {s['world_size']:2d} {s['one_way_delay_us']:6.0f} "
              f"{s['tcp_pingpong']['rtt_us_median']:8.1f} {w['profiled_median']:8.1f} "
              f"{w['unprofiled_median']:9.1f} {s['traces']['profiler_step_ms_median']:8.1f} "
              f"{a.get('grad_busy_ms_median', float('nan')):8.1f} "
              f"{a.get('grad_theory_ms', float('nan')):7.1f} "
              f"{a2a.get('busy_ms_median', float('nan')):8.1f} "
              f"{a2a.get('theory_ms_per_step', float('nan')):7.1f}  "
              f"p10-p90 {sp['p10_ms']:.1f}-{sp['p90_ms']:.1f}, repeats "
              f"{', '.join(f'{x:.1f}' for x in sp['per_repeat_median_ms'])}")


def markdown_tables(measured: dict) -> str:
    """README tables of a measured.json, one per job (--tables)."""
    lines = []
    titles = {(DDP, 2): "DDP, 2 ranks", (DDP, 4): "DDP, 4 ranks", (DDP, 8): "DDP, 8 ranks",
              (MOE, 4): "all-to-all (MoE), 4 ranks"}
    captures = measured.get("captures") or [{"utc": ORIGINAL_CAPTURE_UTC}]
    fams: dict[tuple, list[tuple[str, dict]]] = {}
    for name, s in measured["settings"].items():
        fams.setdefault((s.get("pattern", DDP), s.get("world_size", 2)), []).append((name, s))
    for fam, members in fams.items():
        kind = members[0][1].get("kind", KIND_MOE if fam[0] == MOE else KIND_DDP)
        comm = {KIND_DDP: "gradient allreduce busy / theory", KIND_MOE: "all-to-all busy / "
                "theory", KIND_PIPE: "per stage: fwd / bwd chunk, outside chunks"}[kind]
        lines += [f"{titles.get(fam, f'{fam[0]}, {fam[1]} ranks')}:", "",
                  f"| setting | network spec | RTT us | step, profiled | step, unprofiled | "
                  f"ProfilerStep | {comm} | repeats (unprofiled medians) | captured |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for name, s in members:
            w, sp = s["wall_ms"], s.get("spread", {}).get("unprofiled", {})
            if kind == KIND_PIPE:
                cell = "; ".join(f"{st['fwd_chunk_ms_median']:.1f} / "
                                 f"{st['bwd_chunk_ms_median']:.1f}, "
                                 f"{st['outside_chunks_ms_median']:.0f}"
                                 for st in s["pipeline"]["per_stage"])
            else:
                c = s["all_to_all"] if kind == KIND_MOE else s["allreduce"]
                busy, thy = ((c["busy_ms_median"], c["theory_ms_per_step"]) if kind == KIND_MOE
                             else (c["grad_busy_ms_median"], c["grad_theory_ms"]))
                cell = f"{busy:.1f} / {thy:.1f}"
            reps = ", ".join(f"{x:.1f}" for x in sp.get("per_repeat_median_ms", []))
            day = captures[s.get("capture", 0)]["utc"][:10]
            lines.append(f"| {s.get('dir', 'bw_' + name)} | `{s['network_spec']}` | "
                         f"{s['tcp_pingpong']['rtt_us_median']:.0f} | "
                         f"{w['profiled_median']:.1f} | {w['unprofiled_median']:.1f} | "
                         f"{s['traces']['profiler_step_ms_median']:.1f} | {cell} "
                         f"| {reps} | {day} |")
        lines.append("")
    return "\n".join(lines)


def trace_structure_problems(path: Path, trace: dict, s: dict, rank: int) -> list[str]:
    """The trace holds what measured.json says about the job: the skewed all-to-all's split
    sizes (c10d::alltoall_base_), the pipeline's sends and receives per step (c10d::send /
    c10d::recv_ with their peers)."""
    problems = []
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    a2a = s.get("all_to_all") or {}
    if a2a.get("split_counts"):
        sp = a2a["splits_per_rank"][f"rank{rank}"]
        # forward: dispatch, combine; backward: combine's gradient (the dispatch's splits),
        # then dispatch's (the combine's)
        want = [sp["dispatch"], sp["combine"], sp["dispatch"], sp["combine"]]
        got = [{"out": json.loads(e["args"]["Concrete Inputs"][3]),
                "in": json.loads(e["args"]["Concrete Inputs"][4])}
               for e in events if e["name"] == "c10d::alltoall_base_"]
        if not got or any(g != want[i % 4] for i, g in enumerate(got)):
            problems.append(f"{path}: all-to-all split sizes differ from measured.json")
    pipe = s.get("pipeline")
    if pipe:
        st = pipe["per_stage"][rank]
        plan = pipe["plan_per_rank"][f"rank{rank}"]
        sends = sum(len(a[1]) for a in plan if a[0] == "comm")
        recvs = sum(len(a[2]) for a in plan if a[0] == "comm")
        if st["sends_per_step"] != [sends] or st["recvs_per_step"] != [recvs]:
            problems.append(f"{path}: sends/receives per step {st['sends_per_step']}/"
                            f"{st['recvs_per_step']}, the schedule has {sends}/{recvs}")
        peers = {int(e["args"]["Concrete Inputs"][2]) for e in events
                 if e["name"] in ("c10d::send", "c10d::recv_")}
        if not peers <= {rank - 1, rank + 1}:
            problems.append(f"{path}: a send/recv with a stage that is not a neighbour: {peers}")
    return problems


def check_outputs(measured: dict, out_dir: Path, only: list[str] | None = None) -> list[str]:
    """Every trace is there and complete; the delay was what was asked; nothing dropped (the
    settings ``only``, by default all)."""
    problems = []
    for name, s in measured["settings"].items():
        if only is not None and name not in only:
            continue
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
            kind = s.get("kind", KIND_MOE if s["pattern"] == MOE else KIND_DDP)
            want = ["gloo:all_reduce"] + {KIND_DDP: [], KIND_MOE: ["gloo:all_to_all"],
                                          KIND_PIPE: ["gloo:send", "gloo:recv", "fwd_mb0",
                                                      "bwd_mb0"]}[kind]
            if kind == KIND_PIPE and rank in (0, s["world_size"] - 1):
                want.remove("gloo:recv" if rank == 0 else "gloo:send")
            problems += [f"{path}: no {w} span" for w in want if w not in names]
            problems += trace_structure_problems(path, trace, s, rank)
            print(f"{path.relative_to(out_dir)}: {path.stat().st_size} bytes, "
                  f"{len(trace['traceEvents'])} events")
        within = s.get("tcp_pingpong_within")
        if within and within["rtt_us_median"] - within["base_rtt_us_median"] > RTT_TOLERANCE_US:
            problems.append(f"{name}: the ping-pong within one side of the split grew by "
                            f"{within['rtt_us_median'] - within['base_rtt_us_median']:.0f} us "
                            "(it must not be delayed)")
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


VALIDATION_SEED = 2728  # issues 27 and 28
VALIDATION_JOBS_HELD_OUT = 2


def validation_split(names: list[str], seed: int = VALIDATION_SEED) -> dict:
    """The held-out part of a capture's settings, chosen before the capture with a seeded RNG
    (random.Random(seed)), so no fitting ever sees it. The rule, in this order:

    1. jobs whose settings replay onto each other over the network (DDP, all-to-all) and
       that are new in this capture (no setting of theirs in ORIGINAL_SETTINGS): sorted,
       VALIDATION_JOBS_HELD_OUT of them are held out whole (rng.sample);
    2. every other job with a new setting (the rest of the new jobs, and the original
       2- and 4-rank DDP jobs' 10 Gbit/s settings): one of its new settings, by rng.choice
       over the sorted names (for a job with one new setting, that one);
    3. the pipeline jobs: they are what-ifs from the 1F1B / 4-microbatch trace at 1 Gbit/s
       (pp1f1b4_1gbit, the source, never held out); of the other pipeline settings, sorted,
       one is held out (rng.choice).
    """
    import random

    rng = random.Random(seed)
    settings = [parse_setting(n) for n in names]
    original = {parse_setting(n).family for n in ORIGINAL_SETTINGS.split(",")}
    jobs: dict[tuple, list[str]] = {}
    for s in settings:
        jobs.setdefault(s.family, []).append(s.name)
    net_new = sorted(f for f in jobs if f not in original and parse_setting(
        jobs[f][0]).kind != KIND_PIPE)
    held_jobs = rng.sample(net_new, VALIDATION_JOBS_HELD_OUT)
    held: list[str] = [n for f in held_jobs for n in jobs[f]]
    for f in sorted(jobs):
        if f in held_jobs or parse_setting(jobs[f][0]).kind == KIND_PIPE:
            continue
        held.append(rng.choice(sorted(jobs[f])))
    pipe = sorted(s.name for s in settings if s.kind == KIND_PIPE and s.name != "pp1f1b4_1gbit")
    if pipe:
        held.append(rng.choice(pipe))
    return {
        "seed": seed,
        "rng": "Python random.Random(seed): rng.sample, then rng.choice, in the rule's order",
        "rule": " ".join((validation_split.__doc__ or "").split("\n\n", 1)[1].split()),
        "chosen_from": names,
        "held_out_jobs": [f"{p}, {w} ranks" for p, w in held_jobs],
        "held_out_settings": sorted(held),
        "fit_settings": sorted(n for n in names if n not in held),
        "pipeline_source": "pp1f1b4_1gbit",
        "note": "the settings of the original capture (ORIGINAL_SETTINGS, 2026-12-01) are "
                "all fit settings: every constant fitted so far was fitted on them. A fitted "
                "constant must not be fitted on a held-out setting or job; out-of-sample "
                "figures on the held-out ones are reported apart.",
    }


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
    parser.add_argument("--replace", action="store_true",
                        help="write measured.json with this run's settings only (default: "
                             "keep the settings of an existing measured.json in --out that "
                             "this run does not capture, each with its capture)")
    parser.add_argument("--write-validation", type=Path, metavar="VALIDATION_JSON",
                        help="write the held-out split of --settings (validation_split, seed "
                             f"{VALIDATION_SEED}) to this file and exit")
    parser.add_argument("--tables", type=Path, metavar="MEASURED_JSON",
                        help="print the README's markdown tables of a measured.json and exit")
    # internal modes, used inside the namespaces
    parser.add_argument("--worker", type=int, metavar="RANK", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--kind", default=KIND_DDP, choices=[KIND_DDP, KIND_MOE, KIND_PIPE],
                        help=argparse.SUPPRESS)
    parser.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pingpong-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--pingpong-client", nargs=4,
                        metavar=("ADDR", "PORT", "ROUNDS", "WARMUP"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.tables is not None:
        print(markdown_tables(json.loads(args.tables.read_text())))
        return 0
    if args.write_validation is not None:
        try:
            split = validation_split([parse_setting(s).name
                                      for s in expand_settings(args.settings)])
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        args.write_validation.write_text(json.dumps(split, indent=1) + "\n")
        print(f"held out: {', '.join(split['held_out_settings'])}")
        return 0
    if args.worker is not None:
        run_worker(args.worker, args.world, args.kind, json.loads(args.params), args.tmp)
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
        settings = [parse_setting(s) for s in expand_settings(args.settings)]
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
    path = out_dir / "measured.json"
    if path.exists() and not args.replace:
        measured = merge_measured(json.loads(path.read_text()), measured)
    path.write_text(json.dumps(measured, indent=1) + "\n")
    print_table(measured)
    problems = (check_outputs(measured, out_dir, [s.name for s in settings])
                + check_trends(settings, measured))
    print(f"total {measured['elapsed_s']} s; namespaces left: {sorted(ours()) or 'none'}")
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
