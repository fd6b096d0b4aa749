"""Stores with a known diagnosis for the export tests, and a decoder of the exported Perfetto file."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ingero.store.db import Store

import replays

START_NS = 1_763_800_000 * 10**9


def make_db(path: Path, name: str = "cpu-contention", duration_s: float = 30, policy: str = "spin") -> Path:
    store = replays.write(Store.open(path), name, duration_s, policy, start_ns=START_NS, label=f"{name} {policy}")
    store.close()
    return path


@dataclass
class Slice:
    track: int
    ts: int
    end: int
    name: str
    args: dict
    flow_ids: list[int]
    terminating: list[int] = field(default_factory=list)


@dataclass
class Decoded:
    tracks: dict[int, object]  # uuid -> TrackDescriptor
    slices: list[Slice]  # begin/end pairs
    instants: list[Slice]  # end == ts
    counters: dict[int, list[tuple[int, float]]]


def decode(path: Path) -> Decoded:
    """Parse with the perfetto package's own protobuf classes, reading the file as trace_processor does.

    Per packet sequence: interned event names, arg names and string values; the
    sequence's defaults (track_uuid of its events, timestamp_clock_id); an
    incremental clock (a ClockSnapshot clock with is_incremental: each
    timestamp is the delta since the sequence's previous one), mapped onto the
    trace clock by the snapshot.  Begins and ends are paired per track.
    """
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    names: dict[tuple[int, int], str] = {}
    arg_names: dict[tuple[int, int], str] = {}
    strings: dict[tuple[int, int], str] = {}
    defaults: dict[int, object] = {}
    clocks: dict[tuple[int, int], list[int]] = {}  # (seq, clock id) -> [running value, trace-clock offset]
    tracks: dict[int, object] = {}
    open_: dict[int, list[Slice]] = defaultdict(list)
    out = Decoded(tracks, [], [], defaultdict(list))
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        for e in p.interned_data.event_names:
            names[seq, e.iid] = e.name
        for e in p.interned_data.debug_annotation_names:
            arg_names[seq, e.iid] = e.name
        for e in p.interned_data.debug_annotation_string_values:
            strings[seq, e.iid] = e.str.decode()
        if p.HasField("trace_packet_defaults"):
            defaults[seq] = p.trace_packet_defaults
        if p.HasField("clock_snapshot"):
            cs = {c.clock_id: c for c in p.clock_snapshot.clocks}
            boot = cs[6].timestamp
            for cid, c in cs.items():
                if cid >= 64:
                    assert c.is_incremental
                    clocks[seq, cid] = [c.timestamp, boot - c.timestamp]
            continue
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        ts = p.timestamp
        clock = p.timestamp_clock_id or (defaults[seq].timestamp_clock_id if seq in defaults else 0)
        if clock >= 64:
            c = clocks[seq, clock]
            c[0] += ts
            ts = c[0] + c[1]
        ev = p.track_event
        track = ev.track_uuid if ev.HasField("track_uuid") else defaults[seq].track_event_defaults.track_uuid

        def value(a):
            kind = a.WhichOneof("value")
            return strings[seq, a.string_value_iid] if kind == "string_value_iid" else getattr(a, kind)

        args = {arg_names[seq, a.name_iid]: value(a) for a in ev.debug_annotations}
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_[track].append(Slice(track, ts, -1, names[seq, ev.name_iid], args, list(ev.flow_ids)))
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            s = open_[track].pop()
            assert ts >= s.ts
            s.end = ts
            out.slices.append(s)
        elif ev.type == pb.TrackEvent.TYPE_INSTANT:
            out.instants.append(Slice(track, ts, ts, names[seq, ev.name_iid], args,
                                      list(ev.flow_ids), list(ev.terminating_flow_ids)))
        elif ev.type == pb.TrackEvent.TYPE_COUNTER:
            out.counters[track].append((ts, ev.double_counter_value))
    assert all(not v for v in open_.values()), "unclosed slices"
    return out
