"""The measured device timeline and the training steps of a session: pure functions over the store.

An imported profiler trace (``ingero import``) carries what eBPF on the host
cannot see: when each kernel, copy and memset really ran on the device
(``device_activity``), and the steps and data loading the user's code marked
(``spans``).  These functions read them for one session and an optional time
range ``[start_ns, end_ns)``; they return None when the session has no such
rows, so a caller tells "not measured" from "idle".

- ``steps(con, sid)``: the ``ProfilerStep#N`` spans: count, median and p99
  duration in ms, each step's start/end, and the time inside it covered by
  ``enumerate(DataLoader)...`` spans (data loading) and by device activity.
- ``analysed_span(con, sid)``: the span the device-busy share is taken over:
  the steps' span (first step's start to last step's end) when steps are
  marked, else the span of the session's CUDA calls, else of the device
  activity; clipped to the range asked for.
- ``breakdown(con, sid, steps)``: where the marked steps' wall clock goes, from
  the trace's own calls and spans: data loading, launches, copies, waits for the
  device (syncs, and launches held by a full launch queue), other CUDA calls,
  and host work (the rest: operators, Python).  The trace has no scheduler or
  fault events, so CPU wait and faults are not parts of it.
- ``device_idle(con, sid, steps)``: per marked step, the time the device ran
  nothing, split by what the steps' process did meanwhile: loading data, in a
  launch, in another CUDA call, in a CPU operator outside all of those (host
  work: host-bound's cause), or nothing the trace recorded.  Its ``host_ops``
  names the operators that held that time.
- ``device(con, sid)``: the MEASURED device-busy share of that span (the union
  of all kernel/copy/memset intervals, every device and stream together), and
  per stream: busy time, and overlap (the part of it during which another
  stream ran too).

Intervals are merged in SQL (gaps and islands over a window maximum), so a
session of millions of kernels never comes into Python row by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from ingero.events import ops
from ingero.events.ops import CUDA_OP_NAMES

STEP_PREFIX = "ProfilerStep#"
DATALOADER_PREFIX = "enumerate(DataLoader)"

# Islands: the union of intervals (s, e) of a relation, per partition key k.  {src} is one of
# this module's own sub-queries (never user text); values come in as $parameters.
ISLANDS = """WITH iv AS ({src}),
o AS (SELECT k, s, e,
             max(e) OVER (PARTITION BY k ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
      FROM iv WHERE e > s),
g AS (SELECT k, s, e, sum(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                          OVER (PARTITION BY k ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp FROM o)
SELECT k, min(s) AS s, max(e) AS e FROM g GROUP BY k, grp"""

# What the device ran: a live trace's rows of host waits (kind 'sync', CUPTI's synchronization
# records) are no device time.
DEVICE_WORK = "kind <> 'sync'"

DEVICE_IN_SPAN = """SELECT {key} AS k, greatest(start_ns, $lo) AS s, least(end_ns, $hi) AS e
FROM device_activity WHERE session_id = $sid AND end_ns > $lo AND start_ns < $hi AND kind <> 'sync'"""

STEP_SPANS = """SELECT name, start_ns, end_ns FROM spans
WHERE session_id = $sid AND starts_with(name, $prefix) AND end_ns > $lo AND start_ns < $hi
ORDER BY start_ns, end_ns"""

# Per stream key: time only that stream was busy.  A sweep over the per-stream islands: +1 and
# +key at each start, -1 and -key at each end; where one stream is busy, the running key sum names it.
EXCLUSIVE = """WITH isl AS ({islands}),
pts AS (SELECT s AS t, 1 AS dc, k AS dk FROM isl UNION ALL SELECT e, -1, -k FROM isl),
agg AS (SELECT t, sum(dc) AS dc, sum(dk) AS dk FROM pts GROUP BY t),
run AS (SELECT t, sum(dc) OVER w AS n, sum(dk) OVER w AS key, lead(t) OVER (ORDER BY t) - t AS len
        FROM agg WINDOW w AS (ORDER BY t ROWS UNBOUNDED PRECEDING))
SELECT key, n, sum(len) FROM run WHERE n >= 1 AND len IS NOT NULL GROUP BY ALL"""


@dataclass(frozen=True)
class Step:
    number: int | None  # N of ProfilerStep#N
    start_ns: int
    end_ns: int
    dataloader_ns: int  # time inside the step covered by enumerate(DataLoader)... spans
    device_busy_ns: int | None  # time inside the step the device ran anything (None: no device timeline)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def dataloader_share(self) -> float:
        return self.dataloader_ns / (self.end_ns - self.start_ns) if self.end_ns > self.start_ns else 0.0

    @property
    def device_busy_share(self) -> float | None:
        """Measured device-busy share of the step, 0..1 (None: the session has no device timeline)."""
        if self.device_busy_ns is None or self.end_ns <= self.start_ns:
            return None
        return self.device_busy_ns / (self.end_ns - self.start_ns)


@dataclass(frozen=True)
class Steps:
    count: int
    median_ms: float
    p99_ms: float
    steps: tuple[Step, ...]

    @property
    def dataloader_ms_median(self) -> float:
        return _quantile([s.dataloader_ns / 1e6 for s in self.steps], 0.5)


# A launch that takes this many times the session's median launch, with the device busy when it
# returns, waited for room in the launch queue (about a thousand entries): back-pressure from a
# busy device, not host overhead.  Real V100 launches are bimodal: median 5.2 µs, and 696 of 4,350
# over 50 µs holding 89% of all launch time on a device 97% busy (issue 26); 4x puts the cut at
# ~21 µs, between the modes.  Only the part above the median counts as waiting.
BACKPRESSURE_FACTOR = 4.0

# The calls of the steps' process inside the steps, by category; a launch's part above the
# median launch is a wait for the device when the device was running something as it returned,
# and so is a copy call's time beyond its own transfer on the device (matched by the call's
# thread and start, as the importer links them).
BREAKDOWN_SQL = """
WITH st AS (SELECT * FROM (VALUES {steps}) t(s, e)),
calls AS (
    SELECT e.timestamp AS t, e.timestamp + e.duration_ns AS t_end, e.duration_ns AS d, e.tid,
           CASE WHEN list_contains($launch, e.op) THEN 'launch'
                WHEN list_contains($copy, e.op) THEN 'copy'
                WHEN list_contains($sync, e.op) THEN 'sync' ELSE 'other' END AS cat
    FROM events e JOIN st ON e.timestamp >= st.s AND e.timestamp < st.e
    WHERE e.session_id = $sid AND e.duration_ns > 0 AND list_contains($cuda, e.op)
), xfer AS (
    -- a copy call's own transfer, as the device ran it: the rest of the call waited for the
    -- work queued before it (a D2H copy into pageable memory waits for the step's kernels)
    SELECT least(c.d, coalesce(sum(a.end_ns - a.start_ns), c.d)) AS moving
    FROM calls c LEFT JOIN device_activity a
      ON a.session_id = $sid AND a.call_tid = c.tid AND a.call_ns = c.t AND a.kind = 'memcpy'
    WHERE c.cat = 'copy' GROUP BY c.t, c.tid, c.d
), med AS (SELECT coalesce(median(d), 0) AS m FROM calls WHERE cat = 'launch'),
busy AS ({islands}),
held AS (
    SELECT c.d - med.m AS excess
    FROM calls c CROSS JOIN med ASOF JOIN busy b ON c.t_end >= b.s
    WHERE c.cat = 'launch' AND c.d > $factor * med.m AND b.e >= c.t_end
)
SELECT coalesce(sum(d) FILTER (cat = 'launch'), 0), coalesce(sum(d) FILTER (cat = 'copy'), 0),
       coalesce(sum(d) FILTER (cat = 'sync'), 0), coalesce(sum(d) FILTER (cat = 'other'), 0),
       (SELECT coalesce(sum(excess), 0) FROM held), (SELECT coalesce(sum(moving), 0) FROM xfer)
FROM calls
"""


@dataclass(frozen=True)
class StepParts:
    """Where the marked steps' wall clock went, summed over the steps, in ns: the parts sum to ``total_ns``."""

    data_wait_ns: int
    host_ns: int
    launch_ns: int
    copy_ns: int
    device_wait_ns: int
    other_cuda_ns: int

    @property
    def total_ns(self) -> int:
        return (self.data_wait_ns + self.host_ns + self.launch_ns + self.copy_ns + self.device_wait_ns
                + self.other_cuda_ns)

    def shares(self) -> dict[str, float]:
        """Each part's share of the steps, keyed as explain's step breakdown (steps.PARTS)."""
        total = self.total_ns
        if total <= 0:
            return {}
        return {k[:-3]: round(v / total, 4) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class StreamBusy:
    device: int | None
    stream: int | None
    busy_ns: int  # union of this stream's intervals within the span
    overlap_ns: int  # part of busy_ns during which another stream also ran


@dataclass(frozen=True)
class DeviceTimeline:
    span_start_ns: int
    span_end_ns: int
    span_source: str  # 'steps' | 'calls' | 'device': what the analysed span is
    busy_ns: int  # union of every kernel/copy/memset interval within the span
    activities: int  # device_activity rows overlapping the span
    overlap_ns: int  # time two or more streams ran at once
    streams: tuple[StreamBusy, ...]

    @property
    def span_ns(self) -> int:
        return self.span_end_ns - self.span_start_ns

    @property
    def busy_share(self) -> float:
        """Measured device-busy share of the analysed span, 0..1."""
        return self.busy_ns / self.span_ns if self.span_ns > 0 else 0.0


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return 0.0
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _range(start_ns: int | None, end_ns: int | None) -> tuple[int, int]:
    return (start_ns if start_ns is not None else -(1 << 62), end_ns if end_ns is not None else 1 << 62)


def _union_ns(con: duckdb.DuckDBPyConnection, src: str, params: dict[str, object]) -> int:
    row = con.execute(f"SELECT coalesce(sum(e - s), 0) FROM ({ISLANDS.format(src=src)})", params).fetchone()
    return int(row[0])


def steps(con: duckdb.DuckDBPyConnection, session_id: int, start_ns: int | None = None,
          end_ns: int | None = None) -> Steps | None:
    """The session's ProfilerStep#N steps overlapping the range; None when it marks no steps."""
    lo, hi = _range(start_ns, end_ns)
    rows = con.execute(STEP_SPANS, {"sid": session_id, "prefix": STEP_PREFIX, "lo": lo, "hi": hi}).fetchall()
    if not rows:
        return None
    has_device = con.execute(f"SELECT count(*) > 0 FROM device_activity WHERE session_id = $sid AND {DEVICE_WORK}",
                             {"sid": session_id}).fetchone()[0]
    out = []
    for name, s, e in rows:
        suffix = name[len(STEP_PREFIX):]
        p = {"sid": session_id, "lo": s, "hi": e}
        loader = _union_ns(con, """SELECT 0 AS k, greatest(start_ns, $lo) AS s, least(end_ns, $hi) AS e FROM spans
                                   WHERE session_id = $sid AND starts_with(name, $prefix)
                                     AND end_ns > $lo AND start_ns < $hi""", {**p, "prefix": DATALOADER_PREFIX})
        busy = _union_ns(con, DEVICE_IN_SPAN.format(key="0"), p) if has_device else None
        out.append(Step(int(suffix) if suffix.isdigit() else None, s, e, loader, busy))
    durations = [st.duration_ms for st in out]
    return Steps(len(out), _quantile(durations, 0.5), _quantile(durations, 0.99), tuple(out))


def breakdown(con: duckdb.DuckDBPyConnection, session_id: int, marked: Steps) -> StepParts:
    """Where the marked steps' time went, from the trace's CUDA calls and spans (see BREAKDOWN_SQL).

    Calls of every thread count (PyTorch launches backward's kernels from its autograd
    thread while the step's own thread waits for it); a part is clipped so that the
    parts never exceed the steps, and host work is what is left.
    """
    total = sum(st.end_ns - st.start_ns for st in marked.steps)
    loader = sum(st.dataloader_ns for st in marked.steps)
    values = _step_values(marked)
    lo = min(st.start_ns for st in marked.steps)
    hi = max(st.end_ns for st in marked.steps)
    islands = ISLANDS.format(src=DEVICE_IN_SPAN.format(key="0"))
    launch, copy, sync, other, held, moving = con.execute(
        BREAKDOWN_SQL.format(steps=values, islands=f"SELECT s, e FROM ({islands})"),
        {"sid": session_id, "lo": lo, "hi": hi, "launch": list(ops.LAUNCH_OPS), "copy": list(ops.COPY_OPS),
         "sync": sorted(ops.SYNC_OPS), "cuda": list(CUDA_OP_NAMES), "factor": BACKPRESSURE_FACTOR}).fetchone()
    held = min(int(held), int(launch))
    moving = min(int(moving), int(copy))
    parts = [loader, int(launch) - held, moving, int(sync) + held + int(copy) - moving, int(other)]
    room = total
    clipped = []
    for v in parts:  # in this order: data loading first, then the calls, so the sum never passes the steps
        v = max(0, min(v, room))
        clipped.append(v)
        room -= v
    data_wait, launch_ns, copy_ns, wait_ns, other_ns = clipped
    return StepParts(data_wait, room, launch_ns, copy_ns, wait_ns, other_ns)


# The thread that ran the marked steps: its process' operators and calls are the host side.
STEP_THREAD_SQL = """
SELECT pid, tid FROM spans WHERE session_id = $sid AND starts_with(name, $prefix)
GROUP BY pid, tid ORDER BY count(*) DESC, pid, tid LIMIT 1
"""

# One sweep over the steps, the device's intervals and the process' operator spans, DataLoader
# spans, launches and other CUDA calls (every thread: PyTorch launches backward's kernels from
# its autograd thread): +1 at each start, -1 at each end, per kind; between two consecutive
# points each running count says whether that kind was active.  A segment inside a step with
# no device interval is device idle, and is given to the first of: data loading, a launch,
# another CUDA call, a CPU operator (host work), nothing recorded.  ``seg`` keeps the segments
# (with the step each lies in), stored once as TEMP ing_idle_seg; the queries below sum them.
IDLE_SEGMENTS = """
CREATE OR REPLACE TEMP TABLE ing_idle_seg AS
WITH st AS (SELECT * FROM (VALUES {steps}) t(s, e)),
calls AS (
    SELECT timestamp AS s, timestamp + duration_ns AS e,
           CASE WHEN list_contains($launch, op::VARCHAR) THEN 'k' ELSE 'c' END AS kind
    FROM events WHERE session_id = $sid AND pid = $pid AND duration_ns > 0
      AND list_contains($cuda, op::VARCHAR) AND timestamp < $hi AND timestamp + duration_ns > $lo
), iv AS (
    SELECT s, e, 's' AS kind FROM st
    UNION ALL SELECT start_ns, end_ns, 'd' FROM device_activity
        WHERE session_id = $sid AND start_ns < $hi AND end_ns > $lo AND kind <> 'sync'
    UNION ALL SELECT start_ns, end_ns, CASE WHEN starts_with(name, $loader) THEN 'l' ELSE 'h' END FROM spans
        WHERE session_id = $sid AND pid = $pid AND start_ns < $hi AND end_ns > $lo
          AND (category = 'cpu_op' OR starts_with(name, $loader))
    UNION ALL SELECT s, e, kind FROM calls
), pts AS (
    SELECT s AS t, kind, 1 AS d FROM iv WHERE e > s UNION ALL SELECT e, kind, -1 FROM iv WHERE e > s
), agg AS (
    SELECT t, sum(d) FILTER (kind = 's') AS s, sum(d) FILTER (kind = 'd') AS dv, sum(d) FILTER (kind = 'l') AS l,
           sum(d) FILTER (kind = 'k') AS k, sum(d) FILTER (kind = 'c') AS c, sum(d) FILTER (kind = 'h') AS h
    FROM pts GROUP BY t
), run AS (
    SELECT t, lead(t) OVER (ORDER BY t) - t AS len,
           sum(coalesce(s, 0)) OVER w AS s, sum(coalesce(dv, 0)) OVER w AS dv, sum(coalesce(l, 0)) OVER w AS l,
           sum(coalesce(k, 0)) OVER w AS k, sum(coalesce(c, 0)) OVER w AS c, sum(coalesce(h, 0)) OVER w AS h
    FROM agg WINDOW w AS (ORDER BY t ROWS UNBOUNDED PRECEDING)
), seg AS (
    SELECT run.t, run.len, st.s AS step,
           CASE WHEN l > 0 THEN 'data' WHEN k > 0 THEN 'launch' WHEN c > 0 THEN 'cuda'
                WHEN h > 0 THEN 'host' ELSE 'unrecorded' END AS part
    FROM run ASOF JOIN st ON run.t >= st.s
    WHERE run.s > 0 AND run.dv = 0 AND run.len > 0 AND run.t < st.e
)
SELECT * FROM seg
"""
IDLE_PARTS_SQL = "SELECT step, part, sum(len) FROM ing_idle_seg GROUP BY ALL"
# The outermost operators (not inside another of their thread's) that the host work of the
# idle segments fell in, the step thread's first where two threads had one open.  A segment
# lies inside its operators, as segments split at every operator's edge.
IDLE_OPS_SQL = """
WITH ops AS (
    SELECT tid, start_ns AS s, end_ns AS e, name FROM (
        SELECT tid, start_ns, end_ns, name,
               max(end_ns) OVER (PARTITION BY tid ORDER BY start_ns, end_ns DESC
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
        FROM spans WHERE session_id = $sid AND pid = $pid AND category = 'cpu_op'
          AND start_ns < $hi AND end_ns > $lo)
    WHERE prev IS NULL OR start_ns >= prev
), host AS (
    SELECT seg.t, seg.len, th.tid FROM ing_idle_seg seg, (SELECT DISTINCT tid FROM ops) th WHERE seg.part = 'host'
), cand AS (
    SELECT host.t, host.len, ops.name, host.tid = $tid AS mine
    FROM host ASOF JOIN ops ON host.tid = ops.tid AND host.t >= ops.s WHERE host.t < ops.e
), pick AS (SELECT t, any_value(len) AS len, arg_max(name, mine) AS name FROM cand GROUP BY t)
SELECT name, sum(len) AS ns FROM pick GROUP BY name ORDER BY ns DESC, name LIMIT $limit
"""


@dataclass(frozen=True)
class StepIdle:
    """One marked step's device-idle time (ns), by what the steps' process did meanwhile."""

    step: Step
    data_ns: int = 0  # in an enumerate(DataLoader) span
    launch_ns: int = 0  # in a launch call
    cuda_ns: int = 0  # in another CUDA call (a sync, a copy, cudaMalloc ...)
    host_ns: int = 0  # in a CPU operator outside all of those: host work
    unrecorded_ns: int = 0  # nothing the trace recorded (Python between operators, or asleep)

    @property
    def idle_ns(self) -> int:
        return self.data_ns + self.launch_ns + self.cuda_ns + self.host_ns + self.unrecorded_ns

    @property
    def wall_ns(self) -> int:
        return self.step.end_ns - self.step.start_ns


def step_thread(con: duckdb.DuckDBPyConnection, session_id: int) -> tuple[int, int] | None:
    """(pid, tid) of the thread that ran the marked steps; None without steps."""
    row = con.execute(STEP_THREAD_SQL, {"sid": session_id, "prefix": STEP_PREFIX}).fetchone()
    return (int(row[0]), int(row[1])) if row else None


def _step_values(marked: Steps) -> str:
    """The steps as a SQL VALUES list of (start, end): ints only, never user text."""
    return ", ".join(f"({int(st.start_ns)}, {int(st.end_ns)})" for st in marked.steps)


@dataclass(frozen=True)
class DeviceIdle:
    """The marked steps' device-idle time by what the process did meanwhile (IDLE_SEGMENTS, swept
    once into TEMP ing_idle_seg on ``con``)."""

    steps: list[StepIdle]
    con: duckdb.DuckDBPyConnection
    params: dict[str, object]

    def host_ops(self, tid: int, limit: int = 3) -> list[tuple[str, int]]:
        """The outermost operators that held the most host work while the device idled, the step
        thread ``tid``'s first: (name, ns) summed over the steps."""
        rows = self.con.execute(IDLE_OPS_SQL, {k: self.params[k] for k in ("sid", "pid", "lo", "hi")}
                                | {"tid": tid, "limit": limit}).fetchall()
        return [(name, int(ns)) for name, ns in rows]


def device_idle(con: duckdb.DuckDBPyConnection, session_id: int, marked: Steps, pid: int) -> DeviceIdle:
    """Per marked step, its device-idle time by what process ``pid`` did meanwhile (IDLE_SEGMENTS)."""
    p = {"sid": session_id, "pid": pid, "lo": min(st.start_ns for st in marked.steps),
         "hi": max(st.end_ns for st in marked.steps), "launch": list(ops.LAUNCH_OPS), "cuda": list(CUDA_OP_NAMES),
         "loader": DATALOADER_PREFIX}
    con.execute(IDLE_SEGMENTS.format(steps=_step_values(marked)), p)
    parts: dict[int, dict[str, int]] = {}
    for step, part, ns in con.execute(IDLE_PARTS_SQL).fetchall():
        parts.setdefault(int(step), {})[f"{part}_ns"] = int(ns)
    return DeviceIdle([StepIdle(st, **parts.get(int(st.start_ns), {})) for st in marked.steps], con, p)


def analysed_span(con: duckdb.DuckDBPyConnection, session_id: int, start_ns: int | None = None,
                  end_ns: int | None = None) -> tuple[int, int, str] | None:
    """(start, end, source) of the span a busy share is taken over; None when the session has nothing."""
    lo, hi = _range(start_ns, end_ns)
    p = {"sid": session_id, "lo": lo, "hi": hi}
    queries = (
        ("steps", "SELECT min(start_ns), max(end_ns) FROM spans WHERE session_id = $sid "
                  "AND starts_with(name, $prefix) AND end_ns > $lo AND start_ns < $hi", {"prefix": STEP_PREFIX}),
        ("calls", "SELECT min(timestamp), max(timestamp + coalesce(duration_ns, 0)) FROM events "
                  "WHERE session_id = $sid AND list_contains($ops, op) "
                  "AND timestamp + coalesce(duration_ns, 0) > $lo AND timestamp < $hi", {"ops": list(CUDA_OP_NAMES)}),
        ("device", "SELECT min(start_ns), max(end_ns) FROM device_activity WHERE session_id = $sid "
                   f"AND end_ns > $lo AND start_ns < $hi AND {DEVICE_WORK}", {}),
    )
    for source, sql, extra in queries:
        s, e = con.execute(sql, {**p, **extra}).fetchone()
        if s is not None:
            return max(s, lo), min(e, hi), source
    return None


def device(con: duckdb.DuckDBPyConnection, session_id: int, start_ns: int | None = None,
           end_ns: int | None = None) -> DeviceTimeline | None:
    """The measured device timeline over the analysed span; None without device_activity rows."""
    has = con.execute(f"SELECT count(*) FROM device_activity WHERE session_id = $sid AND {DEVICE_WORK}",
                      {"sid": session_id}).fetchone()[0]
    if not has:
        return None
    span = analysed_span(con, session_id, start_ns, end_ns)
    if span is None:
        return None
    lo, hi, source = span
    p = {"sid": session_id, "lo": lo, "hi": hi}
    activities = con.execute(f"SELECT count(*) FROM ({DEVICE_IN_SPAN.format(key='0')})", p).fetchone()[0]
    busy = _union_ns(con, DEVICE_IN_SPAN.format(key="0"), p)
    # streams numbered 1..K (dense_rank) so the sweep's key sum names the one busy stream
    keys = con.execute(f"""SELECT DISTINCT device, stream, dense_rank() OVER (ORDER BY device, stream) AS k
                           FROM device_activity WHERE session_id = $sid AND {DEVICE_WORK} ORDER BY k""",
                       {"sid": session_id}).fetchall()
    islands = ISLANDS.format(src=f"SELECT k, greatest(s, $lo) AS s, least(e, $hi) AS e FROM ({_ranked()}) "
                                 "WHERE e > $lo AND s < $hi")
    per_stream = dict(con.execute(f"SELECT k, sum(e - s) FROM ({islands}) GROUP BY k", p).fetchall())
    exclusive: dict[int, int] = {}
    overlap = 0
    for key, n, length in con.execute(EXCLUSIVE.format(islands=islands), p).fetchall():
        if n == 1:
            exclusive[int(key)] = exclusive.get(int(key), 0) + int(length)
        else:
            overlap += int(length)
    streams = tuple(
        StreamBusy(dev, stream, int(per_stream.get(k, 0)), int(per_stream.get(k, 0)) - exclusive.get(k, 0))
        for dev, stream, k in keys if per_stream.get(k))
    return DeviceTimeline(lo, hi, source, busy, int(activities), overlap, streams)


def _ranked() -> str:
    """device_activity of the session with a small stream key k (1..K, ordered by device, stream)."""
    return ("SELECT dense_rank() OVER (ORDER BY device, stream) AS k, start_ns AS s, end_ns AS e "
            f"FROM device_activity WHERE session_id = $sid AND {DEVICE_WORK}")
