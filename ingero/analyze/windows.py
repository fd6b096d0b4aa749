"""Window metrics: one pass of DuckDB SQL over the events, per process and window.

``build(ctx)`` creates small TEMP tables (a few rows per process and window)
that every rule reads; the events table itself is scanned only here, so
explain stays linear in the number of events.

  ing_cuda     pid, tid, w, op, cat, kind: count, host time, p99, bytes (calls that returned an
               error: rows of category 'failed' of their own, out of every other category)
  ing_failed   pid, tid, w, op, kind, ret: the calls that returned an error
  ing_sched    pid, tid, w, kind, inside (category of events.in_call, the CUDA call the
               thread was in when switched out; 'none' outside any call), queued (events.queued),
               other_pid (who preempted, 0 for sleeps): count, off-CPU ns, runq ns
  ing_preempt  pid, tid, w, other_pid: preemptions while runnable and their time
  ing_late     pid, tid, w: preempted time inside device waits (syncs), the part of it that
               ended right before the wait returned (the only part that can delay it), the
               estimated delay, and how many waits it delayed
  ing_faults   pid, tid, w, inside (as ing_sched): page faults of traced processes (count, time when known)
  ing_bio      w, pid (issuer), kind: block requests, bytes, latency
  ing_sys      w: host metrics;  ing_gpu  w: NVML metrics
  ing_pcpu     w, pid, comm: host-wide per-process CPU (names the competitors)
  ing_loop     pid, tid: the thread issuing most CUDA calls of each CUDA process
  ing_win      pid, w: the loop thread's metrics joined into one row (rules' main input)
  ing_helper   pid, w: traced processes without CUDA calls (DataLoader workers)
  ing_cgroup, ing_quota  the cgroup CPU quota's throttling (analyze/quota.py), and
               ing_win.quota_wait_ns: the part of the loop's CPU wait it explains

Window index w = (timestamp - start) // window_ns.  An off-CPU interval that
crosses a window boundary is split: its remainder (up to one window) counts
in the next window, so shares stay exact and never exceed 100%.
"""

from __future__ import annotations

import pyarrow as pa

from ingero.analyze import launch_sampling, quota, return_codes, summaries
from ingero.analyze.context import Context
from ingero.events.ops import COPY_OPS, HOST_OPS, LAUNCH_OPS, PINNED_OPS, SYNC_COPY_OPS, SYNC_OPS
from ingero.events.units import NS
from ingero.store.derive import events_relation
from ingero.store.selection import Selection

# The selection's rows (ctx.params() gives the values): session and range, and its processes
_FILTER = Selection.where(pids=False)
_PID_FILTER = Selection.pid_filter()


def _category(column: str) -> str:
    """SQL naming the call category of the op name in ``column`` (an op in two lists takes the first)."""
    return (f"CASE WHEN list_contains($launch_ops, {column}) THEN 'launch' "
            f"WHEN list_contains($sync_ops, {column}) THEN 'sync' "
            f"WHEN list_contains($copy_ops, {column}) THEN 'copy' "
            f"WHEN list_contains($pinned_ops, {column}) THEN 'pinned' ELSE 'other' END")


_CAT = _category("op")

# Two simple scans instead of one rich one (per-row CASE / FILTER
# expressions over ten million rows cost more than the scan itself):
# launches, the bulk of the rows, need only a count and a sum; every other
# CUDA call also gets bytes and quantiles.  The category is derived once per
# group, not per row.
CUDA_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_cuda AS
WITH l AS (
    -- grouped by thread and window only (one launch entry point per thread
    -- in practice): hashing the op string per row costs ~15% of this scan
    SELECT tid, (timestamp - $t0) // $wns AS w, any_value(op) AS op, any_value(pid) AS pid,
           count(*) AS n, sum(duration_ns)::DOUBLE AS dur_ns
    FROM events
    WHERE {_FILTER} AND {_PID_FILTER} AND list_contains($launch_ops, op)
    GROUP BY tid, w
), g AS (
    -- kind raw (NULL a group of its own), named per group below: coalesce()
    -- per row cost 0.1 s of 0.5 on a 10 M-call trace
    SELECT tid, (timestamp - $t0) // $wns AS w, op, kind, any_value(pid) AS pid,
           count(*) AS n,
           sum(duration_ns)::DOUBLE AS dur_ns,
           -- (no p50 or max: no rule reads them; they cost 0.02-0.07 s CPU at 10 M)
           quantile_cont(duration_ns, 0.99) AS p99,
           coalesce(sum(bytes), 0)::DOUBLE AS bytes,
           count(*) FILTER (bytes <= $small_copy_bytes) AS small_n
    FROM events
    WHERE {_FILTER} AND {_PID_FILTER} AND NOT list_contains($host_ops, op) AND NOT list_contains($launch_ops, op)
    GROUP BY ALL
)
SELECT pid, tid, w, op, 'launch' AS cat, '' AS kind, n, dur_ns,
       NULL::DOUBLE AS p99_ns, 0::DOUBLE AS bytes, 0::BIGINT AS small_n
FROM l
UNION ALL
SELECT pid, tid, w, op, {_CAT} AS cat, coalesce(kind, '') AS kind, n, dur_ns, p99 AS p99_ns, bytes, small_n
FROM g
"""

# The CUDA call a thread was inside when it went off CPU or faulted is
# events.in_call (schema 5: the tracer knows it at the switch), named by its
# op: its category is derived once per group, like ing_cuda's.  A sleep
# inside cudaStreamSync is waiting for the GPU, not contention, not
# starvation; a sleep outside every call is waiting for something else, and
# events.queued says whether device work the thread issued may still run.
# Before schema 5 both were found here by ASOF joins of every off-CPU
# interval and fault against the thread's long CUDA calls: building the
# window tables of the 10 M-event benchmark took 2.5-2.8 s CPU with them,
# 1.7-1.85 s without (interleaved rounds, docs/rules.md).
_INSIDE = f"CASE WHEN in_call IS NULL THEN 'none' ELSE {_category('in_call')} END"

# The end of both ing_sched builds (SCHED_SQL from events, S_SCHED_SQL from summaries): each
# group of off-CPU time ``g`` (with ``over``, its overflow past the window's end) is split into
# the part inside its window and the spill into the next, and named by kind and call category.
_SCHED_SPLIT = f"""), k AS (
    SELECT pid, tid, w, coalesce(kind, 'other') AS kind, {_INSIDE} AS inside, queued,
           -- who took the CPU, for preemptions only (a sleep's successor is no culprit)
           CASE WHEN kind = 'preempted' THEN coalesce(other_pid, 0) ELSE 0 END AS other_pid,
           n, dur_ns - over AS off_in, least(over, $wns) AS spill, runq_ns, dur_ns
    FROM g
)
SELECT pid, tid, w, kind, inside, queued, other_pid, sum(n) AS n, sum(off_ns) AS off_ns,
       sum(runq_ns) AS runq_ns, sum(dur_ns) AS dur_ns
FROM (SELECT pid, tid, w, kind, inside, queued, other_pid, n, off_in AS off_ns, runq_ns, dur_ns FROM k
      UNION ALL
      SELECT pid, tid, w + 1, kind, inside, queued, other_pid, 0, spill, 0, 0 FROM k WHERE spill > 0)
GROUP BY ALL
"""
assert "{" not in _SCHED_SPLIT and "}" not in _SCHED_SPLIT  # the templates are .format()ed again

# Grouped on the raw columns straight from the scan (per-row CASE
# expressions and each extra group key cost ~0.04 s CPU at 10 M events);
# kinds and call categories are named per group.  The group needs no pid
# (thread ids are unique host-wide) nor `preempted` (= kind 'preempted').
# `queued` is kept for every row; rules read it for sleeps outside calls.
# Per group: the part of the off-CPU time inside the start window and the
# spill into the next, from the overflow past the window's end; a thread's
# off-CPU intervals never overlap, so at most one per group crosses the
# window's end and capping the group's sum caps that interval's spill.
SCHED_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_sched AS
WITH g AS (
    SELECT tid, (timestamp - $t0) // $wns AS w, kind, in_call, queued, other_pid,
           any_value(pid) AS pid, count(*) AS n, sum(duration_ns)::DOUBLE AS dur_ns,
           sum(greatest(0, duration_ns - ($t0 + ((timestamp - $t0) // $wns + 1) * $wns - timestamp)))::DOUBLE AS over,
           coalesce(sum(runq_ns), 0)::DOUBLE AS runq_ns
    FROM {{events}} WHERE {_FILTER} AND {_PID_FILTER} AND op = 'sched_switch'
    GROUP BY ALL
{_SCHED_SPLIT}"""

# Preemptions and who took the CPU, from ing_sched (off_ns: whole intervals,
# counted in the window they start in).
PREEMPT_SQL = """
CREATE OR REPLACE TEMP TABLE ing_preempt AS
SELECT pid, tid, w, other_pid, sum(n) AS n, sum(dur_ns) AS off_ns
FROM ing_sched WHERE kind = 'preempted' AND n > 0
GROUP BY ALL
"""

# A thread waiting in a sync is off CPU, preempted, only when it spins or
# yields (CUDA's default, cudaDeviceScheduleAuto, spins with one context per
# process).  While the device is still busy that costs nothing: the sync
# would have waited anyway.  It delays the return only when the device
# finished during the interval, and then the sync returns right after the
# thread is back on CPU (a spin or yield loop checks at once).  So per
# preempted interval [a, b] inside a sync [s0, s1]: s1 within $late_eps_ns of
# b marks the last one (late_hi: the delay is at most b - a), else the device
# was still busy after it.  When the device finished inside [a, b] is not in
# the trace: the estimate takes the thread's own undisturbed wait, the 25th
# percentile of its sync times (most syncs are not preempted), so the device
# finished at s0 + that, clamped to [a, b], and the delay is b minus it.
# Checked against the simulated runtime's own lateness (simcudaWaitLateNs,
# docs/rules.md).  Blocking syncs sleep instead; their delay is the
# run-queue wait after the wakeup, counted with every wakeup's.
LATE_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_late AS
WITH p AS (
    SELECT pid, tid, timestamp AS a, timestamp + duration_ns AS b, duration_ns
    FROM {{events}} WHERE {_FILTER} AND {_PID_FILTER} AND op = 'sched_switch' AND kind = 'preempted'
      AND list_contains($sync_ops, in_call)
), s AS (
    SELECT tid, timestamp AS s0, timestamp + duration_ns AS s1, duration_ns
    FROM events WHERE {_FILTER} AND {_PID_FILTER} AND list_contains($sync_ops, op)
      AND tid IN (SELECT tid FROM p)
), q AS (
    SELECT tid, quantile_cont(duration_ns, 0.25) AS undisturbed_ns FROM s GROUP BY tid
)
SELECT p.pid, p.tid, (p.a - $t0) // $wns AS w,
       sum(p.duration_ns)::DOUBLE AS wait_preempt_ns,
       coalesce(sum(p.duration_ns) FILTER (s.s1 - p.b <= $late_eps_ns), 0)::DOUBLE AS late_hi_ns,
       coalesce(sum(p.b - greatest(p.a, least(p.b, s.s0 + q.undisturbed_ns)))
                FILTER (s.s1 - p.b <= $late_eps_ns), 0)::DOUBLE AS late_ns,
       count(*) FILTER (s.s1 - p.b <= $late_eps_ns)::DOUBLE AS late_n
FROM p ASOF JOIN s ON p.tid = s.tid AND p.a >= s.s0 JOIN q ON q.tid = p.tid
GROUP BY ALL
"""

# Faults carry the call they happened in, like off-CPU intervals: a copy
# whose source pages fault in is slow because of memory, not the bus.
FAULTS_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_faults AS
SELECT pid, tid, w, {_INSIDE} AS inside, sum(n) AS n, sum(dur_ns) AS dur_ns
FROM (SELECT tid, (timestamp - $t0) // $wns AS w, in_call, any_value(pid) AS pid, count(*) AS n,
             coalesce(sum(duration_ns), 0)::DOUBLE AS dur_ns
      FROM {{events}} WHERE {_FILTER} AND {_PID_FILTER} AND op = 'page_fault'
      GROUP BY ALL)
GROUP BY ALL
"""

# Block I/O is host-wide (the issuer may be any process): no pid filter.
BIO_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_bio AS
SELECT w, pid, coalesce(kind, '') AS kind, n, bytes, lat_ns, p99_ns, max_ns
FROM (SELECT (timestamp - $t0) // $wns AS w, pid, kind,
             count(*) AS n, coalesce(sum(bytes), 0)::DOUBLE AS bytes,
             sum(duration_ns)::DOUBLE AS lat_ns, quantile_cont(duration_ns, 0.99) AS p99_ns,
             max(duration_ns) AS max_ns
      FROM events WHERE {_FILTER} AND op = 'block_io'
      GROUP BY ALL)
"""

SYS_SQL = """
CREATE OR REPLACE TEMP TABLE ing_sys AS
SELECT (timestamp - $t0) // $wns AS w,
       avg(cpu_pct) AS cpu_pct, avg(iowait_pct) AS iowait_pct, avg(mem_pct) AS mem_pct,
       max(swap_used_bytes) AS swap_used_bytes,
       coalesce(sum(swap_in_bytes), 0) + coalesce(sum(swap_out_bytes), 0) AS swap_io_bytes,
       coalesce(sum(major_faults), 0) AS major_faults, avg(load1) AS load1, max(ncpu) AS ncpu
FROM system_metrics
WHERE session_id = $sid AND timestamp >= $t0 AND timestamp < $t1 + $wns
GROUP BY ALL
"""

GPU_SQL = """
CREATE OR REPLACE TEMP TABLE ing_gpu AS
SELECT (timestamp - $t0) // $wns AS w, gpu, avg(util_pct) AS util_pct, avg(mem_util_pct) AS mem_util_pct
FROM gpu_metrics
WHERE session_id = $sid AND timestamp >= $t0 AND timestamp < $t1 + $wns
GROUP BY ALL
"""

# process_cpu rows close an interval at `timestamp`: attribute each to the
# window holding the middle of its interval.
PCPU_SQL = """
CREATE OR REPLACE TEMP TABLE ing_pcpu AS
SELECT (timestamp - coalesce(interval_ns, 0) // 2 - $t0) // $wns AS w, pid, any_value(comm) AS comm,
       sum(oncpu_ns)::DOUBLE AS oncpu_ns, sum(coalesce(interval_ns, 0))::DOUBLE AS interval_ns,
       sum(involuntary) AS involuntary, sum(voluntary) AS voluntary,
       sum(preempted_traced) AS preempted_traced
FROM process_cpu
WHERE session_id = $sid AND timestamp >= $t0 AND timestamp < $t1 + $wns
GROUP BY ALL
"""

# (calls that failed do no GPU work: a process whose every call failed has no loop thread)
LOOP_SQL = """
CREATE OR REPLACE TEMP TABLE ing_loop AS
SELECT pid, arg_max(tid, n) AS tid, sum(n) AS cuda_n
FROM (SELECT pid, tid, sum(n) AS n FROM ing_cuda WHERE cat <> 'failed' GROUP BY ALL)
GROUP BY pid
"""

# A copy call moves its bytes in at most COPY_LATENCY_NS plus the bytes at COPY_FLOOR_BYTES_PER_S
# (pageable copies measure 2-6 GB/s, pinned 12-25; 1 GB/s is below any current bus): time in
# it beyond that waited for the device, as a synchronous copy waits for the work queued before
# it (a new user's loop that never syncs: 4-byte read-backs of ~17 ms each behind queued
# kernels read "copies 54%, device wait 0%" and a HIGH transfer-bound chain at "0 MB/s").
# Over ing_cuda rows (n, bytes, dur_ns): the transfer part.
COPY_LATENCY_NS = 50_000
COPY_FLOOR_BYTES_PER_S = 1e9
# Where the device's copies were measured (CUPTI under `trace --cmd`), ing_cuda.moved_ns holds
# the group's transfer as measured (MOVED_SQL), and the model stands aside.
COPY_MODEL_SQL = f"least(dur_ns, n * {COPY_LATENCY_NS} + bytes * {1e9 / COPY_FLOOR_BYTES_PER_S!r})"
COPY_TRANSFER_SQL = f"coalesce(moved_ns, {COPY_MODEL_SQL})"
# The two aggregates over ing_cuda rows that use it, read by ing_win and the step breakdown
# (analyze/traced_steps.py) alike: copy calls' transfer, and the time waiting for the device (syncs, and
# copy calls beyond their transfer).
COPY_NS_SQL = f"sum({COPY_TRANSFER_SQL}) FILTER (cat = 'copy')"
DEVICE_WAIT_NS_SQL = (f"coalesce(sum(dur_ns) FILTER (cat = 'sync'), 0)"
                      f" + coalesce(sum(dur_ns - {COPY_TRANSFER_SQL}) FILTER (cat = 'copy'), 0)")

# A copy call's transfer as the device measured it: the memcpy rows CUPTI recorded for it
# (collect/cupti.py joins them to the call by its thread and start), at most the call; a copy
# without one keeps the model's.  Per ing_cuda group of copies.
MOVED_SQL = f"""
UPDATE ing_cuda SET moved_ns = m.moved FROM (
    SELECT e.tid, (e.timestamp - $t0) // $wns AS w, e.op, coalesce(e.kind, '') AS kind,
           sum(CASE WHEN d.dur IS NOT NULL THEN least(e.duration_ns, d.dur)
                    ELSE least(e.duration_ns,
                               {COPY_LATENCY_NS} + coalesce(e.bytes, 0) * {1e9 / COPY_FLOOR_BYTES_PER_S!r})
               END)::DOUBLE AS moved
    FROM events e LEFT JOIN (
        SELECT call_tid, call_ns, sum(end_ns - start_ns) AS dur FROM device_activity
        WHERE session_id = $sid AND kind = 'memcpy' AND call_ns >= $t0 AND call_ns < $t1 GROUP BY ALL
    ) d ON d.call_tid = e.tid AND d.call_ns = e.timestamp
    WHERE {_FILTER} AND {_PID_FILTER} AND list_contains($copy_ops, e.op) AND e.duration_ns IS NOT NULL
    GROUP BY ALL
) m
WHERE ing_cuda.cat = 'copy' AND ing_cuda.tid = m.tid AND ing_cuda.w = m.w AND ing_cuda.op = m.op
  AND ing_cuda.kind = m.kind
"""
MEASURED_COPIES_SQL = """
SELECT count(*) > 0 FROM device_activity WHERE session_id = $sid AND kind = 'memcpy' AND call_ns IS NOT NULL
  AND call_ns >= $t0 AND call_ns < $t1
"""


def _measured_copies(ctx: Context, p: dict) -> None:
    """ing_cuda.moved_ns: the measured transfer of each group of copies, where CUPTI measured them."""
    con = ctx.con
    con.execute("ALTER TABLE ing_cuda ADD COLUMN IF NOT EXISTS moved_ns DOUBLE")
    if ctx.imported_from or not _has_call_ns(con):
        return  # (an imported trace's copies are its own calls: the importer took their bytes from them)
    q = {k: p[k] for k in ("sid", "t0", "t1")}
    if con.execute(MEASURED_COPIES_SQL, q).fetchone()[0]:
        con.execute(MOVED_SQL, {k: p[k] for k in ("sid", "t0", "t1", "wns", "all_pids", "pids", "copy_ops")})


def _has_call_ns(con) -> bool:
    """Whether the store has device_activity with call_ns (schema 7 on; a file before it has none)."""
    return con.execute("SELECT count(*) > 0 FROM duckdb_columns() WHERE table_name = 'device_activity' "
                       "AND column_name = 'call_ns'").fetchone()[0]


# One row per CUDA process and window in which its loop thread made a CUDA
# call ("active" windows).  Shares are fractions of the window's wall clock.
WIN_SQL = """
CREATE OR REPLACE TEMP TABLE ing_win AS
WITH c AS (
    SELECT c.pid, c.w,
        sum(n) AS ops_n,
        sum(n) FILTER (cat = 'launch') AS launch_n,
        sum(dur_ns) FILTER (cat = 'launch') AS launch_ns,
        sum(dur_ns) FILTER (cat = 'launch') / sum(n) FILTER (cat = 'launch') AS launch_mean_ns,
        sum(n) FILTER (cat = 'sync') AS sync_n,
        {device_wait_ns} AS sync_ns,
        max(p99_ns) FILTER (cat = 'sync') AS sync_p99_ns,
        sum(n) FILTER (cat = 'copy') AS copy_n,
        {copy_ns} AS copy_ns,
        sum(bytes) FILTER (cat = 'copy') AS copy_bytes,
        sum(dur_ns) FILTER (list_contains($sync_copy_ops, op)) AS sync_copy_ns,
        sum(bytes) FILTER (list_contains($sync_copy_ops, op)) AS sync_copy_bytes,
        sum(small_n) FILTER (cat = 'copy' AND kind = 'D2H') AS small_d2h_n
    FROM ing_cuda c JOIN ing_loop l ON c.pid = l.pid AND c.tid = l.tid
    WHERE c.cat <> 'failed'
    GROUP BY ALL
), s AS (
    SELECT s.pid, s.w,
        sum(off_ns) AS off_ns,
        sum(off_ns) FILTER (kind = 'preempted') AS preempt_ns,
        sum(n) FILTER (kind = 'preempted') AS preempt_n,
        sum(runq_ns) FILTER (kind <> 'preempted') AS wake_runq_ns,
        -- blocked time of sleeps / D state: the interval minus its run-queue
        -- wait after the wakeup (that part is CPU wait, counted above)
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep') AS sleep_ns,
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep' AND inside = 'none') AS sleep_out_ns,
        -- of it: with nothing of its own queued on the device (NULL: no CUDA call made yet) ...
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep' AND inside = 'none' AND queued IS NOT TRUE)
            AS sleep_out_idle_ns,
        -- ... and with device work it issued since its last sync possibly still running
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep' AND inside = 'none' AND queued)
            AS sleep_out_queued_ns,
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep' AND inside = 'sync') AS sleep_sync_ns,
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'io') AS io_ns,
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'io' AND inside = 'none') AS io_out_ns,
        -- CPU wait inside copy calls: preempted, or runnable after the DMA woke it
        sum(off_ns) FILTER (kind = 'preempted' AND inside = 'copy') AS copy_preempt_ns,
        sum(runq_ns) FILTER (kind <> 'preempted' AND inside = 'copy') AS copy_runq_ns
    FROM ing_sched s JOIN ing_loop l ON s.pid = l.pid AND s.tid = l.tid
    GROUP BY ALL
), lt AS (
    SELECT lt.pid, lt.w, sum(wait_preempt_ns) AS wait_preempt_ns, sum(late_hi_ns) AS late_hi_ns,
           sum(late_ns) AS late_ns, sum(late_n) AS late_n
    FROM ing_late lt JOIN ing_loop l ON lt.pid = l.pid AND lt.tid = l.tid
    GROUP BY ALL
)
SELECT c.pid, c.w, (least($t0 + (c.w + 1) * $wns, $c1) - greatest($t0 + c.w * $wns, $c0))::DOUBLE AS wall_ns,
    c.ops_n, coalesce(c.launch_n, 0) AS launch_n, coalesce(c.launch_ns, 0) AS launch_ns,
    c.launch_mean_ns,
    coalesce(c.sync_n, 0) AS sync_n, coalesce(c.sync_ns, 0) AS sync_ns, c.sync_p99_ns,
    coalesce(c.copy_n, 0) AS copy_n, coalesce(c.copy_ns, 0) AS copy_ns,
    coalesce(c.copy_bytes, 0) AS copy_bytes,
    coalesce(c.sync_copy_ns, 0) AS sync_copy_ns, coalesce(c.sync_copy_bytes, 0) AS sync_copy_bytes,
    coalesce(c.small_d2h_n, 0) AS small_d2h_n,
    least(coalesce(s.off_ns, 0), $wns) AS off_ns,
    coalesce(s.preempt_ns, 0) AS preempt_ns, coalesce(s.preempt_n, 0) AS preempt_n,
    coalesce(s.wake_runq_ns, 0) AS wake_runq_ns,
    -- CPU wait that cost the loop time: preemptions outside device waits, the part of
    -- those inside them that delayed the return (LATE_SQL), run-queue waits after wakeups
    least(greatest(0, coalesce(s.preempt_ns, 0) - coalesce(lt.wait_preempt_ns, 0))
          + coalesce(lt.late_ns, 0) + coalesce(s.wake_runq_ns, 0), $wns) AS cpu_wait_ns,
    coalesce(lt.wait_preempt_ns, 0) AS wait_preempt_ns, coalesce(lt.late_hi_ns, 0) AS late_hi_ns,
    coalesce(lt.late_ns, 0) AS late_ns, coalesce(lt.late_n, 0) AS late_n,
    coalesce(s.sleep_ns, 0) AS sleep_ns, coalesce(s.sleep_out_ns, 0) AS sleep_out_ns,
    coalesce(s.sleep_out_idle_ns, 0) AS sleep_out_idle_ns, coalesce(s.sleep_out_queued_ns, 0) AS sleep_out_queued_ns,
    coalesce(s.sleep_sync_ns, 0) AS sleep_sync_ns,
    coalesce(s.io_ns, 0) AS io_ns, coalesce(s.io_out_ns, 0) AS io_out_ns,
    least(coalesce(s.copy_preempt_ns, 0) + coalesce(s.copy_runq_ns, 0), coalesce(c.copy_ns, 0)) AS copy_wait_ns,
    coalesce(f.n, 0) AS faults_n, coalesce(f.dur_ns, 0) AS faults_ns,
    coalesce(f.copy_n, 0) AS copy_faults_n, coalesce(f.copy_ns, 0) AS copy_faults_ns
FROM c LEFT JOIN s USING (pid, w)
       LEFT JOIN lt USING (pid, w)
       LEFT JOIN (SELECT pid, w, sum(n) AS n, sum(dur_ns) AS dur_ns,
                         sum(n) FILTER (inside = 'copy') AS copy_n,
                         sum(dur_ns) FILTER (inside = 'copy') AS copy_ns
                  FROM ing_faults GROUP BY ALL) f USING (pid, w)
WHERE c.w >= 0 AND c.w < $nw
""".replace("{device_wait_ns}", DEVICE_WAIT_NS_SQL).replace("{copy_ns}", COPY_NS_SQL)

# A CUDA call that returned an error (events.ret: cudaError_t, CUresult, ncclResult_t;
# analyze/return_codes.py) did no GPU work: no kernel ran, nothing was copied or waited for
# (NVIDIA's runtime without a driver fails every call in ~1 µs; a loop of them read as
# "[HIGH] launch-bound").  ncclInProgress (a non-blocking communicator's call still running)
# is no failure.  The failed calls of the range, per thread, window, op, kind and code, from
# the raw rows (the per-second summaries hold no return codes; `ret <> 0` skips the row
# groups whose zone maps say every call succeeded, so a run without failures pays ~nothing).
FAILED_CALL_SQL = f"ret <> 0 AND NOT (ret = {return_codes.NCCL_IN_PROGRESS} AND op::VARCHAR LIKE 'nccl%')"
FAILED_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_failed AS
SELECT pid, tid, (timestamp - $t0) // $wns AS w, op::VARCHAR AS op, coalesce(kind, '') AS kind, ret,
       count(*) AS n, sum(duration_ns)::DOUBLE AS dur_ns, coalesce(sum(bytes), 0)::DOUBLE AS bytes,
       count(*) FILTER (bytes <= $small_copy_bytes) AS small_n, min(timestamp) AS first_ns, max(timestamp) AS last_ns
FROM events
WHERE {_FILTER} AND {_PID_FILTER} AND {FAILED_CALL_SQL} AND NOT list_contains($host_ops, op)
GROUP BY ALL
"""

# ing_cuda without the failed calls: they are taken out of the rows that counted them (the
# timing rules read launches, syncs and copies that did something) and kept as rows of
# their own, category 'failed', so every count of calls still holds them.  Launch rows are
# one per thread and window whatever the entry point (CUDA_SQL): matched by category there.
SPLIT_FAILED_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_cuda AS
WITH f AS (
    SELECT tid, w, cat, CASE WHEN cat = 'launch' THEN '' ELSE op END AS op_key,
           CASE WHEN cat = 'launch' THEN '' ELSE kind END AS kind,
           sum(n) AS n, sum(dur_ns) AS dur_ns, sum(bytes) AS bytes, sum(small_n) AS small_n
    FROM (SELECT *, {_CAT} AS cat FROM ing_failed)
    GROUP BY ALL
)
SELECT c.pid, c.tid, c.w, c.op, c.cat, c.kind, (c.n - coalesce(f.n, 0))::BIGINT AS n,
       c.dur_ns - coalesce(f.dur_ns, 0) AS dur_ns, c.p99_ns, c.bytes - coalesce(f.bytes, 0) AS bytes,
       (c.small_n - coalesce(f.small_n, 0))::BIGINT AS small_n
FROM ing_cuda c LEFT JOIN f ON f.tid = c.tid AND f.w = c.w AND f.cat = c.cat AND f.kind = c.kind
                           AND f.op_key = CASE WHEN c.cat = 'launch' THEN '' ELSE c.op END
WHERE c.n > coalesce(f.n, 0)
UNION ALL
SELECT pid, tid, w, op, 'failed' AS cat, kind, sum(n)::BIGINT, sum(dur_ns), NULL::DOUBLE, sum(bytes),
       sum(small_n)::BIGINT
FROM ing_failed GROUP BY pid, tid, w, op, kind
"""

HELPER_SQL = """
CREATE OR REPLACE TEMP TABLE ing_helper AS
WITH traced AS (
    SELECT DISTINCT pid FROM ing_sched
    UNION SELECT DISTINCT pid FROM ing_faults
), helpers AS (
    SELECT pid FROM traced WHERE pid NOT IN (SELECT pid FROM ing_cuda)  -- (failed calls are CUDA calls)
), s AS (
    SELECT pid, w, sum(off_ns) FILTER (kind = 'preempted') AS preempt_ns,
           sum(runq_ns) FILTER (kind <> 'preempted') AS wake_runq_ns,
           sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep') AS sleep_ns,
           sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'io') AS io_ns
    FROM ing_sched WHERE pid IN (SELECT pid FROM helpers) GROUP BY ALL
)
SELECT h.pid, s.w, coalesce(s.preempt_ns, 0) + coalesce(s.wake_runq_ns, 0) AS cpu_wait_ns,
       coalesce(s.sleep_ns, 0) AS sleep_ns, coalesce(s.io_ns, 0) AS io_ns,
       p.oncpu_ns
FROM helpers h JOIN s USING (pid) LEFT JOIN ing_pcpu p ON p.pid = h.pid AND p.w = s.w
"""

# A sync that returns within this long after its thread got the CPU back
# was waiting for that CPU: a spin or yield loop sees the device done at its
# first check (~1 µs), plus the uretprobe (~5 µs here).  50 µs leaves room for
# a slow VM without taking in a sync that spun on for a kernel's worth.
LATE_EPS_NS = summaries.LATE_EPS_NS
# Below this many bytes a device-to-host copy is a scalar read-back
# (`tensor.item()`, a loss print): 1 KiB covers any scalar or tiny vector.
SMALL_COPY_BYTES = summaries.SMALL_COPY_BYTES


# ---- The same tables from the per-second summaries (analyze/summaries/__init__.py).
# {w}: the windows relation (the stored table, or TEMP summaries made on the
# fly), {l}: the late waits.  Windows are whole seconds aligned to seconds
# (context.resolve), so a window is a set of whole summary seconds.
_SFILTER = Selection.where(time="start_ns", pids=False)
_SW = "(start_ns - $t0) // $wns"
# Merging histograms: one row per bucket.  A day holds ~10 M of them per op, so the
# group keys are computed per summary row first (_HIST beside them), and the unnest
# only repeats them: computed after the unnest, coalesce(kind) and the window number
# were a third of the merge's CPU (0.94 -> 0.61 s for a day's syncs).
_HIST = "duration_hist_bucket, duration_hist_n, duration_hist_sum_ns"
_UNNEST_HIST = ("unnest(duration_hist_bucket) AS bucket, unnest(duration_hist_n) AS n, "
                "unnest(duration_hist_sum_ns) AS sum_ns")

# The syncs' duration histograms merged per thread, window, op and kind: ing_cuda's
# p99 and ing_late's per-thread quartile both read them (each merging ~10 M
# bucket rows a day on its own cost 0.36 CPU-s more).
S_SYNC_HIST_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_sync_hist AS
SELECT tid, w, op, kind, bucket, sum(n)::BIGINT AS n, sum(sum_ns)::DOUBLE AS sum_ns
FROM (SELECT tid, w, op, kind, {_UNNEST_HIST}
      FROM (SELECT tid, {_SW} AS w, op, coalesce(kind, '') AS kind, {_HIST}
            FROM {{w}} WHERE {_SFILTER} AND {_PID_FILTER} AND list_contains($sync_ops, op)))
GROUP BY ALL
"""

# The quantiles of the merged histograms are numpy (summaries.hist_quantile: hist_quantile_sql's
# values to the bit), registered on the connection as views: ing_cuda's p99 of syncs per thread,
# window, op and kind, ing_late's undisturbed wait per thread (from every sync thread's merged
# histogram: a few hundred rows, not only the threads preempted in a sync), ing_bio's p99 per
# window, issuer and kind.  In SQL each was two window functions over a few thousand bucket rows:
# ~5 ms of ing_cuda's 9.4 and ing_bio's 8.0, ~2 of ing_late's 5.6, `explain --since 120s` on a
# day's store; fetched and computed here, ~1 ms each.
SYNC_P99, SYNC_Q25, BIO_P99 = "ing_sync_p99", "ing_sync_q25", "ing_bio_p99"
SYNC_HIST_SQL = "SELECT tid, w, op, kind, bucket, n, sum_ns FROM ing_sync_hist"
SYNC_TID_HIST_SQL = """
SELECT tid, bucket, sum(n)::BIGINT AS n, sum(sum_ns)::DOUBLE AS sum_ns FROM ing_sync_hist GROUP BY ALL
"""

# p99_ns for syncs only: the one ing_win reads (sync_p99_ns); merging every
# call's histograms over a day cost 5 s CPU (the raw path has them all).  r
# carries no histogram lists (ing_sync_hist merged the syncs'): carried through r
# they were 460 MB of a day's intermediate rows (0.4 s of the statement's 1.6).
S_CUDA_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_cuda AS
WITH r AS MATERIALIZED (
    SELECT start_ns, pid, tid, op, kind, events_n, duration_ns, bytes, small_copy_n
    FROM {{w}} WHERE {_SFILTER} AND {_PID_FILTER}
      AND NOT (list_contains($host_ops, op) AND NOT list_contains($launch_ops, op))
), l AS (
    SELECT tid, {_SW} AS w, any_value(op) AS op, any_value(pid) AS pid,
           sum(events_n)::BIGINT AS n, sum(duration_ns)::DOUBLE AS dur_ns
    FROM r WHERE list_contains($launch_ops, op)
    GROUP BY tid, w
), g AS (
    SELECT tid, {_SW} AS w, op, coalesce(kind, '') AS kind, any_value(pid) AS pid,
           sum(events_n)::BIGINT AS n, sum(duration_ns)::DOUBLE AS dur_ns,
           coalesce(sum(bytes), 0)::DOUBLE AS bytes, coalesce(sum(small_copy_n), 0)::BIGINT AS small_n
    FROM r WHERE NOT list_contains($launch_ops, op)
    GROUP BY ALL
)
SELECT pid, tid, w, op, 'launch' AS cat, '' AS kind, n, dur_ns,
       NULL::DOUBLE AS p99_ns, 0::DOUBLE AS bytes, 0::BIGINT AS small_n
FROM l
UNION ALL
SELECT g.pid, g.tid, g.w, g.op, {_category('g.op')} AS cat, g.kind, g.n, g.dur_ns, q.value AS p99_ns, g.bytes, g.small_n
FROM g LEFT JOIN {SYNC_P99} q ON q.tid = g.tid AND q.w = g.w AND q.op = g.op AND q.kind = g.kind
"""

# The overflow past the window's end, row by row: at most one off-CPU interval of
# a thread crosses it (analyze/summaries/__init__.py), so this is SCHED_SQL's `over` exactly.
S_SCHED_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_sched AS
WITH g AS (
    SELECT tid, {_SW} AS w, kind, in_call, queued, other_pid,
           any_value(pid) AS pid, sum(events_n) AS n, sum(duration_ns)::DOUBLE AS dur_ns,
           sum(greatest(0, overflow_ns - ($t0 + ({_SW} + 1) * $wns - (start_ns + {NS}))))::DOUBLE AS over,
           coalesce(sum(runq_ns), 0)::DOUBLE AS runq_ns
    FROM {{w}} WHERE {_SFILTER} AND {_PID_FILTER} AND op = 'sched_switch'
    GROUP BY ALL
{_SCHED_SPLIT}"""

# LATE_SQL from the summaries: the late waits are stored one row each; the
# thread's undisturbed wait (25th percentile of its syncs) comes from the merged
# histograms, within summaries.QUANTILE_REL_ERROR.  b - clamp(s0 + u, a, b) =
# least(b - a, greatest(0, (b - s0) - u)).
S_LATE_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_late AS
WITH p AS (
    SELECT pid, tid, {_SW} AS w, sum(duration_ns)::DOUBLE AS wait_preempt_ns
    FROM {{w}} WHERE {_SFILTER} AND {_PID_FILTER} AND op = 'sched_switch' AND kind = 'preempted'
      AND list_contains($sync_ops, in_call)
    GROUP BY ALL
), x AS (
    SELECT pid, tid, {_SW} AS w, sum(preempted_ns)::DOUBLE AS late_hi_ns,
           sum(least(preempted_ns, greatest(0, since_call_ns - q.value)))::DOUBLE AS late_ns,
           count(*)::DOUBLE AS late_n
    FROM {{l}} JOIN {SYNC_Q25} q USING (tid)
    WHERE {_SFILTER} AND {_PID_FILTER}
    GROUP BY ALL
)
SELECT p.pid, p.tid, p.w, p.wait_preempt_ns, coalesce(x.late_hi_ns, 0)::DOUBLE AS late_hi_ns,
       coalesce(x.late_ns, 0)::DOUBLE AS late_ns, coalesce(x.late_n, 0)::DOUBLE AS late_n
FROM p JOIN {SYNC_Q25} q USING (tid) LEFT JOIN x USING (pid, tid, w)
"""

S_FAULTS_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_faults AS
SELECT pid, tid, w, {_INSIDE} AS inside, sum(n) AS n, sum(dur_ns) AS dur_ns
FROM (SELECT tid, {_SW} AS w, in_call, any_value(pid) AS pid, sum(events_n) AS n,
             coalesce(sum(duration_ns), 0)::DOUBLE AS dur_ns
      FROM {{w}} WHERE {_SFILTER} AND {_PID_FILTER} AND op = 'page_fault'
      GROUP BY ALL)
GROUP BY ALL
"""

S_BIO_HIST_SQL = f"""
SELECT w, pid, kind, bucket, sum(n)::BIGINT AS n, sum(sum_ns)::DOUBLE AS sum_ns
FROM (SELECT w, pid, kind, {_UNNEST_HIST}
      FROM (SELECT {_SW} AS w, pid, coalesce(kind, '') AS kind, {_HIST}
            FROM {{w}} WHERE {_SFILTER} AND op = 'block_io'))
GROUP BY ALL
"""

S_BIO_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_bio AS
SELECT g.w, g.pid, g.kind, g.n, g.bytes, g.lat_ns, q.value AS p99_ns, g.max_ns
FROM (SELECT {_SW} AS w, pid, coalesce(kind, '') AS kind,
             sum(events_n)::BIGINT AS n, coalesce(sum(bytes), 0)::DOUBLE AS bytes,
             sum(duration_ns)::DOUBLE AS lat_ns, max(max_duration_ns) AS max_ns
      FROM {{w}} WHERE {_SFILTER} AND op = 'block_io' GROUP BY ALL) g
LEFT JOIN {BIO_P99} q ON q.w = g.w AND q.pid = g.pid AND q.kind = g.kind
"""


def _arrow(con, sql: str, params: dict | None = None) -> pa.Table:
    """The query's rows as Arrow (``params``: only those it names; DuckDB refuses unused ones)."""
    return con.sql(sql, params=params).to_arrow_table()


def build(ctx: Context, source: str = "summaries") -> None:
    """Create every ing_* TEMP table for ``ctx`` (replacing earlier ones).

    ``source``: "summaries" (the per-second summaries: stored by the tracer, or
    made on the fly from the events with the same SQL when the session has
    none) or "events" (one pass over the raw rows: the reference the summaries
    are tested against; also what a range off whole seconds, an explicit
    --from / --to, is built from)."""
    if source not in ("summaries", "events"):
        raise ValueError(f"unknown source {source!r}")
    if not ctx.aligned:  # a range off whole seconds: summaries cannot split a second
        source = "events"
    p = ctx.params(
        # op categories (events/ops.py) as lists: DuckDB takes them as list parameters
        launch_ops=list(LAUNCH_OPS),
        sync_ops=list(SYNC_OPS),
        copy_ops=list(COPY_OPS),
        pinned_ops=list(PINNED_OPS),
        host_ops=list(HOST_OPS),
        small_copy_bytes=SMALL_COPY_BYTES,
        late_eps_ns=LATE_EPS_NS,
    )
    con = ctx.con

    def run(sql: str, *names: str) -> None:
        con.execute(sql, {k: p[k] for k in names})

    base = ("sid", "t0", "t1", "wns", "all_pids", "pids")
    cats = ("launch_ops", "sync_ops", "copy_ops", "pinned_ops")
    # a file older than schema 5 opened read-only has no in_call / queued: a TEMP
    # view derives them from its CUDA calls (the migration's SQL)
    events = events_relation(con, ctx.session_id)
    if source == "events":
        run(CUDA_SQL, *base, *cats, "host_ops", "small_copy_bytes")
        run(SCHED_SQL.format(events=events), *base, *cats)
        con.execute(PREEMPT_SQL)
        run(LATE_SQL.format(events=events), *base, "sync_ops", "late_eps_ns")
        run(FAULTS_SQL.format(events=events), *base, *cats)
        run(BIO_SQL, "sid", "t0", "t1", "wns")
    else:
        if ctx.summarised is None:  # (a Context not made by resolve)
            w, late = summaries.relations(con, events, ctx.session_id, ctx.start_ns, ctx.end_ns)
        else:
            w, late = summaries.relations(con, events, ctx.session_id, ctx.start_ns, ctx.end_ns,
                                          summarised=ctx.summarised, pending=ctx.summaries_pending_ns)
        run(S_SYNC_HIST_SQL.format(w=w), *base, "sync_ops")
        # the quantiles, in numpy over the merged histograms (summaries.hist_quantile)
        con.register(SYNC_P99, summaries.hist_quantile(_arrow(con, SYNC_HIST_SQL), ["tid", "w", "op", "kind"], 0.99))
        con.register(SYNC_Q25, summaries.hist_quantile(_arrow(con, SYNC_TID_HIST_SQL), ["tid"], 0.25))
        bio = _arrow(con, S_BIO_HIST_SQL.format(w=w), {k: p[k] for k in ("sid", "t0", "t1", "wns")})
        con.register(BIO_P99, summaries.hist_quantile(bio, ["w", "pid", "kind"], 0.99))
        run(S_CUDA_SQL.format(w=w), *base, *cats, "host_ops")
        run(S_SCHED_SQL.format(w=w), *base, *cats)
        con.execute(PREEMPT_SQL)
        run(S_LATE_SQL.format(w=w, l=late), *base, "sync_ops")
        run(S_FAULTS_SQL.format(w=w), *base, *cats)
        run(S_BIO_SQL.format(w=w), "sid", "t0", "t1", "wns")
    run(FAILED_SQL, *base, "host_ops", "small_copy_bytes")
    if con.execute("SELECT count(*) FROM ing_failed").fetchone()[0]:
        run(SPLIT_FAILED_SQL, *cats)
    launch_sampling.scale_launches(ctx)  # a trace under --overhead-budget: launches of sampled windows scaled up
    launch_sampling.add_switch_counts(ctx)  # and the off-CPU intervals it counted instead of storing
    _measured_copies(ctx, p)  # a copy's transfer as CUPTI measured it, where it did
    run(SYS_SQL, "sid", "t0", "t1", "wns")
    run(GPU_SQL, "sid", "t0", "t1", "wns")
    run(PCPU_SQL, "sid", "t0", "t1", "wns")
    con.execute(LOOP_SQL)
    con.execute(
        WIN_SQL,
        {
            "wns": ctx.window_ns,
            "t0": ctx.start_ns,
            "nw": ctx.n_windows,
            "c0": ctx.covered_start_ns,
            "c1": ctx.covered_end_ns,
            "sync_copy_ops": list(SYNC_COPY_OPS),
        },
    )
    con.execute(HELPER_SQL)
    quota.build(ctx)  # the CPU wait the cgroup's quota explains: ing_win.quota_wait_ns
