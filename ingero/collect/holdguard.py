"""The guard of holds.py: resumes every process a dead tracer left stopped.

``python -m ingero.collect.holdguard PIPE CFG_MAP HELD_MAP`` (file descriptors
passed by holds.Holder).  It waits for EOF on PIPE: the tracer closed it
(a normal stop, after resuming everything itself) or died (SIGKILL, a
crash).  Then it turns the holds off (bpf/attach.h ingero_hold_cfg.enabled =
0, in case the probes outlive the tracer in its background closer) and
sends SIGCONT to every pid left in the BPF ``held`` map.

No BCC and nothing of ingero: the maps are read through the bpf() syscall,
so the guard starts in ~30 ms and holds no probe.
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import sys
import time

_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
_MAP_UPDATE_ELEM, _MAP_DELETE_ELEM, _MAP_GET_NEXT_KEY = 2, 3, 4


def _bpf(cmd: int, map_fd: int, key: ctypes.Array | None, value: ctypes.Array | None) -> int:
    # union bpf_attr, map element commands: map_fd u32 @0, key u64 @8, value / next_key u64 @16, flags u64 @24
    attr = (ctypes.c_uint64 * 4)()
    attr[0] = map_fd
    attr[1] = ctypes.addressof(key) if key is not None else 0
    attr[2] = ctypes.addressof(value) if value is not None else 0
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_NR_BPF, cmd, attr, ctypes.sizeof(attr))


def held_pids(held_fd: int) -> list[int]:
    """Every key (a tgid) of the held map."""
    out: list[int] = []
    key, nxt = (ctypes.c_uint32 * 1)(), (ctypes.c_uint32 * 1)()
    first = True
    while _bpf(_MAP_GET_NEXT_KEY, held_fd, None if first else key, nxt) == 0 and len(out) < 65536:
        out.append(int(nxt[0]))
        key[0] = nxt[0]
        first = False
    return out


def release(cfg_fd: int, held_fd: int) -> list[int]:
    """Holds off, then every held pid resumed and forgotten; the pids."""
    zero, off = (ctypes.c_uint32 * 1)(0), (ctypes.c_uint32 * 2)(0, 0)
    _bpf(_MAP_UPDATE_ELEM, cfg_fd, zero, off)
    time.sleep(0.01)  # a program already past its enabled check finishes its insert
    pids = held_pids(held_fd)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        _bpf(_MAP_DELETE_ELEM, held_fd, (ctypes.c_uint32 * 1)(pid), None)
    return pids


def main(argv: list[str]) -> int:
    pipe_fd, cfg_fd, held_fd = (int(a) for a in argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tracer's Ctrl-C: it releases, then closes the pipe
    while True:
        try:
            if not os.read(pipe_fd, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    release(cfg_fd, held_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
