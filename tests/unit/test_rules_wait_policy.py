"""Rules under CUDA's wait policies: a spinning or yielding sync is on CPU the whole time.

cudaDeviceScheduleAuto, CUDA's default, spins while the process has no more
contexts than the host has CPUs: every ordinary one-GPU-per-process job.  The
sync is then one long call with no sleep in it, and under contention the
thread is preempted inside it, which delays the return only when the device
finished while it was off CPU.
"""

from __future__ import annotations

import pytest

from analyze_helpers import Trace, chains_of, silent, named_loop
from ingero.analyze.rules import cpu_contention, launch_bound


def base() -> Trace:
    return named_loop(20, "loop.py")


# A GPU-bound step: 8 launches, 8 ms of kernels, 1 ms of Python; the sync waits ~6.7 ms.
GPU_BOUND = dict(launches=8, launch_us=6, launch_gap_us=25, device_ms=8, cpu_ms=1)
# Issue 15's loop: a 200 KB copy, 8 launches and one sync per step, the sync more than
# half of the ~0.3 ms step: ~26k launches/s, the device busy almost all the time.
FAST_GPU_BOUND = dict(launches=8, launch_us=6, launch_gap_us=5, device_ms=0.28, cpu_ms=0.02,
                      copy_bytes=200_000)


@pytest.mark.parametrize("policy", ["block", "spin", "yield"])
def test_fast_gpu_bound_loop_is_not_launch_bound_under_any_policy(policy):
    report = base().loop(0, 20, policy=policy, **FAST_GPU_BOUND).explain()
    assert silent(report) or all(c.severity == "LOW" for c in report.chains), report.chains


@pytest.mark.parametrize("policy", ["block", "spin", "yield"])
def test_gpu_bound_loop_is_healthy_under_every_policy(policy):
    report = base().loop(0, 20, policy=policy, **GPU_BOUND).explain()
    assert [c.rule_id for c in report.chains if c.severity in ("HIGH", "MEDIUM")] == []


def test_spinning_sync_is_waiting_for_the_device_not_host_work():
    # the sync's call time is the wait, though the thread never sleeps in it
    report = base().loop(0, 20, policy="spin", **GPU_BOUND).explain()
    assert silent(report, "launch-bound")


def test_preemption_inside_a_spinning_sync_while_the_device_runs_costs_nothing():
    # 4 ms of each 6.7 ms sync preempted while the kernels still run: the sync would
    # have waited anyway, so it is no CPU wait of the loop's
    tr = base().loop(0, 20, policy="spin", sync_preempt_ms=4, preempt_by=7000, **GPU_BOUND)
    tr.competitor(7000, "stress", 0, 20)
    report = tr.explain()
    assert silent(report, "cpu-contention")
    assert silent(report, "launch-bound")


def test_preemption_that_delays_a_spinning_sync_is_contention():
    # clean for 6 s, then each sync returns late: preempted 3 ms at the end of the wait
    # (the device finished during it) plus 4 ms while the device still ran
    tr = base().loop(0, 6, policy="spin", **GPU_BOUND)
    tr.loop(6, 20, policy="spin", sync_preempt_ms=4, sync_late_ms=3, preempt_by=7000, **GPU_BOUND)
    tr.competitor(7000, "stress", 6, 20)
    report = tr.explain()
    [chain] = chains_of(report, "cpu-contention")
    assert report.chains[0].rule_id == "cpu-contention"
    assert silent(report, "launch-bound")
    # the device finished where the clean windows' syncs returned (6.75 ms into the sync), at
    # the start of the late interval: all 3 ms of it count, none of the 4 ms before
    step_ms = 1 + 8 * 0.031 + max(8 - 8 * 0.031 - 1, 4 + 1) + 3 + 0.005
    assert chain.numbers["cpu_wait_share"] == pytest.approx(3 / step_ms, abs=0.01)
    assert chain.numbers["cpu_wait_share"] >= cpu_contention.T.min_wait_share


def test_spinning_loop_waiting_for_a_cpu_is_not_launch_bound():
    # issue 15's second finding: tiny kernels, spinning syncs, and the loop runnable but
    # waiting for a CPU two thirds of the time: cpu-contention first, no launch-bound
    tr = base().loop(0, 20, policy="spin", launches=400, launch_us=8, launch_gap_us=20, device_ms=2,
                     cpu_ms=1, preempt_ms=20, preempt_by=7000)
    tr.competitor(7000, "stress", 0, 20)
    report = tr.explain()
    assert report.chains[0].rule_id == "cpu-contention"
    assert silent(report, "launch-bound")
    assert launch_bound.T.min_busy_share > 0.5


def test_chains_are_ranked_by_the_share_of_wall_clock_they_explain():
    tr = base().loop(0, 20, policy="spin", launches=400, launch_us=8, launch_gap_us=20, device_ms=2,
                     cpu_ms=1, preempt_ms=20, preempt_by=7000)
    tr.competitor(7000, "stress", 0, 20)
    report = tr.explain()
    shares = [c.share for c in report.chains]
    assert shares == sorted(shares, reverse=True)
    assert 0 < report.chains[0].share <= 1
