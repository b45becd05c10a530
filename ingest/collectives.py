"""One row per collective call per rank, from whatever the trace recorded about it.

NCCL-era traces describe each call in a ``record_param_comms`` CPU op (kind, sizes, dtype,
group), and the transfer is the NCCL/RCCL kernel launched inside it. gloo traces have no such
op: the call is a ``c10d::<op>_`` CPU op that only enqueues, and the transfer is a
``gloo:<op>`` span on a gloo worker thread; they are paired per collective kind in issue
order, and sizes come from ``Input Dims``/``Input type``. A communication kernel (the
registry's, ``tracetool/comm_kernels.toml``) that no call claims is a collective of its own
(DeepEP, symmetric memory, custom all-reduce: no record_param_comms; 2021 NCCL traces): its
kind and backend from the registry, its size from the launching op's shapes where the
registry says so, else unknown. Collectives are few, so this is plain Python over a handful
of rows.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import re
from collections.abc import Callable

import duckdb
import msgspec
import pyarrow as pa

from tracetool.comm_kernels import Entry, Registry, registry
from tracetool.dtypes import ELEM_BYTES
from tracetool.schema import COLLECTIVES

# Calls recorded like collectives that move no data of their own.
NOT_COLLECTIVES = {"wait", "monitored_barrier"}
# Any of these in record_param_comms' args marks a real collective call (2023-10+ traces).
COLLECTIVE_KEYS = {"Collective name", "Comms Id", "In msg nelems", "In msg size",
                   "Process Group Name", "Process Group ID", "Seq", "dtype"}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


# the collective a c10d op or gloo span name does, in the order analysis/sql/40_collectives.sql
# collective_kind tests them (allreduce before reduce, allgather before gather): what pairs a
# c10d::alltoall_base_ call with its gloo:all_to_all span (tests/test_collective_matching.py
# checks that both agree on every name of the corpus)
KIND_WORDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "barrier",
              "gather", "scatter", "reduce", "send", "recv")


def kind_key(name: str) -> str:
    """The collective a call or span name does (``_norm`` of it when it names none)."""
    n = _norm(name)
    return next((w for w in KIND_WORDS if w in n), n)


def _args(text: str | None) -> dict:
    """A stored args object: msgspec decodes it 2.9x faster than json.loads (24k
    record_param_comms rows of the 1 GB benchmark: 0.04 against 0.12 s); json.loads takes
    what msgspec rejects, such as NaN."""
    if not text:
        return {}
    try:
        a = msgspec.json.decode(text)
    except msgspec.DecodeError:
        try:
            a = json.loads(text)
        except (ValueError, RecursionError):
            return {}
    except RecursionError:  # nested deeper than a decoder reads: the text is all there is
        return {}
    return a if isinstance(a, dict) else {}


def _ranks(value: object) -> tuple[list[int] | None, bool]:
    if isinstance(value, list):
        return [int(x) for x in value if isinstance(x, int)], False
    if not isinstance(value, str):
        return None, False
    return _ranks_text(value)


@functools.lru_cache(maxsize=4096)
def _ranks_text(text: str) -> tuple[list[int] | None, bool]:
    """Ranks written as text ("[0, 1, 2]", "0,1,...,7"); every call of a group repeats the
    same text. The list is shared: callers must not change it."""
    nums = [int(x) for x in re.findall(r"-?\d+", text)]
    return (nums or None), "..." in text


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _nelems(dims: object) -> int | None:
    """Elements of the first tensor (or tensor list) in an Input Dims value."""
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    if isinstance(first, list) and first and all(isinstance(x, list) for x in first):
        total = 0
        for t in first:
            total += math.prod(int(x) for x in t) if t else 1
        return total
    if isinstance(first, list):
        return math.prod(int(x) for x in first) if first else 1
    return None


def _size_from_dims(row: dict, *sources: dict) -> None:
    """Element count and dtype from the first source with Input Dims (record_shapes)."""
    src = next((s for s in sources if s.get("Input Dims")), {})
    n = _nelems(src.get("Input Dims"))
    types = src.get("Input type") or []
    row["dtype"] = next((t for t in types if t and t not in ("TensorList", "Scalar")), None)
    row["in_nelems"] = row["out_nelems"] = n


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _by_file(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(r["file"], []).append(r)
    return out


def build(con: duckdb.DuckDBPyConnection, tables: dict[str, str],
          pg_ranks: dict[int, dict[str, list[int]]], comm: Registry | None = None
          ) -> dict[int, pa.Table]:
    """The collectives table of each file of a derivation batch (``pg_ranks``: each file's
    process groups from its distributedInfo), from SQL reading the batch's events, gpu_ops
    and profiler_steps (with their ``file``). The few rows involved are read in one query
    per kind for the whole batch, then matched per file in Python."""
    ev, g, st = tables["events"], tables["gpu_ops"], tables["profiler_steps"]
    steps = _by_file(_rows(con, f"""SELECT file, step, cpu_start_ns,
                                           coalesce(cpu_end_ns, 9223372036854775807) AS cpu_end_ns
                                    FROM {st} ORDER BY file, cpu_start_ns"""))
    rpc = _by_file(_rows(con, f"""
        SELECT file, eid, ts_ns, dur_ns, end_ns, tid, external_id, args FROM {ev}
        WHERE kind = 'cpu_op' AND name = 'record_param_comms' ORDER BY file, ts_ns"""))
    kernels = _by_file(_rows(con, f"""
        SELECT file, eid, name, stream, ts_ns, end_ns, external_id, launch_ts_ns, launch_tid,
               op_eid
        FROM {g} WHERE is_comm ORDER BY file, coalesce(launch_ts_ns, ts_ns), eid"""))

    def op_args(f: int, eids: list[int]) -> dict[int, str]:
        """The args of file ``f``'s events ``eids`` (the launching ops of comm kernels
        sized from their shapes: a few rows, read only when some are needed)."""
        return dict(con.execute(f"SELECT eid, args FROM {ev} WHERE file = ? AND eid IN "
                                "(SELECT unnest(?::BIGINT[]))", [f, eids]).fetchall())

    calls = {f: [(r, _args(r["args"])) for r in rows] for f, rows in rpc.items()}
    # before 2023-10 record_param_comms had no collective args: the nccl:<op> annotation
    # inside it names the op and its Input Dims / Input type give the size
    titles: dict[int, dict[int, dict]] = {}
    if any(a.get("Collective name") is None for c in calls.values() for _, a in c):
        for r in _rows(con, f"""
                SELECT c.file, c.parent_eid, c.name, c.args FROM {ev} c
                SEMI JOIN (SELECT file, eid FROM {ev} WHERE name = 'record_param_comms') p
                  ON p.file = c.file AND p.eid = c.parent_eid
                WHERE c.kind = 'user_annotation' AND c.name LIKE 'nccl:%'"""):
            titles.setdefault(r["file"], {})[r["parent_eid"]] = r
    ops: dict[int, list[dict]] = {}
    spans: dict[int, list[dict]] = {}
    if any(f not in rpc for f in pg_ranks):  # gloo traces have no record_param_comms
        ops = _by_file(_rows(con, f"""
            SELECT file, eid, name, ts_ns, dur_ns, end_ns, tid, args FROM {ev}
            WHERE kind = 'cpu_op' AND name LIKE 'c10d::%' ORDER BY file, ts_ns, eid"""))
        spans = _by_file(_rows(con, f"""SELECT file, eid, name, ts_ns, end_ns, tid, args
                                        FROM {ev} WHERE name LIKE 'gloo:%'
                                        ORDER BY file, ts_ns, eid"""))
    out = {}
    for f, groups in pg_ranks.items():
        rows = _file_rows(steps.get(f, []), calls.get(f, []), kernels.get(f, []),
                          titles.get(f, {}), ops.get(f, []), spans.get(f, []), groups,
                          comm or registry(), functools.partial(op_args, f))
        out[f] = pa.table({c.name: pa.array([r.get(c.name) for r in rows], type=c.type)
                           for c in COLLECTIVES.columns})
    return out


def _file_rows(steps: list[dict], calls: list[tuple[dict, dict]], kernels: list[dict],
               titles: dict[int, dict], ops: list[dict], spans: list[dict],
               pg_ranks: dict[str, list[int]], comm: Registry,
               op_args: Callable[[list[int]], dict[int, str]]) -> list[dict]:
    """One file's collectives rows (the table's columns, as dicts); ``op_args`` reads the
    args of some of the file's events."""
    starts = [s["cpu_start_ns"] for s in steps]

    def step_of(ts: int) -> int | None:
        i = bisect.bisect_right(starts, ts) - 1
        return steps[i]["step"] if i >= 0 and ts < steps[i]["cpu_end_ns"] else None

    if all(a.get("Collective name") is not None for _, a in calls):
        titles = {}  # (read for the batch: another file needs them)
    rows: list[dict] = []
    index = _KernelIndex(kernels)
    if calls:
        for r, a in calls:
            if a.get("Collective name") in NOT_COLLECTIVES:
                continue
            title = titles.get(r["eid"])
            if title is None and not COLLECTIVE_KEYS & a.keys():
                continue  # a wait() recorded like a collective: it moves no data
            k = index.for_call(r)
            row = _row_from_args(r, a, k, None, pg_ranks, "nccl" if k else "cpu")
            if a.get("Collective name") is None and title is not None:
                ta = _args(title["args"])
                row["collective"] = title["name"].split(":", 1)[1]
                _size_from_dims(row, ta, a)
            rows.append(row)
    else:
        by_kind: dict[str, list[dict]] = {}
        for s in spans:
            by_kind.setdefault(kind_key(s["name"].split(":", 1)[1]), []).append(s)
        seen: dict[str, int] = {}
        for o in ops:
            coll = o["name"].split("::", 1)[1].rstrip("_")
            if coll in NOT_COLLECTIVES:
                continue
            key = kind_key(coll)
            i = seen.get(key, 0)
            seen[key] = i + 1
            cands = by_kind.get(key, [])
            span = cands[i] if i < len(cands) else None
            a = _args(o["args"])
            sa = _args(span["args"]) if span else {}
            row = _row_from_args(o, {"Collective name": coll}, None, span, pg_ranks,
                                 "gloo" if span else "cpu")
            _size_from_dims(row, sa, a)
            if key == "alltoall":
                _alltoall_splits(row, a)
            if key in ("send", "recv"):  # c10d::send / recv_(tensors, group, peer, tag)
                ci = a.get("Concrete Inputs")
                row["peer_rank"] = _int(ci[2]) if isinstance(ci, list) and len(ci) > 2 else None
            rows.append(row)
    # comm kernels no call claimed (no CPU-side record of them: 2021 NCCL traces, DeepEP,
    # symmetric memory, custom all-reduce): one row each, in a group of their own
    # (``_row_from_kernel``), so they do not shift the recorded groups' call indices
    default_pg = not rows
    mine = [(k, comm.match(k["name"])) for k in kernels if k["eid"] not in index.used]
    sized = {k["eid"]: k["op_eid"] for k, e in mine  # launching ops whose shapes size them
             if e is not None and e.size == "launch_op" and k["op_eid"] is not None}
    want = [k["eid"] for k, _ in mine] + list(sized.values())
    args = op_args(want) if want else {}
    for k, entry in mine:
        row = _row_from_kernel(k, pg_ranks, entry, default_pg)
        own = _args(args.get(k["eid"]))
        if COLLECTIVE_KEYS & own.keys():  # the kernel's own args record the call (newer
            # PyTorch): its op, group, sequence number and sizes
            r = {"eid": k["eid"], "ts_ns": row["cpu_ts_ns"], "dur_ns": None, "end_ns": None,
                 "tid": k["launch_tid"]}
            coll = row["collective"]
            row = _row_from_args(r, own, k, None, pg_ranks, row["backend"])
            row["collective"] = row["collective"] or coll
        elif k["eid"] in sized:
            a = _args(args.get(sized[k["eid"]]))
            if a.get("Input Dims"):
                _size_from_dims(row, a)
                if row["collective"] == "allgather":  # the input: a rank's share, not the output
                    row["out_nelems"] = None
        rows.append(row)
    # call index per process group, and sizes in bytes
    counters: dict[str | None, int] = {}
    for row in rows:
        row["call_index"] = counters.get(row["pg_name"], 0)
        counters[row["pg_name"]] = row["call_index"] + 1
        eb = ELEM_BYTES.get((row["dtype"] or "").lower())
        row["elem_bytes"] = eb
        row["in_bytes"] = row["in_nelems"] * eb if eb and row["in_nelems"] is not None else None
        row["out_bytes"] = row["out_nelems"] * eb if eb and row["out_nelems"] is not None else None
        row["step"] = step_of(row["cpu_ts_ns"])
        if row["group_size"] is None and row["group_ranks"]:
            row["group_size"] = len(row["group_ranks"])
    return rows


class _KernelIndex:
    """Comm kernels by launching thread and launch time, each handed out once."""

    def __init__(self, kernels: list[dict]) -> None:
        self.by_tid: dict[object, list[tuple[int, int]]] = {}
        self.by_ext: dict[int, list[dict]] = {}
        self.rows = {k["eid"]: k for k in kernels}
        self.used: set[int] = set()
        for k in kernels:
            if k["launch_ts_ns"] is not None:
                self.by_tid.setdefault(k["launch_tid"], []).append((k["launch_ts_ns"], k["eid"]))
            if k["external_id"] is not None:
                self.by_ext.setdefault(k["external_id"], []).append(k)
        for v in self.by_tid.values():
            v.sort()

    def for_call(self, r: dict) -> dict | None:
        """The comm kernel launched inside this record_param_comms (same thread, inside its
        window), else the first unused one with the same External id."""
        end = r["end_ns"] if r["end_ns"] is not None else r["ts_ns"]
        launches = self.by_tid.get(r["tid"], [])
        i = bisect.bisect_left(launches, (r["ts_ns"], -(2**63)))
        found = None
        while i < len(launches) and launches[i][0] <= end:
            eid = launches[i][1]
            if eid not in self.used:
                self.used.add(eid)  # the call's: later ones in it too (a coalesced call's
                found = found or self.rows[eid]  # kernels are not collectives of their own)
            i += 1
        if found is not None:
            return found
        for k in self.by_ext.get(r["external_id"], []) if r["external_id"] is not None else []:
            if k["eid"] not in self.used:
                self.used.add(k["eid"])
                return k
        return None


def _row_from_args(
    r: dict, a: dict, k: dict | None, span: dict | None, pg_ranks: dict[str, list[int]],
    backend: str,
) -> dict:
    pg = a.get("Process Group Name", a.get("Process Group ID"))
    pg = None if pg is None else str(pg)
    ranks, truncated = _ranks(a.get("Process Group Ranks"))
    if ranks is None or truncated:
        cfg = pg_ranks.get(pg if pg is not None else "0")
        if cfg:
            ranks, truncated = cfg, False
    if pg is None and ranks is None and "0" in pg_ranks:
        pg, ranks = "0", pg_ranks["0"]
    if pg is None and backend == "gloo":
        pg = "0"
    peer = _int(a.get("Src Rank", a.get("Dst Rank")))
    coll = a.get("Collective name")
    if peer is None and coll in ("send", "recv"):
        peer = _int(a.get("Rank"))
    comms_id = _int(a.get("Comms Id"))
    if k is not None:
        ts, end = k["ts_ns"], k["end_ns"]
    elif span is not None:
        ts, end = span["ts_ns"], span["end_ns"]
    else:
        ts, end = r["ts_ns"], r["end_ns"]
    return {
        "eid": r["eid"], "collective": coll, "backend": backend, "pg_name": pg,
        "pg_desc": a.get("Process Group Description"),
        "group_size": _int(a.get("Group size")), "group_ranks": ranks,
        "group_ranks_truncated": truncated, "seq": _int(a.get("Seq")),
        "comms_id": comms_id if comms_id is not None and 0 <= comms_id < 2**64 else None,
        "dtype": a.get("dtype"),
        "in_nelems": _int(a.get("In msg nelems", a.get("In msg size"))),
        "out_nelems": _int(a.get("Out msg nelems", a.get("Out msg size"))),
        "in_split_sizes": _text(a.get("In split size")),
        "out_split_sizes": _text(a.get("Out split size")),
        "peer_rank": peer, "cpu_ts_ns": r["ts_ns"], "cpu_dur_ns": r["dur_ns"],
        "cpu_tid": r["tid"],
        "kernel_eid": k["eid"] if k else None, "kernel_name": k["name"] if k else None,
        "kernel_stream": k["stream"] if k else None,
        "gloo_eid": span["eid"] if span else None,
        "ts_ns": ts, "end_ns": end, "dur_ns": None if end is None else end - ts,
    }


KERNEL_DTYPE = (("_f32", "float"), ("_float", "float"), ("_f16", "half"), ("_half", "half"),
                ("_bf16", "bfloat16"), ("_f64", "double"), ("_double", "double"),
                ("_i32", "int"), ("_int32", "int"), ("_i64", "long"), ("_int64", "long"),
                ("_i8", "char"), ("_int8", "char"), ("_u8", "byte"), ("_uint8", "byte"))


def _row_from_kernel(k: dict, pg_ranks: dict[str, list[int]], entry: Entry | None,
                     default_pg: bool) -> dict:
    """A collective known only from its kernel: kind and backend from the registry entry
    that matches its name (NCCL 2.7-2.18 names carry the op and dtype too: hints, not what
    ran); sizes unknown (``_file_rows`` reads the launching op's shapes where the entry
    says ``launch_op``). Its group: the default one (pg 0, when distributedInfo names it)
    for a kernel whose library records its calls (registry size ``call``: NCCL) in a trace
    that records none (``default_pg``: 2021 traces); else ``kernel:<backend>``, no
    process group recorded, the backend's unclaimed kernels matched as one sequence."""
    fn = k["name"].split("(", 1)[0].lower()
    coll = entry.kind_of(k["name"]) if entry is not None else None
    dtype = next((d for key, d in KERNEL_DTYPE if fn.endswith(key) or key + "_" in fn), None)
    backend = entry.backend if entry is not None and entry.backend != "any" else "nccl"
    if default_pg and (entry is None or entry.size == "call"):
        pg = "0" if "0" in pg_ranks else None
    else:
        pg = f"kernel:{backend}"
    return {
        "eid": k["eid"], "collective": coll, "backend": backend, "pg_name": pg,
        "pg_desc": None, "group_size": None, "group_ranks": pg_ranks.get(pg) if pg else None,
        "group_ranks_truncated": False, "seq": None, "comms_id": None, "dtype": dtype,
        "in_nelems": None, "out_nelems": None, "in_split_sizes": None,
        "out_split_sizes": None, "peer_rank": None, "cpu_ts_ns": k["launch_ts_ns"]
        if k["launch_ts_ns"] is not None else k["ts_ns"], "cpu_dur_ns": None,
        "cpu_tid": k["launch_tid"], "kernel_eid": k["eid"], "kernel_name": k["name"],
        "kernel_stream": k["stream"], "gloo_eid": None, "ts_ns": k["ts_ns"],
        "end_ns": k["end_ns"], "dur_ns": k["end_ns"] - k["ts_ns"],
    }


def _alltoall_splits(row: dict, a: dict) -> None:
    """A gloo all-to-all's sizes and split sizes from its c10d op (``alltoall_base_(output,
    input, output_split_sizes, input_split_sizes, ...)``): the split sizes (rows, as NCCL's
    ``In split size`` / ``Out split size``; ``[]`` for equal splits) are in its ``Concrete
    Inputs`` [4] / [3], and its input and output tensors in ``Input Dims`` [1] / [0] (the
    gloo span's shape is the output's: what this rank receives, not what it sends)."""
    ci, dims = a.get("Concrete Inputs"), a.get("Input Dims")
    if isinstance(ci, list) and len(ci) > 4:
        row["out_split_sizes"] = ci[3] if isinstance(ci[3], str) and ci[3] else None
        row["in_split_sizes"] = ci[4] if isinstance(ci[4], str) and ci[4] else None
    if isinstance(dims, list) and len(dims) > 1 and isinstance(dims[0], list) \
            and isinstance(dims[1], list) and dims[0] and dims[1]:
        row["out_nelems"] = _nelems([dims[0]])
        row["in_nelems"] = _nelems([dims[1]])


def _text(v: object) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(v)
