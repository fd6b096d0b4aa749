"""ingero report: one self-contained HTML page with the chains and per-window charts."""

from __future__ import annotations

from pathlib import Path

import click

from ingero.commands.export import selection_options
from ingero.commands.options import resolve_db


@click.command("report")
@click.option("--html", "as_html", is_flag=True, default=True, help="HTML (the only format; the default).")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="HTML file to create.")
@selection_options
def command(as_html: bool, output: Path, force: bool, since: float | None, session: int | None,
            pids: tuple[int, ...], db_path: Path | None) -> None:
    """Write a one-file HTML report (opens offline): chains, charts, evidence shaded.

    \b
      ingero report --html -o report.html
      ingero report --since 5m -p 4242 -o tail.html
    """
    from ingero.analyze.context import Options
    from ingero.export.run import report

    opts = Options(session=session, since_s=since, pids=pids)
    click.echo(report(resolve_db(db_path), output, opts, force=force))
