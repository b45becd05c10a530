"""The DuckDB functions behind the ``op_efficiency`` view (analysis/sql/80_op_efficiency.sql).

Why functions and not SQL: an op's FLOPs and bytes come from its shapes by formulas that
live in one place, ``tracetool/opwork.py``, which the replay's roofline uses too; written
again in SQL they would drift apart. Why functions and not a table computed when the views
are created: a table would cost every connection a pass over the ops, used or not; a
function runs only when the view is queried, and only on its distinct (op, shapes) rows.
``connect`` registers them on every connection it opens, so the view works from ``tracetool
sql``, ``tracetool report`` and ``tracetool.connect`` in a notebook alike. (The SQL of
``setup_sql`` pasted into the DuckDB CLI has no Python: there the view fails to bind, and
says which function is missing.)
"""

from __future__ import annotations

import functools
from typing import Any

import duckdb

from tracetool.hardware import Gpu, catalog, trace_gpu
from tracetool.opwork import Work, op_class, ridge_point, roofline_terms, work_of

OP_WORK = "tracetool_op_work"
ROOFLINE = "tracetool_roofline"
_WORK_TYPE = {"flops": "DOUBLE", "bytes": "DOUBLE", "dtype": "VARCHAR", "op_class": "VARCHAR"}
_ROOFLINE_TYPE = {"gpu": "VARCHAR", "runs_at": "VARCHAR", "peak_tflops": "DOUBLE",
                  "peak_tbps": "DOUBLE", "ridge": "DOUBLE", "roofline_ns": "DOUBLE",
                  "bound": "VARCHAR", "note": "VARCHAR"}


def op_work_row(op: str | None, dims: str | None, types: str | None,
                concrete: str | None) -> dict[str, Any] | None:
    """``tracetool_op_work(op, input_dims, input_types, concrete_inputs)``: the op's FLOPs,
    bytes and dtype (``opwork.op_counts``) from its args' JSON text, and its class (gemm,
    attention, conv: ``opwork.op_class``); NULL when unknown."""
    work = work_of(op, dims, types, concrete, any_op=True)
    if work is None:
        return None
    return {"flops": work.flops, "bytes": work.bytes, "dtype": work.dtype,
            "op_class": op_class(op)}


@functools.cache
def _gpu_of(names: tuple[str, ...]) -> Gpu | None:
    return trace_gpu(names, _catalog())


@functools.cache
def _catalog() -> dict[str, Gpu]:
    return catalog()


def roofline_row(devices: list[str] | None, dtype: str | None, flops: float | None,
                 nbytes: float | None) -> dict[str, Any] | None:
    """``tracetool_roofline(device_names, dtype, flops, bytes)``: the job's catalog GPU (from
    its deviceProperties names, as the replay finds it), its peaks for ``dtype`` (the
    precision it runs it at: ``Gpu.runs_at``), the ridge point, the op's roofline time and
    what bounds it (``opwork.roofline_terms``); without a catalog GPU or a floating dtype,
    the columns it cannot fill are NULL and ``note`` says why. NULL without work."""
    if flops is None or nbytes is None:
        return None
    names = tuple(sorted({d for d in devices or [] if d}))
    gpu = _gpu_of(names)
    if gpu is None:
        why = (f"GPU not in the catalog ({', '.join(names)}): no peak or roofline" if names
               else "no GPU named in the trace's deviceProperties: no peak or roofline")
        return dict.fromkeys(_ROOFLINE_TYPE) | {"note": why}
    row = dict.fromkeys(_ROOFLINE_TYPE) | {"gpu": gpu.key, "peak_tbps": gpu.hbm_gbps / 1e3}
    if not dtype:
        memory = nbytes / (gpu.hbm_gbps * 1e9 * gpu.achievable["memory"])
        return row | {"roofline_ns": memory * 1e9, "bound": "memory",
                      "note": "no floating-point dtype: memory roofline only"}
    compute, memory = roofline_terms(gpu, Work(flops, nbytes, dtype))
    runs_at = gpu.runs_at(dtype)
    note = (f"the {gpu.name} has no {dtype.upper()} units: its {runs_at.upper()} peak"
            if runs_at != dtype else None)
    return row | {"runs_at": runs_at, "peak_tflops": gpu.tflops[runs_at],
                  "ridge": ridge_point(gpu, dtype),
                  "roofline_ns": max(compute, memory) * 1e9,
                  "bound": "compute" if compute >= memory else "memory", "note": note}


def register(con: duckdb.DuckDBPyConnection) -> None:
    """Register the view's functions on ``con`` (``connect`` does, on every connection)."""
    con.create_function(OP_WORK, op_work_row, ["VARCHAR"] * 4,
                        duckdb.struct_type(_WORK_TYPE), null_handling="special",
                        side_effects=False)
    con.create_function(ROOFLINE, roofline_row,
                        [duckdb.list_type("VARCHAR"), "VARCHAR", "DOUBLE", "DOUBLE"],
                        duckdb.struct_type(_ROOFLINE_TYPE), null_handling="special",
                        side_effects=False)
