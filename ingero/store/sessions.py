"""Reading rows of the sessions table by column name.

Migrations add session columns (stale_calls in schema 2, sched_autogroup in
4), and a read-only open of an older file cannot migrate it: readers take the
row as a dict of whatever columns the file has, and a column it lacks reads
as None, instead of each reader probing the catalog for each column.
"""

from __future__ import annotations

from typing import Any

import duckdb


def latest_session(con: duckdb.DuckDBPyConnection, where: str = "TRUE",
                   params: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The newest sessions row matching ``where`` (SQL over sessions' columns, values as $params)."""
    cur = con.execute(f"SELECT * FROM sessions WHERE {where} ORDER BY session_id DESC LIMIT 1", params or {})
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip((d[0] for d in cur.description), row))
