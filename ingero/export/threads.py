"""The per-thread tracks of the Perfetto export, encoded in bulk (_wire.c, else numpy).

Every traced thread writes on its own packet sequence, which makes each
event packet small (~12 bytes for a slice begin, ~10 for an end):
- the sequence's defaults name the thread's track (no track_uuid per event)
  and a sequence-scoped incremental clock (id 64): each packet's timestamp
  is the nanoseconds since the sequence's previous packet, 2-3 bytes;
- event names and string args are interned per sequence (an iid of 1-2
  bytes), numbers that are NULL are left out, and so is a return code of 0
  (success): an absent ``ret`` reads as success.

Rows come in time windows (unsorted; perfetto.py's SQL gives every string
as a code into lists known up front) and are sorted here by (thread, start,
longest first).  Slices on one track must nest: an interval crossing the end
of the slice around it (clock skew between probes) is clipped to it.
Markers (begin, end, instant) are then written in time order per thread; at
one instant, ends of older slices come first (innermost first), then begins
in start order, a zero-length slice's end right after its begin.  A slice
still open at a window's end is carried into the next window.

Two implementations give the same bytes (tests/unit/test_export_perfetto.py
compares them): ``_wire`` (C, built with the package by setup.py) walks each
thread's rows once with a stack of open slices and writes the packets in one
pass; without it, numpy clips with array passes (a stack walk only for a
cluster deeper than two), sorts the markers with lexsort and writes the
wire format with protowire.py, ~3x the CPU time.
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np
import pyarrow as pa

from ingero.export import protowire as pw

try:  # the per-event loops in C (setup.py builds it with the package); else numpy
    from ingero.export import _wire
except ImportError:  # pragma: no cover - a build without a compiler
    _wire = None

CLOCK_ID = 64  # first sequence-scoped clock id
BOOTTIME = 6  # the trace's default clock; the clock snapshot maps 64 onto it
SLICE_CUDA, SLICE_SCHED, INSTANT = 0, 1, 2  # the classes of rows
# the NUM_ARGS (bits of ``has``) each class shows: CUDA calls bytes, stream, ret; off-CPU
# intervals runq_ns; faults and block I/O bytes and latency_ns
_CLASS_ARGS = np.array([1 | 2 | 4, 8, 1 | 16], np.uint8)
BEGIN, END, INSTANT_T = 1, 2, 3  # TrackEvent.Type
DELAYED = "delayed (see arrow)"
_MIN = np.iinfo(np.int64).min
_NO_CUTOFF = np.iinfo(np.int64).max

# TracePacket / TrackEvent / DebugAnnotation / InternedData field keys
_T_PACKET = pw.tag(1, 2)  # Trace.packet
_T_TS, _T_SEQ, _T_TE = pw.tag(8, 0), pw.tag(10, 0), pw.tag(11, 2)
_T_TYPE, _T_NAME, _T_ANN = pw.tag(9, 0), pw.tag(10, 0), pw.tag(4, 2)
_T_ANN_NAME, _T_INT, _T_UINT, _T_STR_IID = pw.tag(1, 0), pw.tag(4, 0), pw.tag(3, 0), pw.tag(17, 0)
_T_FLOW, _T_TERM_FLOW = pw.tag(47, 1), pw.tag(48, 1)

# Numeric args: (arg name, column of the window's table, value tag); bit k of the table's
# ``has`` column says whether NUM_ARGS[k] is not NULL (a ret of 0 counts as NULL: success).
NUM_ARGS = (("bytes", "bytes", _T_INT), ("stream", "stream", _T_UINT), ("ret", "ret", _T_INT),
            ("runq_ns", "runq_ns", _T_INT), ("latency_ns", "dur", _T_INT))
# DebugAnnotation field number of each one's value (int_value 4, uint_value 3), for _wire.encode
_NUM_FIELDS = bytes(t[0] >> 3 for _, _, t in NUM_ARGS)
# String args: (arg name, column of codes into the strings list; 0 = none)
STR_ARGS = (("kind", "kind"), ("in_call", "in_call"))
# What a row carried into the next window (a slice open at its end) still needs: its end and
# delayed mark are left to write, not its begin (name and args)
_CARRIED = ("tidx", "ts", "end", "is_slice", "fixed", "delayed", "fin", "v_dur")
# The interned-iid sets of all sequences as one boolean matrix while it stays this small
_SENT_MATRIX_MAX = 1 << 26


def _take(rows: dict[str, np.ndarray], sel: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[sel] for k, v in rows.items()}


def _concat(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return b if a is None else {k: np.concatenate((a[k], b[k])) for k in b}


def _excl_cummax(v: np.ndarray) -> np.ndarray:
    out = np.empty_like(v)
    if len(v):
        out[0] = _MIN
        np.maximum.accumulate(v[:-1], out=out[1:])
    return out


def clip(ts: np.ndarray, end: np.ndarray, is_slice: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """End of each slice clipped to the slice around it (rows in start order); ``fixed`` rows keep ``end``.

    A top-level slice starts at or after the end of the top-level slice before it
    (a child never ends after its parent), so the top-level slices are a chain:
    each one's successor is the first slice starting at or after its end, found by
    a binary search; walking the chain costs a list lookup per top-level slice.
    Every other slice is clipped to the top-level slice before it, which is right
    while its siblings do not overlap (depth two); a cluster where they do is
    clipped again with a stack (any depth)."""
    endc = end.copy()
    si = np.nonzero(is_slice)[0]
    if not len(si):
        return endc
    t, e = ts[si], end[si]
    nxt = np.maximum(np.searchsorted(t, e, side="left"), np.arange(1, len(si) + 1)).tolist()
    top = np.zeros(len(si), bool)
    chain = []
    k, n = 0, len(si)
    while k < n:
        chain.append(k)
        k = nxt[k]
    top[chain] = True
    parent = np.maximum.accumulate(np.where(top, np.arange(n), 0))
    inner = ~top & ~fixed[si]
    ec = np.where(inner, np.minimum(e, e[parent]), e)
    endc[si] = ec
    # siblings (consecutive inner slices, one parent) must not overlap
    bad = ~top[1:] & ~top[:-1] & (t[1:] < ec[:-1])
    if bad.any():
        cluster = np.cumsum(top)
        redo = si[np.isin(cluster, cluster[1:][bad])]
        endc[redo] = _clip_stack(ts[redo], end[redo], is_slice[redo], fixed[redo])
    return endc


def _clip_stack(ts: np.ndarray, end: np.ndarray, is_slice: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """The same clipping, one row at a time with a stack of open ends (any depth)."""
    endc = end.copy()
    stack: list[int] = []
    for i in range(len(ts)):
        if not is_slice[i]:
            continue
        t = int(ts[i])
        while stack and stack[-1] <= t:
            stack.pop()
        e = int(end[i])
        if not fixed[i] and stack and e > stack[-1]:
            e = stack[-1]
        endc[i] = e
        stack.append(e)
    return endc


def _order(tidx: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Permutation sorting rows by (thread, start, longest first)."""
    if not len(ts):
        return np.zeros(0, np.int64)
    t0 = int(ts.min())
    if int(ts.max()) - t0 >= 1 << 44 or int(tidx.max()) >= 1 << 19:
        return np.lexsort((-dur, ts, tidx))
    key = (tidx << 44) | (ts - t0)  # one int64 key, a stable sort (timsort: the runs are long)
    perm = np.argsort(key, kind="stable")
    k = key[perm]
    eq = k[1:] == k[:-1]
    if eq.any():  # rows of a thread starting together (few): longest first
        pos = np.nonzero(np.r_[eq, False] | np.r_[False, eq])[0]
        run = np.cumsum(~np.r_[False, eq][pos])  # a new run where a row differs from the one before
        sub = perm[pos]
        perm[pos] = sub[np.lexsort((-dur[sub], run))]
    return perm


class _Interned:
    """Which interned iids each sequence has been sent (a boolean matrix, or sets when it would be large)."""

    def __init__(self, threads: int, iids: int) -> None:
        self.width = iids + 1
        self.matrix = np.zeros(threads * self.width, bool) if threads * self.width <= _SENT_MATRIX_MAX else None
        if self.matrix is not None:
            self.matrix[::self.width] = True  # iid 0: no name or string, never sent
        self.sets: list[set[int]] = [set() for _ in range(threads)] if self.matrix is None else []

    def new(self, tidx: np.ndarray, iid: np.ndarray) -> dict[int, list[int]]:
        """The (thread, iid) pairs (iid > 0) not sent yet, now marked sent: thread -> sorted iids."""
        key = tidx * self.width + iid
        if self.matrix is not None:
            key = np.unique(key[~self.matrix[key]])
            self.matrix[key] = True
        else:
            key = np.unique(key[iid > 0])
            key = key[[int(k) % self.width not in self.sets[int(k) // self.width] for k in key]]
            for k in key.tolist():
                self.sets[k // self.width].add(k % self.width)
        out: dict[int, list[int]] = {}
        for k in key.tolist():
            out.setdefault(k // self.width, []).append(k % self.width)
        return out


class ThreadTracks:
    """Writes the thread tracks' packets to ``f``: setup, then window after window.

    The window SQL's codes (1-based, 0 none) index ``ops`` (op), ``preempted`` ("preempted by
    <name> (<pid>)" per code of other) and ``strings`` (kind, in_call); ``threads``: (pid, tid)
    in track order; ``flows_out``/``flows_in``: flow ids by event (pid, tid or None, timestamp, op)."""

    def __init__(self, f: BinaryIO, threads: list[tuple[int, int]], uuid_of, arg_iids: dict[str, int],
                 base_ns: int, flows_out: dict, flows_in: dict, ops: list[str], preempted: list[str],
                 strings: list[str], first_seq: int = 2) -> None:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        self.pb = pb
        self.f = f
        self.arg_iids = arg_iids
        self.packets = 0
        self.events = 0
        # names and string values: one iid each across the trace: the ops (op code k -> iid k),
        # "blocked", the preempting processes, "delayed"
        self.ops = ops
        self.names = [""] + ops + ["blocked"] + preempted + [DELAYED]
        self.blocked_iid = len(ops) + 1
        self.delayed_iid = len(self.names) - 1
        self.op_class = np.array([SLICE_CUDA] + [SLICE_SCHED if o == "sched_switch" else
                                                 INSTANT if o in ("page_fault", "block_io") else SLICE_CUDA
                                                 for o in ops], np.uint8)
        self.strings = [""] + strings
        self.threads = threads
        self.seq = first_seq + np.arange(len(threads), dtype=np.int64)
        tids = np.array([t for _, t in threads], np.int64)
        self.tid_order = np.argsort(tids, kind="stable")
        self.tid_sorted = tids[self.tid_order]
        # thread index by tid: a table while tids are small (pid_max is 4 M by default), else a search
        self.tid_lut = None
        if len(tids) and 0 <= tids.min() and tids.max() < 1 << 23:
            self.tid_lut = np.zeros(int(tids.max()) + 1, np.int64)
            self.tid_lut[tids] = np.arange(len(tids))
        self.last_ts = np.full(len(threads), base_ns, np.int64)  # time of each sequence's last packet
        self.names_sent = _Interned(len(threads), len(self.names))
        self.strings_sent = _Interned(len(threads), len(self.strings))
        self.carry: dict[str, np.ndarray] | None = None
        # flow ids by event key (pid, tid, timestamp, op) (a NULL tid is the pid, as on the tracks)
        norm = lambda d: {(k[0], k[0] if k[1] is None else k[1], *k[2:]): v for k, v in d.items()}  # noqa: E731
        self.flows_out, self.flows_in = norm(flows_out), norm(flows_in)
        self.flow_ts = np.array(sorted({k[2] for k in (*self.flows_out, *self.flows_in)}), dtype=np.int64)
        self.flow_lists: list[bytes] = [b""]  # encoded flow_ids / terminating_flow_ids; 0: none
        trace = pb.Trace()
        for i, (_, tid) in enumerate(threads):
            seq = int(self.seq[i])
            p = trace.packet.add()
            p.trusted_packet_sequence_id = seq
            p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            p.trace_packet_defaults.timestamp_clock_id = CLOCK_ID
            p.trace_packet_defaults.track_event_defaults.track_uuid = uuid_of(tid)
            for name, iid in arg_iids.items():
                e = p.interned_data.debug_annotation_names.add()
                e.iid, e.name = iid, name
            # clock 64 counts from 0 at base_ns; every later timestamp on the sequence is a delta
            p = trace.packet.add()
            p.trusted_packet_sequence_id = seq
            c = p.clock_snapshot.clocks.add()
            c.clock_id, c.timestamp, c.is_incremental = CLOCK_ID, 0, True
            c = p.clock_snapshot.clocks.add()
            c.clock_id, c.timestamp = BOOTTIME, base_ns
        self.packets += len(trace.packet)
        f.write(trace.SerializeToString())

    # -- rows ----------------------------------------------------------------

    def _rows(self, t: pa.Table) -> dict[str, np.ndarray]:
        """One window's table as arrays (in the table's order); names and args by op."""
        col = lambda name: t.column(name).to_numpy()  # noqa: E731  (the SQL leaves no NULLs)
        tid = col("tid")
        tidx = self.tid_lut[tid] if self.tid_lut is not None else self.tid_order[np.searchsorted(self.tid_sorted, tid)]
        ts = col("timestamp").astype(np.int64, copy=False)
        dur = col("dur").astype(np.int64, copy=False)
        op = col("op").astype(np.int64)
        cls = self.op_class[op]
        is_slice = cls != INSTANT
        sched = cls == SLICE_SCHED
        preempted = sched & col("preempted")
        # off-CPU intervals: "preempted by <name> (<pid>)" or "blocked"; the others their op
        name = np.where(sched, np.where(preempted, self.blocked_iid + col("other"), self.blocked_iid), op)
        n = len(ts)
        rows: dict[str, np.ndarray] = {
            "tidx": tidx, "ts": ts, "is_slice": is_slice,
            # a negative duration (clock skew between probes) ends the slice where it begins:
            # a sequence's incremental clock cannot run back
            "end": np.where(is_slice, ts + np.maximum(dur, 0), ts),
            "name": name, "has": col("has") & _CLASS_ARGS[cls],
            "s_kind": np.where(preempted, 0, col("kind")).astype(np.int64),
            "s_in_call": np.where(cls == INSTANT, col("in_call"), 0).astype(np.int64),
        }
        for _, c, _ in NUM_ARGS:
            rows["v_" + c] = dur if c == "dur" else col(c).astype(np.int64, copy=False)
        fout = np.zeros(n, np.int64)
        fin = np.zeros(n, np.int64)
        if len(self.flow_ts) and n:
            at = np.minimum(np.searchsorted(self.flow_ts, ts), len(self.flow_ts) - 1)
            for i in np.nonzero(self.flow_ts[at] == ts)[0].tolist():
                pid, tid_ = self.threads[int(tidx[i])]
                key = (pid, tid_, int(ts[i]), self.ops[int(op[i]) - 1])
                if key in self.flows_out:
                    fout[i] = self._flow_bytes(_T_FLOW, self.flows_out[key])
                if key in self.flows_in:
                    fin[i] = self._flow_bytes(_T_TERM_FLOW, self.flows_in[key])
        rows.update(fout=fout, fin=fin, fixed=np.zeros(n, bool), delayed=np.zeros(n, bool))
        return rows

    def _flow_bytes(self, tag: bytes, ids: list[int]) -> int:
        self.flow_lists.append(b"".join(tag + int(f).to_bytes(8, "little") for f in ids))
        return len(self.flow_lists) - 1

    def window(self, t: pa.Table, cutoff: int | None) -> None:
        """Write the markers of a window's rows before ``cutoff`` (None: the last window, everything)."""
        new = self._rows(t)
        self.events += len(new["ts"])
        self._emit(new, cutoff)

    def finish(self) -> None:
        """Write what is still open (the last window was cut at its end)."""
        if self.carry is not None:
            self._emit(None, None)

    # -- markers -------------------------------------------------------------

    def _emit(self, new: dict[str, np.ndarray] | None, cutoff: int | None) -> None:
        """The markers of the new rows and of those carried open from the last window (after them:
        the sort puts them first in their thread, they began earlier)."""
        carry, self.carry = self.carry, None
        if carry is None:
            rows = new
        elif new is None:
            rows = carry
        else:
            rows = {k: np.concatenate((new[k], carry[k])) for k in _CARRIED}
        if rows is None or not len(rows["ts"]):
            return
        is_slice, fixed = rows["is_slice"], rows["fixed"]
        has_dly = is_slice & (rows["fin"] > 0) & ~rows["delayed"]
        cut = _NO_CUTOFF if cutoff is None else cutoff
        order = _order(rows["tidx"], rows["ts"], rows["v_dur"])
        markers = _markers_c if _wire is not None else _markers_numpy
        # a carried row's end is the clipped one, fixed
        endc, row, what, delta = markers(order, rows["tidx"], rows["ts"], rows["end"], is_slice, fixed, has_dly,
                                         cut, self.last_ts)
        if cutoff is not None:
            # rows whose end is not written stay open: carried with their begin (and delay mark) done
            open_ = is_slice & (endc >= cutoff)
            if open_.any():
                kept = {k: rows[k][open_] for k in _CARRIED}
                kept["fixed"] = np.ones(int(open_.sum()), bool)
                kept["end"] = endc[open_]
                dly_t = np.maximum(kept["ts"], kept["end"] - 1)
                kept["delayed"] = kept["delayed"] | (dly_t < cutoff) | (kept["fin"] == 0)
                self.carry = kept
        if not len(row):
            return
        if new is None:
            new = {k: np.zeros(0, np.int64) for k in ("name", "has", "fout", *(f"v_{c}" for _, c, _ in NUM_ARGS),
                                                         *(f"s_{c}" for _, c in STR_ARGS))}
            new["has"] = new["has"].astype(np.uint8)
            new["tidx"] = new["name"]
        head = self._interned(new, rows, row, what)
        body = (self._encode_c if _wire is not None else self._encode_numpy)(new, rows, row, what, delta)
        if head:
            self.f.write(head)
        self.f.write(body)
        self.packets += len(row)

    # -- encoding ------------------------------------------------------------

    def _interned(self, new: dict[str, np.ndarray], rows: dict[str, np.ndarray], row: np.ndarray,
                  what: np.ndarray) -> bytes:
        """Packets interning the names and string args each sequence is sent for the first time
        (of the new rows: a carried row's were sent when it began; and "delayed")."""
        names = self.names_sent.new(new["tidx"], new["name"])
        dly = row[what == 2]
        if len(dly):
            for k, v in self.names_sent.new(rows["tidx"][dly], np.full(len(dly), self.delayed_iid)).items():
                names[k] = sorted({*names.get(k, ()), *v})
        strings: dict[int, list[int]] = {}
        for _, c in STR_ARGS:
            for k, v in self.strings_sent.new(new["tidx"], new["s_" + c]).items():
                strings[k] = sorted({*strings.get(k, ()), *v})
        if not names and not strings:
            return b""
        t = self.pb.Trace()
        for k in sorted({*names, *strings}):
            p = t.packet.add()
            p.trusted_packet_sequence_id = int(self.seq[k])
            for i in names.get(k, ()):
                e = p.interned_data.event_names.add()
                e.iid, e.name = i, self.names[i]
            for i in strings.get(k, ()):
                e = p.interned_data.debug_annotation_string_values.add()
                e.iid, e.str = i, self.strings[i].encode()
        self.packets += len(t.packet)
        return t.SerializeToString()

    def _encode_c(self, new: dict[str, np.ndarray], rows: dict[str, np.ndarray], row: np.ndarray,
                  what: np.ndarray, delta: np.ndarray) -> bytes:
        m = len(new["name"])
        val = np.empty((len(NUM_ARGS), m), np.int64)
        for k, (_, c, _) in enumerate(NUM_ARGS):
            val[k] = new["v_" + c]
        sval = np.empty((len(STR_ARGS), m), np.int64)
        for k, (_, c) in enumerate(STR_ARGS):
            sval[k] = new["s_" + c]
        iids = bytes(self.arg_iids[x] for x, _, _ in NUM_ARGS) + bytes(self.arg_iids[x] for x, _ in STR_ARGS)
        xoff = np.zeros(len(self.flow_lists) + 1, np.int64)
        np.cumsum([len(x) for x in self.flow_lists], out=xoff[1:])
        return _wire.encode(row, what, delta, self.seq[rows["tidx"]], rows["is_slice"].view(np.uint8),
                            new["name"], new["has"], val, sval, iids, _NUM_FIELDS, self.delayed_iid,
                            new["fout"], rows["fin"], xoff, b"".join(self.flow_lists))

    def _encode_numpy(self, new: dict[str, np.ndarray], rows: dict[str, np.ndarray], row: np.ndarray,
                      what: np.ndarray, delta: np.ndarray) -> bytes:
        """The same bytes as _wire.encode.  Packets with the same fields (a signature) are encoded
        together, so each group's matrix is only as wide as its own fields, then put back in order."""
        n, m = len(rows["ts"]), len(new["name"])  # new rows first, then carried (no begin: no name, args)
        rows = {**rows, **{k: np.concatenate((v, np.zeros(n - m, v.dtype))) for k, v in new.items()
                           if k not in _CARRIED}}
        opens, dly = what == 0, what == 2
        a = {"seq": self.seq[rows["tidx"][row]], "delta": delta,
             "typ": np.where(opens, np.where(rows["is_slice"][row], BEGIN, INSTANT_T), np.where(dly, INSTANT_T, END)),
             "name": np.where(opens, rows["name"][row], np.where(dly, self.delayed_iid, 0)),
             "extra_out": np.where(opens, rows["fout"][row], 0), "extra_in": np.where(dly, rows["fin"][row], 0)}
        has = rows["has"][row]
        for k, (_, c, _) in enumerate(NUM_ARGS):
            a["h_" + c] = opens & (has >> k & 1).astype(bool)
            a["v_" + c] = rows["v_" + c][row]
        for _, c in STR_ARGS:
            a["s_" + c] = np.where(opens, rows["s_" + c][row], 0)
        present = [a["name"] > 0] + [a["h_" + c] for _, c, _ in NUM_ARGS] + [a["s_" + c] > 0 for _, c in STR_ARGS]
        present.append((a["extra_out"] > 0) | (a["extra_in"] > 0))
        sig = np.zeros(len(a["seq"]), np.int64)
        for bit, p in enumerate(present):
            sig |= p.astype(np.int64) << bit
        kinds = np.nonzero(np.bincount(sig))[0]  # a few signatures: no sort
        if len(kinds) == 1:
            return pw.join(self._packets(a, int(kinds[0])))
        encoded = []
        sizes = np.zeros(len(sig), np.int64)
        for k in kinds:
            sel = np.nonzero(sig == k)[0]
            fields = self._packets({c: v[sel] for c, v in a.items() if self._needs(c, int(k))}, int(k))
            sizes[sel] = pw.size(fields)
            encoded.append((sel, np.frombuffer(pw.join(fields), np.uint8)))
        offsets = np.cumsum(sizes) - sizes
        out = np.empty(int(sizes.sum()), np.uint8)
        for sel, data in encoded:
            own = np.cumsum(sizes[sel]) - sizes[sel]  # where each packet starts in the group's bytes
            out[np.arange(len(data)) + np.repeat(offsets[sel] - own, sizes[sel])] = data
        return out.tobytes()

    @staticmethod
    def _needs(col: str, sig: int) -> bool:
        """Whether packets of signature ``sig`` read column ``col`` (copy only those per group)."""
        if col in ("seq", "delta", "typ", "name"):
            return True
        if col in ("extra_out", "extra_in"):
            return bool(sig >> (1 + len(NUM_ARGS) + len(STR_ARGS)) & 1)
        names = [c for _, c, _ in NUM_ARGS] + [c for _, c in STR_ARGS]
        return col[2:] in names and bool(sig >> (1 + names.index(col[2:])) & 1)

    def _packets(self, a: dict[str, np.ndarray], sig: int) -> list[pw.Field]:
        """The fields of packets that all have the fields of ``sig`` (bit 0 name, then the args, last flows)."""
        n = len(a["seq"])
        body: list[pw.Field] = [pw.varint(a["typ"], None, _T_TYPE)]
        if sig & 1:
            body.append(pw.varint(a["name"], None, _T_NAME))
        bit = 1
        for arg, c, vtag in NUM_ARGS:
            if sig >> bit & 1:
                body += pw.nested(_T_ANN, [pw.const(_T_ANN_NAME + bytes([self.arg_iids[arg]]), n),
                                           pw.varint(a["v_" + c], None, vtag)])
            bit += 1
        for arg, c in STR_ARGS:
            if sig >> bit & 1:
                body += pw.nested(_T_ANN, [pw.const(_T_ANN_NAME + bytes([self.arg_iids[arg]]), n),
                                           pw.varint(a["s_" + c], None, _T_STR_IID)])
            bit += 1
        if sig >> bit & 1:
            extras = [self.flow_lists[int(o or i)] for o, i in zip(a["extra_out"], a["extra_in"])]
            mat = np.zeros((n, max(len(x) for x in extras)), np.uint8)
            for i, x in enumerate(extras):
                mat[i, :len(x)] = np.frombuffer(x, np.uint8)
            body.append((mat, np.array([len(x) for x in extras], np.int64)))
        packet = [pw.varint(a["delta"], None, _T_TS), pw.varint(a["seq"], None, _T_SEQ), *pw.nested(_T_TE, body)]
        return pw.nested(_T_PACKET, packet)


def _markers_c(order, tidx, ts, end, is_slice, fixed, has_dly, cutoff, last_ts):
    """(clipped end per row, then per marker: row, what (0 begin/instant, 1 end, 2 delayed), time delta)."""
    n = len(ts)
    cap = 2 * n + int(has_dly.sum())
    endc = np.empty(n, np.int64)
    row, what, delta = np.empty(cap, np.int64), np.empty(cap, np.uint8), np.empty(cap, np.int64)
    k = _wire.markers(np.ascontiguousarray(order, np.int64), np.ascontiguousarray(tidx, np.int64),
                      np.ascontiguousarray(ts, np.int64), np.ascontiguousarray(end, np.int64),
                      is_slice.view(np.uint8), fixed.view(np.uint8), has_dly.view(np.uint8), int(cutoff),
                      last_ts, endc, row, what, delta)
    return endc, row[:k], what[:k], delta[:k]


def _markers_numpy(order, tidx, ts, end, is_slice, fixed, has_dly, cutoff, last_ts):
    """The same as _markers_c, thread after thread: clip, then lexsort of (time, group, order)."""
    tidx, ts, end, is_slice, fixed, has_dly = (x[order] for x in (tidx, ts, end, is_slice, fixed, has_dly))
    endc = np.empty(len(ts), np.int64)
    out = []
    starts = np.nonzero(np.r_[True, tidx[1:] != tidx[:-1]])[0]
    for a, z in zip(starts.tolist(), np.r_[starts[1:], len(ts)].tolist()):
        s = slice(a, z)
        t, sl, fx = ts[s], is_slice[s], fixed[s]
        ec = clip(t, end[s], sl, fx)
        ec = np.where(sl, ec, t)
        endc[s] = ec
        idx = np.arange(z - a)
        dly_t = np.maximum(t, ec - 1)
        # markers: (time, group, order, row, what); group 0 = ends of slices begun earlier
        b = np.nonzero(~fx)[0]  # begins and instants not written yet
        e = np.nonzero(sl)[0]
        d = np.nonzero(has_dly[s])[0]
        zero = ec[e] == t[e]
        time = np.concatenate((t[b], ec[e], dly_t[d]))
        grp = np.concatenate((np.ones(len(b), np.int64), np.where(zero, 1, 0), np.ones(len(d), np.int64)))
        seq = np.concatenate((3 * idx[b], np.where(zero, 3 * idx[e] + 2, -idx[e]), 3 * idx[d] + 1))
        row = order[np.concatenate((b, e, d)) + a]
        what = np.concatenate((np.zeros(len(b), np.uint8), np.ones(len(e), np.uint8), np.full(len(d), 2, np.uint8)))
        srt = np.lexsort((seq, grp, time))
        time, row, what = time[srt], row[srt], what[srt]
        now = time < cutoff
        time, row, what = time[now], row[now], what[now]
        if len(time):
            k = int(tidx[a])
            out.append((row, what, np.diff(time, prepend=last_ts[k])))
            last_ts[k] = time[-1]
    endc_rows = np.empty(len(ts), np.int64)
    endc_rows[order] = endc
    if not out:
        return endc_rows, np.zeros(0, np.int64), np.zeros(0, np.uint8), np.zeros(0, np.int64)
    return (endc_rows, *(np.concatenate(x) for x in zip(*out)))
