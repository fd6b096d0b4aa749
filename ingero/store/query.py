"""Run SQL typed by a user against the store, safely.

The connection is read-only with external access off and the configuration
locked (see db.USER_SQL_CONFIG): ingero often runs as root, and a query must
never become a way to read or write files.  When a running tracer holds the
database (DuckDB allows one writer process), the query goes to the tracer's
query socket instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ingero.errors import IngeroError, first_line
from ingero.store.db import default_db_path, open_for_user_sql

DEFAULT_MAX_ROWS = 10_000


@dataclass
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool  # more rows existed than max_rows



def explain_duckdb_error(exc: duckdb.Error) -> IngeroError:
    """One line for a failed user query: what DuckDB said and what to do."""
    msg = first_line(exc)
    if isinstance(exc, duckdb.PermissionException) or "disabled by configuration" in msg:
        return IngeroError(
            f"refused: {msg}",
            "queries run read-only without file, network or extension access; select from the ingero tables",
        )
    if "configuration has been locked" in msg:
        return IngeroError(f"refused: {msg}", "settings cannot be changed from a query")
    if "read-only mode" in msg:
        return IngeroError(f"refused: {msg}", "queries are read-only")
    if isinstance(exc, (duckdb.ParserException, duckdb.CatalogException, duckdb.BinderException)):
        return IngeroError(f"bad SQL: {msg}", "`ingero query --schema` lists the tables and columns")
    return IngeroError(f"query failed: {msg}")


def run_query(sql: str, db_path: Path | None = None, *, max_rows: int = DEFAULT_MAX_ROWS) -> QueryResult:
    """Run one user query read-only; at most ``max_rows`` rows are returned."""
    if not sql.strip():
        raise IngeroError("empty query", 'pass SQL, e.g. ingero query "SELECT op, count(*) FROM events GROUP BY op"')
    path = db_path or default_db_path()
    try:
        con = open_for_user_sql(path)
    except IngeroError as exc:
        from ingero.daemon.client import is_lock_error

        if is_lock_error(exc):
            return _query_daemon(sql, path, max_rows)
        raise
    try:
        try:
            cur = con.execute(sql)
        except duckdb.Error as exc:
            raise explain_duckdb_error(exc) from None
        if cur.description is None:
            return QueryResult([], [], [], False)
        columns = [d[0] for d in cur.description]
        types = [str(d[1]) for d in cur.description]
        rows = cur.fetchmany(max_rows + 1)
        return QueryResult(columns, types, rows[:max_rows], len(rows) > max_rows)
    finally:
        con.close()


def _query_daemon(sql: str, path: Path, max_rows: int) -> QueryResult:
    """The DB is held by a running tracer: ask the tracer writing it, over its query socket."""
    from ingero.daemon import client  # only here: plain queries never touch sockets

    socket_path = client.find_socket(path)
    if socket_path is None:
        raise IngeroError(
            f"database {path} is locked by another process and no ingero tracer serving it was found",
            "wait for that process to finish, or pass another --db",
        )
    reply = client.query_reply(sql, socket_path=socket_path, max_rows=max_rows)
    return QueryResult(
        list(reply["columns"]),
        [str(t) for t in reply.get("types") or ["?"] * len(reply["columns"])],
        [tuple(r) for r in reply["rows"]],
        bool(reply.get("truncated")),
    )
