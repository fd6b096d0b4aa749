"""What the device did and how the loop stepped, for one explain: measured where the session
has a device timeline (an imported profiler trace), else inferred from the CUDA calls.

``resolve(ctx)`` returns the report's ``DeviceBusy`` and ``StepStats`` and fills
``ctx.device_busy`` (busy share per CUDA process) for the rules, which read it
as the effect a host-side cause must show: a device busy most of the time is
not waiting for the host.
"""

from __future__ import annotations

from ingero.analyze import timeline
from ingero.analyze.context import Context
from ingero.analyze.model import DeviceBusy, StepStats

# Tables of schema 7: a file written before it, opened read-only, has neither.
TIMELINE_TABLES_SQL = """
SELECT count(*) = 2 FROM duckdb_tables() WHERE table_name IN ('device_activity', 'spans')
"""
CUDA_PIDS_SQL = "SELECT pid FROM ing_loop ORDER BY cuda_n DESC"


def resolve(ctx: Context) -> tuple[DeviceBusy | None, StepStats | None]:
    con = ctx.con
    if not con.execute(TIMELINE_TABLES_SQL).fetchone()[0]:
        return None, None
    lo, hi = (None, None) if ctx.whole_session else (ctx.start_ns, ctx.end_ns)
    steps = ctx.marked_steps = timeline.steps(con, ctx.session_id, lo, hi)
    step_stats = None
    if steps is not None:
        step_stats = StepStats(steps.count, round(steps.median_ms, 3), round(steps.p99_ms, 3), "marked")
        total = sum(s.end_ns - s.start_ns for s in steps.steps)
        if total > 0:
            step_stats.breakdown["data_wait"] = round(sum(s.dataloader_ns for s in steps.steps) / total, 4)
    measured = timeline.device(con, ctx.session_id, lo, hi)
    if measured is None:
        return None, step_stats
    share = round(measured.busy_share, 4)
    # one device timeline per imported session: it belongs to the process whose calls fed it
    for (pid,) in con.execute(CUDA_PIDS_SQL).fetchall():
        ctx.device_busy[int(pid)] = share
    return DeviceBusy(share, share, share, "measured", measured.span_ns), step_stats
