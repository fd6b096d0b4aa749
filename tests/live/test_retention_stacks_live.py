"""Live: with --stack and --retain, a stack retention pruned is written again when its call site recurs.

The workload calls cudaMalloc (site A) and cudaStreamSynchronize (site C) for a
second, sleeps past the first retention pass (RETENTION_INTERVAL_S after the
start), then calls site A again.  With --retain 3s that pass deletes the first
second's events, so both stacks lose every reference and are pruned.  C never
recurs: its frames must be gone.  A recurs: the tracer's stack resolver must
write its frames again, so no stored event refers to a stack without rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

import workloads

from ingero.store.retention import RETENTION_INTERVAL_S

pytestmark = pytest.mark.live

SECOND_PHASE_S = RETENTION_INTERVAL_S + 5  # workload time of the second phase: after the first pass

WORKLOAD = textwrap.dedent("""
    import ctypes, sys, time
    cudart = ctypes.CDLL(sys.argv[1])
    ptr = ctypes.c_void_p()

    def site_a():
        cudart.cudaMalloc(ctypes.byref(ptr), 4096)  # SITE_A

    def site_c():
        cudart.cudaStreamSynchronize(None)  # SITE_C

    def run(seconds, with_c):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            site_a()
            if with_c:
                site_c()
            time.sleep(0.005)

    start = time.monotonic()
    for phase in (0, 1):
        if phase:
            time.sleep(max(0.0, float(sys.argv[2]) - (time.monotonic() - start)))
        run(1.0, with_c=phase == 0)  # the same call site in both phases: the same stack for site A
    print("done", flush=True)
""")


def _libcudart() -> str:
    from workloads import libcudart

    lib = libcudart()
    if lib is None:
        pytest.fail("nvidia-cuda-runtime-cu12 is not installed in this venv (pip install nvidia-cuda-runtime-cu12)")
    return str(lib)


def _line(text: str, tag: str) -> int:
    return next(no for no, ln in enumerate(text.splitlines(), 1) if ln.rstrip().endswith("# " + tag))


def test_a_pruned_stack_is_written_again_when_its_site_recurs(tmp_path: Path) -> None:
    script = tmp_path / "phases.py"
    script.write_text(WORKLOAD)
    db = tmp_path / "t.duckdb"
    r = subprocess.run(
        [sys.executable, "-m", "ingero", "trace", "--stack", "--retain", "3s", "--duration", "90s", "--db", str(db),
         "--cmd", f"{sys.executable} {script} {_libcudart()} {SECOND_PHASE_S}"],
        capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S,
        env={**os.environ, "INGERO_SOCKET": str(tmp_path / "ingero.sock")})
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout, r.stdout
    con = duckdb.connect(str(db), read_only=True)
    syncs, mallocs, with_stack = con.execute(
        "SELECT count(*) FILTER (op = 'cudaStreamSync'), count(*) FILTER (op = 'cudaMalloc'), "
        "count(stack_id) FILTER (op = 'cudaMalloc') FROM events").fetchone()
    assert syncs == 0  # the first second was deleted by retention ...
    assert mallocs > 50 and with_stack >= 0.9 * mallocs  # ... the second phase is there, with stacks
    lines = dict(con.execute(
        "SELECT line, count(DISTINCT stack_id) FROM stacks WHERE file = $f GROUP BY line", {"f": str(script)}
    ).fetchall())
    assert _line(WORKLOAD, "SITE_C") not in lines  # pruned, never seen again
    assert lines.get(_line(WORKLOAD, "SITE_A"), 0) >= 1  # pruned, then written again
    dangling = con.execute(
        "SELECT count(*) FROM events e WHERE stack_id IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM stacks s WHERE s.stack_id = e.stack_id)").fetchone()[0]
    assert dangling == 0
