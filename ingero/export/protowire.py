"""Protocol-buffer wire format for many messages at once, in numpy.

A batch of n messages of the same shape is a list of fields; each field is
an (n, w) uint8 matrix of its encoded bytes per message and the number of
those bytes each message uses (0: the field is absent from that message).
``join`` cuts the used bytes out of the fields side by side, row-major, so
message i's fields come out in order right after message i-1's: one boolean
mask over the matrix, no Python loop per message.

Only what the Perfetto export needs: varints (uint64, two's complement for
negative int64 as protobuf does), constant bytes (tags), and length-delimited
fields whose body is itself a list of fields.
"""

from __future__ import annotations

import numpy as np

Field = tuple[np.ndarray, np.ndarray]  # (uint8 matrix (n, w), used bytes per row int64 (n,))

_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
# 2**(7k): a value below _LIMITS[k-1] fits in k varint bytes
_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def varint_len(v: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each value (uint64 view of int64)."""
    return np.searchsorted(_LIMITS, v.astype(np.uint64, copy=False), side="right") + 1


def varint(v: np.ndarray, present: np.ndarray | None = None, tag: bytes = b"") -> Field:
    """A varint field (with its tag bytes before it); absent where ``present`` is False."""
    u = np.asarray(v).astype(np.int64, copy=False).view(np.uint64)
    n = len(u)
    lens = varint_len(u)
    if present is not None:
        lens = np.where(present, lens, 1)
    w = int(lens.max()) if n else 1
    t = len(tag)
    mat = np.empty((n, t + w), dtype=np.uint8)
    if t:
        mat[:, :t] = np.frombuffer(tag, dtype=np.uint8)
    for k in range(w):
        b = ((u >> _SHIFTS[k]) & np.uint64(0x7F)).astype(np.uint8)
        b[lens > k + 1] |= 0x80  # more bytes follow
        mat[:, t + k] = b
    used = lens + t
    if present is not None:
        used = np.where(present, used, 0)
    return mat, used


def const(data: bytes, n: int, present: np.ndarray | None = None) -> Field:
    """The same bytes in every row (a tag and a fixed value)."""
    mat = np.broadcast_to(np.frombuffer(data, dtype=np.uint8), (n, len(data)))
    used = np.full(n, len(data), dtype=np.int64)
    if present is not None:
        used = np.where(present, used, 0)
    return mat, used


def size(fields: list[Field]) -> np.ndarray:
    """Bytes of each row once joined."""
    total = np.zeros(len(fields[0][1]), dtype=np.int64)
    for _, used in fields:
        total += used
    return total


def nested(tag: bytes, body: list[Field], present: np.ndarray | None = None) -> list[Field]:
    """A length-delimited field (tag, length, body): the body's fields after a tag+length field.

    No fields at all when no row has it (keeps the joined matrix narrow)."""
    if present is not None and not present.any():
        return []
    length = size(body)
    head = varint(length, present, tag)
    if present is None:
        return [head, *body]
    return [head, *((m, np.where(present, u, 0)) for m, u in body)]


def join(fields: list[Field]) -> bytes:
    """The used bytes of every row, row after row, each row's fields in order."""
    n = len(fields[0][1])
    width = sum(m.shape[1] for m, _ in fields)
    mat = np.empty((n, width), dtype=np.uint8)
    mask = np.empty((n, width), dtype=bool)
    col = 0
    for m, used in fields:
        w = m.shape[1]
        mat[:, col:col + w] = m
        np.less(np.arange(w), used[:, None], out=mask[:, col:col + w])
        col += w
    return mat[mask].tobytes()


def tag(field_number: int, wire_type: int) -> bytes:
    """The encoded key of a field (wire type 0 varint, 1 fixed64, 2 length-delimited)."""
    key = (field_number << 3) | wire_type
    out = bytearray()
    while True:
        b = key & 0x7F
        key >>= 7
        out.append(b | (0x80 if key else 0))
        if not key:
            return bytes(out)
