"""The data an export covers (a store ``Selection``: one session, a time range, optionally
some processes), and how exporters read it.

The same resolution explain uses (ingero.analyze.context), so an export and
an explain with the same flags talk about the same rows.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import duckdb

from ingero.analyze.context import Options, resolve
from ingero.errors import IngeroError
from ingero.store.db import named_params
from ingero.store.selection import Selection

# The rows of a table in the selection; every exporter filters with it.
WHERE = Selection.where()
COUNT_SQL = f"SELECT count(*) FROM events WHERE {WHERE}"


def select(con: duckdb.DuckDBPyConnection, opts: Options) -> Selection:
    """Resolve the options; an empty selection is the user's error (one line, exit 2)."""
    ctx = resolve(con, opts)
    sel = Selection(ctx.session_id, ctx.start_ns, ctx.end_ns, tuple(opts.pids))
    if int(con.execute(COUNT_SQL, sel.params()).fetchall()[0][0]) == 0:
        who = f" of PID {', '.join(map(str, opts.pids))}" if opts.pids else ""
        raise IngeroError(f"the selection holds no events{who} in session {sel.session_id}",
                          "widen --since, pick another --session or --pid (see `ingero status`)")
    return sel


def run(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """Execute with the parameters ``sql`` names (DuckDB refuses unused ones)."""
    return con.execute(sql, named_params(sql, params))


def reader(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any], rows: int) -> Any:
    """A pyarrow RecordBatchReader over the result, read batch by batch (bounded memory)."""
    return con.sql(sql, params=named_params(sql, params)).to_arrow_reader(rows)


# DuckDB's sort of a whole session (ORDER BY thread, time) takes memory up to its limit
# (80% of RAM by default: 1.5 GB for 10 M events here); with this it spills instead
# (412 MB peak, 3.1 -> 4.3 s for 10 M rows).
STREAM_MEMORY = "256MB"


@contextlib.contextmanager
def bounded_memory(con: duckdb.DuckDBPyConnection, limit: str = STREAM_MEMORY) -> Iterator[None]:
    """Lower DuckDB's memory limit while a stream is read, then restore it."""
    before = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    con.execute("SET memory_limit = $m", {"m": limit})
    try:
        yield
    finally:
        con.execute("SET memory_limit = $m", {"m": before})
