"""launch-bound, sync-heavy, gpu-idle, straggler."""

from __future__ import annotations

import pytest

from analyze_helpers import MAIN_PID, MAIN_TID, SESSION, T0, US, S, Trace, chains_of, sample_store, silent, named_loop
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.rules import launch_bound, sync_heavy


def base() -> Trace:
    return named_loop(20)


def test_launch_bound_fires():
    tr = base().loop(0, 20, launches=400, launch_us=8, launch_gap_us=20, device_ms=2, cpu_ms=1)
    report = tr.explain()
    [chain] = chains_of(report, "launch-bound")
    assert report.chains[0] is chain
    assert chain.severity == "HIGH"
    # one launch every 28 µs plus the step's 1 ms of Python: ~32k/s
    assert chain.numbers["launches_per_s"] == pytest.approx(400 / 0.0122, rel=0.05)
    assert chain.numbers["launch_mean_ns"] == pytest.approx(8000)
    assert chain.numbers["oncpu_share"] > 0.95
    assert any("CUDA graph" in f for f in chain.fix)
    assert silent(report, "sync-heavy")
    assert silent(report, "cpu-contention")


def short_kernels(policy: str) -> Trace:
    """400 launches of 15 µs a step, each kernel done 5 µs after its launch returned; the sync
    returns 4.5 µs after the last kernel plus its wake-up (block: 25 µs) or at once (spin)."""
    tr = base()
    tr.ev(T0 + 1000, "cudaStreamSync", MAIN_PID, MAIN_TID, 2 * US)  # a sync with nothing to wait for
    return tr.loop(0.001, 1.5, launches=400, launch_us=15, launch_gap_us=0.5, device_ms=6.2045, cpu_ms=0,
                   policy=policy)


def test_launch_bound_behind_a_sleeping_sync_is_medium_and_says_why():
    # the sleeping sync's wake-up reads as the last kernel's time: the model then has the device
    # keep pace with the launches (busy ~99%), which no full launch queue shows
    report = short_kernels("block").explain()
    assert report.device.busy_share >= launch_bound.T.max_device_busy_share
    [chain] = chains_of(report, "launch-bound")
    assert report.chains[0] is chain
    assert chain.severity == "MEDIUM"
    assert any(e.startswith("the device may have kept pace: inferred busy 99.") for e in chain.effect)
    # spinning, the sync returns as the device ends: the kernels' 5 µs show, the device idles
    report = short_kernels("spin").explain()
    assert report.device.busy_share < launch_bound.T.max_device_busy_share
    [chain] = chains_of(report, "launch-bound")
    assert chain.severity == "HIGH"
    assert not any("kept pace" in e for e in chain.effect)


@pytest.mark.parametrize("cost_us, severity", [(9.0, "LOW"), (2.0, "HIGH")])
def test_launch_bound_only_while_traced_is_low(cost_us, severity):
    # 15.5 µs a launch, ~10 µs of device time per launch inferred (spinning syncs): with 9 µs of
    # each launch the tracer's own probes, untraced launches (6.5 µs) would outrun the kernels
    store = short_kernels("spin").store()
    store.update_session(SESSION, call_cost_ns=cost_us * 1000)
    report = explain(store.con, Options())
    [chain] = chains_of(report, "launch-bound")
    assert chain.severity == severity
    assert chain.numbers["trace_cost_per_call_ns"] == cost_us * 1000
    # (a launch every 15.5 µs, and each step's sync: ~0.1 µs more per launch)
    assert chain.numbers["untraced_period_ns"] == pytest.approx(15_500 - cost_us * 1000, abs=150)
    assert f"~{cost_us:.1f} µs is this trace's own probes" in chain.root[2]
    assert any("launch-bound only while traced" in line for line in chain.root) == (severity == "LOW")


def test_no_launch_bound_only_while_traced_without_evidence():
    # (reviewed) the point at the middle of its bounds says nothing of the kernels: 1 ms of
    # Python after the launches, the sync never waits
    tr = base().loop(0, 20, launches=400, launch_us=6, launch_gap_us=4, device_ms=2, cpu_ms=1, policy="spin")
    store = tr.store()
    store.update_session(SESSION, call_cost_ns=8000.0)
    [chain] = chains_of(explain(store.con, Options()), "launch-bound")
    assert chain.severity == "HIGH" and "untraced_period_ns" in chain.numbers
    assert not any("only while traced" in line for line in chain.root)
    # a cost above the launch interval: nothing to take out
    store = short_kernels("spin").store()
    store.update_session(SESSION, call_cost_ns=20_000.0)
    [chain] = chains_of(explain(store.con, Options()), "launch-bound")
    assert chain.severity == "HIGH" and "untraced_period_ns" not in chain.numbers
    # a trace under --overhead-budget: most launches never paid the probes
    store = short_kernels("spin").store()
    store.update_session(SESSION, call_cost_ns=9000.0)
    sample_store(store, 0.2)
    [chain] = chains_of(explain(store.con, Options()), "launch-bound")
    assert chain.severity != "LOW" and "untraced_period_ns" not in chain.numbers


def test_launches_held_by_a_full_queue_are_not_launch_bound():
    # 60 µs kernels behind a 32-deep queue: from the 33rd launch on each waits for a slot
    tr = base()
    t = T0 + 1000
    ends: list[int] = []
    while t < T0 + 3 * S:
        for i in range(400):
            slot = ends[i - 32] if i >= 32 else t
            dur = max(5 * US, slot - t + 5 * US)
            tr.ev(t, "cudaLaunchKernel", MAIN_PID, MAIN_TID, dur)
            t += dur
            ends.append(max(t, ends[-1] if ends else 0) + 60 * US)
            t += 5 * US
        tr.ev(t, "cudaStreamSync", MAIN_PID, MAIN_TID, ends[-1] - t + 3 * US)
        t = ends[-1] + 3 * US
        ends = []
    report = tr.explain()
    assert report.device.busy_share >= launch_bound.T.max_device_busy_share
    assert silent(report, "launch-bound")


def test_launch_rate_just_below_threshold():
    # 30 launches per 16 ms step = 1,900/s < 2,000/s
    tr = base().loop(0, 20, launches=30, launch_us=8, launch_gap_us=20, device_ms=1, cpu_ms=15)
    assert silent(tr.explain(), "launch-bound")


def test_gpu_bound_loop_is_not_launch_bound():
    # as many launches, but the loop waits for the GPU in its sync: device is the bottleneck
    tr = base().loop(0, 20, launches=400, launch_us=8, launch_gap_us=20, device_ms=40, cpu_ms=1)
    assert silent(tr.explain())
    assert launch_bound.T.max_sync_wait_share < 0.5


def test_sync_heavy_fires_counts_read_backs():
    tr = base().loop(0, 20, launches=40, syncs=20, small_d2h=20, device_ms=10)
    report = tr.explain()
    [chain] = chains_of(report, "sync-heavy")
    assert report.chains[0] is chain
    assert chain.severity == "HIGH"
    assert chain.numbers["syncs_per_launch"] == pytest.approx(0.5, abs=0.01)
    assert chain.numbers["small_d2h_copies"] > 0
    assert any(".item()" in f for f in chain.fix)
    assert silent(report, "launch-bound")
    assert silent(report, "cpu-contention")  # sleeping in syncs is not contention


def test_sync_per_launch_just_below_threshold():
    # 7 syncs per 40 launches = 0.175 < 0.2
    tr = base().loop(0, 20, launches=40, syncs=7, device_ms=10)
    assert 7 / 40 < sync_heavy.T.min_syncs_per_launch
    assert silent(tr.explain(), "sync-heavy")


def test_gpu_idle_needs_nvml_and_reports_it():
    tr = base().loop(0, 20)
    assert silent(tr.explain(), "gpu-idle")  # no NVML samples: silent
    for s in range(20):
        tr.gpu.append({"session_id": SESSION, "timestamp": T0 + s * S + S // 2, "gpu": 0,
                       "name": "A100", "util_pct": 20.0 if s >= 8 else 95.0})
    [chain] = chains_of(tr.explain(), "gpu-idle")
    assert chain.severity == "HIGH"  # 11 of 18 steady windows idle >= high_window_share
    assert chain.numbers["util_pct_idle_windows"] == pytest.approx(20.0)
    assert len(chain.evidence_windows) == 11  # windows 8-18 (the last active window is trimmed)


def test_straggler_names_the_slow_rank_and_why():
    tr = base().name(4300, "python3 (train.py rank1)", "python3", "torchrun train.py")
    tr.loop(0, 20).loop(0, 20, pid=4300, tid=4300, preempt_ms=60, preempt_by=0)
    [chain] = chains_of(tr.explain(), "straggler")
    assert chain.pids == [4300]
    assert chain.severity == "HIGH"
    assert chain.numbers["rate_ratio"] == pytest.approx(30.05 / 65.3, abs=0.03)
    assert any("waiting for a CPU" in r for r in chain.root)


def test_equal_ranks_are_not_stragglers():
    tr = base().loop(0, 20).loop(0, 20, pid=4300, tid=4300)
    assert silent(tr.explain(), "straggler")


def test_launch_bound_is_not_claimed_for_a_loop_waiting_for_a_cpu():
    # the same tiny-kernel loop, runnable but off CPU ~30% of the time (another process has
    # the core): a host that cannot launch fast enough is the premise, and this one waits
    # for a CPU instead; cpu-contention measures that on the same windows and ranks first
    tr = base().loop(0, 20, launches=400, launch_us=8, launch_gap_us=20, device_ms=2, cpu_ms=1,
                     preempt_ms=5, preempt_by=7000)
    report = tr.explain()
    assert silent(report, "launch-bound")
    assert report.chains[0].rule_id == "cpu-contention"


def _part_contended(contended_s: float) -> Trace:
    """The tiny-kernel loop, another process taking its core (~30% of the time) for the first
    ``contended_s`` of 20 s and never after."""
    lb = dict(launches=400, launch_us=8, launch_gap_us=20, device_ms=2, cpu_ms=1)
    return base().loop(0, contended_s, **lb, preempt_ms=5, preempt_by=7000).loop(contended_s, 20, **lb)


def test_a_loop_contended_part_of_the_time_is_launch_bound_in_the_rest():
    # 12 s of 20 contended: launch-bound in all 8 other windows, with contention named for the 11 s
    report = _part_contended(12).explain()
    [chain] = chains_of(report, "launch-bound")
    assert (len(chain.evidence_windows), chain.windows_total) == (8, 19)  # (19 whole windows in 20 s)
    assert chain.severity == "HIGH"
    [contention] = chains_of(report, "cpu-contention")
    assert contention.severity in ("HIGH", "MEDIUM")


def test_launch_bound_in_too_few_windows_beside_contention_is_not_claimed():
    # 16 of 20 contended: the 4 others are under a quarter of the trace; cpu-contention is the story
    report = _part_contended(16).explain()
    assert silent(report, "launch-bound")
    assert report.chains[0].rule_id == "cpu-contention"


def test_launch_bound_survives_light_load_on_the_host():
    # 1 ms of 13 preempted: under cpu-contention's 10% threshold, the loop still runs flat out
    tr = base().loop(0, 20, launches=400, launch_us=8, launch_gap_us=20, device_ms=2, cpu_ms=1,
                     preempt_ms=1, preempt_by=7000)
    report = tr.explain()
    [chain] = chains_of(report, "launch-bound")
    assert chain.numbers["busy_share"] >= launch_bound.T.min_busy_share
    assert report.chains[0].rule_id == "launch-bound"


def test_processes_doing_different_work_are_not_stragglers():
    # an inference process with 4 kernels per sync beside a 40-kernel training step
    tr = base().loop(0, 20).loop(0, 20, pid=4300, tid=4300, launches=4, device_ms=2, cpu_ms=20)
    assert silent(tr.explain(), "straggler")
