"""Who made the loop wait: each blocked second of a loop thread followed to its root (issue 37).

A loop thread off CPU outside CUDA calls either waits for a CPU (preempted:
ing_preempt names who ran instead) or is blocked.  A blocked interval's row
says what it blocked in (events.syscall, fd_target, kind) and who woke it
(waker_pid, waker_tid: sched_waking runs in the waker's context).  The root
is found by following the waker: what was that thread doing while the loop
waited -- on CPU (it is the root: a worker computing a batch, a thread
holding the GIL or a lock), itself preempted (the process that ran instead:
hogs starving the workers), itself blocked (follow its own waker, up to
MAX_HOPS) -- until a root the trace shows without guessing: a thread on
CPU, a process taking the CPU, the disk, the network, a sleep or timer.

Output: the TEMP table ``ing_block`` (one row per loop thread, window and
root), which the rules read through ``by_root``.  ``follow`` is the
mechanism on plain tuples, so unit tests feed it hand-made wake-up chains.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field, replace

import pyarrow as pa

from ingero.analyze.context import Context
from ingero.analyze.procs import has_column, same_job
from ingero.store.selection import Selection

# Blocked intervals shorter than this are not followed (a futex hand-off of a
# few µs says nothing about the loop's time; they are summed as 'short').
MIN_FOLLOW_NS = 20_000
MAX_HOPS = 4  # the loop, its waker, the waker's waker, ...: real chains seen here are 2-3 long
# A timed futex wait that ran out is a lock holder's when another thread of the
# process ran at least this share of it (else it is the timer's).
ON_CPU_ROOT_SHARE = 0.5

FLUSH_CALLS = frozenset({"fsync", "fdatasync", "sync_file_range", "msync", "sync", "syncfs"})
SLEEP_CALLS = frozenset({"nanosleep", "clock_nanosleep", "pause"})
SOCKET_CALLS = frozenset({"recvfrom", "recvmsg", "recvmmsg", "accept", "accept4", "connect"})
# The loop blocked writing: what it waits for is the consumer of its output (a pipe's reader, a
# socket's peer), never its input.
WRITE_CALLS = frozenset({"write", "writev", "pwrite64", "pwritev", "pwritev2", "sendto", "sendmsg", "sendmmsg",
                         "splice", "sendfile"})

# Roots: what the trace can show without guessing.
ON_CPU = "on-cpu"          # a thread running (root_pid/root_tid): a worker computing, a lock or GIL holder
CPU = "cpu"                # a process that took the CPU from a thread in the chain (root_pid)
DISK = "disk"              # block I/O: a flush (fsync ...), a read of a file, D-state
NETWORK = "network"        # a socket woken from an interrupt: a request, a peer's data
SLEEP = "sleep"            # the thread slept on purpose (nanosleep)
TIMER = "timer"            # a timed wait that ran out (a poll, a futex with a timeout)
FAULT = "fault"            # blocked outside a system call: a major page fault
UNKNOWN = "unknown"        # no waker seen, or the chain ran past MAX_HOPS / into a cycle


@dataclass(frozen=True)
class Interval:
    """One off-CPU interval of a thread (a sched_switch row)."""

    start: int
    end: int
    preempted: bool
    other_pid: int  # preempted: who ran instead; blocked: who it waited behind once woken (0: not known)
    kind: str  # preempted / sleep / io / other
    syscall: str | None
    fd_target: str | None
    waker_pid: int | None
    waker_tid: int | None
    runq: int = 0  # of a blocked interval: its last part, woken and waiting for a CPU (behind other_pid)

    @property
    def woken_at(self) -> int:
        """Where a blocked interval's wait ended and its wait for a CPU began."""
        return self.end - min(self.runq, self.end - self.start)


@dataclass(frozen=True)
class Root:
    root: str
    pid: int = 0
    tid: int = 0
    detail: str = ""  # 'fsync /ckpt/step_500.pt', 'futex', 'read pipe:[123]'


@dataclass
class Threads:
    """Every traced thread's off-CPU intervals (sorted), and the names of kernel threads."""

    by_tid: dict[int, list[Interval]] = field(default_factory=dict)
    pid_of: dict[int, int] = field(default_factory=dict)
    kernel_pids: frozenset[int] = frozenset()
    _starts: dict[int, list[int]] = field(default_factory=dict)

    def add(self, pid: int, tid: int, iv: Interval) -> None:
        self.by_tid.setdefault(tid, []).append(iv)
        self.pid_of[tid] = pid

    def seal(self) -> None:
        for tid, ivs in self.by_tid.items():
            ivs.sort(key=lambda i: i.start)
            self._starts[tid] = [i.start for i in ivs]

    def overlapping(self, tid: int, start: int, end: int) -> list[Interval]:
        ivs = self.by_tid.get(tid)
        if not ivs:
            return []
        i = bisect.bisect_right(self._starts[tid], start) - 1
        out = []
        for iv in ivs[max(i, 0):]:
            if iv.start >= end:
                break
            if iv.end > start:
                out.append(iv)
        return out

    def on_cpu_ns(self, tid: int, start: int, end: int, running_at_end: bool = False) -> int:
        """Time in [start, end) the thread was seen on CPU: between the end of one of its off-CPU
        intervals and the start of its next (before its first row and after its last nothing is
        known); ``running_at_end``: it ran at ``end`` (it is the waker), so its last gap is open."""
        ivs = self.by_tid.get(tid)
        if not ivs:
            return 0
        starts = self._starts[tid]
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        total = 0
        for k in range(i, len(ivs)):
            gap_start = ivs[k].end
            if gap_start >= end:
                break
            nxt = ivs[k + 1].start if k + 1 < len(ivs) else (end if running_at_end else None)
            if nxt is None:
                break
            total += max(0, min(nxt, end) - max(gap_start, start))
        return total

    def tids_of(self, pid: int) -> list[int]:
        return [t for t, p in self.pid_of.items() if p == pid]


def fd_kind(target: str | None) -> str:
    """'socket', 'pipe', 'file', 'anon' (eventfd, epoll ...) or '' of an fd_target."""
    if not target:
        return ""
    if target.startswith("/"):
        return "file"
    head = target.split(":", 1)[0]
    return {"socket": "socket", "pipe": "pipe", "anon_inode": "anon"}.get(head, "other")


def _own_root(iv: Interval, tid: int, threads: Threads) -> Root | None:
    """The root an interval shows by itself, without following its waker (None: follow it)."""
    call = iv.syscall
    target = iv.fd_target or ""
    if call in FLUSH_CALLS:
        return Root(DISK, detail=f"{call} {target}".strip())
    if call in SLEEP_CALLS:
        return Root(SLEEP, detail=call)
    if iv.kind == "io":
        return Root(DISK, detail=f"{call} {target}".strip()) if call else Root(FAULT)
    if iv.waker_pid is None:
        return Root(UNKNOWN, detail=call or "")
    if iv.waker_pid == 0 or iv.waker_pid in threads.kernel_pids:  # an interrupt, or a kernel thread
        if call in SOCKET_CALLS or target.startswith("socket:"):
            return Root(NETWORK, detail=f"{call} {target}".strip())
        if target.startswith("/"):
            return Root(DISK, detail=f"{call} {target}".strip())
        return Root(TIMER, detail=call or "")
    if iv.waker_tid == tid:
        return Root(UNKNOWN, detail=call or "")
    return None


def _holder(iv: Interval, tid: int, threads: Threads) -> Root | None:
    """A timed futex wait that ran out while another thread of the process ran: that thread held
    the lock (a Python thread waits for the GIL 5 ms at a time, then asks the holder to drop it)."""
    pid = threads.pid_of.get(tid)
    span = iv.end - iv.start
    best, best_ns = 0, 0
    for other in threads.tids_of(pid) if pid is not None else []:
        if other == tid:
            continue
        ns = threads.on_cpu_ns(other, iv.start, iv.end)
        if ns > best_ns:
            best, best_ns = other, ns
    if best and best_ns >= ON_CPU_ROOT_SHARE * span:
        return Root(ON_CPU, pid, best, "futex (timed out)")
    return None


def follow(iv: Interval, tid: int, threads: Threads, depth: int = 0,
           seen: frozenset[int] = frozenset()) -> dict[Root, float]:
    """The roots of a blocked interval of thread ``tid``, as shares summing to 1."""
    own = _own_root(iv, tid, threads)
    if own is not None:
        if own.root == TIMER and iv.syscall == "futex":
            return {_holder(iv, tid, threads) or own: 1.0}
        return {own: 1.0}
    waker = int(iv.waker_tid or 0)
    waker_pid = int(iv.waker_pid or 0)
    how = f"{iv.syscall} {iv.fd_target or ''}".strip() if iv.syscall else ""
    if depth >= MAX_HOPS or waker in seen:
        return {Root(UNKNOWN, waker_pid, waker, how): 1.0}
    if waker not in threads.by_tid:  # untraced (a client, a hog, an exited thread): it is the root
        return {Root(ON_CPU, waker_pid, waker, how): 1.0}
    span = iv.end - iv.start

    def inside(a: int, b: int) -> float:
        return max(0, min(b, iv.end) - max(a, iv.start)) / span

    out: dict[Root, float] = defaultdict(float)
    who = f"{threads.pid_of.get(waker, waker_pid)}:{waker}"
    for w in threads.overlapping(waker, iv.start, iv.end):
        if w.preempted:
            out[Root(CPU, w.other_pid, 0, f"preempted {who}")] += inside(w.start, w.end)
            continue
        woken = w.woken_at
        if woken < w.end:  # woken, then runnable: whoever held its CPU kept it from us
            out[Root(CPU, w.other_pid, 0, f"woken, waiting for a CPU {who}")] += inside(woken, w.end)
        part = inside(w.start, woken)
        if part > 0:  # what kept the waker waiting during the part of its wait inside ours
            clipped = replace(w, start=max(w.start, iv.start), end=woken, runq=0)
            for root, share in follow(clipped, waker, threads, depth + 1, seen | {tid}).items():
                out[root] += part * share
    on_cpu = threads.on_cpu_ns(waker, iv.start, iv.end, running_at_end=True) / span
    rest = max(0.0, 1.0 - on_cpu - sum(out.values()))  # before the waker's first row: not known
    if on_cpu > 0:
        out[Root(ON_CPU, waker_pid, waker, how)] += on_cpu
    if rest > 1e-9:
        out[Root(UNKNOWN, waker_pid, waker, how)] += rest
    return dict(out)


# The loop threads' blocked intervals outside CUDA calls, and every traced thread's off-CPU
# intervals in the range (the wakers' side), from the raw rows: only switches are read.
_LOOP_SQL = f"""
SELECT e.pid, e.tid, e.timestamp, e.duration_ns, e.kind::VARCHAR, e.syscall, e.fd_target, e.waker_pid, e.waker_tid
FROM events e JOIN ing_loop l ON e.pid = l.pid AND e.tid = l.tid
WHERE {Selection.where("e", pids=False)} AND e.op = 'sched_switch'
  AND NOT e.preempted AND e.in_call IS NULL
ORDER BY e.tid, e.timestamp
"""
_THREADS_SQL = """
SELECT pid, tid, timestamp, duration_ns, preempted, coalesce(other_pid, 0), kind::VARCHAR, syscall, fd_target,
       waker_pid, waker_tid, CASE WHEN NOT preempted THEN coalesce(runq_ns, 0) ELSE 0 END
FROM events
WHERE session_id = $sid AND timestamp >= $t0 - $margin AND timestamp < $t1 AND op = 'sched_switch'
  AND list_contains($tids, tid)
"""
_SIBLINGS_SQL = f"""
SELECT DISTINCT e.tid FROM events e JOIN ing_loop l ON e.pid = l.pid
WHERE {Selection.where("e", pids=False)} AND e.op = 'sched_switch'
"""
_KERNEL_SQL = """
SELECT DISTINCT pid FROM process_cpu
WHERE session_id = $sid AND (comm LIKE 'kworker%' OR comm LIKE 'ksoftirqd%' OR comm LIKE 'irq/%' OR comm LIKE 'jbd2%'
                             OR comm LIKE 'kswapd%' OR comm LIKE 'rcu_%')
"""
BLOCK_SCHEMA = pa.schema([
    ("pid", pa.int32()), ("tid", pa.int32()), ("w", pa.int64()), ("root", pa.string()),
    ("root_pid", pa.int32()), ("root_tid", pa.int32()), ("detail", pa.string()),
    ("via_call", pa.string()), ("via_pid", pa.int32()), ("via_fd", pa.string()), ("ns", pa.float64()),
    ("n", pa.float64()),
])


def build(ctx: Context) -> None:
    """Create ing_block: pid, tid, w, root, root_pid, root_tid, detail, via_call (what the loop
    blocked in), via_pid (the process whose thread woke it, 0 for an interrupt, -1 when no
    wake-up was seen: a trace without waker columns, a synthetic replay), via_fd (the kind of
    fd it waited on: socket, pipe, file, anon, '' for none), ns (its blocked
    time in w attributed to that root), n (intervals, fractional)."""
    con = ctx.con
    rows: list[tuple] = []
    if has_column(con, "events", "waker_tid"):
        rows = _attribute(ctx)
    con.register("_ing_block", pa.Table.from_pylist(
        [dict(zip(BLOCK_SCHEMA.names, r)) for r in rows], schema=BLOCK_SCHEMA))
    con.execute("CREATE OR REPLACE TEMP TABLE ing_block AS SELECT * FROM _ing_block")
    con.unregister("_ing_block")


def _attribute(ctx: Context) -> list[tuple]:
    con = ctx.con
    p = {"sid": ctx.session_id, "t0": ctx.start_ns, "t1": ctx.end_ns}
    loops = con.execute(_LOOP_SQL, p).fetchall()
    if not loops:
        return []
    threads = Threads(kernel_pids=frozenset(int(r[0]) for r in con.execute(_KERNEL_SQL, {"sid": ctx.session_id})
                                            .fetchall()))
    # a blocked interval's other_pid names who held its CPU after its wake-up only from schema 17
    holder_known = has_column(con, "sessions", "switch_holder") and bool(con.execute(
        "SELECT coalesce(bool_and(switch_holder), false) FROM sessions WHERE session_id = $sid",
        {"sid": ctx.session_id}).fetchone()[0])
    # the wakers' intervals, hop by hop: only threads a chain can reach are read
    fetched = {int(r[1]) for r in loops}
    siblings = {int(t) for (t,) in con.execute(_SIBLINGS_SQL, p).fetchall()}
    wanted = ({int(r[8]) for r in loops if r[8]} | siblings) - fetched
    for _ in range(MAX_HOPS):
        if not wanted:
            break
        fetched |= wanted
        more = set()
        for pid, tid, ts, dur, pre, other, kind, call, target, wp, wt, runq in con.execute(
                _THREADS_SQL, {**p, "margin": 10 * ctx.window_ns, "tids": sorted(wanted)}).fetchall():
            other = int(other) if pre or holder_known else 0
            threads.add(int(pid), int(tid), Interval(int(ts), int(ts) + int(dur or 0), bool(pre), other,
                                                     kind or "", call, target, wp, wt, int(runq)))
            if wt and not pre:
                more.add(int(wt))
        wanted = more - fetched
    loop_ivs = []
    for pid, tid, ts, dur, kind, call, target, wp, wt in loops:
        iv = Interval(int(ts), int(ts) + int(dur or 0), False, 0, kind or "", call, target, wp, wt)
        threads.add(int(pid), int(tid), iv)
        loop_ivs.append((int(pid), int(tid), iv))
    threads.seal()
    acc: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
    wns, t0 = ctx.window_ns, ctx.start_ns
    for pid, tid, iv in loop_ivs:
        span = iv.end - iv.start
        if span <= 0:
            continue
        via = iv.syscall or ("fault" if iv.kind == "io" else "")
        via_pid = -1 if iv.waker_pid is None else int(iv.waker_pid)  # -1: no wake-up seen (an older trace)
        via_fd = fd_kind(iv.fd_target)
        roots = follow(iv, tid, threads) if span >= MIN_FOLLOW_NS else {Root("short", detail=via): 1.0}
        # split at window boundaries, as the window tables split off-CPU time
        pieces = []
        s = iv.start
        while s < iv.end:
            w = (s - t0) // wns
            e = min(iv.end, t0 + (w + 1) * wns)
            pieces.append((w, e - s))
            s = e
        for w, ns in pieces:
            for root, share in roots.items():
                a = acc[(pid, tid, w, root.root, root.pid, root.tid, root.detail, via, via_pid, via_fd)]
                a[0] += ns * share
                a[1] += share * ns / span
    return [(*k, v[0], v[1]) for k, v in acc.items()]


@dataclass(frozen=True)
class RootTime:
    root: str
    pid: int
    tid: int
    detail: str
    via_call: str
    ns: float
    n: float


BY_ROOT_SQL = """
SELECT root, root_pid, root_tid, any_value(detail ORDER BY ns DESC), via_call, sum(ns), sum(n)
FROM ing_block WHERE pid = $pid AND list_contains($ws, w)
GROUP BY root, root_pid, root_tid, via_call ORDER BY sum(ns) DESC
"""


def by_root(con, pid: int, ws: list[int]) -> list[RootTime]:
    """The loop's blocked time in windows ``ws``, by root and the call it blocked in, largest first."""
    return [RootTime(r, int(rp), int(rt), d or "", v or "", float(ns), float(n))
            for r, rp, rt, d, v, ns, n in con.execute(BY_ROOT_SQL, {"pid": pid, "ws": ws}).fetchall()]


PER_WINDOW_SQL = """
SELECT w, sum(ns) FROM ing_block
WHERE pid = $pid AND root = $root AND ($any_pid OR root_pid = $root_pid) AND ($any_tid OR root_tid <> $not_tid)
  AND ($any_call OR via_call = $call)
GROUP BY w
"""


def per_window(con, pid: int, root: str, *, root_pid: int | None = None, not_tid: int | None = None,
               call: str | None = None) -> dict[int, float]:
    """ns per window of the loop's blocked time with ``root`` (narrowed by its pid, by a tid it is
    not, by the call the loop blocked in)."""
    rows = con.execute(PER_WINDOW_SQL, {
        "pid": pid, "root": root, "any_pid": root_pid is None, "root_pid": root_pid or 0,
        "any_tid": not_tid is None, "not_tid": not_tid or 0, "any_call": call is None, "call": call or "",
    }).fetchall()
    return {int(w): float(ns) for w, ns in rows}


def lock_wait_by_window(con, pid: int, tid: int) -> dict[int, float]:
    """ns per window the loop thread ``tid`` waited for a lock (the GIL) a sibling thread held:
    its blocked time whose root is another thread of its process on CPU (lock-contention's
    cause, the step's lock wait)."""
    return per_window(con, pid, ON_CPU, root_pid=pid, not_tid=tid)


# The loop's blocked time per window, and the part of it fed by another process: woken by a
# thread of another traced or untraced process (a DataLoader worker through its queue's pipe)
# over anything but a socket (requests are no input pipeline), whatever that worker's own
# root (computing, starved of CPU by a hog, or sleeping itself: a fetch's latency, as the
# dataloader-starvation demo's worker sleeps 4.5 ms a batch); a disk, network or fault root, or a
# sleep further down the chain, is another rule's (io-stall ...).  A wait whose wake-up was not
# seen (via_pid -1) counts as it did before wake-ups were traced.
INPUT_SQL = """
SELECT w, sum(ns),
       coalesce(sum(ns) FILTER (via_pid NOT IN (0, pid) AND (root NOT IN ('disk', 'sleep', 'network', 'timer', 'fault')
                                                      OR (root IN ('sleep', 'timer') AND root_pid IN (0, via_pid)))
                                AND NOT list_contains($socket_calls, via_call) AND via_fd <> 'socket'
                                AND NOT list_contains($write_calls, via_call)), 0)
FROM ing_block WHERE pid = $pid GROUP BY w
"""


def input_fraction(con, pid: int) -> dict[int, float]:
    """Per window with attributed blocked time: the share of it that waited on another process."""
    rows = con.execute(INPUT_SQL, {"pid": pid, "socket_calls": sorted(SOCKET_CALLS),
                                   "write_calls": sorted(WRITE_CALLS)}).fetchall()
    return {int(w): float(inp) / float(tot) for w, tot, inp in rows if tot}


# The loop's own sleeps: it blocked in a sleep call (time.sleep, a rate limit, a polling loop)
# and the timer woke it (via_pid 0) -- nobody else made it wait.
OWN_SLEEP_SQL = """
SELECT w, sum(ns), coalesce(sum(ns) FILTER (root = 'sleep' AND list_contains($sleep_calls, via_call)
                                          AND via_pid IN (0, pid)), 0)
FROM ing_block WHERE pid = $pid GROUP BY w
"""

# The loop blocked writing into a pipe or a socket (its log piped into a slow reader, a peer that
# reads slowly): woken by the consumer that made room; a write to a file waits on the disk (io-stall's).
OUTPUT_SQL = """
SELECT w, sum(ns), coalesce(sum(ns) FILTER (list_contains($write_calls, via_call) AND via_fd IN ('pipe', 'socket')
                                          AND root NOT IN ('disk', 'fault')), 0)
FROM ing_block WHERE pid = $pid GROUP BY w
"""


def _own_sleep(con, pid: int) -> list[tuple]:
    return con.execute(OWN_SLEEP_SQL, {"pid": pid, "sleep_calls": sorted(SLEEP_CALLS)}).fetchall()


def _output(con, pid: int) -> list[tuple]:
    return con.execute(OUTPUT_SQL, {"pid": pid, "write_calls": sorted(WRITE_CALLS)}).fetchall()


def own_sleep_fraction(con, pid: int) -> dict[int, float]:
    """Per window with attributed blocked time: the share of it the loop slept on its own timer."""
    return {int(w): float(x) / float(tot) for w, tot, x in _own_sleep(con, pid) if tot}


def output_fraction(con, pid: int) -> dict[int, float]:
    """Per window with attributed blocked time: the share of it the loop waited to write its output."""
    return {int(w): float(x) / float(tot) for w, tot, x in _output(con, pid) if tot}


def own_sleep_by_window(con, pid: int) -> dict[int, float]:
    """ns per window the loop slept on its own timer (the step's sleep)."""
    return {int(w): float(x) for w, _, x in _own_sleep(con, pid) if x}


def output_wait_by_window(con, pid: int) -> dict[int, float]:
    """ns per window the loop was blocked writing into a pipe or socket (the step's output wait)."""
    return {int(w): float(x) for w, _, x in _output(con, pid) if x}


CONSUMERS_SQL = """
SELECT via_pid, any_value(detail ORDER BY ns DESC), sum(ns), sum(n), any_value(root ORDER BY ns DESC)
FROM ing_block
WHERE pid = $pid AND list_contains($ws, w) AND list_contains($write_calls, via_call) AND via_fd IN ('pipe', 'socket')
  AND root NOT IN ('disk', 'fault')
GROUP BY via_pid ORDER BY sum(ns) DESC
"""


def consumers(con, pid: int, ws: list[int]) -> list[tuple[int, str, float, float, str]]:
    """(pid that made room, the write it blocked in, ns, waits, what that consumer was doing) of the
    loop's blocked writes in windows ``ws``, largest first (pid 0: an interrupt, a remote peer)."""
    return [(int(p), d or "", float(ns), float(n), r or "") for p, d, ns, n, r in
            con.execute(CONSUMERS_SQL, {"pid": pid, "ws": ws, "write_calls": sorted(WRITE_CALLS)}).fetchall()]


STARVERS_SQL = """
SELECT root_pid, sum(ns), any_value(via_pid ORDER BY ns DESC) FROM ing_block
WHERE pid = $pid AND list_contains($ws, w) AND root = 'cpu' AND via_pid NOT IN (-1, 0, pid) AND root_pid NOT IN (0, pid)
GROUP BY root_pid ORDER BY sum(ns) DESC
"""


def starvers(con, pid: int, ws: list[int]) -> list[tuple[int, float, int]]:
    """(pid, ns, worker pid): processes outside the job that took the CPU from the workers the
    loop waited on (its workers preempting each other share the job's cores: no culprit)."""
    rows = con.execute(STARVERS_SQL, {"pid": pid, "ws": ws}).fetchall()
    return [(int(p), float(ns), int(v)) for p, ns, v in rows if not same_job(con, pid, int(p))]
