"""What the HTML report charts: per traced process and window, aggregated in DuckDB.

Never raw events: a few numbers per window and process, so a 10 M-event
session still makes a small page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from ingero.analyze.context import Options, resolve
from ingero.export.selection import WHERE, run
from ingero.store.selection import Selection

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


@dataclass
class Charts:
    start_ns: int
    window_ns: int
    n_windows: int
    processes: list[Series]


def collect(con: duckdb.DuckDBPyConnection, sel: Selection, opts: Options) -> Charts:
    """The charts of ``sel``, in the windows explain makes of ``opts`` (what ``sel`` was resolved from)."""
    ctx = resolve(con, opts)
    params = {**sel.params(), "wns": ctx.window_ns}
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
    return Charts(ctx.start_ns, ctx.window_ns, n, [per_pid[p] for p in sorted(per_pid)])
