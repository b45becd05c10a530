"""FLOPs and bytes of an op from its recorded shapes, and the roofline: one home for both
the analysis (the ``op_efficiency`` view) and the replay (projections onto another GPU), so
the two never disagree.

A kernel's work comes from the shapes of the op that launched it (``Input Dims``, ``Input
type`` and, for a convolution's stride / padding / dilation, ``Concrete Inputs``, recorded
with ``record_shapes``), using torch's flop-counter formulas (shared/docs/replay-models.md
section 4): mm/addmm/linear ``2mnk``, bmm/baddbmm ``2bmnk``, flash/SDPA forward ``4 b h s_q
s_k d``, convolution ``2 x output positions x weight elements`` (``2 N prod(out) C_out
C_in/groups prod(kernel)``); bytes are the inputs read plus the output written. Memory-bound
ops (``memory_bytes``) read every tensor input and write an output the size of the largest.

The roofline of ``work`` on a GPU is ``max(flops / (peak(dtype) x achievable compute), bytes
/ (hbm x achievable memory))`` (``roofline_terms``): the op is compute-bound when the first
term is the larger, i.e. when its arithmetic intensity (FLOPs per byte) is at or above the
ridge point ``peak x achievable compute / (hbm x achievable memory)``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from tracetool.dtypes import ELEM_BYTES
from tracetool.hardware import Gpu

# ops whose output is much smaller than their input (it is not counted in their bytes)
_REDUCING = re.compile(r"::(mean|sum|amax|amin|max|min|norm|linalg_vector_norm|all|any|prod|"
                       r"var|std|var_mean|std_mean|argmax|argmin|count_nonzero)$")
# ops that move data without arithmetic: no FLOPs (op_counts)
_MOVING = re.compile(r"::(copy_|_to_copy|to|clone|contiguous|cat|stack|index_select|index|"
                     r"embedding|gather|scatter|fill_|zero_|zeros|ones|full|repeat|"
                     r"expand|flip|roll|_unsafe_view|view|reshape|slice|select|"
                     r"constant_pad_nd|pad|masked_fill_|masked_fill)$")
DTYPE_OF = {"float": "fp32", "float32": "fp32", "double": "fp32", "half": "fp16",
            "c10::half": "fp16", "float16": "fp16", "bfloat16": "bf16",
            "c10::bfloat16": "bf16", "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8"}
# a convolution op's argument positions: (stride, padding, dilation, transposed or None)
_CONV_ARGS = {"aten::conv1d": (3, 4, 5, None), "aten::conv2d": (3, 4, 5, None),
              "aten::conv3d": (3, 4, 5, None), "aten::convolution": (3, 4, 5, 6),
              "aten::_convolution": (3, 4, 5, 6), "aten::cudnn_convolution": (3, 2, 4, None),
              "aten::miopen_convolution": (4, 3, 5, None),
              "aten::mkldnn_convolution": (4, 3, 5, None)}


_MATMUL = ("aten::mm", "aten::addmm", "aten::matmul", "aten::bmm", "aten::baddbmm",
           "aten::linear")
_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention")


def op_class(op: str | None) -> str | None:
    """The class of an op ``op_work`` has a formula for, named as the kernels view names
    kernel categories (gemm, attention, conv), None for any other op."""
    name = (op or "").lower()
    if name in _MATMUL:
        return "gemm"
    if _ATTENTION.search(name):
        return "attention"
    return "conv" if name in _CONV_ARGS or name == "aten::convolution_backward" else None


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    dtype: str  # fp32 / fp16 / bf16 / fp8, or "" for an op on no floating type (op_counts)


def _numel(dims: list) -> int:
    return math.prod(int(d) for d in dims) if dims else 1


def _concrete_ints(concrete: list | None, i: int, n: int) -> list[int] | None:
    """Argument ``i`` of ``Concrete Inputs`` as ``n`` ints (one int repeats), else None."""
    if not concrete or i >= len(concrete):
        return None
    try:
        v = json.loads(str(concrete[i]))
    except ValueError:
        return None
    v = [v] * n if isinstance(v, int) else v
    if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
        return None
    v = v * n if len(v) == 1 else v
    return v if len(v) == n else None


def _conv(name: str, tensors: list, concrete: list | None) -> tuple[int, int] | None:
    """(FLOPs, output elements) of a forward convolution, from its input and weight shapes
    and its stride / padding / dilation (``Concrete Inputs``); None without them or for a
    transposed one."""
    at = _CONV_ARGS.get(name)
    if at is None or len(tensors) < 2:
        return None
    (x, _), (w, _) = tensors[:2]
    n = len(x) - 2
    if n < 1 or len(w) != len(x):
        return None
    if at[3] is not None and (not concrete or len(concrete) <= at[3]
                              or str(concrete[at[3]]).lower() != "false"):
        return None  # transposed (or not recorded)
    stride, pad, dil = (_concrete_ints(concrete, i, n) for i in at[:3])
    if stride is None or pad is None or dil is None:
        return None
    out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
           for i in range(n)]
    if min(out) < 1:
        return None
    positions = x[0] * math.prod(out)
    return 2 * positions * _numel(w), positions * w[0]


def _conv_backward(tensors: list, concrete: list | None) -> tuple[int, int] | None:
    """(FLOPs, output elements) of aten::convolution_backward(grad_output, input, weight,
    ..., output_mask): the input's gradient and the weight's, each a forward's FLOPs over
    the grad_output's positions, as its output_mask (Concrete Inputs, the last argument)
    asks; None without it or for a transposed convolution (argument 7)."""
    if len(tensors) < 3 or not concrete:
        return None
    (g, _), (x, _), (w, _) = tensors[:3]
    if not (len(g) == len(x) == len(w) >= 3) or str(concrete[7]).lower() != "false":
        return None
    try:
        mask = json.loads(str(concrete[-1]).lower())
    except ValueError:
        return None
    if not (isinstance(mask, list) and len(mask) == 3):
        return None
    positions = g[0] * math.prod(g[2:])
    flops = 2 * positions * _numel(w) * (bool(mask[0]) + bool(mask[1]))
    out = _numel(x) * bool(mask[0]) + _numel(w) * bool(mask[1]) + w[0] * bool(mask[2])
    return flops, out


def op_work(op: str, dims: list, types: list, concrete: list | None = None) -> Work | None:
    """FLOPs and bytes of a matmul, attention or convolution op from its Input Dims / Input
    type (and Concrete Inputs, which a convolution needs), None for any other op or when
    they are not recorded."""
    tensors = [(d, t) for d, t in zip(dims, types, strict=False)
               if isinstance(d, list) and d and all(isinstance(x, int) and x >= 0 for x in d)]
    if not tensors:
        return None
    elem = ELEM_BYTES.get((tensors[0][1] or "").lower())
    dtype = DTYPE_OF.get((tensors[0][1] or "").lower())
    if elem is None or dtype is None:
        return None
    name = op.lower()
    flops = out = None
    try:
        mats2 = [d for d, _ in tensors if len(d) == 2]
        mats3 = [d for d, _ in tensors if len(d) == 3]
        if name in ("aten::mm", "aten::addmm", "aten::matmul") and len(mats2) >= 2:
            a, b = mats2[-2:]  # addmm: (bias, mat1, mat2); the bias may be 1-D or absent
            flops, out = 2 * a[0] * a[1] * b[1], a[0] * b[1]
        elif name in ("aten::bmm", "aten::baddbmm") and len(mats3) >= 2:
            a, b = mats3[-2:]
            flops, out = 2 * a[0] * a[1] * a[2] * b[2], a[0] * a[1] * b[2]
        elif name == "aten::linear" and len(tensors) >= 2:
            (x, _), (w, _) = tensors[:2]
            rows = _numel(x[:-1])
            flops, out = 2 * rows * x[-1] * w[0], rows * w[0]
        elif _ATTENTION.search(name) and len(tensors) >= 3:
            # a backward op's first tensor is the output's gradient, then q, k, v; it
            # recomputes the scores and runs four more matmuls: 10 b h s_q s_k d, 2.5 x the
            # forward's 4 (torch's sdpa_backward_flop_count), and writes dq, dk, dv
            backward = name.endswith("_backward")
            (q, _), (k, _) = tensors[1:3] if backward else tensors[:2]
            if len(q) == 4 and len(k) == 4:
                # aten::_flash/_efficient_attention_forward/backward: [batch, seq, heads,
                # head_dim]; the scaled_dot_product_* ops: [batch, heads, seq, head_dim]
                seq_first = not name.startswith("aten::_scaled_dot_product") and \
                    name.endswith(("_attention_forward", "_attention_backward"))
                b, h, s_q, d = (q[0], q[2], q[1], q[3]) if seq_first else q
                s_k = k[1] if seq_first else k[2]
                flops = (10 if backward else 4) * b * h * s_q * s_k * d
                out = _numel(q) + 2 * _numel(k) if backward else _numel(q)
        elif name == "aten::convolution_backward":
            flops, out = _conv_backward(tensors, concrete) or (None, None)
        elif name in _CONV_ARGS:
            flops, out = _conv(name, tensors, concrete) or (None, None)
    except (IndexError, TypeError):
        return None
    if flops is None:
        return None
    read = sum(_numel(d) for d, _ in tensors)
    return Work(float(flops), float((read + out) * elem), dtype)


def roofline_terms(gpu: Gpu, work: Work) -> tuple[float, float]:
    """(compute, memory) model seconds of ``work`` on ``gpu`` at its achievable fractions;
    the larger is the roofline, and names what bounds the op."""
    compute = work.flops / (gpu.peak_tflops(work.dtype) * 1e12 * gpu.achievable["compute"])
    memory = work.bytes / (gpu.hbm_gbps * 1e9 * gpu.achievable["memory"])
    return compute, memory


def roofline_s(gpu: Gpu, work: Work) -> float:
    """Model seconds of ``work`` on ``gpu`` at its achievable fractions."""
    return max(roofline_terms(gpu, work))


def ridge_point(gpu: Gpu, dtype: str) -> float:
    """FLOPs per byte at which ``dtype`` work turns from memory- to compute-bound on
    ``gpu`` (the roofline's ridge, at the achievable fractions ``roofline_terms`` uses)."""
    return (gpu.peak_tflops(dtype) * 1e12 * gpu.achievable["compute"]
            / (gpu.hbm_gbps * 1e9 * gpu.achievable["memory"]))


def _tensors(dims: list, types: list) -> list[tuple[list, str]]:
    """(shape, dtype name) of every tensor input, TensorList elements included."""
    out = []
    for d, t in zip(dims, types, strict=False):
        if isinstance(d, list) and d and all(isinstance(x, int) and x >= 0 for x in d):
            out.append((d, str(t or "")))
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            # a TensorList's type is "TensorList": its elements take the op's first dtype
            first = next((str(x) for x in types if str(x).lower() in ELEM_BYTES), "")
            out += [(x, first) for x in d if x and all(isinstance(v, int) and v >= 0 for v in x)]
    return out


def _gathered(name: str, tensors: list, concrete: list | None) -> float | None:
    """Bytes of a lookup (index_select, embedding): the indices read and the rows they pick
    read and written, not the whole table (a 30522-row embedding reads 141 rows)."""
    if len(tensors) < 2 or any(t.lower() not in ELEM_BYTES for _, t in tensors[:2]):
        return None
    (table, t_type), (index, i_type) = tensors[:2]
    if name == "aten::embedding":
        out = _numel(index) * table[-1]
    else:  # index_select(self, dim, index): dim from Concrete Inputs, 0 when not recorded
        dim = (_concrete_ints(concrete, 1, 1) or [0])[0] % len(table)
        out = _numel(table) // max(table[dim], 1) * _numel(index)
    return float(_numel(index) * ELEM_BYTES[i_type.lower()]
                 + 2 * out * ELEM_BYTES[t_type.lower()])


def memory_bytes(op: str, dims: list, types: list, concrete: list | None = None
                 ) -> float | None:
    """Bytes a memory-bound op moves, from its Input Dims / Input type: every tensor input
    read, plus an output the size of its largest input written (none for a reduction such as
    mean or sum, whose output is small); a lookup (index_select, embedding) moves only the
    rows it picks (dim from ``concrete``, Concrete Inputs); None when no input has a known
    size."""
    name = (op or "").lower()
    tensors = _tensors(dims, types)
    if name in ("aten::index_select", "aten::embedding"):
        picked = _gathered(name, tensors, concrete)
        if picked is not None:
            return picked
    sizes = [_numel(d) * ELEM_BYTES[t.lower()] for d, t in tensors if t.lower() in ELEM_BYTES]
    if not sizes:
        return None
    out = 0 if _REDUCING.search(name) else max(sizes)
    return float(sum(sizes) + out)


def op_counts(op: str, dims: list, types: list, concrete: list | None = None
              ) -> Work | None:
    """The work of any op with recorded shapes, for efficiency tables: ``op_work``'s for a
    matmul, attention or convolution; else ``memory_bytes``' bytes and one FLOP per element
    of its largest input (an elementwise op's or a reduction's arithmetic, as TraceLens'
    elementwise model counts it), none for an op that only moves data (copy, cat, index,
    fill, ...). dtype is its first tensor's floating type, "" when it has none."""
    work = op_work(op, dims, types, concrete)
    if work is not None:
        return work
    nbytes = memory_bytes(op, dims, types, concrete)
    if nbytes is None:
        return None
    tensors = _tensors(dims, types)
    elements = max(_numel(d) for d, _ in tensors)
    flops = 0 if _MOVING.search((op or "").lower()) else elements
    return Work(float(flops), nbytes, DTYPE_OF.get(tensors[0][1].lower(), ""))


def parse_json_list(text: str | None) -> list | None:
    """A JSON list from its text (an op's ``Input Dims``, ``Input type`` or ``Concrete
    Inputs`` arg), None when absent or not a list."""
    if not text:
        return None
    try:
        v = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, list) else None


def parse_shapes(dims: str | None, types: str | None) -> tuple[list, list] | None:
    """Input Dims / Input type of an op from their JSON text, None when absent."""
    d, t = parse_json_list(dims), parse_json_list(types)
    return (d, t) if d is not None and t is not None else None


def work_of(op: str | None, dims: str | None, types: str | None,
            concrete: str | None = None, *, any_op: bool = False) -> Work | None:
    """``op_work`` (or, with ``any_op``, ``op_counts``) of an op from its args' JSON text,
    as the store keeps them: the one entry point the replay and the analysis share."""
    try:
        shapes = parse_shapes(dims, types)
        if shapes is None:
            return None
        fn = op_counts if any_op else op_work
        return fn(op or "", *shapes, parse_json_list(concrete))
    except (ValueError, TypeError, IndexError, OverflowError, RecursionError):
        return None  # args no profiler writes (a hostile or broken trace): no work
