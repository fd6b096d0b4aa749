"""Synthetic replay: a scenario's events generated with numpy, when eBPF is not available.

Same tables and columns a live trace writes (events, process_names,
process_cpu, system_metrics, a closed session), generated step by step
with the physics the live run has: launches cost host time, kernels queue
on a device timeline, a sync returns when the device drains (plus the
thread's wake-up delay), pageable copies are synchronous and slow, a
starved loop sleeps on its queue, a preempted loop waits runnable while a
hog runs, faults and block I/O take time on the thread that suffers them.

As in the live demo, the cause starts after a clean baseline share of the
run (``BASELINE_SHARE``), so rules compare windows of the same session.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ingero.demo.scenarios import BASELINE_SHARE, Physics, Scenario
from ingero.store.db import Store
from ingero.store.derive import fill_call_state

NS = 1_000_000_000
US = 1_000
# Fake PIDs of the replay (clearly not live processes of this host).
LOOP_PID = 424_242
WORKER_PID0 = 424_250
HOG_PID0 = 424_300
# A blocked thread wakes ~30 us after its event on an idle host (measured
# wake-up latency of clock_nanosleep here: 20-60 us).
WAKE_NS = 30 * US
# cudaMemcpyAsync from pinned memory returns after ~10 us (queues the DMA).
ASYNC_COPY_CALL_NS = 10 * US
# A preempting hog keeps the CPU for about one scheduler slice (~3 ms with
# EEVDF's default base slice on a 2-CPU box).
PREEMPT_SLICE_NS = 3_000 * US
# Samplers write one row a second.
SAMPLE_NS = NS


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

    @classmethod
    def empty(cls) -> "Columns":
        return cls(*([] for _ in range(12)))

    def add(self, ts: int, dur: int, op: str, *, pid: int = LOOP_PID, tid: int | None = None,
            kind: str | None = None, nbytes: int | None = None, preempted: bool | None = None,
            other_pid: int | None = None, runq_ns: int | None = None, cpu: int = 0) -> None:
        is_cuda = op.startswith("cuda")
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
        })


@dataclass
class Replay:
    """What a replay produced: the tables and the workload-style summary."""

    events: Columns
    steps: int
    step_ns: list[int]
    sync_ns: list[int]
    device_busy_ns: int
    start_ns: int
    end_ns: int
    hogs: int
    process_cpu: list[dict]
    system: list[dict]

    def summary(self) -> dict:
        wall = (self.end_ns - self.start_ns) / NS
        step_ms = np.array(self.step_ns) / 1e6 if self.step_ns else np.zeros(1)
        sync_ms = np.array(self.sync_ns) / 1e6 if self.sync_ns else np.zeros(1)
        return {
            "steps": self.steps,
            "wall_s": round(wall, 3),
            "steps_per_s": round(self.steps / wall, 2) if wall else 0.0,
            "step_ms_mean": round(float(step_ms.mean()), 3),
            "step_ms_p50": round(float(np.percentile(step_ms, 50)), 3),
            "step_ms_p99": round(float(np.percentile(step_ms, 99)), 3),
            "sync_ms_p99": round(float(np.percentile(sync_ms, 99)), 3),
            "device_busy_pct": round(100 * self.device_busy_ns / (self.end_ns - self.start_ns), 1)
            if self.end_ns > self.start_ns else 0.0,
            "pid": LOOP_PID,
        }


def _step(c: Columns, rng: np.random.Generator, p: Physics, t: int, dev_free: int,
          step_index: int) -> tuple[int, int, int, list[int]]:
    """One training step starting at host time t; returns (end, device free time, busy ns, sync durations)."""
    busy = 0
    syncs: list[int] = []
    stretch = 1.0 / (1.0 - p.preempt_share) if p.preempt_share else 1.0
    host_cpu_ns = 0  # CPU the loop used this step (preemptions are spread over it)

    def jit(ns: float) -> int:
        return max(1, int(ns * rng.uniform(0.95, 1.05)))

    # -- data: the loop sleeps on the DataLoader queue
    if p.data_wait_us:
        d = jit(p.data_wait_us * US)
        c.add(t, d, "sched_switch", kind="sleep", preempted=False, runq_ns=WAKE_NS)
        for i in range(p.block_ios_per_step):
            wpid = WORKER_PID0 + step_index % 2
            bd = jit(p.block_io_us * US)
            bt = t + i * max(1, d // max(1, p.block_ios_per_step))
            c.add(bt, bd, "block_io", pid=wpid, kind="read", nbytes=256 * 1024, other_pid=0x00FD0000, cpu=1)
            c.add(bt, bd, "sched_switch", pid=wpid, kind="io", preempted=False, runq_ns=WAKE_NS, cpu=1)
        t += d + WAKE_NS
    # -- collate the batch: faults on the loop thread (pages reclaimed since the last
    # touch).  The live run shows them as mostly minor faults (readahead has the
    # page in flight: ~110k faults/s against ~70 major faults host-wide), so the
    # cost is the fault handling itself, not D-state waits.
    if p.faults_per_step:
        fd = int(p.fault_us * US)
        for _ in range(p.faults_per_step):
            c.add(t, fd, "page_fault", nbytes=None)
            t += fd
    # -- host -> device copy
    if p.copy_sync:
        d = jit(p.copy_bytes / p.copy_gbps + 8 * US)
        start = max(t, dev_free)
        c.add(t, start - t + d, "cudaMemcpy", kind="H2D", nbytes=p.copy_bytes)
        host_cpu_ns += d
        t = start + d
        copy_end = t
    else:
        c.add(t, ASYNC_COPY_CALL_NS, "cudaMemcpyAsync", kind="H2D", nbytes=p.copy_bytes)
        copy_end = max(t, dev_free) + int(p.copy_bytes / p.copy_gbps) + 8 * US
        host_cpu_ns += ASYNC_COPY_CALL_NS
        t += ASYNC_COPY_CALL_NS
    dev = max(dev_free, copy_end)
    # -- kernels, syncs spread among them
    sync_every = max(1, p.kernels // p.syncs) if p.syncs else 0
    for k in range(p.kernels):
        d = int(jit(p.launch_us * US) * stretch)
        c.add(t, d, "cudaLaunchKernel", nbytes=None)
        host_cpu_ns += d
        t += d
        kd = jit(p.kernel_us * US)
        dev = max(dev, t) + kd
        busy += kd
        if sync_every and (k + 1) % sync_every == 0 and (k + 1) // sync_every <= p.syncs:
            wait = max(0, dev - t)
            late = WAKE_NS
            if p.preempt_share and rng.uniform() < p.preempt_share:
                late += jit(PREEMPT_SLICE_NS * rng.uniform(0.2, 1.0))  # woke behind a hog
            d = wait + late
            c.add(t, d, "cudaStreamSync")
            if wait:
                c.add(t, wait + late - WAKE_NS, "sched_switch", kind="sleep", preempted=False,
                      runq_ns=late)
            syncs.append(d)
            t += d
    # -- host work (optimizer bookkeeping), stretched by preemption
    hw = jit(p.host_us * US)
    host_cpu_ns += hw
    t += int(hw * stretch)
    # -- the preemptions that the stretch stands for, spread over the step
    if p.preempt_share:
        off = int(host_cpu_ns * (stretch - 1.0))
        n = max(1, math.ceil(off / PREEMPT_SLICE_NS))
        for i in range(n):
            d = off // n
            c.add(t - off + i * d, d, "sched_switch", kind="preempted", preempted=True,
                  other_pid=HOG_PID0 + i % max(1, p.hogs), runq_ns=d)
    return t, dev, busy, syncs


def generate(scenario: Scenario, *, duration_s: float | None = None, steps: int | None = None,
             fixed: bool = False, start_ns: int | None = None, seed: int = 0) -> Replay:
    """Events of one run of ``scenario`` (``fixed``: the run with the fix applied).

    Runs ``steps`` steps, or as many as fit in ``duration_s``.  The slow run's
    first BASELINE_SHARE of steps (or of time) use the fixed physics.
    """
    if steps is None and duration_s is None:
        raise ValueError("give steps or duration_s")
    rng = np.random.default_rng(seed)
    c = Columns.empty()
    t0 = start_ns if start_ns is not None else time.time_ns()
    t = t0
    dev = t0
    busy = 0
    step_ns: list[int] = []
    sync_ns: list[int] = []
    physics = scenario.fix_physics if fixed else scenario.physics
    base_steps = int(steps * BASELINE_SHARE) if steps is not None else 0
    base_until = t0 + int((duration_s or 0) * BASELINE_SHARE * NS)
    end_by = t0 + int((duration_s or 0) * NS)
    i = 0
    while (steps is not None and i < steps) or (steps is None and t < end_by):
        clean = i < base_steps if steps is not None else t < base_until
        p = scenario.fix_physics if clean and not fixed else physics
        end, dev, b, s = _step(c, rng, p, t, dev, i)
        step_ns.append(end - t)
        sync_ns.extend(s)
        busy += b
        t = end
        i += 1
    cause_from = t0 + sum(step_ns[:base_steps]) if steps is not None else base_until
    hogs = physics.hogs
    pcpu = _process_cpu(t0, t, hogs, cause_from if not fixed else t0, physics)
    system = _system(t0, t, hogs)
    return Replay(c, i, step_ns, sync_ns, busy, t0, t, hogs, pcpu, system)


def _process_cpu(t0: int, t1: int, hogs: int, hogs_from: int, p: Physics) -> list[dict]:
    rows = []
    for ts in range(t0 + SAMPLE_NS, t1 + SAMPLE_NS, SAMPLE_NS):
        for h in range(hogs if ts > hogs_from else 0):
            rows.append({
                "timestamp": ts, "interval_ns": SAMPLE_NS, "pid": HOG_PID0 + h, "comm": "cpu-hog",
                "oncpu_ns": int(SAMPLE_NS * 0.5), "involuntary": 300, "voluntary": 0,
                "preempted_traced": int(100 * p.preempt_share),
            })
    return rows


def _system(t0: int, t1: int, hogs: int) -> list[dict]:
    ncpu = os.cpu_count() or 2
    return [{
        "timestamp": ts, "cpu_pct": min(100.0, 50.0 + 25.0 * hogs), "iowait_pct": 0.0, "mem_pct": 20.0,
        "swap_used_bytes": 0, "major_faults": 0, "load1": 1.0 + hogs, "ncpu": ncpu,
    } for ts in range(t0 + SAMPLE_NS, t1 + SAMPLE_NS, SAMPLE_NS)]


def write(store: Store, scenario: Scenario, replay: Replay, *, label: str) -> int:
    """Store a replay as one closed session; returns its id."""
    sid = store.begin_session(command=f"ingero demo {scenario.name} ({label}, synthetic replay)",
                              targets="python3 (train.py) [synthetic]")
    store.append("events", replay.events.table(sid))
    # what BPF tags at each switch and fault (the thread's CUDA call state), derived from the calls
    fill_call_state(store.con, sid)
    names = [{"pid": LOOP_PID, "name": "python3 (train.py)", "comm": "python3",
              "cmdline": "python3 demos/workloads/train.py", "session_id": sid, "seen_ns": replay.start_ns}]
    names += [{"pid": WORKER_PID0 + w, "name": "python3 (train.py worker)", "comm": "python3",
               "cmdline": "python3 demos/workloads/train.py", "session_id": sid, "seen_ns": replay.start_ns}
              for w in range(2)]
    names += [{"pid": HOG_PID0 + h, "name": "cpu-hog", "comm": "cpu-hog",
               "cmdline": "python3 -m ingero.demo.interference cpu-hog 0", "session_id": sid,
               "seen_ns": replay.start_ns} for h in range(replay.hogs)]
    store.upsert_process_names(names)
    if replay.process_cpu:
        store.append("process_cpu", pa.Table.from_pylist([{**r, "session_id": sid} for r in replay.process_cpu]))
    if replay.system:
        store.append("system_metrics", pa.Table.from_pylist([{**r, "session_id": sid} for r in replay.system]))
    n = replay.events.table(sid).num_rows
    store.end_session(sid, events=n, drops_kernel=0, drops_user=0)
    # the session spans the replayed interval, not the moment it was written
    store.con.execute(
        "UPDATE sessions SET started_ns = $s, ended_ns = $e, heartbeat_ns = $e WHERE session_id = $sid",
        {"s": replay.start_ns, "e": replay.end_ns, "sid": sid},
    )
    return sid
