"""Live: SIGINT / SIGTERM in the middle of a busy trace lose nothing.

The database opens afterwards, the session row is closed, and its event
count equals the rows stored (every decoded record was flushed).
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from workloads import Tracer, build, libcudart, query, wait_for

pytestmark = pytest.mark.live


def _cuda_calls_seen(tracer: Tracer) -> int:
    """CUDA calls decoded so far: the latest tick's op counts (only the workload loads this libcudart)."""
    ticks = tracer.ticks()
    ops = ticks[-1]["ops"] if ticks else {}
    return sum(st["count"] for name, st in ops.items() if name.startswith("cuda"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_trace_flushes_everything_and_closes_the_session(tmp_path, sig):
    lib = libcudart()
    calls = build("cudart_calls", tmp_path)
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db)
    tracer.wait_started()
    # a workload still calling CUDA when the signal arrives
    work = subprocess.Popen([str(calls), str(lib), "5000000", "64"], stdout=subprocess.DEVNULL)  # killed below
    try:
        # the signal comes once the tracer has decoded the workload's calls (its
        # once-a-second tick counts them), not after a guess at how long that takes
        assert wait_for(lambda: _cuda_calls_seen(tracer) > 100, timeout=240), tracer.ticks()[-1:]
        assert work.poll() is None, "the workload should still be running"
        summary = tracer.finish(sig=sig)
    finally:
        work.kill()
        work.wait()
    assert summary["ended_by"] == signal.Signals(sig).name
    sid = summary["session_id"]
    status, events, drops_kernel, drops_user = query(
        db, "SELECT status, events, drops_kernel, drops_user FROM sessions WHERE session_id = $s", {"s": sid})[0]
    stored = query(db, "SELECT count(*) FROM events WHERE session_id = $s", {"s": sid})[0][0]
    cuda = query(db, "SELECT count(*) FROM events WHERE session_id = $s AND pid = $p AND op LIKE 'cuda%'",
                 {"s": sid, "p": work.pid})[0][0]
    assert status == "closed"
    assert events == stored == summary["events"]
    assert cuda > 100  # the workload was traced up to the signal
    assert (drops_kernel, drops_user) == (summary["drops_kernel"], summary["drops_user"])
