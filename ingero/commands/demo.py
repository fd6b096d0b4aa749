"""ingero demo: a failure mode reproduced live on a simulated CUDA runtime, explained, fixed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ingero.commands.options import DURATION, json_option


def _list_text() -> str:
    from ingero.demo import scenarios

    width = max(len(n) for n in scenarios.names())
    return "\n".join(f"  {s.name:<{width}}  {s.title}" for s in scenarios.SCENARIOS)


@click.command("demo")
@click.argument("scenario", required=False)
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option("--duration", "duration_s", type=DURATION, default=None,
              help="Total time for the slow and the fixed run (default 40s).")
@click.option("--keep-db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Keep the slow run's trace in this DuckDB file (for ingero query/explain).")
@click.option("--report", "report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the slow run's one-file HTML report (ingero report) here.")
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
            click.echo(json.dumps([{"name": s.name, "title": s.title, "story": s.story,
                                    "expected_rule": s.expected_rule, "fix": s.fix}
                                   for s in scenarios.SCENARIOS], indent=2))
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
        from ingero.export.output import check_target
        from ingero.export.run import report as html_report

        check_target(report, force=True)  # an unwritable --report fails before the runs, not after

        def _write_report(db: Path, from_ns: int | None) -> str:
            return html_report(db, report, Options(from_ns=from_ns), force=True)

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
    _render(result, keep_db)


def _render(result: Any, keep_db: Path | None) -> None:
    from ingero.render import terminal

    out = sys.stdout
    s = result.scenario
    if result.mode == "synthetic":
        out.write(f"synthetic replay (why: {result.reason})\n")
    else:
        out.write("live: real eBPF trace of the workload on the simulated CUDA runtime\n")
    out.write(f"Scenario {s.name}: {s.story}\n")
    out.write(f"CUDA wait policy: {result.policy}\n\n")
    terminal.write(result.before.report, out)
    out.write("\n")
    if s.expected_rule is not None:
        verdict = "named the cause" if result.diagnosed else (
            f"expected {s.expected_rule}, explain ranked {result.top_rule or 'nothing'} first")
        out.write(f"Diagnosis: {verdict}\n")
    if result.after is not None:
        out.write(f"Fix applied: {s.fix}\n")
        _before_after(result.before.summary, result.after.summary, out)
        after_chains = [c for c in (result.after.report_dict or {}).get("chains", [])
                        if c.get("severity") in ("HIGH", "MEDIUM")]
        out.write("After the fix, explain finds "
                  + (", ".join(f"[{c['severity']}] {c['rule_id']}" for c in after_chains) or "no causal chains")
                  + "\n")
    if keep_db is not None:
        out.write(f"Trace kept in {keep_db}: ingero explain --db {keep_db}\n")
    if result.report_line:
        out.write(f"Report of the slow run: {result.report_line}\n")


ROWS = (
    ("step time (mean)", "step_ms_mean", "ms", False),
    ("step time (p99)", "step_ms_p99", "ms", False),
    ("sync p99", "sync_ms_p99", "ms", False),
    ("steps/s", "steps_per_s", "", True),
    ("device busy", "device_busy_pct", "%", True),
    ("collective wait", "collective_wait_ms_mean", "ms", False),  # multi-rank scenarios: per rank, mean
)


def _before_after(before: dict, after: dict, out: Any) -> None:
    out.write(f"  {'':<18} {'before':>10} {'after':>10}  change\n")
    for label, key, unit, higher_better in ROWS:
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            continue
        change = ""
        if b:
            ratio = a / b
            change = f"{ratio:.2f}x" + (" better" if (ratio > 1) == higher_better and ratio != 1 else "")
        out.write(f"  {label:<18} {b:>9.2f}{unit:<1} {a:>9.2f}{unit:<1}  {change}\n")
