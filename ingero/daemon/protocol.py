"""Wire format between `ingero` clients and the tracer's query server.

One message = 4-byte big-endian length + UTF-8 JSON object.  A connection
carries one request and one response.  Requests:

    {"sql": "...", "max_rows": 10000, "timeout_s": 30, "max_bytes": 67108864}   (the last three optional)
    {"op": "status"}
    {"op": "explain", "args": {...}}

Responses: {"ok": true, "columns": [...], "types": [...], "rows": [[...]],
"truncated": bool, "elapsed_s": float} for SQL, {"ok": true, "result": {...}}
for ops, {"ok": false, "error": "one line", "hint": "..."} on failure.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from ingero import values
from ingero.errors import IngeroError
from ingero.store import query as caps

_HEADER = struct.Struct(">I")

# A request is a query string and a few numbers: 1 MiB is generous.
MAX_REQUEST_BYTES = 1 << 20
# A response is bounded by the server's row cap; this only stops garbage lengths.
MAX_RESPONSE_BYTES = 1 << 30
# A request is an object holding an args object holding a pids list: depth 3.
# Deeper nesting is refused before json.loads, whose recursion a 200 KB request
# of 100,000 nested arrays overflowed (RecursionError, no reply).
MAX_DEPTH = 8

# Per-request limits, applied by decode_request: store.query's caps, the same for every path
# that runs a user's SQL (named here too: the CLI's options and the client read them from here).
DEFAULT_MAX_ROWS = caps.DEFAULT_MAX_ROWS
MAX_ROWS_CAP = caps.MAX_ROWS_CAP
DEFAULT_TIMEOUT_S = caps.DEFAULT_TIMEOUT_S
MAX_TIMEOUT_S = caps.MAX_TIMEOUT_S
MAX_SQL_CHARS = caps.MAX_SQL_CHARS
MAX_REPLY_BYTES = caps.MAX_REPLY_BYTES
MAX_PIDS = 1024


class ProtocolError(Exception):
    """The peer sent something that is not a framed JSON object."""


def encode(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, default=caps.json_default, separators=(",", ":"), allow_nan=True).encode()
    return _HEADER.pack(len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed mid-message")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(encode(obj))


_BRACKETS = bytes.maketrans(b"", b"")
_KEEP = b'[]{}"\\'


def nesting_depth(body: bytes) -> int:
    """The deepest [ / { nesting of a JSON text, brackets inside strings not counted."""
    depth = deepest = 0
    in_str = escaped = False
    for c in body.translate(_BRACKETS, bytes(set(range(256)) - set(_KEEP))):
        if in_str:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def decode(body: bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """One message body -> its JSON object, or ProtocolError (never another exception)."""
    if nesting_depth(body) > max_depth:
        raise ProtocolError(f"nested deeper than {max_depth} levels")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("message is not a JSON object")
    return obj


def recv(sock: socket.socket, max_bytes: int, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > max_bytes:
        raise ProtocolError(f"message of {length} bytes exceeds the limit of {max_bytes}")
    return decode(_recv_exact(sock, length), max_depth)


@dataclass
class Request:
    """A checked request: SQL (with its row and time limits) or an op with its arguments."""

    op: str  # "sql" or an op name
    sql: str | None = None
    max_rows: int = DEFAULT_MAX_ROWS
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_bytes: int = MAX_REPLY_BYTES  # the reply's encoded rows (MCP asks for less)
    args: dict[str, Any] = field(default_factory=dict)


class BadRequest(IngeroError):
    """A request with bad fields: ``fields`` maps each to what is wrong with it."""

    def __init__(self, fields: dict[str, str]):
        super().__init__("bad request: " + "; ".join(f"{k}: {v}" for k, v in fields.items()),
                         "fix the fields named; `ingero query --help` lists the limits")
        self.fields = fields


# explain's arguments (the fields of ingero.analyze.context.Options) -> their parser.
EXPLAIN_ARGS = {
    "session": lambda v: values.parse_count(v, "session"),
    "since_s": lambda v: values.parse_duration(v, "since_s"),
    "from_ns": lambda v: values.parse_time_ns(v, "from_ns"),
    "to_ns": lambda v: values.parse_time_ns(v, "to_ns"),
    "window_s": lambda v: values.parse_window(v, "window_s"),
    "stack": lambda v: _bool(v, "stack"),
    "pids": lambda v: _pids(v),
}


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise values.BadValue(f"bad {what}: expected true or false")
    return v


def _pids(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > MAX_PIDS:
        raise values.BadValue(f"bad pids: expected a list of at most {MAX_PIDS} process ids")
    return tuple(values.parse_count(p, "pid", cap=2**22) for p in v)


def _field(errors: dict[str, str], name: str, parse: Any, value: Any) -> Any:
    try:
        return parse(value)
    except values.BadValue as exc:
        errors[name] = exc.message.removeprefix(f"bad {name}: ")
        return None


def decode_request(obj: Any, ops: Any = ("status", "explain")) -> Request:
    """A decoded JSON message -> Request, or BadRequest naming every bad field; the same
    parsers as the command line (ingero.values), so NaN or a negative limit never passes."""
    if not isinstance(obj, dict):
        raise BadRequest({"request": "not a JSON object"})
    errors: dict[str, str] = {}
    known = {"sql", "op", "args", "max_rows", "timeout_s", "max_bytes"}
    for k in obj:
        if k not in known:
            errors[str(k)[:40]] = f"unknown field (known: {', '.join(sorted(known))})"
    timeout = DEFAULT_TIMEOUT_S
    if obj.get("timeout_s") is not None:
        timeout = _field(errors, "timeout_s", lambda v: values.parse_duration(v, "timeout_s", cap_s=MAX_TIMEOUT_S),
                         obj["timeout_s"])
    if "sql" in obj:
        sql = obj["sql"]
        if not isinstance(sql, str):
            errors["sql"] = "must be a string"
        elif len(sql) > MAX_SQL_CHARS:
            errors["sql"] = f"longer than {MAX_SQL_CHARS} characters"
        max_rows = DEFAULT_MAX_ROWS
        if obj.get("max_rows") is not None:
            max_rows = _field(errors, "max_rows", lambda v: values.parse_count(v, "max_rows", cap=MAX_ROWS_CAP),
                              obj["max_rows"])
        max_bytes = MAX_REPLY_BYTES
        if obj.get("max_bytes") is not None:
            max_bytes = _field(errors, "max_bytes",
                               lambda v: values.parse_count(v, "max_bytes", cap=MAX_REPLY_BYTES), obj["max_bytes"])
        if "op" in obj or "args" in obj:
            errors["op"] = "a request is either sql or an op, not both"
        if errors:
            raise BadRequest(errors)
        return Request("sql", sql=sql, max_rows=max_rows, timeout_s=timeout, max_bytes=max_bytes)
    op = obj.get("op")
    if not isinstance(op, str) or op not in ops:
        errors["op"] = f"unknown op {str(op)[:40]!r} (ops: {', '.join(sorted(ops))}, or sql)"
    for k in ("max_rows", "max_bytes"):
        if k in obj:
            errors[k] = "only for sql"
    raw = obj.get("args") or {}
    args: dict[str, Any] = {}
    if not isinstance(raw, dict):
        errors["args"] = "must be an object"
    elif op == "explain":
        for k, v in raw.items():
            if k not in EXPLAIN_ARGS:
                errors[f"args.{str(k)[:40]}"] = f"unknown (allowed: {', '.join(sorted(EXPLAIN_ARGS))})"
            elif v is not None:
                parsed = _field(errors, k, EXPLAIN_ARGS[k], v)
                if k in errors:
                    errors[f"args.{k}"] = errors.pop(k)
                args[k] = parsed
    elif raw:
        errors["args"] = f"op {op!r} takes no arguments"
    if errors:
        raise BadRequest(errors)
    return Request(op, timeout_s=timeout, args=args)
