"""What the fd a blocked thread waited on was: ``/proc/PID/fd/N``'s link, read at flush time.

A switch row holds the fd of the call its thread blocked in (decode.wait_fds);
what that fd is -- ``socket:[inode]``, ``pipe:[inode]``, a file's path,
``anon_inode:[eventfd]`` -- tells a request socket from a worker's pipe from
a checkpoint file.  It is read once per (pid, fd) per flush, a second or so
after the wait: an fd closed and reused meanwhile reads as its new target, one
closed for good (or a process gone) as NULL.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

MAX_TARGET = 256  # characters kept of a path


def _readlink(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")[:MAX_TARGET]
    except OSError:
        return None


def resolve(pids: np.ndarray, fds: np.ndarray) -> pa.Array | None:
    """events.fd_target per record: the link of (pid, fd) where fd >= 0, else NULL; None when no fd."""
    has = fds >= 0
    if not has.any():
        return None
    idx = np.flatnonzero(has)
    pairs = np.unique(np.stack([pids[idx].astype(np.int64), fds[idx].astype(np.int64)]), axis=1)
    found = {(int(p), int(f)): _readlink(int(p), int(f)) for p, f in pairs.T}
    out: list[str | None] = [None] * len(fds)
    for i in idx.tolist():
        out[i] = found[(int(pids[i]), int(fds[i]))]
    return pa.array(out, type=pa.string())
