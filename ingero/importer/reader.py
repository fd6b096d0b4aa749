"""Streaming reader of a Kineto (Chrome-trace JSON) trace, gzip-compressed or not.

A trace is one JSON object whose ``traceEvents`` array holds the events; the
other top-level keys (``deviceProperties``, ``distributedInfo``,
``baseTimeNanoseconds`` ...) may come before or after it.  The input (a
source.Source: a file, standard input or a pipe) is read in fixed-size chunks
and each array element is decoded on its own by the C JSON scanner
(``raw_decode``), so memory stays bounded by one chunk plus one batch of
events whatever the input's size: never ``json.load`` of the whole file.

Bounds on hostile input, each one line (IngeroError), never a traceback:
- one value (an event, a top-level key's value) is at most MAX_TOKEN_BYTES
  (Kineto's largest are a few kB); the buffer holding a value still being read
  grows by doubling, so a large value costs linear, not quadratic, work;
- nesting deeper than the C scanner allows (it counts against Python's
  recursion limit, ~1,000 levels; a Kineto event nests 3-4) is refused;
- a run of blanks of any length is skipped in C (a regex), without holding it.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ingero.errors import IngeroError
from ingero.importer.source import Source, as_source, not_a_trace, size_text

CHUNK_BYTES = 1 << 20
BATCH_EVENTS = 50_000  # events handed over at once
MAX_TOKEN_BYTES = 16 << 20  # one event (or top-level value) larger than this is not a profiler trace's

_decoder = json.JSONDecoder()
_WS = " \t\n\r"
_NON_WS = re.compile(r"[^ \t\n\r]")
_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")


def too_deep(label: str) -> IngeroError:
    return IngeroError(f"{label}: a JSON value nests deeper than the decoder's limit "
                       f"(about {sys.getrecursionlimit():,} levels; a Kineto event nests 3 or 4)",
                       "pass a torch.profiler trace; this one is damaged or not a trace")


def too_long(label: str) -> IngeroError:
    return IngeroError(f"{label}: one JSON value is longer than {size_text(MAX_TOKEN_BYTES)} "
                       "(a Kineto event is a few kB)",
                       "pass a torch.profiler trace; this one is damaged or not a trace")


class KinetoReader:
    """Iterates a trace: ``events()`` yields lists of event dicts; ``meta`` holds the other keys.

    ``meta`` is complete only once ``events()`` is exhausted (keys after the
    array are read last).  ``bytes_read`` counts uncompressed bytes.
    """

    def __init__(self, source: Source | Path | str, encoding: str = "utf-8"):
        self.source, self._own = as_source(source)
        self.label = self.source.label
        self.meta: dict[str, Any] = {}
        self.bytes_read = 0
        self.saw_events_key = False
        try:
            self._f = self.source.open()
        except BaseException:
            if self._own:
                self.source.close()
            raise
        # latin-1 maps each byte to one character, so positions are byte offsets (find_events)
        self._dec = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._base = 0  # offset in the file of _buf[0]
        self._buf = ""
        self._pos = 0
        self._eof = False

    def close(self) -> None:
        self._f.close()
        if self._own:
            self.source.close()

    # -- buffer --------------------------------------------------------------

    def _fill(self, size: int = CHUNK_BYTES) -> bool:
        """Append the next ``size`` bytes to the buffer (dropping what was consumed); False at EOF."""
        if self._eof:
            return False
        try:
            data = self._f.read(size)
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
            raise IngeroError(f"{self.label}: the compressed data is damaged or truncated ({exc})",
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
            if pos < len(buf) and buf[pos] not in _WS:
                return buf[pos]
            m = _NON_WS.search(buf, pos)
            if m is not None:
                self._pos = m.start()
                return buf[self._pos]
            self._pos = len(buf)  # all blank: dropped by the next fill
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
            return IngeroError(f"{self.label}: the trace ends early (truncated file?)",
                               "copy the trace again; the JSON must be complete")
        return not_a_trace(self.label, why)

    def _decode(self, pos: int) -> tuple[Any, int]:
        try:
            return _decoder.raw_decode(self._buf, pos)
        except RecursionError:
            raise too_deep(self.label) from None

    def _value(self) -> Any:
        """Decode one JSON value at the cursor, reading more of the input while it is incomplete."""
        self._skip_ws()
        while True:
            try:
                value, end = self._decode(self._pos)
            except json.JSONDecodeError as exc:
                pending = len(self._buf) - self._pos
                # cut short: the scanner failed at the buffer's end, or inside a string running to it
                short = exc.pos >= len(self._buf.rstrip()) or exc.msg.startswith("Unterminated")
                if pending > MAX_TOKEN_BYTES:
                    raise (too_long(self.label) if short else self._error("a value is not valid JSON")) from None
                # double what is held: a long value is scanned O(log n) times, not once per chunk
                if not self._fill(max(CHUNK_BYTES, pending)):
                    if short:
                        raise IngeroError(f"{self.label}: the trace ends early (truncated file?)",
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
            raise not_a_trace(self.label, "the file is empty" if self.source.is_file else "it is empty")
        self._expect("{", "a JSON object")
        if self._skip_ws() == "}":
            raise not_a_trace(self.label, "an empty JSON object")

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
            raise not_a_trace(self.label, "data after the JSON object")

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
            except RecursionError:
                raise too_deep(self.label) from None
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
