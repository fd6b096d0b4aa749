"""Resident memory of the largest processes, once a second (table process_memory).

Memory pressure hurts a training job through faults and reclaim, but the
process holding the memory is usually another one: naming it needs a
per-process view.  Reading /proc/PID/statm of ~300 processes costs a few
milliseconds; VmSwap (from /proc/PID/status) is read only for the rows kept.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ingero.collect.procnames import read_proc_file

PROC = Path("/proc")
TOP_N = 10  # the largest processes kept per sample: enough to name a hog, cheap to store
PAGE = os.sysconf("SC_PAGE_SIZE")


def _swap_bytes(base: Path) -> int | None:
    raw = read_proc_file(base / "status")
    if raw is None:
        return None
    for line in raw.splitlines():
        if line.startswith(b"VmSwap:"):
            return int(line.split()[1]) * 1024
    return None


def sample(extra_pids: set[int] | frozenset[int] = frozenset(), *, top_n: int = TOP_N,
           proc: Path = PROC) -> list[dict]:
    """Rows (timestamp, pid, comm, rss_bytes, swap_bytes) for the top_n largest processes plus extra_pids."""
    now = time.time_ns()
    sizes: list[tuple[int, int]] = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        raw = read_proc_file(proc / name / "statm")
        if not raw:
            continue
        parts = raw.split()
        if len(parts) > 1 and parts[1] != b"0":  # kernel threads have no resident pages
            sizes.append((int(parts[1]) * PAGE, int(name)))
    sizes.sort(reverse=True)
    keep = {pid: rss for rss, pid in sizes[:top_n]}
    for rss, pid in sizes:
        if pid in extra_pids:
            keep[pid] = rss
    rows = []
    for pid, rss in keep.items():
        base = proc / str(pid)
        comm = (read_proc_file(base / "comm") or b"?").decode("utf-8", "replace").strip()
        rows.append({"timestamp": now, "pid": pid, "comm": comm, "rss_bytes": rss, "swap_bytes": _swap_bytes(base)})
    return rows
