"""What a blocked thread waits in: x86-64 system call numbers -> names, and which take an fd first.

sched.bpf.c stores the system call a traced thread was in when it blocked
(its ``orig_ax``) and the call's first argument; the decoder turns them into
``events.syscall`` and, for the calls below whose first argument is a file
descriptor, ``events.wait_fd``.  Numbers are the kernel's x86-64 ABI
(arch/x86/entry/syscalls/syscall_64.tbl), fixed forever; only calls a thread
can block in are named, the rest read ``syscall_N``.
"""

from __future__ import annotations

import numpy as np

X86_64: dict[int, str] = {
    0: "read", 1: "write", 2: "open", 3: "close", 7: "poll", 9: "mmap", 10: "mprotect", 11: "munmap",
    12: "brk", 16: "ioctl", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev", 23: "select",
    24: "sched_yield", 26: "msync", 28: "madvise", 34: "pause", 35: "nanosleep", 40: "sendfile",
    42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 56: "clone",
    59: "execve", 60: "exit", 61: "wait4", 65: "semop", 70: "msgrcv", 73: "flock", 74: "fsync",
    75: "fdatasync", 76: "truncate", 77: "ftruncate", 82: "rename", 83: "mkdir", 87: "unlink",
    128: "rt_sigtimedwait", 130: "rt_sigsuspend", 162: "sync", 202: "futex", 208: "io_getevents",
    217: "getdents64", 220: "semtimedop", 230: "clock_nanosleep", 231: "exit_group", 232: "epoll_wait",
    247: "waitid", 257: "openat", 262: "newfstatat", 270: "pselect6", 271: "ppoll", 275: "splice",
    277: "sync_file_range", 281: "epoll_pwait", 285: "fallocate", 288: "accept4", 293: "pipe2",
    295: "preadv", 296: "pwritev", 299: "recvmmsg", 306: "syncfs", 307: "sendmmsg", 318: "getrandom",
    326: "copy_file_range", 327: "preadv2", 328: "pwritev2", 332: "statx", 426: "io_uring_enter",
    435: "clone3", 441: "epoll_pwait2", 449: "futex_waitv",
}

# Calls whose first argument is the file descriptor they wait on.
FD_FIRST = frozenset({
    "read", "write", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2",
    "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "accept", "accept4", "connect",
    "fsync", "fdatasync", "sync_file_range", "syncfs", "ftruncate", "fallocate", "flock", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "ioctl", "getdents64", "sendfile", "splice", "copy_file_range",
    "io_uring_enter",
})

TABLE_SIZE = 1024  # above every x86-64 number; higher ones (none today) are stored as NULL
NAMES: list[str] = [X86_64.get(nr, f"syscall_{nr}") for nr in range(TABLE_SIZE)]
TAKES_FD = np.array([name in FD_FIRST for name in NAMES])
