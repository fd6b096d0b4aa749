"""Databases as older ingero versions left them, for the migration tests.

Rebuilt from today's schema.sql by undoing each change of db.MIGRATIONS'
changelog, with asserts that fail loudly when schema.sql changes shape.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from ingero.store.db import schema_sql

IMPORT_V7 = "-- ---- Imported traces (schema 7)"
HISTORY_V9 = "-- What each process was called over time"
RANKS_V10 = "-- Which rank of which job each traced process is"
THREADS_V15 = "-- The name of each thread of a traced process"
WINDOWS_V11 = "-- ---- Per-second summaries (schema 11)"
OP_ENUM_V11 = "CREATE TYPE IF NOT EXISTS OP_NAME AS ENUM ("
KIND_ENUM_V11 = "CREATE TYPE IF NOT EXISTS EVENT_KIND AS ENUM ("
CGROUP_V15 = "-- ---- CPU limits (schema 15)"
SOURCE_V3 = "    source VARCHAR               -- text of that line, when readable\n"


def _drop_trailing_columns(sql: str, added: tuple[str, ...], last: str, table: str = "") -> str:
    """Undo columns a migration appended to a table: remove the lines of the ``added`` columns
    and take the comma off the line that was the table's last before them (it starts with
    ``last``).  Every line must be found exactly once, or the fixture is out of date.  ``table``
    narrows the search to one CREATE TABLE statement (for a column name other tables use too)."""
    if table:
        head, sep, rest = sql.partition(f"CREATE TABLE IF NOT EXISTS {table} (")
        assert sep, f"schema.sql changed shape ({table}): update this fixture"
        body, end, tail = rest.partition("\n);")
        return head + sep + _drop_trailing_columns(body, added, last) + end + tail
    lines = sql.splitlines(keepends=True)
    for name in added:
        found = [ln for ln in lines if ln.lstrip().startswith(name + " ")]
        assert len(found) == 1, f"schema.sql changed shape ({name}): update this fixture"
        sql = sql.replace(found[0], "")
    before = [ln for ln in lines if ln.lstrip().startswith(last) and ",  " in ln]
    assert len(before) == 1, f"schema.sql changed shape ({last}): update this fixture"
    return sql.replace(before[0], before[0].replace(",  ", "   ", 1))


def old_schema(version: int) -> str:
    """schema.sql as it was at ``version`` (1 to 10), rebuilt from today's by undoing each change."""
    sql = schema_sql()
    # 17 added sessions.switch_holder
    sql = _drop_trailing_columns(sql, ("switch_holder",), last="call_cost_ns DOUBLE", table="sessions")
    # 15 added cgroup_cpu (appended at the end)
    assert sql.count(CGROUP_V15) == 1, "schema.sql changed shape: update this fixture"
    sql = sql[: sql.index(CGROUP_V15)].rstrip("\n") + "\n"
    # and what a switch waited for: events.syscall, wait_fd, fd_target, waker_pid, waker_tid
    sql = _drop_trailing_columns(sql, ("syscall", "wait_fd", "fd_target", "waker_pid", "waker_tid"),
                                 last="peer INTEGER", table="events")
    head, sep, rest = sql.partition(THREADS_V15)  # and the thread_names table
    assert sep, "schema.sql changed shape (thread_names): update this fixture"
    sql = head + rest[rest.index(");\n") + 3:].lstrip("\n")
    # 14 added sessions.call_cost_ns, 13 sessions.summaries_pending_ns
    sql = _drop_trailing_columns(sql, ("call_cost_ns",), last="summaries_pending_ns BIGINT", table="sessions")
    sql = _drop_trailing_columns(sql, ("summaries_pending_ns",), last="notes VARCHAR", table="sessions")
    # 11 added windows and window_late_waits (appended at the end) and the OP_NAME enum of
    # events.op and events.in_call (VARCHAR before)
    assert sql.count(WINDOWS_V11) == 1, "schema.sql changed shape: update this fixture"
    sql = sql[: sql.index(WINDOWS_V11)]
    for marker in (OP_ENUM_V11, KIND_ENUM_V11):
        head, sep, rest = sql.partition(marker)
        assert sep, f"schema.sql changed shape ({marker}): update this fixture"
        sql = head + rest[rest.index(");\n") + 3:]
    for col, typ in (("op OP_NAME NOT NULL,", "OP_NAME"), ("in_call OP_NAME,", "OP_NAME"),
                     ("kind EVENT_KIND,", "EVENT_KIND")):
        assert sql.count(col) == 1, f"schema.sql changed shape ({col}): update this fixture"
        sql = sql.replace(col, col.replace(typ, "VARCHAR"))
    if version >= 10:
        return sql
    # 10 added ranks (appended at the end) and events.comm, events.peer
    assert sql.count(RANKS_V10) == 1, "schema.sql changed shape: update this fixture"
    sql = sql[: sql.index(RANKS_V10)]
    sql = _drop_trailing_columns(sql, ("comm", "peer"), last="queued BOOLEAN", table="events")
    if version >= 9:
        return sql
    # 9 added process_history (appended at the end)
    assert sql.count(HISTORY_V9) == 1, "schema.sql changed shape: update this fixture"
    sql = sql[: sql.index(HISTORY_V9)]
    # 8 added sessions.notes
    sql = _drop_trailing_columns(sql, ("notes",), last="clock_offset_ns BIGINT")
    if version >= 7:
        return sql
    # 7 added device_activity, spans (appended at the end) and six sessions columns
    assert sql.count(IMPORT_V7) == 1, "schema.sql changed shape: update this fixture"
    sql = sql[: sql.index(IMPORT_V7)]
    sql = _drop_trailing_columns(sql, ("imported_from", "rank", "world_size", "device_properties", "import_unused",
                                       "clock_offset_ns"), last="probe_misses BIGINT DEFAULT 0")
    if version >= 6:
        return sql
    # 6 added sessions.probe_misses
    sql = _drop_trailing_columns(sql, ("probe_misses",), last="sched_autogroup BOOLEAN")
    if version >= 5:
        return sql
    # 5 added events.in_call and events.queued
    sql = _drop_trailing_columns(sql, ("in_call", "queued"), last="stack_id BIGINT,")
    if version >= 4:
        return sql
    # 4 added sessions.sched_autogroup
    sql = _drop_trailing_columns(sql, ("sched_autogroup",), last="stale_calls BIGINT")
    if version >= 3:
        return sql
    assert SOURCE_V3 in sql, "schema.sql changed shape: update this fixture"
    # 3 dropped the PRIMARY KEY of stacks
    sql = sql.replace(SOURCE_V3, "    source VARCHAR,              -- text of that line, when readable\n"
                                 "    PRIMARY KEY (stack_id, depth)\n")
    if version >= 2:
        return sql
    # 2 added sessions.stale_calls
    return _drop_trailing_columns(sql, ("stale_calls",), last="ncpu INTEGER,")


def write_old_file(path: Path, version: int = 1) -> None:
    """A database as ingero with schema ``version`` left it: one closed session, one 2-frame stack."""
    con = duckdb.connect(str(path))
    con.execute(old_schema(version))
    con.execute("INSERT INTO meta VALUES ('schema_version', $v)", {"v": str(version)})
    con.execute("INSERT INTO sessions (session_id, started_ns, ended_ns, status, events, drops_kernel, drops_user) "
                "VALUES (1, 10, 20, 'closed', 5, 0, 0)")
    con.execute("INSERT INTO stacks (stack_id, depth, function) VALUES (77, 0, 'inner'), (77, 1, 'outer')")
    con.close()
