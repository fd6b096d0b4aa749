"""What the device did and how the loop stepped, for one explain: measured where the session
has a device timeline (an imported profiler trace; CUPTI under `trace --cmd`), else inferred
from the CUDA calls.

A traced session whose processes have a CUPTI timeline is analysed as an inferred one (the
calls' segments, the steps from NVTX marks or the calls' rhythm, the breakdown from the host's
events), with each such process' device activity measured instead (measured.overlay): the
rules read the measured numbers where they read the inferred ones.

``resolve(ctx)`` returns the report's ``DeviceBusy`` and ``StepStats`` and fills
``ctx.device_busy`` (busy share per CUDA process) for the rules, which read it
as the effect a host-side cause must show: a device busy most of the time is
not waiting for the host.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from ingero.analyze import device, procs, traced_steps
from ingero.analyze.device import imported, measured
from ingero.analyze.context import Context
from ingero.analyze.model import DeviceBusy, StepStats
from ingero.events.units import NS

CUDA_PIDS_SQL = "SELECT pid FROM ing_loop ORDER BY cuda_n DESC"


def device_activity(ctx: Context) -> dict:
    """The device activity per pid, measured where CUPTI measured it, else inferred (cached on ctx by
    resolve; found here when missing)."""
    if ctx.derived.device_activity is None:
        ctx.derived.device_activity = _activity(ctx, measured.live(ctx))
    return ctx.derived.device_activity


def _activity(ctx: Context, live: set[int]) -> dict:
    """Inferred from the calls, then the processes in ``live`` measured."""
    activity = device.infer(ctx)
    return measured.overlay(ctx, activity, live) if live else activity


def rhythm_steps(ctx: Context, pid: int):
    """The steps found in ``pid``'s call rhythm (traced_steps.Steps), or None (cached on ctx)."""
    found = ctx.derived.rhythm_steps
    if pid not in found:
        act = device_activity(ctx).get(pid)
        found[pid] = traced_steps.detect(ctx, act) if act is not None else None
    return found[pid]

# Inferring the device's activity and the steps reads the raw calls (analyze/device/__init__.py,
# analyze/traced_steps.py: a call sequence no per-second summary keeps), a pass that grows
# with the range: 0.2 s CPU per 3.6 M events here.  Over a longer range they
# see its last MAX_RAW_SPAN_S only (whole windows), and explain says so.
MAX_RAW_SPAN_S = 300


def resolve(ctx: Context) -> tuple[DeviceBusy | None, StepStats | None]:
    live = measured.live(ctx)
    if live:
        # a traced session with CUPTI's timeline: its host events are there too
        marked = _marked_steps(ctx)
        with _recent_calls(ctx):
            return _inferred(ctx, marked, live)
    profiled, marked = _profiled(ctx)
    if profiled is not None:
        return profiled, marked
    with _recent_calls(ctx):
        return _inferred(ctx, marked)


# NVML's mean utilization over the main process' span of device calls, when exactly one GPU
# was sampled (with several, which one the process used is not recorded).
NVML_SQL = """
SELECT avg(util_pct) / 100, count(DISTINCT gpu) FROM gpu_metrics
WHERE session_id = $sid AND timestamp > $a AND timestamp <= $b + 1000000000 AND util_pct IS NOT NULL
"""
# NVML's and the calls' shares disagree when NVML is this far outside the calls' bounds: NVML
# averages a kernel-running flag over its sample period (1/6 s to 1 s), so a span's mean can be
# off by a few points at its edges.
NVML_TOLERANCE = 0.05


def nvml_disagreement(ctx: Context, busy: DeviceBusy) -> str | None:
    """Fill ``busy.nvml_util`` from the one sampled GPU; a note when it falls outside the bounds
    the process' own calls allow (None when they agree, or when there is nothing to compare)."""
    if busy.source != "inferred":
        return None  # (a measured timeline: nothing inferred to compare, and no inference to run)
    act = device_activity(ctx)
    main = device.main_process(ctx, act) if act else None
    if main is None:
        return None
    util, gpus = ctx.con.execute(NVML_SQL, {"sid": ctx.session_id, "a": main.start_ns, "b": main.end_ns}).fetchone()
    if gpus != 1 or util is None or not math.isfinite(util):
        return None
    busy.nvml_util = round(float(util), 4)
    if busy.nvml_util > busy.high + NVML_TOLERANCE:
        return (f"NVML says the GPU ran kernels {busy.nvml_util:.0%} of the time, more than the "
                f"{busy.high:.0%} this process' calls allow: another process used the GPU")
    if busy.nvml_util < busy.low - NVML_TOLERANCE:
        return (f"NVML says the GPU ran kernels {busy.nvml_util:.0%} of the time, less than the "
                f"{busy.low:.0%} this process' waits show: NVML does not count copies, or the "
                "process used another GPU than the one sampled")
    return None


@contextmanager
def _recent_calls(ctx: Context) -> Iterator[None]:
    """Within: ``events`` on ctx.con is the range's last MAX_RAW_SPAN_S (a TEMP VIEW over the table)."""
    span_windows = max(1, -(-MAX_RAW_SPAN_S * NS // ctx.window_ns))
    if ctx.n_windows <= span_windows:
        yield
        return
    con = ctx.con
    from_ns = ctx.start_ns + (ctx.n_windows - span_windows) * ctx.window_ns
    db = con.execute("SELECT current_database()").fetchone()[0]
    # the bound is a literal: a view holds no parameters (an integer computed here, never user text)
    con.execute(f'CREATE OR REPLACE TEMP VIEW events AS SELECT * FROM "{db}".main.events '
                f"WHERE timestamp >= {int(from_ns)}")
    ctx.derived.calls_from_ns = from_ns
    try:
        yield
    finally:
        con.execute("DROP VIEW IF EXISTS temp.events")


def _inferred(ctx: Context, marked: StepStats | None,
              live: set[int] | None = None) -> tuple[DeviceBusy | None, StepStats | None]:
    """From the CUDA call stream: what the device can have done (bounds) and most likely did; the
    processes in ``live`` as CUPTI measured it."""
    activity = _activity(ctx, live or set())
    ctx.derived.device_activity = activity
    for pid, act in activity.items():
        ctx.device_busy[pid] = act.busy_share
    main = device.main_process(ctx, activity)
    if main is None:
        return None, marked
    busy = DeviceBusy(round(main.busy_share, 4), round(main.low, 4), round(main.high, 4), main.source,
                      main.span_ns, measured_by="CUPTI" if main.source == "measured" else None)
    if marked is not None:
        return busy, marked
    found = traced_steps.detect(ctx, main)
    ctx.derived.rhythm_steps = {main.pid: found}
    if found is None:
        return busy, None
    stats = StepStats(found.count, round(found.median_ms, 3), round(found.p99_ms, 3), found.source, found.marker,
                      found.pid)
    b = found.breakdown
    if b is not None and b.total_ms > 0:
        for part in traced_steps.PARTS:
            stats.breakdown[part] = round(getattr(b, f"{part}_ms") / b.total_ms, 4)
    return busy, stats


def _marked_steps(ctx: Context) -> StepStats | None:
    """The ProfilerStep marks a profiler trace left (ctx.marked_steps), or None."""
    con = ctx.con
    # device_activity and spans come with schema 7 (one migration): a file written before it,
    # opened read-only, has neither
    if not procs.has_table(con, "device_activity"):
        return None
    lo, hi = (None, None) if ctx.whole_session else (ctx.start_ns, ctx.end_ns)
    steps = ctx.marked_steps = imported.steps(con, ctx.session_id, lo, hi)
    if steps is None:
        return None
    step_stats = StepStats(steps.count, round(steps.median_ms, 3), round(steps.p99_ms, 3), "marked")
    step_stats.breakdown.update(imported.breakdown(con, ctx.session_id, steps).shares())
    return step_stats


def _profiled(ctx: Context) -> tuple[DeviceBusy | None, StepStats | None]:
    """From an imported profiler trace: its device timeline and ProfilerStep marks."""
    con = ctx.con
    if not procs.has_table(con, "device_activity"):
        return None, None
    lo, hi = (None, None) if ctx.whole_session else (ctx.start_ns, ctx.end_ns)
    step_stats = _marked_steps(ctx)
    profiled = imported.device(con, ctx.session_id, lo, hi)
    if profiled is None:
        return None, step_stats
    share = round(profiled.busy_share, 4)
    # one device timeline per imported session: it belongs to the process whose calls fed it
    for (pid,) in con.execute(CUDA_PIDS_SQL).fetchall():
        ctx.device_busy[int(pid)] = share
    return DeviceBusy(share, share, share, "measured", profiled.span_ns), step_stats
