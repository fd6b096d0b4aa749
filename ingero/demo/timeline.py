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

import numpy as np
import pyarrow as pa

from ingero.events.units import US

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


FIELDS = ("timestamp", "duration_ns", "pid", "tid", "op", "kind", "bytes", "preempted", "other_pid", "runq_ns",
          "ret", "cpu", "in_call", "comm")  # comm: an NCCL call's communicator
TYPES = (pa.int64(), pa.int64(), pa.int32(), pa.int32(), pa.string(), pa.string(), pa.int64(), pa.bool_(),
         pa.int32(), pa.int64(), pa.int32(), pa.int16(), pa.string(), pa.uint64())


class Columns:
    """Growing event rows, converted to Arrow once at the end.

    A replay makes millions of rows, one Python call each: a row is one tuple
    appended (not fourteen list appends), and a burst of identical page faults
    is one block of numpy columns.  Parts keep the order rows were added in.
    """

    def __init__(self) -> None:
        self._parts: list[list[tuple] | dict[str, np.ndarray] | pa.Table] = []
        self._rows: list[tuple] = []  # the part rows are being added to
        self._parts.append(self._rows)
        self._table: pa.Table | None = None  # cached until the next row

    @classmethod
    def empty(cls) -> "Columns":
        return cls()

    def add(self, ts: int, dur: int, op: str, *, pid: int = LOOP_PID, tid: int | None = None,
            kind: str | None = None, nbytes: int | None = None, preempted: bool | None = None,
            other_pid: int | None = None, runq_ns: int | None = None, cpu: int = 0,
            in_call: str | None = None, comm: int | None = None) -> None:
        is_cuda = op[:4] in ("cuda", "nccl")
        self._rows.append((int(ts), int(dur), pid, pid if tid is None else tid, op, kind, nbytes, preempted,
                           other_pid, runq_ns, 0 if is_cuda else None, cpu, in_call, comm))
        self._table = None

    def add_back_to_back(self, ts: int, n: int, dur: int, op: str, *, pid: int = LOOP_PID, cpu: int = 0) -> None:
        """``n`` rows of op ``op``, ``dur`` each, end to end from ``ts`` (a burst of page faults)."""
        if n <= 0:
            return
        self.add_block(int(ts) + np.arange(n, dtype=np.int64) * max(0, int(dur)), np.full(n, int(dur), np.int64),
                       op, pid=pid, cpu=cpu)

    def add_block(self, ts: np.ndarray, dur: np.ndarray, op: str, *, pid: int = LOOP_PID, cpu: int = 0) -> None:
        """One row of op ``op`` per (ts, dur), its other fields as ``add`` leaves them (a run of launches)."""
        n = len(ts)
        if n == 0:
            return
        part = {
            "timestamp": np.asarray(ts, np.int64), "duration_ns": np.asarray(dur, np.int64),
            "pid": np.full(n, pid, np.int32), "tid": np.full(n, pid, np.int32),
            "op": np.full(n, op, object), "cpu": np.full(n, cpu, np.int16),
        }
        if op[:4] in ("cuda", "nccl"):
            part["ret"] = np.zeros(n, np.int32)
        self._parts.append(part)
        self._rows = []
        self._parts.append(self._rows)
        self._table = None

    def _events(self) -> pa.Table:
        """Every row so far as one table, in the order added; the parts become that table (their
        Python rows freed).  The Python rows are converted together and the blocks together (one
        Arrow array per field each, not per part: a replay has thousands of parts), then put back
        in order with one take."""
        if self._table is None:
            tables: list[pa.Table] = []
            starts: list[np.ndarray] = []  # each table's rows' places in the whole
            at = 0
            rows: list[tuple] = []
            rows_at: list[np.ndarray] = []
            blocks: list[dict[str, np.ndarray]] = []
            blocks_at: list[np.ndarray] = []
            for part in self._parts:
                n = part.num_rows if isinstance(part, pa.Table) else (
                    len(part["timestamp"]) if isinstance(part, dict) else len(part))
                if n == 0:
                    continue
                place = np.arange(at, at + n, dtype=np.int64)
                at += n
                if isinstance(part, pa.Table):
                    tables.append(part)
                    starts.append(place)
                elif isinstance(part, dict):
                    blocks.append(part)
                    blocks_at.append(place)
                else:
                    rows.extend(part)
                    rows_at.append(place)
            if rows:
                tables.append(pa.Table.from_arrays([pa.array(col, t) for col, t in zip(zip(*rows), TYPES)],
                                                   names=list(FIELDS)))
                starts.append(np.concatenate(rows_at))
            if blocks:
                tables.append(_blocks_table(blocks))
                starts.append(np.concatenate(blocks_at))
            if not tables:
                tables = [pa.Table.from_arrays([pa.array([], t) for t in TYPES], names=list(FIELDS))]
            whole = pa.concat_tables(tables).combine_chunks()
            if len(starts) > 1:
                whole = whole.take(np.argsort(np.concatenate(starts), kind="stable"))
            self._table = whole
            self._rows = []
            self._parts = [self._table, self._rows]
        return self._table

    def column(self, name: str) -> list:
        """One column as a list (tests, small replays)."""
        return self._events().column(name).to_pylist()

    def __getattr__(self, name: str) -> list:
        if name in FIELDS:
            return self.column(name)
        raise AttributeError(name)

    def table(self, session_id: int) -> pa.Table:
        t = self._events()
        return t.add_column(0, "session_id", pa.array(np.full(t.num_rows, session_id, np.int32)))


def _blocks_table(blocks: list[dict[str, np.ndarray]]) -> pa.Table:
    """The rows of ``Columns.add_block`` parts as one table: a field a block lacks is null there."""
    cols = []
    for f, t in zip(FIELDS, TYPES):
        have = [f in b for b in blocks]
        if not any(have):
            cols.append(pa.nulls(sum(len(b["timestamp"]) for b in blocks), t))
            continue
        proto = next(b[f] for b in blocks if f in b)
        values = np.concatenate([b[f] if f in b else np.zeros(len(b["timestamp"]), proto.dtype) for b in blocks])
        if all(have):
            cols.append(pa.array(values, t))
        else:
            missing = np.concatenate([np.full(len(b["timestamp"]), f not in b) for b in blocks])
            cols.append(pa.array(values, t, mask=missing))
    return pa.Table.from_arrays(cols, names=list(FIELDS))


class Draws:
    """Uniform draws of one generator, drawn in blocks: ``uniform(lo, hi)`` gives exactly what
    ``rng.uniform(lo, hi)`` would, in the same order (lo + (hi - lo) * the next double), at a
    fraction of the cost of one numpy call per draw.  Threads of one replay share one."""

    BLOCK = 1 << 14

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self._buf: list[float] = []
        self._i = 0

    def uniform(self, lo: float = 0.0, hi: float = 1.0) -> float:
        if self._i == len(self._buf):
            self._buf = self.rng.random(self.BLOCK).tolist()
            self._i = 0
        u = self._buf[self._i]
        self._i += 1
        return lo + (hi - lo) * u

    def doubles(self, n: int) -> np.ndarray:
        """The next ``n`` doubles of the stream: what ``n`` calls of ``uniform()`` would have drawn."""
        out = np.empty(n)
        got = 0
        while got < n:
            if self._i == len(self._buf):
                self._buf = self.rng.random(self.BLOCK).tolist()
                self._i = 0
            k = min(n - got, len(self._buf) - self._i)
            out[got:got + k] = self._buf[self._i:self._i + k]
            self._i += k
            got += k
        return out


class LoopThread:
    """The training loop's thread: its clock ``t`` and the rows it leaves behind."""

    def __init__(self, c: Columns, rng: "Draws | np.random.Generator", policy: str, t: int, *,
                 pid: int = LOOP_PID, cpu: int = 0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"wait policy {policy!r} is not one of {POLICIES}")
        self.c = c
        self.pid = pid  # the process (and its one thread) whose rows these are
        self.cpu = cpu  # the core it runs on
        self.rng = rng if isinstance(rng, Draws) else Draws(rng)  # threads of one replay share one
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

    @staticmethod
    def jits(ns: float, u: np.ndarray) -> np.ndarray:
        """``jit(ns)`` for each double of ``u`` (the same arithmetic, so the same integers)."""
        return np.maximum(1, (ns * (0.95 + (1.05 - 0.95) * u)).astype(np.int64))

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

    def call_run(self, op: str, ns: int, **row) -> int:
        """``call_op(op, lambda: self.run(ns))`` without the closure: the replay's hottest path
        (a launch-bound replay makes a million of these calls).  Returns its duration."""
        start = self.t
        self.call = op
        self.run(ns)
        self.call = None
        self.c.add(start, self.t - start, op, pid=self.pid, cpu=self.cpu, **row)
        return self.t - start

    def launch_run(self, n: int, launch_ns: float, kernel_ns: float, device_free: int) -> tuple[int, int]:
        """``n`` kernel launches of ``jit(launch_ns)`` each, every one queueing a kernel of
        ``jit(kernel_ns)`` on a device free from ``device_free``: what ``n`` rounds of
        ``call_run('cudaLaunchKernel', ...)`` and a queue would do, drawn and stored as one block.
        Only for a thread nothing preempts (a contended one's slices interleave the launches).
        Returns (the device's end of the work queued, the kernels' total time)."""
        assert not self.contended
        u = self.rng.doubles(2 * n)
        launch = self.jits(launch_ns, u[0::2])
        kernel = self.jits(kernel_ns, u[1::2])
        ends = self.t + np.cumsum(launch)
        self.c.add_block(ends - launch, launch, "cudaLaunchKernel", pid=self.pid, cpu=self.cpu)
        self.t = int(ends[-1])
        self.oncpu_ns += int(launch.sum())
        # the device: free_k = max(free_{k-1}, end_k) + kernel_k, i.e. the kernels' running sum
        # plus the latest of the start free and every launch's end less the kernels before it
        done = np.cumsum(kernel)
        free = int(done[-1]) + max(int(device_free), int(np.max(ends - (done - kernel))))
        return free, int(done[-1])

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
