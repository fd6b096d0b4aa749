"""`ingero check`: is this machine ready for `ingero trace`?"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ingero.check import as_dict, can_trace, run_checks
from ingero.commands.options import db_option, json_option, pid_option, resolve_db


@click.command()
@db_option
@json_option
@pid_option("Also say what of CUDA these processes map and whether their calls can be traced "
            "(e.g. a runtime linked in without symbols).")
def command(db_path: Path | None, as_json: bool, pids: tuple[int, ...]) -> None:
    """Report what tracing needs and what is missing, with a fix per line.

    Exit code 0 when `ingero trace` can run here, 2 when it cannot.

    \b
    Example:
      sudo ingero check
      sudo ingero check -p 4242
      ingero check --json | jq .ready
    """
    results = run_checks(resolve_db(db_path), pids)
    if as_json:
        json.dump(as_dict(results), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from ingero.render.check import text

        click.echo(text(results, can_trace(results)))
    if not can_trace(results):
        raise SystemExit(2)
