"""Each traced process's cgroup CPU quota and throttling counters, once a second (table cgroup_cpu).

A job under a CPU limit (Kubernetes ``resources.limits.cpu``, ``docker run
--cpus``, systemd's CPUQuota) that needs more than the limit is throttled:
once its cgroup has used the period's quota, none of its threads runs until
the next period, whatever else the CPU does.  In the scheduler trace that
looks like a preemption (switched out while runnable) by whoever ran next,
or by nobody (the CPU idles).  The kernel's counters per cgroup tell the two
apart, so they are read beside the trace:

- v2: ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD": no limit) and ``cpu.stat``
  (``nr_periods``, ``nr_throttled``, ``throttled_usec``, ``usage_usec``);
- v1 (the ``cpu`` controller's hierarchy): ``cpu.cfs_quota_us`` (-1: no
  limit), ``cpu.cfs_period_us`` and ``cpu.stat`` (``nr_periods``,
  ``nr_throttled``, ``throttled_time`` in ns), and ``cpuacct.usage`` where
  cpuacct is mounted with cpu.

Which hierarchy holds a process's CPU limit: the v1 ``cpu`` controller's
line of /proc/PID/cgroup when that controller is mounted on v1, else the v2
line (``0::PATH``).  A limit on an ancestor throttles the process too (a
pod's limit above its container's, a systemd slice above a service), and
the kernel counts that throttling in the ancestor's cpu.stat: the process's
own cgroup is always read, and every ancestor that has a quota.

Counters are kept as read and as their increase since the previous reading
of the same cgroup (none on its first reading).  A process that left the
traced set, or left a cgroup (moved, or exiting: the kernel moves an exiting
task to the root cgroup), gets one more reading of the cgroups it left, so the
last partial second of its throttling there is stored too.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SYS_CGROUP = Path("/sys/fs/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")

# The 64-hex container id of docker, containerd, CRI-O and podman paths
# (/docker/<id>, docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope,
# libpod-<id>.scope, kubepods/.../pod<uid>/<id>): the last one in the path.
_CONTAINER_ID = re.compile(r"(?:^|[/\-])([0-9a-f]{64})(?:\.scope)?(?=/|$)")
# A Kubernetes pod's uid: kubepods/burstable/pod<uid> (cgroupfs driver) or
# kubepods-burstable-pod<uid with _ for ->.slice (systemd driver).
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")

# The counters of a reading that have an increase per interval: (column as read, column of the increase).
_COUNTERS = (("nr_periods", "periods_n"), ("nr_throttled", "throttled_n"),
             ("throttled_total_ns", "throttled_ns"), ("usage_total_ns", "usage_ns"))


@dataclass(frozen=True)
class Hierarchies:
    """Where the cgroup hierarchies that can hold a CPU limit are mounted.

    ``*_prefix``: the cgroup path the mount's root stands for (a container
    without its own cgroup namespace sees /proc/PID/cgroup paths from the
    host's root, but has only its own subtree mounted)."""

    v1_cpu: Path | None = None
    v1_prefix: str = "/"
    v2: Path | None = None
    v2_prefix: str = "/"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def hierarchies_from_mountinfo(text: str) -> Hierarchies:
    """The cpu controller's v1 mount and the v2 mount, from /proc/self/mountinfo's text."""
    v1 = v2 = None
    v1_prefix = v2_prefix = "/"
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        root, mount, fstype, options = _unescape(fields[3]), _unescape(fields[4]), rest[0], rest[2]
        if fstype == "cgroup" and v1 is None and "cpu" in options.split(","):
            v1, v1_prefix = Path(mount), root
        elif fstype == "cgroup2" and v2 is None:
            v2, v2_prefix = Path(mount), root
    return Hierarchies(v1, v1_prefix, v2, v2_prefix)


def hierarchies_under(root: Path) -> Hierarchies:
    """The usual layout under ``root`` (/sys/fs/cgroup, or a test's fake tree): v2 at ``root``
    itself when it is a v2 hierarchy, else at ``root``/unified (hybrid); v1's cpu controller in a
    directory named after its controllers (``cpu``, ``cpu,cpuacct``)."""
    v2 = root if (root / "cgroup.controllers").exists() else None
    if v2 is None and (root / "unified" / "cgroup.controllers").exists():
        v2 = root / "unified"
    v1 = None
    if v2 is not root:
        for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            if (root / name / "cpu.cfs_quota_us").exists():
                v1 = root / name
                break
    return Hierarchies(v1_cpu=v1, v2=v2)


def default_hierarchies(mountinfo: Path = MOUNTINFO) -> Hierarchies:
    try:
        found = hierarchies_from_mountinfo(mountinfo.read_text())
    except OSError:
        found = Hierarchies()
    return found if (found.v1_cpu or found.v2) else hierarchies_under(SYS_CGROUP)


def container_ids(path: str) -> tuple[str | None, str | None]:
    """(container id, pod uid) named in a cgroup path, each None when the path holds none."""
    ids = _CONTAINER_ID.findall(path)
    pod = _POD_UID.search(path)
    return (ids[-1] if ids else None), (pod.group(1).replace("_", "-") if pod else None)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _stat(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass(frozen=True)
class Level:
    """One cgroup that limits (or holds) a process: its path and where its files are."""

    version: int
    cgroup: str  # path in its hierarchy, as /proc/PID/cgroup shows it
    directory: Path
    mount: Path
    own: bool  # the process's own cgroup (False: an ancestor with a quota)


def read_limits(level: Level) -> dict | None:
    """The cgroup's quota and cpu.stat counters, or None when it is gone."""
    d = level.directory
    if level.version == 2:
        stat_text = _read(d / "cpu.stat")
        if stat_text is None:
            return None
        stat = _stat(stat_text)
        quota = period = None
        cpu_max = _read(d / "cpu.max")  # absent where the cpu controller is not enabled
        if cpu_max is not None:
            parts = cpu_max.split()
            if len(parts) == 2 and parts[1].isdigit():
                period = int(parts[1])
                quota = int(parts[0]) if parts[0].isdigit() else None
        usec = {k: stat.get(k) for k in ("throttled_usec", "usage_usec")}
        return {
            "quota_us": quota, "period_us": period,
            "nr_periods": stat.get("nr_periods"), "nr_throttled": stat.get("nr_throttled"),
            "throttled_total_ns": None if usec["throttled_usec"] is None else usec["throttled_usec"] * 1000,
            "usage_total_ns": None if usec["usage_usec"] is None else usec["usage_usec"] * 1000,
        }
    quota_text, period_text = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
    if quota_text is None:
        return None
    stat = _stat(_read(d / "cpu.stat"))
    usage = _read(d / "cpuacct.usage")  # only where cpuacct shares the hierarchy
    quota = int(quota_text) if quota_text.strip().lstrip("-").isdigit() else -1
    return {
        "quota_us": quota if quota > 0 else None,
        "period_us": int(period_text) if period_text and period_text.strip().isdigit() else None,
        "nr_periods": stat.get("nr_periods"), "nr_throttled": stat.get("nr_throttled"),
        "throttled_total_ns": stat.get("throttled_time"),
        "usage_total_ns": int(usage) if usage and usage.strip().isdigit() else None,
    }


def _relative(path: str, prefix: str) -> str | None:
    """``path`` below the mount's root, or None when it lies outside what is mounted."""
    if prefix in ("", "/"):
        return path
    if path == prefix:
        return "/"
    if path.startswith(prefix.rstrip("/") + "/"):
        return path[len(prefix.rstrip("/")):]
    return None


def levels_of(pid: int, hier: Hierarchies, proc: Path = PROC) -> list[Level]:
    """The process's own cgroup and every ancestor with a quota, in the hierarchy that holds
    its CPU controller; [] when the process is gone or its cgroup is not mounted here."""
    text = _read(proc / str(pid) / "cgroup")
    if text is None:
        return []
    v1_path = v2_path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    if v1_path is not None and hier.v1_cpu is not None:
        version, path, mount, prefix = 1, v1_path, hier.v1_cpu, hier.v1_prefix
    elif v2_path is not None and hier.v2 is not None:
        version, path, mount, prefix = 2, v2_path, hier.v2, hier.v2_prefix
    else:
        return []
    rel = _relative(path, prefix)
    if rel is None or "/../" in f"{rel}/" or rel.endswith(" (deleted)"):
        return []
    own = mount / rel.lstrip("/")
    if not own.is_dir():
        return []
    out = [Level(version, path, own, mount, True)]
    d, p = own, path
    while d != mount and d.parent != d:
        d, p = d.parent, (p.rsplit("/", 1)[0] or "/")
        if not str(d).startswith(str(mount)):
            break
        quota_file = d / ("cpu.max" if version == 2 else "cpu.cfs_quota_us")
        q = _read(quota_file)
        if q is not None and q.split() and q.split()[0].isdigit():  # 'max' and -1: no limit here
            out.append(Level(version, p, d, mount, False))
    return out


class CgroupSampler:
    """``sample(pids)`` once a second: cgroup_cpu rows (without session_id) for each traced process."""

    def __init__(self, hierarchies: Hierarchies | None = None, *, proc: Path = PROC, root: Path | None = None):
        if hierarchies is None:
            hierarchies = hierarchies_under(root) if root is not None else default_hierarchies()
        self.hier = hierarchies
        self.proc = proc
        self._last: dict[Path, tuple[int, dict]] = {}  # directory -> (timestamp, reading)
        self._levels: dict[int, list[Level]] = {}  # each pid's cgroups at its last reading

    def sample(self, pids) -> list[dict]:
        now = time.time_ns()
        fresh: dict[int, list[Level]] = {}
        for pid in sorted(pids):
            levels = levels_of(pid, self.hier, self.proc)
            if levels:
                fresh[pid] = levels
        # a process that left the traced set, or moved (an exiting task is moved to the root
        # cgroup before it is reaped): the cgroups it left once more, for its last partial second
        current = dict(fresh)
        for pid, levels in self._levels.items():
            now_in = {lv.directory for lv in fresh.get(pid, ())}
            left = [lv for lv in levels if lv.directory not in now_in]
            if left:
                current[pid] = fresh.get(pid, []) + left
        self._levels = fresh
        return self._rows(now, current)

    def finish(self) -> list[dict]:
        """The last reading of every cgroup seen (the trace ends): what the last second added."""
        rows = self._rows(time.time_ns(), self._levels)
        self._levels = {}
        return rows

    def _rows(self, now: int, current: dict[int, list[Level]]) -> list[dict]:
        readings: dict[Path, dict | None] = {}
        rows = []
        for pid, levels in current.items():
            for lv in levels:
                if lv.directory not in readings:
                    readings[lv.directory] = self._reading(now, lv)
                r = readings[lv.directory]
                if r is None:
                    continue
                container, pod = container_ids(lv.cgroup)
                rows.append({"timestamp": now, "pid": pid, "cgroup": lv.cgroup, "own": lv.own,
                             "cgroup_version": lv.version, "mount": str(lv.mount),
                             "container_id": container, "pod_uid": pod, **r})
        return rows

    def _reading(self, now: int, lv: Level) -> dict | None:
        """The reading with its increase since the previous reading of the same cgroup."""
        got = read_limits(lv)
        if got is None:
            self._last.pop(lv.directory, None)
            return None
        before = self._last.get(lv.directory)
        self._last[lv.directory] = (now, got)
        out = dict(got, interval_ns=None, **{inc: None for _, inc in _COUNTERS})
        if before is None:
            return out
        then, prev = before
        out["interval_ns"] = now - then
        for total, inc in _COUNTERS:
            if got[total] is not None and prev[total] is not None:
                # lower than before: the cgroup was made again since (its counters restart at 0)
                out[inc] = got[total] - prev[total] if got[total] >= prev[total] else got[total]
        return out
