"""The overhead budget (`ingero trace --overhead-budget PCT`): what tracing may cost the traced threads.

What the tracer costs the threads it traces, measured each second against
their CPU time (utime + stime of the traced processes):

* every uprobe trap: a traced CUDA call costs its thread 1-7 us of CPU on
  these VMs whatever the BPF program does (a loop launching ~59 k kernels/s
  loses ~30% of its steps/s when every call is traced).  The trap is timed at
  start (a few thousand probed libc calls in the tracer's own process, one
  function per kind of first instruction: entry_cost.py), before any library
  is attached, so before a --cmd job starts; calls x the cost of the kind the
  launch entries begin with;
* every run of the tracepoint programs (sched_switch runs twice per context
  switch of a traced thread, sched_waking once per wakeup): the kernel's own
  BPF run-time statistics (collect/bpfstats.py), host-wide, so an upper bound
  of what lands on the traced threads.

What exceeds PCT of that CPU is given up, cheapest loss first:

1. off-CPU intervals of traced threads that make no CUDA call (a runtime's
   helper threads, the simulated runtime's device thread, a logger) are
   counted in BPF per thread -- by kind, with their off-CPU and run-queue time
   -- instead of stored one by one: the ``switch_counts`` table, a row per
   thread, second and kind; the loop's own switches stay rows;
2. kernel launches, the bulk of a training loop's calls: their probes are
   duty-cycled, attached for a slice of every PERIOD_S, detached for the
   rest; each period in which they were not attached throughout is a row of
   the ``sampling`` table;
3. (not yet: syncs, copies and allocations stay traced in full -- a few per
   step; their counts and percentiles are what the launch estimate rests on.)

It holds from the first second: a --cmd trace starts at the cheapest state
(switches counted, launches at MIN_RATIO), set before any library is
attached and so before the job starts, and gives the losses back, last
first, as the measured cost leaves room (a daemon or --pid trace counts
switches from the start but traces launches in full until its first
decision: see BudgetHook).  The tracepoints' cost is host-wide, an upper
bound: with little traced CPU (an idle daemon) switches stay counted.  Analyze scales launch
counts by ``sampling`` and adds the counted intervals to its off-CPU totals, and says so (analyze/launch_sampling.py).

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

from ingero.collect import bpfstats, entry_cost
from ingero.events.ops import CUDA_OPS, LAUNCH_OP_CODES, NCCL_OPS, OP_NAMES, Op
from ingero.events.records import BudgetFlag, CallFlag
from ingero.traceapi import TraceHook

# The daemon's default (`ingero trace` without --duration or --cmd; README, Overhead budget).
# Ingero upstream publishes 0.4-1.7% for its adaptive
# sampling; 2% of the traced threads' CPU is one slow step in fifty, inside
# the step-to-step spread of every loop in the table (553-577 steps/s
# untraced: +-2%), and leaves a host-bound loop ~5% of its launches at 59 k/s
# and 7 us per call: ~3 k sampled launches per second, enough for its rates.
SUGGESTED_PCT = 2.0
PERIOD_S = 1.0
# Never below this share: a 10 ms slice at 59 k calls/s still holds ~590
# launches (~3 k over the RATE_S a decision averages); below it a rate rests on
# too few, and the attach / detach cycle (two links: ~0.3 ms of tracer CPU)
# stops being small beside the slice.  Not 3% any more: with the syncs and
# copies of issue 44's loop (1.1 k/s at 10-16 us a trap here) taking over half
# of a 2% budget, 3% of its 55 k launches/s alone cost another 1.6-2.6%.
MIN_RATIO = 0.01
# Before any library's launch probes are taken the cycle looks again this often: the first slice
# starts within it of the library's attach.
NO_LIBRARY_WAIT_S = 0.01
# Rates are averaged over the last RATE_S seconds: rows reach on_flush up to a
# flush interval after their slice, so one second alone swings.
RATE_S = 5
SWITCHED_OPS = LAUNCH_OP_CODES
SWITCHED_NAMES = ",".join(sorted(OP_NAMES[o] for o in SWITCHED_OPS))
# every probed call: each one a trap (the launches among them counted at their full rate)
TRAPPED_OPS = frozenset(CUDA_OPS | NCCL_OPS)
# What storing an off-CPU interval as a row costs in BPF above counting it: the system call and
# waker reads of pt_regs, the stack id and the ring record against one hash update.  Measured with
# the kernel's run-time statistics on a pipe ping-pong (docs/benchmarks.md, issue 44): sched_switch
# 400-426 ns a run stored, 304 counted, two runs an interval; sched_waking 232-269 ns, 211.
ROW_NS = 250.0
# Counted switches are stored again only with this much of the budget to spare: switching
# counting on and off every second would leave a thread's off-CPU time half rows, half counts.
RELAX_SHARE = 0.7
KIND_NAMES = ("preempted", "sleep", "io", "other")  # struct ingero_switch_count's index: kind - KIND_PREEMPTED
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


@dataclass
class Second:
    """What one second of a trace cost the traced threads and what they did (totals over dt_s)."""

    dt_s: float
    attached_s: float  # the launch probes' attached time in it
    launches: int  # launch rows seen (of attached_s)
    other_calls: int  # every other probed call (traced throughout)
    switch_rows: int  # off-CPU rows of threads that had made no CUDA call (stored, not counted)
    counted: int  # off-CPU intervals counted instead (switch_counts)
    tracepoint_ns: float  # the tracepoint programs' run time (BPF statistics)
    cpu_s: float  # the traced processes' CPU time


@dataclass(frozen=True)
class Decision:
    """The budget's state: count the switches of threads that make no CUDA call; the launch probes' share."""

    count_switches: bool
    ratio: float
    cost_share: float = 0.0  # what everything traced in full would cost, as a share of the threads' CPU


def decide(seconds: list[Second], cost_ns: float, pct: float, counting: bool, ratio: float = MIN_RATIO,
           min_ratio: float = MIN_RATIO) -> Decision | None:
    """The cheapest loss that keeps the whole cost under ``pct`` % of the traced threads' CPU
    (None: nothing measured yet).  ``counting``: whether the seconds' switches were being counted
    (their tracepoint time then holds counts, not rows); ``ratio``: the launch probes' share in
    force, kept while no launch was seen (a job that has not launched yet is no evidence that its
    launches are cheap: relaxed then, its first seconds of launches would run at full cost)."""
    dt = sum(x.dt_s for x in seconds)
    if dt <= 0:
        return None
    cpu = sum(x.cpu_s for x in seconds) / dt
    tracepoints = sum(x.tracepoint_ns for x in seconds) / dt * 1e-9
    # as if every switch of those threads were counted: the rows stored cost ROW_NS more each
    tracepoints -= sum(x.switch_rows for x in seconds) / dt * ROW_NS * 1e-9
    rows = sum(x.switch_rows + x.counted for x in seconds) / dt * ROW_NS * 1e-9
    attached = sum(x.attached_s for x in seconds)
    # the launches' full rate: per attached second less the traps' own time in it (a loop slowed by
    # its traps in a slice makes fewer launches there: counting per attached second read issue 44's
    # loop ~3x low, and its slices 3-6% instead of 1%); with several threads this can read high,
    # never low: the budget errs on the side of holding
    n = sum(x.launches for x in seconds)
    untraced_s = max(attached - n * cost_ns * 1e-9, 0.1 * attached)
    launches = (n / untraced_s if attached > 0 else 0.0) * cost_ns * 1e-9
    others = sum(x.other_calls for x in seconds) / dt * cost_ns * 1e-9
    full = max(0.0, tracepoints) + rows + launches + others  # CPU-seconds per second
    if full <= 0:
        return None  # nothing ran that tracing costs: no evidence to trace more on
    # the measured CPU holds the tracer's cost at the state in force: never a base below the full cost
    allowed = pct / 100.0 * max(cpu, full)
    share = full / cpu if cpu > 0 else 0.0
    if full <= allowed * (RELAX_SHARE if counting else 1.0):
        return Decision(False, 1.0 if launches > 0 else ratio, share)
    if launches <= 0:
        return Decision(True, ratio, share)
    if full - rows <= allowed:
        return Decision(True, 1.0, share)
    room = allowed - (full - rows - launches)
    return Decision(True, min(1.0, max(min_ratio, room / launches)), share)


class BudgetHook(TraceHook):
    """Keeps what tracing costs the traced threads under ``pct`` % of their CPU (see the module)."""

    def __init__(self, pct: float, period_s: float = PERIOD_S, min_ratio: float = MIN_RATIO,
                 start_sampled: bool = True):
        self.pct = pct
        self.period_s = period_s
        self.min_ratio = min_ratio
        self.calibration_s: float | None = None
        self.note: str | None = None  # why the launch probes cannot be sampled (no uprobe_multi ...)
        self.probes: Any = None  # loader.LinkedProbes
        self.program: Any = None
        # from the first second, before any library is attached: the cheapest state (the module).
        # start_sampled=False (a daemon, --pid: processes already running or started at any time,
        # their rates unknown): launches traced in full until the first decision, so a short burst
        # of calls stays exact; switches are counted from the start all the same
        self.ratio = min_ratio if start_sampled else 1.0  # the launch probes' share in force
        self.counting = True  # switches of threads without CUDA calls counted, not stored
        self.share: float | None = None  # the last measured full cost, as a share of the threads' CPU
        self.switched_ops = SWITCHED_OPS
        self.stats: bpfstats.RunStats | None = None
        self._tp_fds: list[int] = []
        self._tp_prev: int | None = None
        self._acc = [0, 0, 0]  # since the last second: launches, other calls, switch rows of non-CUDA threads
        self._counted = 0  # intervals counted since the last second (write_second's harvest)
        self._seconds: list[Second] = []
        self._cpu_prev: dict[int, float] = {}
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
        # switch_counts: tid -> totals last stored (n[4], off_ns[4], runq_ns); the threads found gone
        self._sc_prev: dict[int, np.ndarray] = {}
        self._sc_gone: set[int] = set()
        self._sc_from_ns: int | None = None
        self.counted_total = 0
        self.counted_threads: set[int] = set()
        self._debug_prev: dict[str, tuple[int, int]] = {}

    @property
    def cost_ns(self) -> float | None:
        """What one traced launch costs its thread (the program's calibration, by its launch entries)."""
        return None if self.program is None else self.program.call_cost_ns

    # -- the seam ------------------------------------------------------------

    def on_program(self, program: Any) -> None:
        """Before any library is attached (so before a --cmd job starts): the cheapest state, the
        calibration, the BPF statistics, and the launch probes taken over (links)."""
        self.program = program
        program.set_budget_flags(BudgetFlag.COUNT_SWITCHES)
        self.stats = bpfstats.RunStats()
        self._tp_fds = program.tracepoint_fds()
        if self.stats.on:
            self._tp_prev = bpfstats.run_time_ns(self._tp_fds)[0]
        self._sc_from_ns = time.time_ns()
        probes = program.switchable_probes(SWITCHED_OPS)
        try:
            entry_cost.calibrate_links(program, probes)  # (the session stores it: not measured twice)
        except OSError as exc:
            program.switchable = None
            self.note = f"overhead budget: launch probes cannot be sampled on this kernel ({exc})"
            self.ratio = 1.0
            return
        self.calibration_s = program.call_costs.calibration_s
        self.probes = probes
        # Detached until the first slice: a library taken meanwhile is linked at that slice's attach
        # (attached here, a --cmd job released before the first slice ran its launches traced).
        self._thread = threading.Thread(target=self._cycle, name="ingero-budget", daemon=True)
        self._thread.start()

    def on_start(self, sess: Any) -> list[str] | None:
        cost = f"one traced call costs {self.cost_ns / 1e3:.1f} us here; " if self.cost_ns else ""
        stats = "" if self.stats is not None and self.stats.on else (
            f"; the tracepoints' cost is not measured ({self.stats.error if self.stats else 'no program'})")
        launches = (f"launch probes attached {self.ratio:.0%} of each second" if self.ratio < 1.0 else
                    "every launch traced until the cost is measured")
        return [f"overhead budget {self.pct:g}%: starts at its cheapest (switches of threads that make no CUDA "
                f"call counted per second, {launches}) and traces more as the measured cost leaves room "
                f"({cost}--overhead-budget off traces everything){stats}"]

    def on_flush(self, sess: Any, recs: np.ndarray, flush_s: float) -> None:
        if not len(recs):
            return
        op = recs["op"]
        counts = np.bincount(op, minlength=256)
        self._acc[0] += int(sum(counts[int(o)] for o in SWITCHED_OPS))
        self._acc[1] += int(sum(counts[int(o)] for o in TRAPPED_OPS)) - int(sum(counts[int(o)] for o in SWITCHED_OPS))
        switch = op == int(Op.SCHED_SWITCH)
        if switch.any():
            self._acc[2] += int(np.count_nonzero((recs["call_flags"][switch] & int(CallFlag.SEEN)) == 0))

    def write_second(self, sess: Any) -> None:
        self._harvest(sess)

    def every_second(self, sess: Any) -> None:
        if self.note:
            sess.notes.append(self.note)
            self.note = None
        if self.probes is not None and self.probes.notes:
            sess.notes += self.probes.notes
            self.probes.notes = []
        now = time.monotonic()
        with self._lock:
            attached_s = self._attached_s
            if self.probes is not None and self.probes.attached:
                attached_s += now - self._attached_at
                self._attached_at = now
            self._attached_s = 0.0
            periods, self._periods = self._periods, []
        if periods:
            self._store(sess, periods)
        dt = now - self._last_decision
        self._last_decision = now
        (launches, others, rows), self._acc = self._acc, [0, 0, 0]
        counted, self._counted = self._counted, 0
        tp_ns = 0.0
        if self._tp_prev is not None:
            total = bpfstats.run_time_ns(self._tp_fds)[0]
            tp_ns, self._tp_prev = float(total - self._tp_prev), total
        cpu = 0.0
        for pid in sess.traced:
            total_cpu = proc_cpu_s(pid)
            if total_cpu is None:
                self._cpu_prev.pop(pid, None)
                continue
            prev = self._cpu_prev.get(pid)
            self._cpu_prev[pid] = total_cpu
            if prev is not None:
                cpu += total_cpu - prev
        if not self._primed:  # the first second: attaching libraries may have taken any time; rates start now
            self._primed = True
            return
        if self.probes is None:
            attached_s = dt  # launches traced throughout
        self._seconds = (self._seconds + [Second(dt, min(attached_s, dt), launches, others, rows, counted,
                                                 tp_ns, cpu)])[-RATE_S:]
        d = decide(self._seconds, self.cost_ns or 0.0, self.pct, self.counting, self.ratio, self.min_ratio)
        if d is None:
            return
        self.share = d.cost_share
        ratio = d.ratio if self.probes is not None else 1.0
        if os.environ.get("INGERO_BUDGET_DEBUG"):
            self._debug(d)
        if d.count_switches != self.counting:
            self.counting = d.count_switches
            self.program.set_budget_flags(BudgetFlag.COUNT_SWITCHES if self.counting else 0)
            sess.notes.append(
                f"overhead budget {self.pct:g}%: switches of threads that make no CUDA call are counted per "
                f"second, not stored one by one (tracing everything would cost {d.cost_share:.1%} of the traced "
                f"threads' CPU)" if self.counting else
                f"overhead budget {self.pct:g}%: every switch stored again (tracing everything costs "
                f"{d.cost_share:.1%} of the traced threads' CPU)")
        before, self.ratio = self.ratio, ratio
        if (before < 1.0) != (ratio < 1.0) or abs(ratio - before) > 0.5 * before:
            sess.notes.append(
                f"overhead budget {self.pct:g}%: launch probes attached {ratio:.0%} of each second "
                f"(one traced call costs {(self.cost_ns or 0) / 1e3:.1f} us here)" if ratio < 1.0 else
                f"overhead budget {self.pct:g}%: every launch traced again")

    def _debug(self, d: Decision) -> None:
        """INGERO_BUDGET_DEBUG=1: each second's figures and each program's run time, on stderr."""
        import sys

        per = {n: bpfstats.run_time_ns(f) for n, f in self.program.program_fds().items()}
        prev, self._debug_prev = self._debug_prev, per
        print(f"budget: {self._seconds[-1]} -> {d}\n  " + ", ".join(
            f"{n}: {(v[0] - prev[n][0]) / 1e6:.1f} ms {v[1] - prev[n][1]} runs"
            for n, v in sorted(per.items()) if n in prev and v[1] > prev[n][1]), file=sys.stderr)

    def on_end(self, sess: Any) -> None:
        self._stop_cycle()
        with self._lock:
            periods, self._periods = self._periods, []
        if periods:
            self._store(sess, periods)
        self._harvest(sess)
        if self.counted_total:
            sess.notes.append(
                f"overhead budget {self.pct:g}%: {self.counted_total:,} off-CPU intervals of "
                f"{len(self.counted_threads)} thread(s) that made no CUDA call were counted per second "
                f"(table switch_counts), not stored one by one")
        self._close_stats()

    def close(self) -> None:
        self._stop_cycle()
        self._close_stats()

    def _close_stats(self) -> None:
        if self.stats is not None:
            self.stats.close()

    # -- counted switches ------------------------------------------------------

    def _harvest(self, sess: Any) -> None:
        """switch_counts rows: each counting thread's intervals since the last harvest, by kind."""
        if self.program is None:
            return
        now_ns = time.time_ns()
        from_ns, self._sc_from_ns = self._sc_from_ns or now_ns, now_ns
        entries = self.program.switch_counts()
        rows: list[tuple[int, int, int, int, int, int]] = []  # pid, tid, kind index, n, off_ns, runq_ns
        for tid, c in entries:
            cur = np.array([*c.n, *c.off_ns, *c.runq_ns], dtype=np.int64)
            prev = self._sc_prev.get(tid)
            delta = cur if prev is None else cur - prev
            self._sc_prev[tid] = cur
            for k in range(4):
                if delta[k]:
                    rows.append((c.tgid, tid, k, int(delta[k]), int(delta[4 + k]), int(delta[8 + k])))
                    self.counted_total += int(delta[k])
                    self.counted_threads.add(tid)
        # a thread gone at the last harvest has had its last count read now: its entry goes
        gone_before = self._sc_gone
        if gone_before:
            self.program.forget_switch_counts(gone_before)
            for tid in gone_before:
                self._sc_prev.pop(tid, None)
        self._sc_gone = {tid for tid, c in entries if tid not in gone_before
                         and not os.path.exists(f"/proc/{c.tgid}/task/{tid}")}
        self._counted += sum(r[3] for r in rows)
        if not rows:
            return
        sess.store.append("switch_counts", pa.table({
            "session_id": pa.array([sess.session_id] * len(rows), pa.int32()),
            "timestamp": pa.array([now_ns] * len(rows), pa.int64()),
            "interval_ns": pa.array([now_ns - from_ns] * len(rows), pa.int64()),
            "pid": pa.array([r[0] for r in rows], pa.int32()),
            "tid": pa.array([r[1] for r in rows], pa.int32()),
            "kind": pa.array([KIND_NAMES[r[2]] for r in rows], pa.string()),
            "switches": pa.array([r[3] for r in rows], pa.int64()),
            "off_cpu_ns": pa.array([r[4] for r in rows], pa.int64()),
            "runq_ns": pa.array([r[5] for r in rows], pa.int64()),
        }))

    # -- the duty cycle (its own thread: slices are shorter than a second) -----

    _attached_at = 0.0

    def _cycle(self) -> None:
        self._attached_at = time.monotonic()
        last_to: int | None = None
        while not self._stop.is_set():
            ratio = self.ratio
            if not self.probes.switchable():  # no library taken yet: nothing to attach; look again soon
                last_to = None
                self._stop.wait(NO_LIBRARY_WAIT_S)
                continue
            if ratio >= 1.0:
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
