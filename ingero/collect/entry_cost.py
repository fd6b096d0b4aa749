"""What one traced CUDA call costs its thread: the uprobe pair, by how the kernel runs the probed instruction.

An entry uprobe replaces a function's first instruction with a trap.  x86's
uprobe code emulates a few instructions in the trap (push among them) and
single-steps any other one out of line, which is a second trap: on this
project's VMs a probed entry that begins with ``push`` costs its caller
1.3-2.1 us a call, one that begins with ``mov`` 10-15 us (docs/benchmarks.md,
"What a probed call costs").  Every CUDA entry point seen so far (the
simulated runtime's, NVIDIA's libcudart 13) begins with a push; libc's
getppid, which the calibration timed alone until 2026-12-02, with a mov --
so the cost of a traced launch read 5-8x too high, enough to call the
launch-bound demo "launch-bound only while traced".

So each kind of entry is calibrated on a libc function that begins the same
way, and the cost a session records is that of the kind its launch entries
(the calls launch-bound and the overhead budget count) begin with, read from
the library's own bytes as they are linked (loader.LinkedProbes.take).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

PUSH = "push"  # emulated in the trap
OTHER = "other"  # single-stepped out of line: a second trap

# What the CUDA programs add to the trap per call (bpf/cuda.bpf.c: ~115 ns above empty programs,
# the record included): added to the calibrated trap.
PROGRAM_NS = 150.0


def entry_kind(code: bytes) -> str:
    """The kind of a function's first instruction, from its first bytes."""
    if code[:1] and 0x50 <= code[0] <= 0x57:  # push r64
        return PUSH
    if code[:1] == b"\x41" and len(code) > 1 and 0x50 <= code[1] <= 0x57:  # push r8-r15
        return PUSH
    return OTHER


# libc functions timed for each kind, with arguments that make them return at once and touch
# nothing: bsearch over no elements never calls its comparator.  A target whose first instruction
# is not of its kind in this libc (another build) is passed over; a kind with none is not measured.
TARGETS: dict[str, tuple[tuple[str, tuple], ...]] = {
    PUSH: (("bsearch", (None, None, 0, 1, None)),),
    OTHER: (("getppid", ()),),
}


@dataclass
class CallCosts:
    """The calibrated cost of a traced call by entry kind, and the kinds of the launch entries linked."""

    by_kind: dict[str, float] = field(default_factory=dict)  # ns, trap pair + PROGRAM_NS
    launch_kinds: Counter = field(default_factory=Counter)
    calibration_s: float = 0.0

    def note_launch_entry(self, code: bytes) -> None:
        self.launch_kinds[entry_kind(code)] += 1

    @property
    def ns(self) -> float | None:
        """What one traced launch costs its thread: the cost of the kind most launch entries begin
        with (a push, until one is linked: every CUDA runtime seen); None when that kind could not
        be measured."""
        kind = self.launch_kinds.most_common(1)[0][0] if self.launch_kinds else PUSH
        return self.by_kind.get(kind)


def calibrate(costs: CallCosts, time_target: Callable[[str, tuple], tuple[float, float]],
              first_bytes: Callable[[str], bytes]) -> None:
    """Each kind's cost into ``costs``, timed by ``time_target(symbol, args)`` -> (trap ns, wall s)
    on the first of its TARGETS whose ``first_bytes(symbol)`` are of that kind.  OSError when none
    could be timed."""
    errors: list[str] = []
    for kind, targets in TARGETS.items():
        for symbol, args in targets:
            try:
                if entry_kind(first_bytes(symbol)) != kind:
                    continue
                trap_ns, wall_s = time_target(symbol, args)
            except (OSError, AttributeError) as exc:  # AttributeError: ctypes has no such symbol
                errors.append(f"{symbol}: {exc}")
                continue
            costs.by_kind[kind] = trap_ns + PROGRAM_NS
            costs.calibration_s += wall_s
            break
    if not costs.by_kind:
        raise OSError("; ".join(errors) or "no libc function of a known entry kind to time")


def calibrate_links(program: Any, links: Any) -> None:
    """``calibrate`` a program's costs (loader.Program.call_costs) with its linked probes
    (loader.LinkedProbes) on this process's libc."""
    calibrate(program.call_costs, links.calibrate_ns, links.libc_entry)
