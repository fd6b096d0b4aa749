"""Which slices the causal arrows join: cause -> the effect it delayed, per chain.

A chain names processes and evidence windows.  For a rule whose cause is a
host event on the affected thread (a preemption, a page fault, an I/O wait)
the arrows go from each such event to the CUDA call it happened inside, in
the evidence windows, the longest causes first.  For a rule whose cause is
not one event (launch-bound, sync-heavy, a straggler...) and when no cause
event lies inside a call, the chain's own marker slice over the window is
the cause and the arrows go to the window's longest CUDA calls.

An arrow ends at the effect's *end* (an instant "delayed" inside the effect
slice): the delay shows where the call returns late, and Perfetto binds a
flow to events in time order, so a cause that began inside the call could
not point at the call's beginning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from ingero.analyze.model import Chain
from ingero.export.selection import run

# At most this many arrows per chain: enough to see the pattern, few enough to read.
MAX_FLOWS_PER_CHAIN = 48
# Marker-caused chains: the longest calls of each window.
MARKER_EFFECTS_PER_WINDOW = 3

# rule id -> condition on the cause row c (constant SQL text, no values).
HOST_CAUSE = {
    "cpu-contention": "c.op = 'sched_switch' AND c.preempted",
    "memory-pressure": "c.op = 'page_fault'",
    "io-stall": "c.op = 'sched_switch' AND c.kind = 'io'",
}

# Per evidence window: the chain's causes (longest first), and the CUDA calls of the same
# processes that can hold them (those starting up to the longest call's duration before the
# window; only the numbers: no op strings, no ORDER BY, 13 ms instead of 75 for a window of
# 234 k calls).  They are paired in numpy: a cause belongs to its thread's latest call started at
# or before it, if that call was still running.  Memory is one window's calls, not the session's.
_CAUSES_SQL = """
SELECT pid, tid, timestamp, op::VARCHAR AS op FROM events c
WHERE session_id = $sid AND list_contains($pids, pid) AND timestamp >= $w0 AND timestamp < $w1 AND {cause}
ORDER BY coalesce(duration_ns, 0) DESC, timestamp
"""
_CALLS_SQL = """
SELECT pid, tid, timestamp, duration_ns FROM events
WHERE session_id = $sid AND list_contains($pids, pid) AND list_contains($tids, tid) AND op LIKE 'cu%'
  AND timestamp >= greatest($lo, $t0) AND timestamp < least($w1, $t1)
"""
# The ops of the calls that were paired (a call is named by its thread and start)
_OPS_SQL = """
SELECT pid, tid, timestamp, min(op) FROM events
WHERE session_id = $sid AND list_contains($pids, pid) AND list_contains($tids, tid) AND op LIKE 'cu%'
  AND list_contains($ts, timestamp)
GROUP BY ALL
"""
_LONGEST_CALL_SQL = """
SELECT coalesce(max(duration_ns), 0) FROM events
WHERE session_id = $sid AND list_contains($pids, pid) AND op LIKE 'cu%' AND timestamp >= $t0 AND timestamp < $t1
"""
_LONGEST_SQL = """
SELECT pid, tid, timestamp, op FROM events
WHERE session_id = $sid AND list_contains($pids, pid) AND op LIKE 'cu%'
  AND timestamp >= $w0 AND timestamp < $w1 AND timestamp >= $t0 AND timestamp < $t1
ORDER BY duration_ns DESC, timestamp
LIMIT $n
"""

Key = tuple  # (pid, tid, timestamp, op): one event row


@dataclass
class Arrows:
    """Flow ids by the event they leave from / end at; bounded by MAX_FLOWS_PER_CHAIN per chain."""

    out_of: dict[Key, list[int]] = field(default_factory=dict)  # cause event -> flow ids
    into: dict[Key, list[int]] = field(default_factory=dict)  # effect event -> flow ids
    out_of_marker: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (chain, window)
    per_chain: list[int] = field(default_factory=list)  # arrows drawn per chain
    next_id: int = 1

    def add(self, cause: Key | tuple[int, int], effect: Key, *, marker: bool) -> None:
        fid = self.next_id
        self.next_id += 1
        (self.out_of_marker if marker else self.out_of).setdefault(cause, []).append(fid)
        self.into.setdefault(effect, []).append(fid)
        self.per_chain[-1] += 1


def plan(con: duckdb.DuckDBPyConnection, chains: list[Chain], params: dict) -> Arrows:
    """The arrows of every chain, within the selection described by ``params``."""
    arrows = Arrows()
    for ci, chain in enumerate(chains):
        arrows.per_chain.append(0)
        wins = chain.evidence_windows
        if not wins or not chain.pids:
            continue
        per_window = max(1, MAX_FLOWS_PER_CHAIN // len(wins))
        q = {"sid": params["sid"], "pids": list(chain.pids), "t0": params["t0"], "t1": params["t1"]}
        cause = HOST_CAUSE.get(chain.rule_id)
        if cause is not None:
            longest = int(con.execute(_LONGEST_CALL_SQL, q).fetchone()[0])
            for w in wins:
                left = MAX_FLOWS_PER_CHAIN - arrows.per_chain[-1]
                if left <= 0:
                    break
                wq = {**q, "w0": w.start_ns, "w1": w.end_ns}
                for c, e in _pairs(con, cause, wq, longest, min(per_window, left)):
                    arrows.add(c, e, marker=False)
        if arrows.per_chain[-1]:
            continue
        n = min(MARKER_EFFECTS_PER_WINDOW, per_window)
        for wi, w in enumerate(wins):
            left = MAX_FLOWS_PER_CHAIN - arrows.per_chain[-1]
            if left <= 0:
                break
            for row in con.execute(_LONGEST_SQL, {**q, "w0": w.start_ns, "w1": w.end_ns,
                                                  "n": min(n, left)}).fetchall():
                arrows.add((ci, wi), tuple(row), marker=True)
    return arrows


def _pairs(con: duckdb.DuckDBPyConnection, cause: str, q: dict, longest: int, n: int) -> list[tuple[Key, Key]]:
    """Up to ``n`` (cause, the call it happened inside) of one window, the longest causes first."""
    causes = run(con, _CAUSES_SQL.format(cause=cause), q).fetchnumpy()
    if not len(causes["timestamp"]):
        return []
    # a cause without a tid belongs to no call (the calls are matched by thread)
    cpid = np.asarray(causes["pid"], dtype=np.int64)
    ctid = np.ma.filled(np.ma.asarray(causes["tid"]).astype(np.int64), -1)
    cts = np.asarray(causes["timestamp"], dtype=np.int64)
    tids = sorted(set(ctid[ctid >= 0].tolist()))
    calls = run(con, _CALLS_SQL, {**q, "lo": q["w0"] - longest, "tids": tids}).fetchnumpy()
    if not len(calls["timestamp"]):
        return []
    pid = np.asarray(calls["pid"], dtype=np.int64)
    tid = np.asarray(calls["tid"], dtype=np.int64)
    ts = np.asarray(calls["timestamp"], dtype=np.int64)
    thread = (pid << 32) | (tid & 0xFFFFFFFF)
    srt = np.argsort(ts, kind="stable")  # by (thread, timestamp): two stable sorts of near-sorted runs
    srt = srt[np.argsort(thread[srt], kind="stable")]
    pid, tid, ts, thread = pid[srt], tid[srt], ts[srt], thread[srt]
    end = ts + np.asarray(calls["duration_ns"], dtype=np.int64)[srt]
    # every cause at once: its thread's latest call started at or before it, if still running
    ckey = (cpid << 32) | (ctid & 0xFFFFFFFF)
    lo = np.searchsorted(thread, ckey, "left")
    hi = np.searchsorted(thread, ckey, "right")
    # calls are sorted by (thread, timestamp): the last call of the thread starting at or before the cause
    i = np.empty(len(cts), np.int64)
    for k in np.unique(ckey).tolist():
        sel = np.nonzero(ckey == k)[0]
        a, b = int(lo[sel[0]]), int(hi[sel[0]])
        i[sel] = a + np.searchsorted(ts[a:b], cts[sel], "right") - 1
    ok = (i >= lo) & (end[np.maximum(i, 0)] > cts) & (ctid >= 0)
    chosen = [(j, int(i[j])) for j in np.nonzero(ok)[0][:n].tolist()]
    if not chosen:
        return []
    named = {tuple(r[:3]): r[3] for r in run(con, _OPS_SQL, {
        "sid": q["sid"], "pids": sorted({int(pid[c]) for _, c in chosen}),
        "tids": sorted({int(tid[c]) for _, c in chosen}), "ts": [int(ts[c]) for _, c in chosen]}).fetchall()}
    out: list[tuple[Key, Key]] = []
    for j, c in chosen:
        cause = (int(cpid[j]), int(ctid[j]), int(cts[j]), str(causes["op"][j]))
        call = (int(pid[c]), int(tid[c]), int(ts[c]))
        out.append((cause, (*call, named[call])))
    return out
