"""The per-thread tracks of the Perfetto export, encoded in bulk (numpy, protowire.py).

Every traced thread writes on its own packet sequence, which makes each
event packet small (~12 bytes for a slice begin, ~10 for an end):
- the sequence's defaults name the thread's track (no track_uuid per event)
  and a sequence-scoped incremental clock (id 64): each packet's timestamp
  is the nanoseconds since the sequence's previous packet, 2-3 bytes;
- event names and string args are interned per sequence (an iid of 1-2
  bytes), numbers that are NULL are left out, and so is a return code of 0
  (success): an absent ``ret`` reads as success.

Rows come in time windows, each sorted by (thread, start, longest first).
Slices on one track must nest: an interval crossing the end of the slice
around it (clock skew between probes) is clipped to it.  Nesting is computed
with array passes for the usual depth of two (an off-CPU interval or a fault
inside a CUDA call); a deeper or overlapping cluster falls back to a stack
walk over that thread's rows.  Markers (begin, end, instant) are then sorted
by time; at one instant, ends of older slices come first (innermost first),
then begins in start order, a zero-length slice's end right after its begin.
A slice still open at a window's end is carried into the next window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingero.export import protowire as pw

CLOCK_ID = 64  # first sequence-scoped clock id
BOOTTIME = 6  # the trace's default clock; the clock snapshot maps 64 onto it
SLICE_CUDA, SLICE_SCHED, INSTANT = 0, 1, 2
BEGIN, END, INSTANT_T = 1, 2, 3  # TrackEvent.Type
DELAYED = "delayed (see arrow)"
_MIN = np.iinfo(np.int64).min

# TracePacket / TrackEvent / DebugAnnotation / InternedData field keys
_T_PACKET = pw.tag(1, 2)  # Trace.packet
_T_TS, _T_SEQ, _T_TE = pw.tag(8, 0), pw.tag(10, 0), pw.tag(11, 2)
_T_TYPE, _T_NAME, _T_ANN = pw.tag(9, 0), pw.tag(10, 0), pw.tag(4, 2)
_T_ANN_NAME, _T_INT, _T_UINT, _T_STR_IID = pw.tag(1, 0), pw.tag(4, 0), pw.tag(3, 0), pw.tag(17, 0)
_T_FLOW, _T_TERM_FLOW = pw.tag(47, 1), pw.tag(48, 1)

# Numeric args: (arg name, column, value tag); present where the column is not NULL.
NUM_ARGS = (("bytes", "bytes", _T_INT), ("stream", "stream", _T_UINT), ("ret", "ret", _T_INT),
            ("runq_ns", "runq_ns", _T_INT), ("latency_ns", "latency_ns", _T_INT))
STR_ARGS = (("kind", "kind"), ("in_call", "in_call"))


class Interner:
    """One iid per string across the trace; which iids each sequence has been sent."""

    def __init__(self) -> None:
        self.iids: dict[str, int] = {}
        self.strings: list[str] = [""]

    def codes(self, col: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """iid per row (0 for NULL)."""
        enc = pc.dictionary_encode(col)
        if isinstance(enc, pa.ChunkedArray):
            enc = enc.combine_chunks()
        lut = np.zeros(len(enc.dictionary) + 1, dtype=np.int64)
        for i, s in enumerate(enc.dictionary.to_pylist()):
            lut[i] = self.iid(s)
        idx = enc.indices.fill_null(len(enc.dictionary)).to_numpy(zero_copy_only=False)
        return lut[idx]

    def iid(self, s: str) -> int:
        got = self.iids.get(s)
        if got is None:
            got = self.iids[s] = len(self.strings)
            self.strings.append(s)
        return got


@dataclass
class _Thread:
    seq: int
    last_ts: int  # time of the sequence's last timestamped packet (its clock's running value)
    names_sent: set[int] = field(default_factory=set)
    strings_sent: set[int] = field(default_factory=set)
    carry: dict[str, np.ndarray] | None = None  # rows with markers not written yet
    next_idx: int = 0


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


class ThreadTracks:
    """Writes the thread tracks' packets to ``f``: setup, then window after window."""

    def __init__(self, f: BinaryIO, threads: list[tuple[int, int]], uuid_of, arg_iids: dict[str, int],
                 base_ns: int, flows_out: dict, flows_in: dict, first_seq: int = 2) -> None:
        self.f = f
        self.names = Interner()
        self.strings = Interner()
        self.delayed_iid = self.names.iid(DELAYED)
        self.arg_iids = arg_iids
        self.base_ns = base_ns
        self.threads: dict[int, _Thread] = {}
        self.packets = 0
        self.events = 0
        # flow ids by event key (pid, tid or None, timestamp, op), and the timestamps to look for
        self.flows_out, self.flows_in = flows_out, flows_in
        self.flow_ts = np.array(sorted({k[2] for k in (*flows_out, *flows_in)}), dtype=np.int64)
        self.flow_lists: list[list[int]] = []
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        self.pb = pb
        trace = pb.Trace()
        for i, (_, tid) in enumerate(threads):
            seq = first_seq + i
            self.threads[tid] = _Thread(seq, base_ns)
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

    def _rows(self, t: pa.Table) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(tid per row, the columns the markers need) of one window's table."""
        n = t.num_rows
        tid = t.column("tid").to_numpy().astype(np.int64)
        ts = t.column("timestamp").to_numpy().astype(np.int64)
        dur = t.column("dur").to_numpy().astype(np.int64)
        cls = t.column("cls").to_numpy().astype(np.int8)
        rows: dict[str, np.ndarray] = {
            "ts": ts, "end": ts + np.where(cls == INSTANT, 0, dur), "cls": cls,
            "name": self.names.codes(t.column("label")),
        }
        for _, col, _ in NUM_ARGS:
            c = t.column(col)
            rows["h_" + col] = c.is_valid().to_numpy(zero_copy_only=False)
            rows["v_" + col] = c.fill_null(0).to_numpy().astype(np.int64, copy=False) if n else np.zeros(0, np.int64)
        for _, col in STR_ARGS:
            rows["s_" + col] = self.strings.codes(t.column(col))
        fout = np.full(n, -1, dtype=np.int64)
        fin = np.full(n, -1, dtype=np.int64)
        if len(self.flow_ts):
            for i in np.nonzero(np.isin(ts, self.flow_ts))[0]:
                r = t.slice(int(i), 1).to_pylist()[0]
                key = (r["pid"], None if r["no_tid"] else r["tid"], r["timestamp"], r["op"])
                if key in self.flows_out:
                    fout[i] = len(self.flow_lists)
                    self.flow_lists.append(self.flows_out[key])
                if key in self.flows_in:
                    fin[i] = len(self.flow_lists)
                    self.flow_lists.append(self.flows_in[key])
        rows.update(fout=fout, fin=fin, begun=np.zeros(n, bool), delayed=np.zeros(n, bool),
                    endc=np.zeros(n, np.int64), idx=np.zeros(n, np.int64))
        return tid, rows

    def window(self, t: pa.Table, cutoff: int | None) -> None:
        """Write the markers of a window's rows (sorted by tid, start, longest first) before ``cutoff``.

        ``cutoff`` None: the last window; everything is written."""
        tid, rows = self._rows(t)
        self.events += t.num_rows
        starts = np.nonzero(np.r_[True, tid[1:] != tid[:-1]])[0] if len(tid) else np.zeros(0, np.int64)
        bounds = list(zip(starts, np.r_[starts[1:], len(tid)]))
        segs = [(int(tid[a]), _take(rows, slice(a, b))) for a, b in bounds]
        seen = {k for k, _ in segs}
        segs += [(k, None) for k, th in self.threads.items() if th.carry is not None and k not in seen]
        parts = [self._markers(k, r, cutoff) for k, r in segs]
        parts = [p for p in parts if p is not None]
        if parts:
            self._write(parts)

    def finish(self) -> None:
        """Write what is still open (the last window was cut at its end)."""
        parts = [self._markers(k, None, None) for k, th in self.threads.items() if th.carry is not None]
        parts = [p for p in parts if p is not None]
        if parts:
            self._write(parts)

    # -- markers -------------------------------------------------------------

    def _markers(self, tid: int, new: dict[str, np.ndarray] | None, cutoff: int | None):
        th = self.threads[tid]
        if new is not None:
            m = len(new["ts"])
            new["idx"] = th.next_idx + np.arange(m)
            th.next_idx += m
        rows = new if th.carry is None else (th.carry if new is None else _concat(th.carry, new))
        th.carry = None
        if rows is None or not len(rows["ts"]):
            return None
        ts, cls, idx = rows["ts"], rows["cls"], rows["idx"]
        is_slice = cls != INSTANT
        fixed = rows["begun"]
        endc = clip(ts, np.where(fixed, rows["endc"], rows["end"]), is_slice, fixed)
        rows["endc"] = endc
        dly_t = np.maximum(ts, endc - 1)
        has_dly = is_slice & (rows["fin"] >= 0) & ~rows["delayed"]
        # markers: (time, group, order, type, row); group 0 = ends of slices begun earlier
        b = np.nonzero(~fixed)[0]  # begins and instants not written yet
        e = np.nonzero(is_slice)[0]
        d = np.nonzero(has_dly)[0]
        zero = endc[e] == ts[e]
        time = np.concatenate((ts[b], endc[e], dly_t[d]))
        grp = np.concatenate((np.ones(len(b), np.int64), np.where(zero, 1, 0), np.ones(len(d), np.int64)))
        order = np.concatenate((3 * idx[b], np.where(zero, 3 * idx[e] + 2, -idx[e]), 3 * idx[d] + 1))
        typ = np.concatenate((np.where(is_slice[b], BEGIN, INSTANT_T), np.full(len(e), END), np.full(len(d), INSTANT_T)))
        row = np.concatenate((b, e, d))
        what = np.concatenate((np.zeros(len(b), np.int8), np.ones(len(e), np.int8), np.full(len(d), 2, np.int8)))
        srt = np.lexsort((order, grp, time))
        time, typ, row, what = time[srt], typ[srt], row[srt], what[srt]
        if cutoff is not None:
            now = time < cutoff
            # rows whose end is not written stay open: carried with their begin (and delay mark) done
            open_ = is_slice & (endc >= cutoff)
            if open_.any():
                carry = _take(rows, open_)
                carry["begun"] = np.ones(int(open_.sum()), bool)
                carry["delayed"] = carry["delayed"] | (dly_t[open_] < cutoff) | (carry["fin"] < 0)
                th.carry = carry
            time, typ, row, what = time[now], typ[now], row[now], what[now]
        if not len(time):
            return None
        delta = np.diff(time, prepend=th.last_ts)
        th.last_ts = int(time[-1])
        return th, rows, time, delta, typ, row, what

    # -- encoding ------------------------------------------------------------

    def _write(self, parts: list) -> None:
        head = bytearray()
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("seq", "delta", "typ", "name", "extra_out",
                                                               "extra_in")}
        argv: dict[str, list[np.ndarray]] = {}
        for th, rows, time, delta, typ, row, what in parts:
            n = len(row)
            opens = what == 0
            name = np.where(opens, rows["name"][row], np.where(what == 2, self.delayed_iid, 0))
            head += self._interned(th, name, [np.where(opens, rows["s_" + c][row], 0) for _, c in STR_ARGS])
            cols["seq"].append(np.full(n, th.seq, np.int64))
            cols["delta"].append(delta)
            cols["typ"].append(typ)
            cols["name"].append(name)
            cols["extra_out"].append(np.where(opens, rows["fout"][row], -1))
            cols["extra_in"].append(np.where(what == 2, rows["fin"][row], -1))
            for _, c, _ in NUM_ARGS:
                has = rows["h_" + c][row] & opens
                if c == "ret":
                    has &= rows["v_ret"][row] != 0
                argv.setdefault("h_" + c, []).append(has)
                argv.setdefault("v_" + c, []).append(rows["v_" + c][row])
            for _, c in STR_ARGS:
                argv.setdefault("s_" + c, []).append(np.where(opens, rows["s_" + c][row], 0))
        a = {k: np.concatenate(v) for k, v in {**cols, **argv}.items()}
        if head:
            self.f.write(head)
        self.f.write(self._encode(a))
        self.packets += len(a["seq"])

    def _encode(self, a: dict[str, np.ndarray]) -> bytes:
        """The packets in order.  Packets with the same fields (a signature) are encoded together,
        so each group's matrix is only as wide as its own fields, then put back in their places."""
        present = [a["name"] > 0] + [a["h_" + c] for _, c, _ in NUM_ARGS] + [a["s_" + c] > 0 for _, c in STR_ARGS]
        present.append((a["extra_out"] >= 0) | (a["extra_in"] >= 0))
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
            body.append(self._flow_ids(a))
        packet = [pw.varint(a["delta"], None, _T_TS), pw.varint(a["seq"], None, _T_SEQ), *pw.nested(_T_TE, body)]
        return pw.nested(_T_PACKET, packet)

    def _flow_ids(self, a: dict[str, np.ndarray]) -> pw.Field:
        """flow_ids (from a cause) and terminating_flow_ids (into an effect): fixed64 each, few rows."""
        extras = []
        for fo, fi in zip(a["extra_out"], a["extra_in"]):
            x = b"".join(_T_FLOW + int(f).to_bytes(8, "little") for f in (self.flow_lists[fo] if fo >= 0 else ()))
            x += b"".join(_T_TERM_FLOW + int(f).to_bytes(8, "little")
                          for f in (self.flow_lists[fi] if fi >= 0 else ()))
            extras.append(x)
        mat = np.zeros((len(extras), max(len(x) for x in extras)), np.uint8)
        for i, x in enumerate(extras):
            mat[i, :len(x)] = np.frombuffer(x, np.uint8)
        return mat, np.array([len(x) for x in extras], np.int64)

    def _interned(self, th: _Thread, names: np.ndarray, strings: list[np.ndarray]) -> bytes:
        """A packet interning the names and string args this sequence has not been sent yet."""
        new_names = [int(i) for i in np.unique(names) if i and int(i) not in th.names_sent]
        new_strings = [int(i) for s in strings for i in np.unique(s) if i and int(i) not in th.strings_sent]
        new_strings = sorted(set(new_strings))
        if not new_names and not new_strings:
            return b""
        p = self.pb.TracePacket()
        p.trusted_packet_sequence_id = th.seq
        for i in new_names:
            e = p.interned_data.event_names.add()
            e.iid, e.name = i, self.names.strings[i]
            th.names_sent.add(i)
        for i in new_strings:
            e = p.interned_data.debug_annotation_string_values.add()
            e.iid, e.str = i, self.strings.strings[i].encode()
            th.strings_sent.add(i)
        self.packets += 1
        t = self.pb.Trace()
        t.packet.append(p)
        return t.SerializeToString()
