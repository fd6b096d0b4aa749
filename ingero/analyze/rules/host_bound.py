"""host-bound: the GPU idles while the loop thread works on the CPU outside every CUDA call.

Physics: after a sync (or a synchronous copy) returns, nothing of the loop's
is queued on the device until its next launch or copy (analyze/device/__init__.py:
the time between a drain's return and the next submission is when the
device surely idled).  Whatever the loop thread does then is on the step's
critical path.  Per window of the loop thread, the rule takes that surely
idle time and the thread's breakdown (analyze/traced_steps.py) over the same
window: of the idle time, the part the thread spent on CPU outside CUDA
calls is this rule's cause.  Sleeping there is waiting for data
(input-bound), runnable but off CPU is CPU wait (cpu-contention), D state
and faults are io-stall / memory-pressure: each is taken out, so no time
is counted by two rules.  Host work *between* a step's launches, while
kernels are queued, is launch pacing (launch-bound), not this rule.

Inline data loading (``DataLoader(num_workers=0)``) is the classic case: the
loop builds each batch on its own thread between the last sync of a step
and the copy that starts the next.  Named as such when the CPU samples of
``--stack`` show DataLoader frames, or, without them, when the loop has no
worker processes and the idle host work precedes the step's copy to the
device (the batch).  The fix then gives the worker count the step needs.

An imported profiler trace has no scheduler rows, but it has what the call
stream only bounds: the device's own timeline, and the CPU operators the
process ran.  There the rule takes, per marked step, the time the device ran
nothing while the process was inside a CPU operator and outside every CUDA
call and DataLoader span (analyze/device/imported.py: device_idle); the operators
that held it are named.  Time between operators (Python, or asleep: the trace
cannot tell) is not counted.  This is how real PyTorch jobs are host-bound:
the device finishes each operator's small kernels before the host has
dispatched the next, and no sync is in sight (real A100 trace: the device
idle 76% of a 222 ms step, 61% of it inside the host's operators).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ingero.analyze import activity, baseline, cpu_samples, kind, procs, saves, traced_steps, units

from ingero.analyze.device import imported
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Window
from ingero.analyze.rules import sync_heavy
from ingero.events.ops import COPY_OPS

ID = "host-bound"
TITLE = "Host-bound outside CUDA: the GPU idles while the loop works on the CPU"


@dataclass(frozen=True)
class Thresholds:
    # Evidence window: the loop thread was on CPU outside CUDA calls with nothing
    # queued on the device for at least this share of wall clock.  The same bar as
    # input-bound's wait for data (a fed loop's between-step Python is a few percent
    # of its step: the healthy demo's 0.5 ms of a 16.5 ms step is 3%).
    min_host_idle_share: float = 0.20
    high_host_idle_share: float = 0.40
    # The effect: the window's inferred device busy share is below this.  At or above
    # it the device is not waiting for the host (explain's DEVICE_BUSY_NOT_HIGH).
    max_device_busy_share: float = 0.90
    # The idle host work prepares the batch when at least this share of it comes right
    # before a copy to the device (the step's first submission is the batch's H2D).
    batch_first_share: float = 0.5
    # More DataLoader workers than this rarely help one GPU's loop (input-bound's bound).
    max_suggested_workers: int = 8
    # Samples outside CUDA calls at least this share in DataLoader frames: the
    # loader runs on the loop thread.
    loader_sample_share: float = 0.5


T = Thresholds()


@dataclass(frozen=True)
class IdleSplit:
    """One window of the loop thread: where the device's idle time went (ns of wall clock)."""

    w: int
    wall_ns: float
    host_ns: float  # on CPU outside CUDA calls, anywhere in the window (less a save's, saves.py)
    idle_ns: float  # nothing of the process queued on the device (surely idle)
    host_idle_ns: float  # the loop on CPU outside CUDA calls with the device idle (this rule's cause):
    #                       in idle_ns, and in the tail below
    launch_idle_ns: float  # device idle while the step's work was being issued (launch pacing)
    tail_ns: float  # of host_idle_ns: after the step's last launch, before its sync, the queued work done
    busy_share: float  # inferred device busy share of the window (point estimate)
    cpu_wait_ns: float  # the loop runnable but off CPU (cpu-contention's cause), in calls or not


# Of the surely idle time (a drain's return to the next submission): the part
# that came right before a copy (the step's batch), per process.
BATCH_FIRST_SQL = """
WITH seg AS (
    SELECT w, seg, min(t) FILTER (dr = 0 AND role IN ('submit', 'copy')) AS s1,
           arg_min(op, pos) FILTER (dr = 0 AND role IN ('submit', 'copy')) AS first_op,
           max(pos) FILTER (dr = 1) AS r
    FROM ing_dev_seq WHERE pid = $pid AND list_contains($ws, w) GROUP BY w, seg
), g AS (
    SELECT first_op, s1 - lag(r) OVER (PARTITION BY w ORDER BY seg) AS gap FROM seg
)
SELECT coalesce(sum(gap) FILTER (list_contains($copy_ops, first_op)), 0), coalesce(sum(gap), 0)
FROM g WHERE gap > 0
"""

WORKERS_SQL = "SELECT DISTINCT pid FROM ing_helper WHERE list_contains($ws, w)"


def idle_split(ctx: Context, pid: int) -> dict[int, IdleSplit]:
    """Per active window of ``pid``'s loop thread: its device idle time by cause (cached on ctx)."""
    cache = ctx.derived.host_idle_split
    if pid in cache:
        return cache[pid]
    out: dict[int, IdleSplit] = {}
    cache[pid] = out
    rows = baseline.windows_by_pid(ctx).get(pid, [])
    tid = baseline.loop_threads(ctx).get(pid)
    act = activity.device_activity(ctx).get(pid)
    if not rows or tid is None or act is None:
        return out
    dev = {wb.w: wb for wb in act.windows}
    parts = traced_steps.window_parts(ctx, pid, tid, [int(r["w"]) for r in rows])
    saved = saves.cpu_ns_by_window(ctx.con, pid)
    for w, p in parts.items():
        wb = dev.get(w)
        if wb is None or wb.span_ns <= 0 or p.wall_ns <= 0:
            continue
        span = float(wb.span_ns)
        idle = max(0.0, span - wb.high_ns) / span * p.wall_ns
        # what else the thread did while nothing was queued: waited for data, for a CPU,
        # for the disk or a fault, or sat in another CUDA call (cudaMalloc, ...)
        other = p.data_wait_idle_ns + p.cpu_wait_out_ns + p.faults_io_ns + p.other_cuda_ns
        # the CPU side of a checkpoint saved in the step (saves.py) is io-stall's, with its fsync
        save = min(p.host_ns, saved.get(w, 0.0))
        host = p.host_ns - save
        surely = min(host, max(0.0, idle - other - save))
        # the device ran out of queued work after the last launch while the loop worked on
        # (logging, metrics) before its sync: analyze/device/__init__.py's tail, host work like the above; less
        # the loop's sleeps with work queued (a wait for data there is input-bound's, and the
        # tail may be all of it: reviewed, 1 ms asleep read as 610 µs of host work)
        queued_sleep = max(0.0, p.asleep_ns - p.data_wait_idle_ns)
        tail = min(max(0.0, host - surely), max(0.0, wb.tail_ns / span * p.wall_ns - queued_sleep))
        out[w] = IdleSplit(
            w=w, wall_ns=p.wall_ns, host_ns=host, idle_ns=idle,
            host_idle_ns=surely + tail,
            launch_idle_ns=max(0.0, wb.high_ns - wb.point_ns - wb.tail_ns) / span * p.wall_ns,
            tail_ns=tail,
            busy_share=wb.point_ns / span,
            cpu_wait_ns=p.cpu_wait_ns,
        )
    return out


def _sync_heavy(r: baseline.Row) -> bool:
    """sync-heavy's cause in the window (its thresholds)."""
    secs = r["wall_ns"] / 1e9
    return (r["launch_n"] > 0 and secs > 0 and r["sync_n"] / secs >= sync_heavy.T.min_syncs_per_s
            and r["sync_n"] / r["launch_n"] >= sync_heavy.T.min_syncs_per_launch)


def evaluate(con, ctx: Context) -> list[Chain]:
    if ctx.imported_from:
        return _from_trace(con, ctx)
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        split = idle_split(ctx, pid)
        if not split:
            continue

        def share(r: baseline.Row) -> float:
            x = split.get(int(r["w"]))
            return x.host_idle_ns / x.wall_ns if x else 0.0

        def own_cause(r: baseline.Row) -> bool:
            # the device idles, the loop's own work is a bigger loss than its wait for a CPU
            # (where other processes take more of the step, cpu-contention is the cause), and
            # the idle gaps are not the turn-taking of a sync-heavy loop (a sync every few
            # launches: the host time after each is sync-heavy's, gone with the syncs)
            x = split.get(int(r["w"]))
            return (x is not None and x.busy_share < T.max_device_busy_share
                    and x.host_idle_ns >= x.cpu_wait_ns and not _sync_heavy(r))

        s = baseline.split(rows, share, T.min_host_idle_share, also=own_cause)
        if not s.evidence:
            continue
        chains.append(_chain(con, ctx, pid, rows, s, [split[int(r["w"])] for r in s.evidence], share))
    return chains


def _chain(con, ctx: Context, pid: int, rows: list, s: baseline.Split, ev: list[IdleSplit], share) -> Chain:
    ws = [x.w for x in ev]
    wall = sum(x.wall_ns for x in ev)
    host_idle = sum(x.host_idle_ns for x in ev)
    tail = sum(x.tail_ns for x in ev)  # of host_idle: after the step's last launch, before its sync
    impact = host_idle / wall
    host_share = sum(x.host_ns for x in ev) / wall
    idle_share = sum(x.idle_ns for x in ev) / wall
    launch_idle = sum(x.launch_idle_ns for x in ev) / wall
    busy = sum(x.busy_share * x.wall_ns for x in ev) / wall
    me = procs.lookup(con, [pid])[pid]
    tid = baseline.loop_threads(ctx).get(pid, pid)

    workers = [int(r[0]) for r in con.execute(WORKERS_SQL, {"ws": ws}).fetchall()]
    names = procs.lookup(con, workers)
    if any(n.ppid is not None for n in names.values()):
        workers = [w for w in workers if names[w].child_of(pid)]
    before_copy, gaps = con.execute(BATCH_FIRST_SQL, {"pid": pid, "ws": ws, "copy_ops": list(COPY_OPS)}).fetchone()
    # (host work in the tail comes after the step's launches, not before its batch's copy)
    batch_first = float(before_copy) / (float(gaps) + tail) if gaps else 0.0
    sampled = cpu_samples.top_lines(ctx, tid, ws, idle_first=True)
    by_samples = sampled is not None and sampled.outside > 0
    inline = (sampled.loader_share >= T.loader_sample_share if by_samples else False) or (
        not workers and batch_first >= T.batch_first_share)

    found = activity.rhythm_steps(ctx, pid)
    step_ms = found.mean_ms if found is not None else None
    root = [
        f"{me.label} was on CPU outside CUDA calls while the GPU had nothing to run {units.ns(host_idle)} "
        f"of {units.ns(wall)} ({units.pct(impact)} of the loop's time in {len(ev)} of {len(rows)} windows)",
    ]
    if step_ms:
        per = step_ms * 1e6 / wall  # ns of a mean step per ns of the windows
        parts = [f"{units.ns((host_idle - tail) * per)} of host work between the step's last sync and its next "
                 f"launch or copy"] if host_idle - tail >= 0.005 * wall else []
        if tail >= 0.005 * wall:
            parts.append(f"{units.ns(tail * per)} after its last launch, before its sync, the queued work done")
        if host_share - impact >= 0.005:
            parts.append(f"{units.ns(step_ms * (host_share - impact) * 1e6)} more while work was queued")
        root.append(f"per step ({units.ns(found.median_ms * 1e6)} p50): {', '.join(parts)}")
    served = kind.of(ctx, pid)
    if served.kind == kind.SERVER:
        inline = False  # a server builds no batches: its host work is the request path
        root.append(f"an {served.kind}: {served.evidence}; the host work is its request path "
                    "(preprocessing, formatting, Python)")
    elif inline and by_samples and sampled.loader_share >= T.loader_sample_share:
        root.append(f"the DataLoader runs on the loop thread: {units.pct(sampled.loader_share)} of the CPU samples "
                    f"outside CUDA calls are in torch.utils.data (num_workers=0)")
    elif inline:
        root.append("inline data loading: no DataLoader worker processes, and the host work comes right before "
                    f"the step's copy to the device ({units.pct(batch_first)} of it): the loop builds each batch "
                    "itself (num_workers=0)")
    elif workers:
        root.append(f"{len(workers)} DataLoader worker process{'es' if len(workers) != 1 else ''} feed it: "
                    "the host work is the loop's own Python (optimizer step, metrics, logging)")

    effect = [
        f"GPU idle: inferred busy {units.pct(busy)} in these windows; nothing queued for {units.pct(idle_share)} "
        f"of wall clock{f', the queued work done before the sync for {units.pct(tail / wall)}' if tail else ''}; "
        f"{units.pct(impact)} of wall clock the loop worked on the CPU meanwhile",
        f"not launch overhead: the device ran dry while launches were issued only {units.pct(launch_idle)} "
        f"of wall clock",
    ]
    base_rate, ev_rate, drop = baseline.throughput(s)
    if s.has_baseline and drop > 0:
        effect.append(f"CUDA ops/s down {units.pct(drop)} from clean windows "
                      f"({units.count(base_rate)} → {units.count(ev_rate)})")
    elif not s.has_baseline:
        line = baseline.quartile_contrast(rows, share, "host work outside CUDA")
        effect.append(line or f"throughout the run: {len(ev)} of {len(rows)} active windows, no clean window "
                      "to compare with")

    contributing = []
    if by_samples:
        contributing.append(f"sampled on CPU outside CUDA calls with nothing queued on the GPU: {sampled.idle:,} "
                            f"of {sampled.total:,} samples of the loop thread at ~99 Hz; the top lines:")
        contributing += [f"  {x.idle_samples / sampled.idle * 100:4.1f}%  {x.text()}" for x in sampled.lines[:3]
                         if x.idle_samples]
    elif sampled is None:
        contributing.append("trace with --stack to name the Python lines (a ~99 Hz CPU sample of the loop thread)")

    if served.kind == kind.SERVER:
        fix = _server_fixes(me, served, impact)
    else:
        fix = _fixes(ctx, me, inline, step_ms, impact, len(workers))
    if tail >= 0.5 * host_idle:
        fix.insert(0, "the work between the step's last launch and its sync runs with the GPU done: launch the "
                      "next step's work before it, or read the results a step later (non_blocking copies) and "
                      "sync after the bookkeeping")
    corr = baseline.evidence_correlation(s, share, baseline.ops_rate, expect=-1)
    numbers = {
        "host_idle_share": round(impact, 4),
        "host_tail_share": round(tail / wall, 4),
        "host_share": round(host_share, 4),
        "device_idle_share": round(idle_share, 4),
        "launch_idle_share": round(launch_idle, 4),
        "device_busy_share": round(busy, 4),
        "batch_first_share": round(batch_first, 4),
        "inline_loading": float(inline),
        "workers": len(workers),
        "throughput_drop": round(drop, 4),
    }
    if step_ms:
        numbers["step_ms_mean"] = round(step_ms, 3)
        numbers["host_idle_ms_per_step"] = round(step_ms * impact, 3)
    if by_samples:
        numbers["samples_outside_cuda"] = sampled.outside
        numbers["samples_idle"] = sampled.idle
        numbers["loader_sample_share"] = round(sampled.loader_share, 4)
    return baseline.chain(
        ID, TITLE, ctx, pid, s,
        severity="HIGH" if impact >= T.high_host_idle_share else "MEDIUM",
        root=root, effect=effect, contributing=contributing, fix=fix, corr=corr,
        corr_note="CUDA ops/s fall as host work outside CUDA grows", impact=impact, numbers=numbers,
    )


def workers_needed(load_ms: float, step_ms: float, t: Thresholds = T) -> tuple[int, int]:
    """(suggested, needed) DataLoader workers so batches come as fast as the rest of the step uses
    them: a worker builds one in ``load_ms``, the step without loading takes the rest (one more
    for jitter), as input-bound computes it for marked traced_steps."""
    rest_ms = max(step_ms - load_ms, 0.1)
    needed = math.ceil(load_ms / rest_ms) + 1
    return min(max(2, needed), t.max_suggested_workers), needed


def _server_fixes(me: procs.Proc, served: kind.Kind, impact: float) -> list[str]:
    """A server's host work per request is its request path: preprocessing, formatting, Python."""
    per = (f", {impact * 1e3 / served.requests_per_s:.2f} ms of CPU per request at "
           f"{served.requests_per_s:,.1f} requests/s" if served.requests_per_s else "")
    return [
        f"take preprocessing off the request path{per}: a compiled tokenizer (the tokenizers library's "
        "encode_batch), or a tokenizer thread or process pool handing ready tensors to the GPU loop",
        "batch requests: run one forward per batch of waiting requests (dynamic batching), so each host "
        "step feeds the GPU more work",
        f"py-spy top --pid {me.pid}   (see which Python lines of the request path take the CPU)",
    ]


def _fixes(ctx: Context, me: procs.Proc, inline: bool, step_ms: float | None, impact: float,
           n_workers: int) -> list[str]:
    fix = []
    if inline:
        if step_ms:
            load_ms = step_ms * impact
            workers, needed = workers_needed(load_ms, step_ms)
            fix.append(f"DataLoader(num_workers={workers}, persistent_workers=True, pin_memory=True)   "
                       f"(num_workers=0: the loop builds every batch itself, {load_ms:.2f} ms of each "
                       f"{step_ms:.2f} ms step; {workers} workers deliver one every "
                       f"{load_ms / workers:.2f} ms, the rest of the step takes {step_ms - load_ms:.2f} ms)")
            if needed > T.max_suggested_workers:
                fix.append(f"a batch takes {load_ms:.2f} ms to build against {step_ms - load_ms:.2f} ms for the "
                           f"rest of the step: {needed} workers would be needed; make items cheaper")
        else:
            workers = min(max(2, math.ceil(impact / max(1e-3, 1 - impact)) + 1), T.max_suggested_workers)
            fix.append(f"DataLoader(num_workers={workers}, persistent_workers=True, pin_memory=True)   "
                       f"(num_workers=0: the loop builds every batch itself, {units.pct(impact)} of wall clock)")
        if ctx.ncpu <= 2:
            fix.append(f"this host has {ctx.ncpu} CPUs: workers share them with the loop; keep the loop on its "
                       "own core (taskset) and the workers off it")
    else:
        fix.append("take per-step Python off the critical path: queue the next step's work before it "
                   "(launch, then do the bookkeeping while the GPU runs), log/compute metrics every N steps")
        fix.append("capture the step in a CUDA graph / torch.compile(mode=\"reduce-overhead\") only helps "
                   "the launch part; host work between steps stays")
    fix.append(f"py-spy top --pid {me.pid}   (see where the loop's CPU time goes)")
    return fix


def _from_trace(con, ctx: Context) -> list[Chain]:
    """host-bound from an imported profiler trace: per marked step, the device idle while the
    process was in a CPU operator outside CUDA calls and data loading (imported.device_idle)."""
    marked = ctx.marked_steps
    thread = imported.step_thread(con, ctx.session_id)
    if marked is None or thread is None or marked.steps[0].device_busy_ns is None:
        return []  # no steps, or no device timeline (a CPU-only trace): nothing to hold it to
    pid, tid = thread
    swept = imported.device_idle(con, ctx.session_id, marked, pid)
    idle = [x for x in swept.steps if x.wall_ns > 0]
    wall = sum(x.wall_ns for x in idle)
    host = sum(x.host_ns for x in idle)
    if not wall:
        return []
    impact = host / wall

    def busy(x: imported.StepIdle) -> float:
        return x.step.device_busy_share or 0.0

    ev = [x for x in idle if x.host_ns / x.wall_ns >= T.min_host_idle_share and busy(x) < T.max_device_busy_share]
    if impact < T.min_host_idle_share or len(ev) * 2 < len(idle):
        return []
    me = procs.lookup(con, [pid]).get(pid)
    label = me.label if me else f"PID {pid}"
    n = len(idle)
    step_ms = wall / n / 1e6
    dev_busy = sum(busy(x) * x.wall_ns for x in idle) / wall
    idle_share = sum(x.idle_ns for x in idle) / wall
    launch = sum(x.launch_ns for x in idle) / wall
    unrecorded = sum(x.unrecorded_ns for x in idle) / wall
    data = sum(x.data_ns for x in idle) / wall
    root = [
        f"{label} was in CPU operators outside every CUDA call with the GPU running nothing "
        f"{units.ns(host)} of {units.ns(wall)} ({units.pct(impact)} of its steps; {len(ev)} of {n} steps "
        f"at or above {units.pct(T.min_host_idle_share)})",
        f"per step ({step_ms:.1f} ms mean): {step_ms * impact:.1f} ms of operator work with the GPU idle, "
        f"{step_ms * launch:.1f} ms inside launch calls, {step_ms * unrecorded:.1f} ms between operators",
    ]
    effect = [
        f"GPU idle: measured busy {units.pct(dev_busy)} of the steps (the trace's device timeline); it ran "
        f"nothing for {units.pct(idle_share)} of them, {units.pct(impact)} while the host dispatched operators",
        f"not the input pipeline: the GPU idled inside DataLoader spans {units.pct(data)} of the steps"
        if data < T.min_host_idle_share else
        f"the GPU also idled while the loop waited for data, {units.pct(data)} of the steps (input-bound's)",
    ]
    top = swept.host_ops(tid)
    contributing = ["the operators that held that time (outermost per thread), per step:"] if top else []
    contributing += [f"  {ns / host * 100:4.1f}%  {name}  ({ns / n / 1e6:.1f} ms)" for name, ns in top]
    fix = [
        "fewer, larger kernels per step: the GPU finishes each operator's kernels before the host has "
        "dispatched the next (a larger batch per GPU, torch.compile to fuse operators)",
        "issue the step in one launch: CUDA graphs (torch.compile(mode=\"reduce-overhead\"), "
        "torch.cuda.CUDAGraph) take the per-operator dispatch off the GPU's critical path",
    ]
    if top:
        fix.append(f"profile the top operator ({top[0][0]}) with torch.profiler(with_stack=True) or py-spy: "
                   "its host time is what the GPU waits for")
    return [Chain(
        rule_id=ID, severity="HIGH" if impact >= T.high_host_idle_share else "MEDIUM", title=TITLE,
        root=root, effect=effect, contributing=contributing, fix=fix, pids=[pid],
        evidence_windows=[Window(x.step.start_ns, x.step.end_ns) for x in ev], windows_total=n,
        impact=impact,
        numbers={"host_idle_share": round(impact, 4), "device_busy_share": round(dev_busy, 4),
                 "device_idle_share": round(idle_share, 4), "launch_idle_share": round(launch, 4),
                 "unrecorded_idle_share": round(unrecorded, 4), "step_ms_mean": round(step_ms, 3),
                 "host_idle_ms_per_step": round(step_ms * impact, 3)},
    )]
