"""A synthetic tracer process (no BPF): live queries while it writes, SIGTERM, kill -9 recovery, status."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from ingero.cli import main
from ingero.daemon import client
from ingero.daemon.state import collect_status
from ingero.store.db import DatabaseLocked
from ingero.render.status import lines as format_status
from ingero.store.db import Store

# the BPF-free writer process (not part of the package: run by path)
WRITER = Path(__file__).resolve().parents[2] / "bench" / "synthetic_writer.py"

RATE = 20_000          # events/s the synthetic writer produces
FLUSH_S = 0.2          # its flush interval (the tracer's is <= 1 s)
BATCH = int(RATE * FLUSH_S)


class Writer:
    def __init__(self, db: Path, sock: Path, *extra: str) -> None:
        env = {**os.environ, "INGERO_SOCKET": str(sock)}
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER), "--db", str(db), "--rate", str(RATE),
             "--flush-s", str(FLUSH_S), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.last: dict[str, Any] = {}

    def read_until(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sel.select(timeout=deadline - time.monotonic()):
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            self.last = msg
            if pred(msg):
                return msg
        raise AssertionError(f"writer did not report in time; last={self.last} stderr={self._stderr()}")

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture()
def writer(short_dir):
    made: list[Writer] = []

    def start(*extra: str) -> Writer:
        w = Writer(short_dir / "w.duckdb", short_dir / "w.sock", *extra)
        made.append(w)
        w.read_until(lambda m: m.get("ready"))
        return w

    yield start
    for w in made:
        w.close()


def test_queries_see_committed_events_while_the_writer_runs(writer, short_dir):
    w = writer("--serve")
    sock = short_dir / "w.sock"
    before = w.read_until(lambda m: m.get("acked", 0) >= 4 * BATCH)
    ack = w.read_until(lambda m: "acked" in m)
    acked = ack["acked"]
    n = client.query("SELECT count(*) FROM events", socket_path=sock)[1][0][0]
    assert n >= acked and n % BATCH == 0  # whole batches only: each append is one transaction
    # freshness: a query sees the batch acknowledged just before it (its events lie in
    # [the previous ack's event_ns, this ack's event_ns)), however slow the box is
    newest = client.query("SELECT max(timestamp) FROM events", socket_path=sock)[1][0][0]
    assert newest >= before["event_ns"]
    later = w.read_until(lambda m: m.get("acked", 0) >= n + 3 * BATCH)["acked"]
    assert client.query("SELECT count(*) FROM events", socket_path=sock)[1][0][0] >= later
    # while it runs, the file cannot be opened by another process; the lock error is recognised
    with pytest.raises(DatabaseLocked):
        Store.open(short_dir / "w.duckdb", read_only=True)
    st = client.status(socket_path=sock)
    assert st["running"] and st["session"]["targets"] == "synthetic writer"
    # the rate over the status window reaches the writer's order of magnitude (polled: a
    # writer starved for a moment on a shared box catches up, it is not a failure)
    rates = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (rates and rates[-1] > RATE / 4):
        rates.append(client.status(socket_path=sock)["session"]["events_per_s"])
        time.sleep(0.2)
    assert rates[-1] > RATE / 4, rates


def test_status_command_and_sigterm_close_cleanly(writer, short_dir, capsys, monkeypatch):
    monkeypatch.setenv("INGERO_SOCKET", str(short_dir / "w.sock"))
    w = writer("--serve")
    w.read_until(lambda m: m.get("acked", 0) >= 3 * BATCH)
    assert main(["status", "--db", str(short_dir / "w.duckdb")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ingero: running (pid {w.proc.pid}) since ")
    assert "targets: synthetic writer" in out and "/s over the last" in out
    w.proc.send_signal(signal.SIGTERM)
    closed = w.read_until(lambda m: m.get("closed"))
    assert w.proc.wait(10) == 0
    assert not (short_dir / "w.sock").exists()
    assert main(["status", "--db", str(short_dir / "w.duckdb"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["running"] is False and st["session"]["status"] == "closed"
    assert st["session"]["events"] == st["session"]["events_stored"] == closed["acked"]


def test_kill_9_loses_at_most_the_last_flush_and_shows_crashed(writer, short_dir):
    w = writer()
    acked = w.read_until(lambda m: m.get("acked", 0) >= 10 * BATCH)["acked"]
    w.proc.kill()
    w.proc.wait()
    db = short_dir / "w.duckdb"
    # read-only first, as `ingero status` does: the session still says running, its tracer is dead
    ro = Store.open(db, read_only=True)
    n = ro.con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    st = collect_status(ro.con)
    ro.close()
    # everything acknowledged survived; at most the one batch in flight beyond it
    assert acked <= n <= acked + BATCH
    assert st["session"]["status"] == "crashed" and st["running"] is False
    assert "CRASHED" in format_status(st)[0]
    # heartbeat: the last flush was at most ~one flush interval before the kill
    assert st["session"]["heartbeat_age_s"] < 5
    store = Store.open(db)
    assert store.mark_crashed_sessions() == 1
    assert store.con.execute("SELECT status FROM sessions").fetchall() == [("crashed",)]
    store.close()


def test_a_new_tracer_after_a_crash_replaces_the_stale_socket(writer, short_dir):
    w = writer("--serve")
    w.read_until(lambda m: m.get("acked", 0) >= BATCH)
    w.proc.kill()
    w.proc.wait()
    assert (short_dir / "w.sock").exists()  # left behind by kill -9
    w2 = writer("--serve")
    w2.read_until(lambda m: m.get("acked", 0) >= BATCH)
    st = client.status(socket_path=short_dir / "w.sock")
    assert st["session"]["tracer_pid"] == w2.proc.pid and st["session"]["session_id"] == 2
