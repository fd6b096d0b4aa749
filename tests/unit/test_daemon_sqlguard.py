"""Client SQL reaching the tracer: every escape attempt is refused with its own one-line reason."""

from __future__ import annotations

import duckdb
import pytest

from ingero.daemon.sqlguard import check_sql
from ingero.errors import IngeroError
from ingero.store.db import Store


@pytest.fixture()
def con():
    store = Store.memory()
    yield store.con
    store.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT op, count(*) FROM events GROUP BY op",
        "  select 1;  ",
        "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
        "FROM events LIMIT 3",
        "DESCRIBE events",
        "SHOW TABLES",
        "SUMMARIZE events",
        "EXPLAIN SELECT * FROM events",
        "EXPLAIN ANALYZE SELECT count(*) FROM events",
        "PRAGMA table_info('events')",
        "PRAGMA database_size",
    ],
)
def test_read_only_statements_pass(con, sql):
    assert check_sql(con, sql).strip().rstrip(";").strip()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("COPY events TO '/tmp/out.csv'", "COPY is refused"),
        ("COPY events FROM '/etc/passwd'", "COPY is refused"),
        ("EXPORT DATABASE '/tmp/x'", "EXPORT is refused"),
        ("ATTACH '/tmp/other.duckdb' AS o", "ATTACH is refused"),
        ("DETACH o", "DETACH is refused"),
        ("INSTALL httpfs", "INSTALL/LOAD is refused"),
        ("LOAD httpfs", "INSTALL/LOAD is refused"),
        ("SET enable_external_access = true", "SET is refused"),
        ("SET memory_limit = '100GB'", "SET is refused"),
        ("RESET lock_configuration", "SET is refused"),
        ("CREATE TABLE x (a INT)", "CREATE is refused"),
        ("CREATE MACRO m(a) AS a + 1", "CREATE is refused"),
        ("INSERT INTO meta VALUES ('k', 'v')", "INSERT is refused"),
        ("UPDATE sessions SET status = 'closed'", "UPDATE is refused"),
        ("DELETE FROM events", "DELETE is refused"),
        ("DROP TABLE events", "DROP is refused"),
        ("ALTER TABLE events ADD COLUMN z INT", "ALTER is refused"),
        ("BEGIN TRANSACTION", "transaction statements are refused"),
        ("CHECKPOINT", "CALL is refused"),
        ("CALL pragma_table_info('events')", "CALL is refused"),
        ("PRAGMA enable_profiling", "PRAGMA enable_profiling is not a read-only pragma"),
        ("SELECT 1; SELECT 2", "2 statements"),
        ("SELECT 1; DROP TABLE events", "2 statements"),
        ("EXPLAIN ANALYZE DELETE FROM events", "EXPLAIN is only allowed for a SELECT"),
        ("EXPLAIN COPY events TO '/tmp/x'", "EXPLAIN is only allowed for a SELECT"),
        ("PIVOT events ON op", "expands to several statements"),
        ("", "empty query"),
        ("SELEC 1", "bad SQL: Parser Error"),
    ],
)
def test_escapes_are_refused_with_their_reason(con, sql, message):
    with pytest.raises(IngeroError) as err:
        check_sql(con, sql)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


class _Interrupting:
    """A connection whose every call was interrupted (stop() or the time limit landed mid-check)."""

    def __init__(self, con, fail_on: str):
        self._con, self._fail_on = con, fail_on

    def extract_statements(self, sql):
        if self._fail_on == "parse":
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")
        return self._con.extract_statements(sql)

    def execute(self, *args, **kwargs):
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")


@pytest.mark.parametrize("fail_on", ["parse", "ast"])
def test_an_interrupted_check_is_reported_as_interrupted_never_as_bad_sql_or_allowed(con, fail_on):
    # CI-shaped load: stop()'s interrupt landing in the parse said "bad SQL: INTERRUPT Error"
    with pytest.raises(duckdb.InterruptException):
        check_sql(_Interrupting(con, fail_on), "SELECT count(*) FROM events")
