"""io-stall: block I/O stalls the loop (a checkpoint writer flooding the disk).

Physics: when the disk queue is deep, every request waits; a loop that reads
data, writes a checkpoint, or hits dirty-page throttling sits in
uninterruptible sleep (D state) until its request completes.  The cause is
block I/O latency in a window (host-wide: any process can fill the queue);
the effect is the loop's D-state time and its CUDA call rate in the same
windows, against windows without the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, saves, units, waits
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit
from ingero.analyze.rules import input_bound, memory_pressure

ID = "io-stall"
TITLE = "Block I/O stalls the training loop"


@dataclass(frozen=True)
class Thresholds:
    # Block request p99 latency marking a stalled window: SSD/NVMe requests
    # complete in well under 5 ms when the queue is short; 20 ms means the
    # queue is backed up (a bulk writer, writeback storm).
    stall_latency_ns: float = 20e6
    # The loop in D state (outside CUDA calls) this share of a window counts as stalled.
    min_io_share: float = 0.05
    high_io_share: float = 0.20
    # Without D-state time, a stall still counts when the loop's CUDA call rate
    # drops this much in stalled windows vs clean ones, moving with latency.
    min_drop: float = 0.15
    high_drop: float = 0.30
    max_corr: float = -0.3
    # DataLoader workers in D state this share of a window (summed over
    # workers), while the loop waits for data at least min_loop_wait_share
    # (input-bound's measure: its waits outside CUDA calls that left the GPU
    # idle), means the loop starves because its feeders block on disk.
    min_worker_io_share: float = 0.2
    min_loop_wait_share: float = 0.2
    # Swap or major-fault traffic this large in the stalled windows makes it
    # memory pressure (the other rule), not a disk hog: 1 MB of swap, or 100
    # major faults per stalled window.
    swap_bytes: float = 1e6
    major_faults: float = 100
    # Where the job itself writes, another process is named (and ioniced) only when it issued at
    # least this share of the job's own bytes.
    min_other_io_share: float = 0.5


T = Thresholds()

WORKER_IO_SQL = "SELECT w, sum(io_ns) FROM ing_helper GROUP BY w"

HOST_SQL = """
SELECT w, max(p99_ns) AS p99_ns, sum(bytes) AS bytes, sum(n) AS n
FROM ing_bio GROUP BY w
"""

MEM_SQL = """
SELECT coalesce(sum(swap_io_bytes), 0), coalesce(sum(major_faults), 0)
FROM ing_sys WHERE list_contains($ws, w)
"""

ISSUERS_SQL = """
SELECT pid, sum(bytes) AS bytes, sum(n) AS n, max(p99_ns) AS p99_ns, string_agg(DISTINCT kind, '/') AS kinds
FROM ing_bio WHERE list_contains($ws, w)
GROUP BY pid ORDER BY bytes DESC, n DESC LIMIT 5
"""


def evaluate(con, ctx: Context) -> list[Chain]:
    host = {int(w): (p99, b, n) for w, p99, b, n in con.execute(HOST_SQL).fetchall()}
    worker_io = {int(w): float(v or 0) for w, v in con.execute(WORKER_IO_SQL).fetchall()}
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        for r in rows:
            r["bio_p99_ns"] = float(host.get(int(r["w"]), (0, 0, 0))[0] or 0)
            r["worker_io_ns"] = worker_io.get(int(r["w"]), 0.0)
        chain = _evaluate_pid(con, ctx, pid, rows)
        if chain:
            chains.append(chain)
    return chains


def _fed_by_blocked_workers(r: baseline.Row) -> bool:
    wall = r["wall_ns"] or 1
    return (r["worker_io_ns"] / wall >= T.min_worker_io_share
            and input_bound.wait_ns(r) / wall >= T.min_loop_wait_share)


def _stall(r: baseline.Row) -> float:
    """>= 1 when the window is stalled (scaled so split() can use threshold 1)."""
    wall = r["wall_ns"] or 1
    io = r["io_ns"] / wall
    workers = r["worker_io_ns"] / wall / T.min_worker_io_share if _fed_by_blocked_workers(r) else 0.0
    return max(io / T.min_io_share, r["bio_p99_ns"] / T.stall_latency_ns, workers)


def _evaluate_pid(con, ctx, pid, rows) -> Chain | None:
    # windows where the loop's D state is page-ins belong to memory-pressure
    sysw = memory_pressure.host_memory(con)
    rows = [r for r in rows if not memory_pressure.paging(r, sysw)] if rows else rows
    s = baseline.split(rows, _stall, 1.0)
    if not s.evidence:
        return None
    ws = [int(r["w"]) for r in s.evidence]
    swap, majors = con.execute(MEM_SQL, {"ws": ws}).fetchone()
    if swap >= T.swap_bytes or majors >= T.major_faults * len(ws):
        return None  # memory-pressure explains these windows
    io_share = baseline.mean_share(s.evidence, "io_ns")
    base_rate, ev_rate, drop = baseline.throughput(s)
    corr = baseline.evidence_correlation(s, lambda r: r["bio_p99_ns"], baseline.ops_rate, expect=-1)
    fed = [r for r in s.evidence if _fed_by_blocked_workers(r)]
    fed_wall = sum(r["wall_ns"] for r in fed)
    starve_share = sum(input_bound.wait_ns(r) for r in fed) / fed_wall * len(fed) / len(s.evidence) if fed else 0.0
    worker_io_share = baseline.mean_share(s.evidence, "worker_io_ns")
    direct = io_share >= T.min_io_share or len(fed) * 2 >= len(s.evidence)
    aligned = s.has_baseline and drop >= T.min_drop and corr is not None and corr <= T.max_corr
    if not (direct or aligned):
        return None
    # the saves' CPU side (saves.py): the steps that flushed also wrote on CPU, outside every call
    per_w = saves.by_window(con, pid)
    saved = [per_w.get(int(r["w"]), (0.0, 0.0)) for r in s.evidence]
    save_ns = sum(ns for ns, _ in saved)
    n_saves = round(sum(n for _, n in saved))
    save_share = save_ns / (sum(r["wall_ns"] for r in s.evidence) or 1)
    blocked = io_share + starve_share + save_share
    severity = "HIGH" if blocked >= T.high_io_share or drop >= T.high_drop else "MEDIUM"
    issuers = con.execute(ISSUERS_SQL, {"ws": ws}).fetchall()
    names = procs.lookup(con, [pid] + [i[0] for i in issuers])
    me = names[pid]
    wall = sum(r["wall_ns"] for r in s.evidence)
    io_ns = sum(r["io_ns"] for r in s.evidence)
    p99 = max(r["bio_p99_ns"] for r in s.evidence)
    root = []
    # what the loop itself blocked in on the disk (waits.py): its flushes, its opens and reads
    own_waits = [t for t in waits.by_root(con, pid, ws) if t.root == waits.DISK]
    traced = {int(p) for (p,) in con.execute("SELECT DISTINCT pid FROM ing_sched").fetchall()} | {pid}
    # a loop blocked in its own calls is the issuer to name first, before a kernel thread that
    # issued on its behalf (kblockd's discards and flushes of the loop's msync: 2.6 GB beside 1.1)
    mine = [i for i in issuers if i[0] in traced] if own_waits else []
    top = (mine or issuers or [None])[0]
    if top is not None:
        root.append(
            f"{names[top[0]].label} issued {units.size(top[1])} of block I/O ({top[4]}, "
            f"{units.count(top[2])} requests), request p99 {units.ns(top[3])}"
        )
    root.append(f"block I/O p99 latency up to {units.ns(p99)} in {len(ws)} of {len(rows)} windows")
    flushes = [t for t in own_waits if t.via_call in waits.FLUSH_CALLS]
    if own_waits:
        calls: dict[str, list[float]] = {}
        for t in own_waits:
            c = calls.setdefault(t.via_call or "fault", [0.0, 0.0])
            c[0] += t.ns
            c[1] += t.n
        files = sorted({t.detail.split(" ", 1)[1] for t in own_waits if " " in t.detail})
        root.append(f"{me.label} blocked on the disk in its own calls: " + ", ".join(
            f"{c} {units.ns(v[0])}" for c, v in sorted(calls.items(), key=lambda kv: -kv[1][0])[:4])
            + (f" on {', '.join(files[:3])}" if files else ""))
    effect = []
    if save_ns:
        flush_ns = sum(t.ns for t in flushes)
        effect.append(
            f"{units.count(n_saves)} step{'s' if n_saves != 1 else ''} that saved: "
            f"{units.ns(save_ns)} on CPU writing ({units.pct(save_share)} of wall clock, beyond the loop's "
            "usual host work between steps)"
            + (f" and {units.ns(flush_ns)} blocked in its flushes" if flush_ns else "") + ", the device idle meanwhile"
        )
    if io_ns:
        effect.append(
            f"{me.label} in uninterruptible I/O wait {units.ns(io_ns)} of {units.ns(wall)} ({units.pct(io_share)})"
        )
    if fed:
        effect.append(
            f"its DataLoader workers were blocked on disk {worker_io_share:.2f} worker-s per s; "
            f"the loop waited for data {units.pct(starve_share)} of wall clock"
        )
    if s.has_baseline and drop > 0:
        effect.append(
            f"CUDA ops/s down {units.pct(drop)} in I/O windows ({units.count(base_rate)} → {units.count(ev_rate)})"
        )
    contributing = [
        f"{names[i[0]].name} (PID {i[0]}): {units.size(i[1])}, {units.count(i[2])} requests"
        for i in [i for i in issuers if i is not top][:2]
    ]
    fix = []
    # kernel threads (kworker, jbd2) issue I/O on others' behalf: not ionice targets
    others = [names[i[0]] for i in issuers
              if i[0] not in traced and i[0] in names and i[0] != 0 and not names[i[0]].is_kernel_thread]
    own = [i for i in issuers if i[0] in traced]
    if flushes or own:
        # the job's own writes and flushes explain the stall: another process is named only when
        # it moved a comparable share of the bytes (a neighbour's trickle is no cause)
        own_bytes = sum(float(i[1] or 0) for i in own)
        others = [p for p in others
                  if next(float(i[1] or 0) for i in issuers if i[0] == p.pid) >= T.min_other_io_share * own_bytes]
    if flushes:
        fix.append(f"{'/'.join(sorted({t.via_call for t in flushes}))} inside the step waits for the whole "
                   "checkpoint to reach the disk: save from a background thread or process (torch.save to a "
                   "buffer, then write and fsync off the loop; torch.distributed.checkpoint.async_save), or less often")
    elif any(i[0] == pid and "write" in (i[4] or "") for i in own):
        fix.append("save checkpoints from a background thread or process (or less often), not inside the step")
    if others:
        fix.append("ionice -c 3 -p " + " ".join(str(p.pid) for p in others)
                   + f"   (idle-class I/O for {', '.join(sorted({p.name for p in others}))})")
        fix.append(f"move {others[0].command} to another disk, or run it between epochs")
    if any("read" in (i[4] or "") for i in own):
        fix.append("the job's own readers wait on cold blocks: keep the dataset in page cache or on local NVMe, "
                   "DataLoader(prefetch_factor=4) to hide read latency")
    if not fix:
        fix.append("put the dataset / checkpoints on local NVMe; DataLoader prefetch_factor=4 hides read latency")
    named = {p.pid for p in others} | {i[0] for i in own}
    ordered = sorted((i for i in issuers if i[0] in named), key=lambda i: i[0] not in traced)  # the job's own first
    culprits = [Culprit(i[0], names[i[0]].name, f"{units.size(i[1])} block I/O") for i in ordered[:3]]
    return baseline.chain(
        ID, TITLE, ctx, pid, s,
        severity=severity,
        root=root,
        effect=effect,
        contributing=contributing,
        fix=fix,
        culprits=culprits,
        corr=corr,
        corr_note='CUDA ops/s fall as disk latency grows',
        impact=blocked,
        numbers={
            "io_wait_share": round(io_share, 4),
            "input_wait_share": round(starve_share, 4),
            "worker_io_share": round(worker_io_share, 4),
            "io_wait_ns": io_ns,
            "block_p99_ns": p99,
            "throughput_drop": round(drop, 4),
            "own_flush_ns": sum(t.ns for t in flushes),
            "save_cpu_ns": save_ns,
            "save_cpu_share": round(save_share, 4),
        },
    )
