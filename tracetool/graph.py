"""The dependency graph's vocabulary: the kinds of edges, the classes of node events.

One home for the words the graph is written in. Ingest stores each rank's graph in the
tables ``cp_nodes`` and ``rank_edges`` (``tracetool.ingest.graph``); the analysis adds the
edges between ranks and walks it (``tracetool.analysis.critical_path``); the replay
schedules it again (``tracetool.replay.graph``). All three read these names from here.
"""

from __future__ import annotations

# Edge kinds, in tie-break order: when two dependencies of a node were satisfied at the same
# instant, the earlier kind in this list is taken as the binding one (the local, recorded
# order first, inferred hand-offs last).
EDGE_KINDS: dict[str, str] = {
    "cpu_order": "consecutive points on a CPU thread (program order and nesting): the "
                 "previous start or end on the same thread",
    "gpu_order": "consecutive points on a GPU stream (stream order)",
    "launch": "runtime/driver call start -> the GPU op it launched (correlation id)",
    "sync": "GPU op end -> end of the CPU call that waited for it: device/stream/event "
            "synchronize (awaited op from cuda_sync events when recorded), blocking memcpy "
            "(its own copy, when it ended before the call returned)",
    "host_wait": "inferred host wait: GPU op end -> the CPU point where a thread resumed "
                 "after a gap of at least HOST_WAIT_MIN_GAP_NS (idle, or inside an op's self "
                 "time) within HOST_WAIT_TOL_NS of that op's end, when so few GPU ops ended "
                 "in the gap that the coincidence is unlikely by chance (a polling loop, a "
                 "spin on pinned memory: waiting, not CPU work); a recorded poll loop (a run "
                 "of POLL_CALLS lasting HOST_WAIT_MIN_GAP_NS whose last call ended within "
                 "HOST_WAIT_TOL_NS of that op's end) is such a gap: its calls are no nodes",
    "collective": "start of the last-arriving rank's collective kernel or gloo span -> end "
                  "of every other rank's one (instances: collective_ranks.instance; "
                  "docs/collectives.md). The only kind between ranks: computed by the "
                  "analysis (view collective_edges), not stored",
    "stream_wait": "GPU op end -> first GPU op launched on the waiting stream after a "
                   "cudaStreamWaitEvent (cuda_sync 'Stream Wait Event'; the awaited op is the "
                   "last one launched on the recorded stream before cudaEventRecord)",
    "event_wait": "inferred stream wait, on ranks without cuda_sync 'Stream Wait Event': "
                  "the last GPU op the thread launched before the cudaEventRecord that most "
                  "recently preceded a cudaStreamWaitEvent on the same thread (the recorded "
                  "stream) -> the first op the thread launched after the wait on another "
                  "stream (the waiting one)",
    "comm_wait": "inferred NCCL stream waits (ranks without cuda_sync): last compute op "
                 "launched before a comm kernel -> its start, and comm kernel end -> first "
                 "compute op on another stream to start after it",
    "comm_enqueue": "CPU call of a gloo collective start -> start of its gloo span on the "
                    "gloo worker thread",
    "thread_wake": "inferred CPU hand-off: end of an event on another thread of the rank -> "
                   "the point where a thread resumed after an idle or waiting gap",
    "transfer_wake": "inferred wait for a CPU-side transfer (replay only, not walked by the "
                     "critical path): end of a gloo span -> the start where another thread "
                     "of the rank resumed after going idle while it was in flight (DDP waits "
                     "on the bucket futures unrecorded), or the end of the op that had just "
                     "enqueued that collective and waited for it inside (an autograd "
                     "function around all_to_all_single) or of a wait op, when it ended as "
                     "the span did; the resume may precede the span's recorded end a little "
                     "(tolerance 5% of the span, at least 100 us), so its lag can be "
                     "negative",
}
KIND_NAMES = list(EDGE_KINDS)
# edges the critical path's backward walk does not follow (their lag may be negative)
REPLAY_ONLY_KINDS = ("transfer_wake",)
# what time inside a node event is (cp_nodes.cls)
CLASSES = ("compute", "comm", "memcpy", "cpu")
POINTS = ("start", "end")  # a node is the start or the end point of its event

# the runtime/driver calls of events, for the inferred stream waits (event_wait)
EVENT_RECORD_CALLS = ("cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord",
                      "cuEventRecordWithFlags", "hipEventRecord", "hipEventRecordWithFlags")
STREAM_WAIT_CALLS = ("cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent")

# host waits (host_wait): a CPU gap of at least MIN_GAP that ends within TOL after a GPU op's
# end is a wait on that op, when at most one GPU op ended per CHANCE tolerances of the gap (so
# a random resume would land within TOL of an end with a chance of at most 1 / CHANCE)
HOST_WAIT_MIN_GAP_NS = 1_000_000
HOST_WAIT_TOL_NS = 20_000
HOST_WAIT_CHANCE = 20
# poll loops (host_wait too): a run of these calls on one thread, nothing else recorded between
# them and at most HOST_POLL_GAP_NS of unrecorded time between one's end and the next's start,
# is one wait when it lasts HOST_WAIT_MIN_GAP_NS and its last call ends within HOST_WAIT_TOL_NS
# of a GPU op's end (the same chance test): its calls are then no nodes of the graph, so the
# run is a gap on its thread that the host_wait edge ends (docs/critical_path.md)
POLL_CALLS = ("cudaEventQuery", "cudaStreamQuery", "cuEventQuery", "cuStreamQuery",
              "hipEventQuery", "hipStreamQuery")
HOST_POLL_GAP_NS = HOST_WAIT_TOL_NS

SYNC_CALLS = (
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
    "synchronizeStream",  # MTIA's runtime (mtia_runtime): the host waits for a stream
)
