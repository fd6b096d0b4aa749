"""Who made the loop wait (analyze/waits.py) on hand-made wake-up chains.

Each case builds the off-CPU intervals of a few threads as the sched_switch rows would hold
them (what the thread blocked in, who woke it) and checks the roots ``follow`` reaches.
"""

from __future__ import annotations

import pytest

from ingero.analyze import waits
from ingero.analyze.waits import Interval, Root, Threads

LOOP, WORKER, HOG, SIBLING, DISKER = 100, 200, 300, 101, 400  # tids (= pids but SIBLING: a thread of LOOP)
MS = 1_000_000


def blocked(start_ms: float, end_ms: float, call: str | None, waker: int | None, *, kind: str = "sleep",
            target: str | None = None, waker_pid: int | None = None) -> Interval:
    wp = None if waker is None else (waker_pid if waker_pid is not None else (waker if waker != SIBLING else LOOP))
    return Interval(int(start_ms * MS), int(end_ms * MS), False, 0, kind, call, target, wp, waker)


def preempted(start_ms: float, end_ms: float, by: int) -> Interval:
    return Interval(int(start_ms * MS), int(end_ms * MS), True, by, "preempted", None, None, None, None)


def threads(rows: dict[int, list[Interval]], pids: dict[int, int] | None = None, kernel=()) -> Threads:
    t = Threads(kernel_pids=frozenset(kernel))
    for tid, ivs in rows.items():
        for iv in ivs:
            t.add((pids or {}).get(tid, LOOP if tid == SIBLING else tid), tid, iv)
    t.seal()
    return t


def test_a_worker_computing_is_the_root() -> None:
    wait = blocked(10, 20, "read", WORKER, target="pipe:[7]")
    th = threads({LOOP: [wait], WORKER: [blocked(0, 5, "read", LOOP), blocked(25, 30, "read", LOOP)]})
    assert waits.follow(wait, LOOP, th) == {Root(waits.ON_CPU, WORKER, WORKER, "read pipe:[7]"): 1.0}


def test_three_hops_a_hog_starving_the_workers_feeder() -> None:
    """loop <- worker (blocked on its reader) <- reader, preempted by a hog 80% of the time."""
    wait = blocked(10, 20, "read", WORKER)
    feeder = 250
    th = threads({
        LOOP: [wait],
        WORKER: [blocked(9, 19.5, "futex", feeder), blocked(30, 31, "futex", feeder)],
        feeder: [blocked(0, 9, "read", None), preempted(9, 17, HOG), blocked(40, 41, "read", None)],
    })
    roots = waits.follow(wait, LOOP, th)
    hog = Root(waits.CPU, HOG, 0, f"preempted {feeder}:{feeder}")
    assert roots[hog] == pytest.approx(0.7)  # the feeder's 8 ms preempted inside the worker's 9.5 ms of the 10
    assert roots[Root(waits.ON_CPU, feeder, feeder, "futex")] == pytest.approx(0.25)  # 17 -> 19.5: it ran
    assert roots[Root(waits.ON_CPU, WORKER, WORKER, "read")] == pytest.approx(0.05)  # 19.5 -> 20: the worker ran
    assert sum(roots.values()) == pytest.approx(1.0)


def test_a_worker_woken_by_the_loop_but_kept_off_its_cpu_by_a_hog() -> None:
    """The DataLoader shape: the loop hands the worker its next index (the worker's wake-up) and
    waits for the batch; the worker is runnable from then on but a hog holds its core (the row's
    runq tail, other_pid = the hog).  That tail is the hog's, not a cycle back to the loop."""
    wait = blocked(10, 20, "read", WORKER, target="pipe:[7]")
    worker_wait = Interval(2 * MS, 16 * MS, False, HOG, "sleep", "read", "pipe:[8]", LOOP, LOOP, runq=6 * MS)
    th = threads({LOOP: [wait], WORKER: [blocked(0, 1, "read", LOOP), worker_wait, blocked(25, 30, "read", LOOP)]})
    roots = waits.follow(wait, LOOP, th)
    assert roots == pytest.approx({
        Root(waits.CPU, HOG, 0, f"woken, waiting for a CPU {WORKER}:{WORKER}"): 0.6,  # 10 -> 16, runnable
        Root(waits.ON_CPU, WORKER, WORKER, "read pipe:[7]"): 0.4,  # 16 -> 20: it computed the batch
    })
    # the same row from before schema 17 (the holder not known): the wait for a CPU, nobody named
    old = Interval(2 * MS, 16 * MS, False, 0, "sleep", "read", "pipe:[8]", LOOP, LOOP, runq=6 * MS)
    th = threads({LOOP: [wait], WORKER: [blocked(0, 1, "read", LOOP), old, blocked(25, 30, "read", LOOP)]})
    assert waits.follow(wait, LOOP, th)[Root(waits.CPU, 0, 0, f"woken, waiting for a CPU {WORKER}:{WORKER}")] \
        == pytest.approx(0.6)


def test_the_blocked_part_of_a_woken_waker_is_still_followed() -> None:
    """Woken at 14 of a wait from 5, runnable until 16: 10 -> 14 follows its waker (a cycle back to
    the loop here: unknown), 14 -> 16 is the hog's."""
    wait = blocked(10, 20, "read", WORKER)
    worker_wait = Interval(5 * MS, 16 * MS, False, HOG, "sleep", "futex", None, LOOP, LOOP, runq=2 * MS)
    th = threads({LOOP: [wait], WORKER: [blocked(0, 1, "read", LOOP), worker_wait, blocked(25, 30, "read", LOOP)]})
    roots = waits.follow(wait, LOOP, th)
    assert roots[Root(waits.CPU, HOG, 0, f"woken, waiting for a CPU {WORKER}:{WORKER}")] == pytest.approx(0.2)
    assert roots[Root(waits.UNKNOWN, LOOP, LOOP, "futex")] == pytest.approx(0.4)
    assert sum(roots.values()) == pytest.approx(1.0)


def test_a_cycle_ends_unknown_instead_of_looping() -> None:
    a, b = 500, 600
    wait = blocked(10, 20, "futex", a)
    th = threads({LOOP: [wait], a: [blocked(5, 25, "futex", b)], b: [blocked(5, 25, "futex", a)]})
    roots = waits.follow(wait, LOOP, th)
    assert sum(roots.values()) == pytest.approx(1.0)
    assert all(r.root == waits.UNKNOWN for r in roots), roots


def test_a_waker_that_exited_or_was_never_traced_is_itself_the_root() -> None:
    wait = blocked(10, 20, "recvfrom", 777, target="socket:[9]")
    th = threads({LOOP: [wait]})
    assert waits.follow(wait, LOOP, th) == {Root(waits.ON_CPU, 777, 777, "recvfrom socket:[9]"): 1.0}


@pytest.mark.parametrize("call, target, root", [
    ("recvfrom", "socket:[9]", waits.NETWORK),
    ("epoll_wait", "socket:[9]", waits.NETWORK),
    ("read", "/data/shard-0001.tar", waits.DISK),
    ("poll", None, waits.TIMER),
])
def test_an_interrupt_waker(call: str, target: str | None, root: str) -> None:
    wait = blocked(10, 20, call, 0, target=target, waker_pid=0)
    th = threads({LOOP: [wait]})
    assert [r.root for r in waits.follow(wait, LOOP, th)] == [root]


def test_a_kernel_thread_waker_counts_as_an_interrupt() -> None:
    kworker = 80
    wait = blocked(10, 20, "read", kworker, target="socket:[3]", waker_pid=kworker)
    th = threads({LOOP: [wait]}, kernel=[kworker])
    assert [r.root for r in waits.follow(wait, LOOP, th)] == [waits.NETWORK]


def test_flushes_sleeps_and_faults_are_their_own_roots() -> None:
    th = threads({})
    fsync = blocked(0, 50, "fsync", 0, kind="io", target="/ckpt/step_500.pt", waker_pid=0)
    assert waits.follow(fsync, LOOP, th) == {Root(waits.DISK, detail="fsync /ckpt/step_500.pt"): 1.0}
    nap = blocked(0, 5, "clock_nanosleep", 0, waker_pid=0)
    assert waits.follow(nap, LOOP, th) == {Root(waits.SLEEP, detail="clock_nanosleep"): 1.0}
    fault = blocked(0, 5, None, 0, kind="io", waker_pid=0)
    assert waits.follow(fault, LOOP, th) == {Root(waits.FAULT): 1.0}
    unseen = blocked(0, 5, "futex", None)
    assert [r.root for r in waits.follow(unseen, LOOP, th)] == [waits.UNKNOWN]


def test_a_timed_out_futex_while_a_sibling_ran_is_that_sibling_holding_the_gil() -> None:
    wait = blocked(10, 15, "futex", 0, waker_pid=0)  # ran out (a timer): CPython's 5 ms GIL interval
    th = threads({LOOP: [wait], SIBLING: [blocked(0, 9, "futex", LOOP), blocked(16, 17, "futex", LOOP)]})
    assert waits.follow(wait, LOOP, th) == {Root(waits.ON_CPU, LOOP, SIBLING, "futex (timed out)"): 1.0}


def test_a_timed_out_futex_while_siblings_slept_stays_the_timers() -> None:
    wait = blocked(10, 15, "futex", 0, waker_pid=0)
    # the sibling sleeps through the wait, and another thread has no row at all (nothing known)
    th = threads({LOOP: [wait], SIBLING: [blocked(0, 30, "clock_nanosleep", 0, waker_pid=0)], 102: []},
                 pids={102: LOOP})
    assert waits.follow(wait, LOOP, th) == {Root(waits.TIMER, detail="futex"): 1.0}


def test_on_cpu_is_only_what_the_rows_show() -> None:
    th = threads({WORKER: [blocked(0, 10, "read", None), blocked(20, 30, "read", None)]})
    assert th.on_cpu_ns(WORKER, 5 * MS, 25 * MS) == 10 * MS  # between its two rows
    assert th.on_cpu_ns(WORKER, 25 * MS, 50 * MS) == 0  # after its last row: not known
    assert th.on_cpu_ns(WORKER, 25 * MS, 50 * MS, running_at_end=True) == 20 * MS
