"""`ingero query`: ad-hoc SQL over the store, read-only and without file access."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ingero import values
from ingero.commands.options import TIMEOUT, Value, db_option, json_option, resolve_db
from ingero.daemon import protocol
from ingero.render import table
from ingero.store.schema_doc import tables

EPILOG = """\b
Examples:
  ingero query "SELECT op, count(*) AS n, quantile_cont(duration_ns, 0.99) AS p99_ns
                FROM events GROUP BY op ORDER BY n DESC"
  ingero query --csv "SELECT * FROM events WHERE op = 'cudaStreamSync' LIMIT 100"
  ingero query "SELECT name, count(*) AS preemptions, sum(duration_ns)/1e9 AS off_cpu_s
                FROM events JOIN process_names USING (pid)
                WHERE op = 'sched_switch' AND preempted GROUP BY name ORDER BY 2 DESC"
  ingero query --schema
"""


# The socket's limits, so a file query and a tracer query are bounded alike.
_MAX_ROWS = Value("count", values.parse_count, cap=protocol.MAX_ROWS_CAP, metavar="N")



@click.command(epilog=EPILOG)
@click.argument("sql", required=False)
@db_option
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
@click.option("--schema", is_flag=True, help="Print the tables and columns, with units.")
@click.option("--max-rows", type=_MAX_ROWS, default=protocol.DEFAULT_MAX_ROWS, show_default=True,
              help=f"Return at most this many rows (at most {protocol.MAX_ROWS_CAP}).")
@click.option("--timeout", "timeout_s", type=TIMEOUT, default=protocol.DEFAULT_TIMEOUT_S, show_default=True,
              help=f"Stop the query after this long (at most {protocol.MAX_TIMEOUT_S:.0f}s); Ctrl-C stops it too.")
def command(sql: str | None, db_path: Path | None, as_json: bool, as_csv: bool, schema: bool, max_rows: int,
            timeout_s: float) -> None:
    """Run read-only SQL over the events store.

    Tables: events, sessions, process_names, process_cpu, stacks,
    system_metrics, gpu_metrics, probes (see --schema).  Queries cannot read
    or write files, attach databases, load extensions or change settings.
    """
    if schema:
        table.write_schema(tables(), sys.stdout)
        return
    if sql is None:
        raise click.UsageError("pass SQL to run, or --schema")
    if as_json and as_csv:
        raise click.UsageError("--json and --csv cannot be combined")
    from ingero.daemon import access, client
    from ingero.daemon.sqlguard import check_sql
    from ingero.store.query import check_sql_text, from_reply, run_on

    check_sql_text(sql)
    # the same guard and caps as the tracer's socket (store/query.py): one read-only statement,
    # rows, row and reply bytes, DuckDB memory, the time limit and Ctrl-C
    result = access.read(
        resolve_db(db_path), user_sql=True, timeout_s=timeout_s,
        local=lambda con: run_on(con, check_sql(con, sql), max_rows),
        remote=lambda sock: from_reply(client.query_reply(sql, socket_path=sock, max_rows=max_rows,
                                                          timeout_s=timeout_s)))
    writer = table.write_json if as_json else table.write_csv if as_csv else table.write_text
    writer(result, sys.stdout)
