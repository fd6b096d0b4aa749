"""ingero demo: a failure mode reproduced live on a simulated CUDA runtime, explained, fixed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ingero.commands.options import DURATION, json_option


def _list_text() -> str:
    from ingero.demo import scenarios
    from ingero.render import demo as render_demo

    return render_demo.scenario_list(scenarios.SCENARIOS)


@click.command("demo")
@click.argument("scenario", required=False)
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option("--duration", "duration_s", type=DURATION, default=None,
              help="Total time for the slow and the fixed run (default 40s).")
@click.option("--keep-db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Keep the slow run's trace in this DuckDB file (for ingero query/explain).")
@click.option("--report", "report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the one-file HTML report (ingero report) of the slow run, with before/after, here.")
@click.option("--no-fix", is_flag=True, help="Only the slow run and its explanation.")
@click.option("--synthetic", is_flag=True, help="Synthetic replay even where live tracing works.")
@json_option
def command(scenario: str | None, list_only: bool, duration_s: float | None, keep_db: Path | None,
            report: Path | None, no_fix: bool, synthetic: bool, as_json: bool) -> None:
    """Reproduce a GPU-job failure mode without a GPU, explain it, apply the fix.

    A training loop runs on a simulated CUDA runtime (demos/build/libcudart.so.12)
    beside real interference processes, traced live with eBPF; `ingero explain`
    names the cause; the loop runs again with the fix.  Without root or BCC, a
    synthetic replay goes through the same store and explain.

    \b
      ingero demo --list
      sudo ingero demo cpu-contention
      ingero demo memcpy-bottleneck --duration 30s --json
      ingero demo io-stall --keep-db /tmp/io.duckdb && ingero explain --db /tmp/io.duckdb
      sudo ingero demo cpu-contention --report cpu.html     the slow run's charts, offline
    """
    from ingero.demo import runner, scenarios
    from ingero.errors import IngeroError

    if list_only or scenario is None:
        if as_json:
            from ingero.render import demo as render_demo

            click.echo(json.dumps(render_demo.scenario_dicts(scenarios.SCENARIOS), indent=2))
        else:
            click.echo("Scenarios:\n" + _list_text())
        if scenario is None and not list_only:
            raise IngeroError("no scenario given", "ingero demo SCENARIO (one of the above)")
        return
    if scenario not in scenarios.BY_NAME:
        click.echo("Scenarios:\n" + _list_text(), err=True)
        scenarios.get(scenario)  # raises the one-line error, exit 2

    duration = duration_s if duration_s is not None else scenarios.DEFAULT_DURATION_S
    write_report = None
    if report is not None:
        from ingero.analyze.context import Options
        from ingero.export.run import check_report_target
        from ingero.export.run import report as html_report

        check_report_target(report)  # an unwritable --report fails before the runs, not after

        def _write_report(db: Path, from_ns: int | None, after_db: Path | None, after_from_ns: int | None) -> str:
            after = (after_db, Options(from_ns=after_from_ns)) if after_db is not None else None
            return html_report(db, report, Options(from_ns=from_ns), force=True, after=after)

        write_report = _write_report
    if as_json:
        result = runner.run(scenario, duration_s=duration, keep_db=keep_db, fix=not no_fix,
                            synthetic_only=synthetic, report=write_report)
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
        return

    from rich.console import Console

    console = Console(stderr=True)
    with console.status(f"ingero demo {scenario}") as status:
        result = runner.run(scenario, duration_s=duration, keep_db=keep_db, fix=not no_fix,
                            synthetic_only=synthetic, progress=lambda m: status.update(f"{scenario}: {m}"),
                            report=write_report)
    from ingero.render import demo as render_demo

    render_demo.write(result, keep_db, sys.stdout)
