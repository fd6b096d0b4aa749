"""What attaches where: the one table of CUDA symbols and kernel tracepoints.

Each CUDA row names a base symbol, the library it lives in, the op it is
stored as, the BPF entry function (bpf/cuda.bpf.c) that reads its
arguments, and how. Every exported variant of a base (``_ptds``/``_ptsz``
per-thread-default-stream builds, ``_v2`` revisions when the base itself is
listed without one) is attached, not only the first that works. All
uretprobes share ``cuda_return``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ingero.collect.records import OP_NAMES, Op

RUNTIME = "runtime"
DRIVER = "driver"
RETURN_FN = "cuda_return"


@dataclass(frozen=True)
class CudaProbe:
    symbol: str  # base name as exported (variants found per library)
    library: str  # RUNTIME (libcudart) | DRIVER (libcuda)
    op: Op
    entry_fn: str  # BPF function in bpf/cuda.bpf.c
    args: str  # how the entry reads the arguments (documentation; --print-bpf shows it)

    @property
    def op_name(self) -> str:
        return OP_NAMES[self.op]


_R, _D = RUNTIME, DRIVER

CUDA_PROBES: tuple[CudaProbe, ...] = (
    # ---- runtime (libcudart)
    CudaProbe("cudaLaunchKernel", _R, Op.CUDA_LAUNCH_KERNEL, "cuda_launch_kernel_enter",
              "stream = stack slot 2 (dim3 grid/block take rsi:rdx, rcx:r8)"),
    CudaProbe("cudaLaunchKernelExC", _R, Op.CUDA_LAUNCH_KERNEL, "cuda_launch_kernel_exc_enter",
              "stream = config->stream (offset 32)"),
    CudaProbe("cudaMemcpy", _R, Op.CUDA_MEMCPY, "cuda_memcpy_enter", "bytes = arg3, kind = arg4"),
    CudaProbe("cudaMemcpyAsync", _R, Op.CUDA_MEMCPY_ASYNC, "cuda_memcpy_async_enter",
              "bytes = arg3, kind = arg4, stream = arg5"),
    CudaProbe("cudaStreamSynchronize", _R, Op.CUDA_STREAM_SYNC, "cuda_stream_sync_enter", "stream = arg1"),
    CudaProbe("cudaDeviceSynchronize", _R, Op.CUDA_DEVICE_SYNC, "cuda_device_sync_enter", "-"),
    CudaProbe("cudaEventSynchronize", _R, Op.CUDA_EVENT_SYNC, "cuda_event_sync_enter", "-"),
    CudaProbe("cudaMalloc", _R, Op.CUDA_MALLOC, "cuda_malloc_enter", "bytes = arg2"),
    CudaProbe("cudaFree", _R, Op.CUDA_FREE, "cuda_free_enter", "-"),
    CudaProbe("cudaGraphLaunch", _R, Op.CUDA_GRAPH_LAUNCH, "cuda_graph_launch_enter", "stream = arg2"),
    CudaProbe("cudaMallocHost", _R, Op.CUDA_MALLOC_HOST, "cuda_malloc_host_enter", "bytes = arg2 (pinned)"),
    CudaProbe("cudaHostAlloc", _R, Op.CUDA_MALLOC_HOST, "cuda_malloc_host_enter", "bytes = arg2 (pinned)"),
    CudaProbe("cudaHostRegister", _R, Op.CUDA_HOST_REGISTER, "cuda_host_register_enter", "bytes = arg2 (pinned)"),
    # ---- driver (libcuda)
    CudaProbe("cuLaunchKernel", _D, Op.CU_LAUNCH_KERNEL, "cu_launch_kernel_enter", "stream = stack slot 3"),
    CudaProbe("cuLaunchKernelEx", _D, Op.CU_LAUNCH_KERNEL, "cu_launch_kernel_ex_enter",
              "stream = config->hStream (offset 32)"),
    CudaProbe("cuMemcpy", _D, Op.CU_MEMCPY, "cu_memcpy_enter", "bytes = arg3"),
    CudaProbe("cuMemcpyHtoD_v2", _D, Op.CU_MEMCPY, "cu_memcpy_htod_enter", "bytes = arg3, kind H2D"),
    CudaProbe("cuMemcpyDtoH_v2", _D, Op.CU_MEMCPY, "cu_memcpy_dtoh_enter", "bytes = arg3, kind D2H"),
    CudaProbe("cuMemcpyDtoD_v2", _D, Op.CU_MEMCPY, "cu_memcpy_dtod_enter", "bytes = arg3, kind D2D"),
    CudaProbe("cuMemcpyAsync", _D, Op.CU_MEMCPY_ASYNC, "cu_memcpy_async_enter", "bytes = arg3, stream = arg4"),
    CudaProbe("cuMemcpyHtoDAsync_v2", _D, Op.CU_MEMCPY_ASYNC, "cu_memcpy_htod_async_enter",
              "bytes = arg3, stream = arg4, kind H2D"),
    CudaProbe("cuMemcpyDtoHAsync_v2", _D, Op.CU_MEMCPY_ASYNC, "cu_memcpy_dtoh_async_enter",
              "bytes = arg3, stream = arg4, kind D2H"),
    CudaProbe("cuMemcpyDtoDAsync_v2", _D, Op.CU_MEMCPY_ASYNC, "cu_memcpy_dtod_async_enter",
              "bytes = arg3, stream = arg4, kind D2D"),
    CudaProbe("cuCtxSynchronize", _D, Op.CU_CTX_SYNC, "cu_ctx_sync_enter", "-"),
    CudaProbe("cuStreamSynchronize", _D, Op.CU_STREAM_SYNC, "cu_stream_sync_enter", "stream = arg1"),
    CudaProbe("cuMemAlloc_v2", _D, Op.CU_MEM_ALLOC, "cu_mem_alloc_enter", "bytes = arg2"),
    CudaProbe("cuMemFree_v2", _D, Op.CU_MEM_FREE, "cu_mem_free_enter", "-"),
)

# Per-thread-default-stream builds of a call: same arguments, same op.
_VARIANT = re.compile(r"^(?:_ptds|_ptsz)?$")


def variants(base: str, exported: frozenset[str] | set[str]) -> list[str]:
    """``base`` and its exported _ptds / _ptsz variants, base first (only those exported)."""
    found = [s for s in exported if s.startswith(base) and _VARIANT.match(s[len(base):])]
    return sorted(found, key=lambda s: (s != base, s))


@dataclass(frozen=True)
class Attachment:
    """One planned uprobe or uretprobe."""

    path: str
    symbol: str
    op: Op
    fn: str
    probe_kind: str  # 'uprobe' | 'uretprobe'


def plan_library(path: str, kind: str, exported: frozenset[str] | set[str]) -> list[Attachment]:
    """Every (entry, return) pair to attach on one library file."""
    out: list[Attachment] = []
    for probe in CUDA_PROBES:
        if probe.library != kind:
            continue
        for sym in variants(probe.symbol, exported):
            # Return probe first: a call entering between the two attaches
            # would otherwise leave entry state whose return is never seen.
            out.append(Attachment(path, sym, probe.op, RETURN_FN, "uretprobe"))
            out.append(Attachment(path, sym, probe.op, probe.entry_fn, "uprobe"))
    return out


# Kernel tracepoints the object attaches (declared in bpf/ingero.bpf.c);
# name -> op stored (None: feeds state or the process_cpu table only).
TRACEPOINTS: tuple[tuple[str, str | None], ...] = (
    ("sched:sched_switch", OP_NAMES[Op.SCHED_SWITCH]),
    ("sched:sched_wakeup", None),
    ("sched:sched_wakeup_new", None),
    ("sched:sched_process_fork", None),
    ("sched:sched_process_exec", OP_NAMES[Op.PROC_EXEC]),
    ("sched:sched_process_exit", OP_NAMES[Op.PROC_EXIT]),
    ("exceptions:page_fault_user", OP_NAMES[Op.PAGE_FAULT]),
    ("block:block_rq_issue", OP_NAMES[Op.BLOCK_IO]),
    ("block:block_rq_complete", OP_NAMES[Op.BLOCK_IO]),
)
