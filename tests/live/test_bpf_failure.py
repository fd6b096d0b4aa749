"""Live: a BPF program that does not compile, or that the verifier refuses, ends `ingero trace`
with one line saying what failed and how to fix it, exit code 2, no traceback, and no session
left 'running' in the database.

The failure is injected through INGERO_BPF_DIR (loader.bpf_dir: where the BPF sources are
read from) pointing at a copy of bpf/ with one change: a broken header, or one extra
tracepoint program dereferencing a scalar (the verifier's "invalid mem access 'scalar'").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from workloads import REPO

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

REFUSED = """
TRACEPOINT_PROBE(sched, sched_process_free)
{
	u64 *p = (u64 *)(unsigned long)bpf_get_prandom_u32();
	return *p; /* a scalar used as a pointer: the verifier refuses it */
}
"""
DEAD_PID = 2**22 + 1  # above pid_max's ceiling (4194304): never a live process


def _bpf_copy(tmp_path: Path) -> Path:
    src = tmp_path / "bpf"
    shutil.copytree(REPO / "bpf", src)
    return src


def _db_with_a_dead_tracers_session(path: Path) -> None:
    """A session a killed tracer left 'running': the failing start must not leave it so."""
    from ingero.store.db import Store

    store = Store.open(path)
    sid = store.begin_session(command="ingero trace", targets="all")
    store.con.execute("UPDATE sessions SET tracer_pid = $p WHERE session_id = $s", {"p": DEAD_PID, "s": sid})
    store.close()


def _trace(bpf_dir: Path, db: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ingero", "trace", "--duration", "2s", "--db", str(db)],
        capture_output=True, text=True, timeout=180, cwd=REPO,
        env={**os.environ, "INGERO_BPF_DIR": str(bpf_dir)},
    )


def _sessions(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT session_id, status FROM sessions ORDER BY session_id").fetchall()
    finally:
        con.close()


def _one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert r.stdout == ""  # nothing started, nothing to report
    return lines[0]


def test_a_compile_failure_is_one_line_and_leaves_no_running_session(tmp_path: Path) -> None:
    src = _bpf_copy(tmp_path)
    with open(src / "events.h", "a") as f:
        f.write("\nthis is not C;\n")  # a broken header
    db = tmp_path / "t.duckdb"
    _db_with_a_dead_tracers_session(db)
    line = _one_line(_trace(src, db))
    assert line.startswith(f"ingero: BPF compile failed ({src / 'ingero.bpf.c'}, kernel headers ")
    assert f"{src / 'events.h'}:" in line and "error: unknown type name 'this'" in line  # the compiler's own line
    assert f"INGERO_BPF_DIR={src} chose these sources: unset it" in line  # how to fix
    assert "ingero check" in line
    assert _sessions(db) == [(1, "crashed")]  # the dead tracer's session marked; no new one begun


def test_a_verifier_refusal_names_the_program_and_leaves_no_session(tmp_path: Path) -> None:
    src = _bpf_copy(tmp_path)
    with open(src / "ingero.bpf.c", "a") as f:
        f.write(REFUSED)
    db = tmp_path / "t.duckdb"
    line = _one_line(_trace(src, db))
    assert line.startswith("ingero: BPF load failed: the kernel verifier refused "
                           "tracepoint__sched__sched_process_free: ")
    assert "invalid mem access 'scalar'" in line  # the verifier's key line, quoted
    assert f"INGERO_BPF_DIR={src} chose these sources" in line
    assert _sessions(db) == []
