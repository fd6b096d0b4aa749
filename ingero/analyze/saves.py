"""The loop's own saves: the CPU side of a checkpoint written on the loop thread (issue 37).

A checkpoint saved inside the step (torch.save, then os.fsync) costs the step
twice: the fsync blocks on the disk (waits.py names that: via_call 'fsync'),
and before it the write() calls copy the state into the page cache, which is
CPU time outside every CUDA call with the device idle -- the same trace as a
loop building its batch inline.  What tells them apart is the step: the
loop's gap between two CUDA calls that contains a flush wait of its own
(FLUSH_CALLS, outside calls) is a save.  Its on-CPU time is the save's, less
what the loop's ordinary between-step gaps take (_GAPS_SQL: the step's own
host work, still host-bound's).

Output: the TEMP table ``ing_save`` (pid, tid, w, cpu_ns, n): per loop thread
and window, the saves' on-CPU time beyond the ordinary gap, and how many
save gaps it came from (fractional where one spans windows).  host-bound
takes cpu_ns out of its host work; io-stall counts it with the flush.
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

from ingero.analyze.context import Context
from ingero.analyze.procs import has_column
from ingero.analyze.waits import FLUSH_CALLS
from ingero.events.ops import CUDA_OP_NAMES, DRAINING_OPS
from ingero.store.selection import Selection

# Each loop thread's CUDA-free gaps that hold a flush wait of its own, and the ordinary gap of
# those that hold none: the median after a draining call (the between-step gap of a loop that
# syncs), else, in a loop that never syncs and flushes in at most 1% of its gaps, the 99th
# percentile of all (its longest ordinary gaps).  A loop that flushes in (nearly) every step
# (a log fsync'd each step) has no ordinary gap to tell its saves from its host work: none
# are counted.
_GAPS_SQL = f"""
WITH c AS (
    SELECT e.pid, e.tid, e.op, e.timestamp AS s, e.timestamp + coalesce(e.duration_ns, 0) AS e
    FROM events e JOIN ing_loop l ON e.pid = l.pid AND e.tid = l.tid
    WHERE {Selection.where("e", pids=False)} AND list_contains($cuda_ops, e.op)
), g AS (
    SELECT pid, tid, op, e AS g0, lead(s) OVER (PARTITION BY tid ORDER BY s) AS g1 FROM c
), f AS (
    SELECT e.tid, e.timestamp AS ts
    FROM events e JOIN ing_loop l ON e.pid = l.pid AND e.tid = l.tid
    WHERE {Selection.where("e", pids=False)} AND e.op = 'sched_switch' AND NOT e.preempted
      AND e.in_call IS NULL AND list_contains($flush, e.syscall)
), fg AS (
    SELECT g.pid, g.tid, g.g0, g.g1, count(*) AS flushes
    FROM f ASOF JOIN g ON f.tid = g.tid AND f.ts >= g.g0
    WHERE g.g1 IS NOT NULL AND f.ts < g.g1
    GROUP BY ALL
), base AS (
    SELECT g.tid,
           CASE WHEN count(*) FILTER (drain AND fg.g0 IS NULL) >= 3
                THEN median(g.g1 - g.g0) FILTER (drain AND fg.g0 IS NULL)
                WHEN count(*) FILTER (drain) = 0 AND count(fg.g0) * 100 <= count(*)
                THEN quantile_cont(g.g1 - g.g0, 0.99) FILTER (fg.g0 IS NULL) END AS ordinary_ns
    FROM (SELECT *, list_contains($draining, op) AS drain FROM g) g
    LEFT JOIN fg ON g.tid = fg.tid AND g.g0 = fg.g0
    WHERE g.g1 IS NOT NULL
    GROUP BY g.tid
)
SELECT fg.pid, fg.tid, fg.g0, fg.g1, base.ordinary_ns FROM fg JOIN base USING (tid)
WHERE base.ordinary_ns IS NOT NULL
ORDER BY fg.tid, fg.g0
"""

# Whether a loop thread waited in a flush of its own at all (most loops never do: then the
# gaps, a window over every CUDA call of the loop, are not computed).
_ANY_FLUSH_SQL = f"""
SELECT 1 FROM events e JOIN ing_loop l ON e.pid = l.pid AND e.tid = l.tid
WHERE {Selection.where("e", pids=False)} AND e.op = 'sched_switch' AND NOT e.preempted
  AND e.in_call IS NULL AND list_contains($flush, e.syscall)
LIMIT 1
"""

# The loop thread's off-CPU intervals overlapping the save gaps.
_OFF_SQL = """
SELECT e.tid, g.g0, e.timestamp, e.timestamp + coalesce(e.duration_ns, 0)
FROM events e JOIN _ing_save_gaps g ON e.tid = g.tid AND e.timestamp < g.g1
     AND e.timestamp + coalesce(e.duration_ns, 0) > g.g0
WHERE e.session_id = $sid AND e.op = 'sched_switch'
"""

SAVE_SCHEMA = pa.schema([("pid", pa.int32()), ("tid", pa.int32()), ("w", pa.int64()),
                         ("cpu_ns", pa.float64()), ("n", pa.float64())])


def on_cpu_by_window(g0: int, g1: int, off: list[tuple[int, int]], t0: int, wns: int) -> dict[int, float]:
    """The on-CPU time of the gap [g0, g1) by window: the gap less its off-CPU intervals
    (one thread's, so they never overlap each other)."""
    out: dict[int, float] = defaultdict(float)
    cursor = g0
    for a, b in sorted(off) + [(g1, g1)]:
        a, b = max(a, g0), min(b, g1)
        s = cursor
        while s < a:  # on CPU from the cursor to the next off-CPU interval
            w = (s - t0) // wns
            e = min(a, t0 + (w + 1) * wns)
            out[w] += e - s
            s = e
        cursor = max(cursor, b)
    return dict(out)


def build(ctx: Context) -> None:
    """Create ing_save (the module docstring)."""
    con = ctx.con
    p = {"sid": ctx.session_id, "t0": ctx.start_ns, "t1": ctx.end_ns}
    # a store from before schema 15 has no syscall column: no flush is known, no save counted
    known = has_column(con, "events", "syscall") and has_column(con, "events", "in_call")
    params = {**p, "cuda_ops": list(CUDA_OP_NAMES), "flush": sorted(FLUSH_CALLS), "draining": sorted(DRAINING_OPS)}
    flushed = known and con.execute(_ANY_FLUSH_SQL, {**p, "flush": params["flush"]}).fetchone() is not None
    gaps = con.execute(_GAPS_SQL, params).fetchall() if flushed else []
    rows: list[dict] = []
    if gaps:
        con.register("_ing_save_gaps", pa.table({"tid": [int(g[1]) for g in gaps], "g0": [int(g[2]) for g in gaps],
                                                 "g1": [int(g[3]) for g in gaps]}))
        try:
            off: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
            for tid, g0, a, b in con.execute(_OFF_SQL, {"sid": ctx.session_id}).fetchall():
                off[(int(tid), int(g0))].append((int(a), int(b)))
        finally:
            con.unregister("_ing_save_gaps")
        acc: dict[tuple[int, int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for pid, tid, g0, g1, ordinary in gaps:
            by_w = on_cpu_by_window(int(g0), int(g1), off[(int(tid), int(g0))], ctx.start_ns, ctx.window_ns)
            cpu = sum(by_w.values())
            excess = cpu - float(ordinary)
            if excess <= 0:
                continue
            for w, ns in by_w.items():
                a = acc[(int(pid), int(tid), w)]
                a[0] += ns * excess / cpu
                a[1] += ns / cpu
        rows = [{"pid": k[0], "tid": k[1], "w": k[2], "cpu_ns": v[0], "n": v[1]} for k, v in acc.items()]
    con.register("_ing_save", pa.Table.from_pylist(rows, schema=SAVE_SCHEMA))
    con.execute("CREATE OR REPLACE TEMP TABLE ing_save AS SELECT * FROM _ing_save")
    con.unregister("_ing_save")


def by_window(con, pid: int) -> dict[int, tuple[float, float]]:
    """The saves of ``pid`` per window (ing_save): (their on-CPU ns, how many)."""
    return {int(w): (float(ns), float(n)) for w, ns, n in con.execute(
        "SELECT w, sum(cpu_ns), sum(n) FROM ing_save WHERE pid = $pid GROUP BY w", {"pid": pid}).fetchall()}


def cpu_ns_by_window(con, pid: int) -> dict[int, float]:
    """The saves' on-CPU time of ``pid`` per window."""
    return {w: ns for w, (ns, _) in by_window(con, pid).items()}
