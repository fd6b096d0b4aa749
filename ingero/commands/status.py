"""`ingero status`: is a tracer running, since when, how much it recorded."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ingero.commands.options import db_option, json_option, resolve_db
from ingero.daemon.access import current_status
from ingero.render import status as render_status

EPILOG = """\b
Examples:
  ingero status                      the tracer writing ~/.ingero/ingero.duckdb
  ingero status --db /var/lib/ingero/ingero.duckdb --json
  systemctl status ingero            the service itself (deploy/README.md)
"""


@click.command(epilog=EPILOG)
@db_option
@json_option
def command(db_path: Path | None, as_json: bool) -> None:
    """Show whether `ingero trace` is running: since when, targets, events, events/s, drops, DB size.

    Asks the running tracer over its socket; when none runs, describes the
    database's last session (closed, or crashed if its tracer died).
    """
    st = current_status(resolve_db(db_path))
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
        return
    for line in render_status.lines(st):
        click.echo(line)
