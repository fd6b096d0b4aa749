"""Which processes a fix may not renice: kernel threads, told apart from exited user processes."""

from __future__ import annotations

import pytest

from ingero.analyze.procs import Proc


@pytest.mark.parametrize(
    ("proc", "kernel"),
    [
        (Proc(2, "kthreadd", "kthreadd", "", known=True, ppid=0), True),
        (Proc(77, "kworker/0:1", "kworker/0:1", "", known=True, ppid=2), True),
        # a hog that exited before /proc/PID/cmdline was read: its parent is a shell
        (Proc(4242, "python", "python", "", known=True, ppid=4100), False),
        (Proc(4242, "python3 (hog.py)", "python3", "python3 hog.py", known=True, ppid=4100), False),
        # parent unknown (a database before ppid was kept): no command line is all there is
        (Proc(88, "ksoftirqd/0", "ksoftirqd/0", "", known=True, ppid=None), True),
        (Proc(99, "pid 99", "", "", known=False, ppid=None), False),
    ],
)
def test_kernel_thread(proc: Proc, kernel: bool) -> None:
    assert proc.is_kernel_thread is kernel
