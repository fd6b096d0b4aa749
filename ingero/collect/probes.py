"""What attaches where: the one table of CUDA, NCCL and NVTX symbols (kernel tracepoints: events/ops.py).

Each row names a base symbol, the library it lives in, the op it is
stored as, the BPF entry function (bpf/cuda.bpf.c, bpf/nccl.bpf.c) that
reads its arguments, and how. Every exported variant of a base
(``_ptds``/``_ptsz`` per-thread-default-stream builds, ``_v2`` revisions
when the base itself is listed without one) is attached, not only the first
that works. CUDA uretprobes share ``cuda_return``, NCCL ones ``nccl_return``.
NVTX probes (on ingero's own injection library, collect/nvtx_inject.c) are
entries only: each reads its arguments and emits its record at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ingero.events.ops import OP_NAMES, Op

RUNTIME = "runtime"
DRIVER = "driver"
NCCL = "nccl"
NVTX = "nvtx"  # ingero's NVTX injection library (collect/nvtx_inject.py builds it)
RETURN_FN = "cuda_return"
NCCL_RETURN_FN = "nccl_return"  # also sends the call's comm / rank out (struct ingero_nccl_ext)


@dataclass(frozen=True)
class CudaProbe:
    symbol: str  # base name as exported (variants found per library)
    library: str  # RUNTIME (libcudart) | DRIVER (libcuda) | NCCL (libnccl)
    op: Op
    entry_fn: str  # BPF function in bpf/cuda.bpf.c / bpf/nccl.bpf.c
    args: str  # how the entry reads the arguments (documentation; --print-bpf shows it)

    @property
    def return_fn(self) -> str | None:
        """The uretprobe's BPF function; None for entry-only probes (NVTX)."""
        if self.library == NVTX:
            return None
        return NCCL_RETURN_FN if self.library == NCCL else RETURN_FN

    @property
    def op_name(self) -> str:
        return OP_NAMES[self.op]


_R, _D, _N = RUNTIME, DRIVER, NCCL

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
    CudaProbe("cuGraphLaunch", _D, Op.CU_GRAPH_LAUNCH, "cu_graph_launch_enter", "stream = arg2"),
    # ---- NCCL (libnccl.so.2); kind = '<redop>:<dtype>', bytes = count x datatype size
    CudaProbe("ncclAllReduce", _N, Op.NCCL_ALL_REDUCE, "nccl_all_reduce_enter",
              "count = arg3, datatype = arg4, redop = arg5, comm = arg6, stream = stack slot 1"),
    CudaProbe("ncclReduceScatter", _N, Op.NCCL_REDUCE_SCATTER, "nccl_reduce_scatter_enter",
              "recvcount = arg3, datatype = arg4, redop = arg5, comm = arg6, stream = stack slot 1"),
    CudaProbe("ncclAllGather", _N, Op.NCCL_ALL_GATHER, "nccl_all_gather_enter",
              "sendcount = arg3, datatype = arg4, comm = arg5, stream = arg6"),
    CudaProbe("ncclBroadcast", _N, Op.NCCL_BROADCAST, "nccl_broadcast_enter",
              "count = arg3, datatype = arg4, peer = root = arg5, comm = arg6, stream = stack slot 1"),
    CudaProbe("ncclBcast", _N, Op.NCCL_BROADCAST, "nccl_bcast_enter",
              "in place: count = arg2, datatype = arg3, peer = root = arg4, comm = arg5, stream = arg6"),
    CudaProbe("ncclReduce", _N, Op.NCCL_REDUCE, "nccl_reduce_enter",
              "count = arg3, datatype = arg4, redop = arg5, peer = root = arg6, comm, stream = stack slots 1, 2"),
    CudaProbe("ncclSend", _N, Op.NCCL_SEND, "nccl_send_enter",
              "count = arg2, datatype = arg3, peer = arg4, comm = arg5, stream = arg6"),
    CudaProbe("ncclRecv", _N, Op.NCCL_RECV, "nccl_recv_enter",
              "count = arg2, datatype = arg3, peer = arg4, comm = arg5, stream = arg6"),
    CudaProbe("ncclGroupStart", _N, Op.NCCL_GROUP_START, "nccl_group_start_enter", "-"),
    CudaProbe("ncclGroupEnd", _N, Op.NCCL_GROUP_END, "nccl_group_end_enter", "-"),
    CudaProbe("ncclCommInitRank", _N, Op.NCCL_COMM_INIT_RANK, "nccl_comm_init_rank_enter",
              "nranks = arg2, ncclUniqueId by value at SP+8 (16 bytes kept), rank = arg3; comm = *arg1 at return"),
    CudaProbe("ncclCommInitRankConfig", _N, Op.NCCL_COMM_INIT_RANK_CONFIG, "nccl_comm_init_rank_config_enter",
              "as ncclCommInitRank"),
    CudaProbe("ncclCommInitAll", _N, Op.NCCL_COMM_INIT_ALL, "nccl_comm_init_all_enter",
              "nranks = ndev = arg2; comm = comms[0] (rank 0) at return"),
    CudaProbe("ncclCommSplit", _N, Op.NCCL_COMM_SPLIT, "nccl_comm_split_enter",
              "parent = arg1, color = arg2, key = arg3; comm = *arg4 at return"),
    CudaProbe("ncclCommDestroy", _N, Op.NCCL_COMM_DESTROY, "nccl_comm_destroy_enter", "comm = arg1"),
    CudaProbe("ncclCommAbort", _N, Op.NCCL_COMM_ABORT, "nccl_comm_abort_enter", "comm = arg1"),
)

# The injection library's probed functions (collect/nvtx_inject.c), read by bpf/nvtx.bpf.c.
NVTX_PROBES: tuple[CudaProbe, ...] = (
    CudaProbe("ingero_nvtx_push", NVTX, Op.NVTX_PUSH, "nvtx_push_enter", "message = arg1, domain = arg2"),
    CudaProbe("ingero_nvtx_pop", NVTX, Op.NVTX_POP, "nvtx_pop_enter", "domain = arg1"),
    CudaProbe("ingero_nvtx_start", NVTX, Op.NVTX_START, "nvtx_start_enter", "message = arg1, range id = arg2"),
    CudaProbe("ingero_nvtx_end", NVTX, Op.NVTX_END, "nvtx_end_enter", "range id = arg1"),
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
    for probe in NVTX_PROBES if kind == NVTX else CUDA_PROBES:
        if probe.library != kind:
            continue
        for sym in variants(probe.symbol, exported):
            # Return probe first: a call entering between the two attaches
            # would otherwise leave entry state whose return is never seen.
            if probe.return_fn is not None:
                out.append(Attachment(path, sym, probe.op, probe.return_fn, "uretprobe"))
            out.append(Attachment(path, sym, probe.op, probe.entry_fn, "uprobe"))
    return out
