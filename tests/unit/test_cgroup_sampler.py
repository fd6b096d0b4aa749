"""The cgroup CPU sampler on fake cgroup trees (v2 and v1) and fake /proc entries."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ingero.sample import cgroup as cg
from ingero.sample.hook import SamplerHook
from ingero.store.db import Store

CID = "3f" * 32  # a 64-hex container id
POD = "1234abcd-5678-90ab-cdef-1234567890ab"
K8S_POD = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice"
K8S = f"{K8S_POD}/cri-containerd-{CID}.scope"


def _write(d: Path, **files: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("__", ".")).write_text(text)


def _proc(tmp: Path, pid: int, text: str) -> Path:
    proc = tmp / "proc"
    _write(proc / str(pid), cgroup=text)
    return proc


def _v2_stat(periods: int, throttled: int, throttled_us: int, usage_us: int) -> str:
    return (f"usage_usec {usage_us}\nuser_usec {usage_us // 2}\nsystem_usec {usage_us // 2}\n"
            f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_usec {throttled_us}\n"
            "nr_bursts 0\nburst_usec 0\n")


def _v2_tree(tmp: Path) -> Path:
    """A v2 host with a Kubernetes pod: the pod's slice limited to 0.5 CPU, its container to 0.2."""
    root = tmp / "cg"
    _write(root, cgroup__controllers="cpuset cpu io memory pids\n", cpu__stat=_v2_stat(0, 0, 0, 9_000_000))
    _write(root / "kubepods.slice", cpu__max="max 100000\n", cpu__stat=_v2_stat(0, 0, 0, 1))
    _write(root / "kubepods.slice" / "kubepods-burstable.slice", cpu__max="max 100000\n",
           cpu__stat=_v2_stat(0, 0, 0, 1))
    _write(root / K8S_POD.lstrip("/"), cpu__max="50000 100000\n", cpu__stat=_v2_stat(40, 3, 70_000, 4_000_000))
    _write(root / K8S.lstrip("/"), cpu__max="20000 100000\n", cpu__stat=_v2_stat(40, 30, 2_500_000, 3_000_000))
    return root


def test_v2_reads_the_own_cgroup_and_each_ancestor_with_a_quota(tmp_path):
    root = _v2_tree(tmp_path)
    proc = _proc(tmp_path, 4242, f"0::{K8S}\n")
    s = cg.CgroupSampler(root=root, proc=proc)
    assert s.hier.v2 == root and s.hier.v1_cpu is None
    first = s.sample({4242})
    assert [(r["cgroup"], r["own"], r["quota_us"], r["period_us"]) for r in first] == [
        (K8S, True, 20000, 100000), (K8S_POD, False, 50000, 100000)]  # the unlimited slices are not rows
    own = first[0]
    assert own["cgroup_version"] == 2 and own["mount"] == str(root)
    assert own["container_id"] == CID and own["pod_uid"] == POD
    assert first[1]["container_id"] is None and first[1]["pod_uid"] == POD
    assert (own["nr_periods"], own["nr_throttled"], own["throttled_total_ns"], own["usage_total_ns"]) == (
        40, 30, 2_500_000_000, 3_000_000_000)
    # the first reading of a cgroup has no interval: no amounts
    assert own["interval_ns"] is None and own["throttled_n"] is None and own["throttled_ns"] is None
    _write(root / K8S.lstrip("/"), cpu__stat=_v2_stat(50, 38, 3_300_000, 3_200_000))
    second = s.sample({4242})
    own2 = second[0]
    assert own2["interval_ns"] == own2["timestamp"] - own["timestamp"] and own2["interval_ns"] > 0
    assert (own2["periods_n"], own2["throttled_n"], own2["throttled_ns"], own2["usage_ns"]) == (
        10, 8, 800_000_000, 200_000_000)
    assert (second[1]["periods_n"], second[1]["throttled_n"]) == (0, 0)  # the pod's counters did not move


def test_v1_per_controller_beside_an_empty_v2_tree(tmp_path):
    """These machines: v1 controllers under /sys/fs/cgroup, v2 mounted empty at unified."""
    root = tmp_path / "cg"
    _write(root / "unified", cgroup__controllers="")
    cpu = root / "cpu,cpuacct"
    _write(cpu, cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n",
           cpu__stat="nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    _write(cpu / "docker", cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n",
           cpu__stat="nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    _write(cpu / "docker" / CID, cpu__cfs_quota_us="150000\n", cpu__cfs_period_us="100000\n",
           cpu__stat="nr_periods 12\nnr_throttled 5\nthrottled_time 123456789\nnr_bursts 0\nburst_time 0\n",
           cpuacct__usage="5000000000\n")
    proc = _proc(tmp_path, 77, f"12:pids:/docker/{CID}\n4:cpu,cpuacct:/docker/{CID}\n3:cpuset:/\n0::/\n")
    s = cg.CgroupSampler(root=root, proc=proc)
    assert s.hier.v1_cpu == cpu and s.hier.v2 == root / "unified"
    [row] = s.sample({77})
    assert (row["cgroup"], row["cgroup_version"], row["own"], row["mount"]) == (f"/docker/{CID}", 1, True, str(cpu))
    assert (row["quota_us"], row["period_us"], row["nr_periods"], row["nr_throttled"]) == (150000, 100000, 12, 5)
    assert row["throttled_total_ns"] == 123456789 and row["usage_total_ns"] == 5_000_000_000
    assert row["container_id"] == CID and row["pod_uid"] is None
    # throttled_time is in ns (v2's throttled_usec in µs)
    _write(cpu / "docker" / CID, cpu__stat="nr_periods 22\nnr_throttled 11\nthrottled_time 523456789\n",
           cpuacct__usage="5100000000\n")
    [row] = s.sample({77})
    assert ((row["periods_n"], row["throttled_n"], row["throttled_ns"], row["usage_ns"])
            == (10, 6, 400_000_000, 100_000_000))


def test_no_limit_is_one_row_with_quota_null(tmp_path):
    root = tmp_path / "cg"
    cpu = root / "cpu"
    _write(cpu, cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n",
           cpu__stat="nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    _write(cpu / "user.slice", cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n",
           cpu__stat="nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    proc = _proc(tmp_path, 5, "1:cpu:/user.slice\n0::/user.slice\n")
    [row] = cg.CgroupSampler(root=root, proc=proc).sample({5})
    assert ((row["cgroup"], row["quota_us"], row["period_us"], row["usage_total_ns"])
            == ("/user.slice", None, 100000, None))
    # v2 "max": no limit either; a cgroup without the cpu controller (no cpu.max) has no period
    root2 = tmp_path / "cg2"
    _write(root2, cgroup__controllers="cpu\n")
    _write(root2 / "a", cpu__max="max 100000\n", cpu__stat=_v2_stat(0, 0, 0, 5))
    _write(root2 / "b", cpu__stat="usage_usec 7\nuser_usec 7\nsystem_usec 0\n")
    proc2 = tmp_path / "proc2"
    _write(proc2 / "6", cgroup="0::/a\n")
    _write(proc2 / "7", cgroup="0::/b\n")
    rows = cg.CgroupSampler(root=root2, proc=proc2).sample({6, 7})
    assert [(r["pid"], r["quota_us"], r["period_us"], r["nr_throttled"], r["usage_total_ns"]) for r in rows] == [
        (6, None, 100000, 0, 5000), (7, None, None, None, 7000)]


def test_a_process_that_exits_gets_its_cgroups_read_once_more(tmp_path):
    root = _v2_tree(tmp_path)
    proc = _proc(tmp_path, 4242, f"0::{K8S}\n")
    s = cg.CgroupSampler(root=root, proc=proc)
    s.sample({4242})
    (proc / "4242" / "cgroup").unlink()  # gone: /proc/PID no longer tells its cgroup
    _write(root / K8S.lstrip("/"), cpu__stat=_v2_stat(43, 33, 2_800_000, 3_100_000))
    last = s.sample(set())  # the tracer dropped it from its targets
    assert [(r["pid"], r["cgroup"], r["throttled_n"]) for r in last] == [(4242, K8S, 3), (4242, K8S_POD, 0)]
    assert s.sample(set()) == []
    assert s.finish() == []


def test_finish_reads_every_cgroup_seen_once_more(tmp_path):
    root = _v2_tree(tmp_path)
    s = cg.CgroupSampler(root=root, proc=_proc(tmp_path, 4242, f"0::{K8S}\n"))
    s.sample({4242})
    _write(root / K8S.lstrip("/"), cpu__stat=_v2_stat(41, 31, 2_600_000, 3_000_500))
    rows = s.finish()
    assert ([(r["cgroup"], r["throttled_n"], r["throttled_ns"]) for r in rows]
            == [(K8S, 1, 100_000_000), (K8S_POD, 0, 0)])


def test_counters_of_a_cgroup_made_again_restart(tmp_path):
    root = _v2_tree(tmp_path)
    s = cg.CgroupSampler(root=root, proc=_proc(tmp_path, 4242, f"0::{K8S}\n"))
    s.sample({4242})
    _write(root / K8S.lstrip("/"), cpu__stat=_v2_stat(4, 2, 90_000, 50_000))  # lower: the cgroup is new
    own = s.sample({4242})[0]
    assert (own["periods_n"], own["throttled_n"], own["throttled_ns"]) == (4, 2, 90_000_000)


def test_a_cgroup_outside_the_mounted_subtree_or_gone_is_skipped(tmp_path):
    root = _v2_tree(tmp_path)
    proc = _proc(tmp_path, 1, "0::/../../elsewhere\n")
    _write(proc / "2", cgroup="0::/no/such/cgroup\n")
    _write(proc / "3", cgroup="garbage\n")
    assert cg.CgroupSampler(root=root, proc=proc).sample({1, 2, 3, 4}) == []


def test_mountinfo_finds_the_cpu_controller_and_v2(tmp_path):
    text = (
        "25 30 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
        "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - "
        "cgroup2 cgroup2 rw,nsdelegate\n"
        "31 25 0:28 / /sys/fs/cgroup/cpuset rw shared:15 - cgroup cgroup rw,cpuset\n"
        "30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct\n"
    )
    h = cg.hierarchies_from_mountinfo(text)
    assert h == cg.Hierarchies(Path("/sys/fs/cgroup/cpu,cpuacct"), "/", Path("/sys/fs/cgroup/unified"), "/")
    # a container without its own cgroup namespace: its subtree mounted, paths from the host's root
    inside = "40 35 0:27 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    h = cg.hierarchies_from_mountinfo(inside)
    assert (h.v1_cpu, h.v1_prefix, h.v2) == (Path("/sys/fs/cgroup/cpu"), "/docker/abc", None)
    # mountinfo's octal escapes
    h = cg.hierarchies_from_mountinfo("1 0 0:1 / /mnt/cg\\040two rw - cgroup2 none rw\n")
    assert h.v2 == Path("/mnt/cg two")


def test_the_mount_root_prefix_maps_host_paths_to_the_mounted_subtree(tmp_path):
    mount = tmp_path / "cpu"
    _write(mount, cpu__cfs_quota_us="50000\n", cpu__cfs_period_us="100000\n",
           cpu__stat="nr_periods 3\nnr_throttled 1\nthrottled_time 5\n")
    _write(mount / "worker", cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n",
           cpu__stat="nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    proc = _proc(tmp_path, 9, "5:cpu:/docker/abc/worker\n")
    hier = cg.Hierarchies(v1_cpu=mount, v1_prefix="/docker/abc")
    rows = cg.CgroupSampler(hier, proc=proc).sample({9})
    # the mount's root is the container's own cgroup (/docker/abc): its quota is the one that binds
    assert [(r["cgroup"], r["own"], r["quota_us"]) for r in rows] == [
        ("/docker/abc/worker", True, None), ("/docker/abc", False, 50000)]


def test_container_and_pod_ids_in_paths():
    assert cg.container_ids(f"/system.slice/docker-{CID}.scope") == (CID, None)
    assert cg.container_ids(f"/docker/{CID}") == (CID, None)
    assert cg.container_ids(f"/kubepods/burstable/pod{POD}/{CID}") == (CID, POD)
    assert cg.container_ids(K8S) == (CID, POD)
    assert cg.container_ids(f"/machine.slice/libpod-{CID}.scope/container") == (CID, None)
    assert cg.container_ids("/user.slice/user-0.slice/session-3.scope") == (None, None)
    assert cg.container_ids("/" + "a" * 63) == (None, None)  # not 64 hex


def test_the_hook_stores_the_rows_in_the_second_and_at_the_end(tmp_path):
    root = _v2_tree(tmp_path)
    store = Store.memory()
    sess = SimpleNamespace(store=store, session_id=3, traced={4242})
    hook = SamplerHook()
    hook.cgroup = cg.CgroupSampler(root=root, proc=_proc(tmp_path, 4242, f"0::{K8S}\n"))
    with store.transaction():
        hook.write_second(sess)
    _write(root / K8S.lstrip("/"), cpu__stat=_v2_stat(45, 35, 3_000_000, 3_500_000))
    hook.on_end(sess)
    rows = store.con.execute("SELECT session_id, pid, cgroup, own, quota_us, throttled_n, throttled_ns, nr_throttled "
                             "FROM cgroup_cpu ORDER BY timestamp, own DESC").fetchall()
    assert rows == [(3, 4242, K8S, True, 20000, None, None, 30), (3, 4242, K8S_POD, False, 50000, None, None, 3),
                    (3, 4242, K8S, True, 20000, 5, 500_000_000, 35), (3, 4242, K8S_POD, False, 50000, 0, 0, 3)]


def test_a_process_that_moves_gets_the_cgroup_it_left_read_once_more(tmp_path):
    """An exiting task is moved to the root cgroup before it is reaped: its old cgroup's last
    second still counts."""
    root = _v2_tree(tmp_path)
    proc = _proc(tmp_path, 4242, f"0::{K8S}\n")
    s = cg.CgroupSampler(root=root, proc=proc)
    s.sample({4242})
    (proc / "4242" / "cgroup").write_text("0::/\n")
    _write(root / K8S.lstrip("/"), cpu__stat=_v2_stat(42, 32, 2_700_000, 3_100_000))
    rows = s.sample({4242})
    assert [(r["cgroup"], r["own"], r["throttled_n"]) for r in rows] == [
        ("/", True, None), (K8S, True, 2), (K8S_POD, False, 0)]
    assert [r["cgroup"] for r in s.sample({4242})] == ["/"]
