"""host.pid_alive: whether a 'running' session's tracer still runs."""

from __future__ import annotations

import subprocess
import sys
import time

from ingero.host import pid_alive


def test_a_running_process_is_alive_and_an_exited_unreaped_one_is_not():
    """A tracer killed under a parent that does not wait for it stays a zombie (a container's
    init may never reap it): its session must still be marked crashed."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_alive(child.pid)
        child.kill()
        # not reaped: wait until the kernel has made it a zombie
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                if b") Z " in f.read():
                    break
            time.sleep(0.01)
        assert not pid_alive(child.pid)
    finally:
        child.wait()
    assert not pid_alive(child.pid)  # reaped: no such process


def test_a_command_name_that_looks_like_a_zombie_state_is_read_past():
    """comm is the process' own to set: "x) Z (y" must not read as the state Z."""
    code = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, b'x) Z (y', 0, 0, 0); "
            "print(flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # the name is set
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            assert f.read().startswith(f"{child.pid} (x) Z (y) ".encode())  # (then its state: S or R)
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
