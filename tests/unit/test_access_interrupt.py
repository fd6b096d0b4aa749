"""daemon.access.run_interruptible: a time limit and Ctrl-C that hold even when DuckDB drops an
interrupt, and a command line that ends at once when a statement ignores them (CI run 2 of
efc26e9: `ingero query` of a runaway recursive CTE did not exit within 60 s of SIGINT)."""

from __future__ import annotations

import _thread
import threading
import time

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
        while not self.stopped.wait(0.01):
            pass
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


def test_ctrl_c_interrupts_again_until_the_statement_stops():
    st = Statement(stop_at=4)
    threading.Timer(0.2, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        access.run_interruptible(st, st.run, 300)
    assert st.interrupts == 4
    assert not access.STUCK.is_set()


def test_a_statement_that_ignores_ctrl_c_is_given_up_on_after_the_grace(monkeypatch):
    monkeypatch.setattr(access, "CTRL_C_GRACE_S", 0.5)
    st = Statement(stop_at=0)
    threading.Timer(0.2, _thread.interrupt_main).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        access.run_interruptible(st, st.run, 300)
    assert 0.5 <= time.monotonic() - t0 < 3.0
    assert access.STUCK.is_set()
    st.stopped.set()  # let the worker thread end


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
