"""One thread's timeline in the synthetic replay: CPU work, sleeps, preemptions, device waits.

The replay's training loop is a ``LoopThread``: it advances its own clock
through what the live thread does (run on the CPU, sleep on a queue, wait
for the device inside a CUDA call) and writes the rows the tracer would
record for it into ``Columns``.  Off-CPU intervals of one thread are laid
end to end on its clock, so they never overlap, and each row carries the
CUDA call the thread was inside (``in_call``), as BPF tags it.

How a device wait looks depends on the wait policy (CUDA's
cudaDeviceSchedule* flags, as demos/simcuda implements them):

* ``block``: the thread sleeps until the device is done (one voluntary
  sleep inside the call) and returns after its wake-up latency.
* ``spin``: the thread stays on the CPU, polling.  Under contention it is
  preempted inside the call like anywhere else; that delays the return only
  when the device finished while it was off the CPU.
* ``yield``: like spin, but each poll calls sched_yield: with another task
  runnable on the core, every yield is a switch-out while runnable (a
  'preempted' row inside the call) for the other task's slice.  Alone on
  its core, sched_yield returns at once and it is spin.

Contention (a share ``p`` of the time the thread wants the CPU spent
runnable but off it) is modelled as alternating slices: the thread runs
for a while, a hog takes the CPU for about one scheduler slice, and so on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

US = 1_000
# Fake PIDs of the replay (clearly not live processes of this host).
LOOP_PID = 424_242
WORKER_PID0 = 424_250
HOG_PID0 = 424_300
# A blocked thread wakes ~30 us after its event on an idle host (measured
# wake-up latency of clock_nanosleep here: 20-60 us).
WAKE_NS = 30 * US
# A preempting hog keeps the CPU for about one scheduler slice (~3 ms with
# EEVDF's default base slice on a 2-CPU box).
PREEMPT_SLICE_NS = 3_000 * US
# One poll of a spinning / yielding wait (a clock read, or sched_yield with
# nothing else runnable): the return lags the device by about this much.
POLL_NS = 1 * US

POLICIES = ("spin", "yield", "block")


@dataclass
class Columns:
    """Growing event columns (plain lists; converted once at the end)."""

    timestamp: list[int]
    duration_ns: list[int]
    pid: list[int]
    tid: list[int]
    op: list[str]
    kind: list[str | None]
    bytes: list[int | None]
    preempted: list[bool | None]
    other_pid: list[int | None]
    runq_ns: list[int | None]
    ret: list[int | None]
    cpu: list[int]
    in_call: list[str | None]
    comm: list[int | None]  # NCCL calls: the communicator

    @classmethod
    def empty(cls) -> "Columns":
        return cls(*([] for _ in range(14)))

    def add(self, ts: int, dur: int, op: str, *, pid: int = LOOP_PID, tid: int | None = None,
            kind: str | None = None, nbytes: int | None = None, preempted: bool | None = None,
            other_pid: int | None = None, runq_ns: int | None = None, cpu: int = 0,
            in_call: str | None = None, comm: int | None = None) -> None:
        is_cuda = op.startswith("cuda") or op.startswith("nccl")
        self.timestamp.append(int(ts))
        self.duration_ns.append(int(dur))
        self.pid.append(pid)
        self.tid.append(tid if tid is not None else pid)
        self.op.append(op)
        self.kind.append(kind)
        self.bytes.append(nbytes)
        self.preempted.append(preempted)
        self.other_pid.append(other_pid)
        self.runq_ns.append(runq_ns)
        self.ret.append(0 if is_cuda else None)
        self.cpu.append(cpu)
        self.in_call.append(in_call)
        self.comm.append(comm)

    def add_back_to_back(self, ts: int, n: int, dur: int, op: str, *, pid: int = LOOP_PID, cpu: int = 0) -> None:
        """``n`` rows of op ``op``, ``dur`` each, end to end from ``ts`` (a burst of page faults)."""
        self.timestamp.extend(range(int(ts), int(ts) + n * int(dur), int(dur)) if dur > 0 else [int(ts)] * n)
        self.duration_ns.extend([int(dur)] * n)
        self.pid.extend([pid] * n)
        self.tid.extend([pid] * n)
        self.op.extend([op] * n)
        for col in (self.kind, self.bytes, self.preempted, self.other_pid, self.runq_ns, self.ret, self.in_call,
                    self.comm):
            col.extend([None] * n)
        self.cpu.extend([cpu] * n)

    def table(self, session_id: int) -> pa.Table:
        n = len(self.timestamp)
        return pa.table({
            "session_id": pa.array([session_id] * n, pa.int32()),
            "timestamp": pa.array(self.timestamp, pa.int64()),
            "duration_ns": pa.array(self.duration_ns, pa.int64()),
            "pid": pa.array(self.pid, pa.int32()),
            "tid": pa.array(self.tid, pa.int32()),
            "op": pa.array(self.op, pa.string()),
            "kind": pa.array(self.kind, pa.string()),
            "bytes": pa.array(self.bytes, pa.int64()),
            "preempted": pa.array(self.preempted, pa.bool_()),
            "other_pid": pa.array(self.other_pid, pa.int32()),
            "runq_ns": pa.array(self.runq_ns, pa.int64()),
            "ret": pa.array(self.ret, pa.int32()),
            "cpu": pa.array(self.cpu, pa.int16()),
            "in_call": pa.array(self.in_call, pa.string()),
            "comm": pa.array(self.comm, pa.uint64()),
        })


class LoopThread:
    """The training loop's thread: its clock ``t`` and the rows it leaves behind."""

    def __init__(self, c: Columns, rng: np.random.Generator, policy: str, t: int, *, pid: int = LOOP_PID,
                 cpu: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"wait policy {policy!r} is not one of {POLICIES}")
        self.c = c
        self.pid = pid  # the process (and its one thread) whose rows these are
        self.cpu = cpu  # the core it runs on
        self.rng = rng
        self.policy = policy
        self.t = t
        self.call: str | None = None  # the CUDA call the thread is inside
        self.share = 0.0  # contention: share of wanted CPU time spent runnable but off it
        self.hogs = 0
        self.budget = math.inf  # CPU time left before the next preemption
        self._next_hog = 0
        self.oncpu_ns = 0

    def jit(self, ns: float) -> int:
        return max(1, int(ns * self.rng.uniform(0.95, 1.05)))

    # -- the CPU it shares -------------------------------------------------

    def contend(self, share: float, hogs: int) -> None:
        """From now on ``hogs`` busy processes share the thread's core (``share`` 0: alone)."""
        if (share, hogs) == (self.share, self.hogs):
            return
        self.share, self.hogs = (share, hogs) if share and hogs else (0.0, 0)
        self.budget = self._run_slice()

    @property
    def contended(self) -> bool:
        return self.share > 0

    def _off_slice(self) -> int:
        return max(1, int(PREEMPT_SLICE_NS * self.rng.uniform(0.5, 1.5)))

    def _run_slice(self) -> float:
        if not self.contended:
            return math.inf
        return PREEMPT_SLICE_NS * (1.0 - self.share) / self.share * self.rng.uniform(0.5, 1.5)

    def _hog(self) -> int:
        self._next_hog = (self._next_hog + 1) % self.hogs
        return HOG_PID0 + self._next_hog

    def _switched_out_runnable(self) -> None:
        """A hog takes the CPU for one slice (a preemption, or a yield to a runnable hog)."""
        off = self._off_slice()
        self.c.add(self.t, off, "sched_switch", kind="preempted", preempted=True, other_pid=self._hog(),
                   runq_ns=off, in_call=self.call, pid=self.pid, cpu=self.cpu)
        self.t += off
        self.budget = self._run_slice()

    # -- what the thread does ------------------------------------------------

    def run(self, ns: int) -> None:
        """``ns`` of CPU work, preempted whenever its slice runs out."""
        while ns > 0:
            if self.budget <= 0:
                self._switched_out_runnable()
            step = int(min(ns, max(1, self.budget)))
            self.t += step
            self.oncpu_ns += step
            self.budget -= step
            ns -= step

    def faults(self, n: int, ns: int) -> None:
        """``n`` page faults handled on the CPU, ``ns`` each (outside any CUDA call)."""
        if not self.contended:  # nothing can preempt them: one burst of rows
            self.c.add_back_to_back(self.t, n, ns, "page_fault", pid=self.pid, cpu=self.cpu)
            self.t += n * ns
            self.oncpu_ns += n * ns
            return
        for _ in range(n):
            start = self.t
            self.run(ns)
            self.c.add(start, self.t - start, "page_fault", pid=self.pid, cpu=self.cpu)

    def sleep(self, ns: int) -> None:
        """A voluntary sleep of ``ns`` (a queue, a blocking sync), then the wake-up: runnable until
        a CPU is free (behind a hog's slice now and then under contention)."""
        late = WAKE_NS
        if self.contended and self.rng.uniform() < self.share:
            late += self.jit(PREEMPT_SLICE_NS * self.rng.uniform(0.2, 1.0))  # woke behind a hog
        self.c.add(self.t, ns + late, "sched_switch", kind="sleep", preempted=False, runq_ns=late,
                   in_call=self.call, pid=self.pid, cpu=self.cpu)
        self.t += ns + late
        self.budget = self._run_slice()

    def wait_device(self, until: int) -> None:
        """Inside a CUDA call: wait until the device reaches ``until``, the policy's way."""
        if self.t >= until:
            self.run(POLL_NS)  # done already: one check
            return
        if self.policy == "block":
            self.sleep(until - self.t)
        elif self.policy == "yield" and self.contended:
            while self.t < until:
                self.run(POLL_NS)
                self._switched_out_runnable()
        else:  # spin, or yield with nothing else runnable (sched_yield returns at once)
            while self.t < until:
                if self.budget <= 0:
                    self._switched_out_runnable()  # may end past `until`: the return is late
                    continue
                step = int(min(until - self.t, max(1, self.budget)))
                self.t += step
                self.oncpu_ns += step
                self.budget -= step
            self.run(POLL_NS)

    def call_op(self, op: str, body, **row) -> int:
        """Make CUDA call ``op``: ``body()`` runs inside it; its row spans the whole call.  Returns its duration."""
        start = self.t
        self.call = op
        try:
            body()
        finally:
            self.call = None
        self.c.add(start, self.t - start, op, **{"pid": self.pid, "cpu": self.cpu, **row})
        return self.t - start
