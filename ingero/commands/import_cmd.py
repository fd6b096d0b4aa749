"""`ingero import`: PyTorch-profiler (Kineto) traces into the store, one session per file."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from ingero.commands.options import COUNT, SIZE, db_option, resolve_db
from ingero.errors import IngeroError
from ingero.render import safe

EPILOG = """\b
Examples:
  ingero import trace.json.gz                     one session per file, in ~/.ingero/ingero.duckdb
  ingero import --db jobs.duckdb rank*.json.gz    several ranks' traces, one session each
  ingero import --calls-only trace.json           host-side calls only: explain must infer the device
  ingero import --db traced.duckdb trace.json     joins the session `ingero trace` recorded of that process
  zcat t.json.gz | ingero import -                from standard input (gzip'd or not)
  ingero import <(ssh node cat t.json.gz)         from a pipe
  ingero import --max-json 100GB huge.json.gz     past the 32 GiB limit on the JSON inflated from one input
"""


@click.command(epilog=EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
@db_option
@click.option("--calls-only", is_flag=True,
              help="Import the CUDA calls and CPU spans but not the device timeline (explain infers it).")
@click.option("--max-json", "max_json", type=SIZE, default=None, metavar="SIZE",
              help="Refuse an input holding more than SIZE of (uncompressed) JSON (default 32GiB).")
@click.option("--max-ratio", "max_ratio", type=COUNT, default=None, metavar="N",
              help="Refuse a gzip'd input inflating to more than N times its compressed size (default 100; "
                   "real traces inflate 10-14x).")
def command(files: tuple[Path, ...], db_path: Path | None, calls_only: bool, max_json: int | None,
            max_ratio: int | None) -> None:
    """Import torch.profiler traces (Kineto JSON, .json or .json.gz) as ingero sessions.

    CUDA runtime/driver calls become events with the tracer's op names, the
    device's kernels, copies and memsets become device_activity, CPU operators
    and annotations become spans (ProfilerStep#N marks steps).  Every
    torch.profiler format since PyTorch 1.8 is read (its old category names,
    string tids, external ids).  What a trace holds that is not stored is
    counted and listed, and so are bad numbers (NaN, 1e308, a time past 2116).
    When the DB holds a session `ingero trace` recorded of the same process, the
    device timeline is attached to it, its clock aligned by matching the calls
    both recorded.  A bad file changes nothing in the DB.  FILE '-' is standard
    input; a pipe works too (gzip is found by its magic bytes, not the name).
    """
    from ingero.importer import import_trace
    from ingero.importer.report import summary_lines
    from ingero.importer.source import MAX_JSON_BYTES, MAX_RATIO, Limits
    from ingero.store.db import Store

    if sum(1 for f in files if str(f) == "-") > 1:
        raise IngeroError("standard input ('-') can be imported once", "name '-' once")
    limits = Limits(max_json or MAX_JSON_BYTES, max_ratio or MAX_RATIO)
    db = resolve_db(db_path)
    created = not db.exists()
    store = Store.open(db)
    imported = 0
    try:
        for path in files:
            words = ["ingero", "import", *(["--calls-only"] if calls_only else []), str(path)]
            result = import_trace(store, path, calls_only=calls_only, command=shlex.join(words), limits=limits)
            imported += 1
            for line in summary_lines(result):
                click.echo(safe.text(line))  # names from the imported file
    finally:
        store.close()
        if created and not imported:  # a bad first file leaves no empty database behind
            for p in (db, db.with_name(db.name + ".wal")):
                p.unlink(missing_ok=True)
