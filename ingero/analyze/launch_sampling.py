"""Launch counts from a sampled trace (`ingero trace --overhead-budget`): scaled, and said so.

The ``sampling`` table (schema 12) lists the periods in which the launch
probes were attached for a slice only.  ``scale_launches`` fills in the
launches of the detached parts in ``ing_cuda`` right after it is built and
before anything reads it, so every rule and the evidence see the estimate.

The estimate is a ratio to the calls that are never sampled.  Syncs, copies,
allocations and collectives are traced throughout; a training loop makes a
fixed number of launches per step between them.  Per thread, inside the
attached slices [attached_from_ns, attached_to_ns) (both instants taken by
the tracer's clock, independent of the loop's phase) we count launches L and
those other calls S; in the detached parts the thread's other calls S_out
are counted too, and its launches there are L / S x S_out.  This holds
whatever the probes cost the thread: a slowed loop makes fewer launches in
a slice, and as many fewer syncs.  (Scaling by attached wall time instead
read 16-45% low on a host-bound loop: the traps' own ~6 us a call slow the
loop in a slice, and a CPU-time correction overshot by +18%, the loop's
spin-wait absorbing the traps.)  A window uses its own slices' ratio when
they hold at least MIN_ANCHORS of the other calls, else the thread's ratio
over the analysed range; a thread with none of them in any slice is scaled by
attached wall time (the old estimate, the only one left).  A window whose
launches were never attached keeps its rows: no estimate is made from
nothing.  A launch's duration percentiles come from the attached slices
alone (the rows there are whole).
"""

from __future__ import annotations

import duckdb
import numpy as np

from ingero.analyze.context import Context
from ingero.events import ops
from ingero.events.ops import OP_NAMES
from ingero.store.db import named_params
from ingero.store.selection import Selection

SAMPLING_SQL = """
SELECT from_ns, to_ns, attached_from_ns, attached_to_ns
FROM sampling
WHERE session_id = $sid AND to_ns > $t0 AND from_ns < $t1
ORDER BY from_ns
"""


def periods(ctx: Context) -> np.ndarray:
    """The sampled periods in ctx's range: (from_ns, to_ns, attached_from_ns, attached_to_ns) rows."""
    try:
        rows = ctx.con.execute(SAMPLING_SQL, {"sid": ctx.session_id, "t0": ctx.start_ns, "t1": ctx.end_ns}).fetchall()
    except Exception:  # duckdb.CatalogException: a store older than schema 12 has no sampling table
        return np.empty((0, 4), dtype=np.int64)
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def detached_parts(rows: np.ndarray) -> list[tuple[int, int]]:
    """The [lo, hi) spans in which the sampled probes were detached, in time order: each
    period's part before its slice and the part after it."""
    return sorted((int(lo), int(hi)) for f, t, a0, a1 in rows for lo, hi in ((f, a0), (a1, t)) if hi > lo)


def detached_ns_per_window(rows: np.ndarray, start_ns: int, window_ns: int, n_windows: int) -> np.ndarray:
    """Per window, how long the sampled probes were detached in it (ns)."""
    out = np.zeros(n_windows, dtype=np.float64)
    for lo, hi in detached_parts(rows):
        w0 = max(0, (lo - start_ns) // window_ns)
        w1 = min(n_windows - 1, (hi - 1 - start_ns) // window_ns)
        for w in range(int(w0), int(w1) + 1):
            ws = start_ns + w * window_ns
            out[w] += max(0, min(hi, ws + window_ns) - max(lo, ws))
    return out


def attached_ns_per_window(ctx: Context) -> dict[int, float]:
    """window -> attached ns, for the windows that were sampled."""
    rows = periods(ctx)
    if not len(rows):
        return {}
    detached = detached_ns_per_window(rows, ctx.start_ns, ctx.window_ns, ctx.n_windows)
    return {w: ctx.window_ns - d for w, d in enumerate(detached) if d > 0 and ctx.window_ns - d > 0}


def call_cost_ns(ctx: Context) -> float:
    """The calibrated cost of one traced call (sampling.call_cost_ns; 0 when not recorded)."""
    try:
        v = ctx.con.execute("SELECT avg(call_cost_ns) FROM sampling WHERE session_id = $sid",
                            {"sid": ctx.session_id}).fetchone()[0]
    except Exception:  # a store without the column
        return 0.0
    return float(v or 0.0)


# the calls traced throughout that a launch is counted against (every CUDA and NCCL call but the launches)
ANCHOR_OPS = sorted(OP_NAMES[o] for o in ops.CUDA_OPS | ops.NCCL_OPS if OP_NAMES[o] not in ops.LAUNCH_OPS)
# a window's own slices give its ratio from this many other calls up; below, the thread's ratio
# over the range (at 10 steps a slice and 2 such calls a step the window ratio errs by ~5%)
MIN_ANCHORS = 20

COUNTS_SQL = f"""
WITH p AS (
    SELECT from_ns, to_ns, attached_from_ns AS a0, attached_to_ns AS a1
    FROM sampling WHERE session_id = $sid AND to_ns > $t0 AND from_ns < $t1
)
SELECT e.pid, e.tid, (e.timestamp - $t0) // $wns AS w,
       (e.timestamp >= p.a0 AND e.timestamp < p.a1) AS inside,
       list_contains($launch_ops, e.op::VARCHAR) AS launch, count(*) AS n
FROM events e JOIN p ON e.timestamp >= p.from_ns AND e.timestamp < p.to_ns
WHERE {Selection.where("e")}
  AND (list_contains($launch_ops, e.op::VARCHAR) OR list_contains($anchor_ops, e.op::VARCHAR))
GROUP BY ALL
"""


def launch_additions(counts: list[tuple[int, int, int, bool, bool, int]],
                     min_anchors: int = MIN_ANCHORS) -> tuple[dict[tuple[int, int, int], float], set[int]]:
    """From (pid, tid, window, inside a slice, is a launch, rows) of the sampled periods:
    ({(pid, tid, window): launches to add}, the tids with no other call in any slice).

    A window's addition is ratio x its other calls in detached parts, less the launch rows
    it holds there (rows of the attach / detach edges: the estimate stands for them)."""
    per_w: dict[tuple[int, int, int], list[int]] = {}  # -> [L in, S in, L out, S out]
    per_t: dict[int, list[int]] = {}  # tid -> [L in, S in]
    for pid, tid, w, inside, launch, n in counts:
        c = per_w.setdefault((pid, tid, w), [0, 0, 0, 0])
        c[(0 if inside else 2) + (0 if launch else 1)] += n
        if inside:
            t = per_t.setdefault(tid, [0, 0])
            t[0 if launch else 1] += n
    no_anchor = {tid for tid, (_, s_in) in per_t.items() if s_in == 0}
    no_anchor |= {k[1] for k in per_w if k[1] not in per_t}
    out: dict[tuple[int, int, int], float] = {}
    for (pid, tid, w), (l_in, s_in, l_out, s_out) in per_w.items():
        if tid in no_anchor:
            continue
        if s_in >= min_anchors:
            ratio = l_in / s_in
        else:
            ratio = per_t[tid][0] / per_t[tid][1]
        add = ratio * s_out - l_out
        if add:
            out[(pid, tid, w)] = add
    return out, no_anchor


def scale_launches(ctx: Context) -> None:
    """Fill in ing_cuda's launches of the detached parts of sampled windows (count and host time)."""
    attached = attached_ns_per_window(ctx)
    if not attached:
        return
    counts = ctx.con.execute(COUNTS_SQL, ctx.params(launch_ops=list(ops.LAUNCH_OPS), anchor_ops=ANCHOR_OPS)).fetchall()
    adds, no_anchor = launch_additions(counts)
    if adds:
        keys = list(adds)
        ctx.con.execute("CREATE OR REPLACE TEMP TABLE ing_sample_add AS SELECT unnest($p) AS pid, unnest($t) AS tid, "
                        "unnest($w) AS w, unnest($a) AS add",
                        {"p": [k[0] for k in keys], "t": [k[1] for k in keys], "w": [k[2] for k in keys],
                         "a": [adds[k] for k in keys]})
        ctx.con.execute("""
            UPDATE ing_cuda
            SET n = greatest(round(ing_cuda.n + a.add), 0)::BIGINT,
                dur_ns = ing_cuda.dur_ns * greatest(ing_cuda.n + a.add, 0) / ing_cuda.n
            FROM ing_sample_add a
            WHERE ing_cuda.cat = 'launch' AND ing_cuda.tid = a.tid AND ing_cuda.w = a.w AND ing_cuda.n > 0
        """)
        # a window whose slice fell outside it: its launches, at the thread's op and mean host time
        ctx.con.execute("""
            INSERT INTO ing_cuda
            SELECT a.pid, a.tid, a.w, t.op, 'launch', '', round(a.add)::BIGINT, a.add * t.mean_ns,
                   NULL, 0, 0
            FROM ing_sample_add a
            JOIN (SELECT tid, any_value(op) AS op, sum(dur_ns) / sum(n) AS mean_ns FROM ing_cuda
                  WHERE cat = 'launch' AND n > 0 GROUP BY tid) t ON t.tid = a.tid
            WHERE round(a.add) >= 1 AND NOT EXISTS (
                SELECT 1 FROM ing_cuda c WHERE c.cat = 'launch' AND c.tid = a.tid AND c.w = a.w AND c.n > 0)
        """)
    if no_anchor:
        _scale_by_wall(ctx, attached, sorted(no_anchor))


def _scale_by_wall(ctx: Context, attached: dict[int, float], tids: list[int]) -> None:
    """The fallback: a thread's launches scaled by window / attached time, less the probes' own time
    in the slice (n x call_cost_ns): its rate without the probes is n / (attached - n x cost)."""
    cost = call_cost_ns(ctx)
    ctx.con.execute("CREATE OR REPLACE TEMP TABLE ing_sample_f AS SELECT unnest($w) AS w, unnest($a) AS att",
                    {"w": list(attached), "a": list(attached.values())})
    ctx.con.execute("""
        UPDATE ing_cuda
        SET n = round(ing_cuda.n * $wns / greatest(s.att - ing_cuda.n * $cost, 0.1 * s.att))::BIGINT,
            dur_ns = ing_cuda.dur_ns * $wns / greatest(s.att - ing_cuda.n * $cost, 0.1 * s.att)
        FROM ing_sample_f s
        WHERE ing_cuda.cat = 'launch' AND ing_cuda.w = s.w AND list_contains($tids, ing_cuda.tid)
    """, {"wns": ctx.window_ns, "cost": cost, "tids": tids})


def note(ctx: Context) -> str | None:
    """'launch rate estimated from a 12% sample (...)' when any of the analysed span was sampled."""
    rows = periods(ctx)
    if not len(rows):
        return None
    lo = np.maximum(rows[:, 0], ctx.start_ns)
    hi = np.minimum(rows[:, 1], ctx.end_ns)
    span = float(np.clip(hi - lo, 0, None).sum())
    att = float(np.clip(np.minimum(rows[:, 3], hi) - np.maximum(rows[:, 2], lo), 0, None).sum())
    if span <= 0:
        return None
    pct = 100.0 * att / span
    return (f"launch counts and rates estimated from a {pct:.0f}% sample over {span / 1e9:.0f} s "
            f"(`--overhead-budget`: launch probes attached for a slice of each second, launches counted "
            f"against the thread's syncs and copies there); "
            f"syncs, copies and host events were traced in full")


# ---- counted switches (the switch_counts table, schema 16) -------------------------------------
#
# Over budget, the off-CPU intervals of threads that had made no CUDA call are counted per
# thread, harvest second and kind instead of stored (collect/budget.py).  They are added to
# ing_sched as the rows they stand for would have been: the thread, the window, the kind,
# outside any CUDA call, no successor (other_pid 0: ing_preempt, built before, names only
# stored successors).  A harvest interval spread over windows is split in proportion to its
# overlap with each (intervals are not timed one by one: off-CPU time spilling into the next
# window is not split off either).

SWITCH_COUNTS_SQL = """
WITH c AS (
    SELECT row_number() OVER () AS r, pid, tid, kind, switches, off_cpu_ns, runq_ns,
           greatest(timestamp - interval_ns, $t0) AS lo, least(timestamp, $t1) AS hi, interval_ns AS span
    FROM switch_counts
    WHERE session_id = $sid AND timestamp > $t0 AND timestamp - interval_ns < $t1
      AND ($all_pids OR list_contains($pids, pid))
), s AS (
    SELECT c.*, unnest(range((lo - $t0) // $wns, (hi - 1 - $t0) // $wns + 1)) AS w FROM c WHERE hi > lo
), f AS (
    SELECT *, (least(hi, $t0 + (w + 1) * $wns) - greatest(lo, $t0 + w * $wns))::DOUBLE / greatest(span, 1) AS f
    FROM s
), g AS (
    SELECT *, sum(f) OVER (PARTITION BY r ORDER BY w) AS cf FROM f
)
-- counts split by their cumulative share, rounded: a row's windows hold its count exactly
SELECT pid, tid, w, kind, 'none' AS inside, false AS queued, 0 AS other_pid,
       sum(round(cf * switches) - round((cf - f) * switches))::BIGINT AS n, sum(off_cpu_ns * f) AS off_ns,
       sum(runq_ns * f) AS runq_ns, sum(off_cpu_ns * f) AS dur_ns
FROM g GROUP BY pid, tid, w, kind
"""


def add_switch_counts(ctx: Context) -> None:
    """The counted off-CPU intervals of the range into ing_sched (nothing for a store without them)."""
    try:
        ctx.con.execute(f"INSERT INTO ing_sched BY NAME {SWITCH_COUNTS_SQL}", ctx.params()).fetchall()
    except duckdb.CatalogException:  # a store older than schema 16 has no switch_counts table
        pass


COUNTED_NOTE_SQL = """
SELECT coalesce(sum(switches), 0), count(DISTINCT tid)
FROM switch_counts WHERE session_id = $sid AND timestamp > $t0 AND timestamp - interval_ns < $t1
                    AND ($all_pids OR list_contains($pids, pid))
"""


def counted_note(ctx: Context) -> str | None:
    """'1,234 off-CPU intervals of 2 threads ... counted' when any of the range's were."""
    try:
        # fetchall: explain's last query must leave no unfinished result on the connection
        (n, threads), = ctx.con.execute(COUNTED_NOTE_SQL, named_params(COUNTED_NOTE_SQL, ctx.params())).fetchall()
    except duckdb.CatalogException:
        return None
    if not n:
        return None
    return (f"{n:,} off-CPU intervals of {threads} thread(s) that made no CUDA call were counted per second, "
            f"not stored one by one (`--overhead-budget`: table switch_counts); they are in the off-CPU totals, "
            f"without who ran instead, the system call or the waker")
