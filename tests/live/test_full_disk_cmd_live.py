"""A storage fault never ends the user's job (issue 25, findings 15 and 16): on a disk that
fills mid-trace the `--cmd` job runs to its end untraced and ingero exits with its status; a
restart on the full disk is one line and writes no session row."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import pytest
import workloads
from workloads import wait_until

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

INGERO = [sys.executable, "-m", "ingero"]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def disk():
    """(a 64 MiB tmpfs for the DB, a normal directory for everything else)."""
    work = Path(tempfile.mkdtemp(prefix="ingfd-", dir="/tmp"))
    mnt = work / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt, work
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def _fill(mnt: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'filler'}", "bs=1M"], capture_output=True)
    st = os.statvfs(mnt)
    assert st.f_bavail * st.f_frsize < 1 << 20


def test_a_full_disk_mid_trace_never_ends_the_cmd_job(disk):
    mnt, work = disk
    db, sock, go, marker = mnt / "t.duckdb", work / "t.sock", work / "go", work / "job-finished"
    job, child = work / "job.sh", work / "child.py"
    # a wrapper whose python child runs until told to stop, and a last line after it
    child.write_text(f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n")
    job.write_text(f"#!/bin/sh\n{sys.executable} {child}\necho done > {marker}\nexit 7\n")
    job.chmod(0o755)
    env = {**os.environ, "INGERO_SOCKET": str(sock), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([*INGERO, "trace", "--db", str(db), "--cmd", str(job)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, what="the tracer serving")
        assert proc.poll() is None, proc.stderr.read()
        _fill(mnt)
        # the tracer detaches (its socket goes) while the job keeps running
        wait_until(lambda: not sock.exists(), what="the tracer to stop tracing")
        assert proc.poll() is None and not marker.exists()
        go.touch()
        _, err = proc.communicate(timeout=workloads.TRACED_RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert marker.exists(), err
    assert marker.read_text() == "done\n"  # the wrapper's last line ran: the job was not killed
    assert proc.returncode == 7, err
    last = err.splitlines()[-1]
    assert last.startswith(f"ingero: stopped writing: the disk holding {db} is full; events written before this "
                           "are kept; the command ran to its end untraced and exited with code 7"), err
    assert "Traceback" not in err

    # finding 15: a restart on the full disk is one line and writes no session row
    again = subprocess.run([*INGERO, "trace", "--db", str(db), "--pid", str(os.getpid()), "--duration", "2s"],
                           env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 2, again.stderr
    assert "Traceback" not in again.stderr
    assert again.stderr.splitlines()[-1].startswith(("ingero: cannot write to", "ingero: cannot start tracing into")), \
        again.stderr
    (mnt / "filler").unlink()
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM sessions").fetchall() == [(1,)]
    finally:
        con.close()
