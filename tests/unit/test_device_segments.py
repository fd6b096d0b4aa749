"""analyze/device/__init__.py's segments and windows in numpy against the SQL they replaced (the oracle here).

The SQL below is what analyze/device/__init__.py ran until 2026-11-27 (ing_dev_seg, then the windows), kept only
as the meaning of the numpy code, and changed with it since (a non-waited segment's caps count at
most the middle of its bounds): every device-inference scenario of test_device_infer and some
demo traces run with each segment table and window row compared to it, exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import test_device_infer as scenarios
from ingero.analyze import device

# Per segment: its submissions, the drain that closed it, the waits in it.
REF_SEG_SQL = """
CREATE OR REPLACE TEMP TABLE ref_dev_seg AS
WITH s AS (
    SELECT pid, w, seg,
           count(*) FILTER (dr = 0 AND role IN ('submit', 'copy')) AS n,
           max(csub) FILTER (dr = 0 AND role IN ('submit', 'copy')) AS cmax,
           min(t) FILTER (dr = 0 AND role IN ('submit', 'copy')) AS s1,
           max(e) FILTER (dr = 0 AND role IN ('submit', 'copy')) AS en,
           max(pos) FILTER (dr = 1) AS r_call,
           max(t) FILTER (dr = 1) AS drain_t,
           coalesce(max(wait) FILTER (dr = 1), 0) AS raw_wait,
           -- surely busy: the drain's wait less every CPU wait inside the segment's syncs
           greatest(0, coalesce(max(wait) FILTER (dr = 1), 0) - coalesce(sum(cpu), 0)) AS drain_wait,
           arg_max(e, pos) FILTER (role = 'cpu') AS cpu_end,
           arg_max(guess, pos) FILTER (role = 'cpu') AS cpu_guess,
           coalesce(sum(wait) FILTER (role = 'wait'), 0) AS other_wait,
           count(*) FILTER (bp) AS bp_n,
           -- the host sat in these launches beyond a normal launch: the queue was full
           coalesce(sum(d) FILTER (bp), 0) AS bp_ns
    FROM ing_dev_seq GROUP BY ALL
), s2 AS (
    -- the likely end of the device's work: the drain's return, or, when the host got the
    -- CPU back only just before returning, the guess of the last off-CPU row inside it
    SELECT *, CASE WHEN cpu_end > drain_t AND r_call - cpu_end <= $tail THEN least(r_call, cpu_guess)
                   ELSE r_call END AS r
    FROM s
), q AS (
    -- one queue of equal kernels k that ended at r: each submission i of n started no
    -- earlier than its call returned (e_i), so the n - i + 1 from it on fit in r - e_i:
    -- k = min over i of (r - e_i) / (n - i + 1); i = 1 is r - s1 spread evenly, i = n the
    -- last kernel alone, a middle i the run after the host stalled (preempted, blocked)
    SELECT d.pid, d.w, d.seg, min((s2.r - d.e) / (s2.cmax - d.csub + 1)) AS k,
           -- a drain that did not wait found the work done when it started: the kernels
           -- from i on ran between submission i's call and the drain's start
           min((s2.drain_t - d.t) / (s2.cmax - d.csub + 1)) AS k_done
    FROM ing_dev_seq d JOIN s2 USING (pid, w, seg)
    WHERE d.dr = 0 AND d.role IN ('submit', 'copy') AND s2.r IS NOT NULL
    GROUP BY ALL
), span AS (
    SELECT pid, coalesce($span_a, min(t)) AS pstart, coalesce($span_b, max(e)) AS pend
    FROM ing_dev_seq WHERE role <> 'cpu' GROUP BY pid
), b AS (
    SELECT s2.*, q.k, q.k_done, span.pstart, span.pend,
           -- the first segment of an interval may hold work queued before it
           CASE WHEN seg = 0 THEN greatest(iv.a, pstart) ELSE s1 END AS a,
           coalesce(r_call, least(iv.b, $t1, pend)) AS z
    FROM s2 JOIN span USING (pid) JOIN ing_dev_iv iv USING (w) LEFT JOIN q USING (pid, w, seg)
), h AS (
    SELECT *, CASE WHEN n = 0 AND seg > 0 THEN 0 ELSE greatest(0, z - a) END AS high FROM b
)
SELECT *, least(high, drain_wait + other_wait + bp_ns) AS low,
       CASE WHEN bp_n > 0 THEN high
            WHEN r IS NOT NULL AND raw_wait - (r_call - r) > $wait_min
                 THEN least(high, greatest(least(high, drain_wait + other_wait + bp_ns),
                                           least(r - a, n * greatest(0, coalesce(k, 0)))))
       END AS point
FROM h
"""

# Segments the host did not wait on take the per-submission device time of
# the process' waited segments; with none, what fits before their drain, at most
# the middle of their bounds; the rest, the middle.
REF_WIN_SQL = """
WITH kk AS (
    SELECT pid, sum(point) / sum(n) AS k FROM ref_dev_seg
    WHERE point IS NOT NULL AND n > 0 AND bp_n = 0 GROUP BY pid
), f AS (
    SELECT s.pid, s.w, s.seg, s.low, s.high, s.n, s.r, s.r_call, s.raw_wait, s.k, s.k_done, s.s1, s.en, s.drain_t,
           -- least() skips NULLs: the learned k, capped by what fits before the drain's start
           -- and its return; with nothing learned, the caps at most the middle of the bounds
           coalesce(s.point, CASE WHEN kk.k IS NOT NULL
                                       THEN least(s.high, greatest(s.low, s.n * least(kk.k, s.k, s.k_done)))
                                  WHEN coalesce(s.k, s.k_done) IS NOT NULL
                                       THEN least(s.high, greatest(s.low, least(s.n * least(s.k, s.k_done),
                                                                                (s.low + s.high) / 2)))
                                  ELSE (s.low + s.high) / 2 END) AS point
    FROM ref_dev_seg s LEFT JOIN kk USING (pid)
), g AS (
    -- the idle after the last submission that the point does not reach into: the host's
    SELECT *, least(greatest(0, CASE WHEN r_call IS NOT NULL AND s1 IS NOT NULL AND en IS NOT NULL
                                     THEN greatest(0, drain_t - en) ELSE 0 END
                                - greatest(0, point - coalesce(en - s1, 0))),
                    greatest(0, high - point)) AS tail
    FROM f
), span AS (
    SELECT pid, coalesce($span_a, min(t) FILTER (role <> 'cpu')) AS pstart,
           coalesce($span_b, max(e) FILTER (role <> 'cpu')) AS pend,
           count(*) FILTER (dr = 0 AND role IN ('submit', 'copy')) AS subs,
           count(*) FILTER (bp) AS bp_n
    FROM ing_dev_seq GROUP BY pid
)
SELECT g.pid, g.w, sum(low)::BIGINT, sum(point)::BIGINT, sum(high)::BIGINT,
       count(*) FILTER (r IS NOT NULL), count(*) FILTER (r IS NOT NULL AND raw_wait - (r_call - r) > $wait_min),
       any_value(span.pstart), any_value(span.pend), any_value(span.subs), any_value(span.bp_n),
       -- the window's last segment was not closed by a drain: work may run on into the next
       arg_max(r IS NULL, seg), sum(tail)::BIGINT
FROM g JOIN span USING (pid)
GROUP BY g.pid, g.w ORDER BY g.pid, g.w
"""


SEG_COLUMNS = ("pid", "w", "seg", "n", "s1", "r_call", "raw_wait", "r", "k", "k_done", "bp_n", "low", "high", "point")


def _numpy_rows(sg: device._Segments) -> list[tuple]:
    def val(x, valid=True):
        if not valid or (isinstance(x, float) and math.isnan(x)):
            return None
        return x

    cols = [sg.pid.tolist(), sg.w.tolist(), sg.seg.tolist(), sg.n.tolist(),
            [val(x, v) for x, v in zip(sg.s1.tolist(), sg.has_s1.tolist())],
            [val(x, v) for x, v in zip(sg.r_call.tolist(), sg.has_r_call.tolist())], sg.raw_wait.tolist(),
            [val(x, v) for x, v in zip(sg.r.tolist(), sg.has_r.tolist())], [val(x) for x in sg.k.tolist()],
            [val(x) for x in sg.k_done.tolist()], sg.bp_n.tolist(), sg.low.tolist(), sg.high.tolist(),
            [val(x) for x in sg.point.tolist()]]
    return list(zip(*cols))


@pytest.fixture
def against_the_sql(monkeypatch):
    """Every _segments / _window_rows call of device.infer checked against the SQL; yields the
    number of segment tables compared."""
    checked = {"segments": 0, "windows": 0}
    state = {}
    segments, window_rows = device._segments, device._window_rows

    def checked_segments(con, ivs, queries, p, seg_params, t):
        sg = segments(con, ivs, queries, p, seg_params, t)
        con.execute(REF_SEG_SQL, seg_params)
        ref = con.execute(f"SELECT {', '.join(SEG_COLUMNS)} FROM ref_dev_seg ORDER BY pid, w, seg").fetchall()
        assert _numpy_rows(sg) == [tuple(int(x) if isinstance(x, int) else x for x in r) for r in ref]
        state.update(con=con, span=(seg_params["span_a"], seg_params["span_b"]))
        checked["segments"] += 1
        return sg

    def checked_window_rows(sg, wait_min):
        rows = window_rows(sg, wait_min)
        span_a, span_b = state["span"]
        ref = state["con"].execute(REF_WIN_SQL, {"wait_min": wait_min, "span_a": span_a, "span_b": span_b}).fetchall()
        assert rows == ref
        checked["windows"] += 1
        return rows

    monkeypatch.setattr(device, "_segments", checked_segments)
    monkeypatch.setattr(device, "_window_rows", checked_window_rows)
    yield checked


def _cases() -> list[tuple[str, dict]]:
    """Every test of test_device_infer that infers, with each of its parameter sets."""
    cases = []
    for name in dir(scenarios):
        test = getattr(scenarios, name)
        if not name.startswith("test_") or name == "test_to_dict_is_the_explain_json_shape":
            continue
        sets = [{}]
        for mark in getattr(test, "pytestmark", []):
            if mark.name == "parametrize":
                sets = [dict(s, **{mark.args[0]: v}) for s in sets for v in mark.args[1]]
        cases += [(name, kw) for kw in sets]
    return cases


@pytest.mark.parametrize("name, kw", _cases(), ids=lambda x: x if isinstance(x, str) else str(x))
def test_segments_and_windows_are_the_sql(name, kw, against_the_sql):
    getattr(scenarios, name)(**kw)
    assert against_the_sql["segments"] >= 1 and against_the_sql["windows"] >= 1


@pytest.mark.parametrize("name", ["cpu-contention", "sync-heavy", "straggler"])
@pytest.mark.parametrize("policy", ["spin", "block"])
def test_demo_traces_segments_are_the_sql(name, policy, against_the_sql):
    """Demo traces: preempted and sleeping syncs (the likely end r), several processes."""
    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain
    from ingero.store.db import Store

    import replays

    store = replays.write(Store.memory(), name, 6, policy, label="segments")
    explain(store.con, Options())
    store.close()
    assert against_the_sql["segments"] >= 1 and against_the_sql["windows"] >= 1


def test_distinct_streams_per_process():
    group = np.array([2, 0, 0, 2, 2, 0, 2])
    values = np.array([7, 5, 5, 9, 7, 1 << 60, 8])
    assert device._distinct_per(group, values, 4).tolist() == [2, 0, 3, 0]
    assert device._distinct_per(group[:0], values[:0], 2).tolist() == [0, 0]
