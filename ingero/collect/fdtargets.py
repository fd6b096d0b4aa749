"""What a blocked thread waited on, read from /proc at flush time: its fd's link, its name.

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


def _comm(pid: int, tid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
            return f.read(64).decode(errors="replace").rstrip("\n")
    except OSError:
        return None


def thread_names(pids: np.ndarray, tids: np.ndarray, known: set[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """(pid, tid, comm) of the threads in the records not in ``known`` (which it extends);
    a thread gone before its first flush keeps no name."""
    pairs = set(zip(pids.tolist(), tids.tolist())) - known
    known |= pairs
    out = []
    for pid, tid in sorted(pairs):
        name = _comm(pid, tid)
        if name is not None:
            out.append((pid, tid, name))
    return out
