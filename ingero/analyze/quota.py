"""The cgroup CPU quota as a root of the loop's wait for a CPU.

A thread throttled by its cgroup's quota is switched out while runnable, as a
preempted one is, but nobody took its CPU: once the group has spent the
period's quota none of its threads runs until the next period, and the CPU
idles (sched_switch's next is the idle task, pid 0) or runs whatever else is
runnable, with no higher claim than the loop had.  Naming whoever ran next
as the cause (cpu-contention's culprits) blames innocent processes; the fix
is the limit.

So, per CUDA process and window, with the throttling its cgroup's cpu.stat
counted in that window (table cgroup_cpu, sample/cgroup.py; the limit that
binds is the process's own cgroup or an ancestor's: the one that throttled
most), the loop thread's CPU wait (ing_win.cpu_wait_ns) is split:

- its preemptions outside device waits with the CPU left idle count as the
  quota's whole (a runnable thread and an idle CPU: only a throttle does that);
- the rest of its CPU wait (preempted by another process, a late return from a
  spinning wait, run-queue wait after a wake-up) counts as the quota's up to
  what is left of the cgroup's throttled time once every traced thread of
  the group has had its idle-CPU preemptions taken from it; beyond that, it
  is contention, as before.

No throttling in a window: nothing is the quota's there.  The tables:

  ing_cgroup  pid, cgroup: each cgroup row set of the range (the process's own and ancestors
              with a quota): the latest limit, totals of the cpu.stat amounts, the span read;
              ``binding`` marks the one whose limit throttled the process (most throttled time)
  ing_quota   pid, w: the binding cgroup's throttling in the window (each reading's amounts
              split over the windows its interval overlaps) and the loop thread's CPU wait
              the quota explains (quota_wait_ns; idle_wait_ns of it with the CPU idle)

and ing_win gains ``quota_wait_ns`` (0 without throttling).  A database older
than schema 15 has no cgroup_cpu: every window gets 0.
"""

from __future__ import annotations

from ingero.analyze import procs
from ingero.analyze.context import Context
from ingero.store.db import named_params



def _range(c: str = "") -> str:
    """The readings whose interval overlaps [t0, t1), of the processes asked for (``c``: a table alias and dot)."""
    return (f"{c}session_id = $sid AND {c}interval_ns > 0 AND {c}timestamp > $t0 "
            f"AND {c}timestamp - {c}interval_ns < $t1 AND ($all_pids OR list_contains($pids, {c}pid))")


# Totals are of every reading whose interval overlaps the range (whole): on a whole session
# they are the counters' increase from the first reading to the last, as cpu.stat moved.
CGROUP_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_cgroup AS
WITH g AS (
    SELECT pid, cgroup, bool_or(own) AS own, max(cgroup_version) AS version, any_value(mount) AS mount,
           any_value(container_id) AS container_id, any_value(pod_uid) AS pod_uid,
           arg_max(quota_us, timestamp) AS quota_us, arg_max(period_us, timestamp) AS period_us,
           coalesce(sum(periods_n), 0)::BIGINT AS periods_n, coalesce(sum(throttled_n), 0)::BIGINT AS throttled_n,
           coalesce(sum(throttled_ns), 0)::DOUBLE AS throttled_ns,
           sum(usage_ns)::DOUBLE AS usage_ns, count(usage_ns) = count(*) AS usage_known,
           sum(interval_ns)::DOUBLE AS covered_ns, min(timestamp - interval_ns) AS from_ns, max(timestamp) AS to_ns
    FROM cgroup_cpu WHERE {_range()}
    GROUP BY pid, cgroup
)
SELECT *, row_number() OVER (PARTITION BY pid ORDER BY throttled_ns DESC, throttled_n DESC,
                             quota_us IS NULL, quota_us::DOUBLE / period_us, own DESC, cgroup) = 1 AS binding
FROM g
"""

# The binding cgroup's amounts per window: a reading covers (timestamp - interval_ns,
# timestamp], split over the windows it overlaps in proportion.
QUOTA_WINDOWS_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_quota_w AS
WITH r AS (
    SELECT c.pid, greatest(c.timestamp - c.interval_ns, $t0) AS a, least(c.timestamp, $t1) AS e,
           c.interval_ns, c.throttled_n, c.throttled_ns, c.periods_n
    FROM cgroup_cpu c JOIN ing_cgroup b ON b.binding AND b.pid = c.pid AND b.cgroup = c.cgroup
    WHERE {_range("c.")}
), x AS (
    SELECT *, unnest(range((a - $t0) // $wns, (e - 1 - $t0) // $wns + 1)) AS w FROM r WHERE e > a
)
SELECT pid, w,
       sum(coalesce(throttled_n, 0) * f) AS throttled_n, sum(coalesce(throttled_ns, 0) * f) AS throttled_ns,
       sum(coalesce(periods_n, 0) * f) AS periods_n
FROM (SELECT *, (least(e, $t0 + (w + 1) * $wns) - greatest(a, $t0 + w * $wns))::DOUBLE / interval_ns AS f FROM x)
WHERE w >= 0 AND w < $nw
GROUP BY pid, w
"""

# The loop thread's CPU wait the quota explains, per window (see the module's docstring).
QUOTA_SQL = """
CREATE OR REPLACE TEMP TABLE ing_quota AS
WITH cg AS (
    SELECT pid, cgroup FROM ing_cgroup WHERE binding
), idle_all AS (
    -- every traced thread of the processes limited by the same cgroup: preempted, the CPU left idle
    SELECT cg.cgroup, s.w, sum(s.off_ns) AS idle_ns
    FROM ing_sched s JOIN cg USING (pid)
    WHERE s.kind = 'preempted' AND s.other_pid = 0
    GROUP BY ALL
), lp AS (
    -- the loop thread's, outside device waits (those are in cpu_wait_ns only as late returns)
    SELECT s.pid, s.w, sum(s.off_ns) AS idle_out_ns
    FROM ing_sched s JOIN ing_loop l ON s.pid = l.pid AND s.tid = l.tid
    WHERE s.kind = 'preempted' AND s.other_pid = 0 AND s.inside <> 'sync'
    GROUP BY ALL
), j AS (
    SELECT win.pid, win.w, q.throttled_n, q.throttled_ns, q.periods_n, win.cpu_wait_ns,
           least(coalesce(lp.idle_out_ns, 0), win.cpu_wait_ns) AS idle_wait_ns,
           greatest(0, q.throttled_ns - coalesce(ia.idle_ns, 0)) AS budget_ns
    FROM ing_win win JOIN ing_quota_w q USING (pid, w) JOIN cg USING (pid)
         LEFT JOIN idle_all ia ON ia.cgroup = cg.cgroup AND ia.w = win.w
         LEFT JOIN lp ON lp.pid = win.pid AND lp.w = win.w
    WHERE q.throttled_ns > 0
)
SELECT pid, w, throttled_n, throttled_ns, periods_n, idle_wait_ns,
       idle_wait_ns + least(cpu_wait_ns - idle_wait_ns, budget_ns) AS quota_wait_ns
FROM j
"""

WIN_SQL = """
CREATE OR REPLACE TEMP TABLE ing_win AS
SELECT win.*, coalesce(q.quota_wait_ns, 0)::DOUBLE AS quota_wait_ns
FROM ing_win win LEFT JOIN ing_quota q ON q.pid = win.pid AND q.w = win.w
ORDER BY win.pid, win.w
"""

EMPTY_SQL = """
CREATE OR REPLACE TEMP TABLE ing_cgroup AS
SELECT NULL::INTEGER AS pid, NULL::VARCHAR AS cgroup, NULL::BOOLEAN AS own, NULL::SMALLINT AS version,
       NULL::VARCHAR AS mount, NULL::VARCHAR AS container_id, NULL::VARCHAR AS pod_uid,
       NULL::BIGINT AS quota_us, NULL::BIGINT AS period_us, 0::BIGINT AS periods_n, 0::BIGINT AS throttled_n,
       0::DOUBLE AS throttled_ns, NULL::DOUBLE AS usage_ns, FALSE AS usage_known, 0::DOUBLE AS covered_ns,
       NULL::BIGINT AS from_ns, NULL::BIGINT AS to_ns, FALSE AS binding
WHERE FALSE;
CREATE OR REPLACE TEMP TABLE ing_quota AS
SELECT NULL::INTEGER AS pid, NULL::BIGINT AS w, 0::DOUBLE AS throttled_n, 0::DOUBLE AS throttled_ns,
       0::DOUBLE AS periods_n, 0::DOUBLE AS idle_wait_ns, 0::DOUBLE AS quota_wait_ns
WHERE FALSE;
"""


def build(ctx: Context) -> None:
    """ing_cgroup, ing_quota and ing_win.quota_wait_ns (after windows.build's other tables)."""
    con = ctx.con
    if procs.has_table(con, "cgroup_cpu"):
        p = ctx.params(nw=ctx.n_windows)
        con.execute(CGROUP_SQL, named_params(CGROUP_SQL, p))
        con.execute(QUOTA_WINDOWS_SQL, named_params(QUOTA_WINDOWS_SQL, p))
        con.execute(QUOTA_SQL)
    else:
        con.execute(EMPTY_SQL)
    con.execute(WIN_SQL)
