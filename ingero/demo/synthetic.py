"""Synthetic replay: a scenario's events generated step by step, when eBPF is not available.

The one synthetic trace generator of the project.  It writes the same
tables and columns a live trace writes (events, process_names,
process_cpu, system_metrics, a closed session), with the physics the live
run has: launches cost host time, kernels queue on a device timeline, a
sync returns when the device drains, pageable copies are staged chunk by
chunk on the calling thread and synchronous, a starved loop sleeps on its
queue, a contended loop waits runnable while a hog runs, faults and block
I/O take time on the thread that suffers them.  How the loop waits for the
device follows the scenario's wait policy (ingero.demo.timeline: spin,
yield or block; ``auto`` resolves as CUDA does).  ``event_batch`` gives
bulk rows of a random mix, for load and retention tests.

Not modelled: a full launch queue (no scenario issues ~1000 launches ahead
of the device), event syncs, more than one loop thread.

As in the live demo, the cause starts after a clean baseline share of the
run (``BASELINE_SHARE``), so rules compare windows of the same session.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingero.demo import scenarios
from ingero.demo.scenarios import BASELINE_SHARE, Physics, Scenario, wait_policy
from ingero.demo.timeline import HOG_PID0, LOOP_PID, WAKE_NS, WORKER_PID0, Columns, Draws, LoopThread
from ingero.events.units import NS, US
from ingero.store.db import Store
from ingero.store.derive import fill_call_state

__all__ = ["LOOP_PID", "WORKER_PID0", "HOG_PID0", "Columns", "Replay", "generate", "write",
           "event_batch"]

# cudaMemcpyAsync from pinned memory returns after ~10 us (queues the DMA).
ASYNC_COPY_CALL_NS = 10 * US
# Pageable copies are staged through a pinned bounce buffer in chunks of this
# size, each chunk's DMA waited for (demos/simcuda STAGE_CHUNK), at the DMA
# bandwidth and setup latency of the simulated runtime's defaults.
STAGE_CHUNK = 2 << 20
DMA_GBPS = 12.0
COPY_LATENCY_NS = 8 * US
# Samplers write one row a second.
SAMPLE_NS = NS


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
    policy: str = "block"
    # per sync: when the device finished the work it waited for (the simulated timeline knows)
    sync_device_done_ns: list[int] = field(default_factory=list)
    ranks: int = 1  # data-parallel ranks (processes LOOP_PID + r)

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
            "wait_policy": self.policy,
        }


class _Device:
    """The device timeline: when the work queued so far ends, and how long kernels ran."""

    def __init__(self, t: int) -> None:
        self.free = t
        self.busy = 0

    def queue(self, at: int, ns: int, *, kernel: bool = False) -> int:
        self.free = max(self.free, at) + ns
        if kernel:
            self.busy += ns
        return self.free


def _data_wait(th: LoopThread, rng: np.random.Generator, p: Physics, worker_free: list[int]) -> None:
    """The loop sleeps on the DataLoader queue while the workers read (block I/O on their threads)."""
    d = th.jit(p.data_wait_us * US)
    spacing = d // max(1, p.block_ios_per_step)
    for i in range(p.block_ios_per_step):
        w = i % len(worker_free)
        bd = th.jit(p.block_io_us * US)
        # one worker reads one request at a time: its I/O waits never overlap
        bt = max(th.t + i * spacing, worker_free[w])
        wpid = WORKER_PID0 + w
        th.c.add(bt, bd, "block_io", pid=wpid, kind="read", nbytes=256 * 1024, other_pid=0x00FD0000, cpu=1)
        th.c.add(bt, bd + WAKE_NS, "sched_switch", pid=wpid, kind="io", preempted=False, runq_ns=WAKE_NS, cpu=1)
        worker_free[w] = bt + bd + WAKE_NS
    th.sleep(d)


def _sync_copy(th: LoopThread, dev: _Device, p: Physics) -> None:
    """Body of a pageable cudaMemcpy: after the queued work, chunk by chunk: a CPU copy into the
    bounce buffer, then that chunk's DMA, waited for."""
    th.wait_device(dev.free)
    host_ns_per_byte = max(0.0, 1.0 / p.copy_gbps - 1.0 / DMA_GBPS)
    left = p.copy_bytes
    while left > 0:
        n = min(left, STAGE_CHUNK)
        th.run(th.jit(n * host_ns_per_byte + 1))
        th.wait_device(dev.queue(th.t, th.jit(n / DMA_GBPS + COPY_LATENCY_NS)))
        left -= n


# Fewer launches than this are cheaper one call at a time than as numpy arrays.
_BLOCK_LAUNCHES = 24


def _launches(th: LoopThread, dev: _Device, n: int, p: Physics) -> None:
    """``n`` kernel launches, each queueing its kernel: as one block where nothing preempts the thread
    (the same draws and rows, at a fraction of the cost of one Python call per launch)."""
    if not th.contended and n >= _BLOCK_LAUNCHES:
        dev.free, busy = th.launch_run(n, p.launch_us * US, p.kernel_us * US, dev.free)
        dev.busy += busy
        return
    for _ in range(n):
        th.call_run("cudaLaunchKernel", th.jit(p.launch_us * US))
        dev.queue(th.t, th.jit(p.kernel_us * US), kernel=True)


def _step(th: LoopThread, rng: np.random.Generator, p: Physics, dev: _Device,
          worker_free: list[int]) -> list[tuple[int, int]]:
    """One training step from the thread's clock; returns (duration, device done) of its syncs."""
    th.contend(p.preempt_share, p.hogs)
    syncs: list[tuple[int, int]] = []
    if p.data_wait_us:
        _data_wait(th, rng, p, worker_free)
    # -- collate the batch: faults on the loop thread (pages reclaimed since the last
    # touch).  The live run shows them as mostly minor faults (readahead has the
    # page in flight: ~110k faults/s against ~70 major faults host-wide), so the
    # cost is the fault handling itself, on the CPU, not D-state waits.
    if p.faults_per_step:
        th.faults(p.faults_per_step, int(p.fault_us * US))
    # -- host -> device copy
    if p.copy_sync:
        th.call_op("cudaMemcpy", lambda: _sync_copy(th, dev, p), kind="H2D", nbytes=p.copy_bytes)
    else:
        th.call_run("cudaMemcpyAsync", ASYNC_COPY_CALL_NS, kind="H2D", nbytes=p.copy_bytes)
        dev.queue(th.t, int(p.copy_bytes / p.copy_gbps) + COPY_LATENCY_NS)
    # -- kernels, syncs spread among them (after kernel k when k + 1 is one of sync_every's first
    # p.syncs multiples)
    sync_every = max(1, p.kernels // p.syncs) if p.syncs else 0
    k = 0
    while k < p.kernels:
        n = p.kernels - k
        if sync_every and (k // sync_every) < p.syncs:
            n = min(n, sync_every - k % sync_every)
        _launches(th, dev, n, p)
        k += n
        if sync_every and k % sync_every == 0 and k // sync_every <= p.syncs:
            syncs.append((th.call_op("cudaStreamSync", lambda: th.wait_device(dev.free)), dev.free))
    # -- host work (optimizer bookkeeping)
    th.run(th.jit(p.host_us * US))
    return syncs


# The simulated NCCL's defaults (demos/simnccl): per-rank bus bandwidth and fixed cost.
NCCL_GBPS = 25.0
NCCL_LAT_NS = 20 * US
GRAD_BYTES = 32 << 20  # train.py --grad-bytes
RANK_COMM0 = 0xC0FFEE00  # rank r's ncclComm_t in the replay: RANK_COMM0 + r
COMM_ID = "5e" * 16  # the replay's ncclUniqueId (hex)


def _rank_steps(ths: list[LoopThread], devs: list[_Device], rng: np.random.Generator, p: Physics,
                clean: bool) -> tuple[int, list[tuple[int, int]]]:
    """One step of every rank: each copies and launches on its own clock, enters the all-reduce; the
    collective starts when the last rank is in (and its kernels are done), every rank's sync waits for
    its end.  The last rank takes the contention (the straggler).  Returns (the step's collective end,
    (duration, device done) of rank 0's sync)."""
    n = len(ths)
    entries = []
    for r, (th, dev) in enumerate(zip(ths, devs)):
        straggler = r == n - 1 and not clean
        th.contend(p.preempt_share if straggler else 0.0, p.hogs if straggler else 0)
        if p.data_wait_us:
            th.sleep(th.jit(p.data_wait_us * US))
        th.call_run("cudaMemcpyAsync", ASYNC_COPY_CALL_NS, kind="H2D", nbytes=p.copy_bytes)
        dev.queue(th.t, int(p.copy_bytes / p.copy_gbps) + COPY_LATENCY_NS)
        _launches(th, dev, p.kernels, p)
        # the backward's Python between the last launch and the all-reduce, then its enqueue
        th.run(th.jit(p.host_us * US))
        th.call_op("ncclAllReduce", lambda: th.run(th.jit(15 * US)), kind="sum:float32", nbytes=GRAD_BYTES,
                   comm=RANK_COMM0 + r)
        entries.append(max(th.t, dev.free))
    start = max(entries)
    end = start + NCCL_LAT_NS + int(GRAD_BYTES * 2 * (n - 1) / n / NCCL_GBPS)
    sync0 = (0, end)
    for r, (th, dev) in enumerate(zip(ths, devs)):
        dev.free = max(dev.free, end)
        d = th.call_op("cudaStreamSync", lambda: th.wait_device(end))
        if r == 0:
            sync0 = (d, end)
    return end, [sync0]


def _generate_ranks(scenario: Scenario, physics: Physics, *, duration_s: float | None, steps: int | None,
                    fixed: bool, t0: int, rng: np.random.Generator, how: str) -> "Replay":
    """The replay of a data-parallel job: ``physics.ranks`` processes (LOOP_PID + r, rank r on core r)."""
    c = Columns.empty()
    draws = Draws(rng)  # one stream for every rank, in the order they draw
    ths = [LoopThread(c, draws, how, t0, pid=LOOP_PID + r, cpu=r) for r in range(physics.ranks)]
    devs = [_Device(t0) for _ in ths]
    base_steps = int(steps * BASELINE_SHARE) if steps is not None else 0
    base_until = t0 + int((duration_s or 0) * BASELINE_SHARE * NS)
    end_by = t0 + int((duration_s or 0) * NS)
    step_ns: list[int] = []
    sync_ns: list[int] = []
    sync_done: list[int] = []
    i = 0
    t = t0
    while (steps is not None and i < steps) or (steps is None and t < end_by):
        clean = fixed or (i < base_steps if steps is not None else t < base_until)
        p = scenario.fix_physics if clean and not fixed else physics
        begin = ths[0].t
        t, syncs = _rank_steps(ths, devs, rng, p, clean)
        for d, done in syncs:
            sync_ns.append(d)
            sync_done.append(done)
        for th in ths:
            th.run(th.jit(500 * US))  # optimizer step
        step_ns.append(ths[0].t - begin)
        i += 1
    end = max(th.t for th in ths)
    cause_from = t0 + sum(step_ns[:base_steps]) if steps is not None else base_until
    hogs = physics.hogs
    pcpu = _process_cpu(t0, end, hogs, cause_from if not fixed else t0, c)
    return Replay(c, i, step_ns, sync_ns, devs[0].busy, t0, end, hogs, pcpu, _system(t0, end, hogs), how,
                  sync_done, ranks=physics.ranks)


def generate(scenario: Scenario, *, duration_s: float | None = None, steps: int | None = None,
             fixed: bool = False, start_ns: int | None = None, seed: int = 0,
             policy: str | None = None) -> Replay:
    """Events of one run of ``scenario`` (``fixed``: the run with the fix applied).

    Runs ``steps`` steps, or as many as fit in ``duration_s``.  The slow run's
    first BASELINE_SHARE of steps (or of time) use the fixed physics.  The
    loop waits for the device by ``policy`` (auto, spin, yield, block;
    default: the scenario's).
    """
    if steps is None and duration_s is None:
        raise ValueError("give steps or duration_s")
    how = wait_policy(policy or scenario.policy)
    rng = np.random.default_rng(seed)
    t0 = start_ns if start_ns is not None else time.time_ns() // NS * NS  # whole seconds, as explain's windows
    if scenario.physics.ranks > 1:
        return _generate_ranks(scenario, scenario.fix_physics if fixed else scenario.physics,
                               duration_s=duration_s, steps=steps, fixed=fixed, t0=t0, rng=rng, how=how)
    c = Columns.empty()
    th = LoopThread(c, rng, how, t0)
    dev = _Device(t0)
    worker_free = [t0, t0]
    step_ns: list[int] = []
    sync_ns: list[int] = []
    sync_done: list[int] = []
    physics = scenario.fix_physics if fixed else scenario.physics
    base_steps = int(steps * BASELINE_SHARE) if steps is not None else 0
    base_until = t0 + int((duration_s or 0) * BASELINE_SHARE * NS)
    end_by = t0 + int((duration_s or 0) * NS)
    i = 0
    while (steps is not None and i < steps) or (steps is None and th.t < end_by):
        clean = i < base_steps if steps is not None else th.t < base_until
        p = scenario.fix_physics if clean and not fixed else physics
        begin = th.t
        for d, done in _step(th, rng, p, dev, worker_free):
            sync_ns.append(d)
            sync_done.append(done)
        step_ns.append(th.t - begin)
        i += 1
    cause_from = t0 + sum(step_ns[:base_steps]) if steps is not None else base_until
    hogs = physics.hogs
    pcpu = _process_cpu(t0, th.t, hogs, cause_from if not fixed else t0, c)
    system = _system(t0, th.t, hogs)
    return Replay(c, i, step_ns, sync_ns, dev.busy, t0, th.t, hogs, pcpu, system, how, sync_done)


def _process_cpu(t0: int, t1: int, hogs: int, hogs_from: int, c: Columns) -> list[dict]:
    """The hogs' per-second rows; preempted_traced counts the loop's switch-outs to each one."""
    t = c.table(0)
    pre = pc.and_(pc.equal(t["op"], "sched_switch"), pc.equal(t["kind"], "preempted")).fill_null(False)
    ts = t["timestamp"].filter(pre).to_numpy()
    took = Counter(zip(t["other_pid"].filter(pre).to_pylist(), ((ts - t0) // SAMPLE_NS).tolist()))
    rows = []
    for ts in range(t0 + SAMPLE_NS, t1 + SAMPLE_NS, SAMPLE_NS):
        for h in range(hogs if ts > hogs_from else 0):
            rows.append({
                "timestamp": ts, "interval_ns": SAMPLE_NS, "pid": HOG_PID0 + h, "comm": "cpu-hog",
                "oncpu_ns": int(SAMPLE_NS * 0.5), "involuntary": 300, "voluntary": 0,
                "preempted_traced": took[(HOG_PID0 + h, (ts - t0) // SAMPLE_NS - 1)],
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
    sid = store.begin_session(command=f"ingero demo {scenario.name} ({label}, synthetic replay, "
                                      f"{replay.policy} waits)",
                              targets="python3 (train.py) [synthetic]")
    events = replay.events.table(sid)
    store.append("events", events)
    # what BPF tags at each switch and fault (the thread's CUDA call state), derived from the calls
    fill_call_state(store.con, sid)
    names = [{"pid": LOOP_PID + r, "name": "python3 (train.py)", "comm": "python3",
              "cmdline": "python3 demos/workloads/train.py", "session_id": sid, "seen_ns": replay.start_ns}
             for r in range(replay.ranks)]
    names += [{"pid": WORKER_PID0 + w, "name": "python3 (train.py worker)", "comm": "python3",
               "cmdline": "python3 demos/workloads/train.py", "session_id": sid, "seen_ns": replay.start_ns}
              for w in range(2)]
    names += [{"pid": HOG_PID0 + h, "name": "cpu-hog", "comm": "cpu-hog",
               "cmdline": "python3 -m ingero.demo.interference cpu-hog 0", "session_id": sid,
               "seen_ns": replay.start_ns} for h in range(replay.hogs)]
    store.upsert_process_names(names)
    if replay.ranks > 1:
        # each rank's communicator (its ncclCommInitRank) and its torchrun environment
        rows = []
        for r in range(replay.ranks):
            common = {"session_id": sid, "pid": LOOP_PID + r, "seen_ns": replay.start_ns, "rank": r,
                      "nranks": replay.ranks}
            rows.append({**common, "source": "nccl", "comm": RANK_COMM0 + r, "comm_id": COMM_ID,
                         "local_rank": None, "job": None})
            rows.append({**common, "source": "env", "comm": None, "comm_id": None, "local_rank": r,
                         "job": "synthetic"})
        store.append("ranks", pa.Table.from_pylist(rows))
    if replay.process_cpu:
        store.append("process_cpu", pa.Table.from_pylist([{**r, "session_id": sid} for r in replay.process_cpu]))
    if replay.system:
        store.append("system_metrics", pa.Table.from_pylist([{**r, "session_id": sid} for r in replay.system]))
    store.end_session(sid, events=events.num_rows, drops_kernel=0, drops_user=0)
    # the session spans the replayed interval, not the moment it was written
    store.con.execute(
        "UPDATE sessions SET started_ns = $s, ended_ns = $e, heartbeat_ns = $e WHERE session_id = $sid",
        {"s": replay.start_ns, "e": replay.end_ns, "sid": sid},
    )
    return sid


@functools.lru_cache(maxsize=1)
def _bulk_template() -> pa.Table:
    """Ten seconds of a contended loop with blocking waits: launches, syncs, copies, sleeps and
    preemptions in the proportions of a replayed run (~7,000 rows), in time order."""
    r = generate(scenarios.get("cpu-contention"), duration_s=10, start_ns=0, policy="block")
    t = r.events.table(0)
    return t.take(pa.array(np.argsort(t["timestamp"].to_numpy(), kind="stable")))


def event_batch(session_id: int, start_ns: int, end_ns: int, n: int, rng: np.random.Generator) -> pa.Table:
    """``n`` rows of a replayed run, from a random point of it, evenly spread over [start_ns, end_ns).

    Bulk rows for load, retention and live-query tests, where the row count and
    the time span are what matters: ops, kinds, durations and PIDs are a real
    replay's, but re-timed, so one thread's intervals may overlap.
    """
    tpl = _bulk_template()
    idx = (int(rng.integers(0, tpl.num_rows)) + np.arange(n)) % tpl.num_rows
    out = tpl.take(pa.array(idx))
    ts = start_ns + np.arange(n, dtype=np.int64) * max(1, end_ns - start_ns) // max(1, n)
    out = out.set_column(out.schema.get_field_index("timestamp"), "timestamp", pa.array(ts, pa.int64()))
    return out.set_column(out.schema.get_field_index("session_id"), "session_id",
                          pa.array(np.full(n, session_id, dtype=np.int32)))
