"""Wire format between `ingero` clients and the tracer's query server.

One message = 4-byte big-endian length + UTF-8 JSON object.  A connection
carries one request and one response.  Requests:

    {"sql": "...", "max_rows": 10000, "timeout_s": 30}
    {"op": "status"}
    {"op": "explain", "args": {...}}

Responses: {"ok": true, "columns": [...], "types": [...], "rows": [[...]],
"truncated": bool, "elapsed_s": float} for SQL, {"ok": true, "result": {...}}
for ops, {"ok": false, "error": "one line", "hint": "..."} on failure.
"""

from __future__ import annotations

import datetime
import decimal
import json
import socket
import struct
import uuid
from typing import Any

_HEADER = struct.Struct(">I")

# A request is a query string and a few numbers: 1 MiB is generous.
MAX_REQUEST_BYTES = 1 << 20
# A response is bounded by the server's row cap; this only stops garbage lengths.
MAX_RESPONSE_BYTES = 1 << 30


class ProtocolError(Exception):
    """The peer sent something that is not a framed JSON object."""


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time, datetime.timedelta,
                          decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def encode(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, default=_json_default, separators=(",", ":"), allow_nan=True).encode()
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


def recv(sock: socket.socket, max_bytes: int) -> dict[str, Any]:
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > max_bytes:
        raise ProtocolError(f"message of {length} bytes exceeds the limit of {max_bytes}")
    try:
        obj = json.loads(_recv_exact(sock, length))
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("message is not a JSON object")
    return obj
