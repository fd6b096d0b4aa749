"""Per-flush aggregates behind `ingero trace --metrics-port`: what /metrics serves.

The trace session calls ``Aggregates.add(recs)`` once per flush with the
records it just stored (numpy, EVENT_DTYPE): a handful of vectorised passes
over the batch, then a Python loop over its distinct (pid, op) keys, never one
per event.  Scrapes read a copy taken under the lock (``snapshot``), so a
scrape never waits on a flush for longer than that copy.

Per traced process (label ``pid``, with its name): CUDA calls per op with a
duration histogram, off-CPU time split preempted / blocked, run-queue wait,
page faults (a count: records carry no fault latency; the time a fault blocks
shows as blocked off-CPU time).  Host-wide: block I/O per kind (read, write ...), whose issuing
pid is often a kernel worker and would grow the label set for nothing.

Bounded labels: an entry whose process has exited is dropped at the next
flush and hidden from the next scrape (``drop_exited``), so days of pids
leave no series behind.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ingero.events.ops import CUDA_OPS, OP_NAMES, Op
from ingero.events.records import KIND_NAMES, SWITCH_RUNQ_BITS, Kind
from ingero.host import pid_alive

# Histogram bucket upper bounds (seconds, Prometheus' `le`): 1 µs to 10 s in steps of 10^(1/25),
# 25 a decade (4 significant digits; 1 ms, 10 ms, 0.1 s and 1 s stay bounds).  histogram_quantile
# interpolates linearly inside the bucket its rank falls in, so its answer and the order statistic
# at that rank share a bucket: within the bound ratio, 1.097, whatever the shape.  Interpolation
# does not help the worst shape, and it is the common one: a loop's syncs and copies are a narrow
# peak (the same kernel, the same copy every step), so a ratio of ~1.2 can still read ~20% high
# and 1-5-10 steps read issue 42's 23.7 ms p99 as 49.6 ms (docs/benchmarks.md has the layouts
# measured).  The whole range matters: launches and the uprobe's floor are µs, syncs and copies
# µs to seconds, block I/O tens of µs to a second.  Each bound is a series per process and op,
# and a scrape's cost grows with them (bench_metrics); Prometheus' native histograms would be
# cheaper, but need its protobuf exposition, which prometheus_client does not write.
BUCKETS_S = tuple(float(f"{10 ** (k / 25):.4g}") for k in range(-150, 26))
_BOUNDS_NS = np.array([round(b * 1e9) for b in BUCKETS_S], dtype=np.uint64)
NBUCKETS = len(BUCKETS_S) + 1  # the last one is +Inf

# events/s is the rate over the flushes of this many seconds: the writer flushes
# at least once a second, so it holds ~10 of them; no flush for that long reads 0.
RATE_WINDOW_S = 10.0

assert all(1 <= o < Op.SCHED_SWITCH for o in CUDA_OPS)  # add() takes them as one slice of sorted ops
_SWITCH, _FAULT, _BLOCK = int(Op.SCHED_SWITCH), int(Op.PAGE_FAULT), int(Op.BLOCK_IO)
_PREEMPTED = int(Kind.PREEMPTED)
_RUNQ_MASK = np.uint64((1 << SWITCH_RUNQ_BITS) - 1)  # a switch's arg also holds its wait's fd (events.h)


@dataclass
class Histo:
    """Count, sum and per-bucket (not cumulative) counts of durations."""

    count: int = 0
    sum_ns: int = 0
    buckets: np.ndarray = field(default_factory=lambda: np.zeros(NBUCKETS, dtype=np.int64))

    def copy(self) -> "Histo":
        return Histo(self.count, self.sum_ns, self.buckets.copy())


@dataclass
class OffCpu:
    preempted_ns: int = 0
    preempted: int = 0
    blocked_ns: int = 0
    blocked: int = 0
    runq_ns: int = 0


@dataclass
class Health:
    events: int = 0  # rows stored so far
    drops_kernel: int = 0
    drops_user: int = 0
    stale_calls: int = 0
    db_bytes: int = 0  # database file + WAL
    flushes: Histo = field(default_factory=Histo)
    last_flush_s: float | None = None  # wall clock of the last flush
    events_per_s: float = 0.0


@dataclass
class Snapshot:
    cuda: dict[tuple[int, str], Histo]
    offcpu: dict[int, OffCpu]
    faults: dict[int, int]
    block_io: dict[str, Histo]
    names: dict[int, str]
    health: Health


def _dense(keys: np.ndarray, dur: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(used keys, their counts, duration sums in ns, bucket counts [key, bucket]) of one batch.

    Keys are small dense ints (< size), so counting is bincount: no sort per flush.  The buckets
    are counted over the used keys only (a handful of a possible size x NBUCKETS)."""
    counts = np.bincount(keys, minlength=size)
    used = np.flatnonzero(counts)
    sums = np.bincount(keys, weights=dur, minlength=size)
    compact = np.zeros(size, dtype=np.int64)
    compact[used] = np.arange(len(used))
    # side='left': bucket i holds durations <= bound i (Prometheus' le); past the last: +Inf
    b = np.searchsorted(_BOUNDS_NS, dur, side="left")
    buckets = np.bincount(compact[keys] * NBUCKETS + b, minlength=len(used) * NBUCKETS).reshape(len(used), NBUCKETS)
    return used, counts[used], sums[used], buckets


def _add(h: Histo, count: int, sum_ns: float, buckets: np.ndarray) -> None:
    h.count += int(count)
    h.sum_ns += int(sum_ns)
    h.buckets += buckets


class Aggregates:
    """Everything /metrics reports about the traced processes, updated once per flush."""

    def __init__(self, alive: Callable[[int], bool] = pid_alive) -> None:
        self._alive = alive
        self._lock = threading.Lock()
        self.cuda: dict[tuple[int, str], Histo] = {}
        self.offcpu: dict[int, OffCpu] = {}
        self.faults: dict[int, int] = {}
        self.block_io: dict[str, Histo] = {}
        self.names: dict[int, str] = {}
        self.health = Health()
        self._stored: deque[tuple[float, int]] = deque()  # (monotonic s, rows) of recent flushes
        # pids of the aggregates, sorted: a record's pid becomes a slot by binary search over a
        # few dozen values (np.unique over a 245 k-record flush cost ~400 ns an event)
        self._known = np.empty(0, dtype=np.int64)

    # -- the writer's side, once per flush --------------------------------------

    def _slots(self, pid: np.ndarray) -> np.ndarray:
        """Index of each pid in self._known (new pids are added: rare after the first flushes)."""
        known = self._known
        if len(known):
            slot = np.searchsorted(known, pid)
            miss = known[np.minimum(slot, len(known) - 1)] != pid
            if not miss.any():
                return slot
            pid_new = pid[miss]
        else:
            pid_new = pid
        self._known = np.union1d(known, np.unique(pid_new))
        return np.searchsorted(self._known, pid)

    def add(self, recs: np.ndarray, names: dict[int, str] | None = None,
            weights: dict[int, float] | None = None) -> None:
        """Fold one stored batch in; ``names``: pid -> process name, as the session knows them.

        ``weights``: op -> how many calls each stored one stands for, for ops sampled under
        `--overhead-budget` (1 / the attached share): their counts, duration sums and
        histogram buckets are scaled (rounded), so rates stay rates of the whole loop.

        The session passes its batch in storage order (decode.storage_order: grouped by op), so
        each op's records are one slice: CUDA ops (1-63), then sched_switch, page_fault, block_io.
        Another order is sorted first."""
        op = np.ascontiguousarray(recs["op"])
        if len(op) > 1 and (op[1:] < op[:-1]).any():
            order = np.argsort(op, kind="stable")
            recs, op = recs[order], op[order]
        lo, sw, pf, bio, end = np.searchsorted(op, [1, _SWITCH, _FAULT, _BLOCK, _BLOCK + 1]).tolist()
        with self._lock:
            if pf > lo:  # CUDA calls, switches and faults: per process
                part = recs[lo:pf]
                slot = self._slots(np.ascontiguousarray(part["pid"]).astype(np.int64))
                known = self._known.tolist()
                dur = np.ascontiguousarray(part["duration_ns"])
                c = sw - lo
                if c:
                    used, counts, sums, buckets = _dense(slot[:c] * 64 + op[lo:sw], dur[:c], len(known) * 64)
                    for k, n, t, b in zip(used.tolist(), counts, sums, buckets):
                        w = weights.get(k & 63, 1.0) if weights else 1.0
                        if w != 1.0:
                            n, t, b = round(n * w), t * w, np.rint(b * w).astype(np.int64)
                        _add(self.cuda.setdefault((known[k >> 6], OP_NAMES.get(k & 63, f"op{k & 63}")), Histo()),
                             n, t, b)
                if pf > sw:
                    self._add_switches(known, slot[c:pf - lo], dur[c:pf - lo],
                                       np.ascontiguousarray(part["kind"][c:]),
                                       np.ascontiguousarray(part["arg"][c:]) & _RUNQ_MASK)
            if bio > pf:  # a count: the tracer records no fault latency (its blocking shows as off-CPU)
                known_f = self._slots(np.ascontiguousarray(recs["pid"][pf:bio]).astype(np.int64))
                known = self._known.tolist()
                counts = np.bincount(known_f, minlength=len(known))
                for k in np.flatnonzero(counts).tolist():
                    self.faults[known[k]] = self.faults.get(known[k], 0) + int(counts[k])
            if end > bio:
                used, counts, sums, buckets = _dense(np.ascontiguousarray(recs["kind"][bio:end]).astype(np.int64),
                                                     np.ascontiguousarray(recs["duration_ns"][bio:end]), 256)
                for k, n, t, b in zip(used.tolist(), counts, sums, buckets):
                    _add(self.block_io.setdefault(KIND_NAMES.get(k) or "other", Histo()), n, t, b)
            if names:
                for p in self._pids():
                    if p in names:
                        self.names[p] = names[p]
            self._drop_exited_locked()

    def _add_switches(self, known: list[int], slot: np.ndarray, dur: np.ndarray, kind: np.ndarray,
                      runq: np.ndarray) -> None:
        pre = kind == _PREEMPTED
        n = len(known)
        all_n = np.bincount(slot, minlength=n)
        pre_n = np.bincount(slot[pre], minlength=n)
        all_ns = np.bincount(slot, weights=dur, minlength=n)
        pre_ns = np.bincount(slot[pre], weights=dur[pre], minlength=n)
        runq_ns = np.bincount(slot, weights=runq, minlength=n)
        for i in np.flatnonzero(all_n).tolist():
            o = self.offcpu.setdefault(known[i], OffCpu())
            o.preempted_ns += int(pre_ns[i])
            o.preempted += int(pre_n[i])
            o.blocked_ns += int(all_ns[i] - pre_ns[i])
            o.blocked += int(all_n[i] - pre_n[i])
            o.runq_ns += int(runq_ns[i])

    def set_health(self, *, events: int, drops_kernel: int, drops_user: int, stale_calls: int, db_bytes: int,
                   flush_s: float, now: float | None = None) -> None:
        """The tracer's own numbers after a flush (``flush_s``: how long it took)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            h = self.health
            self._stored.append((now, events - h.events))
            h.events, h.drops_kernel, h.drops_user, h.stale_calls, h.db_bytes = (
                events, drops_kernel, drops_user, stale_calls, db_bytes)
            b = np.zeros(NBUCKETS, dtype=np.int64)
            b[int(np.searchsorted(_BOUNDS_NS, np.uint64(max(flush_s, 0) * 1e9), side="left"))] = 1
            _add(h.flushes, 1, flush_s * 1e9, b)
            h.last_flush_s = time.time()

    # -- the scrape's side -------------------------------------------------------

    def snapshot(self, now: float | None = None) -> Snapshot:
        """A copy of every aggregate of a live process (exited ones are dropped first)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._drop_exited_locked()
            while self._stored and self._stored[0][0] < now - RATE_WINDOW_S:
                self._stored.popleft()
            h = self.health
            health = Health(h.events, h.drops_kernel, h.drops_user, h.stale_calls, h.db_bytes, h.flushes.copy(),
                            h.last_flush_s, sum(n for _, n in self._stored) / RATE_WINDOW_S)
            return Snapshot(
                cuda={k: v.copy() for k, v in self.cuda.items()},
                offcpu={k: OffCpu(**vars(v)) for k, v in self.offcpu.items()},
                faults=dict(self.faults),
                block_io={k: v.copy() for k, v in self.block_io.items()},
                names=dict(self.names),
                health=health,
            )

    def _pids(self) -> set[int]:
        return {p for p, _ in self.cuda} | set(self.offcpu) | set(self.faults)

    def _drop_exited_locked(self) -> None:
        pids = self._pids()
        gone = {p for p in pids if not self._alive(p)}
        self._known = np.array(sorted(pids - gone), dtype=np.int64)
        if not gone:
            return
        self.cuda = {k: v for k, v in self.cuda.items() if k[0] not in gone}
        for d in (self.offcpu, self.faults, self.names):
            for p in gone:
                d.pop(p, None)
