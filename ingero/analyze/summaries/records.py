"""The per-second summaries of one flush, from its kernel records: what the tracer writes.

``analyze/summaries/__init__.py`` defines a window's metrics in SQL and summarises stored rows
with it (an imported session, one recorded before schema 11).  The tracer
summarises each flush from its records instead, in numpy, before the flush's
transaction, which then stores them with the rows: 60-90 ns per event on
bench_ingest's mix, where the SQL over the stored batch cost ~300 and a fixed
~39 ms per flush (docs/benchmarks.md, "The summaries from the records").
``tests/unit/test_record_summaries.py`` holds the two to the same rows.

How.  Storage order (collect/decode.py) groups a flush by op, process, thread
and the attributes a summary row groups by, so a row's records lie in one run
or a few: the runs of records of one exact key, in the order given, are
summed first.  The runs are then sorted by a hash of their key, and a row ends
where the hash or any exact key changes: two keys whose hashes collide become
several rows, which sum like one (every column adds up; readers sum() a
second's rows, which several flushes write anyway).  A call row's histogram is
counted per (row, bucket) cell, or sorted when the cells would be many.  Any
record order gives the same rows; storage order only makes them cheap.

The late waits (a preemption inside a sync that delayed its return) pair a
sync with the off-CPU intervals it contains, which arrive in the same flush or
earlier ones: ``Summariser`` keeps a thread's preempted-in-sync intervals
until the thread's next syncs are summarised.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ingero.analyze.summaries import HIST_PER_OCTAVE, LATE_EPS_NS, SMALL_COPY_BYTES
from ingero.events import ops
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, KIND_NAME_TABLE, OP_NAME_TABLE, SWITCH_RUNQ_BITS, CallFlag, Kind
from ingero.events.units import NS

# What kind of windows row an op's records make (summaries.SUMMARY_SQL's branches).
LAUNCH, CALL, SWITCH, FAULT, MARK = range(5)
_CAT = np.full(256, CALL, dtype=np.uint8)
for _code in range(256):
    _name = OP_NAME_TABLE[_code]
    if _name in ops.LAUNCH_OPS:
        _CAT[_code] = LAUNCH
    elif _name in ops.HOST_OPS:
        _CAT[_code] = MARK
_CAT[int(Op.SCHED_SWITCH)], _CAT[int(Op.PAGE_FAULT)], _CAT[int(Op.BLOCK_IO)] = SWITCH, FAULT, CALL

# The records as u64 words (events/records.py's struct ingero_event):
# 0 ts_ns, 1 duration_ns, 2 arg, 3 stream, 4 pid | tid << 32, 5 other_pid | stack_id << 32,
# 6 ret | call_op << 16 | call_flags << 24 | op << 32 | kind << 40 | cpu << 48.
assert EVENT_DTYPE.itemsize == 56 and [EVENT_DTYPE.fields[f][1] for f in (
    "ts_ns", "duration_ns", "arg", "pid", "tid", "other_pid", "call_op", "call_flags", "op", "kind")] == [
    0, 8, 16, 32, 36, 40, 50, 51, 52, 53], "summaries/records.py reads the records as words"
_W = 7
_U = np.uint64
_OP_BITS, _KIND_BITS, _CALL_OP_BITS = _U(0xFF << 32), _U(0xFF << 40), _U(0xFF << 16)
_SEEN, _QUEUED = _U(int(CallFlag.SEEN) << 24), _U(int(CallFlag.QUEUED) << 24)
# Per op: the bits of word 6 its row groups by, and of word 4 (block I/O: per process, no thread).
_ATTR_MASK = np.zeros(256, dtype=np.uint64)
_ATTR_MASK[_CAT == LAUNCH] = _OP_BITS
_ATTR_MASK[_CAT == MARK] = _OP_BITS
_ATTR_MASK[_CAT == CALL] = _OP_BITS | _KIND_BITS
_ATTR_MASK[_CAT == FAULT] = _OP_BITS | _CALL_OP_BITS
_ATTR_MASK[_CAT == SWITCH] = _OP_BITS | _KIND_BITS | _CALL_OP_BITS | _SEEN | _QUEUED
_PT_MASK = np.full(256, ~_U(0), dtype=np.uint64)
_PT_MASK[int(Op.BLOCK_IO)] = _U(0xFFFFFFFF)
_SWITCH, _BLOCK_IO = int(Op.SCHED_SWITCH), int(Op.BLOCK_IO)
_PREEMPTION = _U(int(Op.SCHED_SWITCH) | int(Kind.PREEMPTED) << 8)  # (attributes >> 32) & 0xFFFF of one
_RUNQ_MASK = np.int64((1 << SWITCH_RUNQ_BITS) - 1)
_BYTES_OPS = np.zeros(256, dtype=bool)  # ops whose arg is the bytes column
_BYTES_OPS[[int(o) for o in ops.BYTES_OPS]] = True
_SYNC = np.array([OP_NAME_TABLE[c] in ops.SYNC_OPS for c in range(256)])
_SYNC_CODES = np.flatnonzero(_SYNC).tolist()
# the stored names, as collect/decode.py's columns (a kind without one: NULL)
_OP_DICT = pa.array([str(x) for x in OP_NAME_TABLE], type=pa.string())
_KIND_DICT = pa.array([x or "" for x in KIND_NAME_TABLE], type=pa.string())
_KIND_NULL = np.array([x is None for x in KIND_NAME_TABLE])

_DENSE_CELLS = 1 << 18  # (call row, bucket) cells counted densely at most (2 MB a count): more are sorted
_BUCKET_BITS = 11  # bucket + 1 in [0, 16 * 64 + 1): 0 for a zero duration (bucket -1)
_C1, _C2, _C3, _C4 = (_U(0x9E3779B97F4A7C15), _U(0xC2B2AE3D27D4EB4F), _U(0x165667B19E3779F9),
                      _U(0xD6E8FEB86659FD93))

WINDOWS_SCHEMA = pa.schema([
    ("session_id", pa.int32()), ("start_ns", pa.int64()), ("pid", pa.int32()), ("tid", pa.int32()),
    ("op", pa.dictionary(pa.uint8(), pa.string())), ("kind", pa.dictionary(pa.uint8(), pa.string())),
    ("in_call", pa.dictionary(pa.uint8(), pa.string())), ("queued", pa.bool_()), ("other_pid", pa.int32()),
    ("events_n", pa.int64()), ("first_ns", pa.int64()), ("last_ns", pa.int64()), ("duration_ns", pa.int64()),
    ("overflow_ns", pa.int64()), ("runq_ns", pa.int64()), ("bytes", pa.int64()), ("small_copy_n", pa.int64()),
    ("max_duration_ns", pa.int64()), ("duration_hist_bucket", pa.list_(pa.int16())),
    ("duration_hist_n", pa.list_(pa.int32())), ("duration_hist_sum_ns", pa.list_(pa.int64())),
])
LATE_SCHEMA = pa.schema([
    ("session_id", pa.int32()), ("start_ns", pa.int64()), ("pid", pa.int32()), ("tid", pa.int32()),
    ("preempted_ns", pa.int64()), ("since_call_ns", pa.int64()),
])

# Preempted-in-sync intervals kept for syncs still to come, at most (oldest dropped first): a
# thread that dies inside a sync never returns from it.
MAX_PENDING = 1 << 16


def _runs(*cols: np.ndarray) -> np.ndarray:
    """Indices where any of the (sorted) columns changes: the starts of runs, 0 first."""
    n = len(cols[0])
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for c in cols:
        change[1:] |= c[1:] != c[:-1]
    return np.flatnonzero(change)


def _lists(offsets: np.ndarray, values: np.ndarray, null: np.ndarray) -> pa.Array:
    """A list per row (row i: values[offsets[i]:offsets[i + 1]]), NULL where ``null``.  A null
    offset marks a null list (ListArray.from_arrays's mask argument costs ~80 ms on first use)."""
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32(), mask=np.append(null, False)), pa.array(values))


def _masked(values: np.ndarray, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    return pa.array(values, type=type_, mask=None if valid.all() else ~valid)


_CHUNK = 8192  # records per pass of the keys: ~450 KB of records stay in cache across its steps


def _keys(records: np.ndarray, offset_ns: int) -> tuple[np.ndarray, ...]:
    """Per record, its row's exact group keys: pid | tid, the attribute bits (op, kind, call
    state), other_pid, second; what is summed: timestamp, duration, arg; and its op byte."""
    n = len(records)
    words = np.ascontiguousarray(records).view(np.uint64).reshape(n, _W)
    pt, attr, other = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64), np.zeros(n, dtype=np.uint64)
    ts, sec, dur, arg = (np.empty(n, dtype=np.int64) for _ in range(4))
    m = min(n, _CHUNK)
    t, op = np.empty(m, dtype=np.uint64), np.empty(n, dtype=np.uint8)
    off, sh32, q = np.int64(offset_ns), _U(32), _U(1)
    for a in range(0, n, _CHUNK):
        w = words[a : a + _CHUNK]
        k = len(w)
        tk, ok = t[:k], op[a : a + k]
        w6 = w[:, 6]
        np.right_shift(w6, sh32, out=tk)
        np.copyto(ok, tk, casting="unsafe")  # the op byte
        at = attr[a : a + k]
        np.bitwise_and(w6, np.take(_ATTR_MASK, ok), out=at)
        lo, hi = int(ok.min()), int(ok.max())  # in storage order a chunk holds one op or a few
        if lo <= _SWITCH <= hi:
            # queued is NULL for a thread that has made no traced call: its QUEUED bit means nothing
            np.left_shift(at, q, out=tk)
            tk |= ~_QUEUED
            at &= tk
            # who took the CPU: a key of preemptions only (op and kind, bits 32-47 of the attributes)
            np.right_shift(at, sh32, out=tk)
            tk &= _U(0xFFFF)
            o = other[a : a + k]
            np.bitwise_and(w[:, 5], _U(0xFFFFFFFF), out=o)
            o *= tk == _PREEMPTION
        if lo <= _BLOCK_IO <= hi:
            np.bitwise_and(w[:, 4], np.take(_PT_MASK, ok), out=pt[a : a + k])
        else:
            pt[a : a + k] = w[:, 4]
        np.add(w[:, 0].view(np.int64), off, out=ts[a : a + k])
        np.floor_divide(ts[a : a + k], NS, out=sec[a : a + k])
        dur[a : a + k] = w[:, 1].view(np.int64)
        arg[a : a + k] = w[:, 2].view(np.int64)
    arg[op == int(Op.SCHED_SWITCH)] &= _RUNQ_MASK  # a switch's arg also holds its wait's fd (events.h)
    return pt, attr, other, sec, ts, dur, arg, op


def _buckets(dur: np.ndarray) -> np.ndarray:
    """Each duration's histogram bucket (summaries._BUCKET), + 1: 0 for a zero duration."""
    with np.errstate(divide="ignore"):
        b = np.floor(HIST_PER_OCTAVE * np.log2(dur.astype(np.float64)))
    b += 1
    b[dur <= 0] = 0
    return b.astype(np.uint64)


def windows(records: np.ndarray, *, session_id: int, offset_ns: int) -> pa.Table:
    """The ``windows`` rows of ``records`` (EVENT_DTYPE, any order): summaries.SUMMARY_SQL's rows."""
    if len(records) == 0:
        return WINDOWS_SCHEMA.empty_table()
    return _windows(_keys(records, offset_ns), session_id)


def _overflow(ts: np.ndarray, dur: np.ndarray, sec: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per run, the summed parts of its records past the end of their second (one second per
    run): only the few runs whose latest end is past it have any, and only theirs are summed."""
    end = ts + dur
    past = np.flatnonzero(np.maximum.reduceat(end, starts) > (sec[starts] + 1) * NS)
    if len(past) > 64:  # many (a host of sleeping threads): every record at once
        return np.add.reduceat(np.maximum(end - (sec + 1) * NS, 0), starts)
    out = np.zeros(len(starts), dtype=np.int64)
    stops = np.append(starts[1:], len(ts))
    for r in past.tolist():
        a, b = starts[r], stops[r]
        out[r] = np.maximum(end[a:b] - (sec[a] + 1) * NS, 0).sum()
    return out


def _windows(keys: tuple[np.ndarray, ...], session_id: int) -> pa.Table:
    pt, attr, other, sec, ts, dur, arg, _ = keys
    n = len(pt)
    # 1. runs of records of one row, in the order given: storage order makes them long
    starts = _runs(pt, attr, other, sec)
    seg_n = np.diff(np.append(starts, n))
    seg = {
        "dur": np.add.reduceat(dur, starts),
        "max": np.maximum.reduceat(dur, starts),
        "first": np.minimum.reduceat(ts, starts),
        "last": np.maximum.reduceat(ts, starts),
        "arg": np.add.reduceat(arg, starts),  # bytes (copies ...) or run-queue waits (switches)
        "small": np.add.reduceat(arg <= SMALL_COPY_BYTES, starts, dtype=np.int64),
        "over": _overflow(ts, dur, sec, starts),
    }
    k_pt, k_attr, k_other, k_sec = pt[starts], attr[starts], other[starts], sec[starts]
    # 2. the runs of one row brought together: sorted by a hash of the key, then index
    s = len(starts)
    idx_bits = max(1, (s - 1).bit_length())
    h = k_pt * _C1
    h ^= k_attr * _C2
    h ^= k_other * _C3
    h ^= k_sec.view(np.uint64) * _C4
    h ^= h >> _U(31)
    h *= _C1
    key = h >> _U(idx_bits) << _U(idx_bits)
    key |= np.arange(s, dtype=np.uint64)
    key.sort()
    order = (key & _U((1 << idx_bits) - 1)).astype(np.intp)
    k_pt, k_attr, k_other, k_sec = k_pt[order], k_attr[order], k_other[order], k_sec[order]
    # a row ends where the hash or any key changes (two keys of one hash: two rows, which add up)
    rows = _runs(key >> _U(idx_bits), k_pt, k_attr, k_other, k_sec)
    seg_n = seg_n[order]
    seg = {k: v[order] for k, v in seg.items()}
    nrows = len(rows)
    r_attr, r_pt = k_attr[rows], k_pt[rows]
    r_op = ((r_attr >> _U(32)) & _U(0xFF)).astype(np.uint8)
    r_cat = _CAT[r_op]
    calls, switches, faults = r_cat == CALL, r_cat == SWITCH, r_cat == FAULT
    timed = r_cat != MARK
    r_kind = ((r_attr >> _U(40)) & _U(0xFF)).astype(np.uint8)
    r_call = ((r_attr >> _U(16)) & _U(0xFF)).astype(np.uint8)
    bytes_rows = calls & _BYTES_OPS[r_op]
    arg_sum = np.add.reduceat(seg["arg"], rows)
    cols = {
        "session_id": pa.array(np.full(nrows, session_id, dtype=np.int32)),
        "start_ns": pa.array(k_sec[rows] * NS),
        "pid": pa.array((r_pt & _U(0xFFFFFFFF)).astype(np.uint32).view(np.int32)),
        "tid": _masked((r_pt >> _U(32)).astype(np.uint32).view(np.int32), r_op != int(Op.BLOCK_IO), pa.int32()),
        "op": pa.DictionaryArray.from_arrays(pa.array(r_op), _OP_DICT),
        "kind": pa.DictionaryArray.from_arrays(
            pa.array(r_kind, mask=~((calls | switches) & ~_KIND_NULL[r_kind])), _KIND_DICT),
        "in_call": pa.DictionaryArray.from_arrays(pa.array(r_call, mask=~((switches | faults) & (r_call != 0))),
                                                  _OP_DICT),
        "queued": _masked((r_attr & _QUEUED) != 0, switches & ((r_attr & _SEEN) != 0), pa.bool_()),
        "other_pid": _masked(k_other[rows].astype(np.uint32).view(np.int32),
                             switches & (r_kind == int(Kind.PREEMPTED)), pa.int32()),
        "events_n": pa.array(np.add.reduceat(seg_n, rows)),
        "first_ns": pa.array(np.minimum.reduceat(seg["first"], rows)),
        "last_ns": pa.array(np.maximum.reduceat(seg["last"], rows)),
        "duration_ns": _masked(np.add.reduceat(seg["dur"], rows), timed, pa.int64()),
        "overflow_ns": _masked(np.add.reduceat(seg["over"], rows), switches, pa.int64()),
        "runq_ns": _masked(arg_sum, switches, pa.int64()),
        "bytes": _masked(arg_sum, bytes_rows, pa.int64()),
        "small_copy_n": _masked(np.where(bytes_rows, np.add.reduceat(seg["small"], rows), 0), calls, pa.int64()),
        "max_duration_ns": _masked(np.maximum.reduceat(seg["max"], rows), timed, pa.int64()),
    }
    cols.update(_histograms(starts, order, rows, calls, dur, nrows))
    return pa.Table.from_arrays(list(cols.values()), schema=WINDOWS_SCHEMA)


def _histograms(starts: np.ndarray, order: np.ndarray, rows: np.ndarray, calls: np.ndarray, dur: np.ndarray,
                nrows: int) -> dict[str, pa.Array]:
    """The call rows' duration histograms: per row, its buckets ascending, their counts and sums."""
    # the row of each run (runs in sorted order: order[i] is the run at i), then of each record
    starts_row = np.zeros(len(order), dtype=np.int64)
    starts_row[rows] = 1
    row_of_run = np.empty(len(order), dtype=np.int64)
    row_of_run[order] = np.cumsum(starts_row) - 1
    call_runs = np.flatnonzero(calls[row_of_run])
    no_hist = ~calls
    if len(call_runs) == 0:
        offsets = np.zeros(nrows + 1, dtype=np.int32)
        return {"duration_hist_bucket": _lists(offsets, np.zeros(0, np.int16), no_hist),
                "duration_hist_n": _lists(offsets, np.zeros(0, np.int32), no_hist),
                "duration_hist_sum_ns": _lists(offsets, np.zeros(0, np.int64), no_hist)}
    ends = np.append(starts[1:], len(dur))
    lens = ends[call_runs] - starts[call_runs]
    # the call records, run by run
    rec = np.repeat(starts[call_runs] - np.cumsum(np.append(0, lens[:-1])), lens) + np.arange(lens.sum())
    row = np.repeat(row_of_run[call_runs], lens)
    d = dur[rec]
    b = _buckets(d).astype(np.int64)
    bmin = int(b.min())
    width = int(b.max()) - bmin + 1
    dense = np.cumsum(calls) - 1  # the call rows, numbered 0..
    ncall = int(calls.sum())
    if ncall * width <= _DENSE_CELLS and int(d.max()) * len(d) < 1 << 53:
        # one cell per (call row, bucket): counts and sums by bincount, in (row, bucket) order; the
        # sums in float64 are exact below 2^53 ns (every cell's is, checked above)
        cell = dense[row] * width + (b - bmin)
        n = np.bincount(cell, minlength=ncall * width)
        cells = np.flatnonzero(n)
        bucket = (cells % width + bmin - 1).astype(np.int16)
        counts = n[cells].astype(np.int32)
        sums = np.bincount(cell, weights=d, minlength=ncall * width)[cells].astype(np.int64)
        per_row = np.zeros(nrows, dtype=np.int64)
        per_row[calls] = np.bincount(cells // width, minlength=ncall)
    else:  # a wide spread of rows and buckets: a sort of (row, bucket, index) keys
        idx_bits = max(1, (len(d) - 1).bit_length())
        ckey = (row.astype(np.uint64) << _U(_BUCKET_BITS)) | b.astype(np.uint64)
        ckey <<= _U(idx_bits)
        ckey |= np.arange(len(d), dtype=np.uint64)
        ckey.sort()
        d = d[(ckey & _U((1 << idx_bits) - 1)).astype(np.intp)]
        ckey >>= _U(idx_bits)
        b0 = _runs(ckey)
        per_row = np.bincount((ckey[b0] >> _U(_BUCKET_BITS)).astype(np.int64), minlength=nrows)
        bucket = (ckey[b0] & _U((1 << _BUCKET_BITS) - 1)).astype(np.int16) - 1
        counts = np.diff(np.append(b0, len(ckey))).astype(np.int32)
        sums = np.add.reduceat(d, b0)
    offsets = np.zeros(nrows + 1, dtype=np.int32)
    np.cumsum(per_row, out=offsets[1:])
    return {"duration_hist_bucket": _lists(offsets, bucket, no_hist),
            "duration_hist_n": _lists(offsets, counts, no_hist),
            "duration_hist_sum_ns": _lists(offsets, sums, no_hist)}


def _of_ops(records: np.ndarray, op: np.ndarray, codes: list[int]) -> np.ndarray:
    """The records of ops ``codes`` (``op``: their op bytes).  In storage order (grouped by op)
    they are slices, found by bisection; in any other order, a gather of the records as opaque
    items (~10x faster than indexing the structured array)."""
    if len(op) < 2 or (op[1:] >= op[:-1]).all():
        parts = [records[slice(*np.searchsorted(op, [c, c + 1]))] for c in codes]
        parts = [p for p in parts if len(p)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else records[:0]
    raw = np.ascontiguousarray(records).view(np.dtype((np.void, EVENT_DTYPE.itemsize)))
    return np.take(raw, np.flatnonzero(np.isin(op, codes))).view(EVENT_DTYPE)


class Summariser:
    """Summaries of a trace's flushes, in order: ``windows`` rows, and the late waits, which
    need the preempted-in-sync intervals of earlier flushes (kept here, per thread)."""

    def __init__(self, session_id: int, offset_ns: int) -> None:
        self.session_id, self.offset_ns = session_id, offset_ns
        # preempted intervals inside a sync, not yet paired: pid, tid, start, end (ns)
        self._pending = np.zeros((0, 4), dtype=np.int64)

    def rows(self, records: np.ndarray) -> tuple[pa.Table, pa.Table]:
        """This flush's ``windows`` and ``window_late_waits`` rows."""
        if len(records) == 0:
            return WINDOWS_SCHEMA.empty_table(), LATE_SCHEMA.empty_table()
        keys = _keys(records, self.offset_ns)
        return _windows(keys, self.session_id), self._late_waits(records, keys[-1])

    def late_waits(self, records: np.ndarray) -> pa.Table:
        """summaries.LATE_SUMMARY_SQL's rows for this flush: each preempted interval (of this flush or
        an earlier one) inside a sync of this flush, ending within LATE_EPS_NS of its return."""
        return self._late_waits(records, np.ascontiguousarray(records["op"]))

    def _late_waits(self, records: np.ndarray, op: np.ndarray) -> pa.Table:
        sw = _of_ops(records, op, [int(Op.SCHED_SWITCH)])
        new = sw[(sw["kind"] == int(Kind.PREEMPTED)) & _SYNC[sw["call_op"]]]
        if len(new):
            a = new["ts_ns"].view(np.int64) + np.int64(self.offset_ns)
            rows = np.stack([new["pid"].astype(np.int64), new["tid"].astype(np.int64), a,
                             a + new["duration_ns"].view(np.int64)], axis=1)
            self._pending = np.concatenate([self._pending, rows])[-MAX_PENDING:]
        syncs = _of_ops(records, op, _SYNC_CODES)
        if not len(syncs) or not len(self._pending):
            return LATE_SCHEMA.empty_table()
        s_tid = syncs["tid"].astype(np.int64)
        s0 = syncs["ts_ns"].view(np.int64) + np.int64(self.offset_ns)
        s1 = s0 + syncs["duration_ns"].view(np.int64)
        p = self._pending
        keep = np.ones(len(p), dtype=bool)
        out = []
        for tid in np.unique(p[:, 1]):  # the threads with intervals waiting for their sync
            mine = s_tid == tid
            if not mine.any():
                continue
            t0, t1 = s0[mine], s1[mine]
            o = np.argsort(t0, kind="stable")
            t0, t1 = t0[o], t1[o]
            at = np.flatnonzero(p[:, 1] == tid)
            a, e = p[at, 2], p[at, 3]
            # the sync each interval lies in: the last one of the thread that started at or before it
            j = np.searchsorted(t0, a, side="right") - 1
            ok = j >= 0
            jj = np.where(ok, j, 0)
            hit = ok & (a < t1[jj]) & (t1[jj] - e <= LATE_EPS_NS)
            out.append(np.stack([a[hit] // NS * NS, p[at[hit], 0], p[at[hit], 1], e[hit] - a[hit],
                                 e[hit] - t0[jj[hit]]], axis=1))
            # the thread's calls never overlap: an interval before its last sync here has had its sync
            keep[at[a < t1.max()]] = False
        self._pending = p[keep]
        late = np.concatenate(out) if out else np.zeros((0, 5), dtype=np.int64)
        return pa.Table.from_arrays([
            pa.array(np.full(len(late), self.session_id, dtype=np.int32)), pa.array(late[:, 0]),
            pa.array(late[:, 1].astype(np.int32)), pa.array(late[:, 2].astype(np.int32)),
            pa.array(late[:, 3]), pa.array(late[:, 4])], schema=LATE_SCHEMA)
