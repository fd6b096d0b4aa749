"""Issue 41.10-13: the same caps on every path that runs a user's SQL (`ingero query` on a file, the
tracer's socket, MCP's query tool, `ingero fleet query`): a value over a row's limit refused before
DuckDB builds it, DuckDB's memory limit and threads, the time limit, rows and reply bytes, and a
bounded echo of what the user sent."""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

from ingero.cli import cli
from ingero.daemon.server import QueryServer
from ingero.daemon.sqlguard import check_sql
from ingero.demo.synthetic import event_batch
from ingero.errors import MAX_MESSAGE_CHARS, IngeroError
from ingero.store import query as caps
from ingero.store import valuecap
from ingero.store.db import Store, open_for_user_sql

T0 = 1_700_000_000_000_000_000
GIANT = "SELECT repeat('x', 1000000000) AS s"
REFUSED = ("refused: repeat() would build a value larger than 1 MiB (the most one row of a result may hold), "
           "before it is built")


@pytest.fixture
def con():
    c = duckdb.connect()
    caps.lock_down(c)
    yield c
    c.close()


def run(con, sql: str, max_rows: int = 10):
    return caps.run_on(con, check_sql(con, sql), max_rows)


# -- the value cap ----------------------------------------------------------------------------

def test_every_function_whose_result_an_integer_argument_sizes_is_guarded():
    """The mechanism behind BUILDERS: DuckDB's own catalog, probed.  A scalar function whose text grows
    more than 100x when one integer argument goes from 10 to 10,000 must be rewritten with a guard."""
    c = duckdb.connect()
    sample = {"VARCHAR": "'ab'", "BLOB": "'ab'::BLOB", "BIT": "'101'::BIT", "ANY[]": "[1, 2]", "T[]": "[1, 2]",
              "ANY": "'ab'", "T": "1", "JSON": "'[1,2]'::JSON", "BOOLEAN": "true", "DOUBLE": "1.0",
              "TIMESTAMP": "TIMESTAMP '2020-01-01'", "INTERVAL": "INTERVAL 1 DAY", "VARCHAR[]": "['a', 'b']"}
    ints = ("INTEGER", "BIGINT", "UBIGINT", "HUGEINT", "DOUBLE", "ANY", "SMALLINT", "UINTEGER")
    rows = c.execute("SELECT DISTINCT function_name, parameter_types FROM duckdb_functions() "
                     "WHERE function_type = 'scalar' AND function_name NOT LIKE '%sleep%' "
                     "AND function_name NOT LIKE '\\_\\_%' ESCAPE '\\' ORDER BY 1").fetchall()
    growing, probed = set(), 0
    for name, params in rows:
        if not params or len(params) > 4:
            continue
        for k, p in enumerate(params):
            if p not in ints:
                continue
            args = [sample.get(t) for t in params]
            if any(a is None for i, a in enumerate(args) if i != k):
                continue

            def size(n: int) -> int | None:
                call = ", ".join(str(n) if i == k else a for i, a in enumerate(args))
                try:
                    return c.execute(f'SELECT strlen(CAST("{name}"({call}) AS VARCHAR))').fetchone()[0]
                except duckdb.Error:
                    return None

            small, big = size(10), size(10_000)
            probed += small is not None
            if small is not None and big is not None and big > 100 * max(small, 1):
                growing.add(name)
    assert probed > 100  # the probe reached the catalog
    assert {"repeat", "lpad", "range", "list_resize"} <= growing
    assert growing <= set(valuecap.BUILDERS), growing - set(valuecap.BUILDERS)


@pytest.mark.parametrize(("sql", "what"), [
    (GIANT, "repeat()"),
    ("SELECT 'x'.repeat(1000000000)", "repeat()"),  # the method form: DuckDB places it without its receiver
    ("SELECT repeat(repeat('ab', 1000), 1000)", "repeat()"),  # each under the limit, the product over it
    ("SELECT repeat('x', n) FROM (SELECT 1000000000 AS n)", "repeat()"),  # a count from a column
    ("SELECT repeat([1, 2, 3], 1000000)", "repeat()"),
    ("SELECT len(range(100000000))", "range()"),
    ("SELECT len(generate_series(1, 100000000, 1))", "generate_series()"),
    ("SELECT len(range(TIMESTAMP '2020-01-01', TIMESTAMP '2021-01-01', INTERVAL 1 MICROSECOND))", "range()"),
    ("SELECT lpad('x', 500000000, 'y')", "lpad()"),
    ("SELECT rpad('x', 500000000, 'y')", "rpad()"),
    ("SELECT printf('%500000000d', 1)", "printf()"),
    ("SELECT printf('%*d', 1000000000, 1)", "printf()"),
    ("SELECT format('{:>500000000}', 1)", "format()"),
    ("SELECT list_resize([1], 100000000)", "list_resize()"),
    ("SELECT bitstring('1', 100000000)", "bitstring()"),
    ("SELECT replace(repeat('x', 100000), 'x', repeat('y', 1000))", "replace()"),
    ("SELECT regexp_replace(repeat('x', 100000), '', repeat('y', 1000), 'g')", "regexp_replace()"),
    ("SELECT len(list_transform(range(500), lambda x: repeat('x', 1000000)))", "repeat()"),
    # inside a lambda a builder gets the list's share of the limit: 1 MiB / 5,000 elements
    ("SELECT len(list_transform(range(5000), lambda x: repeat('x', 1000)))", "repeat()"),
    ("SELECT len(list_transform(range(100000), lambda x: x::VARCHAR || '" + "a" * 30 + "'))",
     "an element of list_transform()"),
    ("SELECT strlen(list_reduce(list_transform(range(31), lambda i: 'x'), lambda a, b: a || a))",
     "the result of list_reduce()"),
    ("EXPLAIN ANALYZE SELECT repeat('x', 1000000000)", "repeat()"),
    ("WITH t AS (SELECT 1000000000 AS n) SELECT * FROM (SELECT repeat('ab', n) FROM t)", "repeat()"),
])
def test_a_value_over_the_row_limit_is_refused_before_it_is_built(con, sql, what):
    with pytest.raises(IngeroError) as exc:
        run(con, sql)
    assert exc.value.message == REFUSED.replace("repeat()", what)


@pytest.mark.parametrize("sql", [
    "SELECT repeat('-', 20) AS rule, lpad('7', 3, '0') AS n, rpad('a', 3, '.') AS r",
    "SELECT 'ab'.repeat(3), repeat(repeat('ab', 10), 10)",
    "SELECT printf('%5d|%-3s|%%', 42, 'a'), format('{:>6}|{}', 'x', 2)",
    "SELECT range(5), range(2, 8, 2), generate_series(1, 3), len(range(TIMESTAMP '2020-01-01', "
    "TIMESTAMP '2020-01-02', INTERVAL 1 HOUR))",
    "SELECT list_resize([1, 2], 4, 0), bitstring('1', 8), to_base(5, 2, 8), equi_width_bins(0, 10, 2, false)",
    "SELECT replace('a-b-c', '-', '+'), regexp_replace('a1b22', '[0-9]+', '#', 'g')",
    "SELECT list_transform([1, 2, 3], lambda x: x * 2), list_filter(range(10), lambda x: x % 2 = 0), "
    "list_reduce([1, 2, 3], lambda a, b: a + b), list_transform(['a', 'b'], lambda s: repeat(s, 3))",
    "SELECT x, repeat('é', 3) FROM (SELECT 'ü' AS x) t WHERE x <> repeat('-', 2) ORDER BY 1",
    "SELECT count(*) FROM range(1000000)",  # FROM range() streams rows: not a value, not guarded
    "SELECT n, repeat('ab', n) FROM range(4) t(n) ORDER BY n",
])
def test_queries_within_the_limit_give_the_results_they_gave_unguarded(con, sql):
    plain = duckdb.connect()
    expected = plain.execute(sql).fetchall()
    assert [tuple(r) for r in run(con, sql).rows] == expected


def test_explain_plans_a_giant_value_without_building_it(con):
    # planning folds constants: unguarded, EXPLAIN built the 1 GB string while planning
    stmt = check_sql(con, "EXPLAIN SELECT repeat('x', 1000000000)")
    assert valuecap.MARK in stmt
    assert run(con, "EXPLAIN SELECT repeat('x', 1000000000)").rows[0][0] == "physical_plan"


def test_a_rewrite_that_would_change_the_statement_is_refused(con, monkeypatch):
    def wrong(self, n, budget):  # a rewrite that guards, but changes an argument on the way
        self.guards += 1
        return "repeat('x', 2)"

    monkeypatch.setattr(valuecap._Rewriter, "call", wrong)
    with pytest.raises(IngeroError) as exc:
        check_sql(con, "SELECT repeat('y', 3)")
    assert exc.value.message == "refused: the size of the values this query builds cannot be checked"


def test_calls_nested_too_deep_to_rewrite_are_refused_at_once(con):
    sql = "SELECT " + "repeat(" * 20 + "'x'" + ", 2)" * 20
    with pytest.raises(IngeroError) as exc:
        check_sql(con, sql)
    assert exc.value.message == ("refused: the size of the values this query builds cannot be checked "
                                 "(repeat() calls nested too deep)")


def test_a_lambda_parameter_named_like_its_lists_column_is_refused_with_the_fix(con):
    with pytest.raises(IngeroError) as exc:
        run(con, "SELECT list_transform(l, lambda l: l + 1) FROM (SELECT [1, 2] AS l)")
    assert exc.value.message == "refused: the lambda's parameter 'l' has the name of a column its list uses"
    assert [tuple(r) for r in run(con, "SELECT list_transform(l, lambda x: x + 1) FROM (SELECT [1, 2] AS l)").rows] \
        == [([2, 3],)]


# -- the same caps on every path ---------------------------------------------------------------

@pytest.fixture
def paths(monkeypatch):
    """A file DB, a tracer serving another one, and a fleet dataset: (file, socket server, fleet root)."""
    d = Path(tempfile.mkdtemp(prefix="ingc-", dir="/tmp"))
    file_db = d / "f.duckdb"
    store = Store.open(file_db)
    sid = store.begin_session(command="test", targets="pid 1")
    store.append("events", event_batch(sid, T0, T0 + 10**9, 100, np.random.default_rng(1)))
    store.close()
    served = Store.open(d / "t.duckdb")
    srv = QueryServer(served.con.cursor, d / "s.sock", group=None).start()
    from ingero.fleet.synthetic import NodeSpec, generate

    generate(str(d / "ds"), [NodeSpec("a"), NodeSpec("b")], seconds=60)
    yield file_db, srv, d / "ds"
    srv.stop()
    served.close()
    import shutil

    shutil.rmtree(d)


def _each_path(paths, sql: str) -> dict[str, str]:
    """What each path answers ``sql`` with: its rows as text, or its one-line error."""
    from ingero.fleet import status
    from ingero.mcpserver import tools

    file_db, srv, root = paths
    out: dict[str, str] = {}
    res = CliRunner().invoke(cli, ["query", "--db", str(file_db), "--csv", sql], catch_exceptions=True)
    out["file"] = res.exception.message if isinstance(res.exception, IngeroError) else res.output.strip()
    reply = srv.handle({"sql": sql})
    out["socket"] = reply["error"] if not reply["ok"] else "\n".join(",".join(map(str, r)) for r in reply["rows"])
    try:
        out["mcp"] = "\n".join(",".join(map(str, r)) for r in tools.query(file_db, sql)["rows"])
    except IngeroError as exc:
        out["mcp"] = exc.message
    try:
        out["fleet"] = "\n".join(",".join(map(str, r)) for r in status.query(str(root), sql, 10)[0].rows)
    except IngeroError as exc:
        out["fleet"] = exc.message
    return out


def test_every_path_refuses_a_giant_value_before_building_it(paths):
    assert _each_path(paths, GIANT) == dict.fromkeys(("file", "socket", "mcp", "fleet"), REFUSED)


def test_every_path_runs_under_the_same_duckdb_memory_limit_and_threads(paths):
    answers = _each_path(paths, "SELECT current_setting('memory_limit') AS m, current_setting('threads') AS t")
    assert {k: v.splitlines()[-1] for k, v in answers.items()} == dict.fromkeys(
        ("file", "socket", "mcp", "fleet"), "1.0 GiB,2")


def test_every_path_refuses_a_row_over_the_limit(paths):
    half = caps.MAX_ROW_BYTES // 2 + 10
    answers = _each_path(paths, f"SELECT repeat('x', {half}) AS a, repeat('y', {half}) AS b")
    assert all("a row of the result is larger than 1 MiB" in v for v in answers.values()), answers


def test_fleet_query_has_the_time_limit(paths):
    from ingero.fleet import status

    _, _, root = paths
    with pytest.raises(IngeroError) as exc:
        status.query(str(root), "SELECT count(*) FROM range(100000000000000)", 10, timeout_s=0.5)
    assert exc.value.message == "interrupted: time limit of 0.5 s reached"


def test_mcp_query_has_a_reply_cap_and_a_bounded_echo(paths):
    from ingero.mcpserver import tools

    file_db, _, _ = paths
    with pytest.raises(IngeroError) as exc:  # 1,000 rows of 2 KB: 2 MB, over MCP's 1 MiB
        tools.query(file_db, "SELECT repeat('z', 2000) FROM range(1000)", max_rows=1000)
    assert exc.value.message.startswith("result too large: more than 1 MiB after ")
    huge = "SELECT " + "x" * 50_000_000
    with pytest.raises(IngeroError) as exc:
        tools.query(file_db, huge)
    assert exc.value.message == f"query too long: {len(huge):,} characters, more than the limit of 262,144"
    with pytest.raises(IngeroError) as exc:  # a bad value is quoted, at most MAX_MESSAGE_CHARS of it
        tools.explain(file_db, since="9" * 50_000_000 + "s")
    assert len(exc.value.message) <= MAX_MESSAGE_CHARS + 40
    assert exc.value.message.endswith(" more characters)")


def test_a_duckdb_error_quoting_the_sql_is_cut(con):
    with pytest.raises(IngeroError) as exc:
        run(con, "SELECT " + "y" * 200_000)  # DuckDB names the column it cannot find, in full
    assert exc.value.message.startswith("bad SQL: Binder Error: Referenced column ")
    assert len(exc.value.message) <= MAX_MESSAGE_CHARS + 40


def test_the_file_connection_for_user_sql_has_the_caps(tmp_path):
    db = tmp_path / "f.duckdb"
    Store.open(db).close()
    c = open_for_user_sql(db)
    try:
        got = c.execute("SELECT current_setting('memory_limit'), current_setting('threads'), "
                        "current_setting('enable_external_access'), current_setting('lock_configuration')").fetchone()
    finally:
        c.close()
    assert got == ("1.0 GiB", 2, False, True)
