"""straggler: traced processes doing the same work at different rates.

Physics: in data-parallel training every rank waits for the slowest at each
all-reduce, so one slow process sets everybody's pace.  Processes running
the same loop issue launches at the same rate; one well below the others in
the same windows is the straggler, and its own host metrics (CPU wait, D
state, input waits) against the others' say why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain

ID = "straggler"
TITLE = "Straggler: one process runs slower than its peers"


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
        ((share(slow, k) - baseline.median([share(p, k) for p in rate if p != slow]), k, label) for k, label in REASONS),
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
