"""``ingero trace --stack`` end to end: the CLI, the store, analyze.callers.

Runs the real CLI (``python -m ingero trace --stack --cmd ...``) on small
workloads with known line numbers and checks what callers.py reads back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

import workloads

from prereqs import needs_nvidia_libcudart

from ingero.analyze.callers import most_preempted_lines, top_callers
from ingero.store.selection import Selection

pytestmark = pytest.mark.live

HERE = Path(__file__).resolve().parent
STEPS = 1000  # stack_cuda_loop's steps: ~2.3 s idle


def libcudart() -> str:
    return str(needs_nvidia_libcudart())


def trace(cmd: str, db: Path, duration: float) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ingero", "trace", "--stack", "--cmd", cmd, "--duration", str(duration),
         "--db", str(db)],
        capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S,
        # A private query socket: another tracer on the machine must not refuse ours.
        env={**os.environ, "INGERO_SOCKET": str(db.parent / "ingero.sock")})
    assert out.returncode == 0, out.stderr
    return out.stdout


def only_session(con) -> Selection:
    """All of the one session a trace into a fresh database recorded."""
    (sid,), = con.execute("SELECT DISTINCT session_id FROM sessions").fetchall()
    return Selection.whole(int(sid))


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in workload output: {text!r}")


def test_top_callers_name_the_exact_lines(tmp_path):
    db = tmp_path / "t.duckdb"
    script = HERE / "stack_cuda_loop.py"
    stdout = trace(f"{sys.executable} {script} {libcudart()} {STEPS}", db, 120)
    lines = last_json(stdout)
    con = duckdb.connect(str(db), read_only=True)
    rows = top_callers(con, only_session(con))
    by_op = {}
    for r in rows:  # the top site of each op (rows come by time spent, most first)
        by_op.setdefault(r["op"], r)
    assert by_op["cudaMalloc"]["file"] == str(script)
    assert by_op["cudaMalloc"]["line"] == lines["MALLOC_LINE"]
    assert by_op["cudaMalloc"]["source"] == "cudart.cudaMalloc(ctypes.byref(ptr), 1 << 20)  # MALLOC_LINE"
    assert by_op["cudaStreamSync"]["line"] == lines["SYNC_LINE"]
    # Every call got a stack; all but the few made before the new process was
    # examined (within ~20 ms of its first event, ~10 steps) name that line.
    calls = con.execute("SELECT count(*), count(stack_id) FROM events WHERE op = 'cudaMalloc'").fetchone()
    assert calls[0] == calls[1] == STEPS
    assert by_op["cudaMalloc"]["calls"] >= 0.95 * calls[0]


def test_preempted_line_tops_the_list(tmp_path):
    """A loop on one line sharing CPU 0 with a CPU hog: that line is where it gets preempted."""
    db = tmp_path / "t.duckdb"
    script = HERE / "stack_hot_loop.py"
    hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        stdout = trace(f"taskset -c 0 {sys.executable} {script} 3", db, 30)
    finally:
        hog.kill()
        hog.wait()
    hot = last_json(stdout)["HOT_LINE"]
    con = duckdb.connect(str(db), read_only=True)
    rows = most_preempted_lines(con, only_session(con))
    assert rows, "no preemption with a stack was recorded"
    top = rows[0]
    assert (top["file"], top["line"]) == (str(script), hot)
    assert top["source"].startswith("while time.monotonic() < end: n += 1")
    # Sharing one core with a hog for 3 s: CFS slices of a few ms give
    # hundreds of preemptions on an idle machine; a loaded shared one (load 16
    # on 2 cores seen) still gives dozens.  Most land on the loop.
    assert top["preemptions"] >= 10
    assert top["preemptions"] > sum(r["preemptions"] for r in rows[1:])
    assert os.path.basename(top["file"]) == "stack_hot_loop.py"
