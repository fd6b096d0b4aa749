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
* sched_switch: ``runq_ns`` from arg's low SWITCH_RUNQ_BITS; what the thread
  blocked in: ``syscall`` (a name, syscalls.py), ``wait_fd`` (above those bits,
  for calls whose first argument is an fd), and who woke it: ``waker_pid`` /
  ``waker_tid`` (from stream; 0 is the idle task: an interrupt); ``fd_target``
  (what that fd was, read from /proc by the session) is passed in;
* NCCL calls: ``peer`` from other_pid (send/recv peer, broadcast/reduce
  root), ``kind`` '<redop>:<dtype>'; ``comm`` comes from the call's
  extension record (ranks.NcclJoin), passed in as an array.
"""

from __future__ import annotations

import functools
import sys
import time

import numpy as np
import pyarrow as pa

from ingero.collect import syscalls
from ingero.events.ops import BYTES_OPS, NCCL_TRANSFERS, Op
from ingero.events.records import (
    EVENT_DTYPE,
    KIND_NAME_TABLE,
    OP_NAME_TABLE,
    SWITCH_FD_MASK,
    SWITCH_RUNQ_BITS,
    SWITCH_WAKER_SEEN,
    CallFlag,
    Kind,
)

# NCCL's transfers: their stream is always read (a register or a stack slot;
# a few calls per step, so the read costs nothing that shows).
NCCL_STREAM_OPS = frozenset(NCCL_TRANSFERS)
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
# Ops whose other_pid carries a value (who kept the thread from its CPU; the block device).
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
_SYSCALL_DICT = pa.array(syscalls.NAMES, type=pa.string())
_RUNQ_MASK = np.int64((1 << SWITCH_RUNQ_BITS) - 1)

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
        ("syscall", pa.dictionary(pa.uint16(), pa.string())),
        ("wait_fd", pa.int32()),
        ("fd_target", pa.string()),
        ("waker_pid", pa.int32()),
        ("waker_tid", pa.int32()),
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


# storage_order's sort key, one uint64 per record, from the high bits down: the op (8
# bits), the pid's low 16 bits, a hash of the record's few-valued attributes, the record's
# index.  The words and bit positions of the fields it reads, from EVENT_DTYPE:
def _field_at(name: str) -> tuple[int, np.uint64]:
    off = EVENT_DTYPE.fields[name][1]
    return off // 8, np.uint64(off % 8 * 8)


assert sys.byteorder == "little" and EVENT_DTYPE.itemsize % 8 == 0, "storage_order reads records as u64 words"
_WORDS = EVENT_DTYPE.itemsize // 8
_W_ARG, _ = _field_at("arg")
_W_STREAM, _ = _field_at("stream")
_W_PID, _PID_SHIFT = _field_at("pid")
_W_OTHER, _OTHER_SHIFT = _field_at("other_pid")
_W_OP, _OP_SHIFT = _field_at("op")
_W_KIND, _KIND_SHIFT = _field_at("kind")
_W_TID, _TID_SHIFT = _field_at("tid")
_W_CALL, _CALL_SHIFT = _field_at("call_op")
assert (_W_OP == _W_KIND == _W_CALL and _W_TID == _W_PID and EVENT_DTYPE.fields["pid"][0].itemsize == 4
        and EVENT_DTYPE.fields["other_pid"][0].itemsize == 4)
# per op: the bits of arg and of other_pid that are stored as few-valued columns (bytes;
# other_pid / peer), 0 where they are not (a fault's address, a switch's runq_ns)
_ARG_KEY = np.where(_BYTES_MASK, ~np.uint64(0), np.uint64(0))
_OTHER_KEY = np.where(_OTHER_MASK | _PEER_MASK, np.uint64(0xFFFFFFFF) << _OTHER_SHIFT, np.uint64(0))
# per op: the bits of the word of op and kind that are keys: the kind, and for switches and
# faults the call state (in_call, queued); of the word of pid and tid: the thread (block I/O's
# is whoever submitted, not a key: analyze/summaries/__init__.py sums its requests per process)
_STATE_KEY = np.full(256, np.uint64(0xFF) << _KIND_SHIFT, dtype=np.uint64)
_STATE_KEY[[int(Op.SCHED_SWITCH), int(Op.PAGE_FAULT)]] |= np.uint64(0xFFFF) << _CALL_SHIFT
_STREAM_KEY = np.full(256, ~np.uint64(0), dtype=np.uint64)
_STREAM_KEY[int(Op.SCHED_SWITCH)] = 0  # a switch's stream is its waker: many values, no summary key
_TID_KEY = np.full(256, np.uint64(0xFFFFFFFF) << _TID_SHIFT, dtype=np.uint64)
_TID_KEY[int(Op.BLOCK_IO)] = 0
_FIB = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: its product's high bits hash the attributes
_KEY_CHUNK = 8192  # records per pass of the key: 450 KB of records stay in cache across its ~15 steps
_MAX_REVERSED_RUNS = 4096  # more runs than this (a flush of thousands of distinct copy sizes): none reversed


def storage_order(records: np.ndarray) -> np.ndarray:
    """Records grouped by op, then process, then stream / bytes / other_pid / kind / thread / call state; runs
    alternate in direction.

    Row order in the table carries no meaning (queries ORDER BY timestamp),
    but it decides how well DuckDB compresses each column (bitpacking of
    2048-value groups, frame of reference or deltas; RLE; constant): on
    bench_ingest's realistic mix, grouped by op 12.9 bytes per event instead
    of 19.3; then by process, 9.44 (pid and tid runs); then by the attributes
    that take a few values per op and process, 7.2 (docs/benchmarks.md).  The
    attributes: ``stream`` (3 streams 0 and 0x55d0a0c0.. bitpack to 31 bits a
    value when mixed, to nothing in runs), ``bytes`` of copies, ``other_pid``
    / peer and ``kind`` -- the record's ``arg`` only for ops whose arg is
    bytes (a fault's address and a switch's runq_ns take too many values) --
    and the keys of the per-second summaries (analyze/summaries/records.py):
    the thread (not block I/O's: its submitter is no key) and a switch's or
    fault's call state, so the records of one summary row come in one run or
    a few, which keeps summarising a flush at a few percent of storing it.
    (The realistic mix draws each record's thread at random, as no real loop
    does: 7.74 bytes per event with the thread in the key, 7.35 without.)
    They are hashed together into the sort key: two values with one hash
    share a run, which costs bytes, not correctness; so does a pid that
    agrees with another in its low 16 bits.

    Within a run records keep their arrival order (close to time order:
    small timestamp deltas), and every other run is reversed: each run spans
    the flush's time, so one read forwards then the next backwards meet at
    the same end instead of jumping back a second, which would widen the
    timestamp deltas of the whole 2048-value group around the jump
    (7.2 instead of 7.7 bytes per event).  Consumers of a flush's records
    (hooks, the NCCL join) may rely on the op grouping only.

    One SIMD sort of uint64 keys (op, pid, hash, index) and a gather: the
    key is built in cache-sized chunks, since each step over 56-byte records
    would otherwise read them all from memory again.
    """
    n = len(records)
    if n < 2:
        return records
    records = np.ascontiguousarray(records)
    idx_bits = (n - 1).bit_length()
    hash_bits = 40 - idx_bits  # 21 for the session's largest flush (PENDING_CAPACITY)
    if hash_bits <= 0:
        raise ValueError(f"{n:,} records is too many for one storage_order")
    words = records.view(np.uint64).reshape(n, _WORDS)
    key = np.empty(n, dtype=np.uint64)
    tmp = np.empty(min(n, _KEY_CHUNK), dtype=np.uint64)
    op = np.empty(len(tmp), dtype=np.uint8)
    to_top, hash_shift = np.uint64(56) - _OP_SHIFT, np.uint64(64 - hash_bits)
    for a in range(0, n, _KEY_CHUNK):
        w = words[a : a + _KEY_CHUNK]
        k, t, o = key[a : a + len(w)], tmp[: len(w)], op[: len(w)]
        np.right_shift(w[:, _W_OP], _OP_SHIFT, out=t)
        np.copyto(o, t, casting="unsafe")  # the op byte
        # the attributes: stream ^ bytes ^ other_pid ^ kind, hashed
        np.take(_ARG_KEY, o, out=t)
        t &= w[:, _W_ARG]
        t ^= w[:, _W_STREAM] & np.take(_STREAM_KEY, o)
        t ^= np.take(_OTHER_KEY, o) & w[:, _W_OTHER]
        t ^= w[:, _W_KIND] & np.take(_STATE_KEY, o)
        t ^= w[:, _W_TID] & np.take(_TID_KEY, o)
        t *= _FIB
        t >>= hash_shift
        t <<= np.uint64(idx_bits)
        # op in bits 56-63, the pid's low 16 bits in 40-55
        np.bitwise_and(w[:, _W_OP], np.uint64(0xFF) << _OP_SHIFT, out=k)
        k <<= to_top
        k |= t
        np.right_shift(w[:, _W_PID], _PID_SHIFT, out=t)
        t &= np.uint64(0xFFFF)
        t <<= np.uint64(40)
        k |= t
    key |= np.arange(n, dtype=np.uint64)  # unique keys: the sort keeps arrival order within a run
    key.sort()
    order = (key & np.uint64((1 << idx_bits) - 1)).astype(np.intp)
    run = key >> np.uint64(idx_bits)
    starts = (np.flatnonzero(run[1:] != run[:-1]) + 1).tolist()
    if len(starts) <= _MAX_REVERSED_RUNS:
        starts.append(n)
        for s, e in zip(starts[0::2], starts[1::2]):  # runs 1, 3, 5 ...: reversed
            order[s:e] = order[s:e][::-1]
    # gather as opaque 56-byte items: ~10x faster than indexing the structured array
    raw = records.view(np.dtype((np.void, EVENT_DTYPE.itemsize)))
    return np.take(raw, order).view(EVENT_DTYPE)


def events_table(
    records: np.ndarray,
    *,
    session_id: int,
    offset_ns: int,
    stack_ids: np.ndarray | None = None,
    stream_ops: frozenset[Op] = REGISTER_STREAM_OPS,
    comm: np.ndarray | None = None,
    fd_targets: pa.Array | None = None,
) -> pa.Table:
    """Arrow table with the events columns of schema.sql for EVENT_DTYPE ``records``.

    ``stack_ids``: stored stack ids (int64, -1 = none) that replace the kernel
    ids, from StackResolver.resolve; by default the kernel id is kept when >= 0.
    ``stream_ops``: ops whose records carry a stream, ``stream_ops(settings.launch_streams)``;
    the default matches the default program (launch streams not read).
    ``comm``: events.comm per record (uint64, 0 = NULL), from ranks.NcclJoin; None: all NULL.
    ``fd_targets``: events.fd_target per record (strings, NULL where none), from
    FdTargets.resolve over ``wait_fds(records)``; None: all NULL.
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
        _masked(arg & _RUNQ_MASK, is_switch, pa.int64()),
        _masked(stack, stack >= 0, pa.int64()),
        *_call_state_columns(op, records),
        pa.nulls(n, pa.uint64()) if comm is None else _masked(comm, comm != 0, pa.uint64()),
        _peer_column(op, records),
        *_wait_columns(is_switch, records, fd_targets),
    ]
    return pa.Table.from_arrays(cols, schema=EVENTS_SCHEMA)


# one mask per stream_ops set (a session passes the same one on every flush)
_stream_mask = functools.lru_cache(maxsize=None)(_op_mask)


def wait_fds(records: np.ndarray) -> np.ndarray:
    """Per record, the fd a sched_switch row's thread blocked on (-1: none): a call that takes an fd first."""
    fd = np.full(len(records), -1, dtype=np.int32)
    is_switch = records["op"] == int(Op.SCHED_SWITCH)
    if not is_switch.any():
        return fd
    nr = records["ret"].astype(np.int32)
    known = is_switch & (nr >= 0) & (nr < syscalls.TABLE_SIZE)
    takes = known.copy()
    takes[known] = syscalls.TAKES_FD[nr[known]]
    packed = (records["arg"] >> np.uint64(SWITCH_RUNQ_BITS)) & np.uint64(SWITCH_FD_MASK)
    takes &= packed > 0
    fd[takes] = packed[takes].astype(np.int32) - 1
    return fd


def _wait_columns(is_switch: np.ndarray, records: np.ndarray,
                  fd_targets: pa.Array | None) -> tuple[pa.Array, ...]:
    """syscall, wait_fd, fd_target, waker_pid, waker_tid: sched_switch rows only."""
    n = len(records)
    if not is_switch.any():
        return (pa.nulls(n, pa.dictionary(pa.uint16(), pa.string())), pa.nulls(n, pa.int32()),
                pa.nulls(n, pa.string()), pa.nulls(n, pa.int32()), pa.nulls(n, pa.int32()))
    nr = records["ret"].astype(np.int32)
    named = is_switch & (nr >= 0) & (nr < syscalls.TABLE_SIZE)
    syscall = pa.DictionaryArray.from_arrays(pa.array(np.where(named, nr, 0).astype(np.uint16), mask=~named),
                                             _SYSCALL_DICT)
    fd = wait_fds(records)
    waker = np.ascontiguousarray(records["stream"])
    seen = is_switch & ((waker & np.uint64(SWITCH_WAKER_SEEN)) != 0)
    waker_pid = ((waker >> np.uint64(32)) & np.uint64(0x7FFFFFFF)).astype(np.int32)
    waker_tid = (waker & np.uint64(0xFFFFFFFF)).astype(np.int32)
    return (syscall, _masked(fd, fd >= 0, pa.int32()),
            pa.nulls(n, pa.string()) if fd_targets is None else fd_targets,
            _masked(waker_pid, seen, pa.int32()), _masked(waker_tid, seen, pa.int32()))


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
