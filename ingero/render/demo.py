"""What `ingero demo` prints: the scenario list, and a run's explain, verdict and before/after table."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, TextIO

from ingero.events.units import NS
from ingero.render import layout, terminal


def scenario_list(scenarios: Any) -> str:
    """One line per scenario (demo.scenarios.SCENARIOS): name and title."""
    width = max(len(s.name) for s in scenarios)
    return "\n".join(f"  {s.name:<{width}}  {s.title}" for s in scenarios)


def scenario_dicts(scenarios: Any) -> list[dict]:
    """`ingero demo --list --json`: what each scenario reproduces and the fix it applies."""
    return [{"name": s.name, "title": s.title, "story": s.story, "expected_rule": s.expected_rule, "fix": s.fix}
            for s in scenarios]


def write(result: Any, keep_db: Path | None, out: TextIO) -> None:
    """A demo's run (demo.runner.DemoResult): the slow run's explain (short, as `ingero explain`
    prints it), the verdict, before/after, and the explain command that prints the same numbers."""
    view = layout.for_stream(out, verbose=False)

    def put(text: str, keep: tuple[str, ...] = ()) -> None:
        for line in layout.lines(text, view, keep=keep):
            out.write(line + "\n")

    s = result.scenario
    if result.mode == "synthetic":
        put(f"synthetic replay (why: {result.reason})")
    else:
        put("live: real eBPF trace of the workload on the simulated CUDA runtime")
    put(f"Scenario {s.name}: {s.story}")
    put(f"CUDA wait policy: {result.policy}")
    out.write("\n")
    again = explain_command(keep_db, result.before.steady_from_ns)
    more = f"{again} -v" if again else "rerun with --keep-db FILE, then ingero explain -v --db FILE"
    terminal.write(result.before.report, out, view, more=more)
    out.write("\n")
    if s.expected_rule is not None:
        verdict = "named the cause" if result.diagnosed else (
            f"expected {s.expected_rule}, explain ranked {result.top_rule or 'nothing'} first")
        put(f"Diagnosis: {verdict}")
    if result.after is not None:
        put(f"Fix applied: {s.fix}")
        for line in before_after(result.before.summary, result.after.summary):
            out.write(line + "\n")
        put(after_line(result.after.report_dict))
    if again:
        put(f"Trace kept in {keep_db}: {again} prints the numbers above", keep=(again,))
    if result.report_line:
        put(f"Report of the slow run: {result.report_line}")


def explain_command(keep_db: Path | None, from_ns: int | None) -> str | None:
    """The `ingero explain` that reads what the demo's explain read: the kept trace from the
    loop's first step (the demo leaves out the tracer's and the interpreter's start-up, whose
    whole-second windows would differ), the time as exact epoch seconds."""
    if keep_db is None:
        return None
    cmd = f"ingero explain --db {shlex.quote(str(keep_db))}"
    if from_ns is not None:
        cmd += f" --from {from_ns // NS}.{from_ns % NS:09d}"
    return cmd


def after_line(report_dict: dict | None) -> str:
    """What explain finds in the fixed run: its HIGH and MEDIUM chains with their shares, or none."""
    found = [c for c in (report_dict or {}).get("chains", []) if c.get("severity") in ("HIGH", "MEDIUM")]
    if not found:
        return "After the fix, explain finds no causal chains"
    return "After the fix, explain still finds " + ", ".join(
        f"[{c['severity']}] {c['rule_id']} ({c.get('headline') or terminal_share(c.get('share'))})" for c in found)


def terminal_share(share: float | None) -> str:
    return f"{100 * (share or 0):.1f}% of the loop's time"


# label, summary key, unit, what a smaller value is ('faster' for times, 'shorter' for waits,
# 'slower' for rates, None for a share: its change is in points)
ROWS = (
    ("step time (mean)", "step_ms_mean", "ms", "faster"),
    ("step time (p99)", "step_ms_p99", "ms", "faster"),
    ("sync p99", "sync_ms_p99", "ms", "shorter"),
    ("throughput", "steps_per_s", "steps/s", "slower"),
    ("device busy", "device_busy_pct", "%", None),
    ("collective wait", "collective_wait_ms_mean", "ms", "shorter"),  # multi-rank scenarios: per rank, mean
)
_OPPOSITE = {"faster": "slower", "slower": "faster", "shorter": "longer"}
MINUS = "\u2212"  # the minus sign: '−59%'


def _signed_pct(change: float) -> str:
    return f"{'+' if change > 0 else MINUS}{abs(change):.0%}"


def change_text(before: float, after: float, smaller: str | None) -> str:
    """'2.45× faster (−59%)' for a step time from 34.51 to 14.07 ms: how many times faster or
    slower, and the value's own change; a share's change in points; '' without a before."""
    if smaller is None:
        points = after - before
        if round(points, 1) == 0:
            return "no change"
        return f"{'+' if points > 0 else MINUS}{abs(points):.1f} points"
    if before <= 0 or after <= 0:
        return ""
    change = after / before - 1
    if round(change * 100) == 0:
        return "no change"
    factor = before / after if after < before else after / before
    word = smaller if after < before else _OPPOSITE[smaller]
    return f"{factor:.2f}\u00d7 {word} ({_signed_pct(change)})"


def _number(value: float, unit: str) -> str:
    return f"{value:,.1f}" if unit == "%" else f"{value:,.2f}"


def before_after(before: dict, after: dict) -> list[str]:
    """train.py's summaries of the slow and the fixed run, side by side: numbers right-aligned,
    each with its unit, and the change in words."""
    rows = [(label, _number(b, unit), _number(a, unit), unit, change_text(b, a, smaller))
            for label, key, unit, smaller in ROWS
            if (b := before.get(key)) is not None and (a := after.get(key)) is not None]
    if not rows:
        return []
    lw = max(len(r[0]) for r in rows)
    nw = max([len("before")] + [len(x) for r in rows for x in r[1:3]])
    uw = max(len(r[3]) for r in rows)
    lines = [f"  {'':<{lw}}  {'before':>{nw}}{'':<{uw + 1}}  {'after':>{nw}}{'':<{uw + 1}}  change"]
    for label, b, a, unit, change in rows:
        lines.append(f"  {label:<{lw}}  {b:>{nw}} {unit:<{uw}}  {a:>{nw}} {unit:<{uw}}  {change}".rstrip())
    return lines
