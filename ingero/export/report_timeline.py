"""The loop thread's timeline over a short span, for the HTML report: what it was doing, and why not running.

Two lanes over the same span: the thread's CPU state (on CPU, preempted by a
named process, blocked in a named system call, runnable after a wake-up but
waiting for a CPU) and the CUDA call it was inside (launch, copy, sync,
other).  The span is a few steps where the top chain's evidence is (the
middle of its longest run of windows), short enough to read: it shrinks
until it holds at most MAX_ROWS events.  Read from ``events`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from ingero.analyze import procs
from ingero.analyze.model import Report

# Rows a span may hold: ~4 bars per 10 px at 1280 px wide is where bars stop being readable.
MAX_ROWS = 400
# A span of this many median steps (a rhythm is visible at 3), within these bounds (ms).
STEPS_SHOWN = 3
MIN_SPAN_MS, MAX_SPAN_MS, NO_STEPS_SPAN_MS = 5.0, 1000.0, 100.0
# Off-CPU intervals and calls starting this long before the span can still reach into it.
LOOKBACK_NS = 10_000_000_000

_LOOP_SQL = """
SELECT pid, tid, count(*) AS n FROM events
WHERE session_id = $sid AND timestamp >= $t0 AND timestamp < $t1 AND op LIKE 'cu%' AND ($all_pids OR pid = $pid)
GROUP BY ALL ORDER BY n DESC, pid LIMIT 1
"""

_COUNT_SQL = """
SELECT count(*) FROM events
WHERE session_id = $sid AND tid = $tid AND timestamp >= $a - $back AND timestamp < $b
  AND timestamp + duration_ns > $a AND (op = 'sched_switch' OR op LIKE 'cu%' OR op LIKE 'nccl%')
"""

_ROWS_SQL = """
SELECT timestamp, duration_ns, op, kind, preempted, other_pid, coalesce(runq_ns, 0), syscall
FROM events
WHERE session_id = $sid AND tid = $tid AND timestamp >= $a - $back AND timestamp < $b
  AND timestamp + duration_ns > $a AND (op = 'sched_switch' OR op LIKE 'cu%' OR op LIKE 'nccl%')
ORDER BY timestamp
"""

ON_CPU = "on CPU"
RUNNABLE = "runnable, waiting for a CPU"


@dataclass(frozen=True)
class Bar:
    lane: str  # 'CPU' | 'CUDA'
    state: str  # the legend entry: "preempted by cpu-hog (PID 4301)", "in sync", ...
    start_ns: int
    end_ns: int
    detail: str = ""  # the op or system call


@dataclass
class Timeline:
    pid: int
    tid: int
    name: str
    start_ns: int
    end_ns: int
    bars: list[Bar]
    why: str  # why this span: "in the evidence of [HIGH] cpu-contention", ...


def _cuda_state(op: str) -> str:
    low = op.lower()
    if "launch" in low:
        return "in a kernel launch"
    if "memcpy" in low or "memset" in low:
        return "in a copy"
    if "sync" in low:
        return "in a sync (waiting for the device)"
    if low.startswith("nccl"):
        return "in a collective (NCCL)"
    return "in another CUDA call"


def _span(report: Report, pid: int, start_ns: int, end_ns: int, window_ns: int) -> tuple[int, str]:
    """Where the span starts: the middle window of the top chain's longest evidence run on ``pid``."""
    for c in report.chains:
        if c.evidence_windows and (not c.pids or pid in c.pids):
            ws = sorted({w.start_ns for w in c.evidence_windows})
            runs, run = [], [ws[0]]
            for a, b in zip(ws, ws[1:]):
                if b - a <= window_ns:
                    run.append(b)
                else:
                    runs.append(run)
                    run = [b]
            runs.append(run)
            longest = max(runs, key=len)
            return longest[len(longest) // 2], f"in the evidence of [{c.severity}] {c.rule_id}"
    mid = start_ns + (end_ns - start_ns) // 2
    return mid - mid % window_ns if window_ns else mid, "the middle of the range (no chain's evidence)"


def collect(con: duckdb.DuckDBPyConnection, report: Report, params: dict) -> Timeline | None:
    """``params``: the selection's (sid, t0, t1, all_pids, pids) and the window (wns)."""
    pid = report.steps.pid if report.steps is not None and report.steps.pid is not None else 0
    row = con.execute(_LOOP_SQL, {"sid": params["sid"], "t0": params["t0"], "t1": params["t1"],
                                  "all_pids": not pid, "pid": pid}).fetchone()
    if row is None:
        return None
    pid, tid = int(row[0]), int(row[1])
    a, why = _span(report, pid, params["t0"], params["t1"], params["wns"])
    step_ms = report.steps.median_ms if report.steps is not None else None
    span_ms = min(MAX_SPAN_MS, max(MIN_SPAN_MS, STEPS_SHOWN * step_ms)) if step_ms else NO_STEPS_SPAN_MS
    span = int(span_ms * 1e6)
    q = {"sid": params["sid"], "tid": tid, "back": LOOKBACK_NS, "a": a}
    while span > MIN_SPAN_MS * 1e6 and con.execute(_COUNT_SQL, {**q, "b": a + span}).fetchone()[0] > MAX_ROWS:
        span //= 2
    b = min(a + span, params["t1"])
    rows = con.execute(_ROWS_SQL, {**q, "b": b}).fetchall()
    others = sorted({int(r[5]) for r in rows if r[2] == "sched_switch" and r[4] and r[5]})
    names = procs.lookup(con, [pid, *others])
    bars: list[Bar] = []
    off: list[tuple[int, int]] = []
    for ts, dur, op, kind, preempted, other, runq, syscall in rows:
        s, e = max(a, int(ts)), min(b, int(ts) + int(dur))
        if e <= s:
            continue
        if op != "sched_switch":
            bars.append(Bar("CUDA", _cuda_state(op), s, e, op))
            continue
        off.append((s, e))
        if preempted:
            who = names.get(int(other)) if other else None
            state = f"preempted by {who.name} (PID {who.pid})" if who else "preempted"
            bars.append(Bar("CPU", state, s, e))
            continue
        # asleep, then runnable for runq_ns until it ran again
        woke = max(s, min(e, int(ts) + int(dur) - int(runq)))
        what = syscall or ("I/O or a page fault" if kind == "io" else "")
        if woke > s:
            bars.append(Bar("CPU", f"blocked{' in ' + what if what else ''}", s, woke, what))
        if e > woke:
            bars.append(Bar("CPU", RUNNABLE, woke, e))
    # on CPU: the span less its off-CPU intervals
    at = a
    for s, e in sorted(off):
        if s > at:
            bars.append(Bar("CPU", ON_CPU, at, s))
        at = max(at, e)
    if at < b:
        bars.append(Bar("CPU", ON_CPU, at, b))
    name = names[pid].name if pid in names else f"pid {pid}"
    return Timeline(pid, tid, name, a, b, bars, why)
