"""`ingero trace` as a daemon: status, query and explain reach it over its socket while it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ingero.daemon import access, client
import workloads
from workloads import wait_until

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

INGERO = [sys.executable, "-m", "ingero"]


def test_trace_answers_status_query_and_explain_while_running(short_dir):
    db, sock = short_dir / "t.duckdb", short_dir / "t.sock"
    env = {**os.environ, "INGERO_SOCKET": str(sock), "INGERO_DB": str(db)}
    # a target that exists for the whole run and makes a known number of syscalls/switches
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nfor _ in range(12000): time.sleep(0.05)"])
    proc = subprocess.Popen([*INGERO, "trace", "--pid", str(sleeper.pid), "--retain", "1h", "--max-db", "1GB"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, what="the tracer's socket")
        assert proc.poll() is None, proc.stderr.read()
        st = wait_until(lambda: (s := client.status(socket_path=sock))["running"] and s, what="status running")
        assert st["session"]["tracer_pid"] == proc.pid
        assert str(sleeper.pid) in (st["session"]["targets"] or "")
        assert Path(st["db_path"]).samefile(db)
        # `ingero query` falls back to the socket because the file is locked by the tracer
        q = subprocess.run([*INGERO, "query", "--json", "SELECT count(*) AS n FROM sessions"],
                           env=env, capture_output=True, text=True, timeout=60)
        assert q.returncode == 0, q.stderr
        assert json.loads(q.stdout)["rows"] == [{"n": 1}]
        refused = subprocess.run([*INGERO, "query", "COPY events TO '/tmp/ingero-escape.csv'"],
                                 env=env, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "COPY is refused" in refused.stderr
        out = subprocess.run([*INGERO, "status"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith(f"ingero: running (pid {proc.pid})")
        ex = subprocess.run([*INGERO, "explain", "--since", "30s"], env=env, capture_output=True, text=True,
                            timeout=120)
        assert ex.returncode == 0, ex.stderr
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(workloads.EXIT_TIMEOUT_S)
        sleeper.kill()
        sleeper.wait()
    assert not sock.exists()
    st = access.current_status(db)
    assert st["running"] is False and st["session"]["status"] == "closed"
