"""Issue 41.10-13 against real processes: Ctrl-C ends a runaway `ingero fleet query`, and a running
`ingero trace` refuses a giant value over its socket before building it, then answers on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ingero.daemon import client
from ingero.errors import IngeroError
from workloads import wait_until

pytestmark = [pytest.mark.live, pytest.mark.exact]  # counts and lines; times nothing

REPO = Path(__file__).resolve().parents[2]
INGERO = [sys.executable, "-m", "ingero"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_ends_a_runaway_fleet_query(short_dir):
    # it had no time limit and ignored SIGINT (DuckDB held the main thread)
    from ingero.fleet.synthetic import NodeSpec, generate

    generate(str(short_dir / "ds"), [NodeSpec("a"), NodeSpec("b")], seconds=60)
    q = subprocess.Popen([*INGERO, "fleet", "query", "--timeout", "300", str(short_dir / "ds"),
                          "SELECT count(*) FROM range(100000000000000)"], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_until(lambda: _cpu_s(q.pid) > 3.0, what="the query burning CPU")  # imports take < 1 s of CPU
    q.send_signal(signal.SIGINT)
    out, err = q.communicate(timeout=60)
    assert q.returncode == 130 and err.strip() == "ingero: aborted" and out == "", err


def test_sigint_ends_a_file_query_a_script_started_in_the_background(short_dir):
    # `ingero query ... &` in a script inherits SIGINT ignored: `kill -INT` left it running (issue 41.12)
    from ingero.store.db import Store

    db = short_dir / "f.duckdb"
    Store.open(db).close()
    q = subprocess.Popen([*INGERO, "query", "--db", str(db), "--timeout", "300",
                          "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    wait_until(lambda: _cpu_s(q.pid) > 3.0, what="the query burning CPU")
    q.send_signal(signal.SIGINT)
    out, err = q.communicate(timeout=60)
    assert q.returncode == 130 and err.strip() == "ingero: aborted" and out == "", err


def test_the_tracer_refuses_a_giant_value_and_answers_on(short_dir):
    db, sock = short_dir / "t.duckdb", short_dir / "t.sock"
    env = {**ENV, "INGERO_SOCKET": str(sock), "INGERO_DB": str(db)}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.02)"])
    tracer = subprocess.Popen([*INGERO, "trace", "--pid", str(sleeper.pid), "--duration", "600s"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sock.exists() or tracer.poll() is not None, what="the tracer's socket")
        assert tracer.poll() is None, tracer.stderr.read()
        wait_until(lambda: client.status(socket_path=sock)["running"], what="status running")
        for sql, what in (("SELECT repeat('x', 1000000000)", "repeat()"), ("SELECT len(range(100000000))", "range()")):
            with pytest.raises(IngeroError) as exc:
                client.query(sql, socket_path=sock)
            assert exc.value.message == (f"refused: {what} would build a value larger than 1 MiB (the most one row "
                                         "of a result may hold), before it is built")
        cols, rows = client.query("SELECT current_setting('memory_limit') AS m, count(*) > 0 AS named "
                                  "FROM process_names", socket_path=sock)
        assert rows == [["1.0 GiB", True]]
        r = subprocess.run([*INGERO, "query", "--csv", "SELECT strlen(repeat('ab', 3)) AS n"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout == "n\n6\n", r.stderr
    finally:
        tracer.send_signal(signal.SIGTERM)
        tracer.wait(300)
        sleeper.kill()
        sleeper.wait()
    assert tracer.returncode == 0
