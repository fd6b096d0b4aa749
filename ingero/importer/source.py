"""Where a trace's bytes come from, and how many may come: one input of ``ingero import``.

A ``Source`` is a regular file, standard input (``-``) or a pipe (``<(zcat t.json.gz)``,
a FIFO).  The importer reads its input more than once (the keys before the events,
then the events; a second, slower reader when DuckDB's refuses it), so:

- a regular file is opened once and each pass reads it with ``pread`` at its own offset
  (the same file throughout, even if the path is replaced meanwhile);
- standard input and pipes can be read only once: every byte read from them is also
  written to a spool file (in TMPDIR, unlinked at once, gone when the import ends; as big
  as the input *as it arrives*, i.e. compressed when it is gzip'd), and a later pass
  replays the spool, then reads on from the pipe.  The first pass still streams: the
  events are parsed while the pipe's writer is still writing.

gzip is recognised by its magic bytes, never by the name.  An ingero/DuckDB or SQLite
database given by mistake is refused up front.

Limits, checked as the bytes are read (each pass alike), so neither a gzip bomb nor an
endless pipe can fill memory or the disk: the JSON inflated from one input is at most
``Limits.max_json_bytes`` (``--max-json``), and a gzip'd input inflates to at most
``Limits.max_ratio`` (``--max-ratio``) times the compressed bytes read so far, plus
RATIO_SLACK.  Real Kineto traces inflate 10-14x (tests/data/kineto: 12.9-14.2x at
gzip -6, 9.6x at -1; docs/benchmarks.md); gzip itself tops out near 1,030x.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from ingero.errors import IngeroError

MAX_JSON_BYTES = 32 << 30  # a 2 GB trace imports in under a minute here; 32 GiB in ~15 min
MAX_RATIO = 100  # ~7x the ratio of real traces (10-14x), ~1/10 of what gzip can reach
RATIO_SLACK = 1 << 20  # the first MiB inflates freely (gzip's header, a very compressible head)
GZIP_MAGIC = b"\x1f\x8b"
DUCKDB_MAGIC = b"DUCK"  # at offset 8 of a DuckDB database file
SQLITE_MAGIC = b"SQLite format 3\x00"
HEAD_BYTES = 16

ReadAt = Callable[[int, int], bytes]  # (offset, at most n bytes) -> bytes; b"" at the end


@dataclass(frozen=True)
class Limits:
    max_json_bytes: int = MAX_JSON_BYTES  # uncompressed JSON read from one input, bytes
    max_ratio: int = MAX_RATIO  # inflated bytes per compressed byte of a gzip'd input


def size_text(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def not_a_trace(label: str, why: str) -> IngeroError:
    return IngeroError(f"{label} is not a Kineto trace: {why}",
                       "pass a torch.profiler trace (.json or .json.gz, as export_chrome_trace writes it)")


class _Tape:
    """A pipe read once and replayable: what was read stays in an (unlinked) spool file."""

    def __init__(self, f: BinaryIO, label: str, cap: int):
        self.f, self.label, self.cap = f, label, cap
        self.spool = tempfile.TemporaryFile(prefix="ingero-import-")
        self.size = 0
        self.eof = False
        self.lock = threading.Lock()

    def read_at(self, pos: int, n: int) -> bytes:
        with self.lock:
            if pos < self.size:
                return os.pread(self.spool.fileno(), min(n, self.size - pos), pos)
            if self.eof:
                return b""
            # read1: what the pipe has now (up to n), so the import keeps pace with its writer
            read = getattr(self.f, "read1", self.f.read)
            try:
                data = read(n)
            except OSError as exc:
                raise IngeroError(f"cannot read {self.label}: {exc.strerror or exc}",
                                  "check the command writing to it") from None
            if not data:
                self.eof = True
                return b""
            if self.size + len(data) > self.cap:
                raise _too_big(self.label, self.cap)
            try:
                os.pwrite(self.spool.fileno(), data, self.size)
            except OSError as exc:
                raise IngeroError(f"cannot keep a copy of {self.label} in {tempfile.gettempdir()}: "
                                  f"{exc.strerror or exc}",
                                  "set TMPDIR to a disk with room for the (compressed) trace") from None
            self.size += len(data)
            return data

    def close(self) -> None:
        self.spool.close()
        if self.f is not sys.stdin.buffer:
            self.f.close()


def _too_big(label: str, cap: int) -> IngeroError:
    return IngeroError(f"{label}: holds more than {size_text(cap)} of JSON",
                       "pass --max-json SIZE to allow a larger trace")


class _Raw(io.RawIOBase):
    """A sequential reader over ``read_at`` from offset 0; counts the bytes it returned."""

    def __init__(self, read_at: ReadAt):
        self._read_at = read_at
        self.pos = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = []
            while chunk := self.read(1 << 20):
                parts.append(chunk)
            return b"".join(parts)
        parts = []
        got = 0
        while got < n:  # a pipe gives what it has: gather n bytes (or up to the end)
            data = self._read_at(self.pos, n - got)
            if not data:
                break
            parts.append(data)
            got += len(data)
            self.pos += len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class _Limited(io.RawIOBase):
    """The uncompressed bytes of one pass, refused past the limits (IngeroError from read)."""

    def __init__(self, inner: BinaryIO, raw: _Raw, limits: Limits, label: str, gz: bool):
        self._inner, self._raw, self._limits, self._label, self._gz = inner, raw, limits, label, gz
        self.inflated = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._inner.read(n)
        self.inflated += len(data)
        if self.inflated > self._limits.max_json_bytes:
            raise _too_big(self._label, self._limits.max_json_bytes)
        if self._gz and self.inflated > self._limits.max_ratio * self._raw.pos + RATIO_SLACK:
            raise IngeroError(f"{self._label}: inflates to more than {self._limits.max_ratio}x its compressed size "
                              f"({size_text(self.inflated)} from {size_text(self._raw.pos)}: a gzip bomb?)",
                              "pass --max-ratio N to allow a higher ratio")
        return data

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._gz:
            self._inner.close()
        super().close()


class Source:
    """One input, opened once: ``open()`` gives its uncompressed bytes from the start, as often as asked.

    ``label`` names it in messages, ``name`` in summaries (the file's name), ``stored`` in
    sessions.imported_from (the resolved path; '<stdin>' for standard input).
    """

    def __init__(self, spec: str | Path, limits: Limits | None = None):
        self.limits = limits or Limits()
        text = str(spec)
        self._tape: _Tape | None = None
        self._fd: int | None = None
        if text == "-":
            self.label, self.name, self.stored = "standard input", "standard input", "<stdin>"
            if os.isatty(sys.stdin.fileno()):
                raise IngeroError("standard input is a terminal, not a trace",
                                  "pipe a trace into it: zcat trace.json.gz | ingero import -")
            if stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):  # `- < trace.json`: a file after all
                self._fd, self._file = sys.stdin.fileno(), None
            else:
                self._tape = _Tape(sys.stdin.buffer, self.label, self.limits.max_json_bytes)
            return
        path = Path(text)
        self.label, self.name = text, path.name
        try:
            f = open(path, "rb")  # a FIFO: waits for its writer, as `cat` would
        except OSError as exc:
            raise IngeroError(f"cannot read {text}: {exc.strerror or exc}", "check the path") from None
        mode = os.fstat(f.fileno()).st_mode
        if stat.S_ISDIR(mode):
            f.close()
            raise IngeroError(f"cannot read {text}: Is a directory", "check the path")
        if stat.S_ISREG(mode):
            self._fd = f.fileno()
            self._file = f
            self.stored = str(path.resolve())
        else:  # a pipe, a FIFO, a character device: read once, replayed from the spool
            self._tape = _Tape(f, self.label, self.limits.max_json_bytes)
            self.stored = self.name = text

    @property
    def is_file(self) -> bool:
        """A regular file (read with pread), not a pipe replayed from its spool."""
        return self._tape is None

    def _read_at(self, pos: int, n: int) -> bytes:
        if self._tape is not None:
            return self._tape.read_at(pos, n)
        try:
            return os.pread(self._fd, n, pos)  # type: ignore[arg-type]
        except OSError as exc:
            raise IngeroError(f"cannot read {self.label}: {exc.strerror or exc}", "check the path") from None

    def head(self) -> bytes:
        """The first HEAD_BYTES bytes (fewer for a shorter input)."""
        out = b""
        while len(out) < HEAD_BYTES:
            more = self._read_at(len(out), HEAD_BYTES - len(out))
            if not more:
                break
            out += more
        return out

    def open(self) -> BinaryIO:
        """The input's uncompressed bytes from its start, within the limits; refuses a database file."""
        head = self.head()
        if head[8:12] == DUCKDB_MAGIC:
            raise not_a_trace(self.label, "it is a DuckDB database (an ingero DB?)")
        if head.startswith(SQLITE_MAGIC):
            raise not_a_trace(self.label, "it is an SQLite database")
        raw = _Raw(self._read_at)
        if head.startswith(GZIP_MAGIC):
            return _Limited(gzip.GzipFile(fileobj=raw, mode="rb"), raw, self.limits, self.label, True)  # type: ignore[arg-type]
        return _Limited(raw, raw, self.limits, self.label, False)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._tape is not None:
            self._tape.close()
        elif self._fd is not None:
            if self._file is not None:  # standard input stays open
                self._file.close()
            self._fd = None

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def as_source(spec: "Source | str | Path", limits: Limits | None = None) -> tuple[Source, bool]:
    """``spec`` as a Source, and whether the caller opened it here (and must close it)."""
    if isinstance(spec, Source):
        return spec, False
    return Source(spec, limits), True
