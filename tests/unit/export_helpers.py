"""Stores with a known diagnosis for the export tests, and a decoder of the exported Perfetto file."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ingero.demo import scenarios, synthetic
from ingero.store.db import Store

START_NS = 1_763_800_000 * 10**9


def make_db(path: Path, name: str = "cpu-contention", duration_s: float = 30, policy: str = "spin") -> Path:
    store = Store.open(path)
    sc = scenarios.get(name)
    synthetic.write(store, sc, synthetic.generate(sc, duration_s=duration_s, start_ns=START_NS, policy=policy),
                    label=f"{name} {policy}")
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
    """Parse with the perfetto package's own protobuf classes; pair begins and ends per track."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    tracks: dict[int, object] = {}
    open_: dict[int, list[Slice]] = defaultdict(list)
    out = Decoded(tracks, [], [], defaultdict(list))
    for p in trace.packet:
        for e in p.interned_data.event_names:
            names[e.iid] = e.name
        for e in p.interned_data.debug_annotation_names:
            arg_names[e.iid] = e.name
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if not p.HasField("track_event"):
            continue
        ev = p.track_event
        args = {arg_names[a.name_iid]: getattr(a, a.WhichOneof("value")) for a in ev.debug_annotations}
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_[ev.track_uuid].append(Slice(ev.track_uuid, p.timestamp, -1, names[ev.name_iid], args,
                                              list(ev.flow_ids)))
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            s = open_[ev.track_uuid].pop()
            assert p.timestamp >= s.ts
            s.end = p.timestamp
            out.slices.append(s)
        elif ev.type == pb.TrackEvent.TYPE_INSTANT:
            out.instants.append(Slice(ev.track_uuid, p.timestamp, p.timestamp, names[ev.name_iid], args,
                                      list(ev.flow_ids), list(ev.terminating_flow_ids)))
        elif ev.type == pb.TrackEvent.TYPE_COUNTER:
            out.counters[ev.track_uuid].append((p.timestamp, ev.double_counter_value))
    assert all(not v for v in open_.values()), "unclosed slices"
    return out
