"""The one Python mirror of bpf/events.h: its structs, enums and #defines.

Every record the BPF side emits is declared here as a ctypes structure; the
numpy dtype derived from it decodes whole ring-buffer spans with one
``frombuffer`` call.  tests/unit/test_records_parity.py compiles events.h and
checks that sizes, offsets, enum values and the mirrored #defines agree, so the
two cannot drift silently.  ``enum ingero_op`` is ``Op`` in ingero/events/ops.py
(with the op table it names).
"""

from __future__ import annotations

import ctypes
import enum
from typing import TYPE_CHECKING, Any

from ingero.events.ops import OP_NAMES, Op


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


# A sched_switch row's packing (events.h): arg = runq_ns | (fd + 1) << SWITCH_RUNQ_BITS,
# ret = the system call blocked in (-1: none), stream = waker tgid << 32 | tid | SWITCH_WAKER_SEEN.
SWITCH_RUNQ_BITS = 40
SWITCH_FD_MASK = 0x7FFFFF
SWITCH_WAKER_SEEN = 1 << 63
DEFINE_MIRRORS = {"SWITCH_RUNQ_BITS": SWITCH_RUNQ_BITS, "SWITCH_FD_MASK": SWITCH_FD_MASK,
                  "SWITCH_WAKER_SEEN": SWITCH_WAKER_SEEN}


# NVTX messages: cut at NVTX_TEXT_MAX bytes, carried NVTX_TEXT_PART bytes per text record.
NVTX_TEXT_MAX = 64
NVTX_TEXT_PART = 36


class Nvtx(ctypes.Structure):
    """struct ingero_nvtx: one NVTX push, pop, start or end (op NVTX_*)."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("id", ctypes.c_uint64),
        ("pad0", ctypes.c_uint64 * 2),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("text_len", ctypes.c_uint32),
        ("pad1", ctypes.c_uint32),
        ("pad2", ctypes.c_uint32),
        ("op", ctypes.c_uint8),
        ("pad3", ctypes.c_uint8),
        ("cpu", ctypes.c_uint16),
    ]


class NvtxText(ctypes.Structure):
    """struct ingero_nvtx_text: NVTX_TEXT_PART bytes of a push's / start's message (op NVTX_TEXT)."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("text", ctypes.c_char * 24),
        ("pid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("text2", ctypes.c_char * 12),
        ("op", ctypes.c_uint8),
        ("part", ctypes.c_uint8),
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


class SwitchCount(ctypes.Structure):
    """struct ingero_switch_count: a thread's off-CPU intervals the overhead budget counted."""

    _fields_ = [
        ("n", ctypes.c_uint64 * 4),
        ("off_ns", ctypes.c_uint64 * 4),
        ("runq_ns", ctypes.c_uint64 * 4),
        ("tgid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class BudgetFlag(enum.IntFlag):
    """enum ingero_budget_flag (the budget_cfg map)."""

    COUNT_SWITCHES = 1


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
    UNSEEN_SWITCH_IN = 4
    SWITCH_COUNTS_FULL = 5
    MAX = 8


def _numpy_mirrors() -> dict[str, Any]:
    """The numpy views of the records: dtypes, and lookup tables indexed by
    the raw u8 op / kind (vectorised id -> name)."""
    import numpy as np

    return {
        "EVENT_DTYPE": np.dtype(Event),
        "PROC_STAT_DTYPE": np.dtype(ProcStat),
        "NCCL_EXT_DTYPE": np.dtype(NcclExt),
        "NVTX_DTYPE": np.dtype(Nvtx),
        "NVTX_TEXT_DTYPE": np.dtype(NvtxText),
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
    NVTX_DTYPE: np.dtype
    NVTX_TEXT_DTYPE: np.dtype
    OP_NAME_TABLE: np.ndarray
    KIND_NAME_TABLE: np.ndarray


def __getattr__(name: str) -> Any:
    if name in ("EVENT_DTYPE", "PROC_STAT_DTYPE", "NCCL_EXT_DTYPE", "NVTX_DTYPE", "NVTX_TEXT_DTYPE", "OP_NAME_TABLE",
                "KIND_NAME_TABLE"):
        globals().update(_numpy_mirrors())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Every C name the parity test checks, with its Python mirror.
MIRRORS = {
    "struct ingero_event": Event,
    "struct ingero_proc_stat": ProcStat,
    "struct ingero_nccl_ext": NcclExt,
    "struct ingero_nvtx": Nvtx,
    "struct ingero_nvtx_text": NvtxText,
    "struct ingero_switch_count": SwitchCount,
}
ENUM_MIRRORS = {
    "OP_": Op,
    "KIND_": Kind,
    "CALL_FLAG_": CallFlag,
    "CNT_": Counter,
    "BUDGET_": BudgetFlag,
}
