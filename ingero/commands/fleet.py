"""`ingero fleet`: ask the dataset every node publishes (`ingero trace --publish ROOT`)."""

from __future__ import annotations

import json
import sys

import click

from ingero import values
from ingero.commands.options import DURATION, TIMEOUT, Value, json_option
from ingero.daemon import protocol
from ingero.render import safe

_MAX_ROWS = Value("count", values.parse_count, cap=protocol.MAX_ROWS_CAP, metavar="N")


@click.group("fleet")
def command() -> None:
    """Many nodes, one question: the fleet dataset (Parquet, hive layout) in DuckDB.

    \b
      ingero fleet explain /mnt/shared/ingero --since 10m
      ingero fleet status /mnt/shared/ingero
      ingero fleet query /mnt/shared/ingero "SELECT node, sum(steps) FROM nodes GROUP BY node"
    """


@command.command("explain")
@click.argument("root")
@click.option("--job", default=None, metavar="ID",
              help="The job to explain (default: the one with the newest segment).")
@click.option("--since", type=DURATION, default=None,
              help="The last DURATION before the end of the job's newest data (default 1h).")
@json_option
def explain_cmd(root: str, job: str | None, since: float | None, as_json: bool) -> None:
    """Cross-node causal chains: the straggler node and its own cause, causes shared by several
    nodes, hosts busy with work outside the job.  Reads only the nodes, windows and chains files
    of the job and time range."""
    from ingero.fleet.status import explain
    from ingero.render import fleet as view

    report, nodes = explain(root, job=job, since_s=since)
    if as_json:
        json.dump(view.to_dict(report, nodes), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        view.write(report, nodes, sys.stdout)


@command.command("status")
@click.argument("root")
@click.option("--job", default=None, metavar="ID", help="Only this job.")
@json_option
def status_cmd(root: str, job: str | None, as_json: bool) -> None:
    """Nodes, their last segment, drops and clock sync (skew between nodes)."""
    from ingero.fleet.status import status
    from ingero.render import table

    result, notes = status(root, job, times="ns" if as_json else "utc")
    (table.write_json if as_json else table.write_text)(result, sys.stdout)
    for note in notes:
        click.echo(f"note: {safe.text(note)}", err=True)  # notes name nodes


@command.command("query")
@click.argument("root")
@click.argument("sql")
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
@click.option("--max-rows", type=_MAX_ROWS, default=protocol.DEFAULT_MAX_ROWS, show_default=True,
              help=f"Return at most this many rows (at most {protocol.MAX_ROWS_CAP}).")
@click.option("--timeout", "timeout_s", type=TIMEOUT, default=protocol.DEFAULT_TIMEOUT_S, show_default=True,
              help=f"Stop the query after this long (at most {protocol.MAX_TIMEOUT_S:.0f}s); Ctrl-C stops it too.")
def query_cmd(root: str, sql: str, as_json: bool, as_csv: bool, max_rows: int, timeout_s: float) -> None:
    """Read-only SQL over every node: tables events, windows, chains, processes, ranks, nodes,
    each with job, node, date, hour columns (docs/fleet.md)."""
    from ingero.fleet.status import query
    from ingero.render import table

    if as_json and as_csv:
        raise click.UsageError("--json and --csv cannot be combined")
    result, notes = query(root, sql, max_rows, timeout_s)
    writer = table.write_json if as_json else table.write_csv if as_csv else table.write_text
    writer(result, sys.stdout)
    for note in notes:
        click.echo(f"note: {safe.text(note)}", err=True)  # notes name nodes
