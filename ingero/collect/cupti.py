"""The device's own timeline of a traced --cmd: CUPTI records -> ``device_activity`` rows.

ingero's CUPTI injection library (cupti_inject.c, built by cupti_inject.py)
writes, per traced process, a ring of fixed-size records in shared memory
(cupti_ring.h; ``RECORD_DTYPE`` here is its one Python mirror).  This module
reads them once a flush (``CuptiHook``, a TraceHook riding on the session)
and turns them into rows:

* times: each record is on CUPTI's clock (CLOCK_REALTIME unless a client
  asks for another); the library measures that clock against CLOCK_MONOTONIC
  (the BPF events' clock) at every buffer, the tightest of a few brackets.
  A record is mapped by interpolating the offset between the pairs around it
  (constant past the last), then put on the events' clock like an event;
* the call: a kernel, copy or memset carries the correlation id of the runtime
  (or driver) call that submitted it, and that call's own API record its
  thread and start.  The API record is matched to the tracer's row of the same
  call (same process, thread and op, the row's call enclosing CUPTI's, ASOF in
  DuckDB over the stored events), so ``call_tid``/``call_ns`` join
  ``events``; a call the tracer did not record keeps CUPTI's start.  API
  records are matched once DELAY_NS old (their call's row is stored by then:
  the session flushes every second), device records once their call is;
* what is stored: one row per kernel, memcpy, memset (and per host wait CUPTI
  recorded, kind 'sync': not device time), with the process.

The rings are untrusted input (the traced process writes them): a ring is
read only once its pid has made a traced CUDA call, and its positions,
sizes and text are bounded here.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ingero.collect.probes import CUDA_PROBES, DRIVER, RUNTIME
from ingero.traceapi import TraceHook

# --- the mirror of cupti_ring.h ---------------------------------------------------

MAGIC = 0x4954505543474E49
VERSION = 1
HEADER_BYTES = 4096
NAME_PART = 40
REC_CLOCK, REC_KERNEL, REC_MEMCPY, REC_MEMSET, REC_SYNC, REC_API, REC_NAME, REC_DROPPED = range(1, 9)
RING_READY, RING_FAILED, RING_CLOSED = 1, 2, 4

RECORD_DTYPE = np.dtype([
    ("type", np.uint8), ("kind", np.uint8), ("src", np.uint8), ("dst", np.uint8), ("device", np.uint32),
    ("start", np.uint64), ("end", np.uint64), ("bytes", np.uint64), ("name", np.uint64),
    ("stream", np.uint32), ("correlation", np.uint32), ("tid", np.uint32), ("context", np.uint32),
    ("runtime_correlation", np.uint32), ("pad", np.uint32),
])
NAME_DTYPE = np.dtype([
    ("type", np.uint8), ("part", np.uint8), ("len", np.uint8), ("last", np.uint8), ("pad", np.uint32),
    ("id", np.uint64), ("pad2", np.uint64), ("text", f"S{NAME_PART}"),
])
RING_HEADER_DTYPE = np.dtype({
    "names": ["magic", "version", "rec_size", "capacity", "pid", "flags", "cupti_version", "head", "tail",
              "dropped", "cupti_records", "buffers", "handled_ns", "note"],
    "formats": [np.uint64, np.uint32, np.uint32, np.uint64, np.uint32, np.uint32, np.uint64, np.uint64,
                np.uint64, np.uint64, np.uint64, np.uint64, np.uint64, "S512"],
    "offsets": [0, 8, 12, 16, 24, 28, 32, 64, 128, 192, 200, 208, 216, 256],
    "itemsize": HEADER_BYTES,
})
_HEAD, _TAIL = 64 // 8, 128 // 8  # u64 indexes into the header
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")
MAX_CAPACITY = 1 << 24

# --- names CUPTI gives things (cupti_activity.h enums) -----------------------------

# CUpti_ActivityMemcpyKind -> (Kineto's word in 'Memcpy HtoD (...)', device_activity.copy_kind)
MEMCPY_KINDS = {1: ("HtoD", "H2D"), 2: ("DtoH", "D2H"), 3: ("HtoA", "H2D"), 4: ("AtoH", "D2H"),
                5: ("AtoA", "D2D"), 6: ("AtoD", "D2D"), 7: ("DtoA", "D2D"), 8: ("DtoD", "D2D"),
                9: ("HtoH", "H2H"), 10: ("PtoP", "D2D")}
# CUpti_ActivityMemoryKind
MEMORY_KINDS = {1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed", 6: "Device Static",
                7: "Managed Static"}
# CUpti_ActivitySynchronizationType
SYNC_KINDS = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
DOMAIN_DRIVER, DOMAIN_RUNTIME = 1, 2

# A call's name as CUPTI gives it (cudaLaunchKernel_v7000, cudaMemcpyAsync_ptsz_v7000,
# cuMemcpyHtoD_v2) -> the events.op the tracer stores for it.
_BY_SYMBOL = {p.symbol: p.op_name for p in CUDA_PROBES if p.library in (RUNTIME, DRIVER)}
_VERSION_SUFFIX = re.compile(r"_v\d+$")
_PER_THREAD = re.compile(r"_(ptsz|ptds)$")


def op_for_call(name: str) -> str | None:
    """The events.op of a CUDA call named as CUPTI names it, or None (not a call ingero traces)."""
    if name in _BY_SYMBOL:
        return _BY_SYMBOL[name]
    base = _PER_THREAD.sub("", _VERSION_SUFFIX.sub("", name))
    for cand in (base, base + "_v2"):
        if cand in _BY_SYMBOL:
            return _BY_SYMBOL[cand]
    return None


# --- timing of the join -------------------------------------------------------------

# An API record is matched once its call ended this long ago (monotonic): by then the
# tracer's row of the call is stored (the session stores everything at least every second,
# and a ring poll is at most 50 ms late).
DELAY_NS = 3_000_000_000
# A device record whose call is not known this long after its start is stored without it
# (a kernel of a graph, a call CUPTI recorded no API record for).
DEVICE_WAIT_NS = 10_000_000_000
# Matched calls are kept this long for device records still to come (a kernel starts
# behind the launch queue: up to ~a thousand kernels after its launch).
KEEP_CALLS_NS = 30_000_000_000
# The tracer's call row encloses CUPTI's record of it (the uprobe fires at the function's
# entry, CUPTI's timestamp is taken inside); this much slack for the clock mapping
# (its brackets are ~0.1 µs).
MATCH_SLACK_NS = 1_000

# The latest traced call of the thread that began before CUPTI's record of it, if it is the same op
# and encloses the record.  (Ops as their place in $ops: comparing strings in the join cost 40%.)
MATCH_SQL = """
SELECT a.i, e.timestamp
FROM _ing_cupti_api a ASOF JOIN (
    SELECT pid, tid, list_position($ops, op)::SMALLINT AS op_i, timestamp, duration_ns FROM events
    WHERE session_id = $sid AND timestamp >= $lo AND timestamp <= $hi AND list_contains($ops, op)
) e ON a.pid = e.pid AND a.tid = e.tid AND a.probe_ns >= e.timestamp
WHERE e.op_i = a.op_i AND e.timestamp + e.duration_ns + $slack >= a.end_ns
"""

DEVICE_SCHEMA = pa.schema([
    ("session_id", pa.int32()), ("pid", pa.int32()), ("device", pa.int32()), ("stream", pa.int64()),
    ("kind", pa.string()), ("copy_kind", pa.string()), ("bytes", pa.int64()), ("start_ns", pa.int64()),
    ("end_ns", pa.int64()), ("name", pa.string()), ("correlation", pa.int64()), ("call_tid", pa.int32()),
    ("call_ns", pa.int64()),
])

_API_FIELDS = [("pid", np.int64), ("tid", np.int64), ("corr", np.int64), ("domain", np.int8), ("op", np.int16),
               ("start", np.int64), ("end", np.int64)]
_DEV_FIELDS = [("pid", np.int64), ("type", np.uint8), ("kind", np.uint8), ("src", np.uint8), ("dst", np.uint8),
               ("device", np.int64), ("stream", np.int64), ("bytes", np.int64), ("name", np.int64),
               ("corr", np.int64), ("rcorr", np.int64), ("start", np.int64), ("end", np.int64)]
API_DTYPE = np.dtype(_API_FIELDS)
DEV_DTYPE = np.dtype(_DEV_FIELDS)


# --- the rings ---------------------------------------------------------------------

class RingError(Exception):
    """A ring file that is not one (wrong magic, size, pid): never read."""


class Ring:
    """One process' ring, mapped shared: records are copied out, then ``tail`` is stored."""

    def __init__(self, path: Path, pid: int):
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            # (the tracer writes `tail` into it: only a file of its own, never a link to another's)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise RingError(f"{path}: not a regular file of its own")
            if st.st_size < HEADER_BYTES + RECORD_DTYPE.itemsize * 1024:
                raise RingError(f"{path}: too small")
            self._mm = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        hdr = np.frombuffer(self._mm[:HEADER_BYTES], RING_HEADER_DTYPE, count=1)[0]  # (a copy)
        cap = int(hdr["capacity"])
        if (int(hdr["magic"]) != MAGIC or int(hdr["version"]) != VERSION
                or int(hdr["rec_size"]) != RECORD_DTYPE.itemsize or int(hdr["pid"]) != pid
                or cap < 1024 or cap > MAX_CAPACITY or cap & (cap - 1)
                or HEADER_BYTES + cap * RECORD_DTYPE.itemsize > st.st_size):
            self._mm.close()
            raise RingError(f"{path}: not an ingero CUPTI ring of pid {pid}")
        self.path, self.pid, self.capacity = path, pid, cap
        self._u64 = np.frombuffer(self._mm, np.uint64, count=HEADER_BYTES // 8)
        self._hdr = np.frombuffer(self._mm, RING_HEADER_DTYPE, count=1)
        self._recs = np.frombuffer(self._mm, RECORD_DTYPE, count=cap, offset=HEADER_BYTES)
        self.tail = int(self._u64[_TAIL])
        self.corrupt = 0  # reads whose head was out of range (the ring was reset)

    def read(self) -> np.ndarray:
        """Every record written since the last read (a copy)."""
        head = int(self._u64[_HEAD])
        n = head - self.tail
        if n <= 0:
            if n < 0:
                self.corrupt += 1
                self.tail = head
                self._u64[_TAIL] = head
            return np.empty(0, RECORD_DTYPE)
        if n > self.capacity:  # the writer never overruns the tail: a broken ring
            self.corrupt += 1
            self.tail = head
            self._u64[_TAIL] = head
            return np.empty(0, RECORD_DTYPE)
        start = self.tail % self.capacity
        first = min(n, self.capacity - start)
        out = np.empty(n, RECORD_DTYPE)
        out[:first] = self._recs[start:start + first]
        out[first:] = self._recs[:n - first]
        self.tail = head
        self._u64[_TAIL] = head  # one aligned 8-byte store: the writer sees the room
        return out

    def header(self) -> dict[str, Any]:
        h = self._hdr[0]
        # (the note is the process' to write: printable ASCII only reaches a terminal)
        note = _UNPRINTABLE.sub("?", bytes(h["note"]).split(b"\0", 1)[0].decode("ascii", "replace"))
        return {"flags": int(h["flags"]), "note": note,
                "dropped": int(h["dropped"]), "cupti_records": int(h["cupti_records"]),
                "buffers": int(h["buffers"]), "handled_ns": int(h["handled_ns"]),
                "cupti_version": int(h["cupti_version"])}

    def close(self) -> None:
        del self._u64, self._hdr, self._recs
        self._mm.close()


class Rings:
    """The ring directory: rings opened as their processes show up as traced CUDA callers."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.rings: dict[int, Ring] = {}
        self.refused: set[str] = set()

    def scan(self, allowed: set[int] | None) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            m = re.fullmatch(r"(\d{1,10})\.ring", name)
            if m is None or name in self.refused:
                continue
            pid = int(m.group(1))
            if pid in self.rings or (allowed is not None and pid not in allowed):
                continue
            try:
                self.rings[pid] = Ring(self.directory / name, pid)
            except (OSError, ValueError, RingError):
                self.refused.add(name)

    def read(self) -> list[tuple[int, np.ndarray]]:
        return [(pid, ring.read()) for pid, ring in self.rings.items()]

    def close(self) -> None:
        for ring in self.rings.values():
            ring.close()
        self.rings.clear()


# --- records -> rows -------------------------------------------------------------------

@dataclass
class _Process:
    """What one process' ring said so far."""

    pairs_cupti: list[int] = field(default_factory=list)
    pairs_mono: list[int] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # name id -> text
    parts: dict[int, dict[int, bytes]] = field(default_factory=dict)  # name id -> {part: bytes} until the last
    api_ops: dict[int, int] = field(default_factory=dict)  # api id -> index into DeviceJoin.ops (-1: not traced)
    cupti_dropped: int = 0

    def to_mono(self, t: np.ndarray) -> np.ndarray:
        """CUPTI times -> CLOCK_MONOTONIC ns: the offset interpolated between the pairs (int64 throughout:
        float64 holds ns since 1970 only to 256 ns)."""
        t = t.astype(np.int64)
        if not self.pairs_cupti:
            return np.zeros_like(t)
        c = np.asarray(self.pairs_cupti, np.int64)
        off = np.asarray(self.pairs_mono, np.int64) - c
        base, off0 = int(c[0]), int(off[0])
        if len(c) == 1:
            return t + off0
        order = np.argsort(c, kind="stable")
        c, off = c[order], off[order]
        rel = np.interp((t - base).astype(np.float64), (c - base).astype(np.float64), (off - off0).astype(np.float64))
        return t + off0 + np.rint(rel).astype(np.int64)


@dataclass(frozen=True)
class _Calls:
    """Calls matched in one take, by key (pid << 32 | correlation id, sorted)."""

    keys: np.ndarray
    tids: np.ndarray
    call_ns: np.ndarray  # events.timestamp of the tracer's row, else CUPTI's start on that clock
    traced: np.ndarray  # the tracer stored the call's row
    newest_end: int  # CLOCK_MONOTONIC end of the latest call in it (kept KEEP_CALLS_NS past it)


class DeviceJoin:
    """Across flushes: the processes' clocks and names, the calls and device records not yet stored."""

    def __init__(self, session_id: int, offset_ns: int):
        self.session_id = session_id
        self.offset_ns = offset_ns  # CLOCK_MONOTONIC + offset = events.timestamp's clock
        self.procs: dict[int, _Process] = {}
        self.ops: list[str] = sorted(set(_BY_SYMBOL.values()))
        self._op_index = {o: i for i, o in enumerate(self.ops)}
        self._api = np.empty(0, API_DTYPE)  # calls waiting to be matched
        self._dev = np.empty(0, DEV_DTYPE)  # device records waiting for their call
        self._calls: list[_Calls] = []  # matched calls, one chunk per take
        self.rows = 0
        self.joined = 0  # rows whose call the tracer stored (call_ns joins events)
        self.kinds: dict[str, int] = {}

    # -- decoding ----------------------------------------------------------------

    def feed(self, pid: int, recs: np.ndarray) -> None:
        """One ring's new records, in the order written."""
        if not len(recs):
            return
        p = self.procs.setdefault(pid, _Process())
        t = recs["type"]
        # (columns by index arrays: fancy-indexing whole 64-byte records first cost twice as much)
        clocks = np.flatnonzero(t == REC_CLOCK)
        if len(clocks):
            p.pairs_cupti += recs["start"][clocks].astype(np.int64).tolist()
            p.pairs_mono += recs["end"][clocks].astype(np.int64).tolist()
        names = np.flatnonzero(t == REC_NAME)
        if len(names):
            self._names(p, recs[names].view(NAME_DTYPE))
        for i in np.flatnonzero(t == REC_DROPPED).tolist():
            p.cupti_dropped += int(recs["bytes"][i])
        api = np.flatnonzero(t == REC_API)
        if len(api):
            a = np.empty(len(api), API_DTYPE)
            a["pid"] = pid
            a["tid"] = recs["tid"][api]
            a["corr"] = recs["correlation"][api]
            a["domain"] = recs["kind"][api]
            ids, inverse = np.unique(recs["name"][api], return_inverse=True)
            a["op"] = np.array([p.api_ops.get(int(i), -1) for i in ids], np.int16)[inverse]
            a["start"] = p.to_mono(recs["start"][api])
            a["end"] = p.to_mono(recs["end"][api])
            self._api = np.concatenate([self._api, a]) if len(self._api) else a
        dev = np.flatnonzero((t >= REC_KERNEL) & (t <= REC_SYNC))
        if len(dev):
            d = np.empty(len(dev), DEV_DTYPE)
            d["pid"] = pid
            for f in ("type", "kind", "src", "dst", "device", "stream", "bytes", "name"):
                d[f] = recs[f][dev]
            d["corr"] = recs["correlation"][dev]
            d["rcorr"] = recs["runtime_correlation"][dev]
            d["start"] = p.to_mono(recs["start"][dev])
            d["end"] = p.to_mono(recs["end"][dev])
            self._dev = np.concatenate([self._dev, d]) if len(self._dev) else d

    def _names(self, p: _Process, names: np.ndarray) -> None:
        for r in names:
            nid, part = int(r["id"]), int(r["part"])
            text = bytes(r["text"])[: min(int(r["len"]), NAME_PART)]
            parts = p.parts.setdefault(nid, {})
            parts[part] = text
            if r["last"] or len(parts) * NAME_PART >= 1024:
                whole = b"".join(parts[k] for k in sorted(parts)).split(b"\0", 1)[0].decode("utf-8", "replace")
                del p.parts[nid]
                p.names[nid] = whole
                if nid >> 32 in (DOMAIN_DRIVER, DOMAIN_RUNTIME):
                    op = op_for_call(whole)
                    p.api_ops[nid] = self._op_index[op] if op is not None else -1

    # -- joining ---------------------------------------------------------------------

    def take(self, con: Any, now_mono: int, final: bool = False) -> pa.Table | None:
        """Rows for the device records whose call is known (or given up on); everything when ``final``."""
        self._match_due(con, now_mono, final)
        dev = self._dev
        if not len(dev):
            return None
        tid, call_ns, found, traced = self._lookup(dev)
        ready = found | final | (dev["start"] <= now_mono - DEVICE_WAIT_NS)
        if not ready.any():
            return None
        self._dev = dev[~ready]
        self.joined += int(np.count_nonzero(traced[ready]))
        return self._rows(dev[ready], tid[ready], call_ns[ready], found[ready])

    def _match_due(self, con: Any, now_mono: int, final: bool) -> None:
        """Match the calls that ended DELAY_NS ago (all when ``final``) to the tracer's rows."""
        # (calls matched earlier are kept for device records still to come; this take's for this one)
        self._calls = [c for c in self._calls if c.newest_end > now_mono - KEEP_CALLS_NS]
        api = self._api
        due = np.ones(len(api), bool) if final else api["end"] <= now_mono - DELAY_NS
        if due.any():
            a, self._api = api[due], api[~due]
            call_ns = a["start"] + self.offset_ns  # a call the tracer did not record: CUPTI's start
            traced = np.zeros(len(a), bool)
            idx = np.flatnonzero(a["op"] >= 0)
            if len(idx):
                i, ts = self._match(con, a[idx])
                call_ns[idx[i]] = ts
                traced[idx[i]] = True
            # one call per id, the runtime's before the driver's (the runtime's launch runs the
            # driver's inside it: the outer call is the one the tracer stores)
            key = (a["pid"] << 32) | a["corr"]
            order = np.lexsort((-a["domain"].astype(np.int64), key))
            key = key[order]
            first = np.ones(len(order), bool)
            first[1:] = key[1:] != key[:-1]
            pick = order[first]
            self._calls.append(_Calls(key[first], a["tid"][pick], call_ns[pick], traced[pick], int(a["end"].max())))

    def _match(self, con: Any, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indexes into ``a``, events.timestamp) of the calls whose row the tracer stored."""
        off = self.offset_ns
        table = pa.table({
            "i": pa.array(np.arange(len(a)), pa.int64()), "pid": pa.array(a["pid"], pa.int32()),
            "tid": pa.array(a["tid"], pa.int32()),
            "op_i": pa.array(a["op"].astype(np.int16) + 1, pa.int16()),  # (list_position counts from 1)
            "probe_ns": pa.array(a["start"] + off + MATCH_SLACK_NS, pa.int64()),
            "end_ns": pa.array(a["end"] + off, pa.int64()),
        })
        con.register("_ing_cupti_api", table)
        try:
            # (a call's row starts before CUPTI's record of it: the window reaches back a minute)
            rows = con.execute(MATCH_SQL, {
                "sid": self.session_id, "lo": int(a["start"].min()) + off - 60_000_000_000,
                "hi": int(a["end"].max()) + off + MATCH_SLACK_NS, "ops": self.ops,
                "slack": MATCH_SLACK_NS}).fetchnumpy()
        finally:
            con.unregister("_ing_cupti_api")
        return np.asarray(rows["i"], np.int64), np.asarray(rows["timestamp"], np.int64)

    def _lookup(self, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per device record: its call's (tid, call_ns), whether the call is known, and whether
        the tracer stored its row.  A copy's id is its driver call's; runtimeCorrelationId names
        the runtime call around it, tried next."""
        n = len(dev)
        tid = np.zeros(n, np.int64)
        call_ns = np.zeros(n, np.int64)
        found = np.zeros(n, bool)
        traced = np.zeros(n, bool)
        for column in ("corr", "rcorr"):
            want = ~found & (dev[column] > 0)
            if not want.any():
                continue
            key = (dev["pid"] << 32) | dev[column]
            for c in self._calls:
                if not len(c.keys):
                    continue
                # (ids grow with time: a chunk covers a narrow range of them)
                idx = np.flatnonzero(want & ~found & (key >= c.keys[0]) & (key <= c.keys[-1]))
                if not len(idx):
                    continue
                pos = np.minimum(np.searchsorted(c.keys, key[idx]), len(c.keys) - 1)
                hit = c.keys[pos] == key[idx]
                j, at = idx[hit], pos[hit]
                tid[j], call_ns[j], traced[j], found[j] = c.tids[at], c.call_ns[at], c.traced[at], True
        return tid, call_ns, found, traced

    def _rows(self, d: np.ndarray, tid: np.ndarray, call_ns: np.ndarray, found: np.ndarray) -> pa.Table:
        n = len(d)
        off = self.offset_ns
        t = d["type"]
        # names and kinds per distinct record shape of each process: a kernel's by its name id
        # (an address, >= 0), any other's by (type, kind, src, dst) packed below 0
        shape = ((t.astype(np.int64) << 24) | (d["kind"].astype(np.int64) << 16)
                 | (d["src"].astype(np.int64) << 8) | d["dst"].astype(np.int64))
        code = np.where(t == REC_KERNEL, d["name"].astype(np.int64), -1 - shape)
        inverse = np.empty(n, np.int64)
        labels: list[tuple[str, str | None, str | None]] = []
        for pid in np.unique(d["pid"]).tolist():
            mine = d["pid"] == pid
            uniq, inv = np.unique(code[mine], return_inverse=True)
            inverse[mine] = inv + len(labels)
            labels += [self._label(pid, c) for c in uniq.tolist()]
        take = pa.array(inverse)
        kind = pa.array([lb[0] for lb in labels], pa.string()).take(take)
        copy_kind = pa.array([lb[1] for lb in labels], pa.string()).take(take)
        names = pa.array([lb[2] for lb in labels], pa.string()).take(take)
        is_copy = (t == REC_MEMCPY) | (t == REC_MEMSET)
        self.rows += n
        counts = np.bincount(inverse, minlength=len(uniq))
        for lb, c in zip(labels, counts.tolist()):
            self.kinds[lb[0]] = self.kinds.get(lb[0], 0) + c
        return pa.table({
            "session_id": pa.array(np.full(n, self.session_id), pa.int32()),
            "pid": pa.array(d["pid"], pa.int32()),
            "device": pa.array(d["device"], pa.int32()),
            "stream": pa.array(d["stream"], pa.int64()),
            "kind": kind,
            "copy_kind": copy_kind,
            "bytes": pa.array(d["bytes"], pa.int64(), mask=~is_copy),
            "start_ns": pa.array(d["start"] + off, pa.int64()),
            "end_ns": pa.array(d["end"] + off, pa.int64()),
            "name": names,
            "correlation": pa.array(d["corr"], pa.int64(), mask=d["corr"] == 0),
            "call_tid": pa.array(tid, pa.int32(), mask=~found),
            "call_ns": pa.array(call_ns, pa.int64(), mask=~found),
        }, schema=DEVICE_SCHEMA)

    def _label(self, pid: int, code: int) -> tuple[str, str | None, str | None]:
        """(kind, copy_kind, name) of one record shape of ``pid`` (_rows' code)."""
        if code >= 0:
            p = self.procs.get(pid)
            return "kernel", None, p.names.get(code) if p else None
        shape = -1 - code
        t, k, src, dst = shape >> 24, (shape >> 16) & 0xFF, (shape >> 8) & 0xFF, shape & 0xFF
        if t == REC_MEMCPY:
            word, copy_kind = MEMCPY_KINDS.get(k, ("Unknown", None))
            return ("memcpy", copy_kind,
                    f"Memcpy {word} ({MEMORY_KINDS.get(src, 'Unknown')} -> {MEMORY_KINDS.get(dst, 'Unknown')})")
        if t == REC_MEMSET:
            return "memset", None, f"Memset ({MEMORY_KINDS.get(src, 'Unknown')})"
        return "sync", None, SYNC_KINDS.get(k, "Sync")


# --- the hook the trace session runs -------------------------------------------------

def _ring_parent() -> str | None:
    """Shared memory where there is some (the rings are written at every buffer)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class CuptiHook(TraceHook):
    """Reads the command's rings at every flush and stores what they held as device_activity.

    Created by the session for --cmd (collect/session.py), which also puts
    ``command_env``'s variables in the command's environment."""

    def __init__(self, injection: Path, libcupti: Path | None, run_as: tuple[int, int] | None = None):
        self.injection = injection
        self.libcupti = libcupti
        self.dir = Path(tempfile.mkdtemp(prefix="ingero-cupti-", dir=_ring_parent()))
        if run_as is not None:  # the command creates its ring here as the invoking user
            os.chown(self.dir, *run_as)
        self.rings = Rings(self.dir)
        self.join: DeviceJoin | None = None

    def command_env(self, env: dict[str, str] | None) -> tuple[dict[str, str] | None, str]:
        """The command's environment with the injection (``env``: what it would have, None: ingero's
        own); and the start-up line."""
        from ingero.collect import cupti_inject

        out, why_not = cupti_inject.command_env(self.injection, self.dir, self.libcupti, env)
        if why_not is not None:
            return env, why_not
        where = self.libcupti if self.libcupti is not None else "the process' own"
        return out, f"CUPTI: the device's kernels, copies and memsets become device_activity (libcupti: {where})"

    def on_start(self, sess: Any) -> list[str] | None:
        self.join = DeviceJoin(sess.session_id, sess.offset_ns)
        return None

    def flush_rows(self, sess: Any, recs: np.ndarray) -> list[tuple[str, Any]]:
        return self._take(sess, final=False)

    def on_end(self, sess: Any) -> None:
        rows = self._take(sess, final=True)
        if rows:
            with sess.store.transaction():
                for name, table in rows:
                    sess.store.append(name, table)
        line = self.summary()
        if line:
            sess.notes.append(line)

    def _take(self, sess: Any, final: bool) -> list[tuple[str, Any]]:
        if self.join is None:
            return []
        self.rings.scan(sess.seen_pids)
        for pid, recs in self.rings.read():
            self.join.feed(pid, recs)
        table = self.join.take(sess.store.con, time.monotonic_ns(), final=final)
        return [("device_activity", table)] if table is not None else []

    def summary(self) -> str | None:
        """The end-of-trace line: what was stored, joined, dropped; or why there is no timeline."""
        if self.join is None or not self.rings.rings:
            return None
        j = self.join
        heads = {pid: r.header() for pid, r in self.rings.rings.items()}
        failed = [f"pid {pid}: {h['note']}" for pid, h in heads.items() if h["flags"] & RING_FAILED]
        kinds = ", ".join(f"{n:,} {k}{'s' if n != 1 else ''}" for k, n in sorted(j.kinds.items()))
        line = (f"cupti: {j.rows:,} device records stored in device_activity ({kinds or 'none'}) from "
                f"{len(heads)} process{'es' if len(heads) != 1 else ''}, {j.joined:,} joined to their calls' rows")
        dropped = sum(h["dropped"] for h in heads.values()) + sum(p.cupti_dropped for p in j.procs.values())
        if dropped:
            line += f"; {dropped:,} records dropped (ring full or CUPTI out of buffers)"
        corrupt = sum(r.corrupt for r in self.rings.rings.values())
        if corrupt:
            line += f"; {corrupt} ring read(s) out of range (skipped)"
        handled = sum(h["handled_ns"] for h in heads.values())
        records = sum(h["cupti_records"] for h in heads.values())
        if records:
            line += f"; handing CUPTI's records over cost the process {handled / records:.0f} ns CPU each"
        notes = sorted({h["note"] for h in heads.values() if h["note"] and not h["flags"] & RING_FAILED})
        if notes:
            line += "; " + "; ".join(notes)
        if failed:
            line += "; no device timeline for " + "; ".join(failed)
        return line

    def close(self) -> None:
        self.rings.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def for_command(cuda_libs: list[Path]) -> tuple[CuptiHook | None, str | None]:
    """The hook for a --cmd trace (its injection library built, or found in the cache), or
    (None, the line saying why the device timeline is inferred instead)."""
    from ingero.collect import cupti_inject
    from ingero.host import invoking_user

    built = cupti_inject.library()
    if built.path is None:
        return None, (f"CUPTI: no device timeline, it is inferred from the calls: {built.why_not} "
                      "(--no-cupti: not tried)")
    user = invoking_user()
    return CuptiHook(built.path, cupti_inject.find_libcupti(cuda_libs),
                     (user.pw_uid, user.pw_gid) if user else None), None
