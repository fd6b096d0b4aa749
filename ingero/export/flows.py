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

from ingero.analyze.model import Chain

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

# Every evidence window of a chain at once ($w0s/$w1s: the windows; $n: arrows per window).
# A cause pairs with the thread's latest CUDA call started at or before it (ASOF: one call
# per cause, the one it happened inside when it ended after the cause).
_WINDOWS_CTE = """
wins AS (SELECT unnest($w0s) AS w0, unnest($w1s) AS w1, generate_subscripts($w0s, 1) AS wi),
calls AS (SELECT pid, tid, timestamp, op, duration_ns FROM events
          WHERE session_id = $sid AND list_contains($pids, pid) AND op LIKE 'cu%'
            AND timestamp >= $t0 AND timestamp < $t1)
"""
_PAIRS_SQL = "WITH " + _WINDOWS_CTE + """,
causes AS (SELECT c.pid, c.tid, c.timestamp, c.op, coalesce(c.duration_ns, 0) AS dur, wins.wi
           FROM events c JOIN wins ON c.timestamp >= wins.w0 AND c.timestamp < wins.w1
           WHERE c.session_id = $sid AND list_contains($pids, c.pid) AND {cause}),
pairs AS (SELECT c.pid, c.tid, c.timestamp, c.op, e.pid AS epid, e.tid AS etid, e.timestamp AS ets, e.op AS eop,
                 c.wi, row_number() OVER (PARTITION BY c.wi ORDER BY c.dur DESC, c.timestamp) AS r
          FROM causes c ASOF JOIN calls e ON c.pid = e.pid AND c.tid = e.tid AND c.timestamp >= e.timestamp
          WHERE c.timestamp < e.timestamp + e.duration_ns)
SELECT pid, tid, timestamp, op, epid, etid, ets, eop, wi FROM pairs WHERE r <= $n ORDER BY wi, r
"""

_LONGEST_SQL = "WITH " + _WINDOWS_CTE + """,
ranked AS (SELECT e.pid, e.tid, e.timestamp, e.op, wins.wi,
                  row_number() OVER (PARTITION BY wins.wi ORDER BY e.duration_ns DESC, e.timestamp) AS r
           FROM calls e JOIN wins ON e.timestamp >= wins.w0 AND e.timestamp < wins.w1)
SELECT pid, tid, timestamp, op, wi FROM ranked WHERE r <= $n ORDER BY wi, r
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
        q = {"sid": params["sid"], "pids": list(chain.pids), "t0": params["t0"], "t1": params["t1"],
             "w0s": [w.start_ns for w in wins], "w1s": [w.end_ns for w in wins]}
        cause = HOST_CAUSE.get(chain.rule_id)
        if cause is not None:
            rows = con.execute(_PAIRS_SQL.format(cause=cause), {**q, "n": per_window}).fetchall()
            for row in rows[:MAX_FLOWS_PER_CHAIN]:  # windows in order, as many as the budget allows
                arrows.add(tuple(row[:4]), tuple(row[4:8]), marker=False)
        if arrows.per_chain[-1]:
            continue
        n = min(MARKER_EFFECTS_PER_WINDOW, per_window)
        rows = con.execute(_LONGEST_SQL, {**q, "n": n}).fetchall()
        for row in rows[:MAX_FLOWS_PER_CHAIN]:
            arrows.add((ci, row[4] - 1), tuple(row[:4]), marker=True)
    return arrows
