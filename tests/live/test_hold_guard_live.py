"""Live: a tracer that dies while a process is held leaves it to the guard, which resumes it.

The guard (ingero/collect/holdguard.py, started by holds.Holder) holds only
two BPF map fds and a pipe.  Here the maps are the real ones of a loaded
program with the holds compiled in: a stopped child is listed in ``held``,
the holds are on, and the pipe's write end is closed as a SIGKILL of the
tracer would close it.  The child must run again, the map be empty and the
holds be off (the probes may outlive the tracer in its background closer).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads import REPO, wait_for

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_guard_resumes_what_a_dead_tracer_left_held() -> None:
    from ingero.collect.holds import HoldCfg
    from ingero.collect.loader import BpfSettings, load_program

    program = load_program(BpfSettings(holds=True, trace_all_cuda=False))
    child = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        assert wait_for(lambda: _state(child.pid) == "T")
        bpf = program.bpf
        cfg, held = bpf["hold_cfg"], bpf["held"]
        cfg[ctypes.c_int(0)] = HoldCfg(enabled=1, tracer_tgid=os.getpid())
        held[held.Key(child.pid)] = held.Leaf(time.monotonic_ns())
        r, w = os.pipe()
        guard = subprocess.Popen([sys.executable, "-m", "ingero.collect.holdguard", str(r),
                                  str(cfg.map_fd), str(held.map_fd)],
                                 pass_fds=(r, int(cfg.map_fd), int(held.map_fd)), cwd=REPO, start_new_session=True)
        os.close(r)
        time.sleep(0.5)
        assert guard.poll() is None and _state(child.pid) == "T"  # nothing happens while the tracer lives
        os.close(w)  # the tracer is gone
        assert guard.wait(timeout=30) == 0
        assert _state(child.pid) in ("S", "R")
        assert list(held.keys()) == []
        assert cfg[ctypes.c_int(0)].enabled == 0
    finally:
        child.kill()
        child.wait()
        program.close()
