"""Node facts: cores, GPUs (NVML when present), kernel, and how far the clock can be trusted.

BPF timestamps are CLOCK_MONOTONIC; the tracer stores them as wall clock by
adding ``clock_offset_ns`` (realtime - monotonic, collect.decode).  Across
nodes the wall clocks agree only as well as their time sync does: the
kernel's own bound comes from adjtimex(2) (``maxerror``/``esterror`` in µs,
and TIME_ERROR / STA_UNSYNC when nothing disciplines the clock).  Which
daemon does it (chronyd, systemd-timesyncd, ntpd, ptp4l) is read from the
process list.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from ingero.collect.decode import monotonic_offset_ns

TIME_ERROR = 5  # adjtimex: the clock is not synchronised
STA_UNSYNC = 0x0040
SYNC_DAEMONS = {"chronyd": "chrony", "systemd-timesyn": "timesyncd", "ntpd": "ntpd", "ptp4l": "ptp",
                "phc2sys": "ptp", "openntpd": "ntpd"}


class _Timex(ctypes.Structure):
    # struct timex (linux/timex.h, x86-64 / aarch64 LP64 layout)
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_pad", ctypes.c_int * 11)]


@dataclass
class ClockState:
    offset_ns: int
    sync: str  # chrony | timesyncd | ntpd | ptp | none
    synced: bool
    max_error_us: int | None  # the kernel's bound on the clock's error; None: unknown
    est_error_us: int | None


def sync_daemon(proc: Path = Path("/proc")) -> str:
    """Which time-sync daemon runs here ('none' when none does)."""
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return "none"
    for p in entries:
        try:
            comm = (p / "comm").read_text().strip()
        except OSError:
            continue
        if comm in SYNC_DAEMONS:
            return SYNC_DAEMONS[comm]
    return "none"


def clock_state(daemon: str) -> ClockState:
    offset = monotonic_offset_ns()
    tx = _Timex()
    try:
        state = ctypes.CDLL(None, use_errno=True).adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return ClockState(offset, daemon, False, None, None)
    if state < 0:
        return ClockState(offset, daemon, False, None, None)
    synced = state != TIME_ERROR and not (tx.status & STA_UNSYNC)
    return ClockState(offset, daemon, synced, int(tx.maxerror), int(tx.esterror))


@dataclass
class NodeFacts:
    hostname: str
    kernel: str
    ncpu: int
    gpus: int
    gpu_names: list[str] = field(default_factory=list)
    nvml: str = ""  # why there are no GPU facts, when there are none


def node_facts() -> NodeFacts:
    from ingero.sample.gpu import GpuSampler

    gpu = GpuSampler()
    try:
        names = [name or "" for _, _, name in gpu._handles] if gpu.available else []
        note = gpu.note or ""
    finally:
        gpu.close()
    return NodeFacts(hostname=socket.gethostname(), kernel=os.uname().release, ncpu=os.cpu_count() or 1,
                     gpus=len(names), gpu_names=names, nvml=note)
