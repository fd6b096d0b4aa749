"""straggler: one rank of a job late into its collectives, every other rank waiting for it.

Physics: in data-parallel training every rank enters the step's collective
(the gradients' all-reduce) and NCCL starts it only when the last rank is
in; the others stand in it (and in the stream sync after it) until then.
So the rank that enters last sets everybody's pace, and the time the others
wait is the job's loss.  With NCCL calls traced (ingero.analyze.collectives
ties the ranks of a job together and lines up their k-th collectives), per
collective: each rank's entry lag behind the median rank; the last one is
late when its lag passes a threshold taken from the run itself - MAD_K
times the run's lag noise (the median over ranks of the robust spread,
1.4826 x the median absolute deviation, of a rank's step-to-step change in
lag: it measures jitter, not a rank that is late all along).  One rank late
in most late steps is a straggler with a cause of its own, read from its
own window metrics in the windows where it was late, against the other
ranks' in the same windows (CPU wait and who took the CPU, input wait, I/O,
page faults).  Late steps spread over the ranks are a rotating straggler:
no single culprit (LOW: the cause is what the ranks share, and per-rank
chains name it).

Without NCCL calls (processes of one job not traced as ranks) the rule
falls back to comparing processes on one host: the same loop (same shape)
at a lower launch rate in the same windows is the straggler.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from ingero.analyze import baseline, collectives, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit, Window
from ingero.analyze.rules import cpu_contention

ID = "straggler"
# A device "busy" in a collective is NCCL's kernel spinning on the GPU until the last rank
# comes: busy time is no evidence against a straggler (explain's device gate does not apply).
DEVICE_SIDE = True
TITLE = "Straggler: one process runs slower than its peers"
TITLE_RANK = "Straggler rank → every other rank waits in the collective"
TITLE_ROTATING = "Rotating straggler: ranks take turns entering the collective late"

@dataclass(frozen=True)
class Thresholds:
    # Slowest process' launch rate below this fraction of the peers' median
    # (same windows): ranks of one job differ by a few percent when healthy.
    max_rate_ratio: float = 0.75
    high_rate_ratio: float = 0.5
    # Peers compared only over windows where all of them were active, at least this many.
    min_common_windows: int = 3
    # Same work: kernel launches per sync (the step's shape) within this factor.
    max_shape_ratio: float = 1.5
    # ---- ranks of an NCCL job
    # A collective's last rank is late when its lag behind the median rank exceeds
    # mad_k x the run's lag noise: 3 robust standard deviations, the usual outlier cut
    # of a median-absolute-deviation test (a normal jitter passes it 0.3% of the time).
    mad_k: float = 3.0
    # The noise is never taken below this: a uprobe costs 1-7 us here and two ranks'
    # clocks read the same CLOCK_MONOTONIC; 50 us is far below any step.
    min_noise_ns: float = 50_000.0
    # Collectives seen in every rank before a judgement (a few seconds of steps).
    min_steps: int = 20
    # Late windows (or collectives) must be at least this share of all, and at least
    # min_late_windows windows: a straggler now and then is jitter, not a pattern.
    min_late_share: float = 0.2
    min_late_windows: int = 2
    # A window's median lag is judged over at least this many collectives (a 1 s window
    # holds 10-100 steps of a training job).
    min_window_collectives: int = 3
    # One rank is the straggler when it is the late one in at least this share of the
    # late collectives; below, the lateness rotates between ranks.
    fixed_share: float = 0.6
    # A window is evidence when the straggler was late in at least half of its collectives.
    window_late_share: float = 0.5
    # Severity from the waiting ranks' share of wall clock spent waiting for it (evidence
    # windows): MEDIUM from 5%, HIGH from 20% (as cpu-contention's quarter of wall clock,
    # a little lower: every waiting rank loses it).
    min_wait_share: float = 0.05
    high_wait_share: float = 0.20
    # The late rank's own cause is named when its share of wall clock exceeds the other
    # ranks' median in the same windows by at least this much.
    min_cause_excess: float = 0.02
    # ... and that excess, per step, accounts for at least this share of how much later than
    # the others it enters: otherwise its own evidence does not explain its lateness (when
    # every rank carries the same cause, see shared_cause_share, the job is contended as a whole).
    min_cause_explains: float = 0.5
    # A cause every rank carries, each at least this share of its wall clock (cpu-contention's
    # evidence threshold), is shared: the job is contended as a whole, the straggler is LOW.
    shared_cause_share: float = 0.10
    # A preempting process is named when it took at least this share of the rank's preempted time.
    min_culprit_share: float = 0.05


T = Thresholds()

# Why it is slower: the loop-thread shares compared with the peers.
REASONS = (
    ("cpu_wait_ns", "waiting for a CPU"),
    ("io_ns", "in uninterruptible I/O"),
    ("sleep_out_ns", "waiting outside CUDA calls"),
    ("copy_ns", "inside copies"),
)


def _launches_per_sync(rows: list[baseline.Row]) -> float:
    launches = sum(r["launch_n"] for r in rows)
    syncs = sum(r["sync_n"] for r in rows)
    return launches / syncs if syncs else float(launches)


def _similar(a: float, b: float) -> bool:
    if a <= 0 or b <= 0:
        return a == b
    return max(a, b) / min(a, b) <= T.max_shape_ratio


def evaluate(con, ctx: Context) -> list[Chain]:
    jobs = collectives.jobs(ctx)
    if jobs:
        chains = []
        for job in jobs:
            chain = _job_chain(con, ctx, job)
            if chain:
                chains.append(chain)
        return chains
    return _rate_chains(con, ctx)


def _rate_chains(con, ctx: Context) -> list[Chain]:
    by_pid = baseline.windows_by_pid(ctx)
    if len(by_pid) < 2:
        return []
    common = set.intersection(*[{int(r["w"]) for r in rows} for rows in by_pid.values()])
    if len(common) < T.min_common_windows:
        return []
    rows = {pid: [r for r in rs if int(r["w"]) in common] for pid, rs in by_pid.items()}
    rate = {pid: sum(r["launch_n"] for r in rs) / (sum(r["wall_ns"] for r in rs) / 1e9) for pid, rs in rows.items()}
    slow = min(rate, key=rate.get)
    # Peers run the same loop: about as many kernels per sync (per step).
    shape = {pid: _launches_per_sync(rs) for pid, rs in rows.items()}
    same = [p for p in rate if p != slow and _similar(shape[p], shape[slow])]
    if not same:
        return []
    rate = {p: rate[p] for p in [slow, *same]}
    peers = [rate[p] for p in rate if p != slow]
    peer_rate = baseline.median(peers)
    if peer_rate <= 0 or rate[slow] >= T.max_rate_ratio * peer_rate:
        return []
    ratio = rate[slow] / peer_rate
    names = procs.lookup(con, list(rate))
    me = names[slow]

    def share(pid: int, key: str) -> float:
        return baseline.mean_share(rows[pid], key)

    diffs = sorted(
        ((share(slow, k) - baseline.median([share(p, k) for p in rate if p != slow]), k, label)
         for k, label in REASONS),
        reverse=True,
    )
    gap, key, label = diffs[0]
    root = [
        f"{me.label} launches {units.count(rate[slow])}/s vs {units.count(peer_rate)}/s for its "
        f"{len(peers)} peer(s) ({units.pct(1 - ratio)} slower) over {len(common)} common windows",
    ]
    fix = []
    if gap > 0.02:
        root.append(
            f"it spends {units.pct(share(slow, key))} {label} vs "
            f"{units.pct(baseline.median([share(p, key) for p in rate if p != slow]))} for its peers"
        )
        if key == "cpu_wait_ns":
            fix.append(f"taskset -cp <its own cores> {slow}   (pin each rank to separate cores)")
        elif key == "io_ns":
            fix.append(f"check the disk/mount {me.name} reads from; stagger checkpoint writes across ranks")
        elif key == "sleep_out_ns":
            fix.append(f"give {me.name} (PID {slow}) more DataLoader workers or a local copy of its data shard")
        else:
            fix.append("use pinned host buffers on this rank (pin_memory=True)")
    fix.append(f"compare: ingero explain --pid {slow}")
    return [
        Chain(
            rule_id=ID,
            severity="HIGH" if ratio <= T.high_rate_ratio else "MEDIUM",
            title=TITLE,
            root=root,
            effect=[f"every peer waits for it at each collective: the job runs at {units.pct(ratio)} of peer speed"],
            fix=fix,
            pids=[slow],
            evidence_windows=baseline.evidence_windows(ctx, rows[slow]),
            windows_total=len(by_pid[slow]),
            impact=1 - ratio,
            numbers={"rate_ratio": round(ratio, 4), "launches_per_s": round(rate[slow], 1),
                     "peer_launches_per_s": round(peer_rate, 1)},
        )
    ]


# ---- ranks of an NCCL job ----------------------------------------------------------

# 1.4826 x MAD estimates a standard deviation for normal data; a difference of two
# independent lags has sqrt(2) times the spread of one.
MAD_TO_SIGMA = 1.4826

# The late rank's own evidence, per window (ing_win), against the other ranks':
# (column, what it is, the diagnosing rule whose chain it is for that process).
RANK_CAUSES = (
    ("cpu_wait_ns", "preempted (runnable, waiting for a CPU)", "cpu-contention"),
    ("sleep_out_ns", "waiting for its input (asleep outside CUDA calls)", "input-bound"),
    ("io_ns", "in uninterruptible I/O", "io-stall"),
    ("faults_ns", "in page faults", "memory-pressure"),
)

OP_WORDS = {"ncclAllReduce": "all-reduce", "ncclReduceScatter": "reduce-scatter", "ncclAllGather": "all-gather",
            "ncclBroadcast": "broadcast", "ncclReduce": "reduce"}

# The core the late rank's loop ran on (where its preemptors ran too).
CORE_SQL = """
SELECT cpu FROM events
WHERE session_id = $sid AND pid = $pid AND op = 'sched_switch' AND timestamp >= $t0 AND timestamp < $t1
GROUP BY cpu ORDER BY count(*) DESC LIMIT 1
"""

# The heaviest block-I/O issuer other than the job in the evidence windows.
WRITERS_SQL = """
SELECT pid, sum(bytes) AS bytes, sum(n) AS n FROM ing_bio
WHERE list_contains($ws, w) AND NOT list_contains($job, pid) AND pid > 0
GROUP BY pid ORDER BY bytes DESC LIMIT 3
"""


def _lags(job: collectives.Job) -> dict[int, list[float]]:
    """Per rank, per collective: its entry minus the median rank's entry (ns)."""
    out: dict[int, list[float]] = {p: [] for p in job.pids}
    for e in job.entries:
        m = collectives.median(list(e.values()))
        for p in job.pids:
            out[p].append(e[p] - m)
    return out


def _noise(lags: dict[int, list[float]]) -> float:
    """The run's lag noise: median over ranks of the robust spread of a rank's step-to-step lag change."""
    spreads = []
    for series in lags.values():
        diffs = [b - a for a, b in zip(series, series[1:])]
        spreads.append(MAD_TO_SIGMA * collectives.mad(diffs) / math.sqrt(2))
    return max(T.min_noise_ns, collectives.median(spreads))


def _ranks_text(job: collectives.Job, pids: list[int]) -> str:
    known = [job.ranks[p] for p in pids if job.ranks.get(p) is not None]
    if len(known) == len(pids):
        return ("rank " if len(pids) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(known))
    return ", ".join(f"{job.rank_label(p)} (PID {p})" for p in pids)


def _job_chain(con, ctx: Context, job: collectives.Job) -> Chain | None:
    steps = job.entries
    if len(steps) < T.min_steps:
        return None
    if ctx.pids and not set(ctx.pids) & set(job.pids):
        return None
    pids = job.pids
    lags = _lags(job)
    per_window: dict[int, list[int]] = {}
    for k, e in enumerate(steps):
        w = _window(ctx, collectives.median(list(e.values())))
        if 0 <= w < ctx.n_windows:
            per_window.setdefault(w, []).append(k)
    # windows: each rank's median lag over the window's collectives; late past mad_k x the noise of
    # those medians (a rank late all along, however noisy each step, stands out here)
    wins = sorted(w for w, ks in per_window.items() if len(ks) >= T.min_window_collectives)
    wlag = {p: [collectives.median([lags[p][k] for k in per_window[w]]) for w in wins] for p in pids}
    wnoise = _noise(wlag)
    wcut = T.mad_k * wnoise
    late_w: list[tuple[int, int]] = []
    n = len(pids)
    for i, w in enumerate(wins):
        last = max(pids, key=lambda p: wlag[p][i])
        ks = per_window[w]
        # ... or it came in last in more of the window's collectives than chance (1 in n) explains:
        # a binomial z past mad_k, with a lag past mad_k x the noise floor (a noisy run's medians
        # move a lot; a rank last in 20 of 22 collectives is late however they move)
        times_last = sum(max(pids, key=lambda p: lags[p][k]) == last for k in ks)
        z = (times_last - len(ks) / n) / math.sqrt(len(ks) * (1 / n) * (1 - 1 / n))
        if wlag[last][i] > wcut or (z >= T.mad_k and wlag[last][i] > T.mad_k * T.min_noise_ns):
            late_w.append((w, last))
    if len(late_w) >= max(T.min_late_windows, T.min_late_share * len(wins)):
        top, n_top = Counter(p for _, p in late_w).most_common(1)[0]
        if n_top >= T.fixed_share * len(late_w):
            ev_ws = sorted(w for w, p in late_w if p == top)
            return _fixed_chain(con, ctx, job, steps, lags, top, ev_ws, per_window, wcut, wnoise, "window")
    # collectives one by one: a straggler now on one rank, now on another averages out of the windows
    noise = _noise(lags)
    cut = T.mad_k * noise
    late: list[tuple[int, int]] = []  # (collective index, its late rank's pid)
    for k in range(len(steps)):
        last = max(pids, key=lambda p: lags[p][k])
        if lags[last][k] > cut:
            late.append((k, last))
    if len(late) < T.min_late_share * len(steps):
        return None
    counts = Counter(p for _, p in late)
    top, n_top = counts.most_common(1)[0]
    if n_top < T.fixed_share * len(late):
        return _rotating_chain(ctx, job, steps, late, counts, cut, noise)
    mine = {k for k, p in late if p == top}
    ev_ws = sorted(w for w, ks in per_window.items() if sum(k in mine for k in ks) >= T.window_late_share * len(ks))
    if len(ev_ws) < T.min_late_windows:
        return None
    return _fixed_chain(con, ctx, job, steps, lags, top, ev_ws, per_window, cut, noise, "collective")


def _window(ctx: Context, ts: float) -> int:
    return int((ts - ctx.start_ns) // ctx.window_ns)


def _waits(steps: list[dict[int, int]], ks: list[int], late_pid: int) -> dict[int, float]:
    """Per waiting rank, the time it stood in the collectives ``ks`` before ``late_pid`` came (ns)."""
    out: dict[int, float] = {p: 0.0 for p in steps[0] if p != late_pid}
    for k in ks:
        e = steps[k]
        for p in out:
            out[p] += max(0, e[late_pid] - e[p])
    return out


def _fixed_chain(con, ctx: Context, job: collectives.Job, steps, lags, top: int, ev_ws: list[int],
                 per_window: dict[int, list[int]], cut: float, noise: float, unit: str) -> Chain | None:
    pids = job.pids
    others = [p for p in pids if p != top]
    last_of = [max(pids, key=lambda p: lags[p][k]) for k in range(len(steps))]
    mine = [k for k in range(len(steps)) if last_of[k] == top]
    ev_ks = [k for w in ev_ws for k in per_window[w]]
    ev_wall = sum(min(ctx.window_bounds(w)[1], ctx.end_ns) - ctx.window_bounds(w)[0] for w in ev_ws)
    waits = _waits(steps, ev_ks, top)
    wait_share = collectives.median([w / ev_wall for w in waits.values()]) if ev_wall else 0.0
    per_step_ns = collectives.median(list(waits.values())) / max(1, len(ev_ks))
    lag_ns = collectives.median([lags[top][k] for k in ev_ks])
    # how much later than the others it came (with two ranks the median rank is half-way between them)
    after_ns = collectives.median([steps[k][top] - collectives.median([steps[k][p] for p in others])
                                   for k in ev_ks])
    severity = ("HIGH" if wait_share >= T.high_wait_share else
                "MEDIUM" if wait_share >= T.min_wait_share else "LOW")
    names = procs.lookup(con, pids)
    me = names[top]
    who = f"{job.rank_label(top)} ({me.label})"
    op = OP_WORDS.get(job.op, job.op)
    waiting = _ranks_text(job, others)
    what = "median per-window" if unit == "window" else "per-collective"

    cause = _own_cause(ctx, top, others, ev_ws, ev_wall / max(1, len(ev_ks)), after_ns)
    culprits, fix, contributing = [], [], []
    cause_text = "no cause of its own in its host metrics (compare its windows: ingero explain --pid %d)" % top
    cause_rule = None
    shared = _shared_cause(ctx, pids, ev_ws) if cause is None else None
    if shared is not None:
        # every rank carries the same cause: the job is slowed as a whole, this rank a little more
        severity = "LOW"
        cause_text = (f"no cause of its own: every rank is {shared[0]} at least {units.pct(shared[1])} of its "
                      "wall clock (the job is slowed as a whole: see each rank's own chain)")
    if cause is not None:
        key, label, cause_rule, mine_share, peers_share = cause
        cause_text = f"{label} {units.pct(mine_share)} of its wall clock (other ranks {units.pct(peers_share)})"
        if key == "cpu_wait_ns":
            culprits, named = _preemptors(con, ctx, top, pids, ev_ws)
            if named:
                cause_text = (f"preempted {units.pct(mine_share)} of its wall clock by "
                              + ", ".join(f"{c.name} (PID {c.pid})" for c in culprits[:3])
                              + f" (other ranks {units.pct(peers_share)})")
            fix = _cpu_fix(con, ctx, top, who, culprits, pids)
        elif key == "sleep_out_ns":
            kids = len(_children(con, top))
            fix = [f"DataLoader(num_workers=…, prefetch_factor=…, persistent_workers=True) on {who}: its input "
                   f"is what it waits for ({kids} worker process{'es' if kids != 1 else ''} now)",
                   f"give {who} a local copy of its data shard if it reads from a slower mount than the others"]
        elif key == "io_ns":
            writers = con.execute(WRITERS_SQL, {"ws": ev_ws, "job": pids}).fetchall()
            wn = procs.lookup(con, [int(r[0]) for r in writers])
            if writers:
                culprits = [Culprit(int(p), wn[int(p)].name, f"{units.size(b)} written/read in its windows")
                            for p, b, _ in writers if int(p) in wn]
                fix.append("ionice -c 3 -p " + " ".join(str(c.pid) for c in culprits)
                           + f"   (the disk {who} reads from: idle class for the other I/O)")
            fix.append(f"move {me.name}'s data (or the checkpoint writes) off the disk it shares")
        else:
            fix = [f"keep {who}'s dataset and buffers resident: preload or pin them, stop what evicts them",
                   "ingero explain --pid %d   (its memory-pressure chain names the process holding memory)" % top]
    if shared is not None:
        fix.append(f"free the cores of all {len(pids)} ranks, not one: what every rank shares is the cause "
                   f"(ingero explain --pid {' --pid '.join(str(p) for p in pids[:4])})")
    else:
        fix.append(f"then every rank runs at the pace of the others: ingero explain --pid {top} to confirm")
    verb = "waits" if len(others) == 1 else "wait"
    summary = (f"{who} {cause_text.split(' (other ranks')[0]} → enters the {op} "
               f"{units.ns(after_ns)} after the others → {waiting} {verb} {units.ns(per_step_ns)} per step "
               f"({units.pct(wait_share)} of wall clock)")
    root = [
        summary,
        f"{who} entered the {op} last in {len(mine)} of {len(steps)} collectives, "
        f"{units.ns(lag_ns)} behind the median rank in {len(ev_ws)} windows (late: its {what} lag past "
        f"{units.ns(cut)} = {T.mad_k:g} x the run's lag noise {units.ns(noise)}, from the median absolute "
        "deviation of the ranks' lags" + (", or last in more of a window's collectives than chance allows)"
                                          if unit == "window" else ")"),
        f"its own evidence in those windows: {cause_text}",
    ]
    effect = [
        f"{waiting} ({', '.join(f'PID {p}' for p in others)}) {verb} {units.ns(per_step_ns)} per step in the {op} "
        f"and the sync after it: {units.pct(wait_share)} of {'its' if len(others) == 1 else 'their'} wall clock "
        "in those windows",
        f"the whole job runs at the late rank's pace: {len(pids)} ranks lose that time every step",
    ]
    other_last = {p: n for p, n in Counter(last_of).items() if p != top}
    if other_last:
        contributing.append(f"entered the {op} last otherwise: " + ", ".join(
            f"{job.rank_label(p)} {n} times" for p, n in sorted(other_last.items(), key=lambda x: -x[1])))
    if job.ranks.get(top) is None:
        contributing.append(f"PID {top}'s rank is unknown: its communicator was created before the trace "
                            "and its environment names no RANK")
    chain = Chain(
        rule_id=ID,
        severity=severity,
        title=TITLE_RANK,
        root=root,
        effect=effect,
        contributing=contributing,
        fix=fix,
        pids=[top],
        culprits=culprits,
        evidence_windows=[Window(*ctx.window_bounds(w)) for w in ev_ws],
        windows_total=len(per_window),
        impact=wait_share,
        numbers={
            "late_rank": job.ranks.get(top) if job.ranks.get(top) is not None else -1,
            "late_pid": top,
            "last_collectives": len(mine),
            "collectives": len(steps),
            "last_share": round(len(mine) / len(steps), 4),
            "lag_ns": round(lag_ns),
            "after_others_ns": round(after_ns),
            "threshold_ns": round(cut),
            "noise_ns": round(noise),
            "wait_per_step_ns": round(per_step_ns),
            "wait_share": round(wait_share, 4),
            "ranks": len(pids),
        },
    )
    if cause_rule:
        # explain lists this chain before the late rank's own chain of the same cause
        ctx.derived.explains.append((chain, cause_rule, top))
    return chain


def _own_cause(ctx: Context, pid: int, others: list[int], ws: list[int], step_ns: float, after_ns: float):
    """(column, words, rule id, its share, the other ranks' median share) of the late rank's largest
    excess over the other ranks in the windows ``ws``; None when nothing stands out, or when the
    excess (per step of ``step_ns``) is too small to explain how late it comes (``after_ns``)."""
    by_pid = baseline.windows_by_pid(ctx)
    wset = set(ws)
    rows = [r for r in by_pid.get(pid, []) if int(r["w"]) in wset]
    if not rows:
        return None
    peer_rows = {p: [r for r in by_pid.get(p, []) if int(r["w"]) in wset] for p in others}
    best = None
    for key, label, rule in RANK_CAUSES:
        mine = baseline.mean_share(rows, key)
        peers = collectives.median([baseline.mean_share(rs, key) for rs in peer_rows.values() if rs])
        if best is None or mine - peers > best[3] - best[4]:
            best = (key, label, rule, mine, peers)
    if best is None or best[3] - best[4] < T.min_cause_excess:
        return None
    if (best[3] - best[4]) * step_ns < T.min_cause_explains * after_ns:
        return None  # its extra cause is too little to make it that late: not its own cause
    return best


def _shared_cause(ctx: Context, pids: list[int], ws: list[int]) -> tuple[str, float] | None:
    """(words, the least share among the ranks) of a cause every rank carries in the windows ``ws``
    (each at least shared_cause_share of its wall clock); None when there is none."""
    by_pid = baseline.windows_by_pid(ctx)
    wset = set(ws)
    best = None
    for key, label, _ in RANK_CAUSES:
        shares = [baseline.mean_share([r for r in by_pid.get(p, []) if int(r["w"]) in wset], key) for p in pids]
        low = min(shares) if shares else 0.0
        if low >= T.shared_cause_share and (best is None or low > best[1]):
            best = (label, low)
    return best


def _children(con, pid: int) -> list[int]:
    if not procs.has_column(con, "process_names", "ppid"):
        return []
    return [int(r[0]) for r in con.execute("SELECT DISTINCT pid FROM process_names WHERE ppid = $p",
                                           {"p": pid}).fetchall()]


def _preemptors(con, ctx: Context, pid: int, job_pids: list[int], ws: list[int]) -> tuple[list[Culprit], bool]:
    """The processes outside the job that took the late rank's CPU (named), or ([], False)."""
    # who took the CPU from the late rank's threads in its evidence windows: cpu-contention's query
    rows = con.execute(cpu_contention.PREEMPTORS_SQL, {"pid": pid, "ws": ws}).fetchall()
    names = procs.lookup(con, [int(r[0]) for r in rows])
    total = sum(off for _, _, off in rows) or 1.0
    out = []
    for other, n, off in rows:
        other = int(other)
        p = names.get(other)
        if off < T.min_culprit_share * total or other in job_pids:
            continue
        if p is not None and (p.is_kernel_thread or any(p.child_of(j) for j in job_pids)):
            continue
        out.append(Culprit(other, p.name if p else str(other),
                           f"{units.count(n)} preemptions, {units.ns(off)} off-CPU"))
    return out, bool(out)


def _core(con, ctx: Context, pid: int) -> int | None:
    row = con.execute(CORE_SQL, {"sid": ctx.session_id, "pid": pid, "t0": ctx.start_ns,
                                 "t1": ctx.end_ns}).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _cpu_fix(con, ctx: Context, pid: int, who: str, culprits: list[Culprit], job_pids: list[int]) -> list[str]:
    core = _core(con, ctx, pid)
    fix = []
    if culprits:
        pids = " ".join(str(c.pid) for c in culprits)
        comms = ", ".join(sorted({c.name for c in culprits}))
        # only to cores no rank runs on: moving them onto another rank's core makes that rank late
        ranks_cores = {c for c in (_core(con, ctx, p) for p in job_pids) if c is not None}
        rest = [c for c in range(ctx.ncpu) if c != core and c not in ranks_cores]
        if core is not None and rest:
            cores = ",".join(str(c) for c in rest)
            fix.append(f"taskset -acp {cores} {pids}   (keep {comms} off {who}'s core {core})")
        elif core is not None:
            fix.append(f"renice -n 19 -p {pids}   (every core runs a rank: moving {comms} off core {core} "
                       "would make another rank late; lower them, or run them elsewhere)")
        if not fix or not fix[-1].startswith("renice"):
            fix.append(f"renice -n 19 -p {pids}")
        if ctx.sched_autogroup:
            fix.append(f"for p in {pids}; do echo 19 > /proc/$p/autogroup; done   "
                       "(autogroups are on: renice alone does not reach across sessions)")
    else:
        fix.append(f"give {who} a core of its own (taskset -acp <core> {pid}): what runs beside it takes its CPU")
    return fix


def _rotating_chain(ctx: Context, job: collectives.Job, steps, late, counts: Counter, cut: float,
                    noise: float) -> Chain:
    pids = job.pids
    ks_by = {p: [k for k, q in late if q == p] for p in counts}
    waits = {p: 0.0 for p in pids}
    for p, ks in ks_by.items():
        for q, w in _waits(steps, ks, p).items():
            waits[q] += w
    span = max(1, steps[-1][pids[0]] - steps[0][pids[0]])
    wait_share = collectives.median([w / span for w in waits.values()])
    op = OP_WORDS.get(job.op, job.op)
    ws = sorted({_window(ctx, collectives.median(list(steps[k].values()))) for k, _ in late})
    ws = [w for w in ws if 0 <= w < ctx.n_windows]
    shares = ", ".join(f"{job.rank_label(p)} {units.pct(n / len(late))}" for p, n in counts.most_common())
    return Chain(
        rule_id=ID,
        severity="LOW",
        title=TITLE_ROTATING,
        root=[
            f"{len(late)} of {len(steps)} {op}s had a late rank (past {units.ns(cut)} = {T.mad_k:g} x the run's "
            f"lag noise {units.ns(noise)}), and the late one changes: {shares}",
            "no single culprit: what makes a rank late is shared by the ranks (host CPU, storage, "
            "the network), so no one rank's fix helps",
        ],
        effect=[f"each rank waits for whichever is late: {units.pct(wait_share)} of wall clock (median rank)"],
        fix=["look at what every rank shares: the other chains name it per rank "
             + " ".join(f"(ingero explain --pid {p})" for p in pids[:4])],
        pids=[counts.most_common(1)[0][0]],
        evidence_windows=[Window(*ctx.window_bounds(w)) for w in ws],
        windows_total=ctx.n_windows,
        impact=wait_share,
        numbers={"late_collectives": len(late), "collectives": len(steps),
                 "late_share": round(counts.most_common(1)[0][1] / len(late), 4),
                 "threshold_ns": round(cut), "noise_ns": round(noise), "wait_share": round(wait_share, 4),
                 "ranks": len(pids)},
    )
