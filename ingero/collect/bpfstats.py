"""The kernel's run-time statistics of our BPF programs: what each costs whoever it runs on.

The kernel times every BPF program run (``run_time_ns``, ``run_cnt`` in the
program fd's /proc/self/fdinfo) only while statistics are on: two clock reads
per run, ~20-40 ns, so they are off by default.  The overhead budget turns
them on for the trace's life:

* through ``bpf(BPF_ENABLE_STATS)`` (Linux 5.8+): the kernel counts while the
  fd it returns is open, shared with any other holder and closed with the
  process, so nothing is left on should the tracer die and nothing another
  tool turned on is turned off;
* else through the ``kernel.bpf_stats_enabled`` sysctl, its old value
  written back at the end.

No bpftool: the fds are the loader's own (Program.program_fds).
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
_BPF_ENABLE_STATS = 32  # enum bpf_cmd
_BPF_STATS_RUN_TIME = 0  # enum bpf_stats_type
_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())


def read_fdinfo(text: str) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a program's fdinfo text ((0, 0) where the kernel has none)."""
    vals = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("run_time_ns", "run_cnt"):
            vals[key] = int(value.split()[0])
    return vals.get("run_time_ns", 0), vals.get("run_cnt", 0)


class RunStats:
    """Holds the kernel's BPF run-time statistics on; ``close`` gives them back as found."""

    def __init__(self, sysctl: Path = SYSCTL):
        self.sysctl = sysctl
        self.fd: int | None = None
        self.restore: str | None = None  # the sysctl's old value, where we wrote it
        self.how: str | None = None  # None: not on (why in self.error)
        self.error: str | None = None
        self._enable()

    def _enable(self) -> None:
        if _NR_BPF is not None:
            attr = (ctypes.c_uint32 * 4)(_BPF_STATS_RUN_TIME, 0, 0, 0)
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.syscall(_NR_BPF, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
            if fd >= 0:
                self.fd, self.how = fd, "BPF_ENABLE_STATS"
                return
            self.error = f"BPF_ENABLE_STATS: {os.strerror(ctypes.get_errno())}"
        try:
            old = self.sysctl.read_text().strip()
            if old != "1":
                self.sysctl.write_text("1\n")
                self.restore = old
            self.how = "kernel.bpf_stats_enabled"
        except OSError as exc:
            self.error = f"{self.error + '; ' if self.error else ''}{self.sysctl}: {exc.strerror}"

    @property
    def on(self) -> bool:
        return self.how is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.restore is not None:
            try:
                self.sysctl.write_text(self.restore + "\n")
            except OSError:
                pass  # (a sysctl we could write a moment ago: nothing to say at exit)
            self.restore = None
        self.how = None


def run_time_ns(fds: list[int]) -> tuple[int, int]:
    """Summed (run_time_ns, run_cnt) of these program fds of this process."""
    total_ns = total_n = 0
    for fd in fds:
        try:
            ns, n = read_fdinfo(Path(f"/proc/self/fdinfo/{fd}").read_text())
        except OSError:
            continue
        total_ns += ns
        total_n += n
    return total_ns, total_n
