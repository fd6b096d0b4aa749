"""Daemon faults that need root: a full disk (tmpfs) stops writes cleanly and keeps what was acknowledged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ingero.store.db import Store

pytestmark = pytest.mark.live

TMPFS_SIZE = "8m"  # small enough to fill in a second at 100k events/s


@pytest.fixture()
def small_disk():
    d = Path(tempfile.mkdtemp(prefix="ingfull-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)
        d.rmdir()


def test_disk_full_stops_with_one_line_and_keeps_acknowledged_events(small_disk):
    db = small_disk / "full.duckdb"
    proc = subprocess.run(
        [sys.executable, "-m", "ingero.daemon.synthetic", "--db", str(db), "--rate", "100000",
         "--flush-s", "0.1", "--duration", "60"],
        capture_output=True, text=True, timeout=120,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 3, proc.stderr
    last = lines[-1]
    assert last["error"].startswith(f"stopped writing: the disk holding {db} is full; events written before this are kept")
    acked = last["acked"]
    assert acked > 0
    # the DB opens afterwards (read-only, as `ingero status` does) and holds exactly what was acknowledged
    ro = Store.open(db, read_only=True)
    assert ro.con.execute("SELECT count(*) FROM events").fetchall() == [(acked,)]
    assert ro.con.execute("SELECT status, events FROM sessions").fetchall() == [("running", acked)]
    ro.close()
    # and writable, still on the full disk: the dead session is marked crashed
    rw = Store.open(db)
    assert rw.mark_crashed_sessions() == 1
    assert rw.con.execute("SELECT count(*) FROM events").fetchall() == [(acked,)]
    rw.close()
    assert os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize < 1 << 20
