"""The rule registry: every rule module, in evaluation order.

A rule module declares ``ID``, ``TITLE``, a frozen ``Thresholds`` dataclass
(instance ``T``) and ``evaluate(con, ctx) -> list[Chain]``.  It reads the
ing_* window tables built by analyze/windows.py; docs/rules.md lists every
id (a test checks the two agree).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

RULE_MODULES = (
    "failed_calls",  # a notice, listed first: the calls that did no GPU work
    "cpu_contention",
    "cpu_quota",
    "input_bound",
    "lock_contention",
    "output_bound",
    "loop_sleep",
    "host_bound",
    "transfer_bound",
    "io_stall",
    "memory_pressure",
    "launch_bound",
    "sync_heavy",
    "gpu_idle",
    "sizing",
    "straggler",
)


def registry() -> list[ModuleType]:
    return [import_module(f"ingero.analyze.rules.{name}") for name in RULE_MODULES]
