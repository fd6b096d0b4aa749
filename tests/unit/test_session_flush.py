"""TraceSession's pending buffer, flush policy and live-view sampling, with a fake ring (no BPF)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ingero.collect import session
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, Kind
from ingero.collect.session import (
    FLUSH_INTERVAL_S,
    FLUSH_ROWS,
    PCT_SAMPLE,
    ROW_GROUP_ROWS,
    TraceOptions,
    TraceSession,
    _Percentiles,
)
from ingero.store.db import Store


def records(n: int, *, start: int = 0, op: Op = Op.CUDA_LAUNCH_KERNEL, pid: int = 42) -> np.ndarray:
    r = np.zeros(n, dtype=EVENT_DTYPE)
    r["ts_ns"] = 1_000 + start + np.arange(n)
    r["duration_ns"] = 500
    r["pid"] = pid
    r["tid"] = pid
    r["op"] = int(op)
    r["kind"] = int(Kind.NONE)
    r["stack_id"] = -1
    return r


class FakeReader:
    """Hands out queued records in polls of at most `per_poll`, like RingReader.read_into."""

    def __init__(self, *_: object) -> None:
        self.queue = np.zeros(0, dtype=EVENT_DTYPE)
        self.per_poll = 1 << 30

    def take_lapped(self) -> int:
        return 0

    def read_into(self, out: np.ndarray) -> int:
        n = min(len(self.queue), len(out), self.per_poll)
        out[:n] = self.queue[:n]
        self.queue = self.queue[n:]
        return n


class FakeProgram:
    class settings:  # noqa: N801 - mirrors Program.settings
        ring_bytes = 1 << 20
        launch_streams = False

    call_cost_ns = None  # not calibrated

    def ring_fds(self) -> tuple[int, int]:
        return -1, -1


@pytest.fixture
def sess(monkeypatch: pytest.MonkeyPatch) -> TraceSession:
    monkeypatch.setattr(session, "RingReader", FakeReader)
    monkeypatch.setattr(session, "_process_info", lambda pid: None)  # no /proc reads of made-up pids
    store = Store.memory()
    sid = store.begin_session(command="test", targets="fake")
    return TraceSession(TraceOptions(), store, FakeProgram(), sid)


def stored(s: TraceSession) -> list[int]:
    return [r[0] for r in s.store.con.execute("SELECT timestamp - $o FROM events ORDER BY timestamp",
                                              {"o": s.offset_ns}).fetchall()]


def test_size_flush_stores_whole_row_groups_and_keeps_the_rest_in_order(sess: TraceSession) -> None:
    n = FLUSH_ROWS + 1000
    sess.reader.queue = records(n)
    sess.reader.per_poll = 100_000
    while sess.poll():
        pass
    assert sess.pending_rows == n
    sess.flush_if_due(now=0.0)  # size rule; the interval has not passed
    assert sess.events == FLUSH_ROWS and FLUSH_ROWS % ROW_GROUP_ROWS == 0
    assert sess.pending_rows == 1000
    # the rest is the last 1000 records, first of them at the front of the buffer
    assert sess.pending_buf["ts_ns"][:1000].tolist() == list(range(1_000 + FLUSH_ROWS, 1_000 + n))
    sess.flush_if_due(now=sess.next_flush)  # the interval rule stores everything
    assert sess.pending_rows == 0
    assert stored(sess) == list(range(1_000, 1_000 + n))
    row = sess.store.con.execute("SELECT events FROM sessions WHERE session_id = $s", {"s": sess.session_id}).fetchone()
    assert row[0] == n


def test_nothing_is_stored_before_the_interval_below_flush_rows(sess: TraceSession) -> None:
    sess.reader.queue = records(ROW_GROUP_ROWS + 5)
    sess.poll()
    t0 = sess.next_flush - FLUSH_INTERVAL_S
    sess.flush_if_due(now=t0 + FLUSH_INTERVAL_S / 2)
    assert sess.events == 0
    sess.flush_if_due(now=t0 + FLUSH_INTERVAL_S)
    assert sess.events == ROW_GROUP_ROWS + 5  # a time flush stores everything, part groups too
    assert sess.pending_rows == 0


def test_a_poll_never_overfills_the_pending_buffer(sess: TraceSession) -> None:
    sess.reader.queue = records(session.PENDING_CAPACITY + 10)
    got = 0
    while (n := sess.poll()) > 0:
        got += n
    assert got == session.PENDING_CAPACITY == sess.pending_rows
    assert len(sess.reader.queue) == 10  # left in the ring for after the next flush


def test_pids_of_every_run_are_noted(sess: TraceSession, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    monkeypatch.setattr(sess, "upsert_names", lambda pids: seen.extend(pids))
    r = np.concatenate([records(3, pid=5), records(2, pid=9), records(4, pid=5), records(1, pid=11)])
    sw = records(2, op=Op.SCHED_SWITCH, pid=5)
    sw["other_pid"] = [77, 0]
    sess.reader.queue = np.concatenate([r, sw])
    sess.poll()
    assert sorted(seen) == [0, 5, 9, 11, 77]  # upsert_names drops pid 0 itself


def test_live_percentiles_keep_about_pct_sample_per_op_and_second() -> None:
    pct = _Percentiles()
    rng = np.random.default_rng(3)
    for second in range(3):
        for _ in range(20):  # 20 polls of 10 k frequent + 5 rare records
            frequent = records(10_000)
            frequent["duration_ns"] = rng.integers(0, 100_000, 10_000)
            rare = records(5, op=Op.CUDA_MEMCPY)
            rare["duration_ns"] = 7
            pct.add(np.concatenate([frequent, rare]))
        pct.roll()
    st = pct.stats()
    assert st["cudaLaunchKernel"].count == 600_000 and st["cudaMemcpy"].count == 300  # counts are exact
    kept = sum(len(w[0]) for w in pct._window)
    # second 1 samples from PCT_SAMPLE on (~PCT_SAMPLE * (1 + ln 100)); later seconds ~PCT_SAMPLE
    assert kept < 300 + PCT_SAMPLE * 6 + PCT_SAMPLE * 2 * 1.2
    assert st["cudaMemcpy"].p50_ns == 7  # rare ops keep every duration
    assert st["cudaLaunchKernel"].p50_ns == pytest.approx(50_000, rel=0.05)
    assert st["cudaLaunchKernel"].p99_ns == pytest.approx(99_000, rel=0.02)


def test_live_percentiles_keep_no_view_of_the_pending_buffer() -> None:
    buf = records(4)
    buf["duration_ns"] = 900
    pct = _Percentiles()
    pct.add(buf[:1])  # a one-record slice: its fields are contiguous views
    buf["op"] = int(Op.CUDA_FREE)  # the buffer is reused by later polls
    buf["duration_ns"] = 1
    pct.roll()
    st = pct.stats()
    assert st["cudaLaunchKernel"].p50_ns == 900


@pytest.mark.parametrize("launch_streams, expected", [(False, None), (True, 0x5150)])
def test_launch_streams_are_stored_as_the_program_reads_them(
        sess: TraceSession, launch_streams: bool, expected: int | None) -> None:
    program = FakeProgram()
    program.settings = SimpleNamespace(ring_bytes=1 << 20, launch_streams=launch_streams)  # type: ignore[assignment]
    s = TraceSession(TraceOptions(), sess.store, program, sess.session_id)
    launch, copy = records(1), records(1, start=1, op=Op.CUDA_MEMCPY_ASYNC)
    launch["stream"] = copy["stream"] = 0x5150
    s.reader.queue = np.concatenate([launch, copy])
    s.poll()
    s.flush()
    assert s.store.con.execute("SELECT op, stream FROM events ORDER BY timestamp").fetchall() == [
        ("cudaLaunchKernel", expected), ("cudaMemcpyAsync", 0x5150)]


class BrokenStacks:
    """A stack resolver that fails the way a race in it once did (KeyError out of a BPF map delete)."""

    def __init__(self, fail: bool = True) -> None:
        self.fail = fail

    def resolve(self, stack_ids: np.ndarray, pids: np.ndarray) -> np.ndarray:
        if self.fail:
            raise KeyError()
        return np.full(len(stack_ids), 77, dtype=np.int64)


def test_rows_are_stored_without_stacks_when_resolving_them_fails(sess: TraceSession) -> None:
    sess.stacks = BrokenStacks()
    recs = records(10)
    recs["stack_id"] = 5
    sess.reader.queue = recs
    sess.poll()
    sess.flush()
    sess.reader.queue = records(3, start=100)
    sess.poll()
    sess.flush()  # the same error again: counted, not noted twice
    assert sess.events == 13
    rows = sess.store.con.execute("SELECT count(*), count(stack_id) FROM events").fetchone()
    assert rows == (13, 0)
    assert sess.notes == ["stacks: resolving failed (KeyError); 10 rows stored without stacks"]
    assert sess.stack_failures == 2
    sess.stacks.fail = False  # resolving works again: stacks come back
    sess.reader.queue = records(2, start=200)
    sess.poll()
    sess.flush()
    assert sess.store.con.execute("SELECT count(stack_id) FROM events WHERE stack_id = 77").fetchone()[0] == 2
