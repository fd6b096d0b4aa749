"""transfer-bound: the loop spends its wall clock inside host<->device copies.

Physics: a copy from pageable memory is synchronous (the driver stages it
through a pinned bounce buffer) and runs at a few GB/s, so the loop thread
waits inside cudaMemcpy / cudaMemcpyAsync for the whole transfer while no
kernel is queued.  From pinned memory, cudaMemcpyAsync returns at once and
the transfer overlaps compute.  The cause metric is the share of the loop's
wall clock spent in copy calls; effective bandwidth (bytes / host time) and
the absence of cudaMallocHost / cudaHostRegister (anywhere in the process' session)
say whether memory is pageable.  Time the thread waited for a CPU inside a copy
call (preempted, or in the run queue after the DMA woke it) is contention,
not transfer: it is subtracted before anything is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain
from ingero.events.ops import PINNED_OPS

ID = "transfer-bound"
# Its cause is device time (the copy engine, staged pageable copies): a busy
# device is this chain's effect, not evidence against it (explain's device gate).
DEVICE_SIDE = True
TITLE = "Host↔device copies block the training loop"


@dataclass(frozen=True)
class Thresholds:
    # Evidence window: copies hold the loop at least this share of wall clock.
    # A pinned, overlapped pipeline spends < 2% of host time in copy calls.
    min_copy_share: float = 0.20
    # HIGH from this share: the loop spends more time copying than anything else.
    high_copy_share: float = 0.40
    # Below this host-side bandwidth a copy is staged through pageable memory:
    # pinned PCIe gen3 x16 moves ~12 GB/s, gen4 ~25 GB/s; pageable copies
    # measure 2-6 GB/s.  8 GB/s separates the two on any current bus.
    pageable_max_bw_bytes_per_s: float = 8e9
    # When faults inside the copy calls cover at least this share of the
    # copied pages, the copy waits on paging (memory-pressure), not the bus.
    page_bytes: int = 4096
    faulting_source_share: float = 0.5
    # With clean windows to compare, the loop must be this much slower where
    # it copies (a copy share that does not cost throughput is overlapped or
    # inflated by something else, e.g. preemption inside the call).
    min_drop: float = 0.15


T = Thresholds()

# Pinned buffers are allocated once, usually at start-up, often before the
# analysed range: look over the whole session of the process.
PINNED_SQL = """
SELECT count(*) FROM events
WHERE session_id = $sid AND pid = $pid AND list_contains($ops, op)
"""

DIRECTIONS_SQL = """
SELECT kind, op, sum(n) AS n, sum(bytes) AS bytes, sum(dur_ns) AS dur_ns
FROM ing_cuda
WHERE pid = $pid AND tid = $tid AND cat = 'copy' AND list_contains($ws, w)
GROUP BY ALL ORDER BY dur_ns DESC
"""


def _copy_ns(r: baseline.Row) -> float:
    """Host time in copy calls while the thread had a CPU: time preempted (or waiting in
    the run queue) inside a copy is CPU contention, not the transfer."""
    return max(0.0, r["copy_ns"] - r["copy_wait_ns"])


def _share(r: baseline.Row) -> float:
    return _copy_ns(r) / r["wall_ns"] if r["wall_ns"] else 0.0


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    loops = baseline.loop_threads(ctx)
    for pid, rows in baseline.windows_by_pid(ctx).items():
        s = baseline.split(rows, _share, T.min_copy_share)
        if not s.evidence:
            continue
        tid = loops.get(pid, pid)
        wall = sum(r["wall_ns"] for r in s.evidence)
        copy_ns = sum(_copy_ns(r) for r in s.evidence)
        share = copy_ns / wall if wall else 0.0
        severity = "HIGH" if share >= T.high_copy_share else "MEDIUM"
        copy_faults = sum(r["copy_faults_n"] for r in s.evidence)
        copy_fault_ns = sum(r["copy_faults_ns"] for r in s.evidence)
        faulting = copy_faults * T.page_bytes >= T.faulting_source_share * sum(r["copy_bytes"] for r in s.evidence)
        if faulting and severity == "HIGH":
            severity = "MEDIUM"  # the deeper cause is paging: memory-pressure
        ws = [int(r["w"]) for r in s.evidence]
        copy_bytes = sum(r["copy_bytes"] for r in s.evidence)
        copy_n = sum(r["copy_n"] for r in s.evidence)
        bw = copy_bytes / (copy_ns / 1e9) if copy_ns else 0.0
        pinned = int(con.execute(PINNED_SQL, {"sid": ctx.session_id, "pid": pid, "ops": list(PINNED_OPS)})
                     .fetchone()[0])
        pageable = pinned == 0 and bw < T.pageable_max_bw_bytes_per_s
        dirs = con.execute(DIRECTIONS_SQL, {"pid": pid, "tid": tid, "ws": ws}).fetchall()
        me = procs.lookup(con, [pid])[pid]
        base_rate, ev_rate, drop = baseline.throughput(s)
        corr = baseline.evidence_correlation(s, _share, baseline.ops_rate, expect=-1)
        if s.has_baseline and drop < T.min_drop:
            continue

        root = [
            f"{me.label} spent {units.ns(copy_ns)} of {units.ns(wall)} ({units.pct(share)} of the loop's time "
            f"in {len(ws)} of {len(rows)} windows) inside {units.count(copy_n)} copy calls, on CPU",
            f"effective bandwidth {units.rate(copy_bytes, copy_ns)} for {units.size(copy_bytes)} "
            f"({units.size(copy_bytes / copy_n if copy_n else 0)} per copy)",
        ]
        copy_wait = sum(r["copy_wait_ns"] for r in s.evidence)
        if copy_wait > 0:
            root.append(f"not counted: {units.ns(copy_wait)} waiting for a CPU inside the copies (see cpu-contention)")
        if pinned == 0:
            root.append("no cudaMallocHost / cudaHostRegister seen: host buffers are pageable")
        effect = []
        sync_copy = max(0.0, sum(r["sync_copy_ns"] for r in s.evidence) - copy_wait)
        if sync_copy:
            effect.append(f"synchronous cudaMemcpy held the loop {units.ns(sync_copy)}: no kernel queued meanwhile")
        if s.has_baseline and drop > 0:
            effect.append(
                f"CUDA ops/s down {units.pct(drop)} in copy-heavy windows "
                f"({units.count(base_rate)} → {units.count(ev_rate)})"
            )
        elif not s.has_baseline:
            effect.append(f"no clean window to compare with (copies in {len(ws)} of {len(rows)} active windows): "
                          "the loop copies instead of computing")
            line = baseline.quartile_contrast(rows, _share, "copy time")
            if line:
                effect.append(line)
        contributing = []
        if faulting:
            contributing.append(
                f"{units.count(copy_faults)} page faults inside the copies ({units.ns(copy_fault_ns)}): "
                "the source pages are faulted in while copying, see memory-pressure"
            )
        contributing += [
            f"{kind or 'default'} {op}: {units.count(n)} calls, {units.size(b)}, {units.ns(d)}"
            for kind, op, n, b, d in dirs[:3]
        ]
        fix = []
        if pageable:
            fix.append("DataLoader(..., pin_memory=True) and batch.to('cuda', non_blocking=True)   "
                       "(pinned, async copies)")
            fix.append("or allocate host buffers pinned: torch.empty(..., pin_memory=True) / cudaMallocHost")
        else:
            fix.append("overlap copies with compute: non_blocking=True on a side stream, prefetch the next batch")
        if any(kind == "D2H" for kind, *_ in dirs[:1]):
            fix.append("keep results on the GPU; copy back to the host less often")
        chains.append(
            baseline.chain(
                ID, TITLE + (" (pageable memory)" if pageable else ""), ctx, pid, s,
                severity=severity,
                root=root,
                effect=effect,
                contributing=contributing,
                fix=fix,
                corr=corr,
                corr_note='CUDA ops/s fall as copy time grows',
                impact=share,
                numbers={
                    "copy_share": round(share, 4),
                    "copy_ns": copy_ns,
                    "copy_bytes": copy_bytes,
                    "bandwidth_bytes_per_s": round(bw),
                    "pinned_allocs": pinned,
                    "throughput_drop": round(drop, 4),
                },
            )
        )
    return chains
