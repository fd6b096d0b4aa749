"""ingero export: the selection as a Perfetto timeline (with causal arrows) or Parquet files."""

from __future__ import annotations

from pathlib import Path

import click

from ingero.commands.options import SESSION, db_option, pid_option, resolve_db, since_option
from ingero.errors import IngeroError

FORMATS = ("perfetto", "parquet")


def selection_options(f):
    """--force, --since, --session, --pid, --db: what export and report both take."""
    for option in (
        db_option,
        pid_option("Only these processes."),
        click.option("--session", type=SESSION, default=None, help="Session id (default: the latest)."),
        since_option,
        click.option("--force", is_flag=True, help="Overwrite an existing output."),
    ):
        f = option(f)
    return f


@click.command("export")
@click.option("--format", "fmt", metavar="perfetto|parquet", required=True,
              help="perfetto (a .pftrace for ui.perfetto.dev) or parquet (a directory of tables).")
@click.option("-o", "--output", "output", type=click.Path(path_type=Path), required=True,
              help="File (perfetto) or directory (parquet) to create.")
@selection_options
def command(fmt: str, output: Path, force: bool, since: float | None, session: int | None,
            pids: tuple[int, ...], db_path: Path | None) -> None:
    """Export a session: Perfetto timeline with the causal arrows, or Parquet.

    \b
      ingero export --format perfetto -o run.pftrace        open in ui.perfetto.dev
      ingero export --format perfetto --since 2m -p 4242 -o tail.pftrace
      ingero export --format parquet -o run-parquet/         node=…/session=…/*.parquet
    """
    from ingero.analyze.context import Options
    from ingero.export.run import export

    if fmt not in FORMATS:
        raise IngeroError(f"unknown format {fmt!r}", f"use one of: {', '.join(FORMATS)}")
    opts = Options(session=session, since_s=since, pids=pids)
    click.echo(export(resolve_db(db_path), fmt, output, opts, force=force))
