"""Asking a running tracer: SQL, status, explain, over its Unix socket.

`ingero query` / `explain` first open the DB file read-only; when DuckDB says
another process holds it (``is_lock_error``), they come here instead.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import duckdb

from ingero.daemon import protocol
from ingero.daemon.server import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TIMEOUT_S,
    ROOT_SOCKET_DIR,
    SOCKET_NAME,
    default_socket_path,
)
from ingero.errors import IngeroError

# Connecting is local; waiting for the answer gets the query's own time limit plus this.
CONNECT_TIMEOUT_S = 2.0
REPLY_SLACK_S = 10.0


def candidate_sockets() -> list[Path]:
    """Where a tracer may listen, most specific first (INGERO_SOCKET, root's, the user's)."""
    out: list[Path] = []
    env = os.environ.get("INGERO_SOCKET")
    if env:
        out.append(Path(env).expanduser())
    dirs = [ROOT_SOCKET_DIR]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        dirs.append(Path(xdg) / "ingero")
    dirs.append(Path.home() / ".ingero")
    for d in dirs:
        out.append(d / SOCKET_NAME)
        try:  # tracers writing other databases: ingero-<hash>.sock (server.socket_name)
            out.extend(sorted(d.glob("ingero-*.sock")))
        except OSError:
            pass
    seen: set[Path] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def _is_socket(p: Path) -> bool:
    try:
        return stat.S_ISSOCK(p.stat().st_mode)
    except OSError:
        return False


def find_socket(db_path: Path | str | None = None) -> Path | None:
    """The socket of a running tracer, or None.

    With ``db_path``, only a tracer writing that database file counts (asked via status),
    so a query about one file is never answered from another.
    """
    for p in candidate_sockets():
        if not _is_socket(p):
            continue
        if db_path is None:
            return p
        try:
            st = status(socket_path=p)
        except IngeroError:
            continue
        served = st.get("db_path")
        if served and _same_file(served, db_path):
            return p
    return None


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def request(req: dict[str, Any], *, socket_path: Path | str | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Send one request and return the decoded reply; a failed reply raises IngeroError."""
    path = Path(socket_path) if socket_path is not None else (find_socket() or default_socket_path())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        try:
            sock.connect(str(path))
        except FileNotFoundError:
            raise IngeroError(f"no ingero tracer is running (no socket at {path})",
                              "start one with `sudo ingero trace`, or query the DB file directly") from None
        except PermissionError:
            raise IngeroError(f"permission denied on {path}",
                              "run as root or add yourself to the 'ingero' group (then log in again)") from None
        except OSError as exc:
            raise IngeroError(f"cannot reach the tracer at {path}: {exc.strerror or exc}",
                              "it may have exited; `ingero status` tells") from None
        sock.settimeout(timeout_s + REPLY_SLACK_S)
        try:
            try:
                protocol.send(sock, req)
            except BrokenPipeError:
                pass  # the server answered early (busy, permission) and closed: read that answer
            reply = protocol.recv(sock, protocol.MAX_RESPONSE_BYTES)
        except (OSError, protocol.ProtocolError) as exc:
            raise IngeroError(f"the tracer at {path} did not answer: {exc}",
                              "it may be stopping; retry, or check `ingero status`") from None
    finally:
        sock.close()
    if not reply.get("ok"):
        raise IngeroError(reply.get("error") or "the tracer refused the request", reply.get("hint"))
    return reply


def query_reply(sql: str, *, socket_path: Path | str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """The whole SQL reply: columns, types, rows, truncated, elapsed_s."""
    return request({"sql": sql, "max_rows": max_rows, "timeout_s": timeout_s},
                   socket_path=socket_path, timeout_s=timeout_s)


def query(sql: str, *, socket_path: Path | str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
          timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[list[str], list[list[Any]]]:
    """Run read-only SQL in the running tracer: (column names, rows as lists)."""
    reply = query_reply(sql, socket_path=socket_path, max_rows=max_rows, timeout_s=timeout_s)
    return reply["columns"], reply["rows"]


def status(*, socket_path: Path | str | None = None) -> dict[str, Any]:
    """The running tracer's status (state.collect_status)."""
    return request({"op": "status"}, socket_path=socket_path, timeout_s=DEFAULT_TIMEOUT_S)["result"]


def explain(*, socket_path: Path | str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
            **args: Any) -> dict[str, Any]:
    """Run `explain` inside the running tracer.

    ``args`` are the fields of ingero.analyze.context.Options (session, since_s, from_ns, to_ns,
    pids as a list, window_s, stack).  Returns {"json": <render.json.to_dict(report)>,
    "text": <what render.terminal.write prints>}.
    """
    return request({"op": "explain", "args": args, "timeout_s": timeout_s},
                   socket_path=socket_path, timeout_s=timeout_s)["result"]


def is_lock_error(exc: BaseException) -> bool:
    """True when opening the DB failed because another process (a running tracer) holds it."""
    if isinstance(exc, IngeroError):
        return "locked by another process" in exc.message
    if isinstance(exc, duckdb.Error):
        text = str(exc)
        return "Could not set lock on file" in text or "Conflicting lock is held" in text
    return False


def current_status(db_path: Path | str) -> dict[str, Any]:
    """For `ingero status`: the running tracer's status when one writes ``db_path``, else the file's last session."""
    from ingero.daemon.state import collect_status
    from ingero.store.db import Store

    db_path = Path(db_path)
    sock = find_socket(db_path)
    if sock is not None:
        st = status(socket_path=sock)
        st["socket"] = str(sock)
        return st
    if not db_path.exists():
        return {"running": False, "source": "none", "db_path": str(db_path), "db_bytes": 0, "wal_bytes": 0,
                "session": None}
    try:
        store = Store.open(db_path, read_only=True)
    except IngeroError as exc:
        if is_lock_error(exc):
            raise IngeroError(
                f"a tracer holds {db_path} but its query socket is not reachable from here",
                "run as root or join the 'ingero' group; or set INGERO_SOCKET to the tracer's socket",
            ) from None
        raise
    try:
        return collect_status(store.con)
    finally:
        store.close()
