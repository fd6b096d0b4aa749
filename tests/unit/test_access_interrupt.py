"""daemon.access.run_interruptible: a time limit and Ctrl-C that hold even when DuckDB drops an
interrupt, and a command line that ends at once when a statement ignores them (CI run 2 of
efc26e9: `ingero query` of a runaway recursive CTE did not exit within 60 s of SIGINT)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import click
import duckdb
import pytest

from ingero import cli
from ingero.daemon import access
from ingero.errors import IngeroError


class Statement:
    """A connection whose statement stops only at its ``stop_at``-th interrupt (0: never)."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at
        self.interrupts = 0
        self.stopped = threading.Event()

    def interrupt(self) -> None:
        self.interrupts += 1
        if self.stop_at and self.interrupts >= self.stop_at:
            self.stopped.set()

    def run(self, _con) -> str:
        if not self.stopped.wait(30):  # a regression fails the test instead of hanging it
            return "never interrupted"
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")


def aborted(*_a, **_kw):
    """click's main after a Ctrl-C (standalone_mode=False turns KeyboardInterrupt into Abort)."""
    raise click.exceptions.Abort()


@pytest.fixture(autouse=True)
def not_stuck():
    access.STUCK.clear()
    yield
    access.STUCK.clear()


def test_the_time_limit_interrupts_again_until_the_statement_stops():
    st = Statement(stop_at=3)  # the first two interrupts are lost
    with pytest.raises(IngeroError, match=r"^interrupted: time limit of 0\.2 s reached"):
        access.run_interruptible(st, st.run, 0.2)
    assert st.interrupts == 3
    assert not access.STUCK.is_set()


# Ctrl-C is a KeyboardInterrupt in the main thread, and pytest-xdist runs tests on another
# thread: these two run in a fresh interpreter, where the code under test is on the main thread.
CTRL_C = """
import _thread, json, signal, sys, threading, time
# Ctrl-C as a terminal delivers it: a parent started in the background (CI's shell) leaves SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
from test_access_interrupt import Statement
from ingero.daemon import access
access.CTRL_C_GRACE_S = {grace}
st = Statement(stop_at={stop_at})
threading.Timer(0.2, _thread.interrupt_main).start()
t0 = time.monotonic()
try:
    access.run_interruptible(st, st.run, 300)
    raised = None
except KeyboardInterrupt:
    raised = "KeyboardInterrupt"
print(json.dumps({{"raised": raised, "interrupts": st.interrupts, "stuck": access.STUCK.is_set(),
                  "after_s": time.monotonic() - t0}}))
st.stopped.set()
"""


def _ctrl_c(stop_at: int, grace: float) -> dict:
    code = CTRL_C.format(tests=str(Path(__file__).parent), grace=grace, stop_at=stop_at)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_ctrl_c_interrupts_again_until_the_statement_stops():
    r = _ctrl_c(stop_at=4, grace=2.0)
    assert (r["raised"], r["interrupts"], r["stuck"]) == ("KeyboardInterrupt", 4, False)


def test_a_statement_that_ignores_ctrl_c_is_given_up_on_after_the_grace():
    r = _ctrl_c(stop_at=0, grace=0.5)
    assert (r["raised"], r["stuck"]) == ("KeyboardInterrupt", True)
    assert r["interrupts"] >= 3  # every 0.1 s through the grace
    assert 0.5 <= r["after_s"] - 0.2 < 3.0


def test_the_command_line_exits_at_once_when_a_statement_is_stuck(monkeypatch, capsys):
    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", fake_exit)

    monkeypatch.setattr(cli.cli, "main", aborted)
    access.STUCK.set()
    with pytest.raises(SystemExit):
        cli.main(["query", "SELECT 1"])
    assert exits == [130]
    assert capsys.readouterr().err.strip() == "ingero: aborted"


def test_the_command_line_returns_normally_when_nothing_is_stuck(monkeypatch, capsys):
    monkeypatch.setattr(cli.cli, "main", aborted)
    assert cli.main(["query", "SELECT 1"]) == 130
    assert capsys.readouterr().err.strip() == "ingero: aborted"


# issue 41.12: `ingero query ... &` from a script inherits SIGINT ignored; `kill -INT` did nothing
INHERITED_IGNORE = """
import json, os, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell without job control starts `cmd &`
sys.path.insert(0, {tests!r})
from test_access_interrupt import Statement
from ingero.daemon import access
st = Statement(stop_at=1)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    access.run_interruptible(st, st.run, 300)
    raised = None
except KeyboardInterrupt:
    raised = "KeyboardInterrupt"
print(json.dumps({{"raised": raised, "interrupts": st.interrupts,
                  "after": "ignored" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "other"}}))
"""


def test_sigint_is_heard_by_a_read_even_when_it_was_inherited_ignored():
    code = INHERITED_IGNORE.format(tests=str(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    # heard, the statement interrupted, and the inherited disposition back afterwards
    assert json.loads(out.stdout) == {"raised": "KeyboardInterrupt", "interrupts": 1, "after": "ignored"}
