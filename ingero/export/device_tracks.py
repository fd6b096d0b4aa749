"""The device's tracks of the Perfetto export: what the GPU ran, per process, device and stream.

From ``device_activity`` (an imported profiler trace's timeline, or CUPTI's
under `trace --cmd`): a track "GPU d stream s" under its process' track (at
the top for rows that name no process: imports before schema 15), one slice
per kernel, memcpy and memset, named as stored (the kernel's name, 'Memcpy
HtoD (Pageable -> Device)').  Host waits (kind 'sync') are the host's, already
on its thread tracks as the sync calls: not drawn here.

The slices are encoded in bulk (protowire.py) on a sequence of their own, its
names interned in its first packet: a launch-bound trace holds ~100,000
kernels a second.  A stream's work does not overlap; where clocks round two of
its slices into each other by a few ns, the later one starts at the earlier
one's end (slices on one track must nest).
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from ingero.export import protowire as pw
from ingero.export.selection import run

SEQ = 2  # the device tracks' packet sequence (perfetto.py's own is 1)
CHUNK = 500_000  # device rows encoded at once
SEQ_NEEDS_INCREMENTAL_STATE = 2  # TracePacket.SequenceFlags
BEGIN, END = 1, 2  # TrackEvent.Type
_T_PACKET = pw.tag(1, 2)
_T_TS, _T_SEQ, _T_TE, _T_FLAGS = pw.tag(8, 0), pw.tag(10, 0), pw.tag(11, 2), pw.tag(13, 0)
_T_TYPE, _T_NAME, _T_TRACK = pw.tag(9, 0), pw.tag(10, 0), pw.tag(11, 0)

_FILTER = """session_id = $sid AND end_ns > $t0 AND start_ns < $t1 AND kind <> 'sync'
  AND ($all_pids OR pid IS NULL OR list_contains($pids, pid))"""
TRACKS_SQL = f"""
SELECT DISTINCT pid, coalesce(device, -1) AS device, coalesce(stream, -1) AS stream FROM device_activity
WHERE {_FILTER} ORDER BY pid NULLS FIRST, device, stream
"""
NAMES_SQL = f"SELECT DISTINCT coalesce(name, kind) FROM device_activity WHERE {_FILTER}"
# (k: the track's place in TRACKS_SQL's order, the same ranking over the same rows; the name as
# its place in $names, NAMES_SQL's, sorted)
ROWS_SQL = f"""
SELECT dense_rank() OVER (ORDER BY pid NULLS FIRST, coalesce(device, -1), coalesce(stream, -1)) - 1 AS k,
       coalesce(list_position($names::VARCHAR[], coalesce(name, kind)), 0) AS name_iid,
       greatest(start_ns, $t0) AS s, least(end_ns, $t1) AS e
FROM device_activity WHERE {_FILTER}
ORDER BY k, s, e
"""


def has_rows(con) -> bool:
    """The store has a device_activity table with pid (schema 15); else nothing to draw."""
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'device_activity'").fetchall()}
    return "pid" in cols


def write(con, w, f: BinaryIO, params: dict, process_uuid, track_uuid) -> int:
    """The device tracks (descriptors through ``w``, perfetto.py's writer, flushed here) and their
    slices, written to ``f``; returns how many slices.  ``process_uuid(pid)``: a process' track,
    ``track_uuid(k)``: the k-th device track's uuid."""
    if not has_rows(con):
        return 0
    tracks = [tuple(r) for r in run(con, TRACKS_SQL, params).fetchall()]
    if not tracks:
        return 0
    for k, (pid, device, stream) in enumerate(tracks):
        label = f"GPU {device if device >= 0 else '?'} stream {stream if stream >= 0 else '?'}"
        w.track(track_uuid(k), label, parent=process_uuid(pid) if pid is not None else 0, order=1000 + k)
    names = sorted(r[0] for r in run(con, NAMES_SQL, params).fetchall() if r[0] is not None)
    iid = {n: i + 1 for i, n in enumerate(names)}  # (= the place in $names: ROWS_SQL's name_iid)
    first = w.packet()
    first.trusted_packet_sequence_id = SEQ
    first.sequence_flags = w.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    first.incremental_state_cleared = True
    for n, i in iid.items():
        e = first.interned_data.event_names.add()
        e.iid, e.name = i, n
    w.flush()
    written = 0
    q = {**params, "names": names}
    reader = con.sql(ROWS_SQL, params=_named(ROWS_SQL, q)).to_arrow_reader(CHUNK)
    carry: tuple[int, int] | None = None  # (track, end) of the last slice of the previous chunk
    low = np.iinfo(np.int64).min
    for batch in reader:
        if not batch.num_rows:
            continue
        trk = batch.column("k").to_numpy().astype(np.int64)
        name_iid = batch.column("name_iid").to_numpy().astype(np.int64)
        s = batch.column("s").to_numpy().astype(np.int64)
        e = batch.column("e").to_numpy().astype(np.int64)
        # within a track, no slice starts before the ones before it ended
        before = np.r_[low, e[:-1]]
        new_track = np.r_[True, trk[1:] != trk[:-1]]
        if carry is not None and trk[0] == carry[0]:
            before[0], new_track[0] = carry[1], False
        before[new_track] = low
        group = np.cumsum(new_track)
        prev_end = before.copy()
        for g in np.unique(group).tolist():  # (a running maximum per track)
            m = group == g
            prev_end[m] = np.maximum.accumulate(before[m])
        s = np.maximum(s, prev_end)
        e = np.maximum(e, s)
        carry = (int(trk[-1]), int(e[-1]))
        f.write(_encode(np.array([track_uuid(int(k)) for k in range(len(tracks))], np.int64)[trk], name_iid, s, e))
        written += len(s)
    return written


def _named(sql: str, params: dict) -> dict:
    from ingero.store.db import named_params

    return named_params(sql, params)


def _encode(uuid: np.ndarray, name_iid: np.ndarray, s: np.ndarray, e: np.ndarray) -> bytes:
    """One begin and one end packet per slice, begin before its end, on SEQ."""
    n = len(s)
    ts = np.empty(2 * n, np.int64)
    ts[0::2], ts[1::2] = s, e
    typ = np.empty(2 * n, np.int64)
    typ[0::2], typ[1::2] = BEGIN, END
    trk = np.repeat(uuid, 2)
    names = np.repeat(name_iid, 2)
    is_begin = typ == BEGIN
    event = [pw.varint(typ, tag=_T_TYPE), pw.varint(names, is_begin & (names > 0), tag=_T_NAME),
             pw.varint(trk, tag=_T_TRACK)]
    body = [pw.varint(ts, tag=_T_TS), pw.varint(np.full(2 * n, SEQ), tag=_T_SEQ), *pw.nested(_T_TE, event),
            pw.varint(np.full(2 * n, SEQ_NEEDS_INCREMENTAL_STATE), tag=_T_FLAGS)]
    return pw.join(pw.nested(_T_PACKET, body))
