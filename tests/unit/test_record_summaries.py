"""The tracer's summaries (analyze/summaries/records.py: numpy over each flush's records) against their SQL.

summaries.SUMMARY_SQL and LATE_SUMMARY_SQL define a window's metrics; the
tracer computes them from the records instead, inside each flush's
transaction.  Both must give the same rows: on the realistic mix, with
records in any order, when every hash collides, on hand-made edge cases;
test_summaries.py holds them to the same rows on every demo trace, and
explain on the stored summaries to explain on the raw events.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from bench.bench_ingest import _realistic
from ingero.analyze import summaries
from ingero.analyze.summaries import records
from ingero.analyze.explain import explain
from ingero.analyze.context import Options
from ingero.collect import decode
from ingero.analyze.summaries import hook as summaries_hook
from ingero.analyze.summaries.hook import SummaryHook
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, CallFlag, Kind
from ingero.events.units import NS
from ingero.store.db import Store

OFFSET = 1_700_000_000 * 10**9
WINDOW_COLS = ("start_ns, pid, tid, op::VARCHAR, kind::VARCHAR, in_call::VARCHAR, queued, other_pid, events_n, "
                "first_ns, last_ns, duration_ns, overflow_ns, runq_ns, bytes, small_copy_n, max_duration_ns, "
                "duration_hist_bucket, duration_hist_n, duration_hist_sum_ns")


def _both_ways(store: Store, flushes: list[np.ndarray], offset_ns: int, order=decode.storage_order) -> None:
    """Each flush stored, then summarised as the tracer does (Summariser.rows, into windows) and by
    the SQL (into sql_*)."""
    summariser = records.Summariser(1, offset_ns)
    for recs in flushes:
        recs = order(recs)
        store.append("events", decode.events_table(recs, session_id=1, offset_ns=offset_ns))
        for table, rows in zip(("windows", "window_late_waits"), summariser.rows(recs)):
            store.append(table, rows)
        summarise_sql(store.con, "SELECT * FROM events WHERE rowid >= (SELECT count(*) FROM events) - $n",
                      {"n": len(recs)})


def summarise_sql(con, batch: str, params: dict, session_id: int = 1) -> None:
    """The SQL's summaries of the rows ``batch`` selects, added to sql_windows and sql_late (TEMP)."""
    for table, like in (("sql_windows", "windows"), ("sql_late", "window_late_waits")):
        con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {table} AS SELECT * FROM {like} LIMIT 0")
    con.execute(f"CREATE OR REPLACE TEMP TABLE batch AS {batch}", params)
    summaries.summarise(con, "batch", session_id=session_id, target="sql_windows", late_target="sql_late",
                        stored="events")


def _rows(con, table: str, cols: str) -> list:
    return sorted(con.execute(f"SELECT {cols} FROM {table}").fetchall(), key=repr)


def assert_same_rows(con) -> None:
    """The tracer's summaries (windows, window_late_waits) are the SQL's (sql_windows, sql_late), row for row."""
    numpy, sql = _rows(con, "windows", WINDOW_COLS), _rows(con, "sql_windows", WINDOW_COLS)
    assert len(sql) == len(numpy) and sql == numpy
    late = "start_ns, pid, tid, preempted_ns, since_call_ns"
    assert _rows(con, "window_late_waits", late) == _rows(con, "sql_late", late)


def _realistic_flushes(n: int = 60_000, size: int = 7_000) -> list[np.ndarray]:
    recs = _realistic(n)
    return [recs[i : i + size] for i in range(0, n, size)]


@pytest.mark.parametrize("cells", ["dense", "sorted"])
def test_realistic_mix_in_storage_order_and_in_any_order(cells, monkeypatch):
    if cells == "sorted":  # the histograms' other path: (row, bucket) keys sorted instead of counted
        monkeypatch.setattr(records, "_DENSE_CELLS", 0)
    for order in (decode.storage_order, lambda r: r[np.random.default_rng(len(r)).permutation(len(r))]):
        store = Store.memory()
        _both_ways(store, _realistic_flushes(), OFFSET, order)
        assert_same_rows(store.con)


@pytest.mark.parametrize("crossing", [3, 200], ids=["few", "many"])
def test_intervals_past_their_second_few_or_many(crossing):
    """overflow_ns: a few runs reaching past their second are summed one by one, many all at once."""
    ns = NS
    runs = 300
    starts = np.arange(runs) * 4  # 4 records a run, each run in second 7 or 8
    sec = np.repeat(np.arange(runs) % 2 + 7, 4)
    ts = sec * ns + np.tile([100, 200, 300, 400], runs)
    dur = np.full(runs * 4, 1_000)
    dur[starts[:crossing] + 3] = ns  # the last record of the first runs ends in the next second
    got = records._overflow(ts, dur, sec, starts)
    assert np.array_equal(got, np.add.reduceat(np.maximum(ts + dur - (sec + 1) * ns, 0), starts))
    assert (got > 0).sum() == crossing and got[0] == 400
    # and end to end, against the SQL: the realistic mix with ~0.16 s intervals, many crossing
    flushes = _realistic_flushes(30_000, 7_000)
    for f in flushes:
        f["duration_ns"] *= np.uint64(20_000 if crossing > 64 else 1)
    store = Store.memory()
    _both_ways(store, flushes, OFFSET)
    assert_same_rows(store.con)


def test_colliding_hashes_still_give_exact_rows(monkeypatch):
    """Every key hashes alike: the exact keys alone split the rows (a collision costs rows, never truth)."""
    for c in ("_C1", "_C2", "_C3", "_C4"):
        monkeypatch.setattr(records, c, np.uint64(0))
    store = Store.memory()
    _both_ways(store, _realistic_flushes(20_000, 5_000), OFFSET, lambda r: r[::-1].copy())
    con = store.con
    # the same totals per key, and per key and bucket; rows may be split where the hash no longer orders them
    keys = "start_ns, pid, tid, op::VARCHAR, kind::VARCHAR, in_call::VARCHAR, queued, other_pid"
    totals = (f"SELECT {keys}, sum(events_n), sum(duration_ns), sum(overflow_ns), sum(runq_ns), sum(bytes), "
              "sum(small_copy_n), max(max_duration_ns), min(first_ns), max(last_ns) FROM {} GROUP BY ALL")
    hists = (f"SELECT {keys}, b, sum(n), sum(s) FROM (SELECT *, unnest(duration_hist_bucket) AS b, "
             "unnest(duration_hist_n) AS n, unnest(duration_hist_sum_ns) AS s FROM {}) GROUP BY ALL")
    for q in (totals, hists):
        assert _rows(con, f"({q.format('windows')})", "*") == _rows(con, f"({q.format('sql_windows')})", "*")
    assert con.execute("SELECT count(*) FROM windows").fetchone()[0] > con.execute(
        "SELECT count(*) FROM sql_windows").fetchone()[0]  # the hash no longer brings a row's records together


def _rec(op: Op, ts: int, dur: int, *, tid: int = 7, kind: Kind = Kind.NONE, arg: int = 0, other: int = 0,
         call_op: int = 0, flags: int = 0) -> np.ndarray:
    r = np.zeros(1, dtype=EVENT_DTYPE)
    r["ts_ns"], r["duration_ns"], r["op"], r["kind"], r["arg"] = ts, dur, int(op), int(kind), arg
    r["pid"], r["tid"], r["other_pid"], r["call_op"], r["call_flags"], r["stack_id"] = 5, tid, other, call_op, flags, -1
    return r


def test_hand_made_rows():
    """Block I/O per process; a zero-duration call's bucket; queued NULL before any call; who preempted."""
    sync = int(Op.CUDA_STREAM_SYNC)
    seen, queued = int(CallFlag.SEEN), int(CallFlag.SEEN | CallFlag.QUEUED)
    recs = np.concatenate([
        _rec(Op.BLOCK_IO, 10, 500, tid=1, kind=Kind.READ, arg=4096, other=8),
        _rec(Op.BLOCK_IO, 20, 700, tid=2, kind=Kind.READ, arg=512, other=8),
        _rec(Op.CUDA_MEMCPY, 30, 0, kind=Kind.D2H, arg=4),
        _rec(Op.CUDA_MEMCPY, 40, 1 << 20, kind=Kind.D2H, arg=4),
        _rec(Op.SCHED_SWITCH, 50, 900, kind=Kind.PREEMPTED, arg=33, other=99, flags=int(CallFlag.QUEUED)),
        _rec(Op.SCHED_SWITCH, 60, 900, kind=Kind.SLEEP, other=98, call_op=sync, flags=queued),
        _rec(Op.SCHED_SWITCH, 70, 2 * 10**9, kind=Kind.SLEEP, other=97, call_op=sync, flags=queued),
        _rec(Op.PAGE_FAULT, 80, 5, call_op=sync, flags=seen),
        _rec(Op.PROC_EXIT, 90, 0),
    ])
    rows = records.windows(recs, session_id=3, offset_ns=OFFSET).to_pylist()
    by = {(r["op"], r["tid"], r["kind"], r["other_pid"]): r for r in rows}
    bio = by[("block_io", None, "read", None)]
    assert (bio["events_n"], bio["bytes"], bio["small_copy_n"], bio["duration_hist_n"]) == (2, 4608, 1, [1, 1])
    copy = by[("cudaMemcpy", 7, "D2H", None)]
    assert copy["duration_hist_bucket"] == [-1, 320] and copy["duration_hist_sum_ns"] == [0, 1 << 20]
    pre = by[("sched_switch", 7, "preempted", 99)]
    assert (pre["queued"], pre["in_call"], pre["runq_ns"], pre["overflow_ns"]) == (None, None, 33, 0)
    sleep = by[("sched_switch", 7, "sleep", None)]  # who ran next is no key of a sleep: one row
    assert (sleep["events_n"], sleep["queued"], sleep["in_call"]) == (2, True, "cudaStreamSync")
    assert sleep["overflow_ns"] == 2 * 10**9 - (10**9 - 70)
    fault = by[("page_fault", 7, None, None)]
    assert (fault["in_call"], fault["queued"], fault["duration_hist_n"]) == ("cudaStreamSync", None, None)
    assert by[("proc_exit", 7, None, None)]["duration_ns"] is None
    assert {r["session_id"] for r in rows} == {3} and sum(r["events_n"] for r in rows) == len(recs)


def test_late_waits_pair_a_sync_with_intervals_of_earlier_flushes():
    sync = int(Op.CUDA_STREAM_SYNC)
    s = records.Summariser(1, OFFSET)
    pre = dict(kind=Kind.PREEMPTED, call_op=sync, flags=int(CallFlag.SEEN))
    # flush 1: two preemptions inside a sync still running; another thread's, never returned
    f1 = np.concatenate([_rec(Op.SCHED_SWITCH, 1_000, 100, **pre), _rec(Op.SCHED_SWITCH, 150_000, 30_000, **pre),
                         _rec(Op.SCHED_SWITCH, 1_000, 100, tid=8, **pre)])
    assert s.late_waits(f1).num_rows == 0
    # flush 2: the sync returns 20 us after the second ended: that one was late, the first was not
    late = s.late_waits(_rec(Op.CUDA_STREAM_SYNC, 500, 199_500)).to_pylist()
    assert late == [{"session_id": 1, "start_ns": OFFSET, "pid": 5, "tid": 7, "preempted_ns": 30_000,
                     "since_call_ns": 179_500}]
    # paired intervals are gone; tid 8's waits for its sync
    assert sorted(s._pending[:, 1].tolist()) == [8]


def test_pending_intervals_are_bounded(monkeypatch):
    monkeypatch.setattr(records, "MAX_PENDING", 100)
    s = records.Summariser(1, OFFSET)
    pre = dict(kind=Kind.PREEMPTED, call_op=int(Op.CUDA_STREAM_SYNC), flags=int(CallFlag.SEEN))
    for i in range(5):
        s.late_waits(np.concatenate([_rec(Op.SCHED_SWITCH, i * 10**6 + k * 10, 5, tid=k, **pre) for k in range(60)]))
    assert len(s._pending) == 100 and s._pending[:, 2].min() == OFFSET + 3 * 10**6 + 20 * 10  # the newest kept


@pytest.fixture(autouse=True)
def _writes_by_count_only(monkeypatch):
    """The hook also writes what it holds once 4 s old: on a loaded box a test's flushes can be
    that far apart, so the tests count writes by flushes only (one test sets the age to 0)."""
    monkeypatch.setattr(summaries_hook, "WRITE_AFTER_S", 1e9)


def _hooked_flushes(store: Store, hook: SummaryHook, n: int = 30_000, end: bool = False) -> SimpleNamespace:
    """TraceSession.flush's order: the hook's rows and session fields, then the batch, them and
    the session row in one transaction; ``end``: the trace's end (on_end) after the last."""
    sess = SimpleNamespace(session_id=1, offset_ns=OFFSET, store=store, notes=[], derived_cpu_s=0.0)
    has_row = store.con.execute("SELECT count(*) FROM sessions WHERE session_id = 1").fetchone()[0]
    for batch in _realistic_flushes(n, 7_000):
        batch = decode.storage_order(batch)
        derived = hook.flush_rows(sess, batch)
        fields = hook.session_fields(sess)
        with store.transaction():
            store.append("events", decode.events_table(batch, session_id=1, offset_ns=OFFSET))
            for name, rows in derived:
                store.append(name, rows)
            if has_row and fields:
                store.update_session(1, **fields)
    if end:
        hook.on_end(sess)
    return sess


def _summarised(con) -> int:
    return con.execute("SELECT coalesce(sum(events_n), 0) FROM windows").fetchone()[0]


def test_the_hook_writes_what_explain_reads():
    store = Store.memory()
    assert store.begin_session(command="test", targets="") == 1
    sess = _hooked_flushes(store, SummaryHook(), end=True)  # 5 flushes: 4 written together, then the end's
    assert _summarised(store.con) == 30_000
    assert summaries.pending_from(store.con, 1) is None
    assert sess.notes[0].startswith("summaries: 5 flushes summarised in ") and sess.notes[0].endswith("; 2 writes)")


def test_rows_held_by_the_tracer_are_marked_and_read_from_the_events():
    """Killed after its 7th flush: the windows rows of flushes 5-7 were held, not written.  The
    session row marks their first second, from which readers summarise the events."""
    store = Store.memory()
    assert store.begin_session(command="test", targets="") == 1
    hook = SummaryHook()
    flushes = _realistic_flushes(49_000, 7_000)
    _hooked_flushes(store, hook, 49_000)  # (no on_end: the tracer was killed)
    assert _summarised(store.con) == 28_000  # 4 flushes written
    first_held = min(int(decode.events_table(f, session_id=1, offset_ns=OFFSET)["timestamp"].to_numpy().min())
                     for f in flushes[4:]) // 10**9 * 10**9
    assert summaries.pending_from(store.con, 1) == first_held
    assert summaries.session_span(store.con, 1) == tuple(store.con.execute(
        "SELECT min(timestamp), max(timestamp) FROM events").fetchone())
    assert explain(store.con, Options()).analysed.events == 49_000  # (test_summaries: explain on demo traces)
    # the trace's end writes what was held and clears the mark
    hook.on_end(SimpleNamespace(session_id=1, store=store, notes=[], derived_cpu_s=0.0))
    assert _summarised(store.con) == 49_000 and summaries.pending_from(store.con, 1) is None


def test_rows_are_written_every_few_flushes_and_when_old(monkeypatch):
    store = Store.memory()
    assert store.begin_session(command="test", targets="") == 1
    hook = SummaryHook()
    sess = _hooked_flushes(store, hook, 21_000)  # 3 flushes: held
    assert _summarised(store.con) == 0 and hook.writes == 0
    hook.every_second(sess)  # not old yet
    assert _summarised(store.con) == 0
    monkeypatch.setattr(summaries_hook, "WRITE_AFTER_S", 0.0)
    hook.every_second(sess)  # old: written in their own transaction, the mark cleared
    assert _summarised(store.con) == 21_000 and hook.writes == 1
    assert summaries.pending_from(store.con, 1) is None


def test_a_failing_summary_costs_no_rows_and_explain_reads_the_events(monkeypatch):
    hook = SummaryHook()
    store = Store.memory()
    assert store.begin_session(command="test", targets="") == 1
    _hooked_flushes(store, hook, 35_000)  # five flushes summarised: four written, one held
    assert summaries.has_summaries(store.con, 1) and summaries.pending_from(store.con, 1) is not None
    monkeypatch.setattr(records.Summariser, "rows", lambda self, recs: 1 / 0)
    sess = _hooked_flushes(store, hook, 14_000)
    assert store.con.execute("SELECT count(*) FROM events").fetchone()[0] == 49_000
    assert hook._held == [] and summaries.pending_from(store.con, 1) is None
    assert not summaries.has_summaries(store.con, 1)  # every summary gone: explain summarises the events
    assert hook.failed == "ZeroDivisionError: division by zero"
    assert sess.notes == ["summaries: failed (ZeroDivisionError: division by zero); "
                          "explain summarises this session's events instead"]
    fallback, raw = explain(store.con, Options()), explain(store.con, Options(), source="events")
    assert fallback.analysed == raw.analysed and fallback.analysed.events == 49_000


def _flush(store: Store, hook: SummaryHook, sess: SimpleNamespace, recs: np.ndarray) -> None:
    """One TraceSession.flush: the hook's rows and session fields with the batch, one transaction."""
    recs = decode.storage_order(recs)
    derived, fields = hook.flush_rows(sess, recs), hook.session_fields(sess)
    with store.transaction():
        store.append("events", decode.events_table(recs, session_id=1, offset_ns=OFFSET))
        for name, rows in derived:
            store.append(name, rows)
        store.update_session(1, **fields)


def test_the_mark_is_the_oldest_second_held_and_a_long_late_row_is_written_at_once():
    """An off-CPU interval is stored when it ends, in the second it began: 2.5 s back it is held
    and moves the mark back; 100 s back it is written with its flush (held, it would put a
    hundred seconds of events behind the mark)."""
    store = Store.memory()
    assert store.begin_session(command="test", targets="") == 1
    hook, sess = SummaryHook(), SimpleNamespace(session_id=1, offset_ns=OFFSET, store=store, notes=[],
                                                derived_cpu_s=0.0)
    s = 200 * 10**9  # second 200 of the trace's clock
    launches = lambda t: np.concatenate([_rec(Op.CUDA_LAUNCH_KERNEL, t + k * 1000, 500) for k in range(3)])  # noqa: E731
    _flush(store, hook, sess, launches(s + 10 * 10**9))
    assert summaries.pending_from(store.con, 1) == OFFSET + s + 10 * 10**9
    _flush(store, hook, sess, np.concatenate([
        launches(s + 11 * 10**9), _rec(Op.SCHED_SWITCH, s + 8_500_000_000, 2_600_000_000, kind=Kind.SLEEP)]))
    assert summaries.pending_from(store.con, 1) == OFFSET + s + 8 * 10**9  # the oldest second held
    assert _summarised(store.con) == 0
    _flush(store, hook, sess, np.concatenate([launches(s + 12 * 10**9),
                                              _rec(Op.SCHED_SWITCH, s - 100 * 10**9, 112 * 10**9, kind=Kind.SLEEP)]))
    assert summaries.pending_from(store.con, 1) == OFFSET + s + 8 * 10**9  # not moved back 108 s
    assert store.con.execute("SELECT start_ns, events_n FROM windows").fetchall() == [(OFFSET + s - 100 * 10**9, 1)]
    # the fourth flush writes what was held and clears the mark
    _flush(store, hook, sess, launches(s + 13 * 10**9))
    assert _summarised(store.con) == 14 and summaries.pending_from(store.con, 1) is None


def test_the_next_tracer_summarises_a_killed_tracers_held_seconds():
    """Killed with three flushes held: the next tracer's start puts those seconds in the table from
    the events (retention deletes events, never summaries) and clears the mark."""
    store = Store.memory()
    assert store.begin_session(command="test", targets="") == 1
    _hooked_flushes(store, SummaryHook(), 49_000)  # 7 flushes: 4 written, 3 held when killed
    store.con.execute("UPDATE sessions SET status = 'crashed' WHERE session_id = 1")
    assert _summarised(store.con) == 28_000 and summaries.pending_from(store.con, 1) is not None
    raw = explain(store.con, Options(), source="events")
    assert SummaryHook().on_start(SimpleNamespace(store=store)) is None
    assert _summarised(store.con) == 49_000 and summaries.pending_from(store.con, 1) is None
    repaired = explain(store.con, Options())
    assert repaired.analysed == raw.analysed and repaired.device == raw.device
