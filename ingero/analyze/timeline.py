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

from ingero.collect.records import CUDA_OPS, OP_NAMES

STEP_PREFIX = "ProfilerStep#"
DATALOADER_PREFIX = "enumerate(DataLoader)"
CUDA_OP_NAMES = sorted(OP_NAMES[o] for o in CUDA_OPS)

# Islands: the union of intervals (s, e) of a relation, per partition key k.  {src} is one of
# this module's own sub-queries (never user text); values come in as $parameters.
ISLANDS = """WITH iv AS ({src}),
o AS (SELECT k, s, e, max(e) OVER (PARTITION BY k ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
      FROM iv WHERE e > s),
g AS (SELECT k, s, e, sum(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                          OVER (PARTITION BY k ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp FROM o)
SELECT k, min(s) AS s, max(e) AS e FROM g GROUP BY k, grp"""

DEVICE_IN_SPAN = """SELECT {key} AS k, greatest(start_ns, $lo) AS s, least(end_ns, $hi) AS e
FROM device_activity WHERE session_id = $sid AND end_ns > $lo AND start_ns < $hi"""

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
    has_device = con.execute("SELECT count(*) > 0 FROM device_activity WHERE session_id = $sid",
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
                  "AND timestamp + coalesce(duration_ns, 0) > $lo AND timestamp < $hi", {"ops": CUDA_OP_NAMES}),
        ("device", "SELECT min(start_ns), max(end_ns) FROM device_activity WHERE session_id = $sid "
                   "AND end_ns > $lo AND start_ns < $hi", {}),
    )
    for source, sql, extra in queries:
        s, e = con.execute(sql, {**p, **extra}).fetchone()
        if s is not None:
            return max(s, lo), min(e, hi), source
    return None


def device(con: duckdb.DuckDBPyConnection, session_id: int, start_ns: int | None = None,
           end_ns: int | None = None) -> DeviceTimeline | None:
    """The measured device timeline over the analysed span; None without device_activity rows."""
    has = con.execute("SELECT count(*) FROM device_activity WHERE session_id = $sid",
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
    keys = con.execute("""SELECT DISTINCT device, stream, dense_rank() OVER (ORDER BY device, stream) AS k
                          FROM device_activity WHERE session_id = $sid ORDER BY k""", {"sid": session_id}).fetchall()
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
            "FROM device_activity WHERE session_id = $sid")
