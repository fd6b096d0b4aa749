"""Streaming reader of a Kineto (Chrome-trace JSON) file, gzip-compressed or not.

A trace is one JSON object whose ``traceEvents`` array holds the events; the
other top-level keys (``deviceProperties``, ``distributedInfo``,
``baseTimeNanoseconds`` ...) may come before or after it.  The file is read in
fixed-size chunks and each array element is decoded on its own by the C JSON
scanner (``raw_decode``), so memory stays bounded by one chunk plus one batch
of events whatever the file's size: never ``json.load`` of the whole file.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ingero.errors import IngeroError

CHUNK_BYTES = 1 << 20
BATCH_EVENTS = 50_000  # events handed over at once
MAX_ELEMENT_CHARS = 64 << 20  # one event (or top-level value) larger than this is not a trace
GZIP_MAGIC = b"\x1f\x8b"
DUCKDB_MAGIC = b"DUCK"  # at offset 8 of a DuckDB database file
SQLITE_MAGIC = b"SQLite format 3\x00"

_decoder = json.JSONDecoder()
_WS = " \t\n\r"
_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")


def _not_a_trace(path: Path, why: str) -> IngeroError:
    return IngeroError(f"{path} is not a Kineto trace: {why}",
                       "pass a torch.profiler trace (.json or .json.gz, as export_chrome_trace writes it)")


def open_bytes(path: Path) -> BinaryIO:
    """The file's uncompressed bytes; refuses an ingero/DuckDB database up front."""
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise IngeroError(f"cannot read {path}: {exc.strerror}", "check the path") from None
    head = raw.read(16)
    raw.seek(0)
    if head[8:12] == DUCKDB_MAGIC:
        raw.close()
        raise _not_a_trace(path, "it is a DuckDB database (an ingero DB?)") from None
    if head.startswith(SQLITE_MAGIC):
        raw.close()
        raise _not_a_trace(path, "it is an SQLite database") from None
    if head.startswith(GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


class KinetoReader:
    """Iterates a trace: ``events()`` yields lists of event dicts; ``meta`` holds the other keys.

    ``meta`` is complete only once ``events()`` is exhausted (keys after the
    array are read last).  ``bytes_read`` counts uncompressed bytes.
    """

    def __init__(self, path: Path, encoding: str = "utf-8"):
        self.path = path
        self.meta: dict[str, Any] = {}
        self.bytes_read = 0
        self.saw_events_key = False
        self._f = open_bytes(path)
        # latin-1 maps each byte to one character, so positions are byte offsets (find_events)
        self._dec = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._base = 0  # offset in the file of _buf[0]
        self._buf = ""
        self._pos = 0
        self._eof = False

    def close(self) -> None:
        self._f.close()

    # -- buffer --------------------------------------------------------------

    def _fill(self) -> bool:
        """Append the next chunk to the buffer (dropping what was consumed); False at EOF."""
        if self._eof:
            return False
        try:
            data = self._f.read(CHUNK_BYTES)
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
            raise IngeroError(f"{self.path}: the compressed data is damaged or truncated ({exc})",
                              "copy the trace again; a gzip file must be complete") from None
        self.bytes_read += len(data)
        if not data:
            self._eof = True
            self._base += self._pos
            self._buf = self._buf[self._pos:] + self._dec.decode(b"", final=True)
            self._pos = 0
            return False
        self._base += self._pos
        self._buf = self._buf[self._pos:] + self._dec.decode(data)
        self._pos = 0
        return True

    def _skip_ws(self) -> str:
        """The next non-blank character (not consumed), '' at EOF."""
        while True:
            buf, pos = self._buf, self._pos
            n = len(buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self._pos = pos
            if pos < n:
                return buf[pos]
            if not self._fill():
                return ""

    def _expect(self, chars: str, what: str) -> str:
        c = self._skip_ws()
        if not c or c not in chars:
            raise self._error(f"expected {what}")
        self._pos += 1
        return c

    def _error(self, why: str) -> IngeroError:
        if self._eof and self._pos >= len(self._buf):
            return IngeroError(f"{self.path}: the trace ends early (truncated file?)",
                               "copy the trace again; the JSON must be complete")
        return _not_a_trace(self.path, why)

    def _value(self) -> Any:
        """Decode one JSON value at the cursor, reading more of the file while it is incomplete."""
        self._skip_ws()
        while True:
            try:
                value, end = _decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if len(self._buf) - self._pos > MAX_ELEMENT_CHARS:
                    raise self._error("a value is not valid JSON") from None
                # cut short: the scanner failed at the buffer's end, or inside a string running to it
                short = exc.pos >= len(self._buf.rstrip()) or exc.msg.startswith("Unterminated")
                if not self._fill():
                    if short:
                        raise IngeroError(f"{self.path}: the trace ends early (truncated file?)",
                                          "copy the trace again; the JSON must be complete") from None
                    raise self._error(f"not valid JSON ({exc.msg})") from None
                continue
            if end == len(self._buf) and not self._eof and isinstance(value, (int, float)):
                # a number cut at the chunk's end would decode short: read on and decode again
                if self._fill():
                    continue
            self._pos = end
            return value

    # -- structure -----------------------------------------------------------

    def _open_object(self) -> None:
        if not self._skip_ws() and self.bytes_read == 0:
            raise _not_a_trace(self.path, "the file is empty")
        self._expect("{", "a JSON object")
        if self._skip_ws() == "}":
            raise _not_a_trace(self.path, "an empty JSON object")

    def _keys(self) -> Iterator[str]:
        """The top-level keys in order; the caller reads each one's value before the next."""
        self._open_object()
        while True:
            key = self._value()
            if not isinstance(key, str):
                raise self._error("expected a key")
            self._expect(":", "':' after a key")
            yield key
            if self._expect(",}", "',' or '}'") == "}":
                return

    def find_events(self) -> int | None:
        """Read the keys before ``traceEvents`` into ``meta``; the file offset of its '[' (None: no such key).

        With encoding latin-1 the offset is in bytes of the uncompressed file.
        """
        for key in self._keys():
            if key == "traceEvents":
                self.saw_events_key = True
                if self._skip_ws() != "[":
                    raise self._error("traceEvents is not an array")
                return self._base + self._pos
            self.meta[key] = self._value()
        return None

    def events(self) -> Iterator[list[dict[str, Any]]]:
        """Every element of traceEvents, in batches; ``meta`` gets the other keys."""
        for key in self._keys():
            if key == "traceEvents":
                self.saw_events_key = True
                yield from self._array()
            else:
                self.meta[key] = self._value()
        if self._skip_ws():
            raise _not_a_trace(self.path, "data after the JSON object")

    def _array(self) -> Iterator[list[dict[str, Any]]]:
        self._expect("[", "traceEvents to be an array")
        batch: list[dict[str, Any]] = []
        if self._skip_ws() == "]":
            self._pos += 1
            return
        decode = _decoder.raw_decode
        sep = _SEP.match
        while True:
            # fast path: decode straight from the buffer and step over the ',' after the element;
            # the slow path (a chunk boundary, the array's end, bad JSON) goes through _value
            buf, pos = self._buf, self._pos
            try:
                value, end = decode(buf, pos)
            except json.JSONDecodeError:
                value = self._value()
                end = self._pos
            if not isinstance(value, dict):
                raise self._error("a traceEvents element is not an object")
            batch.append(value)
            if len(batch) >= BATCH_EVENTS:
                yield batch
                batch = []
            m = sep(buf, end) if buf is self._buf else None
            if m is not None and m.end() < len(buf):
                self._pos = m.end()
                continue
            self._pos = end
            if self._expect(",]", "',' or ']' in traceEvents") == "]":
                break
            self._skip_ws()
        if batch:
            yield batch
