"""Kernel records (EVENT_DTYPE numpy arrays) -> Arrow tables for the store.

Pure functions of their inputs: unit tests feed them hand-made records.
Column semantics follow ingero/store/schema.sql:

* ``timestamp`` = BPF CLOCK_MONOTONIC + the offset taken when the trace began;
* ``op`` / ``kind`` are names, dictionary-encoded (a few distinct values in
  millions of rows);
* ``arg`` becomes ``bytes`` for copies, allocations and block I/O, and
  ``runq_ns`` for sched_switch;
* ``stream`` only for CUDA ops that take a stream, and for kernel launches
  only when their streams were read (``stream_ops``); ``preempted`` only for
  sched_switch; ``other_pid`` only where it means something; ``stack_id``
  NULL for -1;
* ``in_call`` (the op name of the CUDA call the thread was inside,
  dictionary-encoded like ``op``) and ``queued`` only for sched_switch and
  page_fault: ``in_call`` NULL outside every call, ``queued`` NULL for a
  thread that has made no traced CUDA call (no CALL_FLAG_SEEN);
* NCCL calls: ``peer`` from other_pid (send/recv peer, broadcast/reduce
  root), ``kind`` '<redop>:<dtype>'; ``comm`` comes from the call's
  extension record (ranks.NcclJoin), passed in as an array.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pyarrow as pa

from ingero.collect.records import (
    EVENT_DTYPE,
    KIND_NAME_TABLE,
    OP_NAME_TABLE,
    CallFlag,
    Kind,
    Op,
)

# Ops whose arg is a byte count.
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
        Op.NCCL_ALL_REDUCE,
        Op.NCCL_REDUCE_SCATTER,
        Op.NCCL_ALL_GATHER,
        Op.NCCL_BROADCAST,
        Op.NCCL_REDUCE,
        Op.NCCL_SEND,
        Op.NCCL_RECV,
        Op.BLOCK_IO,
        Op.BENCH,
    }
)
# NCCL's transfers: their stream is always read (a register or a stack slot;
# a few calls per step, so the read costs nothing that shows).
NCCL_STREAM_OPS = frozenset(
    {Op.NCCL_ALL_REDUCE, Op.NCCL_REDUCE_SCATTER, Op.NCCL_ALL_GATHER, Op.NCCL_BROADCAST, Op.NCCL_REDUCE,
     Op.NCCL_SEND, Op.NCCL_RECV}
)
# Ops whose stream the probes always read: a register argument (free), or NCCL's.
REGISTER_STREAM_OPS = frozenset(
    {
        Op.CUDA_MEMCPY_ASYNC,
        Op.CUDA_STREAM_SYNC,
        Op.CUDA_GRAPH_LAUNCH,
        Op.CU_MEMCPY_ASYNC,
        Op.CU_STREAM_SYNC,
        Op.CU_GRAPH_LAUNCH,
    }
) | NCCL_STREAM_OPS
# Kernel launches (cudaLaunchKernel / cudaLaunchKernelExC, cuLaunchKernel /
# cuLaunchKernelEx): their stream is on the stack or in a config struct, read
# only when the program was compiled with LAUNCH_STREAMS (`trace --streams`);
# otherwise the record holds 0, which must not be stored as the legacy
# default stream (a real stream, also 0).
LAUNCH_STREAM_OPS = frozenset({Op.CUDA_LAUNCH_KERNEL, Op.CU_LAUNCH_KERNEL})
# Every op that can take a stream.
STREAM_OPS = REGISTER_STREAM_OPS | LAUNCH_STREAM_OPS
# Ops whose other_pid carries a value (the next process; the block device).
OTHER_PID_OPS = frozenset({Op.SCHED_SWITCH, Op.BLOCK_IO, Op.PROC_EXEC})
# Ops whose other_pid is events.peer: the peer (send / recv) or root (broadcast / reduce).
PEER_OPS = frozenset({Op.NCCL_SEND, Op.NCCL_RECV, Op.NCCL_BROADCAST, Op.NCCL_REDUCE})
# Ops without a return code.
NO_RET_OPS = frozenset({Op.SCHED_SWITCH, Op.PROC_EXEC, Op.PROC_EXIT, Op.CPU_SAMPLE})
# Ops tagged with the thread's CUDA call state (call_op, call_flags); the
# bytes are unset in every other record.
CALL_STATE_OPS = frozenset({Op.SCHED_SWITCH, Op.PAGE_FAULT, Op.CPU_SAMPLE})


def _op_mask(ops: frozenset[Op]) -> np.ndarray:
    m = np.zeros(256, dtype=bool)
    m[[int(o) for o in ops]] = True
    return m


_BYTES_MASK = _op_mask(BYTES_OPS)
_OTHER_MASK = _op_mask(OTHER_PID_OPS)
_PEER_MASK = _op_mask(PEER_OPS)
_RET_MASK = ~_op_mask(NO_RET_OPS)
_IN_CALL_TYPE = pa.dictionary(pa.uint8(), pa.string())
_CALL_OP_OFFSET = EVENT_DTYPE.fields["call_op"][1]
assert EVENT_DTYPE.fields["call_flags"][1] == _CALL_OP_OFFSET + 1, "call_op and call_flags must be adjacent"
_CALL_STATE_MASK = _op_mask(CALL_STATE_OPS)

# Dictionaries for the op / kind columns: index = raw u8 id.  Kinds without a
# name (KIND_NONE) are masked to NULL instead of being a NULL dictionary entry.
_OP_DICT = pa.array([str(x) for x in OP_NAME_TABLE], type=pa.string())
_KIND_DICT = pa.array([x if x is not None else "" for x in KIND_NAME_TABLE], type=pa.string())
_KIND_NULL = np.array([x is None for x in KIND_NAME_TABLE])

EVENTS_SCHEMA = pa.schema(
    [
        ("session_id", pa.int32()),
        ("timestamp", pa.int64()),
        ("duration_ns", pa.int64()),
        ("pid", pa.int32()),
        ("tid", pa.int32()),
        ("op", pa.dictionary(pa.uint8(), pa.string())),
        ("kind", pa.dictionary(pa.uint8(), pa.string())),
        ("bytes", pa.int64()),
        ("stream", pa.uint64()),
        ("ret", pa.int32()),
        ("cpu", pa.int16()),
        ("preempted", pa.bool_()),
        ("other_pid", pa.int32()),
        ("runq_ns", pa.int64()),
        ("stack_id", pa.int64()),
        ("in_call", pa.dictionary(pa.uint8(), pa.string())),
        ("queued", pa.bool_()),
        ("comm", pa.uint64()),
        ("peer", pa.int32()),
    ]
)


def stream_ops(launch_streams: bool) -> frozenset[Op]:
    """The ops whose ``stream`` column is stored, for a program compiled with BpfSettings.launch_streams."""
    return STREAM_OPS if launch_streams else REGISTER_STREAM_OPS


def monotonic_offset_ns(samples: int = 5) -> int:
    """wall clock - CLOCK_MONOTONIC (what bpf_ktime_get_ns reads), from the tightest of a few samples."""
    best = None
    for _ in range(samples):
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        span = m1 - m0
        if best is None or span < best[0]:
            best = (span, w - (m0 + m1) // 2)
    assert best is not None
    return best[1]


def _masked(values: np.ndarray, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    if valid.all():
        return pa.array(values, type=type_)
    return pa.array(values, type=type_, mask=~valid)


def storage_order(records: np.ndarray) -> np.ndarray:
    """Records grouped by op, then by process (stable, so time order holds within each).

    Row order in the table carries no meaning (queries ORDER BY timestamp),
    but runs of one op make DuckDB's per-column compression far better:
    12.9 instead of 19.3 bytes per event on bench_ingest's realistic mix; runs
    of one process within it make pid and tid runs too (schema 11: 9.1 against
    10.1 bytes per event with events.op an ENUM, docs/benchmarks.md).  Two
    stable sorts on small keys (the pid's low 16 bits, then the op) are radix
    sorts: cheap.  Two processes whose pids agree in the low 16 bits interleave
    in one run, which costs bytes, not correctness.
    """
    if len(records) < 2:
        return records
    by_pid = np.argsort(records["pid"].astype(np.uint16), kind="stable")
    order = by_pid[np.argsort(records["op"][by_pid], kind="stable")]
    # gather as opaque 56-byte items: ~10x faster than indexing the structured array
    raw = np.ascontiguousarray(records).view(np.dtype((np.void, EVENT_DTYPE.itemsize)))
    return np.take(raw, order).view(EVENT_DTYPE)


def events_table(
    records: np.ndarray,
    *,
    session_id: int,
    offset_ns: int,
    stack_ids: np.ndarray | None = None,
    stream_ops: frozenset[Op] = REGISTER_STREAM_OPS,
    comm: np.ndarray | None = None,
) -> pa.Table:
    """Arrow table with the events columns of schema.sql for EVENT_DTYPE ``records``.

    ``stack_ids``: stored stack ids (int64, -1 = none) that replace the kernel
    ids, from StackResolver.resolve; by default the kernel id is kept when >= 0.
    ``stream_ops``: ops whose records carry a stream, ``stream_ops(settings.launch_streams)``;
    the default matches the default program (launch streams not read).
    ``comm``: events.comm per record (uint64, 0 = NULL), from ranks.NcclJoin; None: all NULL.
    Same-width integer columns are reinterpreted (views), not copied.
    """
    if records.dtype != EVENT_DTYPE:
        raise TypeError(f"expected EVENT_DTYPE records, got {records.dtype}")
    n = len(records)
    op = np.ascontiguousarray(records["op"])
    kind = np.ascontiguousarray(records["kind"])
    arg = np.ascontiguousarray(records["arg"]).view(np.int64)
    is_switch = op == int(Op.SCHED_SWITCH)
    kind_valid = ~_KIND_NULL[kind]

    op_col = pa.DictionaryArray.from_arrays(pa.array(op, type=pa.uint8()), _OP_DICT)
    kind_col = pa.DictionaryArray.from_arrays(
        pa.array(kind, type=pa.uint8(), mask=None if kind_valid.all() else ~kind_valid), _KIND_DICT
    )
    if stack_ids is None:
        stack = np.ascontiguousarray(records["stack_id"]).astype(np.int64)
    else:
        stack = np.asarray(stack_ids, dtype=np.int64)
    ts = np.ascontiguousarray(records["ts_ns"]).view(np.int64) + np.int64(offset_ns)
    cols = [
        pa.array(np.full(n, session_id, dtype=np.int32)),
        pa.array(ts),
        pa.array(np.ascontiguousarray(records["duration_ns"]).view(np.int64)),
        pa.array(np.ascontiguousarray(records["pid"]).view(np.int32)),
        pa.array(np.ascontiguousarray(records["tid"]).view(np.int32)),
        op_col,
        kind_col,
        _masked(arg, _BYTES_MASK[op], pa.int64()),
        _masked(np.ascontiguousarray(records["stream"]), _stream_mask(stream_ops)[op], pa.uint64()),
        _masked(np.ascontiguousarray(records["ret"]), _RET_MASK[op], pa.int32()),
        pa.array(np.ascontiguousarray(records["cpu"]).view(np.int16)),
        _masked(kind == int(Kind.PREEMPTED), is_switch, pa.bool_()),
        _masked(np.ascontiguousarray(records["other_pid"]).view(np.int32), _OTHER_MASK[op], pa.int32()),
        _masked(arg, is_switch, pa.int64()),
        _masked(stack, stack >= 0, pa.int64()),
        *_call_state_columns(op, records),
        pa.nulls(n, pa.uint64()) if comm is None else _masked(comm, comm != 0, pa.uint64()),
        _peer_column(op, records),
    ]
    return pa.Table.from_arrays(cols, schema=EVENTS_SCHEMA)


# one mask per stream_ops set (a session passes the same one on every flush)
_stream_mask = functools.lru_cache(maxsize=None)(_op_mask)


def _peer_column(op: np.ndarray, records: np.ndarray) -> pa.Array:
    valid = _PEER_MASK[op]
    if not valid.any():
        return pa.nulls(len(op), pa.int32())
    return _masked(np.ascontiguousarray(records["other_pid"]).view(np.int32), valid, pa.int32())


def _call_state_columns(op: np.ndarray, records: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """in_call and queued: from call_op / call_flags of sched_switch and page_fault records, else NULL."""
    tagged = _CALL_STATE_MASK[op]
    if not tagged.any():
        return pa.nulls(len(op), _IN_CALL_TYPE), pa.nulls(len(op), pa.bool_())
    # call_op and call_flags are adjacent bytes: one strided copy for both (~2 ms per 500 k records)
    records = np.ascontiguousarray(records)  # a view of the buffer below needs one (no copy when it is)
    both = np.ndarray(len(records), dtype="<u2", buffer=records, offset=_CALL_OP_OFFSET,
                      strides=(records.strides[0],)).copy()
    call_op = both.astype(np.uint8)
    flags = (both >> 8).astype(np.uint8)
    in_call_valid = tagged & (call_op != 0)
    in_call = pa.DictionaryArray.from_arrays(pa.array(call_op, type=pa.uint8(), mask=~in_call_valid), _OP_DICT)
    queued_valid = tagged & ((flags & np.uint8(CallFlag.SEEN)) != 0)
    queued = pa.array((flags & np.uint8(CallFlag.QUEUED)) != 0, type=pa.bool_(), mask=~queued_valid)
    return in_call, queued


def op_names(records: np.ndarray) -> np.ndarray:
    """The public op name of each record (object array)."""
    return OP_NAME_TABLE[records["op"]]
