"""Which SQL ingero agrees to run for a user: on the tracer's socket, a file, MCP or a fleet dataset.

Every path that runs a user's SQL asks ``check_sql`` first (the caps are
store/query.py's).  The daemon answers queries on a cursor of the tracer's
own (writable, root) connection, so read-only-ness cannot come from how the
database was opened.  Three independent layers keep client SQL harmless:

1. ``check_sql`` (here): DuckDB's own parser splits the text; exactly one
   statement, of a read-only type, or it is refused with one clear line.
2. ``lock_down`` (server.py): the database instance has external access
   disabled and its configuration locked, so no file, network or extension
   is reachable even by a statement that slipped through, and no SET can
   undo it.
3. The server runs every statement inside ``BEGIN TRANSACTION READ ONLY``
   and rolls it back, so DuckDB itself refuses any write.
"""

from __future__ import annotations

import re

import duckdb

from ingero.errors import IngeroError, first_line
from ingero.store.query import MAX_ROW_BYTES
from ingero.store.valuecap import bound_values

# PRAGMAs that only describe the database.  Others (enable_profiling to a
# file, memory settings, checkpoint variants) are refused.
READ_PRAGMAS = frozenset(
    {"table_info", "show_tables", "show_tables_expanded", "database_size", "storage_info",
     "version", "show", "database_list", "functions", "platform"}
)

_EXPLAIN_PREFIX = re.compile(r"^\s*EXPLAIN\s+(?:\(\s*[^)]*\)\s*)?(?:ANALY[SZ]E\s+)?", re.IGNORECASE)
_PRAGMA_NAME = re.compile(r"^\s*PRAGMA\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)

# statement type name -> why it is refused (one line, what to do instead).
_REFUSED = {
    "COPY": "COPY is refused: a query never reads or writes files "
            "(use `ingero query --json` and redirect the output)",
    "EXPORT": "EXPORT is refused: a query never writes files",
    "ATTACH": "ATTACH is refused: only the ingero database is queryable",
    "DETACH": "DETACH is refused: only the ingero database is queryable",
    "LOAD": "INSTALL/LOAD is refused: no extensions are loaded for client SQL",
    "SET": "SET is refused: the configuration of a query's connection is locked",
    "VARIABLE_SET": "SET is refused: the configuration of a query's connection is locked",
    "CREATE": "CREATE is refused: queries are read-only",
    "CREATE_FUNC": "CREATE is refused: queries are read-only",
    "INSERT": "INSERT is refused: queries are read-only",
    "UPDATE": "UPDATE is refused: queries are read-only",
    "DELETE": "DELETE is refused: queries are read-only",
    "DROP": "DROP is refused: queries are read-only",
    "ALTER": "ALTER is refused: queries are read-only",
    "TRUNCATE": "TRUNCATE is refused: queries are read-only",
    "TRANSACTION": "transaction statements are refused: each query runs in its own read-only transaction",
    "VACUUM": "VACUUM is refused: queries are read-only",
    "CALL": "CALL is refused: use SELECT * FROM <table function>(...) instead",
    "PREPARE": "PREPARE/EXECUTE is refused: send the statement itself",
    "EXECUTE": "PREPARE/EXECUTE is refused: send the statement itself",
    "MULTI": "this statement expands to several statements (PIVOT ...); write it as a SELECT",
}


# Table functions that do something rather than read: a SELECT FROM them is still a
# SELECT to the parser.  SELECT * FROM checkpoint() got past the statement check and
# reached DuckDB; query() runs any SQL text, behind this guard's back.
_REFUSED_FUNCTIONS = frozenset({
    "checkpoint", "force_checkpoint", "enable_logging", "disable_logging", "enable_profiling",
    "disable_profiling", "truncate_duckdb_logs", "add_grammar_extension", "remove_grammar_extension",
    "create_external_resource", "register_external_resource", "deregister_external_resource",
    "destroy_external_resource", "register_external_resource_type", "query", "query_table",
    "json_execute_serialized_sql",
})
_FUNCTION_NAME = re.compile(r'"function_name":"((?:[^"\\]|\\.)*)"')


def _check_functions(con: duckdb.DuckDBPyConnection, select_sql: str) -> None:
    """Refuse a SELECT that calls a function in _REFUSED_FUNCTIONS (found in DuckDB's own AST)."""
    try:
        ast = con.execute("SELECT json_serialize_sql($q)", {"q": select_sql}).fetchone()[0]
    except duckdb.InterruptException:
        raise  # stop() or the time limit: the caller says which, never "allowed"
    except duckdb.Error:
        return  # the other two layers (lock_down, the read-only transaction) still hold
    for name in _FUNCTION_NAME.findall(ast):
        if name.lower() in _REFUSED_FUNCTIONS:
            raise IngeroError(f"refused: {name}() is not a read-only function",
                              "select from the ingero tables and read-only table functions")


def _type_name(stmt: duckdb.Statement) -> str:
    return str(stmt.type).rsplit(".", 1)[-1].upper()


def _parse(con: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    try:
        return con.extract_statements(sql)
    except duckdb.InterruptException:
        raise  # not bad SQL: stop() or the time limit interrupted the parse
    except duckdb.Error as exc:
        raise IngeroError(f"bad SQL: {first_line(exc)}", "check the query syntax") from None



def check_sql(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """Return the single allowed statement's text, or raise IngeroError saying why it is refused.

    Allowed: SELECT (incl. WITH, FROM-first, DESCRIBE, SHOW, SUMMARIZE), EXPLAIN [ANALYZE] of a
    SELECT, and the describing PRAGMAs in READ_PRAGMAS.
    """
    if not sql or not sql.strip():
        raise IngeroError("empty query", "pass a SELECT statement")
    stmts = _parse(con, sql)
    if len(stmts) != 1:
        raise IngeroError(
            f"refused: {len(stmts)} statements; a query is exactly one statement",
            "send one SELECT at a time",
        )
    stmt = stmts[0]
    kind = _type_name(stmt)
    if kind == "SELECT":
        _check_functions(con, stmt.query)
        return bound_values(con, stmt.query, MAX_ROW_BYTES)
    if kind == "EXPLAIN":
        prefix = _EXPLAIN_PREFIX.match(stmt.query)
        inner = stmt.query[prefix.end():] if prefix else stmt.query
        inner_stmts = _parse(con, inner)
        if len(inner_stmts) != 1 or _type_name(inner_stmts[0]) != "SELECT":
            raise IngeroError("refused: EXPLAIN is only allowed for a SELECT", "explain a SELECT")
        _check_functions(con, inner_stmts[0].query)
        # planning folds constants (a repeat() of literals is built while planning), and ANALYZE runs it
        bounded = bound_values(con, inner_stmts[0].query, MAX_ROW_BYTES)
        return stmt.query if bounded == inner_stmts[0].query else stmt.query[:prefix.end() if prefix else 0] + bounded
    if kind == "PRAGMA":
        m = _PRAGMA_NAME.match(stmt.query)
        name = m.group(1).lower() if m else "?"
        if name in READ_PRAGMAS:
            return stmt.query
        raise IngeroError(
            f"refused: PRAGMA {name} is not a read-only pragma",
            f"allowed: {', '.join(sorted(READ_PRAGMAS))}",
        )
    reason = _REFUSED.get(kind, f"{kind} statements are refused: queries are read-only")
    raise IngeroError(reason)
