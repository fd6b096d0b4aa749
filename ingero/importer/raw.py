"""Stage a trace's events into one temporary table, ``_imp_raw``, with the fields the importer uses.

Fast path: the keys before ``traceEvents`` are read in Python (they are small),
then the array itself goes to DuckDB's JSON reader (C++, columnar: ~4x the C
json module here) in pieces of whole events, each a temporary file.  The array's end is found in the
last TAIL_WINDOW bytes of the file, whose remaining keys (``baseTimeNanoseconds``
follows the events in some traces) are decoded there.

Slow path, when DuckDB refuses the array (an unusual layout or type, or bad
input): the streaming Python reader (reader.py), which also names what is
wrong with a bad file.  Both fill the same table.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb

from ingero.errors import IngeroError
from ingero.importer.reader import CHUNK_BYTES, KinetoReader, open_bytes

TAIL_WINDOW = 4 << 20  # bytes held back to find the array's end: the keys after it must fit

# DuckDB's types for the fields read.  ts and dur are microseconds as doubles: ~0.1 µs of a
# 2024 epoch timestamp (the streaming path reads the text, then converts it the same way).
READ_COLUMNS = {
    "ph": "VARCHAR",
    "cat": "VARCHAR",
    "name": "VARCHAR",
    "pid": "VARCHAR",
    "tid": "VARCHAR",
    "ts": "DOUBLE",
    "dur": "DOUBLE",
    "args": "STRUCT(correlation BIGINT, device BIGINT, stream BIGINT, bytes BIGINT, name VARCHAR)",
}
RAW_SELECT = """SELECT ph, cat, name, TRY_CAST(pid AS INTEGER) AS pid, TRY_CAST(tid AS INTEGER) AS tid, ts, dur,
       args.correlation AS correlation,
       args.device AS device, args.stream AS stream, args.bytes AS bytes, args.name AS arg_name"""
RAW_DDL = """CREATE OR REPLACE TEMP TABLE _imp_raw (ph VARCHAR, cat VARCHAR, name VARCHAR, pid INTEGER,
    tid INTEGER, ts DOUBLE, dur DOUBLE, correlation BIGINT, device BIGINT, stream BIGINT, bytes BIGINT,
    arg_name VARCHAR)"""


def _tail_meta(rest: bytes) -> dict[str, Any] | None:
    """The keys after the array, from the bytes after its ']'; None when they do not parse."""
    rest = rest.strip()
    if rest == b"}":
        return {}
    if not rest.startswith(b","):
        return None
    try:
        meta = json.loads(b"{" + rest[1:])
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def find_array_end(tail: bytes) -> tuple[int, dict[str, Any]] | None:
    """Offset in ``tail`` of the ']' closing traceEvents, and the keys after it.

    Scans the ']'s right to left for one preceded by the end of an event ('}')
    or the array's start, followed by valid keys and the object's '}'.  A wrong
    pick (a list of objects after the events) makes the array unbalanced, which
    DuckDB then refuses, and the slow path takes over.
    """
    p = len(tail)
    while True:
        p = tail.rfind(b"]", 0, p)
        if p < 0:
            return None
        before = tail[:p].rstrip()[-1:]
        if before in (b"}", b"["):
            meta = _tail_meta(tail[p + 1:])
            if meta is not None:
                return p, meta


# Where one top-level event ends and the next begins: '}', a comma, '{' (blanks between).  A cut
# anywhere else leaves the first piece open (a string or an object inside an event never closed):
# DuckDB refuses it and the slow path takes over, so a wrong cut can fail, never mis-read.
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*(?=\{)")
PIECE_BYTES = 64 << 20  # the array goes to DuckDB in pieces of about this size (bounds memory)


def _pieces(path: Path, start: int, tail_meta: dict[str, Any]):
    """The array's elements as JSON arrays of about PIECE_BYTES each (bytes, '[' and ']' added);
    ``tail_meta`` gets the keys after the array.  Raises ValueError where no end is found."""
    with open_bytes(path) as f:
        f.seek(start + 1)  # past the '['; a gzip stream seeks forward by reading and dropping the head
        held = bytearray()
        eof = False
        while not eof:
            chunk = f.read(CHUNK_BYTES)
            eof = not chunk
            held += chunk
            if len(held) < PIECE_BYTES + TAIL_WINDOW:
                continue
            cut = None
            for m in _CUT.finditer(held, len(held) - TAIL_WINDOW - CHUNK_BYTES, len(held) - TAIL_WINDOW):
                cut = m
            if cut is None:
                continue  # one long event: read on
            yield b"[" + bytes(held[:cut.start() + 1]) + b"]"
            del held[:cut.end()]
        found = find_array_end(b"[" + bytes(held))
        if found is None:
            raise ValueError("end of traceEvents not found")
        tail_meta.update(found[1])
        yield b"[" + bytes(held[:found[0] - 1]) + b"]"


def _ahead(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The pieces, the next one read (and inflated: zlib lets go of the GIL) while DuckDB parses this one."""
    q: queue.Queue = queue.Queue(maxsize=1)
    done = object()
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for piece in pieces:
                if not put(piece):
                    return  # the consumer gave up (DuckDB refused a piece)
            put(done)
        except BaseException as exc:  # handed to the consumer, which falls back to the slow path
            put(exc)

    reader = threading.Thread(target=run, name="ingero-import-reader", daemon=True)
    reader.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join()


def _stage_fast(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, Any] | None:
    """The fast path; the trace's top-level keys, or None when the slow path must do it.

    The array goes to DuckDB's JSON reader piece by piece, each written to a temporary
    file (DuckDB holds a whole array read through a pipe in memory: ~1 GB of a 1 GB trace)."""
    head = KinetoReader(path, encoding="latin-1")
    try:
        start = head.find_events()
    except IngeroError:
        return None  # the slow path says what is wrong
    finally:
        head.close()
    if start is None:
        return None
    meta = _fix_latin1(head.meta)
    tail: dict[str, Any] = {}
    con.execute(RAW_DDL)
    with tempfile.TemporaryDirectory(prefix="ingero-import-") as tmp:
        piece_path = os.path.join(tmp, "events.json")
        try:
            for piece in _ahead(_pieces(path, start, tail)):
                with open(piece_path, "wb") as out:
                    out.write(piece)
                del piece
                con.execute(f"""INSERT INTO _imp_raw {RAW_SELECT}
                                FROM read_json($p, format = 'array', columns = $columns)""",
                            {"p": piece_path, "columns": READ_COLUMNS})
        except (duckdb.Error, ValueError, OSError, EOFError, zlib.error, gzip.BadGzipFile):
            return None
    meta.update(_fix_latin1(tail))
    meta["_events_key"] = True
    return meta


def _fix_latin1(value: Any) -> Any:
    """Strings decoded byte-per-character (latin-1) back to their UTF-8 text."""
    if isinstance(value, str):
        try:
            return value.encode("latin-1").decode("utf-8")
        except UnicodeError:
            return value
    if isinstance(value, list):
        return [_fix_latin1(v) for v in value]
    if isinstance(value, dict):
        return {_fix_latin1(k): _fix_latin1(v) for k, v in value.items()}
    return value


def _text(v: Any) -> str | None:
    return None if v is None or isinstance(v, (dict, list)) else str(v)


def _int(v: Any, bits: int = 64) -> int | None:
    if isinstance(v, str) and v.lstrip("-").isdigit():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and -(1 << bits - 1) <= v < (1 << bits - 1) else None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _stage_slow(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, Any]:
    import pyarrow as pa

    TYPES = {k: pa.string() for k in ("ph", "cat", "name", "arg_name")}
    TYPES.update({"pid": pa.int32(), "tid": pa.int32(), "ts": pa.float64(), "dur": pa.float64()})
    TYPES.update({k: pa.int64() for k in ("correlation", "device", "stream", "bytes")})

    con.execute(RAW_DDL)
    reader = KinetoReader(path)
    try:
        for batch in reader.events():
            cols: dict[str, list[Any]] = {k: [] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur",
                                                          "correlation", "device", "stream", "bytes",
                                                          "arg_name")}
            for e in batch:
                args = e.get("args")
                if not isinstance(args, dict):
                    args = {}
                for k in ("ph", "cat", "name"):
                    cols[k].append(_text(e.get(k)))
                cols["pid"].append(_int(e.get("pid"), 32))
                cols["tid"].append(_int(e.get("tid"), 32))
                cols["ts"].append(_float(e.get("ts")))
                cols["dur"].append(_float(e.get("dur")))
                for k in ("correlation", "device", "stream", "bytes"):
                    cols[k].append(_int(args.get(k)))
                cols["arg_name"].append(_text(args.get("name")))
            table = pa.table({k: pa.array(v, type=TYPES[k]) for k, v in cols.items()})
            con.register("_imp_batch", table)
            try:
                con.execute("INSERT INTO _imp_raw BY NAME SELECT * FROM _imp_batch")
            finally:
                con.unregister("_imp_batch")
    finally:
        reader.close()
    meta = dict(reader.meta)
    meta["_events_key"] = reader.saw_events_key
    return meta


def stage(con: duckdb.DuckDBPyConnection, path: Path, *, fast: bool = True) -> dict[str, Any]:
    """Fill ``_imp_raw`` from the trace at ``path``; returns its top-level keys (not traceEvents).

    Raises IngeroError for a file that is not a complete Kineto trace.
    """
    meta = _stage_fast(con, path) if fast else None
    if meta is None:
        meta = _stage_slow(con, path)
    if not meta.pop("_events_key"):
        raise IngeroError(f"{path} is not a Kineto trace: it has no traceEvents",
                          "pass a torch.profiler trace (.json or .json.gz, as export_chrome_trace writes it)")
    return meta
