"""What `ingero demo` prints: the scenario list, and a run's explain, verdict and before/after table."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from ingero.render import safe, terminal


def scenario_list(scenarios: Any) -> str:
    """One line per scenario (demo.scenarios.SCENARIOS): name and title."""
    width = max(len(s.name) for s in scenarios)
    return "\n".join(f"  {s.name:<{width}}  {s.title}" for s in scenarios)


def scenario_dicts(scenarios: Any) -> list[dict]:
    """`ingero demo --list --json`: what each scenario reproduces and the fix it applies."""
    return [{"name": s.name, "title": s.title, "story": s.story, "expected_rule": s.expected_rule, "fix": s.fix}
            for s in scenarios]


def write(result: Any, keep_db: Path | None, out: TextIO) -> None:
    """A demo's run (demo.runner.DemoResult): the slow run's explain, the verdict, before/after."""
    s = result.scenario
    if result.mode == "synthetic":
        out.write(safe.text(f"synthetic replay (why: {result.reason})") + "\n")
    else:
        out.write("live: real eBPF trace of the workload on the simulated CUDA runtime\n")
    out.write(safe.text(f"Scenario {s.name}: {s.story}") + "\n")
    out.write(f"CUDA wait policy: {result.policy}\n\n")
    terminal.write(result.before.report, out)
    out.write("\n")
    if s.expected_rule is not None:
        verdict = "named the cause" if result.diagnosed else (
            f"expected {s.expected_rule}, explain ranked {result.top_rule or 'nothing'} first")
        out.write(safe.text(f"Diagnosis: {verdict}") + "\n")
    if result.after is not None:
        out.write(safe.text(f"Fix applied: {s.fix}") + "\n")
        before_after(result.before.summary, result.after.summary, out)
        after_chains = [c for c in (result.after.report_dict or {}).get("chains", [])
                        if c.get("severity") in ("HIGH", "MEDIUM")]
        out.write("After the fix, explain finds "
                  + (", ".join(f"[{c['severity']}] {c['rule_id']}" for c in after_chains) or "no causal chains")
                  + "\n")
    if keep_db is not None:
        out.write(safe.text(f"Trace kept in {keep_db}: ingero explain --db {keep_db}") + "\n")
    if result.report_line:
        out.write(safe.text(f"Report of the slow run: {result.report_line}") + "\n")


ROWS = (
    ("step time (mean)", "step_ms_mean", "ms", False),
    ("step time (p99)", "step_ms_p99", "ms", False),
    ("sync p99", "sync_ms_p99", "ms", False),
    ("steps/s", "steps_per_s", "", True),
    ("device busy", "device_busy_pct", "%", True),
    ("collective wait", "collective_wait_ms_mean", "ms", False),  # multi-rank scenarios: per rank, mean
)


def before_after(before: dict, after: dict, out: TextIO) -> None:
    """train.py's summaries of the slow and the fixed run, side by side."""
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
