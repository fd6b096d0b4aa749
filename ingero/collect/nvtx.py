"""NVTX records -> ``spans`` rows (category 'nvtx'): pushes paired with pops, starts with ends.

bpf/nvtx.bpf.c emits one record per push, pop, start or end the traced
process makes through ingero's injection library, a push's or start's
message first in text records (bpf/events.h).  ``NvtxSpans.take`` takes
them out of each flush's batch (they are never rows of ``events``) and keeps
what is open across flushes:

* push / pop: a stack per (pid, tid, domain), as NVTX defines them; a pop
  with nothing open on its stack (its push was before the trace, or lost to a
  full ring) is counted in ``unmatched`` and dropped;
* start / end: by (pid, range id); the span belongs to the starting thread
  (the end may come from another one); an end without its start likewise.

A range never closed ends where its process did: at the process's exit
(its proc_exit record, also after a crash or a kill), or, for a process still
running when the trace stopped (Ctrl-C, SIGTERM, --duration), at the trace's
end (``finish``).  Pairing here rather than in BPF keeps the probes
stateless, and every open range is in this process's memory when the trace
stops, so none is lost.

A thread's records reach the ring in program order and a flush takes a
prefix of the ring, so per thread the batch order is time order; a batch is
sorted by timestamp (storage_order regroups it) before it is walked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ingero.events.ops import NVTX_OPS, Op
from ingero.events.records import NVTX_DTYPE, NVTX_TEXT_DTYPE

CATEGORY = "nvtx"
SPANS_SCHEMA = pa.schema([
    ("session_id", pa.int32()), ("pid", pa.int32()), ("tid", pa.int32()), ("start_ns", pa.int64()),
    ("end_ns", pa.int64()), ("name", pa.string()), ("category", pa.string()),
])
_NVTX_MASK = np.zeros(256, dtype=bool)
_NVTX_MASK[[int(o) for o in NVTX_OPS]] = True
_KEEP_TAKES = 3


class NvtxSpans:
    """Across flushes: the open ranges and the text waiting for its range record."""

    def __init__(self, session_id: int, offset_ns: int):
        self.session_id = session_id
        self.offset_ns = offset_ns  # BPF CLOCK_MONOTONIC + offset = events.timestamp's clock
        self._stacks: dict[tuple[int, int, int], list[tuple[int, str]]] = {}  # (pid, tid, domain) -> [(ts, name)]
        self._started: dict[tuple[int, int], tuple[int, int, str]] = {}  # (pid, range id) -> (tid, ts, name)
        self._text: dict[tuple[int, int], tuple[int, dict[int, bytes]]] = {}  # (tid, ts) -> (take, {part: bytes})
        self._takes = 0
        self.spans = 0  # rows made so far
        self.unmatched = 0  # pops / ends without their push / start
        self.ended_at_exit = 0  # ranges closed by their process's exit
        self.ended_at_stop = 0  # ranges closed by the trace's end

    def take(self, recs: np.ndarray) -> tuple[np.ndarray, pa.Table | None]:
        """(the records without NVTX ones, spans rows closed by this batch or None)."""
        op = recs["op"]
        nvtx = _NVTX_MASK[op]
        exits = op == int(Op.PROC_EXIT)
        if not nvtx.any() and not (exits.any() and self._has_open()):
            return recs, None
        self._takes += 1
        mine = recs[nvtx | exits]
        # time order, a range record after its text (same ts_ns; storage_order put the text last)
        mine = mine[np.lexsort((mine["op"] != int(Op.NVTX_TEXT), mine["ts_ns"]))]
        rows = self._walk(mine)
        # text whose range record never came (lost to a full ring): it comes in the same
        # batch as its text or the next one, never later
        for k in [k for k, (n, _) in self._text.items() if self._takes - n >= _KEEP_TAKES]:
            del self._text[k]
        return recs[~nvtx], self._table(rows)

    def finish(self, end_mono_ns: int) -> pa.Table | None:
        """Rows for every range still open when the trace stopped: they end at ``end_mono_ns`` (BPF clock)."""
        rows = []
        for (pid, tid, _), stack in self._stacks.items():
            rows += [(pid, tid, ts, end_mono_ns, name) for ts, name in stack]
        rows += [(pid, tid, ts, end_mono_ns, name) for (pid, _), (tid, ts, name) in self._started.items()]
        self._stacks.clear()
        self._started.clear()
        self._text.clear()
        self.ended_at_stop += len(rows)
        return self._table(rows)

    # -- inside ----------------------------------------------------------------

    def _has_open(self) -> bool:
        return bool(self._started) or any(self._stacks.values())

    def _walk(self, recs: np.ndarray) -> list[tuple[int, int, int, int, str]]:
        raw = np.ascontiguousarray(recs)
        r = raw.view(NVTX_DTYPE)
        t = raw.view(NVTX_TEXT_DTYPE)
        rows: list[tuple[int, int, int, int, str]] = []
        for i in range(len(raw)):
            o, pid, tid, ts = int(r["op"][i]), int(r["pid"][i]), int(r["tid"][i]), int(r["ts_ns"][i])
            if o == Op.NVTX_TEXT:
                parts = self._text.setdefault((tid, ts), (self._takes, {}))[1]
                parts[int(t["part"][i])] = t["text"][i].tobytes() + t["text2"][i].tobytes()
            elif o == Op.NVTX_PUSH:
                name = self._name(tid, ts)
                self._stacks.setdefault((pid, tid, int(r["id"][i])), []).append((ts, name))
            elif o == Op.NVTX_START:
                self._started[(pid, int(r["id"][i]))] = (tid, ts, self._name(tid, ts))
            elif o == Op.NVTX_POP:
                stack = self._stacks.get((pid, tid, int(r["id"][i])))
                if stack:
                    start, name = stack.pop()
                    rows.append((pid, tid, start, ts, name))
                else:
                    self.unmatched += 1
            elif o == Op.NVTX_END:
                got = self._started.pop((pid, int(r["id"][i])), None)
                if got is not None:
                    rows.append((pid, got[0], got[1], ts, got[2]))
                else:
                    self.unmatched += 1
            elif o == Op.PROC_EXIT:
                closed = self._close_process(pid, ts)
                self.ended_at_exit += len(closed)
                rows += closed
        return rows

    def _name(self, tid: int, ts: int) -> str:
        """The message sent before the range record of (tid, ts): its parts in order, cut at the first NUL.

        A name cut at NVTX_TEXT_MAX bytes in the middle of a UTF-8 character ends in U+FFFD."""
        got = self._text.pop((tid, ts), None)
        if not got:
            return ""
        parts = got[1]
        text = b"".join(parts[k] for k in sorted(parts))
        return text.split(b"\0", 1)[0].decode("utf-8", "replace")

    def _close_process(self, pid: int, ts: int) -> list[tuple[int, int, int, int, str]]:
        """The process exited at ts: its open ranges end there (its last event)."""
        rows = []
        for key in [k for k in self._stacks if k[0] == pid]:
            rows += [(pid, key[1], start, ts, name) for start, name in self._stacks.pop(key)]
        for key in [k for k in self._started if k[0] == pid]:
            tid, start, name = self._started.pop(key)
            rows.append((pid, tid, start, ts, name))
        return rows

    def _table(self, rows: list[tuple[int, int, int, int, str]]) -> pa.Table | None:
        if not rows:
            return None
        self.spans += len(rows)
        pid, tid, start, end, name = zip(*rows)
        off = self.offset_ns
        cols: dict[str, Any] = {
            "session_id": [self.session_id] * len(rows),
            "pid": pid,
            "tid": tid,
            "start_ns": [s + off for s in start],
            "end_ns": [e + off for e in end],
            "name": name,
            "category": [CATEGORY] * len(rows),
        }
        return pa.table(cols, schema=SPANS_SCHEMA)
