"""`ingero import`: PyTorch-profiler (Kineto) traces into the store, one session per file."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from ingero.commands.options import db_option, resolve_db
from ingero.render import safe

EPILOG = """\b
Examples:
  ingero import trace.json.gz                     one session per file, in ~/.ingero/ingero.duckdb
  ingero import --db jobs.duckdb rank*.json.gz    several ranks' traces, one session each
  ingero import --calls-only trace.json           host-side calls only: explain must infer the device
  ingero import --db traced.duckdb trace.json     joins the session `ingero trace` recorded of that process
"""


@click.command(epilog=EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@db_option
@click.option("--calls-only", is_flag=True,
              help="Import the CUDA calls and CPU spans but not the device timeline (explain infers it).")
def command(files: tuple[Path, ...], db_path: Path | None, calls_only: bool) -> None:
    """Import torch.profiler traces (Kineto JSON, .json or .json.gz) as ingero sessions.

    CUDA runtime/driver calls become events with the tracer's op names, the
    device's kernels, copies and memsets become device_activity, CPU operators
    and annotations become spans (ProfilerStep#N marks steps).  What a trace
    holds that is not stored is counted and listed.  When the DB holds a session
    `ingero trace` recorded of the same process, the device timeline is attached
    to it, its clock aligned by matching the calls both recorded.  A bad file
    changes nothing in the DB.
    """
    from ingero.importer import import_trace
    from ingero.importer.report import summary_lines
    from ingero.store.db import Store

    db = resolve_db(db_path)
    created = not db.exists()
    store = Store.open(db)
    imported = 0
    try:
        for path in files:
            words = ["ingero", "import", *(["--calls-only"] if calls_only else []), str(path)]
            result = import_trace(store, path, calls_only=calls_only, command=shlex.join(words))
            imported += 1
            for line in summary_lines(result):
                click.echo(safe.text(line))  # names from the imported file
    finally:
        store.close()
        if created and not imported:  # a bad first file leaves no empty database behind
            for p in (db, db.with_name(db.name + ".wal")):
                p.unlink(missing_ok=True)
