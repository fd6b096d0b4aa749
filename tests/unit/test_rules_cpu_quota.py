"""cpu-quota: a loop throttled by its cgroup's CPU quota is named with the limit and its fix,
and cpu-contention keeps only the wait beyond it."""

from __future__ import annotations

import pytest

from analyze_helpers import MAIN_PID, S, Trace, chains_of, silent
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.rules import cpu_quota

STRESS = 7000
INNOCENT = 7100  # a process that only runs while the loop is throttled
POD = "1234abcd-5678-90ab-cdef-1234567890ab"
CID = "ab" * 32
POD_SLICE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice"


def throttled(*, preempt_by: int = 0, throttled_share: float = 0.9, **cgroup) -> Trace:
    """30 s of the loop, 40 ms of every ~45 ms step switched out while runnable (the CPU left idle,
    or given to ``preempt_by``), in a cgroup throttled ``throttled_share`` of every second."""
    tr = Trace().name(MAIN_PID, "python3 (serve.py)", "python3", "python3 serve.py --port 8000")
    tr.name(INNOCENT, "sshd", "sshd", "sshd: root")
    tr.loop(0, 30, preempt_ms=40, preempt_by=preempt_by)
    tr.cgroup(MAIN_PID, 0, 30, throttled_share=throttled_share, **cgroup)
    return tr.system(0, 30)


def test_the_quota_is_named_with_its_counters_and_the_limit_is_the_fix():
    report = throttled().explain()
    assert silent(report, "cpu-contention")
    [chain] = chains_of(report, "cpu-quota")
    assert chain.severity == "HIGH" and chain.pids == [MAIN_PID] and chain.culprits == []
    # 30 one-second readings, 10 periods each, every one throttled, 0.9 s a second
    assert chain.root[0] == ("cgroup CPU limit 0.2 CPU (20 ms per 100 ms, /job, cgroup v1): throttled 300 times "
                             "in 300 periods, 27.0 s throttled in 30.0 s (cpu.stat)")
    n = chain.numbers
    assert (n["throttled_n"], n["periods_n"], n["throttled_ns"]) == (300, 300, 27 * S)
    assert n["quota_cpus"] == 0.2 and n["quota_us"] == 20_000 and n["period_us"] == 100_000
    # the loop's wait is all the quota's, and all of it with the CPU left idle
    assert n["quota_wait_share"] == pytest.approx(40 / 45.3, abs=0.02)
    assert n["idle_wait_ns"] == n["quota_wait_ns"] and n["other_cpu_wait_ns"] == 0
    assert "runnable with the CPU left idle" in chain.root[1] and chain.root[1].endswith("no higher claim (0 ns)")
    # the 31 active windows (the last step ends past 30 s) less the first and last
    assert len(chain.evidence_windows) == 29
    # demand: 0.2 CPU used + 0.9 throttled per second = 1.1 CPU; + 20% = 1.32, rounded up to 1.4
    assert n["demand_cpus"] == pytest.approx(1.1) and n["suggested_cpus"] == 1.4
    assert chain.fix == ["echo 140000 > /sys/fs/cgroup/cpu/job/cpu.cfs_quota_us   "
                         "(1.4 CPU: the measured demand 1.1 CPU + 20%; -1 removes the limit)"]
    assert not any("taskset" in f or "renice" in f for f in chain.fix)


def test_processes_that_ran_while_the_loop_was_throttled_are_not_culprits():
    report = throttled(preempt_by=INNOCENT).explain()
    assert silent(report, "cpu-contention")
    [chain] = chains_of(report, "cpu-quota")
    n = chain.numbers
    assert n["idle_wait_ns"] == 0 and n["other_cpu_wait_ns"] == 0
    assert n["quota_wait_share"] == pytest.approx(40 / 45.3, abs=0.02)
    assert "no higher claim" in chain.root[1] and not any("sshd" in line for line in chain.root + chain.fix)


def test_the_same_wait_without_throttling_stays_contention():
    """The look-alike: a generous quota that never throttles; a CPU hog takes the loop's core."""
    tr = Trace().name(MAIN_PID, "python3 (serve.py)", "python3", "python3 serve.py")
    tr.name(STRESS, "stress", "stress", "stress --cpu 2")
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=STRESS).loop(20, 30)
    tr.competitor(STRESS, "stress", 10, 20, oncpu=0.9)
    tr.cgroup(MAIN_PID, 0, 30, quota_us=200_000, throttled_share=0.0).system(0, 30)
    store = tr.store()
    report = explain(store.con, Options())
    assert silent(report, "cpu-quota")
    [chain] = chains_of(report, "cpu-contention")
    assert chain.culprits[0].pid == STRESS and len(chain.evidence_windows) == 10
    # the quota was read: 2 CPUs, never throttled
    assert store.con.execute("SELECT quota_us, throttled_n, periods_n FROM ing_cgroup").fetchall() == [
        (200_000, 0, 300)]
    assert store.con.execute("SELECT count(*), sum(quota_wait_ns) FROM ing_win").fetchone() == (30, 0)


def test_idle_cpu_preemptions_without_throttling_are_not_the_quota():
    tr = throttled(throttled_share=0.0)
    report = tr.explain()
    assert silent(report, "cpu-quota")
    [chain] = chains_of(report, "cpu-contention")
    assert chain.severity == "HIGH"


def test_quota_and_a_hog_each_get_their_part():
    """Throttled 0.3 s a second while a hog preempts the loop: the quota's part is the throttled
    time, the rest is the hog's."""
    tr = throttled(preempt_by=STRESS, throttled_share=0.3)
    tr.name(STRESS, "stress", "stress", "stress --cpu 2").competitor(STRESS, "stress", 0, 30)
    report = tr.explain()
    [quota] = chains_of(report, "cpu-quota")
    [contention] = chains_of(report, "cpu-contention")
    assert quota.numbers["quota_wait_share"] == pytest.approx(0.3, abs=1e-6)
    assert contention.numbers["cpu_wait_share"] == pytest.approx(40 / 45.3 - 0.3, abs=0.02)
    assert contention.culprits[0].pid == STRESS
    assert any("for a CPU other processes held (cpu-contention's part)" in c for c in quota.contributing)


def test_a_pods_limit_above_the_container_binds_and_the_fix_is_the_pod_spec():
    tr = Trace().name(MAIN_PID, "python3 (serve.py)", "python3", "python3 serve.py")
    tr.loop(0, 30, preempt_ms=40)
    own = f"{POD_SLICE}/cri-containerd-{CID}.scope"
    common = {"version": 2, "mount": "/sys/fs/cgroup", "pod_uid": POD, "usage_share": 0.5}
    tr.cgroup(MAIN_PID, 0, 30, path=own, quota_us=None, container_id=CID, **common)
    tr.cgroup(MAIN_PID, 0, 30, path=POD_SLICE, own=False, quota_us=50_000, throttled_share=0.9, **common)
    [chain] = chains_of(tr.system(0, 30).explain(), "cpu-quota")
    assert chain.root[0].startswith(f"cgroup CPU limit 0.5 CPU (50 ms per 100 ms, {POD_SLICE}, pod {POD}, cgroup v2)")
    assert f"the limit is {POD_SLICE}'s, above the process's own cgroup {own}" in chain.contributing
    # demand 0.5 used + 0.9 throttled = 1.4 CPU; + 20% = 1.68: 1.7
    assert chain.fix == [
        f'resources.limits.cpu: "1700m"   in the container\'s spec (pod {POD}) (the measured demand 1.4 CPU + 20%)',
        f"echo '170000 100000' > /sys/fs/cgroup{POD_SLICE}/cpu.max   "
        "(1.7 CPU: the measured demand 1.4 CPU + 20%; 'max' removes the limit)",
    ]


def test_docker_and_systemd_limits_get_their_own_commands():
    [chain] = chains_of(throttled(path=f"/docker/{CID}", container_id=CID).explain(), "cpu-quota")
    assert chain.fix[0] == f"docker update --cpus 1.4 {CID[:12]}   (the measured demand 1.1 CPU + 20%)"
    [chain] = chains_of(throttled(path="/system.slice/infer.service", version=2, mount="/sys/fs/cgroup").explain(),
                        "cpu-quota")
    assert chain.fix[0] == "systemctl set-property infer.service CPUQuota=140%   (the measured demand 1.1 CPU + 20%)"
    assert chain.fix[1].startswith("echo '140000 100000' > /sys/fs/cgroup/system.slice/infer.service/cpu.max")


def test_without_the_cgroups_usage_the_demand_comes_from_process_cpu():
    tr = throttled(usage_share=None)
    tr.competitor(MAIN_PID, "python3", 0, 30, oncpu=0.1, took=0)  # process_cpu: 0.1 CPU
    [chain] = chains_of(tr.explain(), "cpu-quota")
    # 30 s of readings cover 3 s of the process' CPU (0.1 a second) and 27 s throttled: 1.0 CPU
    assert chain.numbers["demand_cpus"] == pytest.approx(1.0, abs=0.01)


def _throughout(preempt_ms: float) -> Trace:
    # host-bound steps (~5.3 ms of host work, 2 ms of GPU work), throttled in every window
    tr = Trace().name(MAIN_PID, "python3 (serve.py)", "python3", "python3 serve.py")
    tr.loop(0, 30, device_ms=2, preempt_ms=preempt_ms)
    return tr.cgroup(MAIN_PID, 0, 30, throttled_share=0.5).system(0, 30)


def test_just_below_threshold_is_silent():
    # 0.4 ms of 5.7 ms per step = 7% < min_wait_share (10%)
    report = _throughout(0.4).explain()
    assert silent(report, "cpu-quota", "cpu-contention")
    assert report.analysed.cuda_events > 0
    # 0.8 ms of 6.1 ms = 13%: above it, present throughout, under high_wait_share; no clean window,
    # but cpu.stat counted throttling in every period: the limit binds -> MEDIUM
    [chain] = chains_of(_throughout(0.8).explain(), "cpu-quota")
    assert chain.severity == "MEDIUM"
    assert cpu_quota.T.min_wait_share <= chain.numbers["quota_wait_share"] < cpu_quota.T.high_wait_share
    assert any(e.startswith("no clean window to compare with") for e in chain.effect), chain.effect


def test_a_limit_binding_all_run_long_at_a_varying_wait_is_named():
    """Throttled in every period, the loop waiting 5% of some windows and 16% of others: the quieter
    windows are throttled too, no baseline (as baseline.split's quietest quarter made them, finding
    an 11% drop under min_drop: a 0.3-CPU limit went unnamed on a new user's loop)."""
    tr = Trace().name(MAIN_PID, "python3 (serve.py)", "python3", "python3 serve.py")
    for k in range(6):
        tr.loop(5 * k, 5 * k + 5, device_ms=2, preempt_ms=0.3 if k % 2 else 1.0)
    report = tr.cgroup(MAIN_PID, 0, 30, throttled_share=0.3).system(0, 30).explain()
    [chain] = chains_of(report, "cpu-quota")
    # (window 0 holds the first reading, which has no interval: 14 of 15)
    assert chain.severity == "MEDIUM" and len(chain.evidence_windows) == 14
    assert any(e.startswith("no clean window to compare with") for e in chain.effect), chain.effect


def test_voluntary_sleeps_in_a_throttled_cgroup_are_not_the_quota():
    tr = Trace().name(MAIN_PID, "python3 (serve.py)", "python3", "python3 serve.py")
    tr.loop(0, 30, wait_ms=40).cgroup(MAIN_PID, 0, 30, throttled_share=0.9).system(0, 30)
    report = tr.explain()
    assert silent(report, "cpu-quota", "cpu-contention")


def test_throttled_only_in_the_middle_compares_with_clean_windows():
    tr = Trace().name(MAIN_PID, "python3 (serve.py)", "python3", "python3 serve.py")
    tr.loop(0, 10).loop(10, 20, preempt_ms=40).loop(20, 30)
    tr.cgroup(MAIN_PID, 0, 10).cgroup(MAIN_PID, 10, 20, throttled_share=0.9).cgroup(MAIN_PID, 20, 30)
    [chain] = chains_of(tr.system(0, 30).explain(), "cpu-quota")
    assert chain.severity == "HIGH" and len(chain.evidence_windows) == 10
    assert any(e.startswith("CUDA ops/s down") for e in chain.effect)
    assert chain.correlation is not None and chain.correlation < -0.9


def test_the_raw_events_give_the_same_chain():
    store = throttled(preempt_by=INNOCENT).store()
    a = chains_of(explain(store.con, Options()), "cpu-quota")[0]
    b = chains_of(explain(store.con, Options(), source="events"), "cpu-quota")[0]
    assert a.root == b.root and a.numbers["quota_wait_ns"] == pytest.approx(b.numbers["quota_wait_ns"], rel=1e-9)


def test_an_unprintable_cgroup_path_is_shown_safely():
    [chain] = chains_of(throttled(path="/job\x1b[31m\x07red").explain(), "cpu-quota")
    assert "/job?[31m?red" in chain.root[0] and "\x1b" not in "".join(chain.root + chain.fix)
    assert (cpu_quota.printable("/" + "x" * 300).count("…") == 1
            and "…" not in cpu_quota.printable("/" + "x" * 300, None))
