"""Native Perfetto protobuf of a selection, streamed: one track per traced thread, causal arrows.

Packets are written in batches of BATCH (a ``Trace`` message of many packets
is the same bytes as the packets one after another), from a DuckDB cursor
read in record batches, so memory stays bounded whatever the session size.

Layout (what ui.perfetto.dev shows):
- per process a track "name (pid)", under it one track per thread carrying
  the CUDA calls (slices named by op; bytes, stream, ret as args), the
  off-CPU intervals ("preempted by <name> (<pid>)" or "blocked"), page
  faults and block I/O requests as instants (latency as an arg);
- counter tracks: host CPU %, memory used, GPU utilisation (NVML), and per
  process its RSS and the run-queue wait of its threads per second;
- a track per causal chain with a slice "[SEVERITY] title" over each
  evidence window, and flow arrows (see flows.py) from causes to effects.

Slices on one thread track must nest; an interval that would cross the end
of the slice around it (clock skew between probes) is clipped to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import duckdb

from ingero.analyze.explain import explain
from ingero.analyze.model import Chain
from ingero.export import flows
from ingero.export.selection import WHERE, Selection, bounded_memory, reader, run

BATCH = 20_000  # packets per write
ARG_NAMES = ("bytes", "stream", "ret", "kind", "runq_ns", "latency_ns", "in_call", "rule",
             "share_of_wall_clock", "fix")
ROWS = 65_536  # rows per record batch from DuckDB
SEQ = 1  # the one trusted packet sequence of this writer

# Track uuids: the id shifted left, the kind of track in the low 3 bits; small numbers
# keep the varint of every event's track_uuid short (3-4 bytes, not 9).
_PROC, _THREAD, _COUNTER, _CHAIN = 1, 2, 3, 4


def _uuid(kind: int, id_: int) -> int:
    return (id_ << 3) | kind

_EVENTS_SQL = f"""
WITH names AS (
    SELECT pid, any_value(name) AS name FROM process_names GROUP BY pid
    UNION ALL
    SELECT pid, any_value(comm) FROM process_cpu
    WHERE session_id = $sid AND pid NOT IN (SELECT pid FROM process_names) GROUP BY pid
)
SELECT e.pid, coalesce(e.tid, e.pid) AS tid, e.timestamp, coalesce(e.duration_ns, 0), e.op, e.kind,
       e.bytes, e.stream, e.ret, e.preempted, e.other_pid, e.runq_ns, e.in_call,
       CASE WHEN e.op = 'sched_switch' AND e.preempted THEN
            (SELECT n.name FROM names n WHERE n.pid = e.other_pid LIMIT 1) END AS other_name,
       e.tid IS NULL AS no_tid
FROM (SELECT * FROM events WHERE {WHERE}) e
ORDER BY e.pid, tid, e.timestamp, e.duration_ns DESC
"""

_THREADS_SQL = f"""
SELECT DISTINCT pid, coalesce(tid, pid) AS tid FROM events WHERE {WHERE} ORDER BY pid, tid
"""

_PROC_NAMES_SQL = "SELECT pid, any_value(name) FROM process_names WHERE list_contains($pids, pid) GROUP BY pid"

# (name, unit, SQL of (timestamp, value) in the selection's time range)
_HOST_COUNTERS = (
    ("CPU %", "%", "SELECT timestamp, cpu_pct FROM system_metrics WHERE session_id = $sid "
                   "AND timestamp >= $t0 AND timestamp < $t1 AND cpu_pct IS NOT NULL ORDER BY timestamp"),
    ("memory used", "bytes", "SELECT timestamp, mem_used_bytes FROM system_metrics WHERE session_id = $sid "
                             "AND timestamp >= $t0 AND timestamp < $t1 AND mem_used_bytes IS NOT NULL "
                             "ORDER BY timestamp"),
)
_GPU_SQL = ("SELECT gpu, timestamp, util_pct FROM gpu_metrics WHERE session_id = $sid AND timestamp >= $t0 "
            "AND timestamp < $t1 AND util_pct IS NOT NULL ORDER BY gpu, timestamp")
# RSS of the processes that have a track (events in the selection)
_RSS_SQL = f"""
SELECT pid, timestamp, rss_bytes FROM process_memory WHERE session_id = $sid AND timestamp >= $t0
  AND timestamp < $t1 AND rss_bytes IS NOT NULL AND pid IN (SELECT DISTINCT pid FROM events WHERE {WHERE})
ORDER BY pid, timestamp
"""
# run-queue wait of a process' traced threads per second of wall clock (0-ncpu)
_RUNQ_SQL = f"""
SELECT pid, (timestamp // 1000000000) * 1000000000 AS sec, sum(runq_ns) / 1e9
FROM events WHERE {WHERE} AND op = 'sched_switch' AND runq_ns IS NOT NULL
GROUP BY pid, sec ORDER BY pid, sec
"""


@dataclass
class Summary:
    path: Path
    events: int
    packets: int
    bytes: int
    chains: int
    flows: int


class _Writer:
    """Batches packets and interns strings (event names, annotation names) on one sequence."""

    def __init__(self, f: BinaryIO) -> None:
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        self.pb = pb
        self.builder = StreamingTraceProtoBuilder(f)  # writes the first packet: the sequence reset
        self.f = f
        self.trace = pb.Trace()
        self.names: dict[str, int] = {}
        self.arg_names: dict[str, int] = {}
        self.packets = 0
        first = self.builder.create_packet()
        first.trusted_packet_sequence_id = SEQ
        first.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        first.incremental_state_cleared = True
        for name in ARG_NAMES:  # interned once up front: the hot loop only sets iids
            e = first.interned_data.debug_annotation_names.add()
            e.iid = self.arg_names[name] = len(self.arg_names) + 1
            e.name = name
        self.builder.write_packet(first)
        self.packets += 1
        self.pending = 0

    def packet(self) -> Any:
        if self.pending >= BATCH:
            self.flush()
        self.pending += 1
        p = self.trace.packet.add()
        p.trusted_packet_sequence_id = SEQ
        return p

    def flush(self) -> None:
        if self.pending:
            self.f.write(self.trace.SerializeToString())
            self.trace = self.pb.Trace()  # a fresh arena: Clear() would keep the memory
            self.packets += self.pending
            self.pending = 0

    def name_iid(self, p: Any, name: str) -> int:
        iid = self.names.get(name)
        if iid is None:
            iid = self.names[name] = len(self.names) + 1
            e = p.interned_data.event_names.add()
            e.iid, e.name = iid, name
        p.sequence_flags = self.pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        return iid

    def arg(self, p: Any, ev: Any, name: str, value: Any) -> None:
        a = ev.debug_annotations.add()
        a.name_iid = self.arg_names[name]  # one of ARG_NAMES
        if isinstance(value, str):
            a.string_value = value
        elif isinstance(value, bool):
            a.bool_value = value
        elif isinstance(value, int) and value >= 1 << 63:
            a.uint_value = value
        elif isinstance(value, int):
            a.int_value = value
        else:
            a.double_value = float(value)

    def track(self, uuid: int, name: str, *, parent: int = 0, pid: int = 0, tid: int = 0,
              counter_unit: str | None = None, order: int | None = None) -> None:
        p = self.packet()
        d = p.track_descriptor
        d.uuid = uuid
        if parent:
            d.parent_uuid = parent
        if tid:
            d.thread.pid, d.thread.tid, d.thread.thread_name = pid, tid, name
        elif pid:
            d.process.pid, d.process.process_name = pid, name
        else:
            d.name = name
        if counter_unit is not None:
            if counter_unit == "bytes":
                d.counter.unit = self.pb.CounterDescriptor.UNIT_SIZE_BYTES
            else:
                d.counter.unit_name = counter_unit
        if order is not None:
            d.sibling_order_rank = order

    def begin(self, uuid: int, ts: int, name: str) -> Any:
        return self._named(uuid, ts, name, self.pb.TrackEvent.TYPE_SLICE_BEGIN)

    def instant(self, uuid: int, ts: int, name: str) -> Any:
        return self._named(uuid, ts, name, self.pb.TrackEvent.TYPE_INSTANT)

    def _named(self, uuid: int, ts: int, name: str, kind: int) -> Any:
        p = self.packet()
        p.timestamp = ts
        ev = p.track_event
        ev.type = kind
        ev.track_uuid = uuid
        ev.name_iid = self.name_iid(p, name)
        return p, ev

    def end(self, uuid: int, ts: int) -> None:
        p = self.packet()
        p.timestamp = ts
        p.track_event.type = self.pb.TrackEvent.TYPE_SLICE_END
        p.track_event.track_uuid = uuid

    def counter(self, uuid: int, ts: int, value: float) -> None:
        p = self.packet()
        p.timestamp = ts
        p.track_event.type = self.pb.TrackEvent.TYPE_COUNTER
        p.track_event.track_uuid = uuid
        p.track_event.double_counter_value = float(value)


def export(con: duckdb.DuckDBPyConnection, sel: Selection, f: BinaryIO, path: Path) -> Summary:
    chains = explain(con, sel.opts).chains
    params = sel.params()
    arrows = flows.plan(con, chains, params)
    w = _Writer(f)
    _process_tracks(con, w, params)
    _counters(con, w, params)
    _chains(w, chains, arrows)
    with bounded_memory(con):
        events = _events(con, w, params, arrows)
    w.flush()
    return Summary(path, events, w.packets, f.tell(), len(chains), arrows.next_id - 1)


def _process_tracks(con: duckdb.DuckDBPyConnection, w: _Writer, params: dict) -> None:
    threads = run(con, _THREADS_SQL, params).fetchall()
    pids = sorted({p for p, _ in threads})
    names = dict(con.execute(_PROC_NAMES_SQL, {"pids": pids}).fetchall())
    for pid in pids:
        w.track(_uuid(_PROC, pid), f"{names.get(pid) or 'pid'} ({pid})", pid=pid)
    for pid, tid in threads:
        label = "main" if tid == pid else f"thread {tid}"
        w.track(_uuid(_THREAD, tid), label, parent=_uuid(_PROC, pid), pid=pid, tid=tid)


def _counters(con: duckdb.DuckDBPyConnection, w: _Writer, params: dict) -> None:
    n = 0
    for name, unit, sql in _HOST_COUNTERS:
        rows = run(con, sql, params).fetchall()
        if rows:
            n += 1
            w.track(_uuid(_COUNTER, n), name, counter_unit=unit)
            for ts, v in rows:
                w.counter(_uuid(_COUNTER, n), ts, v)
    per_key: dict[Any, int] = {}
    for sql, label, unit, parent in ((_GPU_SQL, "GPU {} util %", "%", None),
                                     (_RSS_SQL, "RSS", "bytes", _PROC),
                                     (_RUNQ_SQL, "run-queue wait (CPU s/s)", "s/s", _PROC)):
        for key, ts, v in run(con, sql, params).fetchall():
            if (label, key) not in per_key:
                n += 1
                per_key[(label, key)] = _uuid(_COUNTER, n)
                w.track(_uuid(_COUNTER, n), label.format(key), counter_unit=unit,
                        parent=_uuid(parent, key) if parent else 0)
            w.counter(per_key[(label, key)], ts, v)


def _chains(w: _Writer, chains: list[Chain], arrows: flows.Arrows) -> None:
    if not chains:
        return
    w.track(_uuid(_CHAIN, 0), "ingero: causal chains", order=-1)
    for ci, c in enumerate(chains):
        uuid = _uuid(_CHAIN, 1 + ci)
        w.track(uuid, f"#{ci + 1} {c.rule_id}", parent=_uuid(_CHAIN, 0), order=ci)
        for wi, win in enumerate(c.evidence_windows):
            p, ev = w.begin(uuid, win.start_ns, f"[{c.severity}] {c.title}")
            w.arg(p, ev, "rule", c.rule_id)
            w.arg(p, ev, "share_of_wall_clock", round(c.share, 4))
            w.arg(p, ev, "fix", c.fix[0] if c.fix else "")
            ev.flow_ids.extend(arrows.out_of_marker.get((ci, wi), ()))
            w.end(uuid, win.end_ns)


def _events(con: duckdb.DuckDBPyConnection, w: _Writer, params: dict, arrows: flows.Arrows) -> int:
    batches = reader(con, _EVENTS_SQL, params, ROWS)
    out_of, into = arrows.out_of, arrows.into
    stack: list[tuple[int, int, tuple | None]] = []  # (end_ns, begin_ns, key of an effect) of open slices
    cur = None
    n = 0
    IID_BYTES, IID_STREAM, IID_RET, IID_RUNQ = (w.arg_names[k] for k in ("bytes", "stream", "ret", "runq_ns"))

    def close_until(uuid: int, t: int | None) -> None:
        while stack and (t is None or stack[-1][0] <= t):
            end, begin, key = stack.pop()
            if key is not None:
                _, ev = w.instant(uuid, max(begin, end - 1), "delayed (see arrow)")
                ev.terminating_flow_ids.extend(into[key])
            w.end(uuid, end)

    for batch in batches:
        cols = batch.to_pydict()
        for pid, tid, ts, dur, op, kind, nbytes, stream, ret, preempted, other, runq, in_call, oname, no_tid in zip(
                *cols.values()):
            n += 1
            uuid = (tid << 3) | _THREAD
            if uuid != cur:
                if cur is not None:
                    close_until(cur, None)
                cur = uuid
            close_until(uuid, ts)
            key = (pid, None if no_tid else tid, ts, op)
            if op == "page_fault" or op == "block_io":
                p, ev = w.instant(uuid, ts, op)
                if dur:
                    w.arg(p, ev, "latency_ns", dur)
                if nbytes is not None:
                    w.arg(p, ev, "bytes", nbytes)
                if kind:
                    w.arg(p, ev, "kind", kind)
                if in_call:
                    w.arg(p, ev, "in_call", in_call)
                if key in out_of:
                    ev.flow_ids.extend(out_of[key])
                continue
            if op == "sched_switch":
                name = f"preempted by {oname or 'pid'} ({other})" if preempted else "blocked"
                p, ev = w.begin(uuid, ts, name)
                if runq is not None:
                    a = ev.debug_annotations.add()
                    a.name_iid, a.int_value = IID_RUNQ, runq
                if not preempted and kind:
                    w.arg(p, ev, "kind", kind)
            else:
                p, ev = w.begin(uuid, ts, op)
                if nbytes is not None:
                    a = ev.debug_annotations.add()
                    a.name_iid, a.int_value = IID_BYTES, nbytes
                if stream is not None:
                    a = ev.debug_annotations.add()
                    a.name_iid, a.uint_value = IID_STREAM, stream
                if ret is not None:
                    a = ev.debug_annotations.add()
                    a.name_iid, a.int_value = IID_RET, ret
                if kind:
                    w.arg(p, ev, "kind", kind)
            if key in out_of:
                ev.flow_ids.extend(out_of[key])
            end = ts + dur
            if stack and end > stack[-1][0]:
                end = stack[-1][0]  # would cross the enclosing slice's end: clip
            stack.append((end, ts, key if key in into else None))
    if cur is not None:
        close_until(cur, None)
    return n
