"""Open the DB, or ask the running tracer: the one way query, explain and status read a database.

DuckDB lets one process write a file and nobody else open it.  So a reader
opens the file read-only; when that raises ``DatabaseLocked`` (or the file is
not readable by this user: a root tracer's DB), the tracer writing it answers
over its socket instead.  A file read runs under the same time limit as a
socket query, and Ctrl-C interrupts it within a second: DuckDB holds the main
thread inside C while it runs, so the work happens on a worker thread and the
main thread waits in short steps, where Python delivers the signal (and
interrupts again until the statement stops: see run_interruptible).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, TypeVar

import duckdb

from ingero.daemon import client, protocol
from ingero.errors import IngeroError
from ingero.store.db import DatabaseLocked, DatabaseUnreadable, Store, check_db_path, open_for_user_sql

T = TypeVar("T")

# How often the waiting main thread wakes to take a Ctrl-C (and to interrupt again).
_WAIT_STEP_S = 0.1
# After Ctrl-C, how long the interrupted statement may take to stop before the command gives up on it.
CTRL_C_GRACE_S = 2.0
# Set when a statement kept running through Ctrl-C's grace: nothing may wait for it any more.
STUCK = threading.Event()


def read(path: Path, *, local: Callable[[duckdb.DuckDBPyConnection], T], remote: Callable[[Path], T],
         timeout_s: float = protocol.DEFAULT_TIMEOUT_S, user_sql: bool = False) -> T:
    """``local(con)`` on the file opened read-only (``user_sql``: the locked-down connection for
    SQL typed by a user), under ``timeout_s``; or ``remote(socket)`` when a tracer holds the file."""
    try:
        con = open_for_user_sql(path) if user_sql else Store.open(path, read_only=True).con
    except (DatabaseLocked, DatabaseUnreadable) as exc:
        return remote(tracer_socket(path, exc))
    try:
        return run_interruptible(con, local, timeout_s)
    finally:
        if not STUCK.is_set():  # closing waits for the running statement: never for one that ignores interrupts
            try:
                con.close()
            except duckdb.Error:
                pass


def tracer_socket(path: Path, why: IngeroError) -> Path:
    """The socket of the tracer writing ``path``; a socket we may not use is named with the
    command that grants access; no tracer at all re-raises ``why`` with what to do."""
    denied: list[client.SocketDenied] = []
    sock = client.find_socket(path, denied=denied)
    if sock is not None:
        return sock
    if denied:
        raise denied[0]
    if isinstance(why, DatabaseLocked):
        raise IngeroError(f"database {path} is locked by another process and no ingero tracer serving it "
                          "was found", "wait for that process to finish, or pass another --db") from None
    raise why


@contextmanager
def _sigint_heard() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt while a read waits, even when it was inherited ignored.

    A shell without job control starts `cmd &` with SIGINT ignored, and Python then never raises
    KeyboardInterrupt: `kill -INT` of a runaway `ingero query` did nothing (it ran on past 3 s).
    A read has nothing to protect from SIGINT; the previous disposition comes back afterwards.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_interruptible(con: Any, fn: Callable[[Any], T], timeout_s: float) -> T:
    """``fn(con)`` on a worker thread: interrupted after ``timeout_s`` (one line naming the
    limit) or on Ctrl-C (KeyboardInterrupt within CTRL_C_GRACE_S).

    DuckDB drops an interrupt that lands where no statement checks for it (before one starts,
    between two), so the waiting thread interrupts again at every step until the worker is
    done.  A worker still running CTRL_C_GRACE_S after Ctrl-C sets ``STUCK``: its connection
    cannot be closed (a close waits for the statement), and the command line exits without
    waiting for it (cli.main).
    """
    out: dict[str, Any] = {}
    # Not worker.is_alive(): a Ctrl-C inside Thread.join makes it False for a thread still
    # running (Python 3.11's clean-up for bpo-45274), and the close after it then waits.
    done = threading.Event()
    timed_out = False

    def work() -> None:
        try:
            out["value"] = fn(con)
        except BaseException as exc:  # handed to the waiting thread, raised there
            out["error"] = exc
        finally:
            done.set()

    deadline = time.monotonic() + timeout_s
    threading.Thread(target=work, name="ingero-read", daemon=True).start()
    try:
        with _sigint_heard():
            while not done.wait(_WAIT_STEP_S):
                if time.monotonic() >= deadline:
                    timed_out = True
                    con.interrupt()
    except KeyboardInterrupt:
        give_up = time.monotonic() + CTRL_C_GRACE_S
        try:
            while not done.is_set() and time.monotonic() < give_up:
                con.interrupt()
                done.wait(_WAIT_STEP_S)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting for the statement
        if not done.is_set():
            STUCK.set()
        raise
    err = out.get("error")
    if err is not None:
        if timed_out and isinstance(err, duckdb.InterruptException):
            raise IngeroError(f"interrupted: time limit of {timeout_s:g} s reached",
                              f"narrow the query, or pass --timeout (at most {protocol.MAX_TIMEOUT_S:.0f} s)") from None
        raise err
    return out["value"]


def current_status(db_path: Path | str) -> dict[str, Any]:
    """For `ingero status`: the running tracer's status when one writes ``db_path``, else the file's last
    session (daemon.access chooses); a tracer whose socket refuses us is named, with how to get access."""
    from ingero.daemon.state import collect_status

    db_path = Path(db_path)
    if not check_db_path(db_path):  # a FIFO or a device is refused here, never opened
        denied: list[client.SocketDenied] = []
        if client.find_socket(db_path, denied=denied) is None and denied:
            raise denied[0]
        return {"running": False, "source": "none", "db_path": str(db_path), "db_bytes": 0, "wal_bytes": 0,
                "session": None}

    def remote(sock: Path) -> dict[str, Any]:
        return {**client.status(socket_path=sock), "socket": str(sock)}

    return read(db_path, local=collect_status, remote=remote)
