"""Facts about this host and its users that several layers need (no ingero imports).

Who ran sudo, whether the kernel groups CPU time per session, whether a pid
lives, whether the `ingero` group exists, and the file modes ingero creates
its files with.
"""

from __future__ import annotations

import grp
import os
import pwd

# The group whose members may query a root tracer (socket) and read its files.
GROUP = "ingero"


def invoking_user() -> pwd.struct_passwd | None:
    """The user behind ``sudo`` (SUDO_USER), else None when not under sudo."""
    name = os.environ.get("SUDO_USER")
    if not name or name == "root":
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def group_gid(group: str | None = GROUP) -> int | None:
    if not group:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def private_umask() -> int:
    """The umask for files that hold traces (command lines often carry tokens and paths):
    owner only, or owner + read for the `ingero` group when that group exists."""
    return 0o027 if group_gid() is not None else 0o077


def sched_autogroup_enabled(path: str = "/proc/sys/kernel/sched_autogroup_enabled") -> bool:
    """Whether this kernel groups CPU time per session (CONFIG_SCHED_AUTOGROUP, switched on).

    Then two busy processes of different sessions share a core half and half whatever their
    nice values: measured here, three hogs reniced to 19 left a pinned loop at 40 steps/s (42
    at nice 0), while their autogroup nice at 19 gave it 86.
    """
    try:
        with open(path) as f:
            return f.read().strip() == "1"
    except OSError:
        return False  # no such file: the kernel has no autogroups


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists and has not exited (a tracer that wrote a
    'running' session).  An exited process nobody has reaped yet (a zombie: a tracer killed
    under a parent that does not wait, or a container's init that never does) is not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # (no /proc: what kill said)
    # the state follows the command name in parentheses, which may itself hold ") "
    state = stat.rfind(b")") + 2
    return stat[state : state + 1] != b"Z"
