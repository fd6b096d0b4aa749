"""The one Python mirror of bpf/events.h.

Every record the BPF side emits is declared here as a ctypes structure; the
numpy dtype derived from it decodes whole ring-buffer spans with one
``frombuffer`` call.  tests/unit/test_records_parity.py compiles events.h and
checks that sizes and offsets agree, so the two cannot drift silently.
"""

from __future__ import annotations

import ctypes
import enum
from typing import TYPE_CHECKING, Any


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
# Collectives and point-to-point transfers: the rows whose entry time ranks
# are compared by (events.bytes = count x datatype size, events.comm, stream).
NCCL_TRANSFER_OPS = frozenset(
    OP_NAMES[o]
    for o in (
        Op.NCCL_ALL_REDUCE,
        Op.NCCL_REDUCE_SCATTER,
        Op.NCCL_ALL_GATHER,
        Op.NCCL_BROADCAST,
        Op.NCCL_REDUCE,
        Op.NCCL_SEND,
        Op.NCCL_RECV,
    )
)
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
SYNC_OPS = frozenset(
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
DRAINING_OPS = SYNC_OPS | {OP_NAMES[Op.CUDA_MEMCPY], OP_NAMES[Op.CU_MEMCPY]}


class Kind(enum.IntEnum):
    """enum ingero_kind.  ``KIND_NAMES`` gives the value stored in ``events.kind``."""

    H2H = 0
    H2D = 1
    D2H = 2
    D2D = 3
    DEFAULT = 4
    NONE = 15
    PREEMPTED = 16
    SLEEP = 17
    IO = 18
    OTHER_STATE = 19
    READ = 24
    WRITE = 25
    FLUSH = 26
    DISCARD = 27
    NCCL = 128  # NCCL calls: NCCL | redop << 4 | datatype (nccl_kind_name)


# NCCL's ncclRedOp_t and ncclDataType_t values, as events.kind spells them.
NCCL_REDOPS = ("sum", "prod", "max", "min", "avg", "custom")  # 5: made by ncclRedOpCreatePreMulSum
NCCL_REDOP_NONE = 7
NCCL_DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
               "bfloat16", "float8e4m3", "float8e5m2")


def nccl_kind_name(kind: int) -> str | None:
    """'<redop>:<dtype>' ('sum:float32'), or '<dtype>' for calls without a reduction; None for no NCCL kind."""
    if not Kind.NCCL <= kind <= 255:
        return None
    redop, dtype = (kind >> 4) & 7, kind & 15
    dname = NCCL_DTYPES[dtype] if dtype < len(NCCL_DTYPES) else "unknown"
    if redop == NCCL_REDOP_NONE:
        return dname
    return f"{NCCL_REDOPS[redop] if redop < len(NCCL_REDOPS) else 'unknown'}:{dname}"


KIND_NAMES: dict[Kind, str | None] = {
    Kind.H2H: "H2H",
    Kind.H2D: "H2D",
    Kind.D2H: "D2H",
    Kind.D2D: "D2D",
    Kind.DEFAULT: "default",
    Kind.NONE: None,
    Kind.PREEMPTED: "preempted",
    Kind.SLEEP: "sleep",
    Kind.IO: "io",
    Kind.OTHER_STATE: "other",
    Kind.READ: "read",
    Kind.WRITE: "write",
    Kind.FLUSH: "flush",
    Kind.DISCARD: "discard",
}


class Event(ctypes.Structure):
    """struct ingero_event."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
        ("arg", ctypes.c_uint64),
        ("stream", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("other_pid", ctypes.c_uint32),
        ("stack_id", ctypes.c_int32),
        ("ret", ctypes.c_int16),
        ("call_op", ctypes.c_uint8),
        ("call_flags", ctypes.c_uint8),
        ("op", ctypes.c_uint8),
        ("kind", ctypes.c_uint8),
        ("cpu", ctypes.c_uint16),
    ]


class NcclExt(ctypes.Structure):
    """struct ingero_nccl_ext: what an NCCL call's record (op NCCL_*) has no room for."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("comm", ctypes.c_uint64),
        ("id", ctypes.c_uint64 * 2),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("rank", ctypes.c_int32),
        ("nranks", ctypes.c_int32),
        ("color", ctypes.c_int32),
        ("op", ctypes.c_uint8),
        ("call_op", ctypes.c_uint8),
        ("cpu", ctypes.c_uint16),
    ]


class ProcStat(ctypes.Structure):
    """struct ingero_proc_stat."""

    _fields_ = [
        ("oncpu_ns", ctypes.c_uint64),
        ("involuntary", ctypes.c_uint64),
        ("voluntary", ctypes.c_uint64),
        ("preempted_traced", ctypes.c_uint64),
        ("comm", ctypes.c_char * 16),
    ]


class CallFlag(enum.IntFlag):
    """enum ingero_call_flag: bits of Event.call_flags (sched_switch, page_fault and cpu_sample records)."""

    SEEN = 1  # the thread has made a traced CUDA call (else events.queued is NULL)
    QUEUED = 2  # async device work issued since its last synchronising call returned


class Counter(enum.IntEnum):
    """enum ingero_counter."""

    RB_DROPS = 0
    STACK_ERRORS = 1
    NEST_SKIPPED = 2
    STALE_CALLS = 3
    MAX = 8


def _numpy_mirrors() -> dict[str, Any]:
    """The numpy views of the records: dtypes, and lookup tables indexed by
    the raw u8 op / kind (vectorised id -> name)."""
    import numpy as np

    return {
        "EVENT_DTYPE": np.dtype(Event),
        "PROC_STAT_DTYPE": np.dtype(ProcStat),
        "NCCL_EXT_DTYPE": np.dtype(NcclExt),
        "OP_NAME_TABLE": np.array([OP_NAMES.get(i, f"op{i}") for i in range(256)], dtype=object),  # type: ignore[call-overload]
        "KIND_NAME_TABLE": np.array([KIND_NAMES.get(i, nccl_kind_name(i)) for i in range(256)], dtype=object),  # type: ignore[call-overload]
    }


# EVENT_DTYPE, PROC_STAT_DTYPE, OP_NAME_TABLE, KIND_NAME_TABLE are made on
# first use (PEP 562): readers of the store (explain, query, status) use the
# op names here but no numpy, whose import is ~0.09 s of each such command.
if TYPE_CHECKING:
    import numpy as np

    EVENT_DTYPE: np.dtype
    PROC_STAT_DTYPE: np.dtype
    NCCL_EXT_DTYPE: np.dtype
    OP_NAME_TABLE: np.ndarray
    KIND_NAME_TABLE: np.ndarray


def __getattr__(name: str) -> Any:
    if name in ("EVENT_DTYPE", "PROC_STAT_DTYPE", "NCCL_EXT_DTYPE", "OP_NAME_TABLE", "KIND_NAME_TABLE"):
        globals().update(_numpy_mirrors())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Every C name the parity test checks, with its Python mirror.
MIRRORS = {
    "struct ingero_event": Event,
    "struct ingero_proc_stat": ProcStat,
    "struct ingero_nccl_ext": NcclExt,
}
ENUM_MIRRORS = {
    "OP_": Op,
    "KIND_": Kind,
    "CALL_FLAG_": CallFlag,
    "CNT_": Counter,
}
