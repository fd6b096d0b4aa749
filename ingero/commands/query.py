"""`ingero query`: ad-hoc SQL over the store, read-only and without file access."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ingero.commands.options import db_option, json_option
from ingero.render import table
from ingero.store.query import DEFAULT_MAX_ROWS, run_query
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


@click.command(epilog=EPILOG)
@click.argument("sql", required=False)
@db_option
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
@click.option("--schema", is_flag=True, help="Print the tables and columns, with units.")
@click.option("--max-rows", type=click.IntRange(min=1), default=DEFAULT_MAX_ROWS, show_default=True,
              help="Return at most this many rows.")
def command(sql: str | None, db_path: Path | None, as_json: bool, as_csv: bool, schema: bool, max_rows: int) -> None:
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
    result = run_query(sql, db_path, max_rows=max_rows)
    writer = table.write_json if as_json else table.write_csv if as_csv else table.write_text
    writer(result, sys.stdout)
