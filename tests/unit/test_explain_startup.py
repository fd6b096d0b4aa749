"""Start-up (imports, first-touch faults, waiting for the first batch) is not the steady state.

Rules look at a process from its first window with a kernel launch or a sync:
before it the process only initialises (cudaMalloc, reading data, faulting in
pages), and its faults or sleeps there are no slowdown of a training loop.
"""

from __future__ import annotations

from analyze_helpers import MAIN_PID, MS, S, T0, US, Trace, chains_of, silent, named_loop


def startup(tr: Trace, seconds: float, *, faults: int = 0, fault_us: float = 0, sleep_ms: float = 0) -> Trace:
    """Init phase: a cudaMalloc every 10 ms, with page faults and/or sleeps outside CUDA calls."""
    t = T0
    while t < T0 + int(seconds * S):
        tr.ev(t, "cudaMalloc", MAIN_PID, MAIN_PID, 30 * US, bytes=1 << 20)
        for k in range(faults):
            tr.ev(t + 40 * US + k * int(fault_us * US), "page_fault", MAIN_PID, MAIN_PID, fault_us * US)
        if sleep_ms:
            tr.switch(t + 2 * MS, MAIN_PID, MAIN_PID, sleep_ms * MS, "sleep", runq=10 * US)
        t += 10 * MS
    return tr


def base() -> Trace:
    return named_loop(30)


def test_first_touch_faults_before_the_first_launch_are_not_memory_pressure():
    # 8 s of start-up: 100 faults of 60 us per 10 ms (60% of the time in faults), then a healthy loop
    tr = startup(base(), 8, faults=100, fault_us=60).loop(8, 30)
    assert silent(tr.explain(), "memory-pressure")


def test_waiting_before_the_first_launch_is_not_input_bound():
    # 8 s of loading (sleeping outside CUDA calls 7 ms of every 10 ms), then a healthy loop
    tr = startup(base(), 8, sleep_ms=7).loop(8, 30)
    assert silent(tr.explain(), "input-bound")


def test_the_same_faults_during_the_loop_still_fire():
    # control: the fault load in the middle of the loop is memory pressure
    tr = base().loop(0, 10).loop(10, 20, faults=400).loop(20, 30)
    for e in tr.events:
        if e["op"] == "page_fault" and T0 + 10 * S <= e["timestamp"] < T0 + 20 * S:
            e["duration_ns"] = 60 * US
    assert chains_of(tr.explain(), "memory-pressure") != []
