"""What the HTML report charts: per traced process and window, aggregated in DuckDB.

Never raw events: a few numbers per window and process, so a 10 M-event
session still makes a small page.  The windows are explain's (whole seconds,
``resolve(align=True)``), so a window here is the window a chain's evidence
names; the per-step breakdown reads the window tables explain left on the
connection (``collect`` runs after ``explain`` on the same one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from ingero.analyze import traced_steps
from ingero.analyze.context import Options, resolve
from ingero.analyze.model import StepStats
from ingero.export.selection import WHERE, run
from ingero.store.selection import Selection
from ingero.store.sessions import latest_session

# Per window and traced process (a process with CUDA calls): call rate and latency
# percentiles by family, in ms.
_CUDA_SQL = f"""
SELECT pid, (timestamp - $t0) // $wns AS w, count(*) / ($wns / 1e9) AS ops_s,
       quantile_cont(duration_ns, 0.5) FILTER (op ILIKE '%sync%') / 1e6 AS sync_p50,
       quantile_cont(duration_ns, 0.99) FILTER (op ILIKE '%sync%') / 1e6 AS sync_p99,
       quantile_cont(duration_ns, 0.5) FILTER (op ILIKE '%memcpy%') / 1e6 AS copy_p50,
       quantile_cont(duration_ns, 0.99) FILTER (op ILIKE '%memcpy%') / 1e6 AS copy_p99,
       quantile_cont(duration_ns, 0.5) FILTER (op ILIKE '%launch%') / 1e6 AS launch_p50,
       quantile_cont(duration_ns, 0.99) FILTER (op ILIKE '%launch%') / 1e6 AS launch_p99
FROM events WHERE {WHERE} AND op LIKE 'cu%'
GROUP BY ALL ORDER BY pid, w
"""

# The loop thread (the thread of a process with the most CUDA calls): share of each
# window it spent off the CPU, preempted versus blocked.
_WAIT_SQL = f"""
WITH loops AS (
    SELECT pid, arg_max(tid, n) AS tid FROM (
        SELECT pid, tid, count(*) AS n FROM events WHERE {WHERE} AND op LIKE 'cu%' GROUP BY ALL)
    GROUP BY pid)
SELECT e.pid, (e.timestamp - $t0) // $wns AS w,
       least(1.0, coalesce(sum(e.duration_ns) FILTER (e.preempted), 0) / $wns) AS preempted,
       least(1.0, coalesce(sum(e.duration_ns) FILTER (NOT e.preempted), 0) / $wns) AS blocked
FROM events e JOIN loops USING (pid, tid)
WHERE {Selection.where("e", pids=False)} AND e.op = 'sched_switch'
GROUP BY ALL ORDER BY e.pid, w
"""

# Faults and block I/O of a traced process and its children (DataLoader workers).
_HOST_SQL = f"""
WITH fam AS (
    SELECT DISTINCT pid AS pid, pid AS owner FROM events WHERE {WHERE} AND op LIKE 'cu%'
    UNION
    SELECT n.pid, n.ppid FROM process_names n
    WHERE n.ppid IN (SELECT pid FROM events WHERE {WHERE} AND op LIKE 'cu%'))
SELECT fam.owner, (e.timestamp - $t0) // $wns AS w,
       count(*) FILTER (e.op = 'page_fault') / ($wns / 1e9) AS faults_s,
       quantile_cont(e.duration_ns, 0.99) FILTER (e.op = 'block_io') / 1e6 AS bio_p99
FROM events e JOIN fam USING (pid)
WHERE {Selection.where("e", pids=False)}
  AND e.op IN ('page_fault', 'block_io')
GROUP BY ALL ORDER BY fam.owner, w
"""

_RSS_SQL = f"""
SELECT pid, (timestamp - $t0) // $wns AS w, max(rss_bytes) / 1e6 AS rss_mb
FROM process_memory WHERE {Selection.where(pids=False)}
  AND pid IN (SELECT pid FROM events WHERE {WHERE} AND op LIKE 'cu%')
GROUP BY ALL ORDER BY pid, w
"""

_GPU_SQL = f"""
SELECT 0 AS pid, (timestamp - $t0) // $wns AS w, avg(util_pct) AS gpu_util
FROM gpu_metrics WHERE {Selection.where(pids=False)}
GROUP BY ALL ORDER BY w
"""

_NAMES_SQL = "SELECT pid, any_value(name) FROM process_names GROUP BY pid"


@dataclass
class Series:
    """One process' charts: metric -> values per window (None where nothing was recorded)."""

    pid: int
    name: str
    metrics: dict[str, list[float | None]] = field(default_factory=dict)


# The loop thread's drains (syncs, synchronous copies) per window: the rhythm's steps end at
# every p-th of them, so a window's share of the range's drains is its share of the steps.
_DRAINS_SQL = f"""
SELECT (timestamp - $t0) // $wns AS w, count(*) AS n FROM events
WHERE {WHERE} AND pid = $pid AND tid = $tid AND (op ILIKE '%sync%' OR (op ILIKE '%memcpy%' AND op NOT ILIKE '%async%'))
GROUP BY ALL
"""

# Marked steps (NVTX ranges of the marker's family, a profiler trace's ProfilerStep#N) by the
# window they start in.
_MARKS_SQL = """
SELECT (start_ns - $t0) // $wns AS w, count(*) AS n FROM spans
WHERE session_id = $sid AND start_ns >= $t0 AND start_ns < $t1 AND pid = $pid
  AND trim(regexp_replace(name, '[0-9]+', '#', 'g')) = $family
GROUP BY ALL
"""

_LOOP_SQL = f"""
SELECT arg_max(tid, n) FROM (SELECT tid, count(*) AS n FROM events WHERE {WHERE} AND pid = $pid AND op LIKE 'cu%'
                             GROUP BY tid)
"""


@dataclass
class StepWindows:
    """The loop's step (or request) per window: ms per step by part (traced_steps.PARTS), from the
    loop thread's time in the window over the steps it held; None where it held none."""

    pid: int
    tid: int
    unit: str  # 'step' | 'request'
    parts_ms: dict[str, list[float | None]]
    steps: list[float | None]  # steps (or requests) per window


@dataclass
class Session:
    """What the page's header says about the run."""

    session_id: int
    command: str
    hostname: str
    targets: str
    started_ns: int
    ended_ns: int | None
    ingero_version: str
    kernel: str


@dataclass
class Charts:
    start_ns: int
    window_ns: int
    n_windows: int
    processes: list[Series]
    session: Session | None = None
    steps: StepWindows | None = None
    params: dict = field(default_factory=dict)  # the queries' (sid, t0, t1, pids, wns): the timeline's too


def session_of(con: duckdb.DuckDBPyConnection, sid: int) -> Session | None:
    row = latest_session(con, "session_id = $sid", {"sid": sid})
    if row is None:
        return None
    return Session(sid, row.get("command") or "", row.get("hostname") or "", row.get("targets") or "",
                   int(row["started_ns"]), row.get("ended_ns"), row.get("ingero_version") or "",
                   row.get("kernel") or "")


def step_windows(con: duckdb.DuckDBPyConnection, params: dict, n: int, steps: StepStats | None) -> StepWindows | None:
    """Per window, the mean step of the loop by part (None without steps or window tables)."""
    if steps is None or steps.pid is None or steps.count <= 0:
        return None
    pid = steps.pid
    p = {**params, "pid": pid}
    tid_row = run(con, _LOOP_SQL, p).fetchone()
    if tid_row is None or tid_row[0] is None:
        return None
    tid = int(tid_row[0])
    if steps.source in ("nvtx", "marked"):
        # (ProfilerStep#N with its number as '#', as analyze/traced_steps.py names a family)
        family = steps.marker if steps.source == "nvtx" and steps.marker else "ProfilerStep##"
        per_w = dict(run(con, _MARKS_SQL, {**p, "family": family}).fetchall()) if _has(con, "spans") else {}
        counts = {int(w): float(c) for w, c in per_w.items()}
    else:
        drains = {int(w): float(c) for w, c in run(con, _DRAINS_SQL, {**p, "tid": tid}).fetchall()}
        total = sum(drains.values())
        counts = {w: c * steps.count / total for w, c in drains.items()} if total else {}
    if not _has(con, "ing_win"):
        return None
    from ingero.analyze.context import Context

    ctx = Context(con, params["sid"], params["t0"], params["t1"], params["wns"])
    parts = traced_steps.window_parts(ctx, pid, tid, list(range(n)))
    out = {part: [None] * n for part in traced_steps.PARTS}
    held: list[float | None] = [None] * n
    for w, wp in parts.items():
        k = counts.get(w, 0.0)
        # a window holding under half a step is an edge (the loop starting or ending): no mean step
        if not 0 <= w < n or k < 0.5 or wp.wall_ns <= 0:
            continue
        held[w] = k
        for part in traced_steps.PARTS:
            out[part][w] = getattr(wp, f"{part}_ns") / k / 1e6
    if not any(v is not None for v in held):
        return None
    return StepWindows(pid, tid, steps.unit, out, held)


def _has(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = $t", {"t": table}).fetchone()[0]
                or con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = $t", {"t": table}).fetchone()[0])


def collect(con: duckdb.DuckDBPyConnection, sel: Selection, opts: Options, steps: StepStats | None = None) -> Charts:
    """The charts of ``sel``, in the windows explain makes of ``opts`` (what ``sel`` was resolved from);
    ``steps``: explain's steps of the same range (the breakdown over time)."""
    ctx = resolve(con, opts, align=True)
    params = {**sel.params(), "t0": ctx.start_ns, "t1": ctx.end_ns, "wns": ctx.window_ns}
    n = ctx.n_windows
    names = dict(run(con, _NAMES_SQL, params).fetchall())
    per_pid: dict[int, Series] = {}
    gpu: dict[str, list[float | None]] = {}
    for sql in (_CUDA_SQL, _WAIT_SQL, _HOST_SQL, _RSS_SQL, _GPU_SQL):
        cur = run(con, sql, params)
        cols = [d[0] for d in cur.description][2:]
        for pid, w, *values in cur.fetchall():
            if not 0 <= w < n:
                continue
            target = gpu if sql is _GPU_SQL else per_pid.setdefault(
                pid, Series(pid, names.get(pid) or f"pid {pid}")).metrics
            for col, v in zip(cols, values):
                target.setdefault(col, [None] * n)[int(w)] = None if v is None else float(v)
    for s in per_pid.values():
        s.metrics.update(gpu)
    return Charts(ctx.start_ns, ctx.window_ns, n, [per_pid[p] for p in sorted(per_pid)],
                  session=session_of(con, ctx.session_id), steps=step_windows(con, params, n, steps),
                  params=params)
