"""cpu-contention: the loop thread wants a CPU and other processes have it.

Physics: every nanosecond a runnable thread waits for a CPU is lost wall
clock; a CUDA sync that completes while its thread waits in the run queue
returns late.  The cause metric is the loop thread's CPU wait per window:
time switched out while still runnable (kind='preempted') plus run-queue
latency after its wakeups.  Voluntary sleeps (waiting in a sync, on a queue)
are not contention and are not counted.  Nor is a preemption inside a sync
that spins or yields (CUDA's default) while the GPU still works: the sync
would have waited anyway; only the interval the sync returned right after
counts, from when the device finished in it (windows.LATE_SQL).  Nor is the
part of the wait the cgroup's CPU quota explains (ing_win.quota_wait_ns,
analyze/quota.py): that is cpu-quota's, and whoever ran while the loop was
throttled took nothing from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, kind, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit
from ingero.events.ops import SYNC_OPS

ID = "cpu-contention"
TITLE = "CPU scheduling contention → CUDA calls delayed"


@dataclass(frozen=True)
class Thresholds:
    # A window is evidence when the loop thread waits for a CPU at least this
    # share of it.  On an idle host a thread's run-queue wait is well under 1%
    # of wall clock; at 10% the loss is a tenth of the job's throughput.
    min_wait_share: float = 0.10
    # HIGH when the wait reaches a quarter of wall clock in evidence windows
    # (a quarter of the GPU's feed time gone), or throughput drops that much.
    high_wait_share: float = 0.25
    high_drop: float = 0.25
    # With clean windows to compare, the loop's CUDA call rate must fall by at
    # least this much where the cause is: smaller drops are within the
    # window-to-window noise of a healthy run (its rate varies by ~5-10%).
    min_drop: float = 0.15
    # A sync op is named in the effect when its p99 grows at least this much.
    min_p99_ratio: float = 2.0
    # Other processes are listed as busy when they used at least this share
    # of one CPU in the evidence windows.
    busy_cpu_share: float = 0.25
    # A preempting process is named when it took at least this share of the
    # loop's preempted time (the long tail of kworkers and daemons is noise).
    min_culprit_share: float = 0.05


T = Thresholds()

# Who took the CPU from the process' threads in the evidence windows.
PREEMPTORS_SQL = """
SELECT other_pid, sum(n) AS n, sum(off_ns) AS off_ns
FROM ing_preempt
WHERE pid = $pid AND list_contains($ws, w) AND other_pid <> 0 AND other_pid <> $pid
GROUP BY other_pid ORDER BY off_ns DESC, n DESC LIMIT 8
"""

# Busy processes host-wide in the same windows (process_cpu names them even
# when the preemption events are missing, e.g. wakeup latency).
BUSY_SQL = """
SELECT pid, any_value(comm) AS comm, sum(oncpu_ns) AS oncpu_ns, sum(preempted_traced) AS took
FROM ing_pcpu
WHERE list_contains($ws, w) AND pid <> $pid AND pid <> 0
GROUP BY pid HAVING sum(oncpu_ns) >= $min_oncpu_ns
ORDER BY oncpu_ns DESC LIMIT 8
"""

TRACED_SQL = "SELECT DISTINCT pid FROM ing_sched UNION SELECT pid FROM ing_loop"


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    loops = baseline.loop_threads(ctx)
    traced = {int(r[0]) for r in con.execute(TRACED_SQL).fetchall()}
    for pid, rows in baseline.windows_by_pid(ctx).items():
        chain = _evaluate_pid(con, ctx, pid, loops.get(pid, pid), _beyond_quota(rows), traced)
        if chain:
            chains.append(chain)
    return chains


def _beyond_quota(rows: list[baseline.Row]) -> list[baseline.Row]:
    """The rows with cpu_wait_ns less the part the CPU quota explains (copies: the rows are shared)."""
    if not any(r.get("quota_wait_ns") for r in rows):
        return rows
    return [{**r, "cpu_wait_ns": max(0.0, r["cpu_wait_ns"] - r["quota_wait_ns"])} for r in rows]


def _share(r: baseline.Row) -> float:
    return r["cpu_wait_ns"] / r["wall_ns"] if r["wall_ns"] else 0.0


def _evaluate_pid(con, ctx, pid, tid, rows, traced) -> Chain | None:
    s = baseline.split(rows, _share, T.min_wait_share)
    if not s.evidence:
        return None
    wait_share = baseline.mean_share(s.evidence, "cpu_wait_ns")
    base_rate, ev_rate, drop = baseline.throughput(s)
    raw_corr = baseline.correlation([_share(r) for r in rows], [baseline.ops_rate(r) for r in rows])
    corr = baseline.evidence_correlation(s, _share, baseline.ops_rate, expect=-1)
    if s.has_baseline:
        # time-aligned effect required: the loop is slower where it waits
        if drop < T.min_drop or (raw_corr is not None and raw_corr > 0):
            return None
        severity = "HIGH" if (wait_share >= T.high_wait_share or drop >= T.high_drop) else "MEDIUM"
    else:
        # present throughout: the waited time itself is the loss
        severity = "HIGH" if wait_share >= T.high_wait_share else "LOW"

    ws = [int(r["w"]) for r in s.evidence]
    ev_wall = sum(r["wall_ns"] for r in s.evidence)
    wait_ns = sum(r["cpu_wait_ns"] for r in s.evidence)
    preempt_n = sum(r["preempt_n"] for r in s.evidence)
    wake_ns = sum(r["wake_runq_ns"] for r in s.evidence)

    pre = con.execute(PREEMPTORS_SQL, {"pid": pid, "ws": ws}).fetchall()
    busy = con.execute(
        BUSY_SQL,
        {"pid": pid, "ws": ws, "min_oncpu_ns": T.busy_cpu_share * ctx.window_ns * len(ws)},
    ).fetchall()
    names = procs.lookup(con, [pid] + [r[0] for r in pre] + [r[0] for r in busy])
    me = names[pid]

    outsiders: dict[int, str] = {}
    own: dict[int, str] = {}
    kernel: list[int] = []
    tracer = procs.tracer_pid(con, ctx.session_id)
    tracer_took = ""
    total_off = sum(off for _, _, off in pre) or 1.0
    for other, n, off in pre:
        if off < T.min_culprit_share * total_off:
            continue
        if other == tracer:
            tracer_took = f"{units.count(n)} preemptions, {units.ns(off)} off-CPU"
            continue
        if other in names and names[other].is_kernel_thread:
            kernel.append(other)
            continue
        # the job's own processes: its workers, its parent launcher, ranks of the same launch;
        # another traced job (two scripts sharing a core) is a culprit like any process
        # (without parent pids, an older store: every traced process counts as the job's own)
        mine = procs.same_job(con, pid, other) or (other in traced and names.get(other) is not None
                                                    and names[other].ppid is None)
        bucket = own if mine else outsiders
        bucket[other] = f"{units.count(n)} preemptions, {units.ns(off)} off-CPU"
    for other, comm, oncpu, took in busy:
        if other in outsiders or other in kernel or other in own or other == tracer:
            continue
        if procs.same_job(con, pid, other) or (other in traced and other in names and names[other].ppid is None):
            if other not in traced:
                own[other] = f"{units.ns(oncpu)} on CPU"
            continue
        if other in names and names[other].is_kernel_thread:
            continue
        outsiders[other] = f"{units.ns(oncpu)} on CPU"
    culprits = [Culprit(p, names[p].name if p in names else str(p), d) for p, d in outsiders.items()]
    culprits += [Culprit(p, names[p].role(pid) if p in names else str(p), d + " (same job)") for p, d in own.items()]
    own_only = bool(own) and not outsiders
    if own_only and severity == "HIGH":
        # the job competes with itself: real, but the fix is its own sizing
        severity = "MEDIUM"

    root = [
        f"{units.count(preempt_n)} involuntary context switches on {me.label}",
        f"waiting for a CPU {units.ns(wait_ns)} of {units.ns(ev_wall)} "
        f"({units.pct(wait_share)} of the loop's time in {len(ws)} of {len(rows)} windows)",
    ]
    if outsiders:
        top = list(outsiders)[:3]
        root.append("CPU taken by " + ", ".join(f"{names[p].name} (PID {p})" for p in top if p in names))
    effect = []
    for op, clean_p99, ev_p99 in baseline.op_p99(ctx, pid, tid, SYNC_OPS, s)[:2]:
        if s.has_baseline and clean_p99 > 0 and ev_p99 >= T.min_p99_ratio * clean_p99:
            effect.append(
                f"{op} p99 {units.ratio(ev_p99, clean_p99)} baseline ({units.ns(clean_p99)} → {units.ns(ev_p99)})"
            )
    if s.has_baseline:
        effect.append(
            f"CUDA ops/s down {units.pct(drop)} from clean windows ({units.count(base_rate)} → {units.count(ev_rate)})"
        )
    else:
        effect.extend(_effect_without_baseline(ctx, pid, tid, s))
    contributing = []
    if outsiders:
        # named as the root names them (a hog that set its comm, e.g. 'cpu-hog', keeps its readable name)
        kinds = sorted({names[p].name for p in outsiders if p in names})
        contributing.append(f"{len(outsiders)} busy process{'es' if len(outsiders) != 1 else ''} "
                            f"({', '.join(kinds[:4])}) on {ctx.ncpu} cores")
    if own:
        kids = [p for p in own if p in names and names[p].child_of(pid)]
        if kids:
            contributing.append(
                f"{len(kids)} worker process{'es' if len(kids) != 1 else ''} of PID {pid} (its children: "
                f"{', '.join(str(p) for p in kids[:6])}) also took the CPU"
            )
        if len(own) > len(kids):
            n_own = len(own) - len(kids)
            contributing.append(f"{n_own} process{'es' if n_own != 1 else ''} of the same job also preempted the loop")
    if tracer_took:
        contributing.append(f"ingero's own tracer (PID {tracer}) took part of the CPU too ({tracer_took}): "
                            "the cost of tracing, not a culprit")
    if kernel:
        contributing.append("kernel threads: " + ", ".join(names[p].name for p in kernel[:4]))
    if wake_ns > 0:
        contributing.append(f"run-queue wait after wakeups {units.ns(wake_ns)}")
    in_waits = sum(r["wait_preempt_ns"] for r in s.evidence)
    if in_waits > 0:
        # spinning / yielding syncs (CUDA's default) are preempted while the GPU works
        late_hi = sum(r["late_hi_ns"] for r in s.evidence)
        late = sum(r["late_ns"] for r in s.evidence)
        # (a window table without the count, e.g. a fleet dataset's: the total alone)
        late_n = sum(r.get("late_n") or 0 for r in s.evidence)
        came = (f"{units.count(late_n)} sync{'s' if late_n != 1 else ''} returned {units.ns(late)} late in total, "
                f"{units.ns(late / late_n)} each on average" if late_n
                else f"the returns came {units.ns(late)} late in total")
        contributing.append(
            f"preempted {units.ns(in_waits)} inside syncs that spin or yield: {units.ns(in_waits - late_hi)} "
            f"while the GPU was still busy (no delay, not counted), {units.ns(late_hi)} right before the sync "
            f"returned (the GPU finished meanwhile: {came})"
        )
    # its children (or, in a store without parent pids, the traced processes counted as its own)
    workers_n = sum(1 for p in own if p in names and (names[p].child_of(pid) or names[p].ppid is None))
    fix = _fixes(ctx, me, [names[p] for p in outsiders if p in names], len(own), workers_n)
    return baseline.chain(
        ID, TITLE, ctx, pid, s,
        severity=severity,
        root=root,
        effect=effect,
        contributing=contributing,
        fix=fix,
        culprits=culprits,
        corr=corr,
        corr_note="CUDA ops/s fall as CPU wait rises",
        impact=wait_share,
        numbers={
            "cpu_wait_share": round(wait_share, 4),
            "cpu_wait_ns": wait_ns,
            "preemptions": preempt_n,
            "ops_per_s_clean": round(base_rate, 1),
            "ops_per_s_evidence": round(ev_rate, 1),
            "throughput_drop": round(drop, 4),
        },
    )


def _effect_without_baseline(ctx: Context, pid: int, tid: int, s: baseline.Split) -> list[str]:
    """The cause is in every window: no clean window to compare with.  Say so, and compare with
    what the run itself shows: the time the loop wanted a CPU against the time it got one, and
    the least- against the most-contended quarter of its windows when they differ."""
    rows = s.all
    wait = sum(r["cpu_wait_ns"] for r in rows)
    # on CPU = wall clock minus every off-CPU interval (sleeps, D state, preempted)
    oncpu = sum(max(0.0, r["wall_ns"] - r["off_ns"]) for r in rows)
    # runnable: on CPU, or waiting for a CPU (the wait for the quota too, cpu-quota's part)
    wanted = oncpu + wait + sum(r.get("quota_wait_ns", 0.0) for r in rows)
    out = [
        f"no clean window to compare with (CPU wait in {len(s.evidence)} of {len(rows)} active windows): "
        f"of the {units.ns(wanted)} the loop was runnable it ran {units.ns(oncpu)} "
        f"and waited {units.ns(wait)} ({units.pct(wait / wanted if wanted else 0.0)})"
    ]
    line = baseline.quartile_contrast(rows, _share, "CPU wait")
    if line:
        out.append(line)
    least, most = baseline.least_affected(rows, _share)
    if least and most:
        quiet = baseline.Split(evidence=most, clean=least, all=rows)
        for op, lo_p99, hi_p99 in baseline.op_p99(ctx, pid, tid, SYNC_OPS, quiet)[:1]:
            if lo_p99 > 0 and hi_p99 >= T.min_p99_ratio * lo_p99:
                out.append(
                    f"{op} p99 {units.ratio(hi_p99, lo_p99)} the least-contended windows' "
                    f"({units.ns(lo_p99)} → {units.ns(hi_p99)})"
                )
    return out


def _gpu_jobs_fixes(ctx: Context, me: procs.Proc, loops: list[procs.Proc]) -> list[str]:
    """The loop preempted by other GPU loops (two jobs on one core): each job its own cores, the
    same split whichever job's chain says it (lowest PID on the last core, and down), so the
    chains of both jobs give one plan; "taskset -c LAST" told to each put them together again."""
    jobs = sorted([me, *loops], key=lambda p: p.pid)
    if ctx.ncpu < len(jobs):
        return [f"{len(jobs)} GPU loops share {ctx.ncpu} core{'s' if ctx.ncpu != 1 else ''} "
                f"(PIDs {', '.join(str(p.pid) for p in jobs)}): no split gives each a core; run them one after "
                "another, or move one to another host"]
    return [f"taskset -acp {ctx.ncpu - 1 - i} {p.pid}   ({p.name}: a core of its own; every GPU loop here gets one)"
            for i, p in enumerate(jobs)]


def _fixes(ctx: Context, me: procs.Proc, outsiders: list[procs.Proc], own_n: int, workers_n: int) -> list[str]:
    fix = []
    cuda_loops = set(baseline.windows_by_pid(ctx))
    loops = [p for p in outsiders if p.pid in cuda_loops]
    if loops:
        fix += _gpu_jobs_fixes(ctx, me, loops)
        outsiders = [p for p in outsiders if p not in loops]
    elif ctx.ncpu >= 2:
        last = ctx.ncpu - 1
        fix.append(f"taskset -c {last} {me.command}   (give the loop its own core)")
        fix.append(f"taskset -acp {last} {me.pid}   (the same for the running process)")
        if outsiders:
            others = " ".join(str(p.pid) for p in outsiders)
            rest = "0" if last == 1 else f"0-{last - 1}"
            fix.append(f"taskset -acp {rest} {others}   (keep {', '.join(sorted({p.name for p in outsiders}))} off it)")
    if outsiders:
        pids = " ".join(str(p.pid) for p in outsiders)
        fix.append("renice -n 19 -p " + pids)
        if ctx.sched_autogroup:
            # Where the kernel groups CPU time per session, renice orders processes only
            # inside their own session: against a loop in another one it changes nothing
            # (measured: 3 hogs at nice 19, loop 40 steps/s vs 42 at nice 0; at autogroup
            # nice 19, 86).  The session's autogroup nice is what reaches across.
            fix.append(f"for p in {pids}; do echo 19 > /proc/$p/autogroup; done   "
                       "(autogroups are on: renice alone does not reach across sessions)")
    if own_n and kind.of(ctx, me.pid).kind == kind.SERVER:
        fix.append(f"the server's own processes take the loop's CPU: size its worker pool to the {ctx.ncpu} cores "
                   "less the GPU loop's, and pin the loop (taskset) apart from them")
    elif workers_n:  # its children (DataLoader workers): a DataLoader is what sizes them
        workers = max(1, ctx.ncpu - 1)
        fix.append(
            f"DataLoader(num_workers={workers}, persistent_workers=True)   "
            f"(at most one worker per spare core: {ctx.ncpu} cores; workers of PID {me.pid})"
        )
    return fix
