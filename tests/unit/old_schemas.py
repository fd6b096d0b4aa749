"""Databases as older ingero versions left them, for the migration tests.

Rebuilt from today's schema.sql by undoing each change of db.MIGRATIONS'
changelog, with asserts that fail loudly when schema.sql changes shape.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from ingero.store.db import schema_sql

NCPU_V2 = "    ncpu INTEGER,                    -- CPUs on the host\n"
SOURCE_V3 = "    source VARCHAR               -- text of that line, when readable\n"
STACK_ID_V4 = "    stack_id BIGINT,             -- stacks.stack_id with --stack, else NULL\n"


def old_schema(version: int) -> str:
    """schema.sql as it was at ``version`` (1 to 5), rebuilt from today's by undoing each change."""
    sql = schema_sql()
    # 6 added sessions.probe_misses after sched_autogroup
    lines = sql.splitlines(keepends=True)
    misses = [ln for ln in lines if ln.lstrip().startswith("probe_misses ")]
    autogroup = [ln for ln in lines if ln.lstrip().startswith("sched_autogroup BOOLEAN,")]
    assert len(misses) == 1 and len(autogroup) == 1, "schema.sql changed shape: update this fixture"
    sql = sql.replace(misses[0], "").replace(autogroup[0], autogroup[0].replace("BOOLEAN,", "BOOLEAN ", 1))
    if version >= 5:
        return sql
    # 5 added events.in_call and events.queued after stack_id
    lines = sql.splitlines(keepends=True)
    added = [ln for ln in lines if ln.lstrip().startswith(("in_call ", "queued "))]
    assert len(added) == 2 and STACK_ID_V4 in sql, "schema.sql changed shape: update this fixture"
    for ln in added:
        sql = sql.replace(ln, "")
    sql = sql.replace(STACK_ID_V4, "    stack_id BIGINT              -- stacks.stack_id with --stack, else NULL\n")
    if version >= 4:
        return sql
    # 4 added sessions.sched_autogroup after stale_calls
    lines = sql.splitlines(keepends=True)
    autogroup = [ln for ln in lines if ln.lstrip().startswith("sched_autogroup ")]
    stale = [ln for ln in lines if ln.lstrip().startswith("stale_calls ")]
    assert len(autogroup) == 1 and len(stale) == 1, "schema.sql changed shape: update this fixture"
    sql = sql.replace(autogroup[0], "").replace(stale[0], stale[0].replace("DEFAULT 0, ", "DEFAULT 0  ", 1))
    if version >= 3:
        return sql
    assert SOURCE_V3 in sql, "schema.sql changed shape: update this fixture"
    # 3 dropped the PRIMARY KEY of stacks
    sql = sql.replace(SOURCE_V3, "    source VARCHAR,              -- text of that line, when readable\n"
                                 "    PRIMARY KEY (stack_id, depth)\n")
    if version >= 2:
        return sql
    # 2 added sessions.stale_calls
    lines = sql.splitlines(keepends=True)
    stale = [ln for ln in lines if ln.lstrip().startswith("stale_calls ")]
    assert len(stale) == 1 and NCPU_V2 in sql, "schema.sql changed shape: update this fixture"
    return sql.replace(stale[0], "").replace(NCPU_V2, "    ncpu INTEGER                     -- CPUs on the host\n")


def write_old_file(path: Path, version: int = 1) -> None:
    """A database as ingero with schema ``version`` left it: one closed session, one 2-frame stack."""
    con = duckdb.connect(str(path))
    con.execute(old_schema(version))
    con.execute("INSERT INTO meta VALUES ('schema_version', $v)", {"v": str(version)})
    con.execute("INSERT INTO sessions (session_id, started_ns, ended_ns, status, events, drops_kernel, drops_user) "
                "VALUES (1, 10, 20, 'closed', 5, 0, 0)")
    con.execute("INSERT INTO stacks (stack_id, depth, function) VALUES (77, 0, 'inner'), (77, 1, 'outer')")
    con.close()
