"""Issue 41.9 on a real full file system (a 1 MiB tmpfs, mounted as root): a database whose
creation fails leaves no file behind, and the next command on that path works."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing

REPO = Path(__file__).resolve().parents[2]
INGERO = [sys.executable, "-m", "ingero"]
TRACE = REPO / "tests" / "data" / "torch_cpu_workers0.json.gz"


@pytest.fixture
def tiny_fs():
    d = Path(tempfile.mkdtemp(prefix="ingfull-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)
        d.rmdir()


def _fill(d: Path, leave_bytes: int) -> Path:
    st = os.statvfs(d)
    fill = d / "fill"
    fill.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave_bytes))
    return fill


def _ingero(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*INGERO, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


# bytes left free: none (DuckDB cannot write its header) and a little (the schema is cut half-way)
@pytest.mark.parametrize("leave", [0, 8 << 10, 16 << 10])
def test_a_db_that_cannot_be_created_is_not_left_behind(tiny_fs: Path, leave: int):
    db = tiny_fs / "x.duckdb"
    fill = _fill(tiny_fs, leave)
    r = _ingero("import", "--db", str(db), str(TRACE))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "disk is full" in r.stderr or "Could not write" in r.stderr, r.stderr
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["fill"]
    fill.unlink()
    r = _ingero("import", "--db", str(db), str(TRACE))
    assert r.returncode == 0, r.stderr
    q = _ingero("query", "--db", str(db), "--csv", "SELECT count(*) AS n FROM sessions")
    assert q.returncode == 0 and q.stdout == "n\n1\n", q.stderr
