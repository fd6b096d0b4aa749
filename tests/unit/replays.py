"""Synthetic replays shared by the unit tests.

Generating a replay costs seconds (the 30 s launch-bound replay is 1.1 M
rows, memory-pressure's 4.8 M), and the policy matrix, the budget, the
export and the summary tests ask for the same ones.  Writing a replay into a
store never changes it, so one generation serves every store made from it.
The modules that share replays (the 30 s spin replay of each scenario) run
on one pytest-xdist worker (the ``replays`` group: ``make test``), so the
cache serves all of them.
"""

from __future__ import annotations

import functools

from ingero.demo import scenarios, synthetic
from ingero.store.db import Store

START_NS = 1_763_800_000 * 10**9


@functools.lru_cache(maxsize=12)
def replay(name: str, duration_s: float, policy: str, fixed: bool = False,
           start_ns: int = START_NS) -> synthetic.Replay:
    return synthetic.generate(scenarios.get(name), duration_s=duration_s, fixed=fixed, start_ns=start_ns,
                              policy=policy)


def write(store: Store, name: str, duration_s: float, policy: str, *, fixed: bool = False,
          start_ns: int = START_NS, label: str) -> Store:
    """``store`` with the replay written into it as one closed session."""
    synthetic.write(store, scenarios.get(name), replay(name, duration_s, policy, fixed, start_ns), label=label)
    return store
