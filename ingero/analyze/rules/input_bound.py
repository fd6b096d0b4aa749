"""input-bound: the loop waits for its next batch while the GPU idles.

Physics: when DataLoader workers produce batches slower than the GPU eats
them, the loop thread sleeps on the batch queue between steps: off CPU,
voluntarily, outside any CUDA call (a sleep inside a sync is waiting for the
GPU and does not count).  Whether the device idles meanwhile depends on the
loop's shape, which events.queued tells per sleep:

* serial (`wait for the batch; launch; sync`): the last sync returned before
  the wait and nothing was queued since (queued FALSE).  The device idles
  through the whole wait, however long the sync after it is: every such
  wait is lost GPU time.
* overlapped (`launch; wait for the batch; sync`): the step's kernels were
  queued before the wait (queued TRUE) and run during it.  The wait costs
  GPU time only where the device ran dry before the batch came, and then the
  sync that follows has nothing left to wait for; a sync that still waits
  long means the kernels outlasted the wait (GPU-bound: the wait was hidden).

The cause metric is the loop thread's wait for data per window: its sleeps
outside calls with nothing queued, plus those with work queued when the
window's syncs waited little next to them.  The workers' CPU use says
whether they are the bottleneck (busy) or are themselves starved of CPU
(contention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ingero.analyze import baseline, procs, units, waits
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit, Window
from ingero.store.selection import Selection

ID = "input-bound"
TITLE = "Input pipeline starvation → training loop waits for data, GPU idles"


@dataclass(frozen=True)
class Thresholds:
    # Evidence window: the loop sleeps outside CUDA calls at least this share
    # of wall clock.  A loop fed by a prefetching DataLoader finds its next
    # batch ready: its between-step sleeps stay under a few percent.
    min_wait_share: float = 0.20
    high_wait_share: float = 0.40
    # Waits with device work queued (overlapped loop) count only when the window's
    # syncs waited at most this share of them.  With one queue, a sync that still
    # waits after the data wait means the device was busy through all of it; what
    # syncs wait after the device ran dry is wake-up latency and jitter (a slower
    # kernel, a faster batch now and then).  At 0.1, a loop whose kernels outlast its
    # data wait by under ~10% also counts: its two rates are within 10% of each other
    # and any slower batch makes it wait for data.
    max_queued_sync_ratio: float = 0.10
    # Workers waiting for a CPU (or the disk) at least this share of their
    # time, more than they run, make contention (io-stall) the deeper cause.
    deeper_cause_share: float = 0.2
    # Adding workers helps while each is below this share of a core (it waits
    # on something: more run in parallel) or this many CPUs are idle.
    saturated_worker_share: float = 0.8
    min_free_cpus: float = 0.5
    # A process outside the job that took the CPU from the workers this share of the loop's
    # wait for data is named as a cause (the loop waited on a worker it preempted): two hogs on
    # the workers' core took 6% each in a run where the workers' own preemptions of each other
    # and their feeder threads took the rest.
    starver_share: float = 0.05


T = Thresholds()

WORKERS_SQL = """
SELECT pid, sum(coalesce(oncpu_ns, 0)) AS oncpu_ns, sum(cpu_wait_ns) AS cpu_wait_ns,
       sum(sleep_ns) AS sleep_ns, sum(io_ns) AS io_ns, count(*) AS nw
FROM ing_helper WHERE list_contains($ws, w)
GROUP BY pid ORDER BY oncpu_ns DESC
"""


def _queued_wait_ns(r: baseline.Row) -> float:
    """The window's waits with device work queued, when the syncs show the device ran dry in them."""
    queued = r["sleep_out_queued_ns"]
    # the syncs' call time, not their sleeps: a spinning sync waits on CPU
    return queued if queued and r["sync_ns"] <= T.max_queued_sync_ratio * queued else 0.0


def idle_wait_ns(r: baseline.Row) -> float:
    """The loop's sleeps outside CUDA calls in window ``r`` that cost GPU time (the module doc),
    whatever it waited for: the other rules of the loop's own waits take their part of it."""
    return r["sleep_out_idle_ns"] + _queued_wait_ns(r)


def wait_ns(r: baseline.Row) -> float:
    """The loop's wait for data in window ``r`` that cost GPU time (see the module doc): of its
    waits, the part whose wake-up came from another process (waits.input_fraction, kept in the
    row as ``input_fraction``; all of it where nothing was attributed: an older store)."""
    return idle_wait_ns(r) * r.get("input_fraction", 1.0)


def _share(r: baseline.Row) -> float:
    return wait_ns(r) / r["wall_ns"] if r["wall_ns"] else 0.0


def evaluate(con, ctx: Context) -> list[Chain]:
    if ctx.marked_steps is not None:
        # a profiler trace marks its steps and its DataLoader waits: measured, not inferred
        return _from_marked_steps(con, ctx, ctx.marked_steps)
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        fed = waits.input_fraction(con, pid)
        for r in rows:
            r["input_fraction"] = fed.get(int(r["w"]), 1.0)
        s = baseline.split(rows, _share, T.min_wait_share)
        if not s.evidence:
            continue
        ws = [int(r["w"]) for r in s.evidence]
        wall = sum(r["wall_ns"] for r in s.evidence)
        waited = sum(wait_ns(r) for r in s.evidence)
        queued_ns = sum(_queued_wait_ns(r) for r in s.evidence)
        wait = waited / wall if wall else 0.0
        queued_share = queued_ns / wall if wall else 0.0
        sync_share = baseline.mean_share(s.evidence, "sync_ns")
        workers = con.execute(WORKERS_SQL, {"ws": ws}).fetchall()
        names = procs.lookup(con, [pid] + [w[0] for w in workers])
        me = names[pid]
        # with parent pids known, this process' workers are its children (another
        # CUDA process' workers, or an unrelated traced helper, are not)
        if any(names[w[0]].ppid is not None for w in workers):
            workers = [w for w in workers if names[w[0]].child_of(pid)]
        n_workers = len(workers)
        w_oncpu = sum(w[1] for w in workers) / wall if wall else 0.0  # in CPUs
        w_wait = sum(w[2] for w in workers) / wall if wall else 0.0
        w_io = sum(w[4] for w in workers) / wall if wall else 0.0
        severity = "HIGH" if wait >= T.high_wait_share else "MEDIUM"
        # workers that mostly wait for a CPU or for the disk point at a deeper cause
        starved_workers = n_workers and w_wait > w_oncpu and w_wait >= T.deeper_cause_share * n_workers
        io_workers = n_workers and w_io > w_oncpu and w_io >= T.deeper_cause_share * n_workers
        if (starved_workers or io_workers) and severity == "HIGH":
            severity = "MEDIUM"
        base_rate, ev_rate, drop = baseline.throughput(s)
        corr = baseline.evidence_correlation(s, _share, baseline.ops_rate, expect=-1)

        root = [
            f"{me.label} waited outside CUDA calls {units.ns(waited)} of {units.ns(wall)} "
            f"({units.pct(wait)} of the loop's time in {len(ws)} of {len(rows)} windows)",
        ]
        if n_workers:
            root.append(
                f"{n_workers} DataLoader worker process{'es' if n_workers != 1 else ''}"
                f"{f' of PID {pid}' if all(names[w[0]].child_of(pid) for w in workers) else ''} used "
                f"{w_oncpu:.2f} CPUs of {ctx.ncpu} ({w_oncpu / n_workers * 100:.0f}% of a core each)"
            )
        else:
            root.append("no worker processes traced: the loop loads its data itself, or waits on something else")
        idle_share = wait - queued_share
        if queued_share:
            # overlapped loop: its kernels ran during part of these waits
            q_rows = [r for r in s.evidence if _queued_wait_ns(r)]
            dry = (f"the kernels queued before the wait finished before the batch came "
                   f"({units.pct(queued_share)} of wall clock; the syncs of those windows waited "
                   f"{units.pct(baseline.mean_share(q_rows, 'sync_ns'))})")
            effect = [f"GPU idle while the loop waits: nothing queued for {units.pct(idle_share)} of wall clock; "
                      f"{dry}" if round(idle_share, 3) > 0 else f"GPU idle while the loop waits: {dry}"]
        else:
            effect = [
                f"GPU idle while the loop waits: nothing queued for {units.pct(wait)} of wall clock "
                f"(waiting for the GPU: {units.pct(sync_share)})"
            ]
        if s.has_baseline and drop > 0:
            effect.append(
                f"CUDA ops/s down {units.pct(drop)} from clean windows "
                f"({units.count(base_rate)} → {units.count(ev_rate)})"
            )
        elif not s.has_baseline:
            line = baseline.quartile_contrast(rows, _share, "waiting for data")
            effect.append(line or f"no clean window to compare with: the loop waited for data in {len(ws)} of "
                          f"{len(rows)} active windows")
        contributing = []
        # who starved the workers: followed from the loop's wake-ups (waits.py)
        hogs = [h for h in waits.starvers(con, pid, ws) if h[1] >= T.starver_share * waited]
        if starved_workers:
            contributing.append(f"workers waited for a CPU {w_wait:.2f} CPU-s per s"
                                + (": see the processes above that took it" if hogs else ": see cpu-contention"))
        if io_workers:
            contributing.append(f"workers blocked on disk {units.pct(w_io / n_workers)} of the time: see io-stall")
        elif w_io > 0.05:
            contributing.append(f"workers in uninterruptible I/O {units.pct(w_io / max(n_workers, 1))} of the time")
        loop_cpus = 1.0 - baseline.mean_share(s.evidence, "off_ns")
        fix = _fixes(ctx, me, n_workers, wait, workers[0][0] if workers else None, w_oncpu, loop_cpus)
        culprits = [
            Culprit(w[0], names[w[0]].role(pid), f"{units.ns(w[1])} on CPU, {units.ns(w[2])} waiting for a CPU")
            for w in workers[:4]
        ]
        if hogs:
            hog_names = procs.lookup(con, [h[0] for h in hogs])
            pids_txt = " ".join(str(h[0]) for h in hogs)
            root.append("the workers waited for a CPU taken by " + ", ".join(
                f"{hog_names[h[0]].label} ({units.ns(h[1])} of the loop's wait)" for h in hogs[:4]))
            culprits = [Culprit(h[0], hog_names[h[0]].name, f"took the CPU from the workers: {units.ns(h[1])} "
                                f"of the loop's wait") for h in hogs[:4]] + culprits
            free = _free_cores(con, ctx, [pid] + [w[0] for w in workers])
            hog_what = ", ".join(sorted({hog_names[h[0]].name for h in hogs}))
            hog_fix = [f"renice -n 19 -p {pids_txt}   (the workers first: {hog_what} took their CPU)"]
            worker_cores = _used_cores(con, ctx, [w[0] for w in workers])
            if free:
                hog_fix.insert(0, f"taskset -acp {free} {pids_txt}   "
                                  "(move them off the cores the workers and the loop use)")
            elif workers and worker_cores and len(worker_cores) < ctx.ncpu:
                # no core is free of the job: let the confined workers use the loop's idle time instead
                hog_fix.insert(0, f"taskset -acp 0-{ctx.ncpu - 1} {' '.join(str(w[0]) for w in workers)}   (the "
                                  f"workers ran only on CPU {','.join(map(str, sorted(worker_cores)))}, beside "
                                  f"{hog_what}: let them use every core)")
            fix = hog_fix + fix
            if severity == "MEDIUM" and wait >= T.high_wait_share:
                severity = "HIGH"  # the deeper cause is named: the hogs
        chains.append(
            baseline.chain(
                ID, TITLE, ctx, pid, s,
                severity=severity,
                root=root,
                effect=effect,
                contributing=contributing,
                fix=fix,
                culprits=culprits,
                corr=corr,
                corr_note='CUDA ops/s fall as the wait for data grows',
                impact=wait,
                numbers={
                    "input_wait_share": round(wait, 4),
                    "input_wait_ns": waited,
                    "queued_wait_share": round(queued_share, 4),
                    "sync_wait_share": round(sync_share, 4),
                    "workers": n_workers,
                    "worker_cpus": round(w_oncpu, 3),
                    "throughput_drop": round(drop, 4),
                },
            )
        )
    return chains


# The cores a set of processes ran on: those holding at least 5% of their switches (a worker's
# first switches before its pinning land anywhere).
CORES_SQL = f"""
SELECT cpu FROM (
    SELECT cpu, count(*) AS n, sum(count(*)) OVER () AS total FROM events
    WHERE {Selection.where(pids=False)} AND op = 'sched_switch'
      AND list_contains($pids, pid)
    GROUP BY cpu
) WHERE n >= 0.05 * total
"""


def _used_cores(con, ctx: Context, pids: list[int]) -> set[int]:
    """The cores ``pids`` ran on over the range (CORES_SQL)."""
    return {int(c) for (c,) in con.execute(CORES_SQL, {"sid": ctx.session_id, "t0": ctx.start_ns, "t1": ctx.end_ns,
                                                       "pids": pids}).fetchall() if c is not None}


def _free_cores(con, ctx: Context, pids: list[int]) -> str:
    """The cores none of ``pids`` ran on, as a taskset list ('' when none)."""
    used = _used_cores(con, ctx, pids)
    return ",".join(str(c) for c in range(ctx.ncpu) if c not in used)


def _fixes(ctx: Context, me: procs.Proc, n_workers: int, wait: float, top_worker: int | None,
           worker_cpus: float, loop_cpus: float) -> list[str]:
    # The loop needs batches 1/(1-wait) times faster; workers scale about
    # linearly while they are not CPU-bound or cores are left for them.
    # (-0.1: a rate 3.003x the current one is met by 3 workers, not 4)
    need = max(n_workers + 1, math.ceil(max(n_workers, 1) / max(1e-3, 1.0 - wait) - 0.1))
    per_worker = worker_cpus / n_workers if n_workers else 0.0
    room = ctx.ncpu - worker_cpus - loop_cpus  # idle CPUs in the evidence windows
    if n_workers and per_worker >= T.saturated_worker_share:
        # CPU-bound workers: only as many more as the idle CPUs can run
        need = min(need, n_workers + int(max(room, 0.0) / per_worker))
    can_scale = need > n_workers and (
        n_workers == 0 or per_worker < T.saturated_worker_share or room >= T.min_free_cpus
    )
    fix = []
    if can_scale:
        why = (f"{n_workers} worker{'s' if n_workers != 1 else ''} at {per_worker * 100:.0f}% of a core each, "
               f"{max(room, 0):.1f} of {ctx.ncpu} CPUs idle") if n_workers else "no workers now"
        fix.append(
            f"DataLoader(num_workers={need}, pin_memory=True, persistent_workers=True, prefetch_factor=4)   ({why})"
        )
    else:
        fix.append(
            f"DataLoader(num_workers={n_workers}, pin_memory=True, persistent_workers=True, prefetch_factor=4)"
            f"   ({n_workers} workers already use {worker_cpus:.1f} of {ctx.ncpu} CPUs: more will not help)"
        )
        fix.append("make each sample cheaper: cache decoded/augmented samples, move augmentation to the GPU")
    if top_worker is not None:
        fix.append(f"py-spy top --pid {top_worker}   (see where the busiest worker of PID {me.pid} spends its time)")
    else:
        fix.append(f"py-spy top --pid {me.pid}   (see what the loop waits on between steps)")
    return fix


# The loop thread of a profiler trace: who ran the marked steps.
STEP_PID_SQL = """
SELECT pid FROM spans WHERE session_id = $sid AND starts_with(name, 'ProfilerStep#')
GROUP BY pid ORDER BY count(*) DESC LIMIT 1
"""
# What the DataLoader spans say of the loader: the single-process iterator builds
# every batch on the loop thread (num_workers=0).
INLINE_LOADER_SQL = """
SELECT count(*) > 0 FROM spans
WHERE session_id = $sid AND starts_with(name, 'enumerate(DataLoader)') AND contains(name, 'SingleProcess')
"""


# More workers than this rarely help one GPU's loop: they compete for the host's cores.
MAX_SUGGESTED_WORKERS = 8


def _from_marked_steps(con, ctx: Context, steps) -> list[Chain]:
    """input-bound from ProfilerStep#N and enumerate(DataLoader) spans (an imported torch.profiler trace)."""
    total = sum(st.end_ns - st.start_ns for st in steps.steps)
    waited = sum(st.dataloader_ns for st in steps.steps)
    share = waited / total if total else 0.0
    ev = [st for st in steps.steps if st.dataloader_share >= T.min_wait_share]
    if share < T.min_wait_share or len(ev) * 2 < steps.count:
        return []
    pid_row = con.execute(STEP_PID_SQL, {"sid": ctx.session_id}).fetchone()
    pid = int(pid_row[0]) if pid_row and pid_row[0] is not None else 0
    me = procs.lookup(con, [pid]).get(pid)
    label = me.label if me else f"PID {pid}"
    inline = bool(con.execute(INLINE_LOADER_SQL, {"sid": ctx.session_id}).fetchone()[0])
    step_ms = total / steps.count / 1e6
    data_ms = waited / steps.count / 1e6
    busy = ctx.device_busy.get(pid)
    effect = [f"each step waits {data_ms:.1f} ms for its batch: {units.pct(share)} of the step time "
              f"({step_ms:.1f} ms mean over {steps.count} steps)"]
    effect.append(f"the device was busy {units.pct(busy)} of the steps (measured)" if busy is not None else
                  "the trace has no device timeline (CPU only): that wait is time a GPU would idle")
    # workers needed so that batches come as fast as the rest of the step uses them
    # (one more for jitter), within what a host gives a DataLoader
    rest_ms = max(step_ms - data_ms, 0.1)
    needed = math.ceil(data_ms / rest_ms) + 1
    workers = min(max(2, needed), MAX_SUGGESTED_WORKERS)
    fix = []
    if inline:
        fix.append(f"DataLoader(num_workers={workers}, persistent_workers=True, pin_memory=True)   "
                   f"(num_workers=0: the loop builds every batch itself, {data_ms:.1f} ms of each step)")
    else:
        fix.append(f"DataLoader(num_workers={workers}, prefetch_factor=4, persistent_workers=True, pin_memory=True)   "
                   f"(the workers deliver a batch every {data_ms + rest_ms:.1f} ms; the step needs one every "
                   f"{rest_ms:.1f} ms)")
    if needed > MAX_SUGGESTED_WORKERS:
        fix.append(f"a batch takes {data_ms:.1f} ms to build against {rest_ms:.1f} ms of the rest of the step: "
                   f"{needed} workers would be needed")
    fix.append("make items cheaper: decode / augment on the GPU (DALI, torchvision.transforms.v2 on tensors), "
               "or cache preprocessed samples")
    return [Chain(
        rule_id=ID,
        severity="HIGH" if share >= T.high_wait_share else "MEDIUM",
        title=TITLE,
        root=[f"{label}: enumerate(DataLoader) spans cover {units.pct(share)} of its steps "
              f"({len(ev)} of {steps.count} steps at or above {units.pct(T.min_wait_share)})"
              + (", the batches built inline (num_workers=0)" if inline else "")],
        effect=effect,
        fix=fix,
        pids=[pid],
        evidence_windows=[Window(st.start_ns, st.end_ns) for st in ev],
        windows_total=steps.count,
        impact=share,
        numbers={"input_wait_share": round(share, 4), "input_wait_ns": waited,
                 "step_ms_mean": round(step_ms, 3), "inline_loading": float(inline)},
    )]
