"""Issue 37's CPU-quota shape, live, under a real cgroup v1 quota.

An inference-like loop (tests/live/workloads/quota_loop.py: host work, an H2D
copy, kernels, a D2H copy that waits for them) on the simulated runtime runs
alone in a cgroup limited to 20 ms per 100 ms (a Kubernetes CPU limit of 0.2
CPU).  explain must name the quota (cpu-quota, with the counters the sampler
read from cpu.stat and the fix for the limit), never cpu-contention's
innocent bystanders.  The look-alikes: the same loop under a generous quota
that never throttles (no cpu-quota), and the same loop sharing its core with
a CPU hog without a quota (cpu-contention naming the hog, no cpu-quota).

Each cgroup gets the top cpu.shares: this box is shared (load ~30 on 2
cores), and at the default weight the loop's cgroup would compete with every
other session for the CPU and might never reach its quota; the tests are
about the quota, not the neighbours.  The cgroups are made under
/sys/fs/cgroup/cpu (these machines have v1 per controller) and removed after.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import prereqs
import workloads
from ingero.sample.cgroup import CgroupSampler

pytestmark = pytest.mark.live

V1_CPU = Path("/sys/fs/cgroup/cpu")
LOOP = workloads.HERE / "quota_loop.py"
DURATION_S = 8
MAX_SHARES = 262144


@contextlib.contextmanager
def v1_cgroup(quota_us: int, period_us: int = 100_000):
    """A fresh cgroup under the v1 cpu controller with that quota (-1: none); removed after."""
    if os.geteuid() != 0 or not (V1_CPU / "cpu.cfs_quota_us").exists():
        prereqs.missing("root and a cgroup v1 cpu controller at /sys/fs/cgroup/cpu",
                        "run as root on a host with the v1 cpu controller mounted")
    d = V1_CPU / f"ingero-test-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        (d / "cpu.shares").write_text(str(MAX_SHARES))
        (d / "cpu.cfs_period_us").write_text(str(period_us))
        (d / "cpu.cfs_quota_us").write_text(str(quota_us))
        yield d
    finally:
        for pid in (d / "cgroup.procs").read_text().split():  # a task left behind: back to the root
            with contextlib.suppress(OSError):
                (V1_CPU / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def cpu_stat(d: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (d / "cpu.stat").read_text().splitlines())}


def _trace(tmp: Path, simcuda: Path, cg: Path, *, policy: str = "spin", pin: str | None = None) -> tuple[dict, dict]:
    """The loop traced with `ingero trace --cmd`, joining ``cg`` before it starts; (summary, explain --json)."""
    db = tmp / "t.duckdb"
    summary = tmp / "summary.json"
    loop = shlex.join([sys.executable, str(LOOP), "--lib", str(simcuda), "--duration", str(DURATION_S),
                       "--summary-json", str(summary)])
    if pin is not None:
        loop = f"taskset -c {pin} {loop}"
    cmd = shlex.join(["sh", "-c", f"echo $$ > {cg / 'cgroup.procs'}; exec {loop}"])
    tracer = workloads.Tracer(db, "--cuda-lib", str(simcuda), "--cmd", cmd, env={"SIMCUDA_SCHEDULE": policy})
    tracer.wait_started()
    tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    out = subprocess.run([*workloads.INGERO, "explain", "--db", str(db), "--json", "--window", "1"],
                         capture_output=True, text=True, cwd=workloads.REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(summary.read_text()), json.loads(out.stdout)


def _stored(tmp: Path, pid: int, cgroup: str) -> list[tuple]:
    """The process's readings of that cgroup: (nr_throttled, throttled_total_ns, quota_us, period_us, version)."""
    return workloads.query(tmp / "t.duckdb", """
        SELECT nr_throttled, throttled_total_ns, quota_us, period_us, cgroup_version FROM cgroup_cpu
        WHERE pid = $pid AND cgroup = $cg AND own ORDER BY timestamp""", {"pid": pid, "cg": cgroup})


@pytest.mark.parametrize("policy", ["spin", "block"])
def test_a_loop_throttled_by_its_quota_is_named_with_the_limit(tmp_path, simcuda, monkeypatch, policy):
    monkeypatch.setattr(workloads, "START_TIMEOUT_S", 400)  # a BPF compile at a load of 30
    with v1_cgroup(20_000) as cg:
        summary, report = _trace(tmp_path, simcuda, cg, policy=policy)
        final = cpu_stat(cg)
    name = "/" + cg.name
    rules = [c["rule_id"] for c in report["chains"]]
    [chain] = [c for c in report["chains"] if c["rule_id"] == "cpu-quota"]
    assert chain["severity"] == "HIGH" and chain["pids"] == [summary["pid"]]
    assert rules[0] == "cpu-quota", rules  # it explains most of the wall clock
    assert "cpu-contention" not in rules, report["chains"]
    # the numbers are cpu.stat's: the increase from the first reading of the cgroup to the last,
    # and the last (after the loop exited) is what the kernel says now
    rows = _stored(tmp_path, summary["pid"], name)
    assert rows and all(r[2:] == (20_000, 100_000, 1) for r in rows)
    first, last = rows[0], rows[-1]
    assert (last[0], last[1]) == (final["nr_throttled"], final["throttled_time"])
    n = chain["numbers"]
    assert (n["throttled_n"], n["throttled_ns"]) == (last[0] - first[0], last[1] - first[1])
    assert n["throttled_n"] > 0 and n["quota_us"] == 20_000 and n["period_us"] == 100_000
    assert chain["root"][0].startswith(f"cgroup CPU limit 0.2 CPU (20 ms per 100 ms, {name}, cgroup v1): "
                                       f"throttled {n['throttled_n']:,} times in ")
    # the fix is the limit, sized from the measured demand; nobody is reniced or moved
    assert n["suggested_cpus"] > 0.2 and n["suggested_cpus"] >= n["demand_cpus"]
    assert chain["fix"][0].startswith(f"echo {round(n['suggested_cpus'] * 100_000)} > {V1_CPU}{name}/cpu.cfs_quota_us")
    assert not any("taskset" in f or "renice" in f for f in chain["fix"])
    assert chain["culprits"] == []


def test_a_generous_quota_that_never_throttles_is_not_named(tmp_path, simcuda, monkeypatch):
    monkeypatch.setattr(workloads, "START_TIMEOUT_S", 400)
    with v1_cgroup(200_000) as cg:  # 2 CPUs: the single-threaded loop never spends it
        summary, report = _trace(tmp_path, simcuda, cg)
        final = cpu_stat(cg)
    assert final["nr_throttled"] == 0 and summary["requests"] > 100
    assert "cpu-quota" not in [c["rule_id"] for c in report["chains"]], report["chains"]
    # analysed: the loop's calls, and the cgroup's readings (its limit, no throttling)
    assert report["analysed"]["cuda_events"] > 0
    rows = _stored(tmp_path, summary["pid"], "/" + cg.name)
    assert len(rows) >= 2 and {r[0] for r in rows} == {0} and rows[-1][2:] == (200_000, 100_000, 1)


def test_a_cpu_hog_on_the_loops_core_is_contention_not_the_quota(tmp_path, simcuda, monkeypatch):
    monkeypatch.setattr(workloads, "START_TIMEOUT_S", 400)
    spin = workloads.build("spin", tmp_path)
    with v1_cgroup(-1) as cg:  # no quota: the hog and the loop share core 0 inside it
        hog = subprocess.Popen(["taskset", "-c", "0", str(spin), "600", "ingero-qhog"], stdout=subprocess.DEVNULL)
        try:
            (cg / "cgroup.procs").write_text(str(hog.pid))
            summary, report = _trace(tmp_path, simcuda, cg, pin="0")
        finally:
            hog.kill()
            hog.wait()
        final = cpu_stat(cg)
    assert final["nr_throttled"] == 0
    rules = [c["rule_id"] for c in report["chains"]]
    assert "cpu-quota" not in rules, report["chains"]
    [chain] = [c for c in report["chains"] if c["rule_id"] == "cpu-contention"]
    assert chain["pids"] == [summary["pid"]]
    # named (a neighbour of this shared box on core 0 may take more of the loop's CPU than the
    # hog, rightly named too: the order is not the hog's to decide)
    assert hog.pid in [c["pid"] for c in chain["culprits"]], chain["culprits"]
    assert f"(PID {hog.pid})" in next(line for line in chain["root"] if line.startswith("CPU taken by"))
    rows = _stored(tmp_path, summary["pid"], "/" + cg.name)
    assert len(rows) >= 2 and {r[2] for r in rows} == {None}  # read: no limit


@pytest.mark.exact
def test_the_sampler_reads_a_real_v1_quota_exactly(tmp_path):
    """No tracer: a busy process in a 0.2-CPU cgroup, read before, during and after it exits."""
    with v1_cgroup(20_000) as cg:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            (cg / "cgroup.procs").write_text(str(busy.pid))
            sampler = CgroupSampler()
            [first] = sampler.sample({busy.pid})
            time.sleep(1.5)
            [during] = sampler.sample({busy.pid})
        finally:
            busy.kill()
            busy.wait()
        [last] = sampler.sample(set())  # gone from the traced set: its cgroup once more
        final = cpu_stat(cg)
        assert sampler.sample(set()) == []
    assert ((first["cgroup"], first["cgroup_version"], first["own"], first["mount"])
            == ("/" + cg.name, 1, True, str(V1_CPU)))
    assert (first["quota_us"], first["period_us"]) == (20_000, 100_000)
    assert during["throttled_n"] > 0 and during["throttled_ns"] > 0
    assert (last["nr_throttled"], last["throttled_total_ns"]) == (final["nr_throttled"], final["throttled_time"])
    # the amounts add up to the counters' increase
    assert during["throttled_n"] + last["throttled_n"] == last["nr_throttled"] - first["nr_throttled"]
    assert during["throttled_ns"] + last["throttled_ns"] == last["throttled_total_ns"] - first["throttled_total_ns"]
