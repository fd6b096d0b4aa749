"""Every op ingero stores, its category, and the kernel tracepoints it attaches: the one table.

Dependency-free on purpose: collect's decoder and probe table, the store's
derived views, analyze's SQL, the checks and the importer all take their names
and categories from here, so an op added or moved between categories changes in
one place.  ``tests/unit/test_records_parity.py`` holds ``Op`` to ``enum ingero_op``.
"""

from __future__ import annotations

import enum


class Op(enum.IntEnum):
    """enum ingero_op.  ``OP_NAMES`` gives the public name stored in ``events.op``."""

    NONE = 0
    CUDA_LAUNCH_KERNEL = 1
    CUDA_MEMCPY = 2
    CUDA_MEMCPY_ASYNC = 3
    CUDA_STREAM_SYNC = 4
    CUDA_DEVICE_SYNC = 5
    CUDA_EVENT_SYNC = 6
    CUDA_MALLOC = 7
    CUDA_FREE = 8
    CUDA_GRAPH_LAUNCH = 9
    CUDA_MALLOC_HOST = 10
    CUDA_HOST_REGISTER = 11
    CU_LAUNCH_KERNEL = 32
    CU_MEMCPY = 33
    CU_MEMCPY_ASYNC = 34
    CU_CTX_SYNC = 35
    CU_STREAM_SYNC = 36
    CU_MEM_ALLOC = 37
    CU_MEM_FREE = 38
    CU_GRAPH_LAUNCH = 39
    NCCL_EXT = 79
    NCCL_ALL_REDUCE = 80
    NCCL_REDUCE_SCATTER = 81
    NCCL_ALL_GATHER = 82
    NCCL_BROADCAST = 83
    NCCL_REDUCE = 84
    NCCL_SEND = 85
    NCCL_RECV = 86
    NCCL_GROUP_START = 87
    NCCL_GROUP_END = 88
    NCCL_COMM_INIT_RANK = 89
    NCCL_COMM_INIT_ALL = 90
    NCCL_COMM_INIT_RANK_CONFIG = 91
    NCCL_COMM_SPLIT = 92
    NCCL_COMM_DESTROY = 93
    NCCL_COMM_ABORT = 94
    NVTX_PUSH = 96
    NVTX_POP = 97
    NVTX_START = 98
    NVTX_END = 99
    NVTX_TEXT = 100
    SCHED_SWITCH = 64
    PAGE_FAULT = 65
    BLOCK_IO = 66
    PROC_EXEC = 67
    PROC_EXIT = 68
    CPU_SAMPLE = 69
    BENCH = 127


# Public names (the events.op column).  Never rename: users' SQL depends on them.
OP_NAMES: dict[Op, str] = {
    Op.NONE: "none",
    Op.CUDA_LAUNCH_KERNEL: "cudaLaunchKernel",
    Op.CUDA_MEMCPY: "cudaMemcpy",
    Op.CUDA_MEMCPY_ASYNC: "cudaMemcpyAsync",
    Op.CUDA_STREAM_SYNC: "cudaStreamSync",
    Op.CUDA_DEVICE_SYNC: "cudaDeviceSync",
    Op.CUDA_EVENT_SYNC: "cudaEventSync",
    Op.CUDA_MALLOC: "cudaMalloc",
    Op.CUDA_FREE: "cudaFree",
    Op.CUDA_GRAPH_LAUNCH: "cudaGraphLaunch",
    Op.CUDA_MALLOC_HOST: "cudaMallocHost",
    Op.CUDA_HOST_REGISTER: "cudaHostRegister",
    Op.CU_LAUNCH_KERNEL: "cuLaunchKernel",
    Op.CU_MEMCPY: "cuMemcpy",
    Op.CU_MEMCPY_ASYNC: "cuMemcpyAsync",
    Op.CU_CTX_SYNC: "cuCtxSynchronize",
    Op.CU_STREAM_SYNC: "cuStreamSynchronize",
    Op.CU_MEM_ALLOC: "cuMemAlloc",
    Op.CU_MEM_FREE: "cuMemFree",
    Op.CU_GRAPH_LAUNCH: "cuGraphLaunch",
    Op.NCCL_EXT: "nccl_ext",  # never stored: joined to the call it extends (NcclExt)
    Op.NCCL_ALL_REDUCE: "ncclAllReduce",
    Op.NCCL_REDUCE_SCATTER: "ncclReduceScatter",
    Op.NCCL_ALL_GATHER: "ncclAllGather",
    Op.NCCL_BROADCAST: "ncclBroadcast",
    Op.NCCL_REDUCE: "ncclReduce",
    Op.NCCL_SEND: "ncclSend",
    Op.NCCL_RECV: "ncclRecv",
    Op.NCCL_GROUP_START: "ncclGroupStart",
    Op.NCCL_GROUP_END: "ncclGroupEnd",
    Op.NCCL_COMM_INIT_RANK: "ncclCommInitRank",
    Op.NCCL_COMM_INIT_ALL: "ncclCommInitAll",
    Op.NCCL_COMM_INIT_RANK_CONFIG: "ncclCommInitRankConfig",
    Op.NCCL_COMM_SPLIT: "ncclCommSplit",
    Op.NCCL_COMM_DESTROY: "ncclCommDestroy",
    Op.NCCL_COMM_ABORT: "ncclCommAbort",
    # NVTX records: never stored in events, paired into spans rows (collect/nvtx.py)
    Op.NVTX_PUSH: "nvtx_push",
    Op.NVTX_POP: "nvtx_pop",
    Op.NVTX_START: "nvtx_start",
    Op.NVTX_END: "nvtx_end",
    Op.NVTX_TEXT: "nvtx_text",
    Op.SCHED_SWITCH: "sched_switch",
    Op.PAGE_FAULT: "page_fault",
    Op.BLOCK_IO: "block_io",
    Op.PROC_EXEC: "proc_exec",
    Op.PROC_EXIT: "proc_exit",
    Op.CPU_SAMPLE: "cpu_sample",  # --stack: a ~99 Hz CPU sample of a traced thread (bpf/sample.bpf.c)
    Op.BENCH: "bench",
}

CUDA_OPS = frozenset(o for o in Op if 1 <= o < 64)
# NCCL calls (80-95): enqueue calls like launches; a collective's device work
# starts when the last rank of the communicator has entered it.
NCCL_OPS = frozenset(o for o in Op if 80 <= o < 96)
# NVTX records (96-100): the collector turns them into spans rows, never events rows.
NVTX_OPS = frozenset(o for o in Op if 96 <= o <= 100)
# Collectives and point-to-point transfers: the rows whose entry time ranks
# are compared by (events.bytes = count x datatype size, events.comm, stream).
NCCL_TRANSFERS = (Op.NCCL_ALL_REDUCE, Op.NCCL_REDUCE_SCATTER, Op.NCCL_ALL_GATHER, Op.NCCL_BROADCAST, Op.NCCL_REDUCE,
                  Op.NCCL_SEND, Op.NCCL_RECV)
NCCL_TRANSFER_OPS = frozenset(OP_NAMES[o] for o in NCCL_TRANSFERS)
# Ops whose arg is a byte count: events.bytes (collect/decode.py), summed in the summaries.
BYTES_OPS = frozenset(
    {
        Op.CUDA_MEMCPY,
        Op.CUDA_MEMCPY_ASYNC,
        Op.CUDA_MALLOC,
        Op.CUDA_MALLOC_HOST,
        Op.CUDA_HOST_REGISTER,
        Op.CU_MEMCPY,
        Op.CU_MEMCPY_ASYNC,
        Op.CU_MEM_ALLOC,
        *NCCL_TRANSFERS,
        Op.BLOCK_IO,
        Op.BENCH,
    }
)
# The launches: the bulk of a training loop's calls (the overhead budget samples their probes;
# collect/entry_cost.py prices a traced call by their entries).
_LAUNCHES = (Op.CUDA_LAUNCH_KERNEL, Op.CU_LAUNCH_KERNEL, Op.CUDA_GRAPH_LAUNCH, Op.CU_GRAPH_LAUNCH)
LAUNCH_OP_CODES = frozenset(_LAUNCHES)
# What a call does to the thread's queued bit when it returns (bpf/cuda.bpf.c
# op_class; the contract of events.queued): launches and async copies that
# return 0 queue device work; syncs and synchronous copies wait for it.
ASYNC_OPS = frozenset(
    OP_NAMES[o]
    for o in (
        Op.CUDA_LAUNCH_KERNEL,
        Op.CUDA_GRAPH_LAUNCH,
        Op.CUDA_MEMCPY_ASYNC,
        Op.CU_LAUNCH_KERNEL,
        Op.CU_GRAPH_LAUNCH,
        Op.CU_MEMCPY_ASYNC,
    )
) | NCCL_TRANSFER_OPS  # a collective enqueues device work like a launch (bpf/cuda.bpf.c op_class)
# The syncs, in Op order (analyze passes them to DuckDB as a list).
SYNC_OPS: tuple[str, ...] = tuple(
    OP_NAMES[o]
    for o in (
        Op.CUDA_STREAM_SYNC,
        Op.CUDA_DEVICE_SYNC,
        Op.CUDA_EVENT_SYNC,
        Op.CU_CTX_SYNC,
        Op.CU_STREAM_SYNC,
    )
)
# Calls after whose return the thread has nothing of its own queued: the syncs
# and the synchronous copies (which wait for the copy and the work before it).
DRAINING_OPS = frozenset(SYNC_OPS) | {OP_NAMES[Op.CUDA_MEMCPY], OP_NAMES[Op.CU_MEMCPY]}


# Categories analyze's window SQL works with (passed to DuckDB as lists).
LAUNCH_OPS: tuple[str, ...] = tuple(OP_NAMES[o] for o in _LAUNCHES)  # (LAUNCH_OP_CODES by name)
COPY_OPS: tuple[str, ...] = tuple(OP_NAMES[o] for o in (Op.CUDA_MEMCPY, Op.CUDA_MEMCPY_ASYNC, Op.CU_MEMCPY,
                                                        Op.CU_MEMCPY_ASYNC))
SYNC_COPY_OPS: tuple[str, ...] = (OP_NAMES[Op.CUDA_MEMCPY], OP_NAMES[Op.CU_MEMCPY])  # wait for the copy
ASYNC_COPY_OPS: tuple[str, ...] = (OP_NAMES[Op.CUDA_MEMCPY_ASYNC], OP_NAMES[Op.CU_MEMCPY_ASYNC])
# Wait for everything the process queued, on every stream.
DEVICE_SYNC_OPS: tuple[str, ...] = (OP_NAMES[Op.CUDA_DEVICE_SYNC], OP_NAMES[Op.CU_CTX_SYNC])
# Wait for one stream: a drain only when the process uses a single stream.
STREAM_SYNC_OPS: tuple[str, ...] = (OP_NAMES[Op.CUDA_STREAM_SYNC], OP_NAMES[Op.CU_STREAM_SYNC])
# Wait for one point of one stream: never a drain, a wait only.
EVENT_SYNC_OPS: tuple[str, ...] = (OP_NAMES[Op.CUDA_EVENT_SYNC],)
# Collectives every rank of the communicator calls (send / recv are pairwise).
COLLECTIVE_OPS: tuple[str, ...] = tuple(
    OP_NAMES[o]
    for o in (Op.NCCL_ALL_REDUCE, Op.NCCL_REDUCE_SCATTER, Op.NCCL_ALL_GATHER, Op.NCCL_BROADCAST, Op.NCCL_REDUCE)
)
# The CUDA (runtime and driver) calls' names, sorted: the calls' rows of events.
CUDA_OP_NAMES: tuple[str, ...] = tuple(sorted(OP_NAMES[o] for o in CUDA_OPS))
PINNED_OPS: tuple[str, ...] = (OP_NAMES[Op.CUDA_MALLOC_HOST], OP_NAMES[Op.CUDA_HOST_REGISTER])
# Rows that are not CUDA calls: the kernel's events and the benchmark's marker.
HOST_OPS: tuple[str, ...] = tuple(
    OP_NAMES[o]
    for o in (Op.SCHED_SWITCH, Op.PAGE_FAULT, Op.BLOCK_IO, Op.PROC_EXEC, Op.PROC_EXIT, Op.CPU_SAMPLE, Op.BENCH, Op.NONE)
)

# Kernel tracepoints the BPF object attaches (declared in bpf/ingero.bpf.c),
# "category:name" -> the op stored (None: feeds state or the process_cpu table only).
TRACEPOINTS: tuple[tuple[str, str | None], ...] = (
    ("sched:sched_switch", OP_NAMES[Op.SCHED_SWITCH]),
    ("sched:sched_waking", None),
    ("sched:sched_wakeup_new", None),
    ("sched:sched_process_fork", None),
    ("sched:sched_process_exec", OP_NAMES[Op.PROC_EXEC]),
    ("sched:sched_process_exit", OP_NAMES[Op.PROC_EXIT]),
    ("exceptions:page_fault_user", OP_NAMES[Op.PAGE_FAULT]),
    ("block:block_rq_issue", OP_NAMES[Op.BLOCK_IO]),
    ("block:block_rq_complete", OP_NAMES[Op.BLOCK_IO]),
)
