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
    "xpu_runtime": "accelerator_runtime", "privateuse1_runtime": "accelerator_runtime",
    "mtia_ccp_events": "accelerator_op", "hpu_op": "accelerator_op",
}
OTHER = "other"
GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_user_annotation", "cuda_event", "accelerator_op")
CPU_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver",
             "cpu_instant", "accelerator_runtime")
LAUNCH_KINDS = ("cuda_runtime", "cuda_driver", "accelerator_runtime")

# phases: stored as events, flows, counters, metadata
EVENT_PHASES = frozenset("XBEiIRbne")
FLOW_PHASES = frozenset("stf")
