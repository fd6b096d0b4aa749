"""The device's measured timeline of a live trace (CUPTI under `trace --cmd`), in place of the inference.

A traced session whose ``device_activity`` rows carry a pid (collect/cupti.py)
has, for those processes, what analyze/device/__init__.py can only bound: when the device ran
their kernels, copies and memsets.  ``overlay`` replaces each such process'
inferred ``DeviceActivity`` with one of the same shape whose numbers are
measured, window by window, so every reader of it (explain's ``Device:``
line, ctx.device_busy, host-bound's and launch-bound's idle split) reads the
device as it was:

  point = low   the union of the process' device intervals in the window's
                analysed span (every device and stream together);
  high          that plus the device's idle time inside the segments the
                calls cut (from a segment's first submission to the drain that
                closed it: when the process had work queued or being queued),
                so ``span - high`` is the idle with nothing of the process
                queued, as in the inference;
  tail          of that idle, what fell after a segment's last submission and
                before its drain started (the host elsewhere, not launching).

The segments and intervals are the inference's own (device.infer keeps them on
ctx.derived.device_segments), so the two split a window the same way and only
the device's busy time differs.  Busy time inside any interval is read off a
running sum over the merged device intervals (one ASOF join for every point
asked), never by joining intervals with intervals.

``live(ctx)`` says whether the session has such a timeline at all.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from ingero.analyze import procs
from ingero.analyze.context import Context
from ingero.analyze.device import DeviceActivity, WindowBusy
from ingero.analyze.device.imported import DEVICE_WORK  # (host waits CUPTI recorded are no device time)


PIDS_SQL = f"""
SELECT DISTINCT pid FROM device_activity
WHERE session_id = $sid AND pid IS NOT NULL AND {DEVICE_WORK} AND end_ns > $t0 AND start_ns < $t1
"""

# B(t) per query point: the device's busy time of the process from its first interval up to t,
# over the union of its intervals (islands: gaps and islands over a running maximum).
BUSY_UP_TO_SQL = f"""
WITH iv AS (
    SELECT pid AS k, start_ns AS s, end_ns AS e FROM device_activity
    WHERE session_id = $sid AND list_contains($pids, pid) AND {DEVICE_WORK} AND end_ns > $lo AND start_ns < $hi
), o AS (
    SELECT k, s, e, max(e) OVER (PARTITION BY k ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
    FROM iv WHERE e > s
), g AS (
    SELECT k, s, e, sum(CASE WHEN prev IS NULL OR s > prev THEN 1 ELSE 0 END)
                        OVER (PARTITION BY k ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp FROM o
), isl AS (
    SELECT k, min(s) AS s, max(e) AS e FROM g GROUP BY k, grp
), cum AS (
    SELECT k, s, e,
           coalesce(sum(e - s) OVER (PARTITION BY k ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
               AS before
    FROM isl
)
SELECT q.i, coalesce(c.before + least(greatest(q.t - c.s, 0), c.e - c.s), 0) AS b
FROM _ing_measured_q q ASOF LEFT JOIN cum c ON q.pid = c.k AND q.t >= c.s
"""


def live(ctx: Context) -> set[int]:
    """The processes of a traced (not imported) session that have a measured device timeline."""
    if ctx.imported_from or not procs.has_table(ctx.con, "device_activity"):
        return set()
    cols = {r[0] for r in ctx.con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'device_activity'").fetchall()}
    if "pid" not in cols:  # a file written before schema 15, read without migrating
        return set()
    return {int(r[0]) for r in ctx.con.execute(PIDS_SQL, {"sid": ctx.session_id, "t0": ctx.start_ns,
                                                          "t1": ctx.end_ns}).fetchall()}


def overlay(ctx: Context, activity: dict[int, DeviceActivity], pids: set[int]) -> dict[int, DeviceActivity]:
    """``activity`` with the processes in ``pids`` measured (the others as inferred)."""
    want = [p for p in activity if p in pids]
    if not want or ctx.derived.device_segments is None:
        return activity
    seg, ivs = ctx.derived.device_segments
    out = dict(activity)
    for pid in want:
        out[pid] = _measured(ctx, activity[pid], seg, ivs)
    return out


def _busy_up_to(ctx: Context, pid: int, t: np.ndarray) -> np.ndarray:
    """B(t) for each time in ``t``: the process' device busy ns up to it."""
    if not len(t):
        return np.zeros(0, np.int64)
    con = ctx.con
    q = pa.table({"i": np.arange(len(t), dtype=np.int64), "pid": np.full(len(t), pid, np.int64),
                  "t": t.astype(np.int64)})
    con.register("_ing_measured_q", q)
    try:
        rows = con.execute(BUSY_UP_TO_SQL, {"sid": ctx.session_id, "pids": [pid], "lo": int(t.min()) - 1,
                                            "hi": int(t.max()) + 1}).fetchnumpy()
    finally:
        con.unregister("_ing_measured_q")
    out = np.zeros(len(t), np.int64)
    out[np.asarray(rows["i"], np.int64)] = np.asarray(rows["b"], np.int64)
    return out


def _measured(ctx: Context, act: DeviceActivity, seg, ivs: pa.Table) -> DeviceActivity:
    """One process' activity, its windows' numbers measured over the inference's own spans."""
    pid, pstart, pend = act.pid, act.start_ns, act.end_ns
    iv_w = ivs.column("w").to_numpy()
    iv_win = ivs.column("win").to_numpy()
    iv_a = np.maximum(ivs.column("a").to_numpy(), pstart)
    iv_b = np.minimum(np.minimum(ivs.column("b").to_numpy(), ctx.end_ns), pend)
    iv_ok = iv_b > iv_a
    mine = seg.pid == pid
    has_span = mine & seg.has_span
    s_lo, s_hi = seg.span_a[has_span], np.maximum(seg.span_a[has_span], seg.span_z[has_span])
    s_win = iv_win[np.minimum(np.searchsorted(iv_w, seg.w[has_span]), max(len(iv_w) - 1, 0))]
    has_tail = mine & seg.has_r_call & seg.has_s1 & seg.has_en & (seg.drain_t > seg.en)
    t_lo, t_hi = seg.en[has_tail], seg.drain_t[has_tail]
    t_win = iv_win[np.minimum(np.searchsorted(iv_w, seg.w[has_tail]), max(len(iv_w) - 1, 0))]
    points = np.concatenate([iv_a[iv_ok], iv_b[iv_ok], s_lo, s_hi, t_lo, t_hi])
    b = _busy_up_to(ctx, pid, points)
    n_iv, n_s, n_t = int(iv_ok.sum()), len(s_lo), len(t_lo)
    cut = np.cumsum([0, n_iv, n_iv, n_s, n_s, n_t, n_t])
    part = [b[cut[i]:cut[i + 1]] for i in range(6)]
    busy_iv = part[1] - part[0]
    idle_seg = (s_hi - s_lo) - (part[3] - part[2])
    idle_tail = (t_hi - t_lo) - (part[5] - part[4])

    def per_window(win: np.ndarray, values: np.ndarray) -> dict[int, int]:
        out: dict[int, int] = {}
        for w, v in zip(win.tolist(), values.tolist()):
            out[w] = out.get(w, 0) + int(v)
        return out

    busy_w = per_window(iv_win[iv_ok], busy_iv)
    seg_w = per_window(s_win, idle_seg)
    tail_w = per_window(t_win, idle_tail)
    wins = []
    for wb in act.windows:
        busy = min(busy_w.get(wb.w, 0), wb.span_ns)
        high = min(wb.span_ns, busy + max(0, seg_w.get(wb.w, 0)))
        wins.append(WindowBusy(wb.w, wb.start_ns, wb.span_ns, busy, busy, high,
                               min(max(0, tail_w.get(wb.w, 0)), high - busy)))
    total = sum(x.span_ns for x in wins) or 1
    share = sum(x.point_ns for x in wins) / total
    return replace(act, busy_share=share, low=share, high=share, windows=tuple(wins), source="measured")
