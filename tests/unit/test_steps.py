"""Steps from the rhythm of the loop's calls, and the breakdown of a step's wall clock."""

from __future__ import annotations

import pytest
from analyze_helpers import MAIN_PID, US
from test_device_infer import Host, step

from ingero.analyze import context, device, steps, windows


def detect(h: Host, window_s: float | None = None) -> steps.Steps | None:
    store = h.trace.store()
    ctx = context.resolve(store.con, context.Options(window_s=window_s))
    windows.build(ctx)
    return steps.detect(ctx, device.infer(ctx)[MAIN_PID])


def test_one_sync_per_step():
    h = Host()
    for _ in range(100):
        step(h, kernels=10, kernel_us=100, host_us=300)
    st = detect(h)
    assert st.count == 99 and st.drains_per_step == 1
    # copy 8 + 10 x (5 + 10) launches, then the sync until the device is done, 300 µs host
    assert st.median_ms == pytest.approx(st.p99_ms, rel=1e-3)
    assert st.median_ms == pytest.approx((8 + 50 + 1000 + NOWAIT + 300) / 1000, abs=0.002)


NOWAIT = 4


def test_two_syncs_per_step_are_one_step():
    h = Host()
    for _ in range(60):
        h.copy_async(50)
        for _ in range(30):
            h.launch(20)
        h.sync()
        for _ in range(10):
            h.launch(20)
        h.sync()
        h.host(500)
    st = detect(h)
    assert st.drains_per_step == 2
    assert st.count == 59
    assert st.median_ms == pytest.approx(st.p99_ms, rel=1e-3)


def test_the_breakdown_adds_up_and_names_inline_loading():
    h = Host()
    for _ in range(300):
        h.trace.switch(h.t, MAIN_PID, h.tid, 800 * US, "sleep", runq=20 * US)  # waiting for a batch
        h.host(800)
        h.host(200)  # and decoding it on the CPU
        step(h, kernels=20, kernel_us=30, host_us=100)
    st = detect(h, window_s=0.1)
    b = st.breakdown
    assert b.total_ms == pytest.approx(st.mean_ms, rel=1e-9)
    assert b.data_wait_ms == pytest.approx(0.78, abs=0.02)
    assert b.cpu_wait_ms == pytest.approx(0.02, abs=0.005)
    assert b.launch_ms == pytest.approx(0.1, abs=0.005)  # 20 launches of 5 µs
    assert b.host_ms == pytest.approx(0.2 + 0.2 + 0.1, abs=0.02)  # decode, gaps between launches, host work
    assert set(st.to_dict()) == {"count", "median_ms", "p99_ms", "breakdown_ms"}


def test_no_drain_no_steps():
    h = Host()
    for _ in range(500):
        h.launch(20)
        h.host(10)
    assert detect(h) is None


def test_no_repeating_pattern_no_steps():
    h = Host()
    for i in range(60):
        for _ in range((i * 7919) % 23 + 1):
            h.launch(20)
        h.sync()
        h.host(100)
    assert detect(h) is None


def test_period_prefers_the_smallest_repeat():
    assert steps.period([10, 10, 10, 10, 10, 10, 10]) == 1
    assert steps.period([30, 10, 30, 10, 30, 10, 30, 10]) == 2
    assert steps.period([50, 51, 50, 49, 50, 50]) == 1  # an extra launch now and then
    assert steps.period([1, 9, 3, 27, 2, 14, 5]) is None


@pytest.mark.parametrize("cap", [None, 10_000], ids=["exact", "sampled"])
def test_the_count_is_exact_when_the_calls_are_sampled(cap):
    # train.py's shape: one sync per step, a cudaDeviceSynchronize after the last step
    h = Host()
    for _ in range(3000):
        step(h, kernels=10, kernel_us=100, host_us=300)
    h.sync(op="cudaDeviceSync", stream=None)
    store = h.trace.store()
    ctx = context.resolve(store.con, context.Options(window_s=1))
    windows.build(ctx)
    t = device.T if cap is None else device.Thresholds(max_exact_calls=cap)
    act = device.infer(ctx, t)[MAIN_PID]
    assert (act.sampled < 0.5) == (cap is not None)
    st = steps.detect(ctx, act)
    assert st.count == 3000
    assert st.median_ms == pytest.approx((8 + 50 + 1000 + NOWAIT + 300) / 1000, abs=0.002)


def test_period_matches_within_the_tolerance():
    # 10% of the larger count, and always 1: 10 vs 11 match, 10 vs 12 do not, 1 vs 2 do
    assert steps.period([10, 11] * 6) == 1
    assert steps.period([10, 12] * 6) == 2
    assert steps.period([1, 2, 1, 2, 1, 2, 2]) == 1
