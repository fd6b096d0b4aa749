"""The query server a running tracer hosts, so its database stays queryable.

DuckDB lets one process open a file for writing and then nobody else may
open it, not even read-only.  While `ingero trace` runs, `ingero query`,
`explain` and `status` therefore ask the tracer over a local Unix socket and
the tracer answers on cursors of its own connection (a DuckDB cursor is a
separate connection to the same database, safe to use from another thread).

Who may ask: the socket is 0660 root:ingero when that group exists (else
0600 root); under sudo its owner is the invoking user (the DB is theirs too);
every peer's credentials are checked again (SO_PEERCRED).  What
they may ask: see sqlguard.py; SQL runs read-only, with no file or network
access, under a time limit and a row limit.

Integration (session.py)::

    server = QueryServer(store.con.cursor, socket_path=None)   # after the schema is applied
    server.start()        # locks the database configuration down (see lock_down)
    ...                   # run loop; writer keeps using store.con on its own thread
    server.stop()
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import socket
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import duckdb

from ingero.daemon import protocol
from ingero.daemon.sqlguard import check_sql
from ingero.daemon.state import collect_status
from ingero.errors import IngeroError, first_line
from ingero.host import GROUP, group_gid, invoking_user
from ingero.store import query as caps
from ingero.store import valuecap

SOCKET_NAME = "ingero.sock"
ROOT_SOCKET_DIR = Path("/run/ingero")
DEFAULT_GROUP = GROUP

# Client-facing limits: store.query's caps, the same for every path that runs a user's SQL
# (rows, time, reply and row bytes, DuckDB memory and threads); the per-request ones are
# checked by protocol.decode_request, with the CLI's parsers.
DEFAULT_MAX_ROWS = caps.DEFAULT_MAX_ROWS
MAX_ROWS_CAP = caps.MAX_ROWS_CAP
DEFAULT_TIMEOUT_S = caps.DEFAULT_TIMEOUT_S
MAX_TIMEOUT_S = caps.MAX_TIMEOUT_S
# Queries run at once; each uses DuckDB worker threads too, and the tracer
# must keep up on 2 cores.  Further clients wait up to BUSY_WAIT_S for a turn;
# beyond MAX_PENDING connections they are told "busy, retry" at once (like
# PostgreSQL's "too many clients"), and the client retries with backoff.
MAX_CLIENTS = 4
MAX_PENDING = 32
BUSY_WAIT_S = 10.0
# The accept loop never waits on a client (each goes to a thread, or gets the
# busy reply), so the backlog only has to hold a burst of connects: 200 clients
# connecting at once got EAGAIN with 16.  The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 512
# A client has this long to send its request (stops idle connections pinning a slot).
REQUEST_READ_TIMEOUT_S = 5.0
# How often the accept loop wakes to notice stop().
ACCEPT_POLL_S = 0.5
# stop() waits this long for interrupted queries to roll back before the writer's CHECKPOINT.
STOP_WAIT_S = 5.0
STOPPING = "interrupted: tracer stopping"

# DuckDB memory for the whole tracer process (writer + queries): store.query's cap.
DEFAULT_MEMORY_LIMIT_BYTES = caps.MEMORY_LIMIT_BYTES


def socket_name(db_path: Path | str | None = None) -> str:
    """ingero.sock for the default database; ingero-<hash>.sock for any other.

    One socket per database lets two tracers writing two files run side by
    side; clients find the one serving their file by asking each (status).
    """
    if db_path is None:
        return SOCKET_NAME
    from ingero.store.db import default_db_path

    real = os.path.realpath(db_path)
    if real == os.path.realpath(default_db_path()):
        return SOCKET_NAME
    return f"ingero-{hashlib.sha256(real.encode()).hexdigest()[:12]}.sock"


def socket_dirs() -> list[Path]:
    """Where sockets live: /run/ingero for root, else $XDG_RUNTIME_DIR/ingero or ~/.ingero."""
    if os.geteuid() == 0:
        return [ROOT_SOCKET_DIR]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return [Path(xdg) / "ingero"]
    return [Path.home() / ".ingero"]


def default_socket_path(db_path: Path | str | None = None) -> Path:
    """INGERO_SOCKET, else <socket dir>/<socket_name(db_path)>."""
    env = os.environ.get("INGERO_SOCKET")
    if env:
        return Path(env).expanduser()
    return socket_dirs()[0] / socket_name(db_path)


# Bound memory, cut off files/network/extensions and lock the configuration, for the whole DB
# instance (runtime.py and the benchmarks call it on the tracer's connection).
lock_down = caps.lock_down



def _explain_op(con: duckdb.DuckDBPyConnection, args: dict[str, Any]) -> dict[str, Any]:
    """Run the rule engine on the tracer's data (args checked by protocol.decode_request)."""
    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain
    from ingero.render.json import explain_payload

    return explain_payload(explain(con, Options(**args)))


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _peer_allowed(conn: socket.socket, gid: int | None, owner_uid: int) -> bool:
    """Root, our own user, the socket's owner (sudo's user), or a member of the group; checked again
    behind the file mode."""
    pid, uid, peer_gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    if uid in (0, os.geteuid(), owner_uid):
        return True
    if gid is None:
        return False
    if peer_gid == gid:
        return True
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    return name in grp.getgrgid(gid).gr_mem


class QueryServer:
    """Serves status, explain and read-only SQL from the tracer's database over a Unix socket.

    ``con_factory()`` is called once, in ``start()`` on the caller's thread, and must return a
    DuckDB connection to the tracer's database that is not used by the writer (pass
    ``store.con.cursor``); every request then gets its own ``.cursor()`` of it.
    """

    def __init__(
        self,
        con_factory: Callable[[], duckdb.DuckDBPyConnection],
        socket_path: Path | str | None = None,
        *,
        group: str | None = DEFAULT_GROUP,
        lock: bool = True,
        memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
        ops: dict[str, Callable[[duckdb.DuckDBPyConnection, dict[str, Any]], Any]] | None = None,
    ) -> None:
        self._con_factory = con_factory
        self.socket_path = Path(socket_path) if socket_path is not None else default_socket_path()
        self.group = group
        self._lock = lock
        self._memory_limit = memory_limit_bytes
        self._ops: dict[str, Callable[[duckdb.DuckDBPyConnection, dict[str, Any]], Any]] = {
            "status": lambda con, args: collect_status(con, tracer_pid=os.getpid()),
            "explain": _explain_op,
        }
        self._ops.update(ops or {})
        self._base: duckdb.DuckDBPyConnection | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._active: set[duckdb.DuckDBPyConnection] = set()
        self._active_lock = threading.Lock()
        self._idle = threading.Condition(self._active_lock)  # notified when _in_flight drops
        self._in_flight = 0  # requests being answered (a read transaction may be open)
        self._gid: int | None = None
        self._inode: int | None = None
        self._owner_uid = 0
        self.requests = 0  # served requests, for tests and status

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> "QueryServer":
        self._base = self._con_factory()
        if self._lock:
            lock_down(self._base, memory_limit_bytes=self._memory_limit)
        self._gid = group_gid(self.group)
        self._owner_uid = self._socket_owner()[0]
        self._sock = self._bind()
        self._thread = threading.Thread(target=self._accept_loop, name="ingero-query-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop in order: no new connections, interrupt the queries in flight (they reply
        STOPPING), wait for their read transactions to end, then close.  Afterwards the
        writer's CHECKPOINT has no other transaction to wait for.  Idempotent."""
        self._stopping.set()
        if self._sock is not None:
            # shutdown() wakes the blocked accept() now; a client still connecting is refused
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=ACCEPT_POLL_S * 4)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        try:
            if self._inode is not None and self.socket_path.lstat().st_ino == self._inode:
                self.socket_path.unlink()
        except FileNotFoundError:
            pass
        deadline = time.monotonic() + STOP_WAIT_S
        with self._idle:
            while self._in_flight and time.monotonic() < deadline:
                for cur in list(self._active):
                    try:
                        cur.interrupt()
                    except duckdb.Error:
                        pass
                self._idle.wait(0.05)
        if self._base is not None:
            try:
                self._base.close()
            except duckdb.Error:
                pass
            self._base = None

    def __enter__(self) -> "QueryServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _bind(self) -> socket.socket:
        path = self.socket_path
        if len(os.fsencode(str(path))) >= 108:
            raise IngeroError(f"socket path {path} is too long for a Unix socket",
                              "set INGERO_SOCKET to a shorter path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IngeroError(f"cannot create {path.parent}: {exc.strerror}",
                              "set INGERO_SOCKET to a writable path") from None
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise IngeroError(f"{path} exists and is not a socket", "remove it or set INGERO_SOCKET")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left by a tracer that died
            else:
                raise IngeroError(f"another ingero tracer is serving queries at {path}",
                                  "stop it first (`ingero status` shows it) or set INGERO_SOCKET")
            finally:
                probe.close()
        # Bind under a temporary name, restrict it, then rename: the final path never
        # exists with looser permissions, and no process-wide umask change is needed.
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        if tmp.exists():
            tmp.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(tmp))
            uid, mode = self._socket_owner()
            if os.geteuid() == 0:
                os.chown(tmp, uid, self._gid if self._gid is not None else 0)
            os.chmod(tmp, mode)
            sock.listen(LISTEN_BACKLOG)
            sock.settimeout(ACCEPT_POLL_S)
            os.rename(tmp, path)
        except OSError as exc:
            sock.close()
            tmp.unlink(missing_ok=True)
            raise IngeroError(f"cannot serve queries at {path}: {exc.strerror or exc}",
                              "set INGERO_SOCKET to a writable path") from None
        self._inode = path.lstat().st_ino
        return sock

    def _socket_owner(self) -> tuple[int, int]:
        """(owner uid, mode): root (or, under sudo, the invoking user: it is their DB) and the group."""
        uid = os.geteuid()
        if uid == 0:
            user = invoking_user()
            uid = user.pw_uid if user is not None else 0
        return uid, 0o660 if self._gid is not None else 0o600

    # -- serving ---------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)
                continue
            if self._stopping.is_set():
                self._reply_and_close(conn, _stopping_reply())
                return
            if not self._pending.acquire(blocking=False):
                self._reply_and_close(conn, _busy_reply(f"{MAX_PENDING} connections already waiting"))
                continue
            threading.Thread(target=self._serve_one, args=(conn,), name="ingero-query", daemon=True).start()

    def _reply_and_close(self, conn: socket.socket, reply: dict[str, Any]) -> None:
        try:
            conn.settimeout(REQUEST_READ_TIMEOUT_S)
            protocol.send(conn, reply)
            # a request we did not read, left unread, would turn the close into a reset that
            # the client may see before our reply: discard what has arrived
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(1 << 20, socket.MSG_DONTWAIT):
                pass
        except OSError:
            pass
        finally:
            conn.close()

    def _serve_one(self, conn: socket.socket) -> None:
        """Exactly one reply per connection, whatever its bytes; a bug still replies, then raises
        (its traceback goes to stderr through threading's excepthook)."""
        replied = False
        try:
            if not _peer_allowed(conn, self._gid, self._owner_uid):
                peer = _user_name(_UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                _UCRED.size))[1])
                owner = _user_name(self._owner_uid)
                if self._gid is not None:
                    hint = (f"`sudo usermod -aG {self.group} {peer}` then log in again; or run as root "
                            "(sudo)")
                else:
                    hint = f"run as root (sudo) or as the user who started the tracer ({owner})"
                self._reply_and_close(conn, {
                    "ok": False, "hint": hint,
                    "error": f"permission denied on the tracer's socket {self.socket_path} (owner {owner}"
                             + (f", group {self.group}" if self._gid is not None else "") + f") for user {peer}"})
                replied = True
                return
            conn.settimeout(REQUEST_READ_TIMEOUT_S)
            try:
                raw = protocol.recv(conn, protocol.MAX_REQUEST_BYTES)
            except (protocol.ProtocolError, OSError, struct.error) as exc:
                self._reply_and_close(conn, {"ok": False, "error": f"bad request: {exc}"})
                replied = True
                return
            if not self._slots.acquire(timeout=BUSY_WAIT_S):
                self._reply_and_close(conn, _busy_reply(f"{MAX_CLIENTS} queries running"))
                replied = True
                return
            try:
                reply = self.handle(raw)
            finally:
                self._slots.release()  # the DuckDB work is done; sending needs no slot
            data = protocol.encode(reply)
            del reply
            conn.settimeout(None)  # a big answer may take a slow reader a while
            replied = True
            try:
                conn.sendall(data)
            except OSError:
                pass
        except BaseException:
            if not replied:
                self._reply_and_close(conn, {"ok": False, "error": "internal error in the tracer's query server",
                                             "hint": "the tracer's stderr has the traceback; please report it"})
            raise
        finally:
            conn.close()
            self._pending.release()

    def handle(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Answer one decoded message (also used directly by tests)."""
        self.requests += 1
        try:
            req = protocol.decode_request(raw, ops=tuple(self._ops))
            if req.op == "sql":
                return self._run_sql(req)
            return {"ok": True, "result": self._in_read_txn(lambda cur: self._ops[req.op](cur, req.args),
                                                            req.timeout_s)}
        except protocol.BadRequest as exc:
            return {"ok": False, "error": exc.message, "hint": exc.hint, "fields": exc.fields}
        except IngeroError as exc:
            return {"ok": False, "error": exc.message, "hint": exc.hint}
        except duckdb.InterruptException:
            if self._stopping.is_set():
                return _stopping_reply()
            return {"ok": False, "error": "interrupted: time limit reached",
                    "hint": "narrow the query (WHERE timestamp > ...) or pass a larger --timeout (at most "
                            f"{MAX_TIMEOUT_S:.0f} s)"}
        except duckdb.PermissionException as exc:
            return {"ok": False, "error": f"refused: {first_line(exc)}",
                    "hint": "queries cannot read files, the network or extensions"}
        except duckdb.Error as exc:
            too_big = valuecap.refusal(first_line(exc), caps.MAX_ROW_BYTES)
            if too_big is not None:
                return {"ok": False, "error": too_big, "hint": "build smaller values, or aggregate in SQL"}
            return {"ok": False, "error": first_line(exc)}

    def _in_read_txn(self, fn: Callable[[duckdb.DuckDBPyConnection], Any], timeout_s: float) -> Any:
        with self._active_lock:
            if self._base is None or self._stopping.is_set():
                raise IngeroError(STOPPING, "retry after it exits; the database is then readable directly")
            cur = self._base.cursor()
            self._active.add(cur)
            self._in_flight += 1
        timer = threading.Timer(timeout_s, cur.interrupt)
        timer.daemon = True
        try:
            cur.execute("BEGIN TRANSACTION READ ONLY")
            timer.start()
            return fn(cur)
        finally:
            timer.cancel()
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass
            try:
                cur.close()
            except duckdb.Error:
                pass
            with self._idle:
                self._active.discard(cur)
                self._in_flight -= 1
                self._idle.notify_all()

    def _run_sql(self, req: protocol.Request) -> dict[str, Any]:
        t0 = time.monotonic()

        def run(cur: duckdb.DuckDBPyConnection) -> caps.QueryResult:
            return caps.fetch_bounded(cur, check_sql(cur, req.sql or ""), req.max_rows, req.max_bytes)

        res = self._in_read_txn(run, req.timeout_s)
        return {"ok": True, "columns": res.columns, "types": res.types, "rows": res.rows,
                "truncated": res.truncated, "elapsed_s": round(time.monotonic() - t0, 6)}


def _busy_reply(why: str) -> dict[str, Any]:
    return {"ok": False, "busy": True, "error": f"busy: the tracer is serving other queries ({why})",
            "hint": "retry in a moment"}


def _stopping_reply() -> dict[str, Any]:
    return {"ok": False, "error": STOPPING, "hint": "retry after it exits; the database is then readable directly"}
