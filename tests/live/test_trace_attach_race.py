"""Attaching to a library while a thread is inside its calls must not lose that thread.

A process calls libcudart in a tight loop before the trace starts; the
tracer attaches ~40 probes one by one while calls are in flight.  Every
call after the attach must be recorded: none may be swallowed as "nested"
because an entry was seen without its return.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

import workloads
from workloads import build, build_shared

pytestmark = pytest.mark.live

LOOP = textwrap.dedent("""
    import ctypes
    import nvidia.cuda_runtime, os
    lib_dir = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "lib")
    lib = ctypes.CDLL(os.path.join(lib_dir, "libcudart.so.12"))
    print("ready", flush=True)
    while True:  # until the test kills it: a slow attach must not outlast the loop
        lib.cudaStreamSynchronize(ctypes.c_void_p(0))
        lib.cudaMemcpy(None, None, ctypes.c_size_t(64), 1)
""")


def test_calls_in_flight_during_attach_do_not_wedge_the_thread(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    loop = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert loop.stdout is not None and loop.stdout.readline().strip() == "ready"
        db = tmp_path / "t.duckdb"
        r = subprocess.run([sys.executable, "-m", "ingero", "trace", "--pid", str(loop.pid), "--duration", "4s",
                            "--db", str(db)], capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S)
        assert r.returncode == 0, r.stderr
    finally:
        loop.kill()
        loop.wait()
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(con.execute(
        "SELECT op, count(*) FROM events WHERE pid = $p AND op IN ('cudaStreamSync', 'cudaMemcpy') GROUP BY op",
        {"p": loop.pid}).fetchall())
    # ~13 us per probe hit here: thousands of calls per second are recorded.
    assert rows.get("cudaStreamSync", 0) > 2000 and rows.get("cudaMemcpy", 0) > 2000, rows
    # The two ops alternate, so their counts differ by at most one per second
    # of tracing plus the attach window; a wedged thread would record none.
    assert abs(rows["cudaStreamSync"] - rows["cudaMemcpy"]) < 50, rows
    last, first = con.execute(
        "SELECT max(timestamp), min(timestamp) FROM events WHERE pid = $p AND op = 'cudaStreamSync'",
        {"p": loop.pid}).fetchone()
    assert (last - first) / 1e9 > 2.5  # recorded through the whole trace, not just before a wedge


def test_a_call_that_never_returns_does_not_swallow_later_calls(tmp_path: Path) -> None:
    """One call leaves its frame by longjmp (no return probe fires); the next
    1000 calls of the same thread must each still be one row."""
    lib = build_shared("longjmp_lib", tmp_path, "libcudart.so.12")
    exe = build("longjmp_main", tmp_path)
    go = tmp_path / "go"
    db = tmp_path / "t.duckdb"
    tracer = subprocess.Popen(
        [sys.executable, "-m", "ingero", "trace", "--cuda-lib", str(lib), "--duration", "60s", "--db", str(db),
         "--cmd", f"{exe} {lib} {go} 1000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert tracer.stdout is not None
    for line in tracer.stdout:
        if "session" in line and "Ctrl-C" in line:  # attached and recording
            break
    go.touch()
    out, _ = tracer.communicate(timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert tracer.returncode == 0, out
    con = duckdb.connect(str(db), read_only=True)
    n = con.execute("SELECT count(*) FROM events WHERE op = 'cudaStreamSync'").fetchone()[0]
    assert n == 1000, out
