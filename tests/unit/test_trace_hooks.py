"""The services that ride on a trace, through the one seam (ingero/traceapi.py TraceHook):
each is called where the session says, the samplers' rows land in the second's transaction,
and the daemon hook applies retention and stops serving before the drain."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ingero.collect import session
from ingero.daemon.hook import DaemonHook
from ingero.sample.hook import SamplerHook
from ingero.store.db import Store
from ingero.traceapi import TraceHook

from test_session_flush import FakeProgram, FakeReader, records


class Recorder(TraceHook):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.in_transaction: list[bool] = []

    def on_start(self, sess):
        self.calls.append("on_start")
        return ["a start line"]

    def on_flush(self, sess, recs, flush_s):
        self.calls.append(f"on_flush:{len(recs)}")

    def write_second(self, sess):
        self.calls.append("write_second")
        sess.store.con.execute("INSERT INTO system_metrics (session_id, timestamp) VALUES (?, ?)",
                               [sess.session_id, 1])

    def every_second(self, sess):
        self.calls.append("every_second")


class Program(FakeProgram):
    def targets(self) -> set[int]:
        return {42}

    def remove_targets(self, pids) -> None:
        pass


@pytest.fixture
def sess(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(session, "RingReader", FakeReader)
    monkeypatch.setattr(session, "_process_info", lambda pid: None)
    monkeypatch.setattr(session.targets, "alive", lambda pid: True)
    store = Store.memory()
    sid = store.begin_session(command="test", targets="fake")
    return session.TraceSession(session.TraceOptions(), store, Program(), sid)


def test_hooks_hear_every_flush_and_second_in_order(sess, monkeypatch) -> None:
    rec = Recorder()
    sess.opts.hooks.append(rec)
    monkeypatch.setattr(sess, "harvest_process_cpu", lambda: None)
    sess.reader.queue = records(7)
    sess.poll()
    sess.flush()
    session._every_second(sess, None, session.targets.TargetSpec())
    assert rec.calls == ["on_flush:7", "write_second", "every_second"]
    # write_second ran inside the second's transaction, which committed its row
    assert sess.store.con.execute("SELECT count(*) FROM system_metrics").fetchone()[0] == 1


def test_derived_rows_are_stored_in_the_batchs_transaction(sess) -> None:
    """flush_rows' rows land with the batch: when appending them fails, neither is stored (one commit)."""
    import pyarrow as pa

    class Derive(TraceHook):
        def __init__(self, table: str) -> None:
            self.table = table

        def flush_rows(self, sess, recs):
            return [(self.table, pa.table({"session_id": [sess.session_id], "start_ns": [int(len(recs))]}))]

    sess.opts.hooks.append(Derive("window_late_waits"))
    sess.reader.queue = records(7)
    sess.poll()
    sess.flush()
    con = sess.store.con
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] == 7
    assert con.execute("SELECT start_ns FROM window_late_waits").fetchall() == [(7,)]
    sess.opts.hooks[-1] = Derive("no_such_table")
    sess.reader.queue = records(5)
    sess.poll()
    with pytest.raises(ValueError, match="unknown table no_such_table"):
        sess.flush()
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] == 7  # rolled back with the batch


def test_session_fields_are_set_in_the_batchs_transaction(sess) -> None:
    class Mark(TraceHook):
        def __init__(self, table: str) -> None:
            self.table = table

        def flush_rows(self, sess, recs):
            return [(self.table, pa.table({"session_id": [sess.session_id], "start_ns": [0]}))]

        def session_fields(self, sess):
            return {"summaries_pending_ns": 7 * 10**9}

    import pyarrow as pa

    sess.opts.hooks.append(Mark("no_such_table"))
    sess.reader.queue = records(5)
    sess.poll()
    with pytest.raises(ValueError, match="unknown table no_such_table"):
        sess.flush()
    row = "SELECT summaries_pending_ns FROM sessions WHERE session_id = $s"
    assert sess.store.con.execute(row, {"s": sess.session_id}).fetchone() == (None,)  # rolled back with the batch
    sess.opts.hooks[-1] = Mark("window_late_waits")
    sess.reader.queue = records(5)
    sess.poll()
    sess.flush()
    assert sess.store.con.execute(row, {"s": sess.session_id}).fetchone() == (7 * 10**9,)


def test_sampler_hook_writes_the_host_rows_of_the_second(sess) -> None:
    hook = SamplerHook()
    lines = hook.on_start(sess)
    assert lines is None or all(isinstance(x, str) for x in lines)  # NVML absent: one line, else none
    sess.traced = {42}
    with sess.store.transaction():
        hook.write_second(sess)
    assert sess.store.con.execute("SELECT count(*) FROM system_metrics WHERE session_id = $s",
                                  {"s": sess.session_id}).fetchone()[0] == 1


def test_daemon_hook_applies_retention_and_stops_serving(sess) -> None:
    hook = DaemonHook(retain_s=60, serve=False)
    assert hook.on_start(sess) is None and sess.daemon is hook.daemon
    now = time.time_ns()
    old, new = records(3), records(2, start=10)
    sess.reader.queue = np.concatenate([old, new])
    sess.poll()
    sess.flush()
    # the first three rows two minutes old (past --retain 60s), the other two from now
    sess.store.con.execute("""UPDATE events SET timestamp = CASE
                              WHEN timestamp < (SELECT min(timestamp) + 3 FROM events)
                              THEN $t - 120e9 ELSE $t END""", {"t": now})
    hook.daemon._next = 0  # retention is due
    hook.every_second(sess)
    assert sess.store.con.execute("SELECT count(*) FROM events").fetchone()[0] == 2
    hook.on_stopping(sess)
    hook.on_stopping(sess)  # idempotent: the loop and run_trace's finally both call it
