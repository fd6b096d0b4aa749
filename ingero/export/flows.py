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

_PAIRS_SQL = """
SELECT c.pid, c.tid, c.timestamp, c.op, e.pid, e.tid, e.timestamp, e.op
FROM events c JOIN events e
  ON e.session_id = c.session_id AND e.pid = c.pid AND e.tid = c.tid AND e.op LIKE 'cu%'
 AND c.timestamp >= e.timestamp AND c.timestamp < e.timestamp + e.duration_ns
WHERE c.session_id = $sid AND list_contains($pids, c.pid)
  AND c.timestamp >= $w0 AND c.timestamp < $w1 AND e.timestamp >= $t0 AND e.timestamp < $t1 AND {cause}
  AND e.session_id = $sid AND e.timestamp < $w1 AND e.timestamp + e.duration_ns > $w0  -- cuts e before the join
ORDER BY coalesce(c.duration_ns, 0) DESC, c.timestamp
LIMIT $n
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
            sql = _PAIRS_SQL.format(cause=cause)
            for w in wins:
                left = MAX_FLOWS_PER_CHAIN - arrows.per_chain[-1]
                if left <= 0:
                    break
                for row in con.execute(sql, {**q, "w0": w.start_ns, "w1": w.end_ns,
                                             "n": min(per_window, left)}).fetchall():
                    arrows.add(tuple(row[:4]), tuple(row[4:]), marker=False)
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
