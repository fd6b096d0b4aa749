"""Window metrics: one pass of DuckDB SQL over the events, per process and window.

``build(ctx)`` creates small TEMP tables (a few rows per process and window)
that every rule reads; the events table itself is scanned only here, so
explain stays linear in the number of events.

  ing_cuda     pid, tid, w, op, cat, kind: count, host time, p50/p99, max, bytes
  ing_sched    pid, tid, w, kind, inside (CUDA call category the thread was in
               when switched out, 'none' outside any call), other_pid (who
               preempted, 0 for sleeps): count, off-CPU ns, runq ns
  ing_long     tid, timestamp, end_ns, cat (index into CAT_NAMES): CUDA calls long enough to
               contain an interval
  ing_preempt  pid, tid, w, other_pid: preemptions while runnable and their time
  ing_faults   pid, tid, w, inside: page faults of traced processes (count, time when known)
  ing_bio      w, pid (issuer), kind: block requests, bytes, latency
  ing_sys      w: host metrics;  ing_gpu  w: NVML metrics
  ing_pcpu     w, pid, comm: host-wide per-process CPU (names the competitors)
  ing_loop     pid, tid: the thread issuing most CUDA calls of each CUDA process
  ing_win      pid, w: the loop thread's metrics joined into one row (rules' main input)
  ing_helper   pid, w: traced processes without CUDA calls (DataLoader workers)

Window index w = (timestamp - start) // window_ns.  An off-CPU interval that
crosses a window boundary is split: its remainder (up to one window) counts
in the next window, so shares stay exact and never exceed 100%.
"""

from __future__ import annotations

from ingero.analyze.context import Context

# Op categories.  Names are events.op values (collect/records.py OP_NAMES).
LAUNCH_OPS = ["cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch"]
SYNC_OPS = ["cudaStreamSync", "cudaDeviceSync", "cudaEventSync", "cuCtxSynchronize", "cuStreamSynchronize"]
COPY_OPS = ["cudaMemcpy", "cudaMemcpyAsync", "cuMemcpy", "cuMemcpyAsync"]
# Synchronous copy entry points: the host waits for the whole transfer.
SYNC_COPY_OPS = ["cudaMemcpy", "cuMemcpy"]
PINNED_OPS = ["cudaMallocHost", "cudaHostRegister"]
HOST_OPS = ["sched_switch", "page_fault", "block_io", "proc_exec", "proc_exit", "bench", "none"]

_FILTER = """session_id = $sid AND timestamp >= $t0 AND timestamp < $t1"""
_PID_FILTER = """($all_pids OR list_contains($pids, pid))"""
_CAT = """CASE WHEN list_contains($launch_ops, op) THEN 'launch'
               WHEN list_contains($sync_ops, op) THEN 'sync'
               WHEN list_contains($copy_ops, op) THEN 'copy'
               WHEN list_contains($pinned_ops, op) THEN 'pinned'
               ELSE 'other' END"""

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
           count(*) AS n, sum(duration_ns)::DOUBLE AS dur_ns, max(duration_ns) AS max_ns
    FROM events
    WHERE {_FILTER} AND {_PID_FILTER} AND list_contains($launch_ops, op)
    GROUP BY tid, w
), g AS (
    SELECT tid, (timestamp - $t0) // $wns AS w, op, coalesce(kind, '') AS kind, any_value(pid) AS pid,
           count(*) AS n,
           sum(duration_ns)::DOUBLE AS dur_ns,
           max(duration_ns) AS max_ns,
           -- one state for both quantiles (two keep two copies of every value)
           quantile_cont(duration_ns, [0.5, 0.99]) AS q,
           coalesce(sum(bytes), 0)::DOUBLE AS bytes,
           count(*) FILTER (bytes <= $small_copy_bytes) AS small_n
    FROM events
    WHERE {_FILTER} AND {_PID_FILTER} AND NOT list_contains($host_ops, op) AND NOT list_contains($launch_ops, op)
    GROUP BY ALL
)
SELECT pid, tid, w, op, 'launch' AS cat, '' AS kind, n, dur_ns, max_ns, NULL::DOUBLE AS p50_ns,
       NULL::DOUBLE AS p99_ns, 0::DOUBLE AS bytes, 0::BIGINT AS small_n
FROM l
UNION ALL
SELECT pid, tid, w, op, {_CAT} AS cat, kind, n, dur_ns, max_ns, q[1] AS p50_ns, q[2] AS p99_ns, bytes, small_n
FROM g
"""

# CUDA calls that can contain an off-CPU interval or a fault worth
# classifying: a call shorter than MIN_CONTAINING_NS cannot hold an off-CPU
# interval longer than itself, so leaving short calls (most launches) out of
# the join changes nothing for intervals >= 20 us and keeps the join small.
# Thread ids are unique host-wide, so the join needs no pid.
MIN_CONTAINING_NS = 20_000
# The category is kept as a small integer (an index into CAT_NAMES, named on
# the joined rows only): storing the string cost more than the rest of the
# table (at 10 M events: long calls 0.30 -> 0.26 s CPU, and the off-CPU and
# fault joins reading them 0.10 s less).
CAT_NAMES = ["other", "launch", "sync", "copy", "pinned"]
# Same order of tests as _CAT (an op in two lists takes the first).
_CAT_CODE = "CASE {} ELSE 0 END::UTINYINT".format(" ".join(
    f"WHEN list_contains(${cat}_ops, op) THEN {CAT_NAMES.index(cat)}" for cat in ("launch", "sync", "copy", "pinned")
))
_CAT_NAME = "$cat_names[cu.cat + 1]"
LONG_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_long AS
SELECT tid, timestamp, timestamp + duration_ns AS end_ns, {_CAT_CODE} AS cat
FROM events WHERE {_FILTER} AND {_PID_FILTER} AND duration_ns >= {MIN_CONTAINING_NS}
  AND NOT list_contains($host_ops, op)
"""
_CONTAINING = "SELECT * FROM ing_long"

# Each off-CPU interval is matched (ASOF) to the last CUDA call the same
# thread started before it; when that call had not returned yet, the thread
# was switched out inside it (e.g. sleeping in a sync: waiting for the GPU,
# not contention, not starvation).
SCHED_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_sched AS
WITH sw AS (
    SELECT pid, tid, timestamp, duration_ns,
           CASE WHEN preempted THEN 'preempted' ELSE coalesce(kind, 'other') END AS kind,
           coalesce(runq_ns, 0) AS runq_ns,
           CASE WHEN preempted OR kind = 'preempted' THEN coalesce(other_pid, 0) ELSE 0 END AS other_pid
    FROM events WHERE {_FILTER} AND {_PID_FILTER} AND op = 'sched_switch'
), calling AS (
    SELECT DISTINCT tid FROM ing_long
), copying AS (
    SELECT DISTINCT tid FROM ing_long WHERE cat = $copy_cat
), j AS (
    -- only sleeps and D-state intervals of CUDA-calling threads need the
    -- join (preemptions count the same inside or outside a call)
    SELECT sw.pid, sw.tid, (sw.timestamp - $t0) // $wns AS w, sw.kind,
           CASE WHEN cu.end_ns > sw.timestamp THEN {_CAT_NAME} ELSE 'none' END AS inside,
           sw.duration_ns AS dur, $t0 + ((sw.timestamp - $t0) // $wns + 1) * $wns - sw.timestamp AS room,
           sw.runq_ns, sw.other_pid
    FROM (SELECT * FROM sw WHERE kind IN ('sleep', 'io') AND tid IN (SELECT tid FROM calling)) sw
    ASOF LEFT JOIN ing_long cu ON sw.tid = cu.tid AND sw.timestamp >= cu.timestamp
    UNION ALL
    -- preemptions need the call only when it is a copy: time preempted
    -- inside a copy call is CPU wait, not transfer time (transfer-bound
    -- subtracts it).  Copies are few, so this join stays small.
    SELECT sw.pid, sw.tid, (sw.timestamp - $t0) // $wns AS w, sw.kind,
           CASE WHEN cu.end_ns > sw.timestamp THEN 'copy' ELSE 'none' END AS inside,
           sw.duration_ns AS dur, $t0 + ((sw.timestamp - $t0) // $wns + 1) * $wns - sw.timestamp AS room,
           sw.runq_ns, sw.other_pid
    FROM (SELECT * FROM sw WHERE kind = 'preempted' AND tid IN (SELECT tid FROM copying)) sw
    ASOF LEFT JOIN (SELECT tid, timestamp, end_ns FROM ing_long WHERE cat = $copy_cat) cu
         ON sw.tid = cu.tid AND sw.timestamp >= cu.timestamp
    UNION ALL
    SELECT pid, tid, (timestamp - $t0) // $wns, kind, 'none',
           duration_ns, $t0 + ((timestamp - $t0) // $wns + 1) * $wns - timestamp, runq_ns, other_pid
    FROM sw WHERE NOT (kind IN ('sleep', 'io') AND tid IN (SELECT tid FROM calling))
              AND NOT (kind = 'preempted' AND tid IN (SELECT tid FROM copying))
), g AS (
    -- per group: the part inside the start window, and the spill into the next
    SELECT pid, tid, w, kind, inside, other_pid, count(*) AS n,
           sum(least(dur, room))::DOUBLE AS off_in, sum(greatest(0, least(dur - room, $wns)))::DOUBLE AS spill,
           sum(runq_ns)::DOUBLE AS runq_ns, sum(dur)::DOUBLE AS dur_ns
    FROM j GROUP BY ALL
)
SELECT pid, tid, w, kind, inside, other_pid, sum(n) AS n, sum(off_ns) AS off_ns, sum(runq_ns) AS runq_ns,
       sum(dur_ns) AS dur_ns
FROM (SELECT pid, tid, w, kind, inside, other_pid, n, off_in AS off_ns, runq_ns, dur_ns FROM g
      UNION ALL
      SELECT pid, tid, w + 1, kind, inside, other_pid, 0, spill, 0, 0 FROM g WHERE spill > 0)
GROUP BY ALL
"""

# Preemptions and who took the CPU, from ing_sched (off_ns: whole intervals,
# counted in the window they start in).
PREEMPT_SQL = """
CREATE OR REPLACE TEMP TABLE ing_preempt AS
SELECT pid, tid, w, other_pid, sum(n) AS n, sum(dur_ns) AS off_ns
FROM ing_sched WHERE kind = 'preempted' AND n > 0
GROUP BY ALL
"""

# Faults are matched to the CUDA call they happened in, like off-CPU intervals:
# a copy whose source pages fault in is slow because of memory, not the bus.
FAULTS_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_faults AS
WITH pf AS (
    SELECT pid, tid, timestamp, coalesce(duration_ns, 0) AS duration_ns
    FROM events WHERE {_FILTER} AND {_PID_FILTER} AND op = 'page_fault'
), copying AS (
    SELECT DISTINCT tid FROM ing_long WHERE cat = $copy_cat
), j AS (
    -- only a copy call matters (its source paged in while copying): the
    -- join is against the few copy calls, for the threads that make them
    SELECT pf.pid, pf.tid, pf.timestamp, pf.duration_ns,
           CASE WHEN cu.end_ns > pf.timestamp THEN 'copy' ELSE 'none' END AS inside
    FROM (SELECT * FROM pf WHERE tid IN (SELECT tid FROM copying)) pf
    ASOF LEFT JOIN (SELECT tid, timestamp, end_ns FROM ing_long WHERE cat = $copy_cat) cu
         ON pf.tid = cu.tid AND pf.timestamp >= cu.timestamp
    UNION ALL
    SELECT pid, tid, timestamp, duration_ns, 'none' FROM pf WHERE tid NOT IN (SELECT tid FROM copying)
)
SELECT pid, tid, (timestamp - $t0) // $wns AS w, inside, count(*) AS n, sum(duration_ns)::DOUBLE AS dur_ns
FROM j GROUP BY ALL
"""

# Block I/O is host-wide (the issuer may be any process): no pid filter.
BIO_SQL = f"""
CREATE OR REPLACE TEMP TABLE ing_bio AS
SELECT (timestamp - $t0) // $wns AS w, pid, coalesce(kind, '') AS kind,
       count(*) AS n, coalesce(sum(bytes), 0)::DOUBLE AS bytes,
       sum(duration_ns)::DOUBLE AS lat_ns, quantile_cont(duration_ns, 0.99) AS p99_ns,
       max(duration_ns) AS max_ns
FROM events WHERE {_FILTER} AND op = 'block_io'
GROUP BY ALL
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

LOOP_SQL = """
CREATE OR REPLACE TEMP TABLE ing_loop AS
SELECT pid, arg_max(tid, n) AS tid, sum(n) AS cuda_n
FROM (SELECT pid, tid, sum(n) AS n FROM ing_cuda GROUP BY ALL)
GROUP BY pid
"""

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
        sum(dur_ns) FILTER (cat = 'sync') AS sync_ns,
        max(p99_ns) FILTER (cat = 'sync') AS sync_p99_ns,
        sum(n) FILTER (cat = 'copy') AS copy_n,
        sum(dur_ns) FILTER (cat = 'copy') AS copy_ns,
        sum(bytes) FILTER (cat = 'copy') AS copy_bytes,
        sum(dur_ns) FILTER (list_contains($sync_copy_ops, op)) AS sync_copy_ns,
        sum(bytes) FILTER (list_contains($sync_copy_ops, op)) AS sync_copy_bytes,
        sum(small_n) FILTER (cat = 'copy' AND kind = 'D2H') AS small_d2h_n
    FROM ing_cuda c JOIN ing_loop l ON c.pid = l.pid AND c.tid = l.tid
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
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep' AND inside = 'sync') AS sleep_sync_ns,
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'io') AS io_ns,
        sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'io' AND inside = 'none') AS io_out_ns,
        -- CPU wait inside copy calls: preempted, or runnable after the DMA woke it
        sum(off_ns) FILTER (kind = 'preempted' AND inside = 'copy') AS copy_preempt_ns,
        sum(runq_ns) FILTER (kind <> 'preempted' AND inside = 'copy') AS copy_runq_ns
    FROM ing_sched s JOIN ing_loop l ON s.pid = l.pid AND s.tid = l.tid
    GROUP BY ALL
)
SELECT c.pid, c.w, least($wns, $t1 - ($t0 + c.w * $wns))::DOUBLE AS wall_ns,
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
    least(coalesce(s.preempt_ns, 0) + coalesce(s.wake_runq_ns, 0), $wns) AS cpu_wait_ns,
    coalesce(s.sleep_ns, 0) AS sleep_ns, coalesce(s.sleep_out_ns, 0) AS sleep_out_ns,
    coalesce(s.sleep_sync_ns, 0) AS sleep_sync_ns,
    coalesce(s.io_ns, 0) AS io_ns, coalesce(s.io_out_ns, 0) AS io_out_ns,
    least(coalesce(s.copy_preempt_ns, 0) + coalesce(s.copy_runq_ns, 0), coalesce(c.copy_ns, 0)) AS copy_wait_ns,
    coalesce(f.n, 0) AS faults_n, coalesce(f.dur_ns, 0) AS faults_ns,
    coalesce(f.copy_n, 0) AS copy_faults_n, coalesce(f.copy_ns, 0) AS copy_faults_ns
FROM c LEFT JOIN s USING (pid, w)
       LEFT JOIN (SELECT pid, w, sum(n) AS n, sum(dur_ns) AS dur_ns,
                         sum(n) FILTER (inside = 'copy') AS copy_n,
                         sum(dur_ns) FILTER (inside = 'copy') AS copy_ns
                  FROM ing_faults GROUP BY ALL) f USING (pid, w)
WHERE c.w >= 0 AND c.w < $nw
"""

HELPER_SQL = """
CREATE OR REPLACE TEMP TABLE ing_helper AS
WITH traced AS (
    SELECT DISTINCT pid FROM ing_sched
    UNION SELECT DISTINCT pid FROM ing_faults
), helpers AS (
    SELECT pid FROM traced WHERE pid NOT IN (SELECT pid FROM ing_loop)
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

# Below this many bytes a device-to-host copy is a scalar read-back
# (`tensor.item()`, a loss print): 1 KiB covers any scalar or tiny vector.
SMALL_COPY_BYTES = 1024


def build(ctx: Context) -> None:
    """Create every ing_* TEMP table for ``ctx`` (replacing earlier ones)."""
    p = ctx.params(
        launch_ops=LAUNCH_OPS,
        sync_ops=SYNC_OPS,
        copy_ops=COPY_OPS,
        pinned_ops=PINNED_OPS,
        host_ops=HOST_OPS,
        small_copy_bytes=SMALL_COPY_BYTES,
        cat_names=CAT_NAMES,
        copy_cat=CAT_NAMES.index("copy"),
    )
    con = ctx.con

    def run(sql: str, *names: str) -> None:
        con.execute(sql, {k: p[k] for k in names})

    base = ("sid", "t0", "t1", "wns", "all_pids", "pids")
    cats = ("launch_ops", "sync_ops", "copy_ops", "pinned_ops")
    run(CUDA_SQL, *base, *cats, "host_ops", "small_copy_bytes")
    run(LONG_SQL, "sid", "t0", "t1", "all_pids", "pids", *cats, "host_ops")
    run(SCHED_SQL, *base, "cat_names", "copy_cat")
    con.execute(PREEMPT_SQL)
    run(FAULTS_SQL, *base, "copy_cat")
    run(BIO_SQL, "sid", "t0", "t1", "wns")
    run(SYS_SQL, "sid", "t0", "t1", "wns")
    run(GPU_SQL, "sid", "t0", "t1", "wns")
    run(PCPU_SQL, "sid", "t0", "t1", "wns")
    con.execute(LOOP_SQL)
    con.execute(
        WIN_SQL,
        {
            "wns": ctx.window_ns,
            "t0": ctx.start_ns,
            "t1": ctx.end_ns,
            "nw": ctx.n_windows,
            "sync_copy_ops": SYNC_COPY_OPS,
        },
    )
    con.execute(HELPER_SQL)
