"""What each demo scenario's fix is worth: steps/s of the slow run and the fixed run, traced live.

Each scenario runs as `ingero demo NAME` runs it (ingero.demo.runner: the
workload on the simulated CUDA runtime under `ingero trace`, the
interference beside it, then the fixed workload, traced too) and the table
gives both runs' steps/s, the ratio, and whether explain still flags the
scenario's rule on the fixed run.  A measurement, not a test: on a shared
2-core VM the ratio moves with other load (the README's table says what it
was, on which run); tests/live/test_demo_live.py checks the diagnosis.

    python -m bench.bench_demo                       # every scenario, 40 s each
    python -m bench.bench_demo --duration 20 sync-heavy launch-bound
"""

from __future__ import annotations

import argparse
import os
import sys

from ingero.demo import runner, scenarios

# The scenarios model gains of 1.3x (sync-heavy) to 5x (memory-pressure); the
# table marks a ratio below this as "no" for "measurably faster".
MEASURABLE = 1.2


def _row(name: str, duration_s: float) -> str:
    r = runner.run(name, duration_s=duration_s)
    if r.mode != "live":
        return f"| {name} | - | - | - | - | not live: {r.reason} |"
    before, after = r.before.summary["steps_per_s"], r.after.summary["steps_per_s"]
    ratio = after / before if before else float("inf")
    strong_after = {c["rule_id"] for c in r.after.report_dict["chains"] if c["severity"] in ("HIGH", "MEDIUM")}
    still = "yes" if r.scenario.expected_rule in strong_after else "no"
    return (f"| {name} | {before:.1f} | {after:.1f} | {ratio:.2f}x | {'yes' if ratio >= MEASURABLE else 'no'} "
            f"| {still} |")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="scenarios (default: every one with a fix)")
    ap.add_argument("--duration", type=float, default=scenarios.DEFAULT_DURATION_S,
                    help="seconds per scenario, split between the slow and the fixed run")
    args = ap.parse_args(argv)
    names = args.names or [s.name for s in scenarios.SCENARIOS if s.expected_rule is not None]
    load = os.getloadavg()
    print(f"ingero demo, live, {args.duration:g} s per scenario (half slow, half fixed); "
          f"load average at start {load[0]:.2f} on {os.cpu_count()} CPUs\n")
    print(f"| scenario | slow steps/s | fixed steps/s | speed-up | >= {MEASURABLE}x | rule still flagged after fix |")
    print("|---|---:|---:|---:|---|---|")
    for name in names:
        print(_row(name, args.duration), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
