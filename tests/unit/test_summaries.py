"""Explain on the per-second summaries against explain on the raw events, on every demo trace.

The summaries are written as the tracer writes them: flush by flush, each
flush holding the records of the rows that ended (were emitted) in it, so a
second spans several flushes and off-CPU intervals arrive after their second,
summarised by analyze/summaries/records.py (and, for the slow runs, checked row for row
against the SQL that defines the metrics).  Chains must
be identical (rule, severity, processes, culprits, evidence windows) and every
number within what the histogram quantiles allow: each quantile within
summaries.QUANTILE_REL_ERROR (4.4%) of the exact one, a ratio of two within
twice that.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ingero.analyze import summaries, windows

from ingero.analyze.summaries import records
from ingero.analyze.context import Options, resolve
from ingero.analyze.explain import explain
from ingero.collect import decode
from ingero.demo import scenarios
from ingero.store.db import Store

import replays
import test_record_summaries

START_NS = 1_763_800_000 * 10**9 + 123_456_789  # not on a whole second
FLUSH_NS = 700_000_000  # flushes not aligned with seconds either
REL = 2 * summaries.QUANTILE_REL_ERROR + 1e-9


def _store(name: str, policy: str, fixed: bool) -> Store:
    return replays.write(Store.memory(), name, 20, policy, fixed=fixed, start_ns=START_NS, label="summaries")


def write_as_tracer(store: Store, session_id: int = 1, check_rows: bool = False, held: int = 0) -> int:
    """Summaries written as the tracer writes them, flush by flush, each flush the records of the
    rows emitted (ended) in it, summarised by summaries/records.py: flushes made.  ``check_rows``: each
    flush also summarised by the SQL that defines the metrics, and the rows compared at the end.
    ``held``: the windows rows of the last ``held`` flushes are not written (a tracer killed
    before writing what it held): the session row marks their first second."""
    con = store.con
    offset = START_NS - 10**12
    end = "timestamp + coalesce(duration_ns, 0)"
    recs = replays.records_of(con, "true", {}, offset, order_by=end)
    ends = (recs["ts_ns"] + recs["duration_ns"]).astype(np.int64) + offset
    if check_rows:
        con.execute(f"CREATE OR REPLACE TEMP TABLE flushed AS SELECT *, ({end} - $lo) // {FLUSH_NS} AS flush "
                    "FROM events", {"lo": int(ends[0])})
    summariser = records.Summariser(session_id, offset)
    flushes, pending = 0, None
    starts = list(range(int(ends[0]), int(ends[-1]) + 1, FLUSH_NS))
    for k, f0 in enumerate(starts):
        a, b = np.searchsorted(ends, [f0, f0 + FLUSH_NS])
        windows_rows, late = summariser.rows(decode.storage_order(recs[a:b]))
        store.append("window_late_waits", late)
        if k < len(starts) - held:
            store.append("windows", windows_rows)
        elif windows_rows.num_rows:
            first = int(np.min(windows_rows["start_ns"].to_numpy()))
            pending = first if pending is None else min(pending, first)
        if check_rows:
            test_record_summaries.summarise_sql(con, "SELECT * EXCLUDE (flush) FROM flushed WHERE flush = $k",
                                                {"k": k}, session_id)
        flushes += 1
    if check_rows:
        test_record_summaries.assert_same_rows(con)
    if held:
        store.update_session(session_id, summaries_pending_ns=pending)
    return flushes


def _close(a: float, b: float) -> bool:
    if a is None or b is None or isinstance(a, str):
        return a == b
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-6)


def _same(a, b) -> None:
    assert [(c.rule_id, c.severity) for c in a.chains] == [(c.rule_id, c.severity) for c in b.chains]
    for ca, cb in zip(a.chains, b.chains):
        assert ca.pids == cb.pids and ca.culprits == cb.culprits, ca.rule_id
        assert ca.evidence_windows == cb.evidence_windows and ca.windows_total == cb.windows_total, ca.rule_id
        assert ca.numbers.keys() == cb.numbers.keys(), ca.rule_id
        for k in ca.numbers:
            assert _close(ca.numbers[k], cb.numbers[k]), (ca.rule_id, k, ca.numbers[k], cb.numbers[k])
        assert _close(ca.share, cb.share) and _close(ca.impact, cb.impact), ca.rule_id
    assert a.analysed == b.analysed
    assert a.device == b.device
    assert (a.steps is None) == (b.steps is None)
    if a.steps is not None:
        assert (a.steps.count, a.steps.median_ms, a.steps.p99_ms) == (b.steps.count, b.steps.median_ms, b.steps.p99_ms)
        assert a.steps.breakdown.keys() == b.steps.breakdown.keys()
        # shares of the step: CPU wait holds the late-wait estimate (a quantile), and the device
        # wait is what remains of the step; 0.001 of a step is 0.1%
        for k in a.steps.breakdown:
            assert abs(a.steps.breakdown[k] - b.steps.breakdown[k]) <= 0.002, (k, a.steps.breakdown, b.steps.breakdown)


@pytest.mark.parametrize("fixed", [False, True], ids=["slow", "fixed"])
@pytest.mark.parametrize("policy", ["spin", "block"])
@pytest.mark.parametrize("name", scenarios.names())
def test_summaries_explain_like_raw_events(name, policy, fixed):
    if fixed and scenarios.get(name).expected_rule is None:
        pytest.skip("the healthy scenario has no fixed run")
    store = _store(name, policy, fixed)
    # no stored summaries yet: made on the fly, with the tracer's SQL
    assert not summaries.has_summaries(store.con, 1)
    fly = explain(store.con, Options())
    raw = explain(store.con, Options(), source="events")
    assert write_as_tracer(store, check_rows=not fixed) > 20
    assert summaries.has_summaries(store.con, 1)
    stored = explain(store.con, Options())
    _same(raw, stored)
    _same(fly, stored)
    if not fixed and scenarios.get(name).expected_rule:
        assert stored.chains[0].rule_id == scenarios.get(name).expected_rule


@pytest.mark.parametrize("name", ["cpu-contention", "io-stall", "sync-heavy"])
def test_seconds_the_tracer_still_held_are_read_from_the_events(name):
    """A tracer killed with the windows rows of its last flushes held (or one still running):
    explain over the session, and over its last seconds only, is explain on the raw events."""
    store = _store(name, "block", False)
    write_as_tracer(store, held=5)  # 3.5 s of flushes
    pending = summaries.pending_from(store.con, 1)
    last = store.con.execute("SELECT max(timestamp) FROM events").fetchone()[0]
    assert pending is not None and last - pending < 5 * 10**9
    assert summaries.session_span(store.con, 1) == tuple(store.con.execute(
        "SELECT min(timestamp), max(timestamp) FROM events").fetchone())
    for opts in (Options(), Options(since_s=10), Options(since_s=2)):  # pending inside, and before, the range
        _same(explain(store.con, opts, source="events"), explain(store.con, opts))


def _tables(con) -> dict[str, list]:
    out = {}
    for t in ("ing_cuda", "ing_sched", "ing_faults", "ing_bio", "ing_late", "ing_win"):
        out[t] = sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
    return out


def test_window_tables_match_raw_rows_but_quantiles():
    """Everything but quantiles (and what the late estimate derives from one) is exact."""
    store = _store("cpu-contention", "spin", False)
    write_as_tracer(store)
    for window_s in (1, 3, 7):
        ctx = resolve(store.con, Options(window_s=window_s), align=True)
        windows.build(ctx, "events")
        raw = _tables(store.con)
        windows.build(ctx, "summaries")
        summ = _tables(store.con)
        for t in ("ing_sched", "ing_faults"):
            assert summ[t] == raw[t], (t, window_s)
        # ing_cuda: all but p99_ns (column 8) exact
        strip = [r[:8] + r[9:] for r in raw["ing_cuda"]]
        assert sorted(strip, key=repr) == sorted((r[:8] + r[9:] for r in summ["ing_cuda"]), key=repr)
        p99 = {r[:8]: r[8] for r in summ["ing_cuda"]}
        for r in raw["ing_cuda"]:  # p99_ns: of syncs only (the one ing_win reads)
            assert _close(r[8], p99[r[:8]]) if r[4] == "sync" else p99[r[:8]] is None, r


def test_windows_are_whole_seconds():
    store = _store("healthy", "spin", False)
    ctx = resolve(store.con, Options(since_s=7.5, window_s=1.4), align=True)
    assert ctx.start_ns % 10**9 == 0 and ctx.end_ns % 10**9 == 0 and ctx.window_ns == 10**9


def test_quantile_bound():
    """hist_quantile_sql against quantile_cont on awkward samples."""
    import duckdb

    con = duckdb.connect()
    con.execute("SELECT setseed(0.5)")
    con.execute("CREATE TABLE v AS SELECT (k % 5) AS g, CASE WHEN k % 97 = 0 THEN 0 ELSE "
                "(exp(random() * 20))::BIGINT END AS d FROM range(20000) t(k)")
    con.execute(f"CREATE TABLE h AS SELECT g, {summaries._BUCKET.replace('duration_ns', 'd')} AS bucket, "
                "count(*) AS n, "
                "sum(d) AS sum_ns "
                "FROM v GROUP BY ALL")
    for q in (0.25, 0.5, 0.99, 1.0, 0.0):
        exact = dict(con.execute(f"SELECT g, quantile_cont(d, {q}) FROM v GROUP BY g").fetchall())
        est = dict(con.execute(summaries.hist_quantile_sql("h", "g", q)).fetchall())
        for g, x in exact.items():
            assert abs(est[g] - x) <= summaries.QUANTILE_REL_ERROR * x + 1e-9, (q, g, x, est[g])


@pytest.mark.parametrize("held", [5, 10**6], ids=["last-flushes", "nothing-written-yet"])
def test_a_fleet_segment_publishes_the_seconds_still_held_from_the_events(held):
    from ingero.fleet import segment
    from ingero.fleet.facts import ClockState, NodeFacts

    store = _store("cpu-contention", "spin", False)
    write_as_tracer(store, held=held)
    assert summaries.has_summaries(store.con, 1) == (held == 5)
    first, last = store.con.execute("SELECT min(timestamp), max(timestamp) FROM events").fetchone()
    t0 = first // 10**9 * 10**9
    seg = segment.build(store.con, 1, t0, -(-(last + 1 - t0) // 10**9) * 10**9,
                        facts=NodeFacts("node", "6.1", 2, 0), clock=ClockState(0, "none", False, None, None),
                        drops=(0, 0), rows_per_file=1 << 20)
    published = sum(t.column("events_n").to_numpy().sum() for t in seg.tables["summaries"])
    assert published == store.con.execute("SELECT count(*) FROM events").fetchone()[0]


def test_hist_quantile_is_the_sql_to_the_bit():
    """summaries.hist_quantile (numpy, what explain runs) gives hist_quantile_sql's values
    exactly: string and integer keys, a NULL key, one-row groups, empty buckets (and a group of
    nothing else), q at the ends and q whose position falls on a whole rank."""
    import duckdb

    con = duckdb.connect()
    con.execute("SELECT setseed(0.25)")
    con.execute("CREATE TABLE v AS SELECT (k % 7)::INTEGER AS tid, (k % 3)::BIGINT AS w, "
                "CASE WHEN k % 11 = 0 THEN NULL ELSE ['a', 'bb', ''][k % 3 + 1] END AS op, "
                "CASE WHEN k % 97 = 0 THEN 0 ELSE (exp(random() * 20))::BIGINT END AS d "
                "FROM range(30000) t(k) WHERE k % 5 <> 0 OR k < 40")
    # a one-row group (tid 100) and a bucket with no calls (tid 101: n 0)
    con.execute("INSERT INTO v VALUES (100, 0, 'a', 1234), (101, 0, 'a', 50), (101, 0, 'a', 70)")
    con.execute(f"CREATE TABLE h AS SELECT tid, w, op, {summaries._BUCKET.replace('duration_ns', 'd')} AS bucket, "
                "count(*)::BIGINT AS n, sum(d)::DOUBLE AS sum_ns FROM v GROUP BY ALL")
    # (a group of empty buckets only, 102: its quantile is the SQL's, inf)
    con.execute("INSERT INTO h VALUES (101, 0, 'a', 900, 0, 0.0), (102, 0, 'a', 3, 0, 5.0), (102, 0, 'a', 9, 0, 7.0)")
    # keys too far apart to pack into one int64 (hist_quantile sorts them column by column)
    con.execute("CREATE TABLE wide AS SELECT * REPLACE (tid::BIGINT << 55 AS tid) FROM h")
    keys = ["tid", "w", "op"]
    for table in ("h", "wide"):
        hist = con.sql(f"SELECT * FROM {table}").to_arrow_table()
        for q in (0.25, 0.5, 0.99, 1.0, 0.0, 0.35):
            sql = summaries.hist_quantile_sql(table, ", ".join(keys), q)
            want = {r[:3]: r[3] for r in con.execute(sql).fetchall()}
            got = summaries.hist_quantile(hist, keys, q).to_pylist()
            assert len(got) == len(want)
            for r in got:
                x, y = want[(r["tid"], r["w"], r["op"])], r["value"]
                assert repr(x) == repr(y) if x is None or math.isnan(x) else x == y, (table, q, r, x)
    assert summaries.hist_quantile(hist.slice(0, 0), keys, 0.99).num_rows == 0
