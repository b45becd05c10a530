"""Generate large, realistic PyTorch profiler (Kineto) Chrome-trace JSON files for benchmarks.

Why this exists: ingest benchmarks need traces of hundreds of MB to several GB with the shapes
real Kineto files have (nested CPU ops, launches with ac2g flows, kernels on compute and NCCL
streams, collectives, memory instants, metadata), but such files cannot live in the repo. Real
traces are also the only honest input for comparing against HTA, so the text layout mirrors
Kineto's own writer (``output_json.cpp``): one event per block of lines, ``"us.nnn"`` times
relative to ``baseTimeNanoseconds``.

Speed: events are produced by ``%``-formatting pre-baked text templates (no ``json.dumps`` of
dicts) and written one profiler step at a time, so memory stays bounded by one step's text
(by one transformer block when steps are very large) whatever the file size.

    python benchmarks/gen_trace.py --size 200MB --steps 129 --out /tmp/t.json [--gzip]
"""

# ruff: noqa: UP031  (%-formatting of pre-baked templates is the point: it is the fast path)
from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

GEN_VERSION = 2  # bump when the output changes, so cached benchmark inputs are regenerated

QUARTER_NS = 7_889_238 * 1_000_000_000  # Kineto floors baseTimeNanoseconds to this boundary
NUM_SMS = 132
DEVICE_NAME = "NVIDIA H100 80GB HBM3"
COMPUTE_STREAM = 7
NCCL_STREAM = 28
# Above this much text per step, step-level parents are written after their children so
# the output can be flushed block by block (memory stays bounded for huge steps).
STEP_BUFFER_CAP = 64 * 1024 * 1024

# Model shape (a GPT-ish transformer in bf16 with DDP over fp32 grad buckets).
BATCH, SEQ, HID, FFN, HEADS = 4, 2048, 2048, 8192, 16
TOK = BATCH * SEQ
HEAD_DIM = HID // HEADS
BUCKET_ELEMS = 25 * 1024 * 1024 // 4

# --------------------------------------------------------------------------- text templates

_EV_X = (
    '  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %%d.%%03d, "dur": %%d.%%03d,\n    "args": {\n      %s\n    }\n  },\n'
)
_FLOW_S = (
    '  {\n    "ph": "s", "id": %%d, "pid": %d, "tid": %d, "ts": %%d.%%03d,\n'
    '    "cat": "%s", "name": "%s"\n  },\n'
)
_FLOW_F = (
    '  {\n    "ph": "f", "id": %%d, "pid": %d, "tid": %d, "ts": %%d.%%03d,\n'
    '    "cat": "%s", "name": "%s", "bp": "e"\n  },\n'
)
_MEM = (
    '  {\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
    '    "pid": %d, "tid": %d,\n    "ts": %%d.%%03d,\n    "args": {\n'
    '      "Total Reserved": %%d, "Total Allocated": %%d, "Bytes": %%d, "Device Id": %d, '
    '"Device Type": 1, "Addr": %%d, "Ev Idx": %%d\n    }\n  },\n'
)
_META = (
    '  {\n    "name": "%s", "ph": "M", "ts": %d.%03d, "pid": %s, "tid": %s,\n'
    '    "args": {\n      "%s": %s\n    }\n  },\n'
)


def _esc(s: str) -> str:
    """Escape a literal for use inside a %-template."""
    return s.replace("%", "%%")


def _x(cat: str, name: str, pid: int, tid: int, args: str) -> str:
    """An X-event template; `args` may hold further %-placeholders (kept as is)."""
    return _EV_X % (cat, _esc(name), pid, tid, args)


_SHAPES: dict[str, str] = {}


def _shape_args(
    dims: list, types: list[str], strides: list | None = None, concrete: list[str] | None = None
) -> str:
    """record_shapes args in the order PyTorch 2.x writes them (memoized: hot path)."""
    key = repr((dims, types, strides, concrete))
    hit = _SHAPES.get(key)
    if hit is not None:
        return hit
    strides = strides if strides is not None else [_contig(d) if d else [] for d in dims]
    concrete = concrete if concrete is not None else [""] * len(dims)
    j = json.dumps
    out = _SHAPES[key] = _esc(
        f'"Concrete Inputs": {j(concrete)}, "Input type": {j(types)}, '
        f'"Input Strides": {j(strides)}, "Input Dims": {j(dims)}'
    )
    return out


def _contig(dims: list[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return out[::-1]


# --------------------------------------------------------------------------- catalogues


@dataclass(frozen=True)
class KernelSpec:
    """Static facts about one kernel type; durations are in ns."""

    name: str
    regs: int
    smem: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dur: int


def _k(name: str, regs: int, smem: int, grid: tuple, block: tuple, dur_us: float) -> KernelSpec:
    return KernelSpec(name, regs, smem, grid, block, int(dur_us * 1000))


_EW = "void at::native::vectorized_elementwise_kernel<4, {f}, std::array<char*, {n}ul> >(int, {f}, std::array<char*, {n}ul>)"  # noqa: E501
_GELU_F = "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}"  # noqa: E501
_GELUB_F = "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}"  # noqa: E501
_ADD_F = "at::native::CUDAFunctor_add<c10::BFloat16>"
_MTA = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<{n}>, at::native::(anonymous namespace)::{op}<float, {n}, {n}, 0>, {fn}>(at::native::(anonymous namespace)::TensorListMetadata<{n}>, at::native::(anonymous namespace)::{op}<float, {n}, {n}, 0>, {fn})"  # noqa: E501

KERNELS: dict[str, KernelSpec] = {
    "gemm_qkv": _k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", 168, 213248, (24, 64, 1), (384, 1, 1), 310),  # noqa: E501
    "gemm_sq": _k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", 154, 147456, (16, 64, 1), (256, 1, 1), 120),  # noqa: E501
    "gemm_up": _k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", 168, 213248, (32, 64, 1), (384, 1, 1), 470),  # noqa: E501
    "gemm_dgrad": _k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", 168, 213248, (16, 64, 1), (384, 1, 1), 330),  # noqa: E501
    "gemm_wgrad": _k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_on_kernel__5x_cublas", 154, 147456, (16, 32, 4), (256, 1, 1), 360),  # noqa: E501
    "bias_sum": _k("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<float, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 4> >(at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<float, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 4>)", 32, 16, (16, 256, 1), (32, 16, 1), 28),  # noqa: E501
    "ln_fwd": _k("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", 40, 0, (8192, 1, 1), (256, 1, 1), 45),  # noqa: E501
    "ln_bwd_in": _k("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float, false>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)", 48, 0, (8192, 1, 1), (128, 1, 1), 52),  # noqa: E501
    "ln_bwd_gb": _k("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16, float, 32u, 32u, 256u, false, true, false>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16*, c10::BFloat16*)", 64, 0, (64, 32, 1), (32, 32, 1), 38),  # noqa: E501
    "gelu": _k(_EW.format(f=_GELU_F, n=2), 26, 0, (32768, 1, 1), (128, 1, 1), 60),
    "gelu_bwd": _k(_EW.format(f=_GELUB_F, n=3), 30, 0, (32768, 1, 1), (128, 1, 1), 85),
    "add": _k(_EW.format(f=_ADD_F, n=3), 28, 0, (8192, 1, 1), (128, 1, 1), 30),
    "fill": _k(_EW.format(f="at::native::FillFunctor<float>", n=1), 16, 0, (1728, 1, 1), (128, 1, 1), 4),  # noqa: E501
    "flash_fwd": _k("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", 255, 49152, (16, 64, 1), (128, 1, 1), 420),  # noqa: E501
    "flash_bwd_dot": _k("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params)", 40, 0, (32, 64, 1), (256, 1, 1), 22),  # noqa: E501
    "flash_bwd": _k("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, false, false, true, false, false>(pytorch_flash::Flash_bwd_params)", 255, 98304, (32, 4, 16), (256, 1, 1), 980),  # noqa: E501
    "flash_bwd_cvt": _k("void pytorch_flash::flash_bwd_convert_dq_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params, int)", 40, 0, (32, 4, 16), (256, 1, 1), 30),  # noqa: E501
    "log_softmax": _k("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)", 38, 0, (8192, 1, 1), (1024, 1, 1), 150),  # noqa: E501
    "nll": _k("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<c10::BFloat16, float, long>(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, long const*, c10::BFloat16 const*, bool, long, long, long, long)", 30, 8192, (1, 1, 1), (32, 1, 1), 12),  # noqa: E501
    "adam_mul": _k(_MTA.format(n=1, op="BinaryOpScalarFunctor", fn="std::multiplies<float>"), 34, 0, (320, 1, 1), (512, 1, 1), 40),  # noqa: E501
    "adam_lerp": _k(_MTA.format(n=2, op="LerpFunctor", fn="float"), 40, 0, (320, 1, 1), (512, 1, 1), 55),  # noqa: E501
    "adam_addcmul": _k(_MTA.format(n=3, op="PointwiseOpScalarFunctor", fn="std::multiplies<float>"), 40, 0, (320, 1, 1), (512, 1, 1), 60),  # noqa: E501
    "adam_sqrt": _k(_MTA.format(n=2, op="UnaryOpFunctor", fn="at::native::Sqrt<float>"), 34, 0, (320, 1, 1), (512, 1, 1), 45),  # noqa: E501
    "adam_addcdiv": _k(_MTA.format(n=4, op="PointwiseOpScalarFunctor", fn="std::divides<float>"), 48, 0, (320, 1, 1), (512, 1, 1), 70),  # noqa: E501
}
NCCL_KERNEL = _k("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 96, 87568, (24, 1, 1), (640, 1, 1), 0)  # noqa: E501

# (cbid, typical duration ns) of the CUDA runtime calls we emit.
RUNTIME = {
    "cudaLaunchKernel": (211, 5200),
    "cudaLaunchKernelExC": (430, 9800),
    "cudaMemcpyAsync": (41, 9500),
    "cudaMemsetAsync": (51, 6400),
    "cudaEventRecord": (135, 2300),
    "cudaStreamWaitEvent": (147, 2600),
    "cudaStreamSynchronize": (131, 3000),
    "cudaStreamIsCapturing": (317, 900),
}


# --------------------------------------------------------------------------- generator


@dataclass
class GenStats:
    """What a generation run produced (also written as a sidecar by the benchmark driver)."""

    path: str
    bytes: int
    events: int
    steps: int
    modules_per_step: int
    seconds: float
    seed: int
    rank: int
    gzip: bool
    gen_version: int = GEN_VERSION

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


@dataclass
class JobRank:
    """One rank of a lockstep multi-rank job (generate(job=...), job_ranks()): the job's
    ranks share the timeline seed (same program, same durations), so the collectives match
    by Seq and call order across all of them, while each rank has its own ids and pids
    (`ids_seed`) and its node's clock (`clock_offset_ns`, added to every time).
    `straggle`: Seq -> extra ns of compute (a longer GEMM) just before that all-reduce.
    `coll_end`: Seq -> when the collective ends on the job's clock (the last rank's
    arrival + transfer), so every rank's NCCL kernel runs until then; `ends` is filled with
    this rank's own end per Seq (job_ranks() iterates on it)."""

    ids_seed: int
    clock_offset_ns: int = 0
    straggle: dict[int, int] = field(default_factory=dict)
    coll_end: dict[int, int] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)


class _Collector:
    """Tracks first/last GPU op per stream launched under a user annotation (Kineto's
    gpu_user_annotation spans)."""

    __slots__ = ("name", "ext", "spans")

    def __init__(self, name: str, ext: int) -> None:
        self.name = name
        self.ext = ext
        self.spans: dict[int, list[int]] = {}


class _Gen:
    """Lays out one rank's timeline and formats its events; one instance per output file."""

    def __init__(self, seed: int, rank: int, world: int, sink: Callable[[str], None],
                 job: JobRank | None = None) -> None:
        self.rng = random.Random(seed)
        self.rand = self.rng.random
        self.sink = sink
        self.rank, self.world = rank, world
        self.dev = rank % 8
        self.pid = 1_000_000 + self.rng.randrange(3_000_000)
        self.main = self.pid
        self.bwd = self.pid + 1000 + self.rng.randrange(9000)
        # Wall clock of the first step (late 2025); base floored to Kineto's ~91 day boundary.
        wall = 1_760_000_000 * 10**9 + self.rng.randrange(80 * 86_400 * 10**9)
        self.base_ns = wall // QUARTER_NS * QUARTER_NS
        self.t0 = wall - self.base_ns  # relative ns
        # id counters (start values look like a trace captured after some warm-up)
        self.ext = 40 + self.rng.randrange(200)
        self.rf = self.ext - 20
        self.ev = 0
        self.corr = 9000 + self.rng.randrange(5000)
        self.pyid = 2_000_000 + self.rng.randrange(100_000)
        self.seq = 1000
        self.fwdbwd = 0
        self.coll_seq = 0
        self.free = {COMPUTE_STREAM: 0, NCCL_STREAM: 0}
        self.mem_alloc = 1 << 30
        self.mem_reserved = 24 << 30
        self.addr = 0x7F3A_0000_0000
        self.events = 0
        self.bytes = 0
        # buffers: CPU-side (pre-order, with reserved slots) and activity side
        self.cpu: list[str] = []
        self.gpu: list[str] = []
        self.stack: list[list] = []
        self.open_slots = 0
        self.py_parent = self.pyid - 7
        self.collectors: list[_Collector] = []
        self.post_parents = False
        self.job = job
        self.idrng = self.rng
        if job is not None:
            self._job_identity(job)
        self._templates()

    # ------------------------------------------------------------------ templates

    def _templates(self) -> None:
        pid, dev = self.pid, self.dev
        self.tpl: dict[tuple, str] = {}
        plain = '"External id": %d,"Record function id": %d, '
        self.FLOW_S = {
            tid: _FLOW_S % (pid, tid, "ac2g", "ac2g") for tid in (self.main, self.bwd)
        }
        self.FLOW_F_CPU = {
            tid: _FLOW_F % (pid, tid, "ac2g", "ac2g") for tid in (self.main, self.bwd)
        }
        self.FLOW_F_GPU = {
            s: _FLOW_F % (dev, s, "ac2g", "ac2g") for s in (COMPUTE_STREAM, NCCL_STREAM)
        }
        self.FWDBWD_S = _FLOW_S % (pid, self.main, "fwdbwd", "fwdbwd")
        self.FWDBWD_F = _FLOW_F % (pid, self.bwd, "fwdbwd", "fwdbwd")
        self.MEM = {tid: _MEM % (pid, tid, dev) for tid in (self.main, self.bwd)}
        self.RT = {
            (api, tid): _x(
                "cuda_runtime", api, pid, tid,
                '"External id": %%d,      "cbid": %d, "correlation": %%d' % cbid,
            )
            for api, (cbid, _d) in RUNTIME.items()
            for tid in (self.main, self.bwd)
        }
        self.KT: dict[tuple[str, int], str] = {}
        for key, k in KERNELS.items():
            self.KT[(key, COMPUTE_STREAM)] = self._kernel_tpl(k, COMPUTE_STREAM, "")
        ranks = json.dumps(list(range(self.world)))
        self.coll_args = _esc(
            f'"Collective name": "allreduce", "In msg nelems": %d, "Out msg nelems": %d, '
            f'"Group size": {self.world}, "dtype": "Float", "In split size": "[]", '
            f'"Out split size": "[]", "Process Group Name": "0", '
            f'"Process Group Description": "default_pg", "Process Group Ranks": "{ranks}"'
        ).replace("%%d", "%d")
        self.NCCL_T = self._kernel_tpl(
            NCCL_KERNEL, NCCL_STREAM, ", " + self.coll_args + ', "Seq": %d'
        )
        self.RPC_T = _x(
            "cpu_op", "record_param_comms", pid, self.bwd,
            plain + '"Process Group Name": "0", "Global rank stride": 1, '
            '"Out msg nelems": %d, "Process Group Ranks": "' + ranks + '", '
            f'"Group size": {self.world}, "Global rank start": 0, "Ev Idx": %d, '
            '"In msg nelems": %d, "In split size": "[]", "Out split size": "[]", '
            '"dtype": "Float", "Process Group Description": "default_pg", '
            f'"Collective name": "allreduce", "Rank": {self.rank}, "Seq": %d',
        )
        self.MEMCPY = {
            kind: _x(
                "gpu_memcpy", name, dev, COMPUTE_STREAM,
                '"External id": %%d,      "device": %d, "context": 1,      "stream": %d, '
                '"correlation": %%d,      "bytes": %%d, "memory bandwidth (GB/s)": %%s'
                % (dev, COMPUTE_STREAM),
            )
            for kind, name in (
                ("HtoD", "Memcpy HtoD (Pinned -> Device)"),
                ("DtoH", "Memcpy DtoH (Device -> Pageable)"),
            )
        }
        self.MEMSET = _x(
            "gpu_memset", "Memset (Device)", dev, COMPUTE_STREAM,
            '"External id": %%d,      "device": %d, "context": 1,      "stream": %d, '
            '"correlation": %%d,      "bytes": %%d, "memory bandwidth (GB/s)": %%s'
            % (dev, COMPUTE_STREAM),
        )

    def _kernel_tpl(self, k: KernelSpec, stream: int, extra: str) -> str:
        blocks = k.grid[0] * k.grid[1] * k.grid[2]
        bpsm = blocks / NUM_SMS
        wpsm = bpsm * (k.block[0] * k.block[1] * k.block[2]) / 32
        occ = min(100, int(100 * min(wpsm, 64) / 64)) if k.regs < 128 else min(
            12, int(100 * min(wpsm, 8) / 64)
        )
        args = (
            '"External id": %%d,      "queued": 0, "device": %d, "context": 1,      '
            '"stream": %d, "correlation": %%d,      "registers per thread": %d,      '
            '"shared memory": %d,      "blocks per SM": %.6f,      "warps per SM": %.6f,      '
            '"grid": [%d, %d, %d],      "block": [%d, %d, %d],      '
            '"est. achieved occupancy %%%%": %d'
            % (self.dev, stream, k.regs, k.smem, bpsm, wpsm, *k.grid, *k.block, occ)
        )
        return _x("kernel", k.name, self.dev, stream, args + extra)

    def op_tpl(self, name: str, tid: int, shapes: str = "", seq: bool = False) -> str:
        """Template for a cpu_op; args (ext, [seq,] rf, ev)."""
        key = (name, tid, shapes, seq)
        t = self.tpl.get(key)
        if t is None:
            fwd = 0 if tid == self.main else 1
            head = (
                f'"External id": %d,"Sequence number": %d, "Fwd thread id": {fwd}, '
                '"Record function id": %d, '
                if seq
                else '"External id": %d,"Record function id": %d, '
            )
            t = _x("cpu_op", name, self.pid, tid, head + (shapes + ", " if shapes else "")
                   + '"Ev Idx": %d')
            self.tpl[key] = t
        return t

    def ann_tpl(self, name: str, tid: int) -> str:
        key = ("ann", name, tid)
        t = self.tpl.get(key)
        if t is None:
            t = _x("user_annotation", name, self.pid, tid,
                   '"External id": %d,"Record function id": %d, "Ev Idx": %d')
            self.tpl[key] = t
        return t

    def py_tpl(self, name: str) -> str:
        key = ("py", name)
        t = self.tpl.get(key)
        if t is None:
            t = _x("python_function", name, self.pid, self.main,
                   '"Python parent id": %d, "Python id": %d, "Ev Idx": %d')
            self.tpl[key] = t
        return t

    def gpu_ann_tpl(self, name: str, stream: int) -> str:
        key = ("gann", name, stream)
        t = self.tpl.get(key)
        if t is None:
            t = _x("gpu_user_annotation", name, self.dev, stream, '"External id": %d')
            self.tpl[key] = t
        return t

    # ------------------------------------------------------------------ primitives

    def j(self, base: int) -> int:
        """Jittered duration (+-30%)."""
        return int(base * (0.7 + 0.6 * self.rand()))

    def begin(self, tpl: str, t: int, kind: int = 0, seq: int = 0, post: bool = False) -> int:
        """Open a CPU slice at ~t (kind 0 op, 1 seq op, 2 annotation, 3 python); returns the
        cursor for its first child."""
        t += 200 + int(900 * self.rand())
        self.ev += 1
        if kind == 3:
            self.pyid += 1
            ids = (self.py_parent, self.pyid)
            self.py_parent = self.pyid
        else:
            self.ext += 1
            self.rf += 1
            ids = (self.ext, seq, self.rf) if kind == 1 else (self.ext, self.rf)
        slot = -1
        if not post:
            slot = len(self.cpu)
            self.cpu.append("")
            self.open_slots += 1
        self.stack.append([slot, tpl, t, ids, self.ev, kind])
        return t + 300 + int(1500 * self.rand())

    def end(self, t: int) -> int:
        """Close the innermost open CPU slice at ~t; returns the cursor after it."""
        slot, tpl, ts, ids, ev, kind = self.stack.pop()
        t += 300 + int(1200 * self.rand())
        d = t - ts
        s = tpl % (ts // 1000, ts % 1000, d // 1000, d % 1000, *ids, ev)
        if kind == 3:
            self.py_parent = ids[0]
        if slot >= 0:
            self.cpu[slot] = s
            self.open_slots -= 1
        else:
            self.cpu.append(s)
        return t

    def ext_top(self) -> int:
        """External id of the innermost cpu_op (annotations and python frames don't count)."""
        for e in reversed(self.stack):
            if e[5] < 2:
                return e[3][0]
        return 0

    def leaf(self, tpl: str, t: int, dur: int, kind: int = 0) -> int:
        """A CPU op with no children."""
        return self.end(self.begin(tpl, t, kind) + self.j(dur))

    def mem(self, tid: int, t: int, nbytes: int) -> int:
        """[memory] instant: allocation (nbytes > 0) or free (< 0) at t."""
        self.ev += 1
        self.mem_alloc += nbytes
        if nbytes > 0:
            self.addr += (nbytes + 511) & ~511
            addr = self.addr
        else:
            addr = self.addr - self.rng.randrange(1 << 20) * 512
        self.cpu.append(
            self.MEM[tid] % (t // 1000, t % 1000, self.mem_reserved, self.mem_alloc, nbytes,
                             addr, self.ev)
        )
        return t + 150 + int(300 * self.rand())

    def _rt(self, api: str, tid: int, t: int, until: int = 0) -> tuple[int, int, int]:
        """A cuda_runtime slice starting near t (lasting at least until `until`)."""
        t += 300 + int(1500 * self.rand())
        self.corr += 1 + (self.rand() < 0.25)
        d = max(self.j(RUNTIME[api][1]), until - t + 2500)
        self.gpu.append(self.RT[(api, tid)] % (t // 1000, t % 1000, d // 1000, d % 1000,
                                               self.ext_top(), self.corr))
        return t, d, self.corr

    def _gpu_op(self, stream: int, t_rt: int, dur: int, after: int = 0) -> int:
        start = max(t_rt + 4000 + int(6000 * self.rand()), self.free[stream] + 1200
                    + int(2500 * self.rand()), after)
        end = start + dur
        self.free[stream] = end
        for c in self.collectors:
            sp = c.spans.get(stream)
            if sp is None:
                c.spans[stream] = [start, end]
            else:
                sp[1] = end
        return start

    def launch(self, tid: int, t: int, kernel: str) -> int:
        """cudaLaunchKernel + its kernel on the compute stream, linked by correlation/ac2g."""
        ts, d, corr = self._rt("cudaLaunchKernel", tid, t)
        g = self.gpu
        g.append(self.FLOW_S[tid] % (corr, ts // 1000, ts % 1000))
        kd = self.j(KERNELS[kernel].dur)
        ks = self._gpu_op(COMPUTE_STREAM, ts, kd)
        g.append(self.KT[(kernel, COMPUTE_STREAM)] % (ks // 1000, ks % 1000, kd // 1000,
                                                       kd % 1000, self.ext_top(), corr))
        g.append(self.FLOW_F_GPU[COMPUTE_STREAM] % (corr, ks // 1000, ks % 1000))
        return ts + d

    def copy(self, tid: int, t: int, kind: str, nbytes: int) -> int:
        """cudaMemcpyAsync / cudaMemsetAsync + the GPU memcpy/memset."""
        api = "cudaMemsetAsync" if kind == "set" else "cudaMemcpyAsync"
        ts, d, corr = self._rt(api, tid, t)
        g = self.gpu
        g.append(self.FLOW_S[tid] % (corr, ts // 1000, ts % 1000))
        gbps = 2000.0 if kind == "set" else (24.0 if kind == "HtoD" else 18.0)
        kd = max(1200, int(nbytes / gbps * (0.9 + 0.2 * self.rand())))
        ks = self._gpu_op(COMPUTE_STREAM, ts, kd)
        tpl = self.MEMSET if kind == "set" else self.MEMCPY[kind]
        g.append(tpl % (ks // 1000, ks % 1000, kd // 1000, kd % 1000, self.ext_top(), corr,
                        nbytes, repr(nbytes / kd)))
        g.append(self.FLOW_F_GPU[COMPUTE_STREAM] % (corr, ks // 1000, ks % 1000))
        return ts + d

    def rt_only(self, tid: int, t: int, api: str, flow: str = "") -> int:
        """A runtime call with no GPU activity. As in real traces, Kineto may still write a
        lone ac2g `f` on the CPU thread (cudaEventRecord) or a lone `s`
        (cudaStreamWaitEvent without cuda_sync): quirks ingesters must tolerate."""
        ts, d, corr = self._rt(api, tid, t)
        if flow == "f":
            self.gpu.append(self.FLOW_F_CPU[tid] % (corr, ts // 1000, ts % 1000))
        elif flow == "s":
            self.gpu.append(self.FLOW_S[tid] % (corr, ts // 1000, ts % 1000))
        return ts + d

    def sync(self, tid: int, t: int) -> int:
        """cudaStreamSynchronize: the CPU waits until every stream has drained."""
        ts, d, _ = self._rt("cudaStreamSynchronize", tid, t, until=max(self.free.values()))
        return ts + d

    def open_collector(self, name: str) -> None:
        self.collectors.append(_Collector(name, self.ext))

    def close_collector(self) -> None:
        c = self.collectors.pop()
        for stream in sorted(c.spans):
            a, b = c.spans[stream]
            ts, d = a - 1, b - a + 2  # Kineto widens by 1 ns on each side
            self.gpu.append(self.gpu_ann_tpl(c.name, stream) % (
                ts // 1000, ts % 1000, d // 1000, d % 1000, c.ext))

    def flush(self) -> None:
        """Write buffered events if no reserved slot is still open."""
        if self.open_slots:
            return
        data = "".join(self.cpu) + "".join(self.gpu)
        self.events += len(self.cpu) + len(self.gpu)
        self.cpu.clear()
        self.gpu.clear()
        self.bytes += len(data)
        self.sink(data)

    def maybe_flush(self) -> None:
        if self.post_parents and not self.open_slots:
            self.flush()

    # ------------------------------------------------------------------ model pieces

    def py_frames(self, t: int, names: list[str], post: bool = False) -> int:
        for n in names:
            t = self.begin(self.py_tpl(n), t, 3, post=post)
        return t

    def py_close(self, t: int, n: int) -> int:
        for _ in range(n):
            t = self.end(t)
        return t

    def fwd_seq_op(self, name: str, shapes: str, t: int) -> tuple[int, int]:
        """Open an autograd-recording forward op (has a Sequence number and a fwdbwd `s`)."""
        self.seq += 1
        self.fwdbwd += 1
        t = self.begin(self.op_tpl(name, self.main, shapes, True), t, 1, self.seq)
        ts = self.stack[-1][2]
        self.cpu.append(self.FWDBWD_S % (self.fwdbwd, ts // 1000, ts % 1000))
        return t, self.fwdbwd

    def bwd_node(self, node: str, t: int, flow: int, seq: int) -> int:
        """Open `evaluate_function: node` and `node` on the autograd thread (fwdbwd `f`)."""
        bwd = self.bwd
        t = self.begin(self.op_tpl("autograd::engine::evaluate_function: " + node, bwd, "",
                                   True), t, 1, seq)
        t = self.begin(self.op_tpl(node, bwd, "", True), t, 1, seq)
        ts = self.stack[-1][2]
        self.cpu.append(self.FWDBWD_F % (flow, ts // 1000, ts % 1000))
        return t

    def accumulate_grad(self, t: int, dims: list[int]) -> int:
        bwd = self.bwd
        sh = _shape_args([dims], ["c10::BFloat16"])
        t = self.begin(self.op_tpl("autograd::engine::evaluate_function: "
                                   "torch::autograd::AccumulateGrad", bwd), t)
        t = self.begin(self.op_tpl("torch::autograd::AccumulateGrad", bwd), t)
        t = self.begin(self.op_tpl("aten::detach", bwd, sh), t)
        t = self.leaf(self.op_tpl("detach", bwd, sh), t, 1500)
        t = self.end(t)
        t = self.end(t)
        return self.end(t)

    # forward modules: each returns (cursor, backward-closure args)

    def m_linear(self, t: int, i: int, din: int, dout: int, gk: str) -> tuple[int, tuple]:
        main, bf = self.main, "c10::BFloat16"
        t = self.py_frames(t, [f"nn.Module: Linear_{i}", "torch/nn/modules/linear.py(125): forward",
                               "<built-in function linear>"])
        t = self.begin(self.op_tpl("aten::linear", main, _shape_args(
            [[BATCH, SEQ, din], [dout, din], [dout]], [bf] * 3)), t)
        t = self.begin(self.op_tpl("aten::t", main, _shape_args([[dout, din]], [bf])), t)
        t = self.begin(self.op_tpl("aten::transpose", main, _shape_args(
            [[dout, din], [], []], [bf, "Scalar", "Scalar"], concrete=["", "0", "1"])), t)
        t = self.leaf(self.op_tpl("aten::as_strided", main, _shape_args(
            [[dout, din], [], [], []], [bf, "ScalarList", "ScalarList", ""],
            concrete=["", f"[{din}, {dout}]", f"[1, {din}]", ""])), t, 1800)
        t = self.end(t)
        t = self.end(t)
        t = self.leaf(self.op_tpl("aten::view", main, _shape_args(
            [[BATCH, SEQ, din], []], [bf, "ScalarList"], concrete=["", f"[{TOK}, {din}]"])),
            t, 2500)
        t, flow = self.fwd_seq_op("aten::addmm", _shape_args(
            [[dout], [TOK, din], [din, dout], [], []], [bf, bf, bf, "Scalar", "Scalar"],
            concrete=["", "", "", "1", "1"]), t)
        seq = self.seq
        t = self.mem(main, t, TOK * dout * 2)
        t = self.launch(main, t, gk)
        t = self.end(t)
        t = self.leaf(self.op_tpl("aten::_unsafe_view", main, _shape_args(
            [[TOK, dout], []], [bf, "ScalarList"], concrete=["", f"[{BATCH}, {SEQ}, {dout}]"])),
            t, 2200)
        t = self.end(t)
        t = self.py_close(t, 3)
        return t, ("linear", flow, seq, din, dout)

    def m_layernorm(self, t: int, i: int) -> tuple[int, tuple]:
        main, bf = self.main, "c10::BFloat16"
        t = self.py_frames(t, [f"nn.Module: LayerNorm_{i}",
                               "torch/nn/modules/normalization.py(217): forward",
                               "torch/nn/functional.py(2900): layer_norm",
                               "<built-in method layer_norm of type object at 0x7f3b1c2e8a40>"])
        t = self.begin(self.op_tpl("aten::layer_norm", main, _shape_args(
            [[BATCH, SEQ, HID], [], [HID], [HID], [], []],
            [bf, "ScalarList", bf, bf, "Scalar", "Scalar"],
            concrete=["", f"[{HID}]", "", "", "1e-05", "True"])), t)
        t, flow = self.fwd_seq_op("aten::native_layer_norm", _shape_args(
            [[BATCH, SEQ, HID], [], [HID], [HID], []], [bf, "ScalarList", bf, bf, "Scalar"],
            concrete=["", f"[{HID}]", "", "", "1e-05"]), t)
        seq = self.seq
        t = self.mem(main, t, TOK * HID * 2)
        t = self.launch(main, t, "ln_fwd")
        t = self.end(t)
        t = self.end(t)
        t = self.py_close(t, 4)
        return t, ("ln", flow, seq)

    def m_attention(self, t: int, i: int) -> tuple[int, tuple]:
        main, bf = self.main, "c10::BFloat16"
        q = [BATCH, HEADS, SEQ, HEAD_DIM]
        t = self.py_frames(t, [f"nn.Module: SelfAttention_{i}", "model.py(61): forward",
                               "<built-in function scaled_dot_product_attention>"])
        t = self.begin(self.op_tpl("aten::scaled_dot_product_attention", main, _shape_args(
            [q, q, q, [], [], [], [], []],
            [bf, bf, bf, "", "Scalar", "Scalar", "", "Scalar"],
            concrete=["", "", "", "", "0.", "True", "", "False"])), t)
        t, flow = self.fwd_seq_op("aten::_scaled_dot_product_flash_attention", _shape_args(
            [q, q, q, [], [], [], []], [bf, bf, bf, "Scalar", "Scalar", "Scalar", ""],
            concrete=["", "", "", "0.", "True", "False", ""]), t)
        seq = self.seq
        t = self.begin(self.op_tpl("aten::_flash_attention_forward", main, _shape_args(
            [q, q, q, [], [], [], [], [], [], []], [bf, bf, bf] + [""] * 2 + ["Scalar"] * 5,
            concrete=["", "", "", "", "", "2048", "2048", "0.", "True", "False"])), t)
        t = self.mem(main, t, TOK * HID * 2)
        t = self.begin(self.op_tpl("aten::zeros", main, _shape_args(
            [[], [], [], [], []], ["ScalarList", "Scalar", "", "Device", ""],
            concrete=[f"[{BATCH}, {HEADS}, {SEQ}]", "6", "", "cuda:0", ""])), t)
        t = self.mem(main, t, BATCH * HEADS * SEQ * 4)
        t = self.begin(self.op_tpl("aten::zero_", main, _shape_args(
            [[BATCH, HEADS, SEQ]], ["float"])), t)
        t = self.copy(main, t, "set", BATCH * HEADS * SEQ * 4)
        t = self.end(t)
        t = self.end(t)
        t = self.launch(main, t, "flash_fwd")
        t = self.end(t)
        t = self.end(t)
        t = self.end(t)
        t = self.py_close(t, 3)
        return t, ("attn", flow, seq)

    def m_gelu(self, t: int, i: int) -> tuple[int, tuple]:
        main, bf = self.main, "c10::BFloat16"
        t = self.py_frames(t, [f"nn.Module: GELU_{i}",
                               "torch/nn/modules/activation.py(734): forward",
                               "<built-in function gelu>"])
        t, flow = self.fwd_seq_op("aten::gelu", _shape_args(
            [[BATCH, SEQ, FFN], []], [bf, ""], concrete=["", "tanh"]), t)
        seq = self.seq
        t = self.mem(main, t, TOK * FFN * 2)
        t = self.launch(main, t, "gelu")
        t = self.end(t)
        t = self.py_close(t, 3)
        return t, ("gelu", flow, seq)

    def m_add(self, t: int, i: int) -> tuple[int, tuple]:
        main, bf = self.main, "c10::BFloat16"
        t = self.py_frames(t, ["<built-in method add of Tensor object at 0x7f3a5c1b9e90>"])
        t, flow = self.fwd_seq_op("aten::add", _shape_args(
            [[BATCH, SEQ, HID], [BATCH, SEQ, HID], []], [bf, bf, "Scalar"],
            concrete=["", "", "1"]), t)
        seq = self.seq
        t = self.mem(main, t, TOK * HID * 2)
        t = self.launch(main, t, "add")
        t = self.end(t)
        t = self.py_close(t, 1)
        return t, ("add", flow, seq)

    def backward_module(self, t: int, info: tuple) -> tuple[int, int]:
        """Backward of one module on the autograd thread; returns (cursor, grad elems)."""
        bwd, kind, flow, seq = self.bwd, info[0], info[1], info[2]
        grads = 0
        if kind == "linear":
            din, dout = info[3], info[4]
            gk = "gemm_up" if dout >= FFN or din >= FFN else "gemm_dgrad"
            t = self.bwd_node("AddmmBackward0", t, flow, seq)
            t = self.leaf(self.op_tpl("aten::t", bwd), t, 2500)
            t = self.begin(self.op_tpl("aten::mm", bwd, _shape_args(
                [[TOK, dout], [dout, din]], ["c10::BFloat16"] * 2)), t)
            t = self.mem(bwd, t, TOK * din * 2)
            t = self.launch(bwd, t, gk)
            t = self.end(t)
            t = self.leaf(self.op_tpl("aten::t", bwd), t, 2500)
            t = self.begin(self.op_tpl("aten::mm", bwd, _shape_args(
                [[dout, TOK], [TOK, din]], ["c10::BFloat16"] * 2)), t)
            t = self.mem(bwd, t, din * dout * 2)
            t = self.launch(bwd, t, "gemm_wgrad")
            t = self.end(t)
            t = self.begin(self.op_tpl("aten::sum", bwd, _shape_args(
                [[TOK, dout], [], [], []], ["c10::BFloat16", "ScalarList", "Scalar", ""],
                concrete=["", "[0]", "True", ""])), t)
            t = self.launch(bwd, t, "bias_sum")
            t = self.end(t)
            t = self.end(t)
            t = self.mem(bwd, t, -TOK * dout * 2)
            t = self.end(t)
            t = self.accumulate_grad(t, [dout, din])
            t = self.accumulate_grad(t, [dout])
            grads = din * dout + dout
        elif kind == "ln":
            t = self.bwd_node("NativeLayerNormBackward0", t, flow, seq)
            t = self.begin(self.op_tpl("aten::native_layer_norm_backward", bwd, _shape_args(
                [[BATCH, SEQ, HID], [BATCH, SEQ, HID], [], [BATCH, SEQ, 1], [BATCH, SEQ, 1],
                 [HID], [HID], []],
                ["c10::BFloat16", "c10::BFloat16", "ScalarList", "float", "float",
                 "c10::BFloat16", "c10::BFloat16", "ScalarList"],
                concrete=["", "", f"[{HID}]", "", "", "", "", "[True, True, True]"])), t)
            t = self.mem(bwd, t, TOK * HID * 2)
            t = self.launch(bwd, t, "ln_bwd_in")
            t = self.launch(bwd, t, "ln_bwd_gb")
            t = self.end(t)
            t = self.end(t)
            t = self.mem(bwd, t, -TOK * HID * 2)
            t = self.end(t)
            t = self.accumulate_grad(t, [HID])
            t = self.accumulate_grad(t, [HID])
            grads = 2 * HID
        elif kind == "attn":
            t = self.bwd_node("ScaledDotProductFlashAttentionBackward0", t, flow, seq)
            t = self.begin(self.op_tpl("aten::_scaled_dot_product_flash_attention_backward",
                                       bwd), t)
            t = self.begin(self.op_tpl("aten::_flash_attention_backward", bwd), t)
            t = self.mem(bwd, t, 3 * TOK * HID * 2)
            t = self.begin(self.op_tpl("aten::zeros", bwd), t)
            t = self.begin(self.op_tpl("aten::zero_", bwd), t)
            t = self.copy(bwd, t, "set", TOK * HID * 4)
            t = self.end(t)
            t = self.end(t)
            t = self.launch(bwd, t, "flash_bwd_dot")
            t = self.launch(bwd, t, "flash_bwd")
            t = self.launch(bwd, t, "flash_bwd_cvt")
            t = self.end(t)
            t = self.end(t)
            t = self.end(t)
            t = self.mem(bwd, t, -TOK * HID * 2)
            t = self.end(t)
        elif kind == "gelu":
            t = self.bwd_node("GeluBackward0", t, flow, seq)
            t = self.begin(self.op_tpl("aten::gelu_backward", bwd, _shape_args(
                [[BATCH, SEQ, FFN], [BATCH, SEQ, FFN], []],
                ["c10::BFloat16", "c10::BFloat16", ""], concrete=["", "", "tanh"])), t)
            t = self.launch(bwd, t, "gelu_bwd")
            t = self.end(t)
            t = self.end(t)
            t = self.mem(bwd, t, -TOK * FFN * 2)
            t = self.end(t)
        else:  # residual add: CPU-only backward node
            t = self.bwd_node("AddBackward0", t, flow, seq)
            t = self.end(t)
            t = self.mem(bwd, t, -TOK * HID * 2)
            t = self.end(t)
        return t, grads

    def loss_backward(self, t: int, nflow: int, nseq: int, lflow: int, lseq: int) -> int:
        """NllLossBackward0 and LogSoftmaxBackward0: the first autograd nodes of a step."""
        bwd = self.bwd
        t = self.bwd_node("NllLossBackward0", t, nflow, nseq)
        t = self.begin(self.op_tpl("aten::nll_loss_backward", bwd), t)
        t = self.mem(bwd, t, TOK * 32000 * 2)
        t = self.begin(self.op_tpl("aten::zero_", bwd), t)
        t = self.launch(bwd, t, "fill")
        t = self.end(t)
        t = self.launch(bwd, t, "nll")
        t = self.end(t)
        t = self.end(t)
        t = self.end(t)
        t = self.bwd_node("LogSoftmaxBackward0", t, lflow, lseq)
        t = self.begin(self.op_tpl("aten::_log_softmax_backward_data", bwd), t)
        t = self.launch(bwd, t, "log_softmax")
        t = self.end(t)
        t = self.end(t)
        t = self.mem(bwd, t, -TOK * 32000 * 2)
        return self.end(t)

    def allreduce(self, t: int, nelems: int) -> int:
        """DDP bucket all-reduce from the autograd thread: record_param_comms, nccl:all_reduce
        annotation, event/wait calls and the NCCL kernel on its own stream."""
        bwd = self.bwd
        self.coll_seq += 1
        if self.job is not None and self.coll_seq in self.job.straggle:
            t = self._straggle(t, self.job.straggle[self.coll_seq])
        self.ev += 1
        t += 400 + int(900 * self.rand())
        self.ext += 1
        self.rf += 1
        slot = len(self.cpu)
        self.cpu.append("")
        self.open_slots += 1
        ts, ext, rf, ev = t, self.ext, self.rf, self.ev
        self.stack.append([-1, "", ts, (ext,), ev, 0])  # so launches inside link to it
        t += 2000 + int(3000 * self.rand())
        t = self.begin(self.ann_tpl("nccl:all_reduce", bwd), t, 2)
        self.open_collector("nccl:all_reduce")
        t = self.rt_only(bwd, t, "cudaEventRecord", "f")
        t = self.rt_only(bwd, t, "cudaStreamWaitEvent", "s")
        t_rt, d, corr = self._rt("cudaLaunchKernelExC", bwd, t)
        self.gpu.append(self.FLOW_S[bwd] % (corr, t_rt // 1000, t_rt % 1000))
        kd = int(nelems * 4 / 90.0 * (0.85 + 0.3 * self.rand())) + 15_000
        ks = self._gpu_op(NCCL_STREAM, t_rt, kd, after=self.free[COMPUTE_STREAM] + 2000)
        if self.job is not None:
            ks, kd = self._sync_end(ks, kd)
        self.gpu.append(self.NCCL_T % (ks // 1000, ks % 1000, kd // 1000, kd % 1000, ext, corr,
                                       nelems, nelems, self.coll_seq))
        self.gpu.append(self.FLOW_F_GPU[NCCL_STREAM] % (corr, ks // 1000, ks % 1000))
        t = t_rt + d
        t = self.rt_only(bwd, t, "cudaEventRecord", "f")
        self.close_collector()
        t = self.end(t)
        self.stack.pop()
        t += 3000 + int(4000 * self.rand())
        d = t - ts
        self.cpu[slot] = self.RPC_T % (ts // 1000, ts % 1000, d // 1000, d % 1000, ext, rf,
                                       nelems, ev, nelems, self.coll_seq)
        self.open_slots -= 1
        return t

    # ------------------------------------------------------------------ jobs (JobRank)

    def _job_identity(self, job: JobRank) -> None:
        """A rank of a lockstep job: the timeline rng (self.rng) is the job's, so every rank
        lays out the same program with the same durations; ids, pids and the clock are the
        rank's own."""
        r = self.idrng = random.Random(job.ids_seed)
        self.pid = self.main = 1_000_000 + r.randrange(3_000_000)
        self.bwd = self.pid + 1000 + r.randrange(9000)
        self.ext += r.randrange(200)
        self.rf = self.ext - 20
        self.corr += r.randrange(5000)
        self.pyid += r.randrange(100_000)
        self.py_parent = self.pyid - 7
        self.t0 += job.clock_offset_ns

    def _straggle(self, t: int, extra_ns: int) -> int:
        """A slow rank: one more weight-gradient GEMM of `extra_ns` on the compute stream
        just before this all-reduce (so the NCCL kernel starts that much later), under an
        aten::mm on the autograd thread. Draws nothing from the timeline rng, so the rest of
        the rank's layout stays the job's."""
        bwd = self.bwd
        self.ext += 1
        self.rf += 1
        self.ev += 1
        ext, rf, ev = self.ext, self.rf, self.ev
        t_rt = t + 600
        self.corr += 1
        corr = self.corr
        ks = max(t_rt + 5000, self.free[COMPUTE_STREAM] + 1500)
        self.free[COMPUTE_STREAM] = ks + extra_ns
        for c in self.collectors:
            sp = c.spans.get(COMPUTE_STREAM)
            if sp is None:
                c.spans[COMPUTE_STREAM] = [ks, ks + extra_ns]
            else:
                sp[1] = ks + extra_ns
        rt_d, op_d = 5200, 6800
        self.gpu.append(self.RT[("cudaLaunchKernel", bwd)] % (
            t_rt // 1000, t_rt % 1000, rt_d // 1000, rt_d % 1000, ext, corr))
        self.gpu.append(self.FLOW_S[bwd] % (corr, t_rt // 1000, t_rt % 1000))
        self.gpu.append(self.KT[("gemm_wgrad", COMPUTE_STREAM)] % (
            ks // 1000, ks % 1000, extra_ns // 1000, extra_ns % 1000, ext, corr))
        self.gpu.append(self.FLOW_F_GPU[COMPUTE_STREAM] % (corr, ks // 1000, ks % 1000))
        self.cpu.append(self.op_tpl("aten::mm", bwd) % (
            t // 1000, t % 1000, op_d // 1000, op_d % 1000, ext, rf, ev))
        return t + op_d

    def _sync_end(self, ks: int, kd: int) -> tuple[int, int]:
        """The NCCL kernel of a lockstep job ends when the last rank's transfer does
        (job.coll_end, on the job's clock), and starts up to 40 us (at most half its length)
        later than the job's layout says (this rank's own launch jitter, from its ids rng),
        so no two ranks arrive at the same ns: returns its start and
        duration on this rank, and records this rank's own end (arrival + transfer) in
        job.ends."""
        job = self.job
        assert job is not None
        off = job.clock_offset_ns
        job.ends[self.coll_seq] = ks + kd - off
        end = ks + kd
        target = job.coll_end.get(self.coll_seq)
        if target is not None and target + off > end:
            end = target + off
        jitter = self.idrng.randrange(max(1, min(40_000, (end - ks) // 2)))
        ks += jitter
        self.free[NCCL_STREAM] = end
        for c in self.collectors:
            sp = c.spans.get(NCCL_STREAM)
            if sp is not None:
                sp[1] = end
                if sp[0] == ks - jitter:  # the span began with this kernel
                    sp[0] = ks
        return ks, end - ks

    # ------------------------------------------------------------------ one step

    BLOCK = ("ln", "qkv", "attn", "proj", "add", "ln", "up", "gelu", "down", "add")

    def step(self, t: int, step_no: int, modules: int) -> int:
        """Emit one ProfilerStep; returns the cursor at its end."""
        main, bf = self.main, "c10::BFloat16"
        post = self.post_parents
        t = self.begin(self.ann_tpl(f"ProfilerStep#{step_no}", main), t, 2, post=post)
        self.open_collector(f"ProfilerStep#{step_no}")
        # data loading + host-to-device copies
        t = self.py_frames(t, ["torch/utils/data/dataloader.py(733): __next__",
                               "torch/utils/data/dataloader.py(789): _next_data"])
        t += self.j(120_000)
        t = self.py_close(t, 2)
        for _ in range(2):
            t = self.begin(self.op_tpl("aten::to", main, _shape_args(
                [[BATCH, SEQ], [], [], [], []], ["long", "Device", "Scalar", "Scalar", ""],
                concrete=["", "cuda:0", "4", "True", ""])), t)
            t = self.begin(self.op_tpl("aten::_to_copy", main), t)
            t = self.begin(self.op_tpl("aten::empty_strided", main), t)
            t = self.mem(main, t, TOK * 8)
            t = self.end(t)
            t = self.begin(self.op_tpl("aten::copy_", main, _shape_args(
                [[BATCH, SEQ], [BATCH, SEQ], []], ["long", "long", "Scalar"],
                concrete=["", "", "True"])), t)
            t = self.copy(main, t, "HtoD", TOK * 8)
            t = self.end(t)
            t = self.end(t)
            t = self.end(t)
        # forward
        t = self.begin(self.ann_tpl("## forward ##", main), t, 2, post=post)
        self.open_collector("## forward ##")
        t = self.py_frames(t, ["nn.Module: DistributedDataParallel_0",
                               "torch/nn/parallel/distributed.py(1636): forward"], post)
        saved: list[tuple] = []
        block = 0
        for m in range(modules):
            kind = self.BLOCK[m % 10]
            if m % 10 == 0:
                block = m // 10
                t = self.py_frames(t, [f"nn.Module: TransformerBlock_{block}",
                                       "model.py(88): forward"])
            if kind == "ln":
                t, info = self.m_layernorm(t, 2 * block + (m % 10 == 5))
            elif kind == "qkv":
                t, info = self.m_linear(t, 4 * block, HID, 3 * HID, "gemm_qkv")
            elif kind == "attn":
                t, info = self.m_attention(t, block)
            elif kind == "proj":
                t, info = self.m_linear(t, 4 * block + 1, HID, HID, "gemm_sq")
            elif kind == "up":
                t, info = self.m_linear(t, 4 * block + 2, HID, FFN, "gemm_up")
            elif kind == "down":
                t, info = self.m_linear(t, 4 * block + 3, FFN, HID, "gemm_up")
            elif kind == "gelu":
                t, info = self.m_gelu(t, block)
            else:
                t, info = self.m_add(t, m)
            saved.append(info)
            if m % 10 == 9 or m == modules - 1:
                t = self.py_close(t, 2)
                self.maybe_flush()
        # loss
        t = self.begin(self.op_tpl("aten::cross_entropy_loss", main, _shape_args(
            [[TOK, 32000], [TOK], [], [], [], []], [bf, "long", "", "Scalar", "Scalar", "Scalar"],
            concrete=["", "", "", "1", "-100", "0."])), t)
        t = self.begin(self.op_tpl("aten::log_softmax", main), t)
        t, lflow = self.fwd_seq_op("aten::_log_softmax", "", t)
        lseq = self.seq
        t = self.mem(main, t, TOK * 32000 * 2)
        t = self.launch(main, t, "log_softmax")
        t = self.end(t)
        t = self.end(t)
        t = self.begin(self.op_tpl("aten::nll_loss_nd", main), t)
        t = self.begin(self.op_tpl("aten::nll_loss", main), t)
        t, nflow = self.fwd_seq_op("aten::nll_loss_forward", "", t)
        nseq = self.seq
        t = self.launch(main, t, "nll")
        t = self.end(t)
        t = self.end(t)
        t = self.end(t)
        t = self.end(t)
        t = self.py_close(t, 2)
        self.close_collector()
        t = self.end(t)  # ## forward ##
        # backward on the autograd thread, main thread waits inside Tensor.backward
        t = self.begin(self.ann_tpl("## backward ##", main), t, 2, post=post)
        self.open_collector("## backward ##")
        t = self.py_frames(t, ["torch/_tensor.py(626): backward",
                               "torch/autograd/__init__.py(347): backward",
                               "torch/autograd/graph.py(823): _engine_run_backward"], post)
        tb = t + self.j(15_000)
        tb = self.loss_backward(tb, nflow, nseq, lflow, lseq)
        pending = 0
        for info in reversed(saved):
            tb, g = self.backward_module(tb, info)
            pending += g
            if pending >= BUCKET_ELEMS:
                tb = self.allreduce(tb, pending)
                pending = 0
            self.maybe_flush()
        if pending:
            tb = self.allreduce(tb, pending)
        t = tb + self.j(20_000)
        t = self.py_close(t, 3)
        self.close_collector()
        t = self.end(t)
        self.maybe_flush()
        # optimizer: the compute stream waits for the last all-reduce first
        t = self.begin(self.ann_tpl("Optimizer.step#AdamW.step", main), t, 2)
        self.open_collector("Optimizer.step#AdamW.step")
        t = self.py_frames(t, ["torch/optim/optimizer.py(487): wrapper",
                               "torch/optim/adamw.py(209): step"])
        # DDP's finalize made the compute stream wait for the last all-reduce
        self.free[COMPUTE_STREAM] = max(self.free.values())
        n_launch = max(1, modules // 16)
        for op, k in (("aten::_foreach_lerp_", "adam_lerp"), ("aten::_foreach_mul_", "adam_mul"),
                      ("aten::_foreach_addcmul_", "adam_addcmul"),
                      ("aten::_foreach_sqrt", "adam_sqrt"), ("aten::_foreach_div_", "adam_mul"),
                      ("aten::_foreach_add_", "adam_mul"),
                      ("aten::_foreach_addcdiv_", "adam_addcdiv")):
            t = self.begin(self.op_tpl(op, main), t)
            if op == "aten::_foreach_sqrt":
                t = self.mem(main, t, 4 * HID * HID)
            for _ in range(n_launch):
                t = self.launch(main, t, k)
            t = self.end(t)
        t = self.py_close(t, 2)
        self.close_collector()
        t = self.end(t)
        t = self.leaf(self.ann_tpl("Optimizer.zero_grad#AdamW.zero_grad", main), t, 9000, 2)
        # loss.item(): DtoH copy + stream sync, the CPU catches up with the GPU
        t = self.begin(self.op_tpl("aten::item", main, _shape_args([[]], ["float"])), t)
        t = self.begin(self.op_tpl("aten::_local_scalar_dense", main,
                                   _shape_args([[]], ["float"])), t)
        t = self.copy(main, t, "DtoH", 4)
        t = self.sync(main, t)
        t = self.end(t)
        t = self.end(t)
        self.close_collector()
        t = self.end(t)  # ProfilerStep
        self.flush()
        return t + self.j(40_000)

    # ------------------------------------------------------------------ header / trailer

    def header(self, base_after: bool) -> str:
        devs = []
        for i in range(8):
            devs.append(
                '    {\n'
                f'      "id": {i}, "name": "{DEVICE_NAME}", "totalGlobalMem": 84929347584,\n'
                '      "computeMajor": 9, "computeMinor": 0,\n'
                '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
                '      "regsPerBlock": 65536, "warpSize": 32,\n'
                f'      "sharedMemPerBlock": 49152, "numSms": {NUM_SMS}\n'
                '    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, '
                '"sharedMemPerMultiprocessor": 233472\n    }'
            )
        dist = {
            "backend": "nccl", "rank": self.rank, "world_size": self.world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                           "pg_size": self.world, "ranks": list(range(self.world))}],
            "nccl_version": "2.21.5",
        }
        trace_id = "%032X" % self.idrng.getrandbits(128)
        lines = [
            "{",
            '  "schemaVersion": 1,',
            '  "deviceProperties": [\n' + ",\n".join(devs) + "\n  ],",
            '  "cupti_version": 24,',
            '  "cuda_runtime_version": 12060,',
            '  "cuda_driver_version": 12040,',
            f'  "distributedInfo": {json.dumps(dist)},',
            '  "record_shapes": 1,',
            '  "profile_memory": 1,',
            '  "with_stack": 1,',
            f'  "trace_id": "{trace_id}",',
        ]
        if not base_after:
            lines += ['  "displayTimeUnit": "ms",',
                      f'  "baseTimeNanoseconds": {self.base_ns},']
        lines.append('  "traceEvents": [\n')
        return "\n".join(lines)

    def trailer(self, t_start: int, t_end: int, name: str, base_after: bool) -> str:
        a, b = t_start // 1000, t_start % 1000
        out: list[str] = []

        def meta(name: str, pid: object, tid: object, key: str, val: object) -> None:
            out.append(_META % (name, a, b, pid, tid, key, json.dumps(val)))

        pid = self.pid
        meta("process_name", pid, 0, "name", "python3.11")
        meta("process_labels", pid, 0, "labels", "CPU")
        meta("process_sort_index", pid, 0, "sort_index", pid)
        for d in range(8):
            meta("process_name", d, 0, "name", "python3.11")
            meta("process_labels", d, 0, "labels", f"GPU {d}")
            meta("process_sort_index", d, 0, "sort_index", 5000000 + d)
        for s in (COMPUTE_STREAM, NCCL_STREAM):
            meta("thread_name", self.dev, s, "name", f"stream {s} ")
            meta("thread_sort_index", self.dev, s, "sort_index", s)
        for tid, tname in ((self.main, "pt_main_thread"), (self.bwd, "pt_autograd_0")):
            meta("thread_name", pid, tid, "name", f"thread {tid} ({tname})")
            meta("thread_sort_index", pid, tid, "sort_index", tid)
        d = t_end - t_start
        out.append(
            '  {\n    "ph": "X", "cat": "Trace", "ts": %d.%03d, "dur": %d.%03d,\n'
            '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
            '    "args": {\n      "Op count": 0\n    }\n  },\n' % (a, b, d // 1000, d % 1000)
        )
        out.append(_META % ("process_sort_index", a, b, '"Spans"', 0, "sort_index", 536870912))
        out.append(
            '  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
            '    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": %d.%03d\n  },\n' % (a, b)
        )
        out.append(
            '  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
            '    "pid": "", "tid": "", "ts": %d.%03d\n  }\n' % (t_end // 1000, t_end % 1000)
        )
        self.events += len(out)
        tail = ["  ],", f'  "traceName": {json.dumps(name)}']
        if base_after:
            tail[-1] += ","
            tail += ['  "displayTimeUnit": "ms",', f'  "baseTimeNanoseconds": {self.base_ns}']
        return "".join(out) + "\n".join(tail) + "\n}\n"


# --------------------------------------------------------------------------- driver


def parse_size(text: str) -> int:
    """'200MB' -> 200_000_000 (decimal units; KiB/MiB/GiB are binary)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?)(i?)[bB]?\s*", text)
    if not m:
        raise ValueError(f"bad size: {text!r}")
    mult = {"": 1, "k": 1, "m": 2, "g": 3, "t": 4}[m.group(2).lower()]
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base**mult)


def _calibrate(seed: int, rank: int, world: int) -> tuple[int, float]:
    """Bytes of a step as a function of modules per step: (fixed part, per module)."""
    sizes = []
    for m in (20, 40):
        n = [0]

        def count(s: str, n: list[int] = n) -> None:
            n[0] += len(s)

        g = _Gen(seed, rank, world, count)
        # ids of a mid-size trace, so digit widths match what the real run writes
        g.ext += 400_000
        g.rf += 400_000
        g.ev += 1_000_000
        g.corr += 1_000_000
        g.pyid += 2_000_000
        g.seq += 200_000
        g.fwdbwd += 100_000
        g.step(g.t0, 50, m)
        sizes.append(n[0])
    per = (sizes[1] - sizes[0]) / 20
    return int(sizes[0] - 20 * per), per


def _open_sink(path: Path, use_gzip: bool) -> IO[bytes]:
    if use_gzip:
        try:
            from isal import igzip  # type: ignore[import-not-found]

            return igzip.open(path, "wb", compresslevel=1)  # type: ignore[return-value]
        except ImportError:
            return gzip.open(path, "wb", compresslevel=1)  # type: ignore[return-value]
    return open(path, "wb", buffering=4 * 1024 * 1024)


def generate(
    out: str | Path,
    size: int,
    steps: int = 129,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 8,
    use_gzip: bool | None = None,
    first_step: int = 2,
    base_after_events: bool = False,
    job: JobRank | None = None,
) -> GenStats:
    """Write a Kineto-shaped trace of about `size` uncompressed bytes with `steps`
    ProfilerStep windows; deterministic for a given seed and arguments."""
    if steps < 1 or size < 1:
        raise ValueError("steps and size must be positive")
    path = Path(out)
    if use_gzip is None:
        use_gzip = path.suffix == ".gz"
    t_begin = time.perf_counter()
    fixed, per_module = _calibrate(seed, rank, world_size)
    probe = _Gen(seed, rank, world_size, lambda s: None)
    head_len = len(probe.header(base_after_events)) + 12_000  # trailer is ~10 KB
    per_step = (size - head_len) / max(1, steps)
    modules = max(1, round((per_step - fixed) / per_module))
    tmp = path.with_name(path.name + ".tmp")
    with _open_sink(tmp, use_gzip) as fh:
        def sink(s: str) -> None:
            fh.write(s.encode("ascii"))

        g = _Gen(seed, rank, world_size, sink, job)
        g.post_parents = per_step > STEP_BUFFER_CAP
        head = g.header(base_after_events)
        g.bytes += len(head)
        sink(head)
        t = t_start = g.t0
        t += 35_000
        for i in range(steps):
            t = g.step(t, first_step + i, modules)
        tail = g.trailer(t_start, t + 5_000, str(path), base_after_events)
        g.bytes += len(tail)
        sink(tail)
    tmp.replace(path)
    return GenStats(str(path), g.bytes, g.events, steps, modules,
                    time.perf_counter() - t_begin, seed, rank, bool(use_gzip))


def _modules_per_step(size: int, steps: int, seed: int, rank: int, world: int) -> int:
    """generate()'s sizing: modules per step for about `size` bytes in `steps` steps."""
    fixed, per_module = _calibrate(seed, rank, world)
    head_len = len(_Gen(seed, rank, world, lambda s: None).header(False)) + 12_000
    per_step = (size - head_len) / max(1, steps)
    return max(1, round((per_step - fixed) / per_module))


def _probe_ends(job: JobRank, modules: int, steps: int, seed: int, world: int,
                first_step: int) -> dict[int, int]:
    """Lay out a job rank without writing it: its own all-reduce ends (Seq -> ns, job clock)."""
    job.ends = {}
    g = _Gen(seed, 0, world, lambda s: None, job)
    t = g.t0 + 35_000
    for i in range(steps):
        t = g.step(t, first_step + i, modules)
    return dict(job.ends)


def job_ranks(world: int, size: int, steps: int, seed: int = 0, stragglers: int | None = None,
              first_step: int = 2, straggle_ns: int = 2_000_000,
              gpus_per_node: int = 8) -> list[JobRank]:
    """The ranks of a lockstep data-parallel job of `world` ranks (generate(job=...) each).

    Every rank runs the same program (the job's timeline seed), with its own ids and pids,
    and its node's clock: node n's clock is off by a fixed pseudo-random amount within
    +-1.5 ms (node 0's by none), as NTP leaves hosts. `stragglers` ranks (default
    max(1, world // 256), spread over the job) are slow before one all-reduce of every step
    (straggler i before the step's (i % per_step + 2)-th, by straggle_ns + i x 0.5 ms): a
    longer GEMM on the compute stream, so their NCCL kernel starts later. Every rank's NCCL
    kernel of a collective ends when the last rank's transfer does (found by laying out the
    distinct ranks, a plain one and each straggler, until the ends agree)."""
    n_strag = max(1, world // 256) if stragglers is None else stragglers
    modules = _modules_per_step(size, steps, seed, 0, world)
    plain = JobRank(ids_seed=0)
    per_step = max(1, len(_probe_ends(plain, modules, steps, seed, world, first_step)) // steps)
    slow: dict[int, dict[int, int]] = {}
    for i in range(min(n_strag, world)):
        r = (i * world) // n_strag + world // (2 * n_strag)
        k = i % per_step + 2 if per_step > 1 else 1
        extra = straggle_ns + i * 500_000
        slow[r] = {s * per_step + min(k, per_step): extra for s in range(steps)}
    coll_end: dict[int, int] = {}
    for _ in range(200):
        ends = [_probe_ends(JobRank(0, 0, st, coll_end), modules, steps, seed, world,
                            first_step) for st in [{}, *slow.values()]]
        new = {q: max(e[q] for e in ends) for q in ends[0]}
        if new == coll_end:
            break
        coll_end = new
    out = []
    for r in range(world):
        node = r // gpus_per_node
        off = 0 if node == 0 else (node * 7_919_113) % 3_000_001 - 1_500_000
        out.append(JobRank(ids_seed=seed * 1_000_003 + r + 1, clock_offset_ns=off,
                           straggle=slow.get(r, {}), coll_end=dict(coll_end)))
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="200MB", help="uncompressed size, e.g. 200MB, 1GB, 1.5GiB")
    ap.add_argument("--steps", type=int, default=129, help="number of ProfilerStep windows")
    ap.add_argument("--out", required=True, help="output path (.json or .json.gz)")
    ap.add_argument("--gzip", action="store_true", help="gzip the output (also implied by .gz)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--first-step", type=int, default=2, help="N of the first ProfilerStep#N")
    ap.add_argument("--base-after-events", action="store_true",
                    help="write displayTimeUnit/baseTimeNanoseconds after traceEvents "
                         "(pre-2025-03 key order)")
    ap.add_argument("--json", action="store_true", help="print stats as JSON")
    a = ap.parse_args(argv)
    st = generate(a.out, parse_size(a.size), a.steps, a.seed, a.rank, a.world_size,
                  True if a.gzip else None, a.first_step, a.base_after_events)
    if a.json:
        print(json.dumps({**st.__dict__, "mb_per_s": round(st.mb_per_s, 1)}))
    else:
        print(f"wrote {st.path}: {st.bytes / 1e6:.1f} MB uncompressed, {st.events} events, "
              f"{st.steps} steps x {st.modules_per_step} modules, {st.seconds:.1f} s "
              f"({st.mb_per_s:.0f} MB/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
