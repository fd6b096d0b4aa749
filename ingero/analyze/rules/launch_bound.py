"""launch-bound: the GPU waits for a host that launches many tiny kernels.

Physics: each launch costs the host microseconds of API and Python time; if
the kernels run for less than that, the device drains faster than the host
fills it.  Signs, per window of the loop thread: a high launch rate, the
thread running nearly all the time, and syncs that return at once (the
device was already idle).  Time inside a sync is waiting for the device
whatever the wait policy: a sleeping sync is off CPU, but a spinning or
yielding one (CUDA's default with one GPU per process) is on CPU the whole
time, so the sync's call time is what counts, never the thread's sleeps.
Not this rule when syncs are frequent (sync-heavy), when the thread is
runnable but waiting for a CPU (contention: the premise of a host that
cannot launch fast enough is that it runs), or when it sleeps (input, I/O).
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import activity, baseline, launch_sampling, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain
from ingero.analyze.rules import cpu_contention, host_bound

ID = "launch-bound"
TITLE = "Launch-bound: many tiny kernels, the GPU waits for the host"


@dataclass(frozen=True)
class Thresholds:
    # Launches per second of one thread: 2,000/s leaves 500 µs per kernel on
    # average; kernels that short cannot hide ~5-20 µs of launch overhead
    # plus framework time.  Real launch-bound loops run 10k-50k/s.
    min_launch_rate_per_s: float = 2000.0
    high_launch_rate_per_s: float = 8000.0
    # The loop thread running (not sleeping, not in D state, not waiting for
    # a CPU) at least this share of the window: it never waits for anything,
    # so it is the bottleneck.
    min_busy_share: float = 0.80
    # Inside syncs at most this share (call time: spinning, yielding or
    # sleeping alike): the device finished before the host asked.
    max_sync_wait_share: float = 0.10
    # At or above one sync per 5 launches the pattern is sync-heavy instead.
    max_syncs_per_launch: float = 0.2
    # Steady-state property: at least this share of the active windows in which the loop did not
    # wait for a CPU must show it (those are cpu-contention's, which reports them), and at least
    # min_all_window_share of all of them.  A loop on a core another process keeps busy part of
    # the time is launch-bound whenever it runs: under CI's load 4-6 of 12 windows were contended,
    # and launch-bound stood down in the rest while contention held too few windows to be named.
    min_window_share: float = 0.5
    min_all_window_share: float = 0.25
    # The effect is a starved device: one measured busy at least this share of the
    # span is not waiting for launches, nor one inferred with a full launch queue
    # behind it (min_backpressure_share).  Long launch calls on a busy device are
    # back-pressure from that queue, not a slow host (real V100 trace: 60 µs
    # launches, device 97.4% busy).
    max_device_busy_share: float = 0.80
    # The queue was full (and the device the bottleneck) when at least this share
    # of the launches were back-pressure: 1.8% in the real V100 trace (106 of
    # 5,950), 0.007% (7 of 97,000 slow calls) in a launch-bound loop here.
    min_backpressure_share: float = 0.002
    # The device's inferred time per launch says how long its kernels ran only when the point is
    # at least this far (share of the span) from the middle of its bounds (the fallback).
    min_point_off_middle: float = 0.02


T = Thresholds()


def _busy_shown(ctx: Context, pid: int) -> bool | None:
    """Whether a device busy at least ``max_device_busy_share`` is shown, not only modelled.

    None: not that busy.  True: measured (an imported device timeline, CUPTI's in a traced
    command), or inferred with a full launch queue behind it.  False: inferred from the drains'
    returns alone.  That point takes the last kernel to end when the sync returned; a sleeping
    sync returns a wake-up later (15-23 µs on this VM, against 5-10 µs kernels), so behind
    short kernels the point reads a launch-bound loop as a busy device (launch-bound shape,
    block: 93% inferred, 57% true; bench_device_infer).  Such a loop is still launch-bound, at
    most MEDIUM."""
    if ctx.device_busy.get(pid, 0.0) < T.max_device_busy_share:
        return None
    act = (ctx.derived.device_activity or {}).get(pid)
    if act is None or act.source == "measured":
        return True
    return act.backpressure_launches >= T.min_backpressure_share * max(1, act.submissions)


def _running_share(r: baseline.Row) -> float:
    """Share of the window the loop thread ran: not asleep, not in D state, not waiting for a CPU."""
    return 1.0 - (r["sleep_ns"] + r["io_ns"] + r["cpu_wait_ns"]) / r["wall_ns"]


def _waited_for_cpu(r: baseline.Row) -> bool:
    """The loop waited for a CPU long enough in this window for cpu-contention to count it."""
    return bool(r["wall_ns"]) and r["cpu_wait_ns"] / r["wall_ns"] >= cpu_contention.T.min_wait_share


def _is_launch_bound(r: baseline.Row) -> bool:
    wall = r["wall_ns"]
    if not wall or not r["launch_n"]:
        return False
    rate = r["launch_n"] / (wall / 1e9)
    return (
        rate >= T.min_launch_rate_per_s
        and _running_share(r) >= T.min_busy_share
        # what cpu-contention measures on the same window contradicts a host that runs flat out
        and not _waited_for_cpu(r)
        and r["sync_ns"] / wall <= T.max_sync_wait_share
        and r["sync_n"] / r["launch_n"] < T.max_syncs_per_launch
    )


def _launch_starved(split: dict, r: baseline.Row, shown: bool | None) -> bool:
    """The device ran dry while the step's launches were issued more than while the loop worked
    outside CUDA with nothing queued (host-bound's cause): launches, not host work elsewhere,
    leave it idle.  A process without an inferred device timeline (no device calls analysed)
    is judged without it; a window the inference did not cover (outside the analysed slice) is
    no evidence.  Where a busy device is only modelled (``_busy_shown`` False), the split of its
    idle time rests on that point, so the loop's own times decide: launches against host work."""
    if not split:
        return True
    x = split.get(int(r["w"]))
    if x is None:
        return False
    if shown is False:
        return x.host_ns < r["launch_ns"]
    return x.host_idle_ns < x.launch_idle_ns


def _cost_lines(u: Untraced | None, mean_ns: float) -> list[str]:
    """What the tracer's own probes add to each launch, and whether the loop is launch-bound
    without them."""
    if u is None:
        return []
    lines = [f"of each launch's {units.ns(mean_ns)}, ~{units.ns(u.cost_ns)} is this trace's own probes "
             f"(calibrated at its start)"] if u.cost_ns < mean_ns else []
    if u.keeps_pace:
        lines.append(f"without them a launch every ~{units.ns(u.period_ns)} against ~{units.ns(u.kernel_ns)} "
                     f"of device time per launch: the device would keep pace, so the loop is launch-bound "
                     f"only while traced")
    return lines


def _unshown(ctx: Context, pid: int, shown: bool | None) -> list[str]:
    """The effect line of a chain whose starved device is not shown (``_busy_shown`` False)."""
    if shown is not False:
        return []
    act = ctx.derived.device_activity[pid]
    return [f"the device may have kept pace: inferred busy {units.pct(act.busy_share)} ({units.pct(act.low)}-"
            f"{units.pct(act.high)}), shown by no full launch queue; a sync's wake-up after short kernels "
            f"reads as device time"]


@dataclass(frozen=True)
class Untraced:
    """The loop without the tracer's probes (sessions.call_cost_ns)."""

    cost_ns: float  # what tracing one call costs its thread
    period_ns: float  # a launch every this much, the probes' cost taken out
    kernel_ns: float | None  # the device's inferred busy time per launch (None: not shown)

    @property
    def keeps_pace(self) -> bool:
        """The device would keep up with the untraced launches: launch-bound only while traced."""
        return self.kernel_ns is not None and self.kernel_ns >= self.period_ns


def _untraced(ctx: Context, pid: int, shown: bool | None, ev_split: list, wall: float,
              launches: int) -> Untraced | None:
    """Each traced launch pays the entry and return uprobes (~10.7 µs a call on this project's
    VMs, ~1-2 µs on bare metal): a 5 µs launch takes ~15 traced, so 10 µs kernels that would
    outrun the host untraced fall behind it traced (train.py, 200 x 10 µs kernels: 2.49 ms a
    step and the device 96% busy untraced, 4.9 ms and 57% traced).

    None: no calibrated cost, a trace under --overhead-budget (most launches there were never
    probed, and their count is estimated), or launches no longer apart than the cost.  The
    device's time per launch is taken only where the point is more than the middle of its
    bounds, which is all the calls say when no sync shows how long kernels ran: half the launch
    interval whatever the kernels (reviewed: 2 µs kernels read as 5).  (Not the waited drains:
    whether a sync counts as waited rests on the quickest sync in the analysed slices, and every
    sync of a loop that spins ~8 µs behind its last kernel is the quickest.)"""
    if not ctx.call_cost_ns or not launches or len(launch_sampling.periods(ctx)):
        return None
    period = wall / launches
    if period <= ctx.call_cost_ns:
        return None
    act = activity.device_activity(ctx).get(pid)
    kernel = None
    # (a measured timeline says how long the kernels ran; an inferred point only off its middle)
    if shown is None and act is not None and (
            act.source == "measured"
            or abs(act.busy_share - (act.low + act.high) / 2) > T.min_point_off_middle):
        busy_ns = (sum(x.busy_share * x.wall_ns for x in ev_split) if ev_split
                   else ctx.device_busy.get(pid, 0.0) * wall)
        kernel = busy_ns / launches
    return Untraced(ctx.call_cost_ns, period - ctx.call_cost_ns, kernel)


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    if ctx.imported_from:
        return []  # no scheduler rows: whether the loop ran or waited is unknown (explain notes it)
    for pid, rows in baseline.windows_by_pid(ctx).items():
        shown = _busy_shown(ctx, pid)
        if shown:
            continue
        split = host_bound.idle_split(ctx, pid)
        ev = [r for r in rows if _is_launch_bound(r) and _launch_starved(split, r, shown)]
        judged = [r for r in rows if not _waited_for_cpu(r)]
        if not ev or len(ev) < T.min_window_share * len(judged) or len(ev) < T.min_all_window_share * len(rows):
            continue
        wall = sum(r["wall_ns"] for r in ev)
        launches = sum(r["launch_n"] for r in ev)
        launch_ns = sum(r["launch_ns"] for r in ev)
        rate = launches / (wall / 1e9)
        oncpu = 1.0 - sum(r["off_ns"] for r in ev) / wall
        busy = 1.0 - sum(r["sleep_ns"] + r["io_ns"] + r["cpu_wait_ns"] for r in ev) / wall
        sync_wait = baseline.mean_share(ev, "sync_ns")
        # on CPU outside syncs: the host work the device waited for, less the host work while
        # nothing was queued (host-bound's: one cause, one rule)
        host = busy - (sync_wait - baseline.mean_share(ev, "sleep_sync_ns"))
        ev_split = [split[int(r["w"])] for r in ev if int(r["w"]) in split]
        host -= sum(x.host_idle_ns for x in ev_split) / wall
        launch_idle = sum(x.launch_idle_ns for x in ev_split) / wall if ev_split else None
        mean_ns = launch_ns / launches
        me = procs.lookup(con, [pid])[pid]
        severity = "HIGH" if rate >= T.high_launch_rate_per_s and shown is None else "MEDIUM"
        untraced = _untraced(ctx, pid, shown, ev_split, wall, launches)
        traced_only = untraced is not None and untraced.keeps_pace
        if traced_only:
            severity = "LOW"
        launch_share = launch_ns / wall
        chains.append(
            Chain(
                rule_id=ID,
                severity=severity,
                title=TITLE,
                root=[
                    f"{me.label} launched {units.count(rate)} kernels/s ({units.count(launches)} in "
                    f"{len(ev)} of {len(rows)} windows), one every {units.ns(1e9 / rate)}",
                    f"launch calls take {units.ns(mean_ns)} each on average, {units.pct(launch_share)} of wall clock; "
                    f"the thread is on CPU {units.pct(oncpu)} of the time and never waits "
                    f"(running {units.pct(busy)})",
                    *_cost_lines(untraced, mean_ns),
                ],
                effect=[
                    f"{'GPU starved' + (' while traced' if traced_only else '') + ': ' if shown is None else ''}"
                    f"the loop waited for the GPU (in syncs) only "
                    f"{units.pct(sync_wait)} of wall clock",
                    f"throughput capped by the host at {units.count(rate)} kernels/s",
                    *_unshown(ctx, pid, shown),
                ],
                contributing=[f"{units.count(sum(r['sync_n'] for r in ev))} syncs in the same windows"],
                fix=[
                    *(["nothing to fix in the job: its launches outrun its kernels only with this trace's probes on "
                       "them; trace with --overhead-budget 2% (launch probes sampled) to see the loop's own pace"]
                      if traced_only else []),
                    "capture the step in a CUDA graph: "
                    "torch.compile(model, mode=\"reduce-overhead\") or torch.cuda.CUDAGraph",
                    "fuse small kernels: torch.compile, fused optimizers (torch.optim.AdamW(..., fused=True))",
                    "raise work per kernel: larger batch size",
                ],
                pids=[pid],
                evidence_windows=baseline.evidence_windows(ctx, ev),
                windows_total=len(rows),
                correlation=None,
                # launch-bound only while traced: the time is the trace's, not the job's
                impact=0.0 if traced_only else max(0.0, host),
                numbers={
                    "launches_per_s": round(rate, 1),
                    "launch_mean_ns": round(mean_ns, 1),
                    "launch_share": round(launch_share, 4),
                    "oncpu_share": round(oncpu, 4),
                    "busy_share": round(busy, 4),
                    "sync_wait_share": round(sync_wait, 4),
                    **({"launch_idle_share": round(launch_idle, 4)} if launch_idle is not None else {}),
                    **({"trace_cost_per_call_ns": round(untraced.cost_ns, 1),
                        "untraced_period_ns": round(untraced.period_ns, 1)} if untraced is not None else {}),
                },
            )
        )
    return chains
