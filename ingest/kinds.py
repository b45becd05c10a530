"""Normalized event kinds: one name per concept across Kineto's eras and vendors."""

from __future__ import annotations

KIND_OF_CAT = {
    "cpu_op": "cpu_op", "Operator": "cpu_op", "operator": "cpu_op",
    "user_annotation": "user_annotation", "python_function": "python_function",
    "cuda_runtime": "cuda_runtime", "Runtime": "cuda_runtime", "cuda_driver": "cuda_driver",
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy", "gpu_memset": "memset", "Memset": "memset",
    "gpu_user_annotation": "gpu_user_annotation", "cuda_sync": "cuda_sync",
    "cuda_event": "cuda_event", "cpu_instant_event": "cpu_instant", "overhead": "overhead",
    "Trace": "trace_span", "mtia_runtime": "accelerator_runtime",
    "xpu_runtime": "accelerator_runtime", "xpu_driver": "accelerator_runtime",
    "privateuse1_runtime": "accelerator_runtime", "privateuse1_driver": "accelerator_runtime",
    # Kineto's ActivityType.h: HPU_OP is a "HPU host side runtime event" (since aliased to
    # RUNTIME), MTIA_CCP_EVENTS the "MTIA ondevice CCP events" (aliased to CONCURRENT_KERNEL)
    "hpu_op": "accelerator_runtime", "mtia_ccp_events": "accelerator_op",
}
OTHER = "other"
GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation", "cuda_event", "accelerator_op")
CPU_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver",
             "cpu_instant", "accelerator_runtime")
LAUNCH_KINDS = ("cuda_runtime", "cuda_driver", "accelerator_runtime")

# The events gpu_ops holds: GPU kernels and copies, and the device ops of accelerators that
# are not CUDA/ROCm GPUs (accelerator_op: MTIA), which are analysed like GPU ops. Their
# gpu_ops kind comes from the name (HTA's MTIA patterns): DMA transfers (dma_request, ...)
# are copies (memcpy), the device's event records and waits (event_record, event_wait: a
# stream waiting for another stream's event) synchronize streams as cuda_sync events do, so
# they are neither work nor in gpu_ops, and every other device op (pe_exe, merge, remote,
# ...) runs on the device like a kernel.
GPU_OP_KINDS = ("kernel", "memcpy", "memset", "accelerator_op")
DEVICE_COPY_PREFIX = "dma"
DEVICE_SYNC_NAMES = ("event_record", "event_wait")


def gpu_op_kind_sql(kind: str = "kind", name: str = "name") -> str:
    """SQL: the gpu_ops kind of an events row (``kind``, ``name``: its columns), NULL for an
    event gpu_ops does not hold (see GPU_OP_KINDS)."""
    sync = ", ".join(f"'{n}'" for n in DEVICE_SYNC_NAMES)
    kinds = ", ".join(f"'{k}'" for k in GPU_OP_KINDS[:3])
    return (f"CASE WHEN {kind} IN ({kinds}) THEN {kind} "
            f"WHEN {kind} <> 'accelerator_op' OR {name} IN ({sync}) THEN NULL "
            f"WHEN starts_with(lower({name}), '{DEVICE_COPY_PREFIX}') THEN 'memcpy' "
            "ELSE 'kernel' END")

# phases: stored as events, flows, counters, metadata
EVENT_PHASES = frozenset("XBEiIRbne")
FLOW_PHASES = frozenset("stf")
