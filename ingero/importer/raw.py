"""Stage a trace's events into one temporary table, ``_imp_raw``, with the fields the importer uses.

Fast path: the keys before ``traceEvents`` are read in Python (they are small),
then the array itself goes to DuckDB's JSON reader (C++, columnar: ~4x the C
json module here) in pieces of whole events, each a temporary file.  The array's
end is found in the last TAIL_WINDOW bytes of the input, whose remaining keys
(``baseTimeNanoseconds`` follows the events in some traces) are decoded there.

Slow path, when DuckDB refuses the array (an unusual layout, bad JSON) or the
input has no place to cut it (one value, or a run of blanks, longer than
MAX_TOKEN_BYTES): the streaming Python reader (reader.py), which also names
what is wrong with a bad file.  It writes the events it decoded, as JSON lines,
to a temporary file that DuckDB reads the same way.

Both paths give DuckDB the same text and convert it with the same SQL
(RAW_SELECT), so a value means the same whichever path read it.  Every field is
read as text and converted here, by one rule per kind:
- an integer field (pid, tid, device: 32 bits; correlation, external id,
  stream, bytes: 64) takes a JSON integer that fits, or a string holding one
  ("tid": "1234", as PyTorch 1.x writes it); a device row's stream also comes
  from a "tid" of "stream 7" (Kineto before 1.10);
- ts and dur take a JSON number or a numeric string, as a double (load.py
  then refuses non-finite and out-of-range times);
- anything else is NULL.  A NUMBER that does not fit (1.5 as a pid, 1e30 as a
  correlation, NaN, a negative byte count) sets its field's bit in ``bad``:
  a counted, skipped value (the import summary lists them), never an error.
A string that is not a number ("pid": "Spans", "tid": "stream 7") is just not a
number: not counted.
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
from typing import Any, BinaryIO

import duckdb

from ingero.errors import IngeroError, first_line
from ingero.importer.reader import CHUNK_BYTES, MAX_TOKEN_BYTES, KinetoReader
from ingero.importer.source import Source, as_source, not_a_trace

TAIL_WINDOW = 4 << 20  # bytes held back to find the array's end: the keys after it must fit
MAX_END_CANDIDATES = 64  # ']'s tried as the array's end before the slow path takes over

# What DuckDB reads of each event: the strings and ids as text (JSON values other than strings
# as their JSON text), ts and dur as JSON (cast to a double from there: rendering every double as
# text first cost +60% of the read), args as JSON, from which ARG_KEYS are taken in one pass.
READ_COLUMNS = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR",
                "ts": "JSON", "dur": "JSON", "args": "JSON"}
# Kineto's args keys read; 'External id' (1.10+, and CPU ops before) and 'external id'
# (runtime calls and device activity before 1.10) are the same link.
ARG_KEYS = ("correlation", "device", "stream", "bytes", "name", "External id", "external id")
ARG_PATHS = [f'$."{k}"' for k in ARG_KEYS]

# The bit of ``bad`` for each integer field, in this order (load.py counts them by name)
INT_FIELDS = (  # (column, type, text expression in ``t`` below, extra condition on the value)
    ("pid", "INTEGER", "pid_t", ""),
    ("tid", "INTEGER", "tid_t", ""),
    ("correlation", "BIGINT", "a[1]", ""),
    ("device", "INTEGER", "a[2]", ""),
    ("stream", "BIGINT", "stream_text", ""),
    ("bytes", "BIGINT", "a[4]", " AND {v} >= 0"),
    ("ext_id", "BIGINT", "coalesce(a[6], a[7])", ""),
)
BAD_FIELD_NAMES = {"pid": "pid", "tid": "tid", "correlation": "args.correlation", "device": "args.device",
                   "stream": "args.stream", "bytes": "args.bytes", "ext_id": "args.External id"}


def _double(col: str) -> str:
    """A JSON number, or a string holding one, as a double (NaN and the infinities kept: load.py
    refuses them); a boolean (which a cast would make 1.0), an object or an array gives NULL."""
    return f"CASE WHEN {col} IN ('true', 'false') THEN NULL ELSE TRY_CAST({col} AS DOUBLE) END"


def _raw_select() -> str:
    """INSERT INTO _imp_raw {this} with {src} a read_json(...) of the events ($paths: ARG_PATHS)."""
    casts, oks, bads = [], [], []
    vals: dict[str, str] = {}
    for bit, (col, typ, text, extra) in enumerate(INT_FIELDS):
        casts.append(f"{text} AS {col}_t, TRY_CAST({text} AS {typ}) AS {col}_c")
        # the text must be the number's own decimal form: 1.5 (read as '1.5') is not a pid 2, nor
        # is 1e3 (read as '1000.0') or " 12"; the cast refuses the rest (true, 'stream 7', 2^64)
        oks.append(f"coalesce({col}_c::VARCHAR = {col}_t{extra.format(v=f'{col}_c')}, false) AS {col}_ok")
        vals[col] = f"CASE WHEN {col}_ok THEN {col}_c END AS {col}"
        bads.append(f"CASE WHEN {col}_t IS NOT NULL AND NOT {col}_ok AND TRY_CAST({col}_t AS DOUBLE) IS NOT NULL "
                    f"THEN {1 << bit} ELSE 0 END")
    v = vals
    return f"""
WITH j AS (
    SELECT ph, cat, name, pid AS pid_t, tid AS tid_t, ts, dur, json_extract_string(args, $paths) AS a FROM {{src}}
), r AS (
    SELECT *, coalesce(a[3], CASE WHEN starts_with(tid_t, 'stream ') THEN substr(tid_t, 8) END) AS stream_text FROM j
), t AS (
    SELECT ph, cat, name, {_double("ts")} AS ts, {_double("dur")} AS dur, a[5] AS arg_name,
           {', '.join(casts)}
    FROM r
), k AS (SELECT *, {', '.join(oks)} FROM t)
SELECT ph, cat, name, {v["pid"]}, {v["tid"]}, ts, dur, {v["correlation"]}, {v["ext_id"]}, {v["device"]}, {v["stream"]},
       {v["bytes"]}, arg_name, ({' + '.join(bads)})::UTINYINT AS bad
FROM k"""


RAW_SELECT = _raw_select()

# The staged rows live in a scratch database of their own, a DuckDB file in TMPDIR (deleted when
# the import ends): its tables are compressed and on disk, read through DuckDB's buffer pool, so
# the import's memory does not grow with the trace (a TEMP table is held in memory, uncompressed:
# ~120 bytes a row, 600 MB for 5 M events).  TEMP views under the old names read them.
SCRATCH = "ing_imp"
RAW_TABLE = f"{SCRATCH}._imp_raw"
RAW_DDL = f"""CREATE OR REPLACE TABLE {RAW_TABLE} (ph VARCHAR, cat VARCHAR, name VARCHAR, pid INTEGER,
    tid INTEGER, ts DOUBLE, dur DOUBLE, correlation BIGINT, ext_id BIGINT, device INTEGER, stream BIGINT,
    bytes BIGINT, arg_name VARCHAR, bad UTINYINT)"""
RAW_INSERT = f"INSERT INTO {RAW_TABLE} SELECT * FROM (" + RAW_SELECT + ")"
_scratch_dirs: dict[int, tempfile.TemporaryDirectory] = {}


def attach_scratch(con: duckdb.DuckDBPyConnection) -> None:
    """Attach the import's scratch database to ``con`` (once; detach_scratch removes it)."""
    if con.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = $n",
                   {"n": SCRATCH}).fetchone()[0]:
        return
    tmp = tempfile.TemporaryDirectory(prefix="ingero-import-")
    path = os.path.join(tmp.name, "scratch.duckdb").replace("'", "''")
    try:
        con.execute(f"ATTACH '{path}' AS {SCRATCH}")
    except duckdb.Error as exc:
        tmp.cleanup()
        raise IngeroError(f"cannot create the import's scratch database in {tempfile.gettempdir()}: "
                          f"{first_line(exc)}", "set TMPDIR to a writable disk with room") from None
    _scratch_dirs[id(con)] = tmp


def detach_scratch(con: duckdb.DuckDBPyConnection) -> None:
    tmp = _scratch_dirs.pop(id(con), None)
    if tmp is not None:
        con.execute(f"DETACH DATABASE IF EXISTS {SCRATCH}")
        tmp.cleanup()


def _create_raw(con: duckdb.DuckDBPyConnection) -> None:
    attach_scratch(con)
    con.execute(RAW_DDL)
    con.execute(f"CREATE OR REPLACE TEMP VIEW _imp_raw AS SELECT * FROM {RAW_TABLE}")


def _insert(con: duckdb.DuckDBPyConnection, path: str, fmt: str) -> None:
    src = "read_json($p, format = $fmt, columns = $columns, maximum_object_size = $mos)"
    con.execute(RAW_INSERT.replace("{src}", src), {"p": path, "fmt": fmt, "columns": READ_COLUMNS, "paths": ARG_PATHS,
                                                   "mos": MAX_TOKEN_BYTES + (1 << 20)})


def _tail_meta(rest: bytes) -> dict[str, Any] | None:
    """The keys after the array, from the bytes after its ']'; None when they do not parse."""
    rest = rest.strip()
    if rest == b"}":
        return {}
    if not rest.startswith(b","):
        return None
    try:
        meta = json.loads(b"{" + rest[1:])
    except (ValueError, RecursionError):
        return None
    return meta if isinstance(meta, dict) else None


_BLANK = b" \t\r\n"
_OPENERS = b"}["


def find_array_end(tail: bytes) -> tuple[int, dict[str, Any]] | None:
    """Offset in ``tail`` of the ']' closing traceEvents, and the keys after it.

    Scans the ']'s right to left for one preceded by the end of an event ('}')
    or the array's start, followed by valid keys and the object's '}'.  A wrong
    pick (a list of objects after the events) makes the array unbalanced, which
    DuckDB then refuses, and the slow path takes over; so does a tail with more
    than MAX_END_CANDIDATES places to try (each try parses the rest).
    """
    p = len(tail)
    tries = 0
    while True:
        p = tail.rfind(b"]", 0, p)
        if p < 0:
            return None
        q = p - 1
        while q >= 0 and tail[q] in _BLANK:  # the character before it (no copy: a tail of 200 k ']')
            q -= 1
        if q < 0 or tail[q] in _OPENERS:
            tries += 1
            if tries > MAX_END_CANDIDATES:
                return None
            meta = _tail_meta(tail[p + 1:])
            if meta is not None:
                return p, meta


# Where one top-level event ends and the next begins: '}', a comma, '{' (blanks between).  A cut
# anywhere else leaves the first piece open (a string or an object inside an event never closed):
# DuckDB refuses it and the slow path takes over, so a wrong cut can fail, never mis-read.
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*(?=\{)")
PIECE_BYTES = 16 << 20  # the array goes to DuckDB in pieces of about this size (bounds memory)


def _skip(f: BinaryIO, n: int) -> None:
    while n > 0:
        got = f.read(min(n, CHUNK_BYTES))
        if not got:
            raise ValueError("the input ends before its events")
        n -= len(got)


def _pieces(source: Source, start: int, tail_meta: dict[str, Any]):
    """The array's elements as JSON arrays of about PIECE_BYTES each (bytes, '[' and ']' added);
    ``tail_meta`` gets the keys after the array.  Raises ValueError where no end is found, and
    where no cut is found within MAX_TOKEN_BYTES (one long value: the slow path refuses it)."""
    with source.open() as f:
        _skip(f, start + 1)  # past the '['
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
                if len(held) > PIECE_BYTES + TAIL_WINDOW + MAX_TOKEN_BYTES:
                    raise ValueError("no place to cut the events")
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
    interrupted = False
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    except (KeyboardInterrupt, SystemExit):
        interrupted = True  # the reader may sit in a read of a silent pipe: a daemon, it dies with us
        raise
    finally:
        stop.set()
        if not interrupted:
            reader.join()


def _stage_fast(con: duckdb.DuckDBPyConnection, source: Source | Path | str) -> dict[str, Any] | None:
    """The fast path; the trace's top-level keys, or None when the slow path must do it.

    The array goes to DuckDB's JSON reader piece by piece, each written to a temporary
    file (DuckDB holds a whole array read through a pipe in memory: ~1 GB of a 1 GB trace)."""
    source, own = as_source(source)
    try:
        head = KinetoReader(source, encoding="latin-1")
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
        _create_raw(con)
        with tempfile.TemporaryDirectory(prefix="ingero-import-") as tmp:
            piece_path = os.path.join(tmp, "events.json")
            try:
                for piece in _ahead(_pieces(source, start, tail)):
                    with open(piece_path, "wb") as out:
                        out.write(piece)
                    del piece
                    _insert(con, piece_path, "array")
            except (duckdb.Error, ValueError, OSError, EOFError, zlib.error, gzip.BadGzipFile):
                return None
        meta.update(_fix_latin1(tail))
        meta["_events_key"] = True
        return meta
    finally:
        if own:
            source.close()


def _fix_latin1(value: Any, depth: int = 0) -> Any:
    """Strings decoded byte-per-character (latin-1) back to their UTF-8 text (to a depth of 32)."""
    if isinstance(value, str):
        try:
            return value.encode("latin-1").decode("utf-8")
        except UnicodeError:
            return value
    if depth > 32:
        return value
    if isinstance(value, list):
        return [_fix_latin1(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {_fix_latin1(k, depth + 1): _fix_latin1(v, depth + 1) for k, v in value.items()}
    return value


_TOP_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur")


def _trimmed(e: dict[str, Any]) -> dict[str, Any]:
    """The fields RAW_SELECT reads, as the input had them (so DuckDB sees the same values)."""
    out = {k: e[k] for k in _TOP_KEYS if k in e}
    if "args" in e:
        args = e["args"]
        out["args"] = {k: args[k] for k in ARG_KEYS if k in args} if isinstance(args, dict) else args
    return out


def _stage_slow(con: duckdb.DuckDBPyConnection, source: Source | Path | str) -> dict[str, Any]:
    source, own = as_source(source)
    _create_raw(con)
    reader = KinetoReader(source)
    try:
        with tempfile.TemporaryDirectory(prefix="ingero-import-") as tmp:
            lines_path = os.path.join(tmp, "events.jsonl")
            for batch in reader.events():
                # strings may hold lone surrogates (an escaped half of a pair): '?' in UTF-8
                text = "\n".join(json.dumps(_trimmed(e), ensure_ascii=False) for e in batch)
                with open(lines_path, "wb") as out:
                    out.write(text.encode("utf-8", "replace"))
                del text
                try:
                    _insert(con, lines_path, "newline_delimited")
                except duckdb.Error as exc:
                    raise not_a_trace(reader.label, f"its events cannot be read ({first_line(exc)})") from None
    finally:
        reader.close()
        if own:
            source.close()
    meta = dict(reader.meta)
    meta["_events_key"] = reader.saw_events_key
    return meta


def stage(con: duckdb.DuckDBPyConnection, source: Source | Path | str, *, fast: bool = True) -> dict[str, Any]:
    """Fill ``_imp_raw`` from the trace; returns its top-level keys (not traceEvents).

    Raises IngeroError for an input that is not a complete Kineto trace or passes a limit.
    """
    source, own = as_source(source)
    try:
        meta = _stage_fast(con, source) if fast else None
        if meta is None:
            meta = _stage_slow(con, source)
    finally:
        if own:
            source.close()
    if not meta.pop("_events_key"):
        raise not_a_trace(source.label, "it has no traceEvents")
    return meta
