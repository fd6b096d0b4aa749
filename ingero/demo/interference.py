"""Interference processes for the demos: real processes doing real work.

Run as ``python -m ingero.demo.interference KIND [ARGS]``; the demo runner
starts each in its own session (process group) and always kills the group.
Each sets its kernel task name (comm) to its kind, so explain names it
readably, and asks the kernel to kill it if its parent dies
(PR_SET_PDEATHSIG), so no hog outlives an interrupted demo.

Kinds:
  cpu-hog CPU          a busy loop pinned to core CPU
  fsync-writer DIR [MB] writes MB MiB (default 1) and fsyncs, in a loop (a checkpoint writer)
  memory-churn MB      allocates MB of anonymous memory, touches every page, frees it, again
  cache-evictor PATH   drops PATH's pages from the page cache every EVICT_INTERVAL_S
                       (what reclaim does to a memory-mapped dataset under
                       memory pressure; these machines have no swap)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PAGE = 4096
WRITE_CHUNK = 1 << 20
# The writer wraps around at this size so a long demo does not fill the disk.
WRITER_MAX_BYTES = 256 << 20
# Evict every 5 ms: a step maps a fresh window each time; this keeps most
# of its pages out of the cache.
EVICT_INTERVAL_S = 0.005

KINDS = ("cpu-hog", "fsync-writer", "memory-churn", "cache-evictor")


def _prepare(kind: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_NAME, kind.encode()[:15], 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl took effect
        sys.exit(0)


def cpu_hog(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while True:
        x += 1


def fsync_writer(directory: str, megabytes: int = 1) -> None:
    path = Path(directory) / f"ingero-demo-checkpoint-{os.getpid()}.bin"
    chunk = os.urandom(megabytes * WRITE_CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        written = 0
        while True:
            os.write(fd, chunk)
            os.fsync(fd)
            written += len(chunk)
            if written >= WRITER_MAX_BYTES:
                os.lseek(fd, 0, os.SEEK_SET)
                written = 0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def memory_churn(megabytes: int) -> None:
    n = megabytes << 20
    while True:
        buf = bytearray(n)  # calloc'd: fresh zero pages, faulted on first touch
        for off in range(0, n, PAGE):
            buf[off] = 1
        del buf


def cache_evictor(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    while True:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        time.sleep(EVICT_INTERVAL_S)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in KINDS:
        print(f"usage: python -m ingero.demo.interference {{{'|'.join(KINDS)}}} [ARG]", file=sys.stderr)
        return 2
    kind, rest = argv[0], argv[1:]
    _prepare(kind)
    if kind == "cpu-hog":
        cpu_hog(int(rest[0]) if rest else 0)
    elif kind == "fsync-writer":
        fsync_writer(rest[0] if rest else "/var/tmp", int(rest[1]) if len(rest) > 1 else 1)
    elif kind == "memory-churn":
        memory_churn(int(rest[0]) if rest else 512)
    else:
        cache_evictor(rest[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
