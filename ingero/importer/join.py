"""Attach a profiler trace to the session `ingero trace` recorded of the same process.

Both recorded the process's CUDA calls: Kineto with its own clock, the tracer
with the host's.  The clocks are aligned by matching those calls: same thread
id, same op, in the same order.  For each thread, the trace's first ANCHOR ops
are looked up as a run of the traced session's ops; each place they occur
gives a candidate offset (median of the anchor's differences); every call of
the thread is then matched in order to the traced call of the same op nearest
its shifted time (within TOLERANCE_NS).  A training loop repeats its op
sequence every step, so shifts by whole steps match nearly as many calls:
among the candidates matching at least 90% as many as the best, the one
leaving the smallest median residual wins (per µs; then the smallest shift,
since both clocks are the host's wall clock).  The offset is the median difference of all
matched calls, and the residual is the median distance left after applying it.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import duckdb

from ingero.events.ops import CUDA_OP_NAMES

ANCHOR = 16  # ops of the trace's thread looked up as a run in the traced thread
MAX_CANDIDATES = 64  # places an anchor is tried at
TOLERANCE_NS = 20_000_000  # a call matches a traced call this close to its shifted time (a preempted
# thread can take ms between the profiler's timestamp and the call; order keeps the pairs right)
IN_ORDER_NS = 1_000_000  # after a match, a call's traced partner is the next of its op no earlier than this
MAX_SKEW_NS = 600 * 10**9  # sessions whose calls are further than this from the trace's are not tried
MIN_MATCHED = 0.5  # share of the trace's calls that must match for the sessions to be joined

Calls = list[tuple[int, str]]  # (start ns, op), in time order


@dataclass
class Alignment:
    session_id: int
    pid: int
    offset_ns: int  # added to the trace's times to put them on the traced session's clock
    matched: int
    trace_calls: int
    residual_median_ns: int
    pairs: list[tuple[int, int, int]] = field(default_factory=list, repr=False)  # (tid, trace ns, traced ns)


def _by_tid(rows: list[tuple[int, int, str]]) -> dict[int, Calls]:
    out: dict[int, Calls] = defaultdict(list)
    for tid, ts, op in rows:
        out[tid].append((ts, op))
    return out


def _anchor_offsets(a: Calls, b: Calls) -> list[int]:
    """Candidate offsets: where the first ops of ``a`` occur as a run in ``b``."""
    k = min(ANCHOR, len(a))
    ops = [op for _, op in a[:k]]
    b_ops = [op for _, op in b]
    out = []
    for p in range(len(b) - k + 1):
        if b_ops[p] == ops[0] and b_ops[p:p + k] == ops:
            out.append(int(statistics.median(b[p + i][0] - a[i][0] for i in range(k))))
            if len(out) >= MAX_CANDIDATES:
                break
    return out


def _match(a: Calls, b: Calls, offset: int) -> list[tuple[int, int]]:
    """In-order matching of ``a`` (shifted by offset) to ``b``: (a ns, b ns) of each matched call.

    The first call takes the traced call of its op nearest its shifted time; each next one the
    first traced call of its op after the last match and no more than IN_ORDER_NS before its
    shifted time.  Both recorded the same calls in the same order, and two calls a µs apart
    (a run of copies) can sit closer than the clocks' jitter, where the nearest would pair them
    crosswise.
    """
    b_ts = [ts for ts, _ in b]
    pairs: list[tuple[int, int]] = []
    j = 0
    for ts, op in a:
        want = ts + offset
        lo = want - (IN_ORDER_NS if pairs else TOLERANCE_NS)
        k = max(j, bisect.bisect_left(b_ts, lo, lo=j))
        best = None
        while k < len(b) and b[k][0] <= want + TOLERANCE_NS:
            if b[k][1] == op:
                if pairs:
                    best = k
                    break
                if best is None or abs(b[k][0] - want) < abs(b[best][0] - want):
                    best = k
                elif b[k][0] > want:
                    break
            k += 1
        if best is not None:
            pairs.append((ts, b[best][0]))
            j = best + 1
    return pairs


def _align_threads(trace: dict[int, Calls], traced: dict[int, Calls]) -> tuple[int, list[tuple[int, int, int]]]:
    """Best offset over all threads and the matched (tid, trace ns, traced ns)."""
    candidates: set[int] = set()
    for tid, a in trace.items():
        if tid in traced:
            candidates.update(_anchor_offsets(a, traced[tid]))
    scored = []
    for off in candidates:
        pairs = [(tid, x, y) for tid, a in trace.items() if tid in traced for x, y in _match(a, traced[tid], off)]
        if pairs:
            residual = statistics.median(abs(y - x - off) for _, x, y in pairs)
            scored.append((len(pairs), residual, off, pairs))
    if not scored:
        return 0, []
    best = max(s[0] for s in scored)
    # a loop's calls also match, loosely, a whole number of steps away: the gaps between its
    # calls are not the same every step, so the true shift leaves the smallest residual
    _, _, off, pairs = min((s for s in scored if s[0] >= 0.9 * best), key=lambda s: (round(s[1] / 1000), abs(s[2])))
    # refine: the median over every matched call, then match once more with it
    off = int(statistics.median(y - x for _, x, y in pairs))
    pairs = [(tid, x, y) for tid, a in trace.items() if tid in traced for x, y in _match(a, traced[tid], off)]
    return off, pairs


def align(con: duckdb.DuckDBPyConnection, pids: list[int] | None = None) -> Alignment | None:
    """The traced session (not imported) whose calls of one of the trace's processes match the staged
    trace's, or None.  The trace's calls come into Python only for a process that a traced session
    recorded in the trace's time range (a plain import holds none of them: its memory does not grow
    with the trace); ``pids`` is not needed (kept for callers)."""
    lo, hi = con.execute("SELECT min(start_ns), max(start_ns) FROM _imp_use WHERE use = 'call'").fetchone()
    if lo is None:
        return None
    lo, hi = lo - MAX_SKEW_NS, hi + MAX_SKEW_NS
    candidates = con.execute(
        """SELECT e.session_id, e.pid, count(*) AS n FROM events e JOIN sessions s USING (session_id)
           WHERE s.imported_from IS NULL AND e.pid IN (SELECT DISTINCT pid FROM _imp_use WHERE use = 'call')
             AND list_contains($ops, e.op) AND e.timestamp BETWEEN $lo AND $hi
           GROUP BY ALL ORDER BY n DESC, e.session_id DESC""",
        {"ops": list(CUDA_OP_NAMES), "lo": lo, "hi": hi}).fetchall()
    for session_id, pid, _ in candidates:
        trace = _by_tid(con.execute("""SELECT tid, start_ns, op FROM _imp_use WHERE use = 'call' AND pid = $pid
                                       ORDER BY tid, start_ns""", {"pid": pid}).fetchall())
        traced = _by_tid(con.execute(
            """SELECT tid, timestamp, op FROM events WHERE session_id = $sid AND pid = $pid
                 AND list_contains($ops, op) AND timestamp BETWEEN $lo AND $hi ORDER BY tid, timestamp""",
            {"sid": session_id, "pid": pid, "ops": list(CUDA_OP_NAMES), "lo": lo, "hi": hi}).fetchall())
        offset, pairs = _align_threads(trace, traced)
        total = sum(len(a) for a in trace.values())
        if pairs and len(pairs) >= MIN_MATCHED * total:
            residual = int(statistics.median(abs(y - (x + offset)) for _, x, y in pairs))
            return Alignment(session_id, pid, offset, len(pairs), total, residual, pairs)
    return None
