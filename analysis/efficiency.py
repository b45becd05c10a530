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


# ------------------------------------------------------------------------ the report's part

_COLUMNS = ("op", "category", "input_dims", "count", "total_ns", "dtype", "flops", "bytes",
            "intensity", "achieved_tflops", "achieved_tbps", "gpu", "runs_at", "peak_tflops",
            "peak_tbps", "pct_peak", "bound", "roofline_ns", "pct_roofline", "note")


def summary(con: duckdb.DuckDBPyConnection, job: str, top: int = 15) -> dict[str, Any] | None:
    """The report's op-efficiency part, from the ``op_efficiency`` view: the ``top`` rows by
    kernel time, the share of kernel time the shapes give work for, the GPU and the roofline
    of the dtype with the most time (for the chart: one point per op and shape of that
    dtype with FLOPs); None for a job without kernels."""
    cur = con.execute(f"SELECT {', '.join(_COLUMNS)} FROM op_efficiency WHERE job = ?",
                      [job])
    rows = [dict(zip(_COLUMNS, r, strict=True)) for r in cur.fetchall()]
    if not rows:
        return None
    total = sum(r["total_ns"] for r in rows)
    worked = [r for r in rows if r["flops"] is not None]
    by_dtype: dict[str, float] = {}
    for r in worked:
        if r["dtype"]:
            by_dtype[r["dtype"]] = by_dtype.get(r["dtype"], 0) + r["total_ns"]
    dtype = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None
    names = [n for (n,) in con.execute(
        "SELECT DISTINCT unnest(device_names) FROM trace_files WHERE job = ?", [job]
    ).fetchall()]
    gpu = _gpu_of(tuple(sorted({n for n in names if n})))
    out: dict[str, Any] = {
        "gpu": gpu.key if gpu else None, "gpu_name": gpu.name if gpu else None,
        "devices": sorted({n for n in names if n}), "dtype": dtype,
        "kernel_ns": total, "worked_ns": sum(r["total_ns"] for r in worked),
        "rows": rows[:top], "roofline": None, "points": [], "other_dtypes": 0}
    if gpu is not None and dtype is not None:
        runs_at = gpu.runs_at(dtype)
        out["roofline"] = {
            "dtype": dtype, "runs_at": runs_at, "peak_tflops": gpu.tflops[runs_at],
            "peak_tbps": gpu.hbm_gbps / 1e3,
            "achievable_tflops": gpu.tflops[runs_at] * gpu.achievable["compute"],
            "achievable_tbps": gpu.hbm_gbps / 1e3 * gpu.achievable["memory"],
            "ridge": ridge_point(gpu, dtype)}
        plotted = [r for r in worked if r["flops"] > 0 and r["achieved_tflops"]]
        out["points"] = [{k: r[k] for k in ("op", "category", "intensity", "achieved_tflops",
                                            "total_ns")}
                         for r in plotted if r["dtype"] == dtype]
        out["other_dtypes"] = sum(r["dtype"] != dtype for r in plotted)
    return out
