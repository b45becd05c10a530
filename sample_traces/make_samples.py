"""Generate the committed sample traces: a real 2-rank DDP (gloo, CPU) job profiled by torch.

What it runs
    Two processes (ranks 0 and 1) started with ``torch.multiprocessing.spawn`` rendezvous on
    127.0.0.1 (``MASTER_ADDR``/``MASTER_PORT``, a free port picked at start-up; loopback only,
    ``GLOO_SOCKET_IFNAME=lo``) and form a gloo process group. Each wraps the same small MLP
    (512 -> 1024 -> 1024 -> 10, about 1.6 M float32 parameters, 6.3 MB of gradients) in
    ``DistributedDataParallel`` (``bucket_cap_mb=4``, so each backward pass issues more than
    one gradient allreduce) and trains it with SGD + momentum on synthetic data drawn from a
    per-rank seeded generator. After each optimizer step the loss is averaged across ranks
    with an explicit ``dist.all_reduce`` (a small, user-issued collective next to DDP's).

    The loop is profiled with ``torch.profiler.profile(activities=[CPU],
    schedule=schedule(wait=1, warmup=1, active=3, repeat=1), record_shapes=True,
    with_stack=False)`` and ``prof.step()`` each iteration, so the trace holds
    ``ProfilerStep#2`` .. ``ProfilerStep#4``. Each rank writes one gzipped Kineto Chrome
    trace, ``rank<R>.pt.trace.json.gz``, into ``--out``.

How to run
    torch is not a tracetool dependency; install the pinned CPU build into a separate venv
    (never an unpinned ``torch``, which would pull a multi-GB CUDA build)::

        python3 -m venv /tmp/torchvenv
        /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
        /tmp/torchvenv/bin/python sample_traces/make_samples.py            # default --out
        /tmp/torchvenv/bin/python sample_traces/make_samples.py --out /tmp/traces

    The default ``--out`` is ``ddp_gloo_2rank/`` next to this script. A run takes a few
    seconds on a 2-core machine. Seeds make the model, data and op sequence repeatable;
    timestamps, pids/tids and durations naturally differ from run to run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule

WORLD_SIZE = 2
SEED = 1234
BATCH = 64
IN_FEATURES = 512
HIDDEN = 1024
CLASSES = 10
BUCKET_CAP_MB = 4
WAIT, WARMUP, ACTIVE = 1, 1, 3
NUM_ITERS = WAIT + WARMUP + ACTIVE + 1  # one extra step after the active window closes
DEFAULT_OUT = Path(__file__).resolve().parent / "ddp_gloo_2rank"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def gzip_deterministic(src: Path, dst: Path) -> None:
    """gzip ``src`` to ``dst`` with no file name and mtime 0 in the header."""
    with open(src, "rb") as fin, open(dst, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            shutil.copyfileobj(fin, gz)


def run_rank(rank: int, world_size: int, out_dir: str, tmp_dir: str) -> None:
    torch.set_num_threads(1)  # 2 ranks on 2 cores: keep intra-op pools from fighting
    torch.manual_seed(SEED)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    model = DDP(build_model(), bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED + rank)
    batches = [
        (
            torch.randn(BATCH, IN_FEATURES, generator=gen),
            torch.randint(0, CLASSES, (BATCH,), generator=gen),
        )
        for _ in range(NUM_ITERS)
    ]

    trace_json = Path(tmp_dir) / f"rank{rank}.pt.trace.json"
    trace_gz = Path(out_dir) / f"rank{rank}.pt.trace.json.gz"

    def on_trace_ready(prof: profile) -> None:
        prof.export_chrome_trace(str(trace_json))
        gzip_deterministic(trace_json, trace_gz)

    dist.barrier()
    t0 = time.perf_counter()
    losses = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=on_trace_ready,
        record_shapes=True,
        with_stack=False,
    ) as prof:
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            mean_loss /= world_size
            losses.append(round(mean_loss.item(), 4))
            prof.step()
    elapsed = time.perf_counter() - t0
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        nparams = sum(p.numel() for p in model.parameters())
        print(
            f"params={nparams} ({nparams * 4 / 1e6:.1f} MB), iters={NUM_ITERS}, "
            f"loop {elapsed:.2f}s, mean losses={losses}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"directory for rank<R>.pt.trace.json.gz (default: {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

    with tempfile.TemporaryDirectory(prefix="tracetool-samples-") as tmp_dir:
        mp.spawn(run_rank, args=(WORLD_SIZE, str(out_dir), tmp_dir), nprocs=WORLD_SIZE)

    for rank in range(WORLD_SIZE):
        path = out_dir / f"rank{rank}.pt.trace.json.gz"
        with gzip.open(path, "rt") as f:
            trace = json.load(f)
        info = trace.get("distributedInfo")
        if not info or info.get("rank") != rank or info.get("world_size") != WORLD_SIZE:
            print(f"{path}: missing or wrong distributedInfo: {info!r}", file=sys.stderr)
            return 1
        print(f"{path}: {path.stat().st_size} bytes, {len(trace['traceEvents'])} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
