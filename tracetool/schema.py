"""The trace store's schema: every table and column, in one place.

The store is a directory of Parquet files laid out as
``STORE/data/job=J/rank=R/<table>/part-N.parquet``: each table is one Parquet dataset
partitioned by job and rank (hive style), and the
``job=J/rank=R`` directory of one ingested trace file is written in a temporary directory and
renamed into place, so a reader never sees half of an ingest. ``job`` (VARCHAR) and ``rank``
(INTEGER) come from the path, not from the files. A job of 32 ranks or more also has a pack,
``STORE/packs/job=J/<generation>/<table>.parquet``: each table of the job in one file, rows in
rank order, ``job`` and ``rank`` as columns (the same columns, in the same order, as the
partitions read with hive partitioning); readers use it while it copies exactly the job's
current partitions (``tracetool/packs.py``).

Conventions, as in Perfetto's SQL library: times are int64 nanoseconds since the Unix epoch
(``*_ns``; the trace's ``baseTimeNanoseconds`` already added), durations int64 nanoseconds,
``eid`` is the 0-based position of the event in the file's ``traceEvents`` array (unique per
job and rank, stable across re-ingests), and ``args`` is the event's ``args`` object exactly as
written in the file (JSON text; query it with DuckDB's ``->>`` operators).

``docs/schema.md``: its tables part is generated from this module, its views from the views' SQL
(``python -m tracetool.analysis.schema_doc``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from tracetool.graph import CLASSES, EDGE_KINDS

# the largest rank a store holds: its rank column (the hive partition rank=N) is an INTEGER
MAX_RANK = 2**31 - 1
# the largest ProfilerStep (or annotation instance) number: the steps view's step is a BIGINT
MAX_STEP = 2**63 - 1


def sql_type(t: pa.DataType) -> str:
    """The DuckDB type a store column has when read back."""
    if pa.types.is_list(t):
        return sql_type(t.value_type) + "[]"
    return {
        pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.uint64(): "UBIGINT",
        pa.float64(): "DOUBLE", pa.string(): "VARCHAR", pa.bool_(): "BOOLEAN",
        pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    }[t]


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str

    @property
    def sql_type(self) -> str:
        return sql_type(self.type)


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    sort_key: tuple[str, ...] = ()

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type) for c in self.columns])

    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _c(name: str, type_: pa.DataType, doc: str) -> Column:
    return Column(name, type_, doc)


I64, I32, U64, F64 = pa.int64(), pa.int32(), pa.uint64(), pa.float64()
STR, BOOL = pa.string(), pa.bool_()
STR_LIST, I64_LIST = pa.list_(pa.string()), pa.list_(pa.int64())

TRACE_FILES = Table(
    "trace_files",
    "One row per ingested trace file (one rank of one job): where it came from, how its "
    "timestamps were read, its top-level metadata, and the conservation counts "
    "events_read = events_stored + events_quarantined.",
    (
        _c("path", STR, "Absolute path of the input file at ingest time (a byte of a name "
                        "that is not valid UTF-8 as the text \\\\xNN)."),
        _c("file_name", STR, "Base name of the input file (as path)."),
        _c("sha256", STR, "SHA-256 of the file's bytes as stored on disk (compressed if .gz)."),
        _c("bytes", I64, "Size of the file on disk, in bytes."),
        _c("json_bytes", I64, "Size of the (decompressed) JSON text, in bytes."),
        _c("compression", STR, "'gzip' or 'none'."),
        _c("container", STR, "'object' ({\"traceEvents\": [...]}) or 'array' (bare [...])."),
        _c("ts_convention", STR,
           "How ts was written: 'abs_us_int' (integer epoch us, 2020-2024-03), 'abs_us_frac' "
           "(epoch us with decimals, 2024-03/04), 'rel_base' (us relative to "
           "baseTimeNanoseconds, 2024-04+), 'rel_unknown_base' (relative, no base recorded: "
           "times are not absolute), 'none' (no timestamped events)."),
        _c("base_time_ns", I64, "baseTimeNanoseconds from the file, 0 when absent."),
        _c("schema_version", STR, "schemaVersion as written (text), NULL when absent."),
        _c("device_names", STR_LIST, "deviceProperties[].name, in file order."),
        _c("device_properties", STR, "deviceProperties as JSON text."),
        _c("distributed_info", STR, "distributedInfo as JSON text, NULL when absent."),
        _c("world_size", I32, "distributedInfo.world_size, NULL when absent."),
        _c("backend", STR, "distributedInfo.backend (nccl, gloo, ...), NULL when absent."),
        _c("rank_source", STR, "Where the rank came from: 'distributedInfo', 'option' "
           "(--rank), 'file_name', or 'single_file' (rank 0: the only file of its ingest, "
           "with no rank anywhere; a warning says so)."),
        _c("metadata", STR, "Every other top-level key of the file, as a JSON object text."),
        _c("events_read", I64, "Elements of traceEvents (or of the top-level array), "
           "including a truncated last element."),
        _c("events_stored", I64, "Events that landed in events, flows, counters or "
           "metadata_events (a matched B/E pair counts as two)."),
        _c("events_quarantined", I64, "Events not stored; each has a row in ingest_issues."),
        _c("salvaged", BOOL, "True when the file was truncated (no closing ]) and the complete "
           "events before the cut were kept."),
        _c("ingested_at", pa.timestamp("us", tz="UTC"), "When the file was ingested."),
        _c("tracetool_version", STR, "Version of tracetool that wrote this partition."),
    ),
)

EVENTS = Table(
    "events",
    "Every slice (ph X, or a matched B/E pair) and instant (ph i/I/R) and async event "
    "(ph b/n/e) of the trace, with exact integer-ns times, its track, its place in the "
    "per-track nesting, and the typed join keys Kineto puts in args. Kept in file order "
    "(Kineto writes each thread's and stream's events together, in time order), one part "
    "per decoded piece.",
    (
        _c("eid", I64, "Position of the event in traceEvents (0-based); the event's id."),
        _c("ph", STR, "Phase: X (complete, or a B/E pair merged), i (instant; I and R are "
           "written as i), b/n/e (async; not paired)."),
        _c("cat", STR, "Category as written (cpu_op, kernel, Operator, Kernel, ...)."),
        _c("kind", STR,
           "Normalized category: cpu_op, user_annotation, python_function, cuda_runtime, "
           "cuda_driver, kernel, memcpy, memset, gpu_user_annotation, cuda_sync, cuda_event, "
           "cpu_instant, overhead, trace_span, accelerator_runtime, accelerator_op, other."),
        _c("name", STR, "Event name (dictionary-encoded in Parquet)."),
        _c("ts_ns", I64, "Start, ns since the Unix epoch (base time added; exact)."),
        _c("dur_ns", I64, "Duration in ns; 0 for instants; NULL for a B with no E."),
        _c("end_ns", I64, "ts_ns + dur_ns."),
        _c("pid", I64, "pid as an integer (numeric strings parsed), NULL when not numeric."),
        _c("tid", I64, "tid as an integer (numeric strings parsed), NULL when not numeric."),
        _c("pid_raw", STR, "pid as written (\"Spans\", \"\", \"7\", -1 ...), as text."),
        _c("tid_raw", STR, "tid as written (\"stream 7\", \"PyTorch Profiler\" ...), as text."),
        _c("track_id", I32, "Dense id of (pid_raw, tid_raw) in this file; see tracks."),
        _c("track_kind", STR, "Kind of the event's track: cpu_thread, gpu_stream, "
           "gpu_device, overhead, span, other (see tracks)."),
        _c("depth", I32, "Nesting depth on the track (0 = root), after sorting by (ts, longer "
           "dur first, eid) with half-open intervals, as Perfetto does."),
        _c("parent_eid", I64, "eid of the enclosing slice on the same track, NULL at depth 0."),
        _c("overlaps_parent", BOOL, "True when the slice starts inside its parent but ends "
           "after it (out of spec; kept, not dropped)."),
        _c("external_id", I64, "args['External id']: links GPU ops and runtime calls to the "
           "CPU op that issued them."),
        _c("correlation", I64, "args.correlation: links a runtime/driver call to its GPU op."),
        _c("seq_nr", I64, "args['Sequence number'] (autograd; pairs forward and backward)."),
        _c("fwd_thread_id", I64, "args['Fwd thread id'] (backward ops)."),
        _c("ev_idx", I64, "args['Ev Idx'] (or the older 'Profiler Event Index')."),
        _c("record_function_id", I64, "args['Record function id'] (links to execution "
           "traces)."),
        _c("python_id", I64, "args['Python id']."),
        _c("python_parent_id", I64, "args['Python parent id']."),
        _c("device", I32, "args.device (GPU ops), else NULL."),
        _c("stream", I64, "args.stream (GPU ops; hex strings parsed), else NULL."),
        _c("async_id", STR, "id of an async (b/n/e) event, as text."),
        _c("flow_out", I64_LIST, "flow_id of the flows that start (s) on this slice."),
        _c("flow_in", I64_LIST, "flow_id of the flows that end (f) or step (t) on this slice."),
        _c("args", STR, "The event's args object as written (JSON text), NULL when absent."),
    ),
    sort_key=("eid",),
)

GPU_OPS = Table(
    "gpu_ops",
    "GPU activities (kernels, memcpy, memset) with their device, stream, launch "
    "configuration, size, the runtime call that launched them and the CPU op that issued it; "
    "also the device ops of accelerators that are not GPUs (events.kind accelerator_op: MTIA), "
    "analysed like GPU ops.",
    (
        _c("eid", I64, "eid of the GPU op in events."),
        _c("kind", STR, "kernel, memcpy or memset. A device op of another accelerator is a "
           "memcpy when its name starts with dma (MTIA's DMA transfers), else a kernel; its "
           "event records and waits (event_record, event_wait) synchronize streams and are not "
           "GPU ops (ingest/kinds.py)."),
        _c("name", STR, "Kernel or copy name."),
        _c("device", I32, "GPU (or accelerator) index (args.device, else pid)."),
        _c("stream", I64, "Stream id (args.stream, else tid)."),
        _c("ts_ns", I64, "Start on the GPU, ns since the epoch."),
        _c("dur_ns", I64, "Duration, ns."),
        _c("end_ns", I64, "End, ns since the epoch."),
        _c("correlation", I64, "CUPTI/roctracer correlation id."),
        _c("external_id", I64, "External id of the issuing CPU op."),
        _c("grid_x", I64, "Grid size x (kernels)."),
        _c("grid_y", I64, "Grid size y."),
        _c("grid_z", I64, "Grid size z."),
        _c("block_x", I64, "Block size x (kernels)."),
        _c("block_y", I64, "Block size y."),
        _c("block_z", I64, "Block size z."),
        _c("registers_per_thread", I64, "args['registers per thread']."),
        _c("shared_memory", I64, "args['shared memory'], bytes."),
        _c("bytes", I64, "args.bytes for memcpy/memset."),
        _c("is_comm", BOOL, "True for communication kernels: named by the registry "
           "(tracetool/comm_kernels.toml: NCCL, RCCL, torch symmetric memory, NVSHMEM, DeepEP, "
           "custom all-reduce, MSCCL++, HCCL) or an ingest --comm-kernel, or whose args "
           "record a Collective name."),
        _c("launch_eid", I64, "eid of the runtime/driver call with the same correlation."),
        _c("launch_name", STR, "Name of that call (cudaLaunchKernel, hipMemcpyAsync, ...)."),
        _c("launch_ts_ns", I64, "Start of that call."),
        _c("launch_tid", I64, "Thread of that call."),
        _c("op_eid", I64, "eid of the innermost cpu_op around the launch call (else the "
           "cpu_op with the same External id)."),
        _c("op_name", STR, "Name of that CPU op."),
        _c("step", I32, "ProfilerStep number whose CPU window contains the launch call (for "
           "an op without a launch call: its own start), NULL when outside any step."),
    ),
    sort_key=("device", "stream", "ts_ns", "eid"),
)

FLOWS = Table(
    "flows",
    "Flow events (ph s/t/f) as written, with the slice each binds to by Perfetto's rules: "
    "s and t bind to the enclosing slice on their thread, f with bp=e to the enclosing "
    "slice, f without bp to the next slice that starts at or after it.",
    (
        _c("eid", I64, "Position of the flow event in traceEvents."),
        _c("ph", STR, "s (start), t (step) or f (end)."),
        _c("cat", STR, "Flow category: ac2g / async / async_cpu_to_gpu (launch -> GPU op), "
           "fwdbwd (forward -> backward), ..."),
        _c("name", STR, "Flow name as written."),
        _c("flow_id", I64, "id as an integer (hex strings parsed; uint64 above 2^63 wrapped "
           "to int64); flows are keyed by (cat, flow_id)."),
        _c("flow_id_raw", STR, "id as written, as text."),
        _c("ts_ns", I64, "Time of the flow event, ns since the epoch."),
        _c("pid_raw", STR, "pid as written."),
        _c("tid_raw", STR, "tid as written."),
        _c("track_id", I32, "Track of the flow event (see tracks)."),
        _c("bp", STR, "Binding point as written ('e' = enclosing slice), NULL when absent."),
        _c("bound_eid", I64, "eid of the slice the flow event binds to, NULL when none."),
    ),
    sort_key=("eid",),
)

COUNTERS = Table(
    "counters",
    "Counter samples (ph C): one row per numeric series key of each counter event.",
    (
        _c("eid", I64, "Position of the counter event in traceEvents."),
        _c("name", STR, "Counter name."),
        _c("series", STR, "Key inside args (may be '')."),
        _c("counter_id", STR, "The event's id, as text, NULL when absent."),
        _c("pid_raw", STR, "pid as written."),
        _c("ts_ns", I64, "Sample time, ns since the epoch."),
        _c("value", F64, "Sample value (numeric strings parsed)."),
    ),
    sort_key=("name", "series", "ts_ns"),
)

METADATA_EVENTS = Table(
    "metadata_events",
    "Metadata events (ph M): process and thread names, labels and sort indexes.",
    (
        _c("eid", I64, "Position of the M event in traceEvents."),
        _c("name", STR, "process_name, thread_name, process_labels, process_sort_index, "
           "thread_sort_index, ..."),
        _c("pid_raw", STR, "pid as written."),
        _c("tid_raw", STR, "tid as written (NULL when absent)."),
        _c("value", STR, "args.name, args.labels or args.sort_index, as text."),
        _c("args", STR, "args as written (JSON text)."),
    ),
    sort_key=("eid",),
)

TRACKS = Table(
    "tracks",
    "One row per (pid, tid) timeline of the file: a CPU thread, a GPU stream, ... with its "
    "names from metadata events. Its kind comes from the categories of its events.",
    (
        _c("track_id", I32, "Dense id, unique within the file."),
        _c("pid_raw", STR, "pid as written."),
        _c("tid_raw", STR, "tid as written."),
        _c("pid", I64, "pid as an integer, NULL when not numeric."),
        _c("tid", I64, "tid as an integer, NULL when not numeric."),
        _c("track_kind", STR, "gpu_stream (kernels/memcpy/memset/gpu annotations/syncs on a "
           "stream), gpu_device (device-wide syncs), cpu_thread (CPU ops, runtime calls, "
           "annotations), overhead (CUPTI overhead), span (profiler Trace spans), other."),
        _c("process_name", STR, "Last process_name for the pid."),
        _c("process_labels", STR, "Last process_labels for the pid (e.g. 'GPU 0', 'CPU')."),
        _c("thread_name", STR, "Last thread_name for the (pid, tid), trailing spaces trimmed."),
        _c("n_events", I64, "Events on the track."),
        _c("first_ns", I64, "First event start."),
        _c("last_ns", I64, "Last event end."),
    ),
    sort_key=("track_id",),
)

COLLECTIVES = Table(
    "collectives",
    "One row per collective (or point-to-point) call per rank: what it was, on which "
    "process group, how big, and the kernel (NCCL/RCCL) or gloo span that did the transfer.",
    (
        _c("eid", I64, "eid of the CPU event that describes the call (record_param_comms, "
           "else the c10d:: op; in traces with neither, the NCCL kernel itself)."),
        _c("collective", STR, "Collective name as PyTorch records it (allreduce, allgather, "
           "_allgather_base, reduce_scatter_tensor_coalesced, broadcast, send, recv, "
           "all_to_allv, ...)."),
        _c("backend", STR, "nccl (a GPU kernel did the transfer), gloo (a gloo:* span on a "
           "gloo thread did), or cpu (neither found); for a comm kernel no call claims, the "
           "registry's backend (rccl, symm_mem, deepep, nvshmem, custom_ar, mscclpp, hccl, "
           "user)."),
        _c("pg_name", STR, "Process group name/uid ('0', '1', ...); kernel:<backend> for the "
           "comm kernels no call claims (no group recorded; docs/collectives.md)."),
        _c("pg_desc", STR, "Process group description (default_pg, ...)."),
        _c("group_size", I32, "Ranks in the group."),
        _c("group_ranks", pa.list_(pa.int32()), "Global ranks of the group (from args, else "
           "from distributedInfo.pg_config)."),
        _c("group_ranks_truncated", BOOL, "True when args listed the ranks with '...'."),
        _c("seq", I64, "Per-group sequence number (args Seq), NULL when not recorded."),
        _c("call_index", I64, "0-based order of this call among this rank's calls on the "
           "same process group (to match instances when seq is absent)."),
        _c("comms_id", U64, "args['Comms Id'] (identical on all participants), NULL when "
           "absent."),
        _c("dtype", STR, "Element type (Float, BFloat16, ...)."),
        _c("elem_bytes", I32, "Bytes per element of dtype."),
        _c("in_nelems", I64, "Input elements (In msg nelems / In msg size / from Input Dims)."),
        _c("out_nelems", I64, "Output elements."),
        _c("in_bytes", I64, "in_nelems * elem_bytes."),
        _c("out_bytes", I64, "out_nelems * elem_bytes."),
        _c("in_split_sizes", STR, "All-to-all: rows sent to each rank of the group, as "
           "written: args['In split size'] (NCCL), the c10d::alltoall_base_ op's Concrete "
           "Inputs [4] (gloo); '[]' for equal splits."),
        _c("out_split_sizes", STR, "All-to-all: rows received from each rank: args['Out "
           "split size'], or Concrete Inputs [3]."),
        _c("peer_rank", I32, "Peer rank of send/recv (Src/Dst Rank or Rank)."),
        _c("cpu_ts_ns", I64, "Start of the describing CPU event."),
        _c("cpu_dur_ns", I64, "Its duration."),
        _c("cpu_tid", I64, "Its thread."),
        _c("kernel_eid", I64, "eid of the collective's GPU kernel, NULL when none."),
        _c("kernel_name", STR, "Its name."),
        _c("kernel_stream", I64, "Its stream."),
        _c("gloo_eid", I64, "eid of the gloo:* span doing the transfer, NULL when none."),
        _c("ts_ns", I64, "Start of the transfer (kernel, else gloo span, else CPU event)."),
        _c("end_ns", I64, "End of the transfer."),
        _c("dur_ns", I64, "end_ns - ts_ns."),
        _c("step", I32, "ProfilerStep number containing the CPU event, NULL when none."),
    ),
    sort_key=("cpu_ts_ns", "eid"),
)

PROFILER_STEPS = Table(
    "profiler_steps",
    "One row per ProfilerStep#N annotation of the rank: the facts the analysis view ``steps`` "
    "tiles the rank's timeline from (docs/steps.md). The step of a GPU op is the annotation "
    "its launch lies in (gpu_ops.step).",
    (
        _c("step", I32, "N of ProfilerStep#N (the first annotation when N repeats)."),
        _c("eid", I64, "eid of the ProfilerStep#N annotation (user_annotation; cpu_op in 2021)."),
        _c("tid", I64, "Thread of that annotation (the thread that drives the steps)."),
        _c("cpu_start_ns", I64, "Start of the annotation."),
        _c("cpu_end_ns", I64, "End of the annotation, NULL when it never ended."),
        _c("finished", BOOL, "False for an annotation still open at trace end (args "
           "finished=false, or a B with no E)."),
        _c("gpu_start_ns", I64, "First start of a GPU op launched inside the step, NULL when "
           "none."),
        _c("gpu_end_ns", I64, "Last end of a GPU op launched inside the step."),
        _c("n_gpu_ops", I64, "GPU ops launched inside the step."),
        _c("gpu_annotation_ns", I64, "Start of the GPU-side ProfilerStep#N annotation "
           "(gpu_user_annotation), NULL when the trace has none."),
        _c("gpu_first_eid", I64, "The step's first GPU op: the first to start at or after "
           "gpu_annotation_ns on its device, else the earliest op launched inside the step."),
        _c("gpu_first_ns", I64, "Start of gpu_first_eid: where the step begins on the GPU."),
    ),
    sort_key=("step",),
)

CP_NODES = Table(
    "cp_nodes",
    "The events whose start and end points are the nodes of the rank's dependency graph (the "
    "graph the critical path walks and the replay schedules; docs/critical_path.md): CPU "
    "events on CPU threads and GPU ops, complete slices (ph X) only, but the calls of a "
    "recorded poll loop that waited for a GPU op (a host wait: a gap on its thread). Built "
    "at ingest, with rank_edges.",
    (
        _c("eid", I64, "The event (events.eid)."),
        _c("track_id", I32, "Its track (tracks)."),
        _c("name", STR, "As in events."),
        _c("ts_ns", I64, "As in events."),
        _c("end_ns", I64, "As in events."),
        _c("depth", I32, "As in events, 0 when NULL."),
        _c("parent_eid", I64, "As in events."),
        _c("cls", STR, "What time inside it is: " + ", ".join(CLASSES) + " (compute: GPU "
           "kernel; comm: communication kernel, or a gloo:* span that does a collective's "
           "transfer; memcpy: copy/memset; cpu: a CPU event)."),
        _c("is_gpu", BOOL, "A GPU op (on a GPU stream)."),
        _c("waitable", BOOL, "A CPU event whose self time can be waiting on another thread "
           "(user annotations, ProfilerStep, *wait* ops)."),
        _c("wake_start", BOOL, "A gap before its start is idle or waiting (its parent is "
           "absent or waitable), so a thread_wake edge may end there."),
    ),
    sort_key=("eid",),
)

RANK_EDGES = Table(
    "rank_edges",
    "The edges of the rank's dependency graph, one row per edge: the point (dst) could not "
    "happen before the point (src). Every kind but 'collective', the one kind between ranks, "
    "which the analysis adds (views collective_edges, edges). Built at ingest.",
    (
        _c("src_eid", I64, "The event (cp_nodes.eid) whose point the edge starts from."),
        _c("src_point", STR, "That point: 'start' or 'end' of the event."),
        _c("dst_eid", I64, "The event whose point depends on it."),
        _c("dst_point", STR, "'start' or 'end'."),
        _c("kind", STR, "Why: " + "; ".join(f"{k}: {v}" for k, v in EDGE_KINDS.items()
                                          if k != "collective") + "."),
        _c("lag_ns", I64, "Time of the dst point minus time of the src point, >= 0 "
           "(transfer_wake may be slightly negative). The src with the smallest lag into a "
           "point is the dependency satisfied last: the one the critical path follows."),
    ),
)  # unsorted: sorting its ~2 rows per event cost a third of the graph's ingest time

INGEST_ISSUES = Table(
    "ingest_issues",
    "Everything ingest could not store as written: one row per quarantined event "
    "(quarantined = true) and per repaired or partly kept event (quarantined = false).",
    (
        _c("eid", I64, "Position in traceEvents, NULL for file-level issues."),
        _c("byte_offset", I64, "Offset of the event (or problem) in the JSON text, when known."),
        _c("issue", STR, "Short code: invalid_json, repaired_json, repaired_utf8, truncated, "
           "not_an_object, bad_field_type, missing_ts, bad_time (ts, dur or their sum "
           "outside int64 ns, or NaN), too_deep, event_too_large, unsupported_phase, "
           "unmatched_end, value_out_of_range, bad_trailer, ..."),
        _c("detail", STR, "Human-readable explanation."),
        _c("quarantined", BOOL, "True when the event is not in any table."),
        _c("snippet", STR, "First 200 characters of the event text, when useful."),
    ),
    sort_key=("eid",),
)

TABLES: tuple[Table, ...] = (
    TRACE_FILES, EVENTS, GPU_OPS, FLOWS, COUNTERS, METADATA_EVENTS, TRACKS, COLLECTIVES,
    PROFILER_STEPS, CP_NODES, RANK_EDGES,
    INGEST_ISSUES,
)
TABLES_BY_NAME = {t.name: t for t in TABLES}


def render_markdown() -> str:
    """The schema reference as Markdown (docs/schema.md is this text)."""
    doc = (__doc__ or "").strip().split("\n\n")
    lines = ["# tracetool store schema", "", "Generated from `tracetool/schema.py` by "
             "`python -m tracetool.schema > docs/schema.md`; do not edit by hand.", ""]
    for para in doc[1:]:
        lines += [" ".join(x.strip() for x in para.splitlines()), ""]
    for t in TABLES:
        lines += [f"## {t.name}", "", t.doc, ""]
        if t.sort_key:
            lines += [f"Sorted by `{', '.join(t.sort_key)}` within each partition.", ""]
        lines += ["| column | type | meaning |", "|---|---|---|"]
        lines += ["| job | VARCHAR | Job name (partition key, from the path). |",
                  "| rank | INTEGER | Rank (partition key, from the path). |"]
        for c in t.columns:
            lines.append(f"| {c.name} | {c.sql_type} | {c.doc.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")
