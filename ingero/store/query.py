"""Run SQL typed by a user against the store, safely, under one set of caps.

Four paths run a user's SQL: `ingero query` on a file, the tracer's query
socket (daemon/server.py), MCP's ``query`` tool and `ingero fleet query`.
They take every cap from here, so none of them can be looser than another:

- what the connection may do (``USER_SQL_SETTINGS``, ``lock_down``): no file,
  network or extension access, configuration locked, DuckDB memory and
  worker threads bounded;
- how much comes back (``fetch_bounded``): rows, a row's size (checked inside
  DuckDB, before Python holds the row) and the reply's encoded size, counted
  while rows are fetched;
- how long it runs (DEFAULT_TIMEOUT_S .. MAX_TIMEOUT_S: the socket's timer,
  daemon.access.run_interruptible for the others, which Ctrl-C also stops);
- how long the SQL text may be (MAX_SQL_CHARS), and which statements run at
  all (daemon/sqlguard.py: one read-only statement, no acting functions, no
  value larger than a row may be).

ingero often runs as root: a query must never become a way to read or write
files, nor to take the machine's memory.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from dataclasses import dataclass
from typing import Any

import duckdb

from ingero.errors import IngeroError, first_line
from ingero.store import valuecap

# Rows: a terminal's worth by default; the cap keeps one reply (each row is JSON in RAM) bounded.
DEFAULT_MAX_ROWS = 10_000
MAX_ROWS_CAP = 200_000
# Time: an interactive query; the cap stops one client pinning a read transaction (which keeps
# old row versions alive in the tracer) for long.
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 300.0
# The SQL text: any real query is far shorter; the text is quoted back in evidence and errors.
MAX_SQL_CHARS = 256 * 1024
# A reply larger than this is refused, counted while rows are fetched (FETCH_CHUNK rows at a
# time), so no path holds much more than this per query.  One row, and one value any function
# builds (sqlguard), may not exceed MAX_ROW_BYTES: SELECT repeat('x', 1e9) took the tracer from
# 361 MiB to 4.2 GiB before the row check, and to 2.3 GiB with it, before the value check.
MAX_REPLY_BYTES = 64 << 20
MAX_ROW_BYTES = 1 << 20
FETCH_CHUNK = 64
# DuckDB's memory and worker threads for a connection running user SQL: in the tracer these
# are the whole instance's (writer and queries), which shares the host with the training job;
# DuckDB's own default is 80% of RAM.  1 GiB keeps sorts and joins of a day of events in memory.
MEMORY_LIMIT_BYTES = 1 << 30
THREADS = 2

# The settings of a connection opened for user SQL (a file: db.open_for_user_sql; fleet's
# in-memory one: lock_down).  enable_external_access=false refuses COPY TO/FROM, read_csv /
# read_text of paths, ATTACH, INSTALL/LOAD; lock_configuration refuses SET, so none of it (nor
# the memory limit) can be turned back on.
USER_SQL_SETTINGS: dict[str, Any] = {
    "memory_limit": f"{MEMORY_LIMIT_BYTES}B",
    "threads": THREADS,
    "enable_external_access": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "lock_configuration": True,
}


@dataclass
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[Any]  # tuples or lists, one per row
    truncated: bool  # more rows existed than max_rows


def lock_down(con: duckdb.DuckDBPyConnection, *, memory_limit_bytes: int | None = MEMORY_LIMIT_BYTES,
              threads: int = THREADS) -> None:
    """USER_SQL_SETTINGS on a connection already open (the tracer's, fleet's in-memory one).

    These are instance-wide settings: set through any cursor they hold for the writer
    connection and every cursor.  Measured on duckdb 2.0: the writer's own appends
    (register of an Arrow table + INSERT ... SELECT), DELETE and CHECKPOINT keep working
    afterwards; read_text/COPY TO/ATTACH/INSTALL/LOAD fail with PermissionException and SET
    with "the configuration has been locked".  Idempotent (a locked connection is left as it is).
    """
    locked = con.execute("SELECT current_setting('lock_configuration')").fetchall()[0][0]
    if locked:
        return
    if memory_limit_bytes:
        con.execute(f"SET memory_limit = '{int(memory_limit_bytes)}B'")
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def explain_duckdb_error(exc: duckdb.Error) -> IngeroError:
    """One line for a failed user query: what DuckDB said and what to do."""
    msg = first_line(exc)
    too_big = valuecap.refusal(msg, MAX_ROW_BYTES)
    if too_big is not None:
        return IngeroError(too_big, "build smaller values, or aggregate in SQL")
    if isinstance(exc, duckdb.PermissionException) or "disabled by configuration" in msg:
        return IngeroError(
            f"refused: {msg}",
            "queries run read-only without file, network or extension access; select from the ingero tables",
        )
    if "configuration has been locked" in msg:
        return IngeroError(f"refused: {msg}", "settings cannot be changed from a query")
    if "read-only mode" in msg:
        return IngeroError(f"refused: {msg}", "queries are read-only")
    if isinstance(exc, duckdb.OutOfMemoryException):
        return IngeroError(f"query failed: {msg}",
                           f"queries get {MEMORY_LIMIT_BYTES >> 20} MiB of DuckDB memory: aggregate, or narrow the "
                           "range (WHERE timestamp > ...)")
    if isinstance(exc, (duckdb.ParserException, duckdb.CatalogException, duckdb.BinderException)):
        return IngeroError(f"bad SQL: {msg}", "`ingero query --schema` lists the tables and columns")
    return IngeroError(f"query failed: {msg}")


def check_sql_text(sql: Any) -> None:
    """The text itself: a non-empty string of at most MAX_SQL_CHARS."""
    if not isinstance(sql, str) or not sql.strip():
        raise IngeroError("empty query", 'pass SQL, e.g. ingero query "SELECT op, count(*) FROM events GROUP BY op"')
    if len(sql) > MAX_SQL_CHARS:
        raise IngeroError(f"query too long: {len(sql):,} characters, more than the limit of {MAX_SQL_CHARS:,}",
                          "send one statement over the ingero tables")


def json_default(value: Any) -> Any:
    """How a reply writes what JSON has no type for (the socket's encoder and the size count)."""
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


def encoded_size(value: Any) -> int:
    """Bytes of ``value`` as a reply encodes it (compact JSON, ASCII)."""
    return len(json.dumps(value, default=json_default, separators=(",", ":"), allow_nan=True))


def _bounded_sql(stmt: str, types: list[str]) -> str:
    """The SELECT wrapped so that DuckDB refuses a row over MAX_ROW_BYTES before Python sees it."""
    cols = [f"_c{i}" for i in range(len(types))]
    size = " + ".join(
        f"coalesce(strlen({c}), 0)" if t == "VARCHAR" else f"coalesce(octet_length({c}), 0)" if t == "BLOB"
        else f"coalesce(strlen(CAST({c} AS VARCHAR)), 0)" for c, t in zip(cols, types))
    return (f"SELECT * FROM ({stmt}) AS _ingero_q({', '.join(cols)}) WHERE CASE WHEN {size} > {MAX_ROW_BYTES} "
            f"THEN error('a row of the result is larger than {MAX_ROW_BYTES >> 20} MiB') ELSE true END")


def _bytes(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


def fetch_bounded(cur: duckdb.DuckDBPyConnection, stmt: str, max_rows: int = DEFAULT_MAX_ROWS,
                  max_bytes: int = MAX_REPLY_BYTES) -> QueryResult:
    """Run ``stmt`` (one statement sqlguard allowed) and fetch at most ``max_rows`` rows, counting
    the reply's encoded size as rows arrive: past ``max_bytes`` it is refused before more rows are
    fetched.  DuckDB errors are raised as they are (callers word them for their users)."""
    names = None
    kind = str(cur.extract_statements(stmt)[0].type).rsplit(".", 1)[-1]
    if kind == "SELECT":  # the others (EXPLAIN, PRAGMA) describe the DB: small replies
        rel = cur.sql(stmt)  # planned, not run: names and types only
        names, types = list(rel.columns), [str(t) for t in rel.types]
        cur.execute(_bounded_sql(stmt, types) if types else stmt)
    else:
        cur.execute(stmt)
    desc = cur.description or []
    rows: list[Any] = []
    size = 0
    truncated = False
    while True:
        chunk = cur.fetchmany(FETCH_CHUNK)
        if not chunk:
            break
        for r in chunk:
            if len(rows) == max_rows:
                truncated = True
                break
            size += encoded_size(r) + 1
            if size > max_bytes:
                raise IngeroError(f"result too large: more than {_bytes(max_bytes)} after {len(rows)} rows",
                                  "select fewer columns or rows, or aggregate in SQL")
            rows.append(r)
        if truncated:
            break
    columns = names if names is not None and len(names) == len(desc) else [d[0] for d in desc]
    return QueryResult(columns, [str(d[1]) for d in desc], rows, truncated)


def run_on(con: duckdb.DuckDBPyConnection, stmt: str, max_rows: int = DEFAULT_MAX_ROWS,
           max_bytes: int = MAX_REPLY_BYTES) -> QueryResult:
    """fetch_bounded on a connection opened for user SQL, DuckDB's errors worded as one line."""
    check_sql_text(stmt)
    try:
        return fetch_bounded(con, stmt, max_rows, max_bytes)
    except duckdb.InterruptException:
        raise  # the caller's time limit or Ctrl-C: it says which
    except duckdb.Error as exc:
        raise explain_duckdb_error(exc) from None


def from_reply(reply: dict[str, Any]) -> QueryResult:
    """A QueryResult from the tracer's socket reply to {"sql": ...}."""
    return QueryResult(
        list(reply["columns"]),
        [str(t) for t in reply.get("types") or ["?"] * len(reply["columns"])],
        [tuple(r) for r in reply["rows"]],
        bool(reply.get("truncated")),
    )
