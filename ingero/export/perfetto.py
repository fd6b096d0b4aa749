"""Native Perfetto protobuf of a selection, streamed: one track per traced thread, causal arrows.

A ``Trace`` message of many packets is the same bytes as the packets one
after another, so the file is written piece by piece.  The few packets of
tracks, counters and chains are built here with the package's protobuf
classes; the events (millions) are read window by window (WINDOW_ROWS rows,
cut on whole seconds; DuckDB reads the next while this one is encoded) and
encoded in bulk by threads.py, so memory stays bounded whatever the size.

Layout (what ui.perfetto.dev shows):
- per process a track "name (pid)" (with "rank N" for an imported trace of
  a distributed job), under it one track per thread carrying
  the CUDA calls (slices named by op; bytes, stream, ret as args), the
  off-CPU intervals ("preempted by <name> (<pid>)" or "blocked"), page
  faults and block I/O requests as instants (latency as an arg);
- counter tracks: host CPU %, memory used, GPU utilisation (NVML), and per
  process its RSS and the run-queue wait of its threads per second;
- a track per causal chain with a slice "[SEVERITY] title" over each
  evidence window, and flow arrows (see flows.py) from causes to effects;
- under each process, a track per GPU and stream with what the device ran
  (kernels, copies, memsets: an imported trace's timeline, or CUPTI's under
  `trace --cmd`; device_tracks.py).

Slices on one thread track must nest; an interval that would cross the end
of the slice around it (clock skew between probes) is clipped to it (threads.py).

Perfetto's timestamps are unsigned: a selection holding a time before 1970 (a
damaged or hand-made store) is refused with one line before anything is written.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import duckdb

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.model import Chain
from ingero.errors import IngeroError
from ingero.events.units import NS
from ingero.export import device_tracks, flows
from ingero.export.selection import WHERE, bounded_memory, run
from ingero.export.threads import ThreadTracks
from ingero.store.db import named_params
from ingero.store.selection import Selection

BATCH = 20_000  # packets per write
ARG_NAMES = ("bytes", "stream", "ret", "kind", "runq_ns", "latency_ns", "in_call", "rule",
             "share_of_wall_clock", "fix")
SEQ = 1  # the one trusted packet sequence of this writer

# Track uuids: the id shifted left, the kind of track in the low 3 bits; small numbers
# keep the varint of every event's track_uuid short (3-4 bytes, not 9).
_PROC, _THREAD, _COUNTER, _CHAIN, _DEVICE = 1, 2, 3, 4, 5


def _uuid(kind: int, id_: int) -> int:
    return (id_ << 3) | kind

# Names that the slices of the selection can carry, known before any event is written:
# the ops, and for every process that preempted a traced thread "preempted by <name> (<pid>)".
_NAMES = """
WITH names AS (
    SELECT pid, any_value(name) AS name FROM process_names GROUP BY pid
    UNION ALL
    SELECT pid, any_value(comm) FROM process_cpu
    WHERE session_id = $sid AND pid NOT IN (SELECT pid FROM process_names) GROUP BY pid
), one AS (SELECT pid, any_value(name) AS name FROM names GROUP BY pid)
"""
_LABELS_SQL = f"""
{_NAMES}
SELECT 'preempted by ' || coalesce(one.name, 'pid') || ' (' || o.other_pid::VARCHAR || ')'
FROM (SELECT unnest($others) AS other_pid) o LEFT JOIN one ON one.pid = o.other_pid
ORDER BY o.other_pid
"""
# (kinds and in_calls of every op: a string too many in the list costs nothing; with FILTERs per op
# the query took 0.44 CPU-s over 10 M rows instead of 0.05)
_VOCAB_SQL = f"""
SELECT list(DISTINCT op), list(DISTINCT kind), list(DISTINCT in_call) FROM events WHERE {WHERE}
"""
_OTHERS_SQL = f"""
SELECT DISTINCT other_pid FROM events
WHERE {WHERE} AND op = 'sched_switch' AND preempted AND other_pid IS NOT NULL ORDER BY other_pid
"""
# One time window of the selection's events, in storage order (threads.py sorts them), as
# numbers: strings as codes into lists known up front (1-based; 0: none): op into $ops, the
# preempting process into $others (len + 1: unknown), kind and in_call into $strs; which numeric
# args are not NULL (bit k of has: threads.NUM_ARGS[k]; a ret of 0, success, counts as absent);
# NULL numbers are 0.  Which args and names a row's op shows is decided in threads.py (tables
# by op code); doing it here in CASEs cost 0.3-0.8 CPU-s more per 10 M rows.
_WINDOW_SQL = f"""
SELECT coalesce(tid, pid) AS tid, timestamp, coalesce(duration_ns, 0) AS dur,
       list_position($ops::VARCHAR[], op)::USMALLINT AS op, coalesce(preempted, false) AS preempted,
       coalesce(list_position($others::INTEGER[], other_pid), len($others::INTEGER[]) + 1) AS other,
       coalesce(list_position($strs::VARCHAR[], nullif(kind, '')), 0) AS kind,
       coalesce(list_position($strs::VARCHAR[], in_call), 0) AS in_call,
       ((bytes IS NOT NULL)::INTEGER + 2 * (stream IS NOT NULL)::INTEGER + 4 * (coalesce(ret, 0) <> 0)::INTEGER
        + 8 * (runq_ns IS NOT NULL)::INTEGER + 16 * (coalesce(duration_ns, 0) <> 0)::INTEGER)::UTINYINT AS has,
       coalesce(bytes, 0) AS bytes, coalesce(stream, 0) AS stream, coalesce(ret, 0) AS ret,
       coalesce(runq_ns, 0) AS runq_ns
FROM events WHERE {WHERE} AND timestamp >= $w0 AND timestamp < $w1
"""
# Events per second of the selection: the windows are cut on whole seconds
_SECONDS_SQL = f"SELECT timestamp // 1000000000 AS s, count(*) FROM events WHERE {WHERE} GROUP BY s ORDER BY s"
WINDOW_ROWS = 200_000  # rows fetched and encoded at once (bounds memory: ~2 kB a row while encoded)

_THREADS_SQL = f"""
SELECT DISTINCT pid, coalesce(tid, pid) AS tid FROM events WHERE {WHERE} ORDER BY pid, tid
"""

# The earliest time the export would write: events, and the samples of the counter tracks
_RANGE = Selection.where(pids=False)
_EARLIEST_SQL = f"""
SELECT min(t) FROM (
    SELECT min(timestamp) AS t FROM events WHERE {WHERE}
    UNION ALL SELECT min(timestamp) FROM system_metrics WHERE {_RANGE}
    UNION ALL SELECT min(timestamp) FROM gpu_metrics WHERE {_RANGE}
    UNION ALL SELECT min(timestamp) FROM process_memory WHERE {_RANGE})
"""

_PROC_NAMES_SQL = "SELECT pid, any_value(name) FROM process_names WHERE list_contains($pids, pid) GROUP BY pid"

# (name, unit, SQL of (timestamp, value) in the selection's time range)
_HOST_COUNTERS = (
    ("CPU %", "%", f"SELECT timestamp, cpu_pct FROM system_metrics WHERE {_RANGE} "
                   "AND cpu_pct IS NOT NULL ORDER BY timestamp"),
    ("memory used", "bytes", f"SELECT timestamp, mem_used_bytes FROM system_metrics WHERE {_RANGE} "
                             "AND mem_used_bytes IS NOT NULL ORDER BY timestamp"),
)
_GPU_SQL = (f"SELECT gpu, timestamp, util_pct FROM gpu_metrics WHERE {_RANGE} "
            "AND util_pct IS NOT NULL ORDER BY gpu, timestamp")
# RSS of the processes that have a track (events in the selection)
_RSS_SQL = f"""
SELECT pid, timestamp, rss_bytes FROM process_memory WHERE {_RANGE}
  AND rss_bytes IS NOT NULL AND pid IN (SELECT DISTINCT pid FROM events WHERE {WHERE})
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
    device_slices: int = 0  # kernels, copies, memsets drawn on the GPU tracks


# The first packet of every export: the producer's name, so --force knows an earlier trace of ours.
PRODUCER = "ingero export"


def is_ours(path: Path) -> bool:
    """Whether the regular file at ``path`` is a Perfetto trace ingero wrote: its first packet
    names PRODUCER (earlier versions: it interns ARG_NAMES' first names)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head or head[0] != 0x0A:  # field 1 (packet), length-delimited
        return False
    size, shift, i = 0, 0, 1
    while i < len(head) and i < 6:
        size |= (head[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not head[i - 1] & 0x80:
            break
    else:
        return False
    try:
        p = pb.TracePacket.FromString(head[i:i + size])
    except Exception:  # protobuf's DecodeError, or a short read of a foreign file
        return False
    if p.system_info.tracing_service_version == PRODUCER:
        return True
    return [e.name for e in p.interned_data.debug_annotation_names][:3] == list(ARG_NAMES[:3])


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
        producer = self.builder.create_packet()
        producer.system_info.tracing_service_version = PRODUCER
        self.builder.write_packet(producer)
        first = self.builder.create_packet()
        first.trusted_packet_sequence_id = SEQ
        first.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        first.incremental_state_cleared = True
        for name in ARG_NAMES:  # interned once up front: the hot loop only sets iids
            e = first.interned_data.debug_annotation_names.add()
            e.iid = self.arg_names[name] = len(self.arg_names) + 1
            e.name = name
        self.builder.write_packet(first)
        self.packets += 2
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


def export(con: duckdb.DuckDBPyConnection, sel: Selection, opts: Options, f: BinaryIO, path: Path) -> Summary:
    params = sel.params()
    earliest = run(con, _EARLIEST_SQL, params).fetchone()[0]
    if earliest is not None and earliest < 0:
        raise IngeroError(f"the selection holds a time before 1970 ({earliest:,} ns since the epoch): "
                          "Perfetto's timestamps cannot be negative",
                          "narrow it with --since or --pid past that time, or export --format parquet")
    # nothing is written before 0: a range opening earlier (a session's start) starts the clock at 0
    params["t0"] = max(params["t0"], 0)
    chains = explain(con, opts).chains
    arrows = flows.plan(con, chains, params)
    w = _Writer(f)
    threads = _process_tracks(con, w, params)
    _counters(con, w, params)
    _chains(w, chains, arrows)
    w.flush()
    procs = {p for p, _ in threads}
    device = device_tracks.write(con, w, f, params, lambda pid: _uuid(_PROC, pid) if pid in procs else 0,
                                 lambda k: _uuid(_DEVICE, k))
    vocab = _vocabulary(con, params)
    tracks = ThreadTracks(f, threads, lambda tid: _uuid(_THREAD, tid), w.arg_names, params["t0"],
                          arrows.out_of, arrows.into, vocab["ops"], vocab["preempted"], vocab["strs"])
    with bounded_memory(con):
        _events(con, tracks, {**params, **{k: vocab[k] for k in ("ops", "others", "strs")}})
    return Summary(path, tracks.events, w.packets + tracks.packets, f.tell(), len(chains), arrows.next_id - 1,
                   device)


def _vocabulary(con: duckdb.DuckDBPyConnection, params: dict) -> dict[str, list]:
    """The ops, preempting processes (and their slice names) and string args of the selection."""
    ops, kinds, calls = run(con, _VOCAB_SQL, params).fetchone()
    ops = sorted(ops or [])
    others = [r[0] for r in run(con, _OTHERS_SQL, params).fetchall()]
    strs = sorted({*(kinds or []), *(calls or [])} - {None, ""})
    preempted = [r[0] for r in run(con, _LABELS_SQL, {**params, "others": others}).fetchall()] if others else []
    return {"ops": ops, "others": others, "strs": strs, "preempted": [*preempted, "preempted by pid (?)"]}


def _windows(con: duckdb.DuckDBPyConnection, params: dict) -> list[tuple[int, int]]:
    """[start, end) ns of windows of at most WINDOW_ROWS rows (or one second), covering the selection."""
    out: list[tuple[int, int]] = []
    start, rows = None, 0
    for sec, n in run(con, _SECONDS_SQL, params).fetchall():
        if start is None:
            start = params["t0"]
        elif rows + n > WINDOW_ROWS:
            out.append((start, sec * NS))
            start, rows = sec * NS, 0
        rows += n
    if start is not None:
        out.append((start, params["t1"]))
    return out


def _events(con: duckdb.DuckDBPyConnection, tracks: ThreadTracks, params: dict) -> None:
    """Window after window; the next window is read by DuckDB (no GIL) while this one is encoded."""
    wins = _windows(con, params)
    cur = con.cursor()

    def fetch(w: tuple[int, int]):
        q = named_params(_WINDOW_SQL, params)
        return cur.sql(_WINDOW_SQL, params={**q, "w0": w[0], "w1": w[1]}).to_arrow_table()

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(fetch, wins[0]) if wins else None
        for i, w in enumerate(wins):
            table = pending.result()
            pending = pool.submit(fetch, wins[i + 1]) if i + 1 < len(wins) else None
            tracks.window(table, w[1])
    tracks.finish()
    cur.close()


def _process_tracks(con: duckdb.DuckDBPyConnection, w: _Writer, params: dict) -> list[tuple[int, int]]:
    """A track per process ("name (pid)", with the rank of an imported trace), one per thread under it."""
    threads = [tuple(r) for r in run(con, _THREADS_SQL, params).fetchall()]
    pids = sorted({p for p, _ in threads})
    names = dict(con.execute(_PROC_NAMES_SQL, {"pids": pids}).fetchall())
    rank = con.execute("SELECT rank FROM sessions WHERE session_id = $sid", {"sid": params["sid"]}).fetchall()
    suffix = f" rank {rank[0][0]}" if rank and rank[0][0] is not None else ""
    for pid in pids:
        w.track(_uuid(_PROC, pid), f"{names.get(pid) or 'pid'} ({pid}){suffix}", pid=pid)
    for pid, tid in threads:
        label = "main" if tid == pid else f"thread {tid}"
        w.track(_uuid(_THREAD, tid), label, parent=_uuid(_PROC, pid), pid=pid, tid=tid)
    return threads


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
            if win.end_ns < 0:
                continue  # a window wholly before 1970 (the selection holds no event there)
            p, ev = w.begin(uuid, max(win.start_ns, 0), f"[{c.severity}] {c.title}")
            w.arg(p, ev, "rule", c.rule_id)
            w.arg(p, ev, "share_of_wall_clock", round(c.share, 4))
            w.arg(p, ev, "fix", c.fix[0] if c.fix else "")
            ev.flow_ids.extend(arrows.out_of_marker.get((ci, wi), ()))
            w.end(uuid, win.end_ns)
