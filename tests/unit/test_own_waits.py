"""The loop's own waits that are neither input nor a lock: sleeping on its own timer (loop-sleep)
and blocking in a write to a pipe whose reader is slow (output-bound), on hand-made call streams
(test_device_infer's device model), beside the look-alike a DataLoader makes (input-bound)."""

from __future__ import annotations

import pytest
from analyze_helpers import MAIN_PID, chains_of, silent
from test_device_infer import Host

from ingero.analyze.context import Options
from ingero.analyze.explain import explain

MS = 1_000_000
READER = MAIN_PID + 900  # another process: the loop's stdout pipe's reader, or a DataLoader worker


def _loop(wait, steps: int = 600):
    """``steps`` of: the loop's own wait (``wait(h)`` adds its rows and advances h.t), then one
    copy, 10 launches and a blocking sync (the device idles through the wait)."""
    h = Host()
    h.trace.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    h.trace.name(READER, "python3 (reader.py)", "python3", "python3 reader.py")
    for _ in range(steps):
        wait(h)
        h.copy_async(10)
        for _ in range(10):
            h.launch(200)
            h.host(5)
        h.sync(sleep=True)
    return explain(h.trace.store().con, Options(window_s=1))


def _blocked(h, ms: float, call: str, target: str | None, waker_pid: int, waker_tid: int) -> None:
    h.trace.ev(h.t, "sched_switch", MAIN_PID, h.tid, int(ms * MS), kind="sleep", preempted=False, other_pid=0,
               runq_ns=10_000, syscall=call, fd_target=target, waker_pid=waker_pid, waker_tid=waker_tid)
    h.t += int(ms * MS)


def _reader_sleeps(h, ms: float) -> None:
    # the reader naps between reads (time.sleep): its own interval, woken by the timer
    h.trace.ev(h.t, "sched_switch", READER, READER, int(ms * MS), kind="sleep", preempted=False, other_pid=0,
               runq_ns=5_000, syscall="clock_nanosleep", waker_pid=0, waker_tid=0)


def test_a_loop_that_sleeps_on_its_own_timer_is_loop_sleep_with_no_culprit():
    rep = _loop(lambda h: _blocked(h, 20, "clock_nanosleep", None, 0, 0))
    [chain] = chains_of(rep, "loop-sleep")
    assert rep.chains[0] is chain and chain.severity == "HIGH"
    assert chain.culprits == []
    # counted in the evidence windows: all but the run's first and last (partial) ones
    assert 500 < chain.numbers["sleeps"] <= 600
    assert chain.numbers["own_sleep_share"] > 0.8
    assert f"clock_nanosleep {round(chain.numbers['sleeps'])} times" in chain.root[0]
    assert not chains_of(rep, "input-bound") and not chains_of(rep, "output-bound")
    # the step: 20 ms of its own sleep in ~22.4 ms, none of it a wait for data
    assert rep.steps.breakdown["sleep"] == pytest.approx(20 / 22.4, abs=0.03)
    assert rep.steps.breakdown["data_wait"] < 0.01


def test_a_loop_blocked_writing_into_a_slow_readers_pipe_is_output_bound_naming_the_reader():
    def wait(h):
        _reader_sleeps(h, 19.5)
        _blocked(h, 20, "write", "pipe:[31328507]", READER, READER)
    rep = _loop(wait)
    [chain] = chains_of(rep, "output-bound")
    assert rep.chains[0] is chain and chain.severity == "HIGH"
    assert [c.pid for c in chain.culprits] == [READER]
    assert 500 < chain.numbers["blocked_writes"] <= 600
    assert "python3 (reader.py) (PID %d)" % READER in chain.root[1]
    assert any("QueueHandler" in f for f in chain.fix)
    assert not chains_of(rep, "input-bound") and not chains_of(rep, "loop-sleep")
    assert rep.steps.breakdown["output_wait"] == pytest.approx(20 / 22.4, abs=0.03)
    assert rep.steps.breakdown["data_wait"] < 0.01


def test_the_same_wait_in_a_read_woken_by_a_worker_stays_input_bound():
    # the look-alike: the loop reads its next batch from a worker's pipe (a DataLoader queue)
    def wait(h):
        _reader_sleeps(h, 19.5)
        _blocked(h, 20, "read", "pipe:[31328507]", READER, READER)
    rep = _loop(wait)
    assert [c.rule_id for c in rep.chains[:1]] == ["input-bound"]
    assert not chains_of(rep, "output-bound") and not chains_of(rep, "loop-sleep")
    assert rep.steps.breakdown["data_wait"] == pytest.approx(20 / 22.4, abs=0.03)


def test_a_short_nap_each_step_is_not_named():
    # 0.5 ms of time.sleep in a 3 ms step: under loop-sleep's 20%
    rep = _loop(lambda h: _blocked(h, 0.5, "clock_nanosleep", None, 0, 0), steps=3000)
    assert silent(rep, "loop-sleep", "output-bound", "input-bound")
