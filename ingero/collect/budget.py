"""The overhead budget (`ingero trace --overhead-budget PCT`): what tracing may cost the traced threads.

A uprobe trap and its return cost the calling thread 1-7 us of CPU per CUDA
call on these VMs, whatever the BPF program does, so a loop launching ~59 k
kernels/s loses ~30% of its steps/s when every call is traced.  With a budget
the tracer measures that cost on this host at start (a calibration of a few
thousand probed calls of libc's getppid in its own process, about 0.1 s) and
watches the rate of the calls that make it: kernel launches, the bulk of a
training loop's calls.  When the launches would cost more than PCT of the
CPU of the threads making them, their probes are duty-cycled: attached for a
slice of every PERIOD_S, detached for the rest.  Everything else stays on all
the time: syncs, copies and allocations (a few per step: their counts and
percentiles stay exact), the scheduler, fault and block-I/O tracepoints
(cheap, and they carry the causes).

Each period in which the launch probes were not attached throughout is a row
of the ``sampling`` table (docs/schema.md): analyze scales launch counts and
host time by it and says so (ingero/analyze/sampling.py).

The launch probes are uprobe_multi links here (loader.LinkedProbes): a
BCC perf-event uprobe takes one RCU grace period per probe to detach, one at
a time (0.6-0.8 s each on this loaded box), links one per link.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ingero.events.ops import OP_NAMES, Op
from ingero.traceapi import TraceHook

# The daemon's default (`ingero trace` without --duration or --cmd; README, Overhead budget).
# Ingero upstream publishes 0.4-1.7% for its adaptive
# sampling; 2% of the traced threads' CPU is one slow step in fifty, inside
# the step-to-step spread of every loop in the table (553-577 steps/s
# untraced: +-2%), and leaves a host-bound loop ~5% of its launches at 59 k/s
# and 7 us per call: ~3 k sampled launches per second, enough for its rates.
SUGGESTED_PCT = 2.0
PERIOD_S = 1.0
# Never below this share: a 30 ms slice at 59 k calls/s still holds ~1.8 k
# launches; below it a rate rests on too few, and the attach / detach cycle
# (two links: ~0.3 ms of tracer CPU) stops being small beside the slice.
MIN_RATIO = 0.03
# What the CUDA programs add to the trap per call (bpf/cuda.bpf.c: ~115 ns
# above empty programs, the record included): added to the calibrated trap.
PROGRAM_NS = 150.0
# Rates are averaged over the last RATE_S seconds: rows reach on_flush up to a
# flush interval after their slice, so one second alone swings.
RATE_S = 5
SWITCHED_OPS = frozenset({Op.CUDA_LAUNCH_KERNEL, Op.CU_LAUNCH_KERNEL, Op.CUDA_GRAPH_LAUNCH, Op.CU_GRAPH_LAUNCH})
SWITCHED_NAMES = ",".join(sorted(OP_NAMES[o] for o in SWITCHED_OPS))
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def budget_in_force(asked: float | None, daemon: bool) -> float:
    """The budget a trace runs with, in %: what was asked (0: off), else SUGGESTED_PCT in
    daemon mode (on every node, all the time), else none (every call traced)."""
    if asked is not None:
        return asked
    return SUGGESTED_PCT if daemon else 0.0


def attached_ratio(calls_per_s: float, cost_ns: float, cpu_s_per_s: float, budget_pct: float,
                   min_ratio: float = MIN_RATIO) -> float:
    """The share of each period the switched probes stay attached (1.0: always).

    ``calls_per_s``: the switched calls' full rate (as if traced throughout);
    ``cost_ns``: what one traced call costs its thread; ``cpu_s_per_s``: the
    CPU the threads making them use per second.  Their cost at full rate is
    calls_per_s * cost_ns; the budget allows budget_pct % of the CPU."""
    if calls_per_s <= 0 or cost_ns <= 0:
        return 1.0
    full = calls_per_s * cost_ns * 1e-9  # CPU-seconds per second
    allowed = budget_pct / 100.0 * max(cpu_s_per_s, full)
    ratio = allowed / full
    return 1.0 if ratio >= 1.0 else max(min_ratio, ratio)


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process so far, in seconds (None: gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


@dataclass
class Period:
    """One period of the duty cycle, wall-clock ns: attached from a0 to a1 within [from, to).

    from: before the links are made (no row of the slice starts before it); a0: after.
    gone: the entry probes' closes returned (no row starts after it)."""

    from_ns: int
    to_ns: int
    a0_ns: int
    a1_ns: int
    gone_ns: int  # the entry probes' closes returned: no row starts after it

    @property
    def ratio(self) -> float:
        return (self.a1_ns - self.a0_ns) / (self.to_ns - self.from_ns)


class BudgetHook(TraceHook):
    """Duty-cycles the launch probes to keep their cost under ``pct`` % of the traced threads' CPU."""

    def __init__(self, pct: float, period_s: float = PERIOD_S, min_ratio: float = MIN_RATIO):
        self.pct = pct
        self.period_s = period_s
        self.min_ratio = min_ratio
        self.cost_ns: float | None = None
        self.calibration_s: float | None = None
        self.note: str | None = None  # why the budget is off (no uprobe_multi ...)
        self.probes: Any = None  # loader.LinkedProbes
        self.ratio = 1.0  # the decision in force
        self.switched_ops = SWITCHED_OPS
        self._calls: dict[int, int] = {}  # pid -> switched calls seen since the last decision
        self._history: list[tuple[dict[int, int], float, dict[int, float]]] = []  # per second: calls, attached s, cpu
        self._cpu_prev: dict[int, tuple[float, float]] = {}
        self._periods: list[Period] = []  # done, not yet stored
        self._attached_s = 0.0  # attached seconds since the last decision (cycler)
        self._last_decision = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0
        self.refused_attaches = 0
        self._primed = False
        self.sampled_periods = 0

    # -- the seam ------------------------------------------------------------

    def on_program(self, program: Any) -> None:
        """Before any library is attached: calibrate, and take the launch probes over (links)."""
        probes = program.switchable_probes(SWITCHED_OPS)
        try:
            trap_ns, self.calibration_s = probes.calibrate_ns()
        except OSError as exc:
            program.switchable = None
            self.note = f"overhead budget off: this kernel cannot switch probes cheaply ({exc})"
            return
        self.cost_ns = program.call_cost_ns = trap_ns + PROGRAM_NS  # (the session stores it: not measured twice)
        self.probes = probes
        probes.attach()  # attached until a decision says otherwise; libraries join as they are attached
        self._thread = threading.Thread(target=self._cycle, name="ingero-budget", daemon=True)
        self._thread.start()

    def on_start(self, sess: Any) -> list[str] | None:
        if self.probes is None:
            return None  # the note says why (every_second)
        return [f"overhead budget {self.pct:g}%: launch probes are sampled when tracing every launch would cost "
                f"more of the traced threads' CPU (one traced call costs {self.cost_ns / 1e3:.1f} us here; "
                f"--overhead-budget off traces every call)"]

    def on_flush(self, sess: Any, recs: np.ndarray, flush_s: float) -> None:
        if self.probes is None or not len(recs):
            return
        op = recs["op"]
        mask = np.isin(op, np.fromiter((int(o) for o in SWITCHED_OPS), dtype=op.dtype))
        if not mask.any():
            return
        pids, counts = np.unique(recs["pid"][mask], return_counts=True)
        for p, n in zip(pids.tolist(), counts.tolist()):
            self._calls[p] = self._calls.get(p, 0) + n

    def every_second(self, sess: Any) -> None:
        if self.note:
            sess.notes.append(self.note)
            self.note = None
        if self.probes is None:
            return
        if self.probes.notes:
            sess.notes += self.probes.notes
            self.probes.notes = []
        now = time.monotonic()
        with self._lock:
            attached_s = self._attached_s
            if self.probes.attached:
                attached_s += now - self._attached_at
                self._attached_at = now
            self._attached_s = 0.0
            periods, self._periods = self._periods, []
        dt = now - self._last_decision
        self._last_decision = now
        calls, self._calls = self._calls, {}
        if not self._primed:  # the first second: attaching libraries may have taken any time; rates start now
            self._primed = True
            for pid in calls:
                total = proc_cpu_s(pid)
                if total is not None:
                    self._cpu_prev[pid] = (total, now)
            return
        cpu = {}
        for pid in calls:
            total = proc_cpu_s(pid)
            if total is None:
                continue
            prev = self._cpu_prev.get(pid)
            self._cpu_prev[pid] = (total, now)
            if prev is not None and now > prev[1]:
                cpu[pid] = (total - prev[0]) / (now - prev[1])
        self._history = (self._history + [(calls, min(attached_s, dt), cpu)])[-RATE_S:]
        before = self.ratio
        self.ratio = self.decide()
        if (before < 1.0) != (self.ratio < 1.0) or abs(self.ratio - before) > 0.5 * before:
            sess.notes.append(
                f"overhead budget {self.pct:g}%: launch probes attached {self.ratio:.0%} of each second "
                f"(one traced call costs {self.cost_ns / 1e3:.1f} us here)" if self.ratio < 1.0 else
                f"overhead budget {self.pct:g}%: every launch traced again")
        if os.environ.get("INGERO_BUDGET_DEBUG"):
            import sys
            print(f"budget: cost {self.cost_ns:.0f} ns calls {calls} att {attached_s:.3f} cpu {cpu} ratio {self.ratio:.3f} "
                  f"periods {len(periods)}", file=sys.stderr)
        if periods:
            self._store(sess, periods)

    def decide(self) -> float:
        """The attached share for the next periods: the smallest any calling process needs."""
        att = sum(h[1] for h in self._history)
        if att <= 0:
            return self.ratio
        pids = set().union(*(h[0] for h in self._history))
        ratio = 1.0
        for pid in pids:
            rate = sum(h[0].get(pid, 0) for h in self._history) / att
            cpus = [h[2][pid] for h in self._history if pid in h[2]]
            if not cpus:
                continue
            ratio = min(ratio, attached_ratio(rate, self.cost_ns or 0.0, float(np.mean(cpus)), self.pct,
                                              self.min_ratio))
        return ratio

    def on_end(self, sess: Any) -> None:
        self._stop_cycle()
        with self._lock:
            periods, self._periods = self._periods, []
        if periods:
            self._store(sess, periods)

    def close(self) -> None:
        self._stop_cycle()

    # -- the duty cycle (its own thread: slices are shorter than a second) -----

    _attached_at = 0.0

    def _cycle(self) -> None:
        self._attached_at = time.monotonic()
        last_to: int | None = None
        while not self._stop.is_set():
            ratio = self.ratio
            if ratio >= 1.0 or not self.probes.switchable():
                self._attach()
                last_to = None
                self._stop.wait(self.period_s)
                continue
            t0 = time.monotonic()
            # before the links: every row of the slice starts after it.  Periods follow one another
            # without a gap: a thread descheduled between two (tens of ms at a load of 30) would
            # leave detached time that no row of the sampling table covers, read as attached.
            now_ns = time.time_ns()
            from_ns = now_ns if last_to is None else min(last_to, now_ns)
            self._attach()
            # the breakpoints are written at the end of the link call: the slice starts there (an
            # attach takes 0.3 ms of CPU but 10-15 ms of wall time on this loaded box)
            a0 = time.time_ns()
            linked = self.probes.attached
            self._stop.wait(ratio * self.period_s)
            a1, gone = self._detach()
            if not linked:  # refused: an empty slice
                a0 = a1 = gone = from_ns
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - t0)))
            to_ns = max(time.time_ns(), a1 + 1)
            with self._lock:
                self._periods.append(Period(from_ns, to_ns, a0, a1, gone))
            last_to = to_ns
            self.cycles += 1

    def _attach(self) -> None:
        with self._lock:
            if self.probes.attached:
                return
            self._attached_at = time.monotonic()
            try:
                self.probes.attach()
            except OSError as exc:
                # another tracer's BCC uprobe took the offset while ours was detached (see
                # LinkedProbes.take): nothing of ours is attached this slice, and the
                # period says so (ratio 0); tried again next period
                self.refused_attaches += 1
                if self.refused_attaches == 1:
                    self.probes.notes.append(f"overhead budget: re-attaching the launch probes was refused "
                                             f"({exc}); their calls are missing until it succeeds")

    def _detach(self) -> tuple[int, int]:
        with self._lock:
            if self.probes.attached:
                now = time.monotonic()
                self._attached_s += now - self._attached_at
                self._attached_at = now  # a second counted meanwhile adds ~0
        return self.probes.detach()  # blocks this thread for a grace period: not under the lock

    def _stop_cycle(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _store(self, sess: Any, periods: list[Period]) -> None:
        rows = [p for p in periods if p.ratio < 1.0]
        if not rows:
            return
        self.sampled_periods += len(rows)
        sess.store.append("sampling", pa.table({
            "session_id": pa.array([sess.session_id] * len(rows), pa.int32()),
            "from_ns": pa.array([p.from_ns for p in rows], pa.int64()),
            "to_ns": pa.array([p.to_ns for p in rows], pa.int64()),
            "attached_from_ns": pa.array([p.a0_ns for p in rows], pa.int64()),
            "attached_to_ns": pa.array([p.a1_ns for p in rows], pa.int64()),
            "detached_by_ns": pa.array([p.gone_ns for p in rows], pa.int64()),
            "ratio": pa.array([p.ratio for p in rows], pa.float64()),
            "ops": pa.array([SWITCHED_NAMES] * len(rows), pa.string()),
            "call_cost_ns": pa.array([self.cost_ns] * len(rows), pa.float64()),
        }))
