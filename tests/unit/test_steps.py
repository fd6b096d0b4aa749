"""Steps from the rhythm of the loop's calls, and the breakdown of a step's wall clock."""

from __future__ import annotations

import pytest
from analyze_helpers import MAIN_PID, MAIN_TID, US
from test_device_infer import Host, step

from ingero.analyze import context, device, traced_steps, windows


def detect(h: Host, window_s: float | None = None, **opts) -> traced_steps.Steps | None:
    store = h.trace.store()
    ctx = context.resolve(store.con, context.Options(window_s=window_s, **opts))
    windows.build(ctx)
    return traced_steps.detect(ctx, device.infer(ctx)[MAIN_PID])


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


@pytest.mark.parametrize("sleep", [False, True], ids=["spin", "block"])
def test_a_sync_after_every_kernel_is_one_step_per_input_copy(sleep):
    # 32 kernels a step, each followed by its sync (.item() in the loop): the counts repeat
    # every segment, so only the input copy, once a step, shows where a step starts
    h = Host()
    ends = []
    for _ in range(50):
        h.host(200)
        h.copy_async(50)
        for _ in range(32):
            h.launch(40)
            h.sync(sleep=sleep)
        ends.append(h.t)  # the step's last sync returned
    st = detect(h)
    assert st.drains_per_step == 32
    assert st.count == 49
    truth = {(b - a) / 1e6 for a, b in zip(ends, ends[1:])}
    assert len(truth) == 1
    assert st.median_ms == pytest.approx(truth.pop(), abs=1e-6)
    assert st.p99_ms == st.median_ms


def test_a_read_back_every_tenth_step_is_not_the_step():
    # one sync a step, the data already on the device; every tenth step also fetches a value
    # to the host for logging (a D2H copy): one step per sync still
    h = Host()
    for i in range(200):
        for _ in range(10):
            h.launch(100)
        if i % 10 == 0:
            h._call("cudaMemcpyAsync", 8 * US, kind="D2H", bytes=4, stream=7)
            h._queue(7, 5 * US)
        h.sync()
        h.host(300)
    st = detect(h)
    assert st.drains_per_step == 1
    assert st.count == 199


def test_an_input_copy_without_a_host_gap_before_it_is_not_the_step():
    # a sync after each of 8 kernels, and an H2D copy (a lookup table refreshed) before every
    # 8th kernel, but the host works between every two syncs alike: nothing sets those apart
    h = Host()
    for i in range(400):
        h.host(100)
        if i % 8 == 0:
            h.copy_async(20)
        h.launch(40)
        h.sync()
    st = detect(h)
    assert st.drains_per_step == 1


def test_an_extra_sync_on_every_tenth_step_moves_no_step_boundary():
    # two syncs a step (200 µs of Python after the first, 400 µs after the second); every tenth
    # step also reads a buffer back (a D2H copy and a third sync) and logs for 2 ms after it
    h = Host()
    for i in range(200):
        h.copy_async(50)
        for _ in range(20):
            h.launch(40)
        h.sync()
        h.host(200)
        for _ in range(40):
            h.launch(30)
        h.sync()
        if i % 10 == 9:
            h._call("cudaMemcpyAsync", 8 * US, kind="D2H", bytes=1 << 20, stream=7)
            h._queue(7, 90 * US)
            h.sync()
            h.host(2000)
        else:
            h.host(400)
    st = detect(h)
    assert st.drains_per_step == 2
    assert st.count == 199  # (by every second drain: 209)


def test_a_validation_pass_of_tiny_synchronous_copies_is_not_steps():
    # one sync a step; every 50 steps a validation pass reads 640 small results back with
    # synchronous copies: each copy is a drain, and the pass repeats with period 1 too
    h = Host()
    for i in range(300):
        step(h, kernels=10, kernel_us=100, host_us=300)
        if i % 50 == 49:
            for _ in range(640):
                h._call("cudaMemcpy", 15 * US, kind="D2H", bytes=4096)
                h.host(5)
    h.sync(op="cudaDeviceSync", stream=None)
    st = detect(h)
    assert st.drains_per_step == 1
    assert st.count == 300  # (each copy a step: 300 + 6 x 640)
    assert st.median_ms == pytest.approx((8 + 50 + 1000 + NOWAIT + 300) / 1000, abs=0.002)


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
    assert traced_steps.period([10, 10, 10, 10, 10, 10, 10]) == 1
    assert traced_steps.period([30, 10, 30, 10, 30, 10, 30, 10]) == 2
    assert traced_steps.period([50, 51, 50, 49, 50, 50]) == 1  # an extra launch now and then
    assert traced_steps.period([1, 9, 3, 27, 2, 14, 5]) is None


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
    st = traced_steps.detect(ctx, act)
    assert st.count == 3000
    assert st.median_ms == pytest.approx((8 + 50 + 1000 + NOWAIT + 300) / 1000, abs=0.002)


def test_period_matches_within_the_tolerance():
    # 10% of the larger count, and always 1: 10 vs 11 match, 10 vs 12 do not, 1 vs 2 do
    assert traced_steps.period([10, 11] * 6) == 1
    assert traced_steps.period([10, 12] * 6) == 2
    assert traced_steps.period([1, 2, 1, 2, 1, 2, 2]) == 1


# ---- steps from NVTX ranges named as steps


def _marked_loop(h: Host, n: int, name: str = "step {i}", *, sync: bool = True, nested: bool = True) -> list[int]:
    """``n`` steps inside NVTX ranges (forward/backward nested), an odd read-back every 7th;
    the steps' starts."""
    starts = []
    for i in range(n):
        h.host(300)  # the next batch, outside the range
        s = h.t
        starts.append(s)
        h.copy_async(50)
        f = h.t
        for _ in range(10):
            h.launch(40)
        if nested:
            h.trace.span(MAIN_PID, h.tid, f, h.t, "forward")
        b = h.t
        for _ in range(20):
            h.launch(40)
        if nested:
            h.trace.span(MAIN_PID, h.tid, b, h.t, "backward")
        if sync:
            h.sync()
            if i % 7 == 3:
                h.launch(5)
                h.sync()
        h.host(100)
        h.trace.span(MAIN_PID, h.tid, s, h.t, name.format(i=i))
    return starts


def test_nvtx_ranges_named_as_steps_are_the_steps():
    h = Host()
    starts = _marked_loop(h, 40)
    st = detect(h)
    assert (st.source, st.marker, st.count) == ("nvtx", "step #", 40)
    period = [(b - a) / 1e6 for a, b in zip(starts, starts[1:])]
    assert st.median_ms == pytest.approx(sorted(period)[19], rel=1e-9)
    assert st.p99_ms == pytest.approx(max(period), rel=1e-9)  # a step with the read-back
    assert st.breakdown.total_ms == pytest.approx(st.mean_ms, rel=1e-9)


def test_nvtx_steps_of_a_loop_that_never_syncs():
    # real PyTorch loops rarely sync: no drain, no rhythm; the ranges still mark the steps
    h = Host()
    _marked_loop(h, 30, "train_iter{i}", sync=False)
    st = detect(h)
    assert (st.source, st.marker, st.count) == ("nvtx", "train_iter#", 30)
    h2 = Host()
    _marked_loop(h2, 30, "range {i}", sync=False)
    assert detect(h2) is None


def test_ranges_not_named_as_steps_leave_it_to_the_rhythm():
    h = Host()
    for _ in range(50):
        s = h.t
        step(h, kernels=10, kernel_us=100, host_us=300)
        h.trace.span(MAIN_PID, h.tid, s, h.t, "aten::mm")  # emit_nvtx: one range per operator
    st = detect(h)
    assert (st.source, st.marker, st.count) == ("rhythm", None, 49)


def test_too_few_step_ranges_leave_it_to_the_rhythm():
    h = Host()
    _marked_loop(h, traced_steps.T.min_marked_steps - 1)
    for _ in range(40):
        step(h, kernels=10, kernel_us=100, host_us=300)
    assert detect(h).source == "rhythm"


def test_the_step_family_is_the_one_not_inside_another():
    h = Host()
    starts = []
    for i in range(20):
        h.host(300)
        starts.append(h.t)
        for j in range(3):  # gradient accumulation: 3 micro-batches a step, more ranges than steps
            m = h.t
            h.copy_async(50)
            for _ in range(10):
                h.launch(40)
            h.trace.span(MAIN_PID, h.tid, m, h.t, f"micro-batch {j}")
        o = h.t
        h.launch(20)
        h.sync()
        h.trace.span(MAIN_PID, h.tid, o, h.t, "optimizer step")  # inside the step as well
        h.trace.span(MAIN_PID, h.tid, starts[-1], h.t, f"Step {i}")
    # an epoch around them all (not step-named), and one "batch loop" (too few to be steps)
    h.trace.span(MAIN_PID, h.tid, starts[0] - 1, h.t, "epoch 0")
    h.trace.span(MAIN_PID, h.tid, starts[0] - 2, h.t + 1, "batch loop")
    st = detect(h)
    assert (st.source, st.marker, st.count) == ("nvtx", "Step #", 20)
    period = sorted((b - a) / 1e6 for a, b in zip(starts, starts[1:]))
    assert st.median_ms == pytest.approx(period[9], rel=1e-9)


@pytest.mark.parametrize("name, is_step", [
    ("step 12", True), ("train_step", True), ("ProfilerStep#3", True), ("trainStep", True),
    ("iteration 7", True), ("iter", True), ("Batch 4", True), ("step12", True),
    ("forward", False), ("aten::mm", False), ("batchnorm", False), ("stepper", False), ("substep", False),
    # operators and framework names with a step word in them (emit_nvtx, autograd, record_function)
    ("aten::batch_norm, seq = 12, op_id = 40", False), ("aten::cudnn_batch_norm", False),
    ("CudnnBatchNormBackward0", False), ("BatchNorm2d", False), ("Optimizer.step#SGD.step", False),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", False), ("lr_scheduler.step", False),
    ("step#3", True),
])
def test_step_names(name, is_step):
    assert traced_steps.is_step_name(name) is is_step


def test_outermost_ranges_of_a_thread():
    import numpy as np

    s = np.array([0, 0, 5, 8, 20, 25, 40])
    e = np.array([30, 10, 9, 9, 28, 45, 44])
    # (0,30) holds (0,10), (5,9), (8,9), (20,28); (25,45) overlaps it without being inside, and
    # holds (40,44)
    assert traced_steps.outermost(s, e).tolist() == [True, False, False, False, False, True, False]


def test_explain_prints_where_nvtx_steps_come_from():
    import io

    from ingero.render import terminal

    h = Host()
    _marked_loop(h, 40)
    report = h.trace.explain()
    assert (report.steps.source, report.steps.marker, report.steps.count) == ("nvtx", "step #", 40)
    assert report.to_dict()["steps"]["marker"] == "step #"
    out = io.StringIO()
    terminal.write(report, out)
    assert "Steps: 40 (from NVTX ranges 'step #'), p50 " in out.getvalue()


def test_operator_ranges_with_a_step_word_are_not_steps():
    # emit_nvtx: a range per operator, batch_norm among them, several a step
    h = Host()
    for _ in range(50):
        s = h.t
        for j in range(5):
            o = h.t
            h.launch(40)
            h.trace.span(MAIN_PID, h.tid, o, h.t, f"aten::batch_norm, seq = {j}, op_id = 40")
        step(h, kernels=10, kernel_us=100, host_us=300)
        h.trace.span(MAIN_PID, h.tid + 1, s, s + 1000, "CudnnBatchNormBackward0, seq = 3")
    assert detect(h).source == "rhythm"


def test_a_validation_pass_of_many_short_ranges_is_not_the_steps():
    h = Host()
    starts = []
    for i in range(60):
        s = h.t
        starts.append(s)
        step(h, kernels=10, kernel_us=100, host_us=300)
        h.trace.span(MAIN_PID, h.tid, s, h.t, "train_step")
        if i % 20 == 19:  # validation: 100 short ranges between two steps
            for _ in range(100):
                v = h.t
                h.launch(10)
                h.sync()
                h.trace.span(MAIN_PID, h.tid, v, h.t, "val_batch")
    st = detect(h)
    assert (st.source, st.marker, st.count) == ("nvtx", "train_step", 60)
    # the steps before a validation pass end at their range's end plus the usual gap
    assert st.p99_ms == pytest.approx(st.median_ms, rel=0.01)


def test_steps_handed_between_threads_are_one_sequence():
    h = Host()
    starts = []
    for i in range(40):
        h.tid = MAIN_TID + i % 2  # a step on one thread, the next on the other
        h.host(100)
        s = h.t
        starts.append(s)
        step(h, kernels=10, kernel_us=100, host_us=300)
        h.trace.span(MAIN_PID, h.tid, s, h.t, "step")
    h.tid = MAIN_TID
    st = detect(h)
    assert (st.source, st.count) == ("nvtx", 40)
    period = sorted((b - a) / 1e6 for a, b in zip(starts, starts[1:]))
    assert st.median_ms == pytest.approx(period[19], rel=1e-9)


def test_a_narrow_range_keeps_micro_batches_inside_their_step():
    h = Host()
    starts = []
    for i in range(40):
        h.host(300)
        starts.append(h.t)
        for j in range(4):
            m = h.t
            step(h, kernels=5, kernel_us=100, host_us=50)
            h.trace.span(MAIN_PID, h.tid, m, h.t, f"micro batch {j}")
        h.trace.span(MAIN_PID, h.tid, starts[-1], h.t, f"train step {i}")
    # a range holding 4 train steps (16 micro-batches): too few train steps to be a family, and
    # the micro-batches are inside them
    st = detect(h, from_ns=starts[10] - 1, to_ns=starts[13] + 1)
    assert st is None or st.source == "rhythm"
    # 6 of them are steps again
    st = detect(h, from_ns=starts[10] - 1, to_ns=starts[15] + 1)
    assert (st.source, st.marker, st.count) == ("nvtx", "train step #", 6)


@pytest.mark.parametrize("host_ms, gpu_ms", [(900, 1600), (1500, 1000)])
def test_a_step_longer_than_a_window_keeps_its_host_phase(host_ms, gpu_ms):
    # 2.5 s steps over 1 s windows: a window of host work only has no CUDA call of the loop, and
    # was missing from the step's time (host 0%, or no breakdown at all)
    h = Host()
    h.launch(10)
    h.sync()
    for i in range(12):
        s = h.t
        h.host(host_ms * 1000)
        h.copy_async(50)
        for _ in range(10):
            h.launch(gpu_ms * 100)
        h.sync()
        h.trace.span(MAIN_PID, h.tid, s, h.t, f"step {i}")
    h.launch(10)
    h.sync()
    st = detect(h, window_s=1)
    b = st.breakdown
    assert st.count == 12
    assert b.host_ms / b.total_ms == pytest.approx(host_ms / (host_ms + gpu_ms), abs=0.06)


def test_a_read_back_that_waits_for_queued_kernels_is_device_wait_not_copy():
    # a loop that never syncs: launches only, and a 4-byte D2H read-back every 10th step that
    # waits for the kernels queued before it (a new user's loop: "copies 54%, device wait 0%",
    # and a HIGH transfer-bound chain at "0 MB/s for 4 B per copy")
    from ingero.analyze.explain import explain
    from ingero.analyze.context import Options

    h = Host()
    for i in range(400):
        s = h.t
        h.copy_async(20)
        for _ in range(20):
            h.launch(60)
        if i % 10 == 9:
            done = max(h.stream_end.values())
            h._call("cudaMemcpy", max(0, done - h.t) + 30 * US, kind="D2H", bytes=4)
        h.host(100)
        h.trace.span(MAIN_PID, h.tid, s, h.t, "train_step")
    st = detect(h)
    b = st.breakdown
    assert st.count == 400
    assert b.copy_ms < 0.02 * b.total_ms  # the async copies, and 50 µs at most of each 4-byte read-back
    assert b.device_wait_ms > 0.5 * b.total_ms
    report = explain(h.trace.store().con, Options())
    assert "transfer-bound" not in {c.rule_id for c in report.chains}


def test_with_two_traced_processes_the_steps_line_says_whose():
    import io

    from ingero.render import terminal

    h = Host()
    _marked_loop(h, 40)
    for k in range(50):  # a second process with a few CUDA calls of its own
        h.trace.ev(h.first + k * 100 * US, "cudaLaunchKernel", MAIN_PID + 7, MAIN_PID + 7, 5 * US)
    report = h.trace.explain()
    assert (report.steps.pid, report.to_dict()["steps"]["pid"]) == (MAIN_PID, MAIN_PID)
    out = io.StringIO()
    terminal.write(report, out)
    assert f"Steps of PID {MAIN_PID}: 40 (from NVTX ranges 'step #')" in out.getvalue()
