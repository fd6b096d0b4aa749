"""Live: CUDA calls that never return are counted exactly (sessions.stale_calls), and only those.

Why this construction is deterministic (tests/live/workloads/stale_calls.c):

* The BPF side keeps a thread's in-flight call in task-local storage
  (BPF_TASK_STORAGE in bpf/ingero.bpf.c), and counts CNT_STALE_CALLS when
  the same thread enters a probed call at or above the stack pointer of an
  entry whose return never came (bpf/cuda.bpf.c, cuda_enter).  So a stale
  call is one whose frame was left without returning while the thread went
  on: here, a siglongjmp out of cudaDeviceSynchronize of the simulated
  runtime, followed by cudaMalloc from the same frame.  The signal is sent
  only once the thread sleeps in clock_nanosleep, which in the workload only
  the runtime's sync does, so every one of the ESCAPES calls is in progress
  when it is abandoned: exactly ESCAPES stale calls.
* A thread killed mid-call, or still inside a call when the process exits,
  takes its storage with it: nothing is replaced, nothing is counted.  That
  also holds for a later thread that happens to get the dead one's tid (the
  state is keyed by task, not by tid, so a reused tid starts clean); the
  workload starts a fresh thread after the kill, whatever tid it gets.  A
  "thread killed mid-call" therefore must add 0, and the test asserts the
  total is exactly ESCAPES, not at least.
* The trace targets only the command (--cmd): other processes calling CUDA
  on the host at the same time are not traced and cannot add to the count.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workloads import build, build_shared, query, trace_gated

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

ESCAPES = 5


def test_calls_left_by_longjmp_are_counted_and_killed_threads_are_not(tmp_path: Path, simcuda: Path) -> None:
    # the escape waits for the sync's sleep: blocking sync (the runtime's default, CUDA's Auto, spins here)
    tracer, summary, db = trace_gated(build("stale_calls", tmp_path), simcuda, tmp_path, ESCAPES,
                                      env={"SIMCUDA_SCHEDULE": "block"})
    assert f"done {ESCAPES}" in tracer.stderr  # the command's output goes to stderr under --json
    assert (summary["ended_by"], summary["command_exit"]) == ("command exited", 0)

    assert summary["stale_calls"] == ESCAPES
    ops = dict(query(db, "SELECT op, count(*) FROM events WHERE op LIKE 'cuda%' GROUP BY op"))
    # one launch; a cudaMalloc after each escape plus the fresh thread's; no sync ever returned
    assert ops == {"cudaLaunchKernel": 1, "cudaMalloc": ESCAPES + 1}, ops
    assert query(db, "SELECT status, stale_calls FROM sessions") == [("closed", ESCAPES)]

    status = subprocess.run([sys.executable, "-m", "ingero", "status", "--db", str(db)],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert f"{ESCAPES} stale CUDA calls (never returned" in status.stdout, status.stdout


DEEP_CALLS = 100
DEEP_FRAMES = 5  # each call this many frames below main's (1 KiB of locals each)


def test_calls_from_deeper_frames_after_a_longjmp_are_recorded(tmp_path: Path) -> None:
    """One call left by longjmp, then DEEP_CALLS calls from 5 frames further down, then one
    from the abandoned call's own frame: every call that returned must be a row.

    The first deeper call looks nested by stack pointer alone; bpf/cuda.bpf.c
    (outer_frame_alive) sees that the abandoned call's return-address slot no
    longer holds the uretprobe trampoline, so it is counted stale once and every
    later call is recorded.  Genuinely nested calls (the driver's _ptsz entry
    points calling the plain ones) stay one row: tests/live/test_trace_cudart.py."""
    lib = build_shared("longjmp_lib", tmp_path, "libcudart.so.12")
    tracer, summary, db = trace_gated(build("longjmp_main", tmp_path), lib, tmp_path, DEEP_CALLS, DEEP_FRAMES)
    assert f"done {DEEP_CALLS}" in tracer.stderr
    rows = query(db, "SELECT count(*) FROM events WHERE op = 'cudaStreamSync'")[0][0]
    assert (rows, summary["stale_calls"], summary["nest_skipped"]) == (DEEP_CALLS + 1, 1, 0)
