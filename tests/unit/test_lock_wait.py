"""The loop's wait for a lock a sibling thread holds (the GIL): the step's lock wait, and
lock-contention's culprit, on a hand-made call stream (test_device_infer's device model)."""

from __future__ import annotations

import pytest
from analyze_helpers import MAIN_PID, chains_of
from test_device_infer import Host

from ingero.analyze.context import Options
from ingero.analyze.explain import explain

MS = 1_000_000


def test_a_wait_for_a_lock_a_sibling_holds_is_the_steps_lock_wait_not_its_data_wait():
    # the GIL shape in the step breakdown: each step the loop sleeps 20 ms in a futex that its
    # logger thread (on CPU throughout, but for a 0.1 ms sleep at each step's start) ends
    logger = MAIN_PID + 57
    h = Host()
    h.trace.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    for _ in range(600):
        h.trace.ev(h.t, "sched_switch", MAIN_PID, logger, 100_000, kind="sleep", preempted=False, other_pid=0,
                   runq_ns=1_000, syscall="futex", waker_pid=MAIN_PID, waker_tid=h.tid)
        h.host(200)
        h.trace.ev(h.t, "sched_switch", MAIN_PID, h.tid, 20 * MS, kind="sleep", preempted=False, other_pid=0,
                   runq_ns=10_000, syscall="futex", waker_pid=MAIN_PID, waker_tid=logger)
        h.t += 20 * MS
        h.copy_async(10)
        for _ in range(10):
            h.launch(200)
            h.host(5)
        h.sync(sleep=True)
    store = h.trace.store()
    rep = explain(store.con, Options(window_s=1))
    b = rep.steps.breakdown
    assert b["lock_wait"] == pytest.approx(20 / 22.4, abs=0.03)
    assert b["data_wait"] < 0.01
    [chain] = chains_of(rep, "lock-contention")
    assert rep.chains[0] is chain and chain.culprits[0].tid == logger
    assert chain.culprits[0].name == "thread ?"  # the TID is the renderer's to add, once
