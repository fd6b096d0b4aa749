"""sync-heavy: the loop synchronises with the GPU many times per step.

Physics: every sync (``loss.item()``, ``.cpu()``, ``print(tensor)``) blocks the
host until the device drains, so the host cannot queue the next kernels
while the GPU works: host and device run one after the other instead of
overlapped.  Signs per window: many syncs per launch, often each preceded by
a tiny device-to-host copy (a scalar read-back).
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain

ID = "sync-heavy"
TITLE = "Sync-heavy loop: frequent host↔GPU synchronisation serialises the pipeline"


@dataclass(frozen=True)
class Thresholds:
    # A typical training step launches tens to hundreds of kernels and syncs
    # once (the loss read-back); one sync per 5 launches or more is a
    # per-op read-back pattern.
    min_syncs_per_launch: float = 0.2
    high_syncs_per_launch: float = 0.5
    # Rate floor: a handful of syncs per second costs nothing measurable.
    min_syncs_per_s: float = 100.0
    # Steady-state property: at least this share of active windows.
    min_window_share: float = 0.5
    # A device busy this share of the range has no idle for the syncs to cost: other threads'
    # or streams' work fills it (4 server threads syncing their own streams kept it 97% busy).
    max_device_busy_share: float = 0.9


T = Thresholds()


def _heavy(r: baseline.Row) -> bool:
    secs = r["wall_ns"] / 1e9
    return (
        r["launch_n"] > 0
        and secs > 0
        and r["sync_n"] / secs >= T.min_syncs_per_s
        and r["sync_n"] / r["launch_n"] >= T.min_syncs_per_launch
    )


def _busy_note(ctx: Context, pid: int) -> str:
    busy = ctx.device_busy.get(pid)
    return "" if busy is None else f" (device busy {units.pct(busy)} over the range)"


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        busy = ctx.device_busy.get(pid)
        if busy is not None and busy >= T.max_device_busy_share:
            continue
        ev = [r for r in rows if _heavy(r)]
        if not ev or len(ev) < T.min_window_share * len(rows):
            continue
        wall = sum(r["wall_ns"] for r in ev)
        syncs = sum(r["sync_n"] for r in ev)
        launches = sum(r["launch_n"] for r in ev)
        small = sum(r["small_d2h_n"] for r in ev)
        sync_ns = sum(r["sync_ns"] for r in ev)
        per_launch = syncs / launches
        me = procs.lookup(con, [pid])[pid]
        severity = "HIGH" if per_launch >= T.high_syncs_per_launch else "MEDIUM"
        root = [
            f"{me.label}: {units.count(syncs / (wall / 1e9))} syncs/s, one per "
            f"{launches / syncs:.1f} kernel launches, in {len(ev)} of {len(rows)} windows",
        ]
        if small:
            root.append(f"{units.count(small)} scalar read-backs in those windows (device-to-host copies ≤ 1 KB): "
                        f".item() / .cpu() per step")
        chains.append(
            Chain(
                rule_id=ID,
                severity=severity,
                title=TITLE,
                root=root,
                effect=[
                    f"the loop blocked in syncs {units.ns(sync_ns)} of {units.ns(wall)} in those windows "
                    f"({units.pct(sync_ns / wall)} of their wall clock); after each, the GPU idles until the host "
                    f"queues more{_busy_note(ctx, pid)}",
                ],
                fix=[
                    "remove per-step .item() / .cpu() / print(loss): accumulate on the GPU, read every N steps",
                    "find them: torch.cuda.set_sync_debug_mode(\"warn\")",
                    "copy results with non_blocking=True into pinned buffers and read them a step later",
                ],
                pids=[pid],
                evidence_windows=baseline.evidence_windows(ctx, ev),
                windows_total=len(rows),
                impact=sync_ns / wall,
                numbers={
                    "syncs_per_s": round(syncs / (wall / 1e9), 1),
                    "syncs_per_launch": round(per_launch, 4),
                    "small_d2h_copies": small,
                    "sync_share": round(sync_ns / wall, 4),
                },
            )
        )
    return chains
