"""Diagnosis under the overhead budget (issue 44): every demo scenario traced with and without it.

Run as root from the repo root: ``.venv/bin/python -m bench.bench_budget_demos``.

Each scenario's slow run (``ingero demo``'s live run, no fix) twice, in
alternating order: plainly, and with ``--overhead-budget 2%``; per run the
top chain and whether explain says it counted switches or sampled launches.
A scenario passes when both name the same rule at the same severity.  On a
loaded box a run can lose its cause to the load (both modes alike): read the
load column.

Environment: DEMOS_SECONDS (per run, 20), DEMOS (comma list; all by default).
"""

from __future__ import annotations

import os
import sys
import time

from ingero.demo import runner, scenarios

SECONDS = float(os.environ.get("DEMOS_SECONDS", "20"))
WANTED = [x for x in os.environ.get("DEMOS", ",".join(scenarios.names())).split(",") if x]
BUDGET = ("--overhead-budget", "2%")


def _top(result) -> tuple[str, list[str]]:
    report = result.before.report
    chains = report.chains
    top = f"{chains[0].severity} {chains[0].rule_id}" if chains else "none"
    said = [n.split(" (")[0] for n in report.notes if "counted per second" in n or "estimated from a" in n]
    return top, said


def main() -> int:
    if os.geteuid() != 0:
        print("needs root (ingero trace)")
        return 2
    print(f"# bench_budget_demos: {len(WANTED)} scenarios x {SECONDS:g} s, plain and {' '.join(BUDGET)}; "
          f"load at start {os.getloadavg()[0]:.1f}\n")
    print("| scenario | expected | plain | budget 2% | what the budget gave up | same | load |")
    print("|---|---|---|---|---|---|---:|")
    t0 = time.monotonic()
    same = 0
    for i, name in enumerate(WANTED):
        sc = scenarios.get(name)
        out = {}
        order = [(), BUDGET] if i % 2 == 0 else [BUDGET, ()]
        load = os.getloadavg()[0]
        for args in order:
            out[args] = _top(runner.run(name, duration_s=SECONDS, fix=False, trace_args=args))
        (plain, _), (budget, said) = out[()], out[BUDGET]
        ok = plain == budget
        same += ok
        print(f"| {name} | {sc.expected_rule or 'none'} | {plain} | {budget} | {'; '.join(said) or '-'} | "
              f"{'yes' if ok else 'NO'} | {load:.1f} |", flush=True)
    print(f"\n{same} of {len(WANTED)} scenarios: the same top chain with and without the budget "
          f"({time.monotonic() - t0:.0f} s; load at end {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
