"""Stage a trace's events into one temporary table, ``_imp_raw``, with the fields the importer uses.

Fast path: the keys before ``traceEvents`` are read in Python (they are small),
then the array itself is streamed through a FIFO into DuckDB's JSON reader
(C++, columnar: ~4x the C json module here).  The array's end is found in the
last TAIL_WINDOW bytes of the file, whose remaining keys (``baseTimeNanoseconds``
follows the events in some traces) are decoded there.

Slow path, when DuckDB refuses the array (an unusual layout or type, or bad
input): the streaming Python reader (reader.py), which also names what is
wrong with a bad file.  Both fill the same table.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
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


class _Feeder(threading.Thread):
    """Writes the array (from its '[' to its ']') of the uncompressed file into a FIFO."""

    def __init__(self, path: Path, start: int, fifo: str):
        super().__init__(name="ingero-import-feeder", daemon=True)
        self.path, self.start_at, self.fifo = path, start, fifo
        self.tail_meta: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with open_bytes(self.path) as f, open(self.fifo, "wb") as out:
                f.seek(self.start_at)  # a gzip stream seeks forward by reading and dropping the head
                held = bytearray()
                while True:
                    chunk = f.read(CHUNK_BYTES)
                    if not chunk:
                        break
                    held += chunk
                    if len(held) > TAIL_WINDOW + CHUNK_BYTES:
                        cut = len(held) - TAIL_WINDOW
                        out.write(held[:cut])
                        del held[:cut]
                found = find_array_end(bytes(held))
                if found is None:
                    raise ValueError("end of traceEvents not found")
                out.write(held[: found[0] + 1])
                self.tail_meta = found[1]
        except BaseException as exc:  # reported to the importer, which falls back to the slow path
            self.error = exc


def _stage_fast(con: duckdb.DuckDBPyConnection, path: Path) -> dict[str, Any] | None:
    """The fast path; the trace's top-level keys, or None when the slow path must do it."""
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
    with tempfile.TemporaryDirectory(prefix="ingero-import-") as tmp:
        fifo = os.path.join(tmp, "events.json")
        os.mkfifo(fifo, 0o600)
        feeder = _Feeder(path, start, fifo)
        feeder.start()
        try:
            con.execute(f"""CREATE OR REPLACE TEMP TABLE _imp_raw AS {RAW_SELECT}
                            FROM read_json($fifo, format = 'array', columns = $columns)""",
                        {"fifo": fifo, "columns": READ_COLUMNS})
        except duckdb.Error:
            return None
        finally:
            if feeder.is_alive():
                # DuckDB stopped reading: open and close the read end so the writer gets EPIPE
                fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                os.close(fd)
            feeder.join()
    if feeder.error is not None or feeder.tail_meta is None:
        return None
    meta.update(feeder.tail_meta)
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
