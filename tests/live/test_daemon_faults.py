"""Daemon faults that need root: a full disk (tmpfs) stops writes cleanly and keeps what was acknowledged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import workloads

from ingero.store.db import Store

# the BPF-free writer process (not part of the package: run by path)
WRITER = Path(__file__).resolve().parents[2] / "bench" / "synthetic_writer.py"

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

TMPFS_SIZE = "8m"  # small enough to fill in a second at 100k events/s


@pytest.fixture()
def small_disk():
    d = Path(tempfile.mkdtemp(prefix="ingfull-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        # lazy: a connection a failed assertion left open must not keep the mount (and the dir) around
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


def _fill(db: Path) -> int:
    """Write until the disk is full; returns how many events the writer acknowledged."""
    proc = subprocess.run(
        [sys.executable, str(WRITER), "--db", str(db), "--rate", "100000",
         "--flush-s", "0.1", "--duration", "60"],
        capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 3, proc.stderr
    last = lines[-1]
    assert last["error"].startswith(f"stopped writing: the disk holding {db} is full; "
                                    "events written before this are kept")
    assert last["acked"] > 0
    return last["acked"]


def test_disk_full_stops_with_one_line_and_keeps_acknowledged_events(small_disk):
    db = small_disk / "full.duckdb"
    acked = _fill(db)
    # the DB opens afterwards (read-only, as `ingero status` does) and holds exactly what was acknowledged
    ro = Store.open(db, read_only=True)
    try:
        assert ro.con.execute("SELECT count(*) FROM events").fetchall() == [(acked,)]
        assert ro.con.execute("SELECT status, events FROM sessions").fetchall() == [("running", acked)]
    finally:
        ro.close()
    assert os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize < 1 << 20

    # Once space is freed (the tmpfs grows), the next writer marks the dead session crashed and
    # every acknowledged event is still there.
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    rw = Store.open(db)
    try:
        assert rw.mark_crashed_sessions() == 1
        assert rw.con.execute("SELECT status FROM sessions").fetchall() == [("crashed",)]
        assert rw.con.execute("SELECT count(*) FROM events").fetchall() == [(acked,)]
    finally:
        rw.close()


def test_trace_on_a_tiny_disk_ends_with_one_line(tmp_path):
    """`ingero trace` on a 64 KiB disk: one line naming the disk, exit 2."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], check=True)
    try:
        proc = subprocess.run([sys.executable, "-m", "ingero", "trace", "--db", str(tiny / "t.duckdb"),
                               "--duration", "2s"],
                              capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    finally:
        subprocess.run(["umount", "-l", str(tiny)], check=False)
    assert proc.returncode == 2, proc.stderr
    db = tiny / "t.duckdb"
    last = proc.stderr.splitlines()[-1]
    # where the disk runs out (creating the file, or the closing checkpoint) depends on the
    # filesystem's slack; either way it is one line naming the disk, never a traceback
    assert last in (
        f"ingero: cannot write to {db}: its disk is full — free space (or pick another --db), "
        "then run `ingero trace` again",
        f"ingero: cannot start tracing into {db}: its disk has 0 MiB free, a session needs at least 4 MiB to start — "
        "free space (or pick another --db), then run `ingero trace` again",
        f"ingero: stopped writing: the disk holding {db} is full; events written before this are kept — "
        "free space or pass --max-db to bound the database, then restart `ingero trace`",
    ), proc.stderr
    assert "Traceback" not in proc.stderr
