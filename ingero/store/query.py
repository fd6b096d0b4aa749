"""Run SQL typed by a user against the store, safely.

The connection is read-only with external access off and the configuration
locked (see db.USER_SQL_CONFIG): ingero often runs as root, and a query must
never become a way to read or write files.  When a running tracer holds the
database (DuckDB allows one writer process), the query goes to the tracer's
query socket instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from ingero.errors import IngeroError, first_line

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


def check_sql_text(sql: str) -> None:
    if not sql.strip():
        raise IngeroError("empty query", 'pass SQL, e.g. ingero query "SELECT op, count(*) FROM events GROUP BY op"')


def run_on(con: duckdb.DuckDBPyConnection, sql: str, max_rows: int = DEFAULT_MAX_ROWS) -> QueryResult:
    """Run one user query on ``con`` (a connection from db.open_for_user_sql); at most ``max_rows`` rows."""
    check_sql_text(sql)
    try:
        cur = con.execute(sql)
        if cur.description is None:
            return QueryResult([], [], [], False)
        columns = [d[0] for d in cur.description]
        types = [str(d[1]) for d in cur.description]
        rows = cur.fetchmany(max_rows + 1)
    except duckdb.InterruptException:
        raise  # the caller's time limit or Ctrl-C: it says which
    except duckdb.Error as exc:
        raise explain_duckdb_error(exc) from None
    return QueryResult(columns, types, rows[:max_rows], len(rows) > max_rows)


def from_reply(reply: dict[str, Any]) -> QueryResult:
    """A QueryResult from the tracer's socket reply to {"sql": ...}."""
    return QueryResult(
        list(reply["columns"]),
        [str(t) for t in reply.get("types") or ["?"] * len(reply["columns"])],
        [tuple(r) for r in reply["rows"]],
        bool(reply.get("truncated")),
    )
