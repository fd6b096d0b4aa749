"""Hand-made traces for rule tests: they look like what the tracer stores.

``Trace`` writes a training loop step by step (launches, copies, syncs, the
off-CPU intervals around and inside them, page faults), DataLoader workers,
competing processes, block I/O and host metrics, into an in-memory Store
with the real schema.  The loop follows the same physics as the simulated
runtime: launches are async, the device works ``device_ms`` per step, a sync
waits for what is left of it, and everything the host does (preemption, data
waits, I/O, pageable copies) stretches the step.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ingero.events import ops
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.model import Report
from ingero.collect import budget
from ingero.events.ops import OP_NAMES
from ingero.store.db import Store

S = 1_000_000_000
MS = 1_000_000
US = 1_000
T0 = 1_763_800_000 * S
SESSION = 1

MAIN_PID = 4242
MAIN_TID = 4242

# The tracer's model of a thread's call state (contract v5), written out here
# independently of the store's SQL: events.in_call / events.queued of host rows.
HOST_ROW_OPS = {"sched_switch", "page_fault"}
NOT_CUDA_OPS = HOST_ROW_OPS | {"block_io", "proc_exec", "proc_exit", "bench", "none"}
# device work queued without waiting for it ...
ASYNC_WORK_OPS = {"cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync", "cuMemcpyAsync"}
# ... and the calls that wait until the device is done
SYNCING_OPS = {"cudaStreamSync", "cudaDeviceSync", "cudaEventSync", "cuCtxSynchronize", "cuStreamSynchronize",
               "cudaMemcpy", "cuMemcpy"}


def with_call_state(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with in_call / queued set as the tracer records them (contract v5).

    sched_switch and page_fault rows: in_call = the op of the outermost CUDA call
    of the same thread that had started and not returned at the row's timestamp;
    queued = NULL before the thread's first call, else TRUE when an asynchronous
    call returned 0 after the thread's last synchronising call returned.  Every
    other row: NULL.  Keys a row already has win (a test of odd data).
    """
    calls: dict[int, list[tuple[int, int, str]]] = {}
    flips: dict[int, list[tuple[int, bool]]] = {}
    for e in events:
        if e["op"] in NOT_CUDA_OPS:
            continue
        end = e["timestamp"] + e["duration_ns"]
        calls.setdefault(e["tid"], []).append((e["timestamp"], end, e["op"]))
        if e["op"] in SYNCING_OPS:
            flips.setdefault(e["tid"], []).append((end, False))
        elif e["op"] in ASYNC_WORK_OPS and not e.get("ret"):
            flips.setdefault(e["tid"], []).append((end, True))
    starts, reach = {}, {}
    for tid, v in calls.items():
        v.sort()
        starts[tid] = [c[0] for c in v]
        # reach[i]: the latest return among calls[:i + 1]; the first call whose return
        # is after ts is the outermost one still open at ts
        reach[tid], last = [], 0
        for c in v:
            last = max(last, c[1])
            reach[tid].append(last)
    for v in flips.values():
        v.sort()
    flip_ts = {tid: [f[0] for f in v] for tid, v in flips.items()}
    out = []
    for e in events:
        in_call = queued = None
        tid, ts = e["tid"], e["timestamp"]
        if e["op"] in HOST_ROW_OPS and tid in calls:
            n = bisect.bisect_right(starts[tid], ts)  # calls started at or before the row
            if n:
                j = bisect.bisect_right(reach[tid], ts)
                in_call = calls[tid][j][2] if j < n else None
                k = bisect.bisect_right(flip_ts.get(tid, []), ts)
                queued = flips[tid][k - 1][1] if k else False
        out.append({"in_call": in_call, "queued": queued, **e})
    return out


@dataclass
class Step:
    """What one training step does; every field in milliseconds unless named otherwise."""

    cpu_ms: float = 4.0  # Python work of the loop thread between steps (on CPU)
    device_ms: float = 30.0  # GPU work queued by the step's kernels
    launches: int = 40
    launch_us: float = 6.0
    launch_gap_us: float = 25.0  # Python between two launches
    syncs: int = 1
    small_d2h: int = 0  # scalar read-backs (.item()) per step, each before a sync
    copy_op: str | None = "cudaMemcpyAsync"
    copy_kind: str = "H2D"
    copy_bytes: int = 4 << 20
    copy_ms: float = 0.02  # host time of the copy call (pinned async: tiny)
    copy_preempt_ms: float = 0.0  # of copy_ms: runnable but off CPU inside the copy call
    wait_ms: float = 0.0  # sleeping outside CUDA calls (waiting for a batch)
    # where the wait is: False, before the step's copy and launches (a serial loop: nothing
    # queued, the device idles through it); True, after the launches, before the sync (an
    # overlapped loop: the device runs the queued kernels during the wait)
    overlap: bool = False
    preempt_ms: float = 0.0  # runnable but off CPU, outside CUDA calls
    preempt_by: int = 0
    preempt_slices: int = 4
    wake_runq_ms: float = 0.01  # run-queue wait after waking from the sync
    # how syncs wait (CUDA's policies): "block" sleeps (a switch-out of kind sleep inside
    # the sync); "spin" and "yield" stay on CPU, so the sync is only a long call
    policy: str = "block"
    # spin/yield under contention: runnable but off CPU inside each sync.  sync_preempt_ms
    # falls while the device is still busy (the sync spins on after it: no delay);
    # sync_late_ms ends right before the sync returns (the device finished during it:
    # the return is late by up to that much)
    sync_preempt_ms: float = 0.0
    sync_late_ms: float = 0.0
    io_ms: float = 0.0  # uninterruptible (D) outside CUDA calls
    faults: int = 0  # page faults per step


@dataclass
class Trace:
    ncpu: int = 2
    sched_autogroup: bool | None = False  # the traced host's kernel setting (sessions row)
    stale_calls: int = 0
    tracer_pid: int | None = None  # the ingero process that recorded it (sessions row)
    events: list[dict[str, Any]] = field(default_factory=list)
    pcpu: list[dict[str, Any]] = field(default_factory=list)
    sysm: list[dict[str, Any]] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    names: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)
    cgroups: list[dict[str, Any]] = field(default_factory=list)
    end_ns: int = T0

    # -- building blocks ---------------------------------------------------

    def ev(self, ts: int, op: str, pid: int, tid: int, dur: float = 0, **kw: Any) -> None:
        row = {"session_id": SESSION, "timestamp": int(ts), "duration_ns": int(dur), "pid": pid,
               "tid": tid, "op": op, "kind": None, "bytes": None, "preempted": None,
               "other_pid": None, "runq_ns": None, "cpu": 0, "ret": 0, "syscall": None, "fd_target": None}
        row.update(kw)
        self.events.append(row)
        self.end_ns = max(self.end_ns, int(ts + dur))

    def switch(self, ts: int, pid: int, tid: int, dur: float, kind: str, runq: float = 0,
               other: int = 0) -> None:
        self.ev(ts, "sched_switch", pid, tid, dur, kind=kind, preempted=(kind == "preempted"),
                other_pid=other, runq_ns=int(runq))

    def span(self, pid: int, tid: int, start: int, end: int, name: str, category: str = "nvtx") -> None:
        """A range (an NVTX push/pop as `ingero trace --cmd` records it, by default)."""
        self.spans.append({"session_id": SESSION, "pid": pid, "tid": tid, "start_ns": int(start),
                           "end_ns": int(end), "name": name, "category": category})

    def name(self, pid: int, name: str, comm: str, cmdline: str = "", ppid: int | None = None) -> "Trace":
        self.names.append({"pid": pid, "name": name, "comm": comm, "cmdline": cmdline, "ppid": ppid,
                           "session_id": SESSION, "first_seen_ns": T0, "last_seen_ns": T0})
        return self

    # -- the training loop ---------------------------------------------------

    def loop(self, start_s: float, end_s: float, step: Step | None = None, *, pid: int = MAIN_PID,
             tid: int = MAIN_TID, **overrides: Any) -> "Trace":
        """Steps of ``step`` (with overrides) from start_s to end_s; returns self."""
        st = Step(**{**(step.__dict__ if step else {}), **overrides})
        t = T0 + int(start_s * S)
        end = T0 + int(end_s * S)
        while t < end:
            t = self._step(t, st, pid, tid)
        return self

    def _step(self, t: int, st: Step, pid: int, tid: int) -> int:
        if st.wait_ms and not st.overlap:
            self.switch(t, pid, tid, st.wait_ms * MS, "sleep", runq=0.01 * MS)
            t += int(st.wait_ms * MS)
        if st.io_ms:
            self.switch(t, pid, tid, st.io_ms * MS, "io", runq=0.01 * MS)
            t += int(st.io_ms * MS)
        if st.copy_op:
            self.ev(t, st.copy_op, pid, tid, st.copy_ms * MS, kind=st.copy_kind, bytes=st.copy_bytes)
            if st.copy_preempt_ms:  # preempted inside the call: the CPU, not the bus
                self.switch(t + 20 * US, pid, tid, st.copy_preempt_ms * MS, "preempted",
                            runq=st.copy_preempt_ms * MS, other=st.preempt_by)
            elif st.copy_ms >= 1:  # a long synchronous copy sleeps while the DMA runs
                self.switch(t + 20 * US, pid, tid, (st.copy_ms - 0.05) * MS, "sleep", runq=0.01 * MS)
            t += int(st.copy_ms * MS)
        first_launch = t
        slice_every = max(1, st.launches // max(1, st.preempt_slices))
        for i in range(st.launches):
            self.ev(t, "cudaLaunchKernel", pid, tid, st.launch_us * US)
            t += int((st.launch_us + st.launch_gap_us) * US)
            if st.preempt_ms and i % slice_every == 0:
                d = st.preempt_ms / max(1, st.preempt_slices) * MS
                self.switch(t, pid, tid, d, "preempted", runq=d, other=st.preempt_by)
                t += int(d)
        if st.wait_ms and st.overlap:
            self.switch(t, pid, tid, st.wait_ms * MS, "sleep", runq=0.01 * MS)
            t += int(st.wait_ms * MS)
        for k in range(st.faults):
            self.ev(t + k * 200, "page_fault", pid, tid, 0)
        t += int(st.cpu_ms * MS)
        for k in range(st.syncs):
            if k < st.small_d2h:
                self.ev(t, "cudaMemcpyAsync", pid, tid, 8 * US, kind="D2H", bytes=4)
                t += 8 * US
            share = st.device_ms * MS / st.syncs
            left = max(0.0, first_launch + share * (k + 1) - t)
            if st.policy == "block":
                runq = st.wake_runq_ms * MS
                dur = left + runq + 15 * US
                self.ev(t, "cudaStreamSync", pid, tid, dur)
                if left > 50 * US:
                    self.switch(t + 5 * US, pid, tid, left + runq, "sleep", runq=runq)
                t += int(dur)
                continue
            # spinning / yielding: on CPU until the device is done, except where preempted
            late = st.sync_late_ms * MS
            dur = max(left, st.sync_preempt_ms * MS + 1 * MS if st.sync_preempt_ms else 0.0) + late + 5 * US
            self.ev(t, "cudaStreamSync", pid, tid, dur)
            if st.sync_preempt_ms:
                self.switch(t + 100 * US, pid, tid, st.sync_preempt_ms * MS, "preempted",
                            runq=st.sync_preempt_ms * MS, other=st.preempt_by)
            if late:
                self.switch(t + dur - late - 3 * US, pid, tid, late, "preempted", runq=late,
                            other=st.preempt_by)
            t += int(dur)
        return t

    # -- other processes -----------------------------------------------------

    def worker(self, pid: int, start_s: float, end_s: float, *, oncpu: float = 0.3,
               wait: float = 0.0, io: float = 0.0, comm: str = "pt_data_worker") -> "Trace":
        """A DataLoader worker: on-CPU share, CPU-wait share, D-state share per second."""
        for s in range(int(start_s), int(end_s)):
            ts = T0 + s * S
            self.pcpu.append(self._pcpu(pid, comm, ts + S, oncpu))
            if wait:
                for k in range(10):
                    self.switch(ts + k * S // 10, pid, pid, wait * S / 10, "preempted",
                                runq=wait * S / 10, other=9999)
            if io:
                self.switch(ts + S // 2, pid, pid, io * S, "io", runq=10 * US)
            sleep = max(0.0, 1 - oncpu - wait - io)
            if sleep > 0.01:
                self.switch(ts + S // 3, pid, pid, sleep * S, "sleep", runq=10 * US)
        return self

    def competitor(self, pid: int, comm: str, start_s: float, end_s: float, *, oncpu: float = 0.95,
                   took: int = 50) -> "Trace":
        for s in range(int(start_s), int(end_s)):
            self.pcpu.append(self._pcpu(pid, comm, T0 + (s + 1) * S, oncpu, took))
        return self

    @staticmethod
    def _pcpu(pid: int, comm: str, ts: int, oncpu: float, took: int = 0) -> dict[str, Any]:
        return {"session_id": SESSION, "timestamp": ts, "interval_ns": S, "pid": pid, "comm": comm,
                "oncpu_ns": int(oncpu * S), "involuntary": int(took * 2), "voluntary": 10,
                "preempted_traced": took}

    def block_io(self, pid: int, start_s: float, end_s: float, *, per_s: int = 50,
                 bytes_: int = 1 << 20, lat_ms: float = 40.0, kind: str = "write") -> "Trace":
        t = T0 + int(start_s * S)
        step = S // per_s
        while t < T0 + int(end_s * S):
            self.ev(t, "block_io", pid, pid, lat_ms * MS, kind=kind, bytes=bytes_, other_pid=259)
            t += step
        return self

    def rss(self, pid: int, comm: str, start_s: float, end_s: float, start_bytes: float,
            end_bytes: float) -> "Trace":
        """process_memory samples once a second, RSS growing linearly from start to end."""
        n = max(1, int(end_s) - int(start_s))
        for k, s in enumerate(range(int(start_s), int(end_s))):
            rss = start_bytes + (end_bytes - start_bytes) * k / max(1, n - 1)
            self.memory.append({"session_id": SESSION, "timestamp": T0 + s * S, "pid": pid, "comm": comm,
                                "rss_bytes": int(rss), "swap_bytes": 0})
        return self

    def cgroup(self, pid: int, start_s: float, end_s: float, *, path: str = "/job", quota_us: int | None = 20_000,
               period_us: int = 100_000, throttled_share: float = 0.0, usage_share: float | None = 0.2,
               version: int = 1, own: bool = True, mount: str = "/sys/fs/cgroup/cpu", phase_s: float = 0.3,
               container_id: str | None = None, pod_uid: str | None = None) -> "Trace":
        """cgroup_cpu readings of ``pid``'s cgroup once a second from start_s to end_s, ``phase_s``
        past each whole second (as the sampler reads, off the windows' edges): per second
        ``throttled_share`` of it throttled, in every period when above 0, and ``usage_share`` of
        a CPU used (None: not readable, v1 without cpuacct).  The first reading has no interval."""
        totals = {"nr_periods": 0, "nr_throttled": 0, "throttled_total_ns": 0, "usage_total_ns": 0}
        per_s = S // (period_us * 1_000)  # periods a second
        prev = None
        for s_ in range(int(start_s), int(end_s) + 1):
            ts = T0 + s_ * S + int(phase_s * S)
            row = {"session_id": SESSION, "timestamp": ts, "pid": pid, "cgroup": path, "own": own,
                   "cgroup_version": version, "mount": mount, "container_id": container_id, "pod_uid": pod_uid,
                   "quota_us": quota_us, "period_us": period_us, "interval_ns": None, "periods_n": None,
                   "throttled_n": None, "throttled_ns": None, "usage_ns": None}
            if prev is not None:
                inc = {"nr_periods": per_s, "nr_throttled": per_s if throttled_share > 0 else 0,
                       "throttled_total_ns": int(throttled_share * S),
                       "usage_total_ns": int((usage_share or 0.0) * S)}
                for k, v in inc.items():
                    totals[k] += v
                row.update(interval_ns=ts - prev, periods_n=inc["nr_periods"], throttled_n=inc["nr_throttled"],
                           throttled_ns=inc["throttled_total_ns"],
                           usage_ns=inc["usage_total_ns"] if usage_share is not None else None)
            row.update(totals)
            if usage_share is None:
                row["usage_total_ns"] = None
            self.cgroups.append(row)
            prev = ts
        return self

    def system(self, start_s: float, end_s: float, **fields: Any) -> "Trace":
        for s in range(int(start_s), int(end_s)):
            row = {"session_id": SESSION, "timestamp": T0 + (s + 1) * S, "cpu_pct": 45.0,
                   "iowait_pct": 0.5, "mem_pct": 40.0, "swap_used_bytes": 0, "swap_in_bytes": 0,
                   "swap_out_bytes": 0, "major_faults": 0, "load1": 1.2, "ncpu": self.ncpu}
            row.update(fields)
            self.sysm = [r for r in self.sysm if r["timestamp"] != row["timestamp"]] + [row]
        return self

    # -- output --------------------------------------------------------------

    def store(self, path: Any = None, *, drops: int = 0) -> Store:
        """The trace in a Store: in memory, or written to ``path`` (then closed and reopenable)."""
        store = Store.memory() if path is None else Store.open(path)
        end = max(self.end_ns, T0 + S)
        store.con.execute(
            """INSERT INTO sessions (session_id, started_ns, ended_ns, status, events,
                   drops_kernel, drops_user, ncpu, sched_autogroup, stale_calls, tracer_pid)
               VALUES ($sid, $t0, $end, 'closed', $n, $d, 0, $ncpu, $ag, $stale, $tracer)""",
            {"sid": SESSION, "t0": T0, "end": end, "n": len(self.events), "d": drops, "ncpu": self.ncpu,
             "ag": self.sched_autogroup, "stale": self.stale_calls, "tracer": self.tracer_pid},
        )
        for table, rows in (("events", with_call_state(self.events)), ("process_cpu", self.pcpu),
                            ("system_metrics", self.sysm), ("gpu_metrics", self.gpu),
                            ("process_names", self.names), ("process_memory", self.memory),
                            ("spans", self.spans), ("cgroup_cpu", self.cgroups)):
            if rows:
                store.append(table, pa.Table.from_pylist(rows))
        return store

    def explain(self, *, drops: int = 0, **opts: Any) -> Report:
        store = self.store(drops=drops)
        return explain(store.con, Options(**opts))


def healthy(seconds: float = 30, **step: Any) -> Trace:
    """A GPU-bound run: pinned async copies, one sync per step, workers keep up."""
    tr = Trace()
    tr.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py --epochs 3")
    for k in range(2):
        tr.name(5000 + k, "python3 (train.py)", "pt_data_worker", "python3 train.py --epochs 3")
        tr.worker(5000 + k, 0, seconds, oncpu=0.3)
    tr.loop(0, seconds, **step)
    tr.system(0, seconds)
    return tr


def named_loop(seconds: float, script: str = "train.py") -> Trace:
    """A trace of one named Python process (MAIN_PID running ``script``) and the host's samples over
    ``seconds``: the start of most rule tests, which then add the loop's shape."""
    return Trace().name(MAIN_PID, f"python3 ({script})", "python3", f"python3 {script}").system(0, seconds)


def chains_of(report: Report, rule_id: str) -> list:
    return [c for c in report.chains if c.rule_id == rule_id]


def silent(report: Report, *rule_ids: str) -> bool:
    """No chain of ``rule_ids`` (of any rule when none is named) in a report that analysed the loop.

    "The rule stays silent" would also pass if explain had read nothing: this fails then.
    """
    a = report.analysed
    assert a.windows > 0 and a.events > 0 and a.cuda_events > 0, f"nothing was analysed: {a}"
    found = [c.rule_id for c in report.chains if not rule_ids or c.rule_id in rule_ids]
    assert found == [], found
    return True


def sample_store(store: Store, ratio: float, period_ns: int = S, phase_ns: int = 0) -> tuple[int, int]:
    """Apply the tracer's duty cycle to a stored trace: keep the launch rows of the first ``ratio`` of
    every period, drop the rest, and write the sampling rows; (launch rows before, after)."""
    con = store.con
    sid, t0, t1 = con.execute(
        "SELECT session_id, min(timestamp), max(timestamp) + 1 FROM events GROUP BY ALL").fetchone()
    ops = sorted(budget.SWITCHED_NAMES.split(","))
    before = con.execute("SELECT count(*) FROM events WHERE list_contains($ops, op)", {"ops": ops}).fetchone()[0]
    start = t0 - phase_ns
    keep = int(ratio * period_ns)
    con.execute("DELETE FROM events WHERE list_contains($ops, op) AND (timestamp - $s) % $p >= $k",
                {"ops": ops, "s": start, "p": period_ns, "k": keep})
    rows = []
    p = start
    while p < t1:
        # no call cost: the replay's calls were not slowed by probes in their slices
        rows.append((sid, p, p + period_ns, p, p + keep, p + keep, keep / period_ns, budget.SWITCHED_NAMES, None))
        p += period_ns
    con.executemany("INSERT INTO sampling VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    after = con.execute("SELECT count(*) FROM events WHERE list_contains($ops, op)", {"ops": ops}).fetchone()[0]
    return before, after


def count_switches(store: Store) -> int:
    """Apply the budget's first loss to a stored trace: the sched_switch rows of threads that made no
    CUDA call become switch_counts rows, one per thread, second and kind (collect/budget.py); returns
    how many rows were counted."""
    con = store.con
    cuda = sorted(OP_NAMES[o] for o in ops.CUDA_OPS | ops.NCCL_OPS)
    nc = ("op = 'sched_switch' AND tid NOT IN (SELECT DISTINCT tid FROM events "
          "WHERE list_contains($cuda, op::VARCHAR))")
    # seconds from the trace's first event, as explain's windows are; the last ends with the trace
    t0, t1 = con.execute("SELECT min(timestamp), max(timestamp) + 1 FROM events").fetchone()
    con.execute(f"""
        INSERT INTO switch_counts
        SELECT session_id, least($t1, $t0 + ((timestamp - $t0) // {S} + 1) * {S}) AS end_ns,
               end_ns - ($t0 + ((timestamp - $t0) // {S}) * {S}), pid, tid, kind::VARCHAR, count(*), sum(duration_ns),
               coalesce(sum(runq_ns), 0)
        FROM events WHERE {nc} GROUP BY ALL""", {"cuda": cuda, "t0": t0, "t1": t1})
    n = con.execute(f"SELECT count(*) FROM events WHERE {nc}", {"cuda": cuda}).fetchone()[0]
    con.execute(f"DELETE FROM events WHERE {nc}", {"cuda": cuda})
    return n
