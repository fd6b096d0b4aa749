"""Host-wide system metrics, one ``system_metrics`` row per call (psutil + /proc/vmstat).

Counters the kernel keeps since boot (CPU times, swap traffic, major faults,
context switches) are turned into amounts for the interval since the
previous call.  The constructor takes the first reading, so the first
``sample()`` already covers a real interval (construction -> first call).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

VMSTAT = Path("/proc/vmstat")

# psutil's Linux cpu_times include guest time inside user/nice already;
# counting it again would inflate the total (psutil's own cpu_percent skips it too).
_DOUBLE_COUNTED = ("guest", "guest_nice")


@dataclass
class _Counters:
    per_cpu: list  # psutil scputimes per CPU
    swap_used_bytes: int
    swap_in_bytes: int
    swap_out_bytes: int
    major_faults: int | None
    ctx_switches: int


def _total(t) -> float:
    return sum(getattr(t, f) for f in t._fields if f not in _DOUBLE_COUNTED)


def _pgmajfault(vmstat: Path) -> int | None:
    try:
        with open(vmstat, "rb") as f:
            for line in f:
                if line.startswith(b"pgmajfault "):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _delta(now: int | None, before: int | None) -> int | None:
    if now is None or before is None:
        return None
    return max(0, now - before)  # a counter reset (e.g. swapoff) is not negative traffic


class SystemSampler:
    def __init__(self, vmstat: Path = VMSTAT):
        self._vmstat = vmstat
        self._ncpu = psutil.cpu_count() or os.cpu_count() or 1
        self._last = self._read()

    def _read(self) -> _Counters:
        swap = psutil.swap_memory()
        return _Counters(
            per_cpu=psutil.cpu_times(percpu=True),
            swap_used_bytes=swap.used,
            swap_in_bytes=swap.sin,
            swap_out_bytes=swap.sout,
            major_faults=_pgmajfault(self._vmstat),
            ctx_switches=psutil.cpu_stats().ctx_switches,
        )

    def sample(self) -> dict:
        now = self._read()
        before, self._last = self._last, now
        per_core, busy_sum, iowait_sum, total_sum = [], 0.0, 0.0, 0.0
        for t_now, t_before in zip(now.per_cpu, before.per_cpu):
            total = _total(t_now) - _total(t_before)
            idle = t_now.idle - t_before.idle
            iowait = getattr(t_now, "iowait", 0.0) - getattr(t_before, "iowait", 0.0)
            busy = max(0.0, total - idle - iowait)  # iowait is idle time with I/O pending
            per_core.append(round(100.0 * busy / total, 2) if total > 0 else 0.0)
            busy_sum += busy
            iowait_sum += max(0.0, iowait)
            total_sum += max(0.0, total)
        mem = psutil.virtual_memory()
        return {
            "timestamp": time.time_ns(),
            "cpu_pct": round(100.0 * busy_sum / total_sum, 2) if total_sum > 0 else 0.0,
            "cpu_per_core_pct": per_core,
            "iowait_pct": round(100.0 * iowait_sum / total_sum, 2) if total_sum > 0 else 0.0,
            "mem_pct": mem.percent,
            "mem_used_bytes": mem.total - mem.available,  # what is really taken, as mem_pct counts it
            "mem_total_bytes": mem.total,
            "swap_used_bytes": now.swap_used_bytes,
            "swap_in_bytes": _delta(now.swap_in_bytes, before.swap_in_bytes),
            "swap_out_bytes": _delta(now.swap_out_bytes, before.swap_out_bytes),
            "major_faults": _delta(now.major_faults, before.major_faults),
            "ctx_switches": _delta(now.ctx_switches, before.ctx_switches),
            "load1": os.getloadavg()[0],
            "ncpu": self._ncpu,
        }
