"""Asking a running tracer: SQL, status, explain, over its Unix socket.

`ingero query` / `explain` / `status` first open the DB file read-only; when
it is locked by a tracer (store.db.DatabaseLocked) they come here instead,
through daemon.access.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import stat
from pathlib import Path
from typing import Any

from ingero.daemon import protocol
from ingero.daemon.server import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TIMEOUT_S,
    ROOT_SOCKET_DIR,
    SOCKET_NAME,
    default_socket_path,
)
from ingero.errors import IngeroError
from ingero.host import GROUP

# Connecting is local; waiting for the answer gets the query's own time limit plus this.
CONNECT_TIMEOUT_S = 2.0
REPLY_SLACK_S = 10.0
# A "busy" reply (or a full listen backlog, EAGAIN) is retried with exponential
# backoff and jitter, for up to BUSY_RETRY_S in all.
BUSY_RETRY_S = 60.0
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 2.0


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


class SocketDenied(IngeroError):
    """A tracer listens there, but this user may not talk to it."""


def _name(lookup: Any, key: int) -> str:
    try:
        return lookup(key)[0]
    except KeyError:
        return str(key)


def permission_error(path: Path) -> SocketDenied:
    """Which socket, whose, and the exact command that grants access."""
    try:
        st = path.stat()
        owner, group = _name(pwd.getpwuid, st.st_uid), _name(grp.getgrgid, st.st_gid)
        whose = f"owner {owner}, group {group}, mode {stat.S_IMODE(st.st_mode):04o}"
    except OSError:
        owner, group, whose = "?", "?", "not readable"
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        me = str(os.geteuid())
    try:
        grp.getgrnam(GROUP)
        grant = f"`sudo usermod -aG {GROUP} {me}` then log in again"
    except KeyError:  # the tracer could not offer the group: create it, restart the tracer
        grant = (f"`sudo groupadd {GROUP} && sudo usermod -aG {GROUP} {me}`, restart the tracer, then log in "
                 "again")
    return SocketDenied(f"permission denied on the tracer's socket {path} ({whose}) for user {me}",
                        f"{grant}; or run the command with sudo")


def find_socket(db_path: Path | str | None = None, *, denied: list[SocketDenied] | None = None) -> Path | None:
    """The socket of a running tracer, or None.

    With ``db_path``, only a tracer writing that database file counts (asked via status),
    so a query about one file is never answered from another.  Sockets that refuse this
    user are appended to ``denied`` (the one named for ``db_path`` first).
    """
    from ingero.daemon.server import socket_name

    want = socket_name(db_path) if db_path is not None else SOCKET_NAME
    for p in candidate_sockets():
        if not _is_socket(p):
            continue
        if db_path is None:
            return p
        try:
            st = status(socket_path=p)
        except SocketDenied as exc:
            if denied is not None:
                denied.insert(0, exc) if p.name == want else denied.append(exc)
            continue
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


class _Busy(Exception):
    pass


def request(req: dict[str, Any], *, socket_path: Path | str | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S, retry_s: float = BUSY_RETRY_S) -> dict[str, Any]:
    """Send one request and return the decoded reply; a failed reply raises IngeroError.
    While the tracer says it is busy, retry with backoff for up to ``retry_s``."""
    import random
    import time

    path = Path(socket_path) if socket_path is not None else (find_socket() or default_socket_path())
    give_up = time.monotonic() + retry_s
    wait = BACKOFF_FIRST_S
    while True:
        try:
            return _request_once(req, path, timeout_s)
        except _Busy as busy:
            if time.monotonic() + wait > give_up:
                reply = busy.args[0]
                raise IngeroError(f"{reply.get('error') or 'the tracer is busy'} (still busy after {retry_s:.0f} s)",
                                  "retry later") from None
            time.sleep(wait * random.uniform(0.5, 1.0))
            wait = min(wait * 2, BACKOFF_MAX_S)


def _request_once(req: dict[str, Any], path: Path, timeout_s: float) -> dict[str, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        try:
            sock.connect(str(path))
        except FileNotFoundError:
            raise IngeroError(f"no ingero tracer is running (no socket at {path})",
                              "start one with `sudo ingero trace`, or query the DB file directly") from None
        except PermissionError:
            raise permission_error(path) from None
        except BlockingIOError:  # EAGAIN: the listen backlog is full, the tracer is alive
            raise _Busy({"error": "busy: the tracer's connection queue is full"}) from None
        except OSError as exc:
            raise IngeroError(f"cannot reach the tracer at {path}: {exc.strerror or exc}",
                              "it may have exited; `ingero status` tells") from None
        sock.settimeout(timeout_s + REPLY_SLACK_S)
        try:
            try:
                protocol.send(sock, req)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered early (busy, permission) and closed: read that answer
            reply = protocol.recv(sock, protocol.MAX_RESPONSE_BYTES)
        except (OSError, protocol.ProtocolError) as exc:
            raise IngeroError(f"the tracer at {path} did not answer: {exc}",
                              "it may be stopping; retry, or check `ingero status`") from None
    finally:
        sock.close()
    if not reply.get("ok") and reply.get("busy"):
        raise _Busy(reply)
    if not reply.get("ok") and str(reply.get("error", "")).startswith("permission denied"):
        raise SocketDenied(reply["error"], reply.get("hint"))
    if not reply.get("ok"):
        raise IngeroError(reply.get("error") or "the tracer refused the request", reply.get("hint"))
    return reply


def query_reply(sql: str, *, socket_path: Path | str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int | None = None) -> dict[str, Any]:
    """The whole SQL reply: columns, types, rows, truncated, elapsed_s (``max_bytes``: a smaller
    reply cap than the server's)."""
    req: dict[str, Any] = {"sql": sql, "max_rows": max_rows, "timeout_s": timeout_s}
    if max_bytes is not None:
        req["max_bytes"] = max_bytes
    return request(req, socket_path=socket_path, timeout_s=timeout_s)


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
