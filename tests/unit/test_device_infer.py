"""Device activity inferred from hand-made call streams whose device timeline is known.

``Host`` plays a loop against a one-queue-per-stream device model (kernels run
in submission order, each when its launch has returned and the stream's
previous work is done), writes the calls as the tracer stores them, and keeps
the device's busy intervals as the truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from analyze_helpers import MAIN_PID, MAIN_TID, SESSION, T0, US, Trace, sample_store

from ingero.analyze import context, device, windows
from ingero.analyze.device import Thresholds

NOWAIT_US = 4  # a sync with nothing to wait for


@dataclass
class Host:
    t: int = T0
    tid: int = MAIN_TID
    trace: Trace = field(default_factory=Trace)
    busy: list[tuple[int, int]] = field(default_factory=list)
    stream_end: dict[int, int] = field(default_factory=dict)
    first: int | None = None

    def _call(self, op: str, dur_ns: int, **kw) -> None:
        self.first = self.t if self.first is None else self.first
        self.trace.ev(self.t, op, MAIN_PID, self.tid, dur_ns, **kw)
        self.t += dur_ns

    def _queue(self, stream: int, work_ns: int) -> None:
        start = max(self.t, self.stream_end.get(stream, 0))
        self.stream_end[stream] = start + work_ns
        self.busy.append((start, start + work_ns))

    def launch(self, kernel_us: float, launch_us: float = 5, stream: int = 7, show_stream: bool = False) -> None:
        self._call("cudaLaunchKernel", int(launch_us * US), stream=stream if show_stream else None)
        self._queue(stream, int(kernel_us * US))

    def copy_async(self, copy_us: float, stream: int = 7) -> None:
        self._call("cudaMemcpyAsync", 8 * US, kind="H2D", bytes=1 << 20, stream=stream)
        self._queue(stream, int(copy_us * US))

    def sync(self, op: str = "cudaStreamSync", stream: int | None = 7, sleep: bool = False,
             wake_us: float = 10) -> None:
        """Wait for ``stream`` (all streams: None); sleeping or spinning, as the wait policy says."""
        done = max([e for s, e in self.stream_end.items() if stream is None or s == stream] or [0])
        wait = max(0, done - self.t)
        dur = wait + NOWAIT_US * US + (int(wake_us * US) if sleep and wait else 0)
        if sleep and wait:
            self.trace.switch(self.t + 2 * US, MAIN_PID, self.tid, dur - 3 * US, "sleep", runq=int(wake_us * US))
        self._call(op, dur, stream=stream)

    def host(self, us: float) -> None:
        self.t += int(us * US)

    def truth(self) -> float:
        """Busy share of the device over the span of the calls (union of its busy intervals)."""
        a, b = self.first, self.t
        total, cur = 0, None
        for s, e in sorted(self.busy):
            s, e = max(s, a), min(e, b)
            if e <= s:
                continue
            if cur and s <= cur[1]:
                cur[1] = max(cur[1], e)
                continue
            total += cur[1] - cur[0] if cur else 0
            cur = [s, e]
        total += cur[1] - cur[0] if cur else 0
        return total / (b - a)

    def infer(self, t: Thresholds = device.T, window_s: float | None = None,
              sampled: float | None = None) -> device.DeviceActivity:
        """``sampled``: the launches kept as `--overhead-budget` keeps them, the first ``sampled``
        of every second (the sampling table says so)."""
        store = self.trace.store()
        if sampled is not None:
            sample_store(store, sampled, phase_ns=T0 % 10**9 + 10**9 // 3)
        ctx = context.resolve(store.con, context.Options(window_s=window_s))
        windows.build(ctx)
        return device.infer(ctx, t)[MAIN_PID]


def step(h: Host, *, kernels: int, kernel_us: float, host_us: float, gap_us: float = 10, **sync) -> None:
    h.copy_async(50)
    for _ in range(kernels):
        h.launch(kernel_us)
        h.host(gap_us)
    h.sync(**sync)
    h.host(host_us)


def check(act: device.DeviceActivity, truth: float, tol: float = 0.02) -> None:
    assert act.low <= truth + 1e-9 <= act.high + 2e-9, (act.low, truth, act.high)
    assert abs(act.busy_share - truth) <= tol, (act.busy_share, truth)


@pytest.mark.parametrize("sleep", [False, True], ids=["spin", "block"])
def test_gpu_bound_loop_waits_in_the_sync(sleep):
    h = Host()
    for _ in range(200):
        step(h, kernels=10, kernel_us=100, host_us=300, sleep=sleep)
    act = h.infer()
    assert act.waited_drains == 200 and act.drains == 200
    check(act, h.truth())
    assert 0.70 < h.truth() < 0.80  # 1,050 µs of device work per ~1,400 µs step


def test_wait_policy_does_not_move_the_inference():
    acts = []
    for sleep in (False, True):
        h = Host()
        for _ in range(100):
            step(h, kernels=20, kernel_us=50, host_us=500, sleep=sleep, wake_us=0)
        acts.append(h.infer())
    # a sleeping sync returns 1 µs after its sleep row ends: the device ended then, or 1 µs earlier
    assert acts[0].busy_share == pytest.approx(acts[1].busy_share, abs=0.002)
    assert (acts[0].low, acts[0].high) == pytest.approx((acts[1].low, acts[1].high), abs=1e-4)


def test_launch_bound_tiny_kernels_bounds_hold():
    # kernels of 8 µs launched every 15 µs: the device drains as fast as the host fills it,
    # the sync returns at once and nothing says how long the kernels were
    h = Host()
    for _ in range(200):
        step(h, kernels=50, kernel_us=8, host_us=200)
    act = h.infer()
    assert act.waited_drains == 0
    assert act.low <= h.truth() <= act.high
    # the host was idle-free only in [first submission, sync]: the upper bound is that share
    assert act.high < 0.85


@pytest.mark.parametrize("sleep", [False, True], ids=["spin", "block"])
def test_a_call_starting_as_the_drain_returns_is_the_next_segments(sleep):
    # the next step's copy starts on the very ns the sync returned (a clock of whole µs, as in
    # an imported trace, makes such ties common): it is not work the sync waited for
    hosts = []
    for host_us in (0, 0.001):  # the tie, and 1 ns later
        h = Host()
        for _ in range(100):
            step(h, kernels=20, kernel_us=30, host_us=host_us, sleep=sleep)
        hosts.append(h)
    tie, apart = (h.infer() for h in hosts)
    assert tie.waited_drains == apart.waited_drains == 100
    assert tie.busy_share == pytest.approx(apart.busy_share, abs=1e-4)
    check(tie, hosts[0].truth(), tol=0.05)


def half_waiting(steps: int) -> Host:
    """Every other step syncs late (after long host work: no wait); the others wait. Same kernels."""
    h = Host()
    for i in range(steps):
        h.copy_async(20)
        for _ in range(10):
            h.launch(100)
        if i % 2:
            h.host(2000)  # the device finishes during it
        h.sync()
        h.host(300)
    return h


def test_learned_kernel_time_fills_segments_that_did_not_wait():
    h = half_waiting(200)
    act = h.infer()
    assert act.waited_drains == 100
    check(act, h.truth(), tol=0.03)


def test_inline_data_loading_leaves_the_device_idle_between_steps():
    h = Host()
    for _ in range(200):
        h.host(800)  # loading the batch inline: nothing queued
        step(h, kernels=50, kernel_us=20, host_us=50)
    act = h.infer()
    check(act, h.truth(), tol=0.03)
    assert act.high < 0.65  # the loading time is surely idle


def test_async_copies_overlap_kernels_on_two_streams():
    # copies on stream 3 overlap kernels on stream 7; stream syncs are not drains with two streams
    h = Host()
    for _ in range(100):
        h.copy_async(400, stream=3)
        for _ in range(10):
            h.launch(60, show_stream=True)
        h.sync(stream=7)
        h.sync(stream=3)
        h.host(300)
    act = h.infer()
    assert act.drains == 0  # two streams: a stream sync waits for one of them only
    assert act.low <= h.truth() <= act.high


def test_device_sync_drains_every_stream():
    h = Host()
    for _ in range(100):
        h.copy_async(400, stream=3)
        for _ in range(10):
            h.launch(60, show_stream=True)
        h.sync(op="cudaDeviceSync", stream=None)
        h.host(600)
    act = h.infer()
    assert act.drains == 100 and act.waited_drains == 100
    check(act, h.truth(), tol=0.05)
    assert act.high < 0.8


def test_event_sync_waits_but_does_not_drain():
    h = Host()
    for _ in range(100):
        for _ in range(10):
            h.launch(100)
        h.sync(op="cudaEventSync")
        h.host(500)
    act = h.infer()
    assert act.drains == 0
    assert act.low > 0.4  # the waits: the device surely ran during them
    assert act.low <= h.truth() <= act.high


def backpressure(h: Host, *, queue: int = 32, kernels: int = 400, kernel_us: float = 60) -> None:
    """A loop that fills a ``queue``-deep launch queue: each further launch waits for a slot."""
    ends: list[int] = []
    for i in range(kernels):
        slot_free = ends[i - queue] if i >= queue else h.t
        dur = max(5 * US, slot_free - h.t + 5 * US)
        h._call("cudaLaunchKernel", dur)
        start = max(h.t, ends[-1] if ends else 0)
        ends.append(start + int(kernel_us * US))
        h.busy.append((start, ends[-1]))
        h.stream_end[7] = ends[-1]
        h.host(5)


def test_long_launch_runs_are_backpressure_from_a_full_queue():
    h = Host()
    for _ in range(5):
        backpressure(h)
        h.sync()
        h.host(2000)
    act = h.infer()
    assert act.backpressure_launches > 1000
    assert act.low > 0.5  # the host sat in launches while the device ran
    check(act, h.truth(), tol=0.05)


def test_an_isolated_long_launch_is_not_backpressure():
    # a 3 s first launch (lazy module loading on a real A100) with the device idle
    h = Host()
    h._call("cudaLaunchKernel", 3_000_000 * US)
    h.busy.append((h.t, h.t + 10 * US))
    h.stream_end[7] = h.t + 10 * US
    for _ in range(100):
        step(h, kernels=5, kernel_us=10, host_us=100)
    act = h.infer()
    assert act.backpressure_launches == 0
    assert act.low <= h.truth() <= act.high


def test_windows_and_sampling_keep_the_share():
    h = Host()
    for _ in range(3000):
        step(h, kernels=10, kernel_us=100, host_us=300)
    exact = h.infer(window_s=1)
    sampled = h.infer(Thresholds(max_exact_calls=10_000), window_s=1)
    assert len(exact.windows) == 5 and exact.sampled == 1.0
    assert sampled.sampled < 0.5
    assert sampled.busy_share == pytest.approx(exact.busy_share, abs=0.02)
    for w in exact.windows:
        low, point, high = w.share
        assert 0 <= low <= point <= high <= 1


def test_a_sampled_trace_is_inferred_where_every_launch_was_seen():
    # half the steps wait in their sync, half sync late and learn the kernel time from the others:
    # where the launch probes were detached (the budget), those steps show one submission (the copy)
    # of their eleven, and would count one learned kernel time instead of ten
    h = half_waiting(4000)
    full = h.infer(window_s=1)
    check(full, h.truth(), tol=0.03)
    sampled = h.infer(window_s=1, sampled=0.2)
    check(sampled, h.truth(), tol=0.03)
    # a fifth of each of the trace's seconds is analysed: the attached slices, in their windows
    assert sampled.span_ns == pytest.approx(full.span_ns * 0.2, rel=0.1)
    assert {w.w for w in sampled.windows} <= {w.w for w in full.windows}


def test_failed_calls_queue_nothing():
    # without a driver every call returns an error (35): no device activity at all
    h = Host()
    for _ in range(50):
        step(h, kernels=5, kernel_us=100, host_us=100)
    for e in h.trace.events:
        e["ret"] = 35
    store = h.trace.store()
    ctx = context.resolve(store.con, context.Options())
    windows.build(ctx)
    assert device.infer(ctx) == {}


def test_to_dict_is_the_explain_json_shape():
    h = Host()
    for _ in range(50):
        step(h, kernels=10, kernel_us=100, host_us=300)
    d = h.infer().to_dict()
    assert set(d) == {"busy_share", "low", "high", "source"} and d["source"] == "inferred"
    assert SESSION == 1


def test_a_sync_preempted_after_the_device_finished_is_not_surely_device_time():
    # a yielding sync on a busy host: the device is done 5 µs into a 2 ms preemption, the thread
    # returns right after it; the 2 ms are CPU wait (sched rows inside the sync), not surely
    # device time, and the device may have finished anywhere in them
    h = Host()
    for _ in range(100):
        h.copy_async(20)
        for _ in range(5):
            h.launch(20)
        done = h.stream_end[7]
        h.trace.switch(done - 5 * US, MAIN_PID, h.tid, 2000 * US, "preempted", runq=2000 * US, other=99)
        h._call("cudaStreamSync", done - h.t + 1995 * US + NOWAIT_US * US, stream=7)
        h.host(300)
    act = h.infer()
    truth = h.truth()
    assert act.low <= truth <= act.high
    assert act.low < 0.05  # the wait was all CPU wait
    # the point takes the middle of the preemption: 1 ms of each ~2.5 ms step too much at worst
    step_ms = (h.t - h.first) / 100 / 1e6
    assert truth < act.busy_share <= truth + 1.0 / step_ms + 0.01
