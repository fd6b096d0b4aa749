"""memory-pressure: the host is short of memory and the loop pays in faults.

Physics: under memory pressure pages are reclaimed, swapped out and faulted
back in; a major fault or a swap-in puts the faulting thread in D state for
a disk read, and direct reclaim stalls allocations.  Cause per window: swap
traffic, host major faults, memory use, and the traced processes' page
faults against their quiet windows; effect: the loop's D-state time and CUDA
call rate in the same windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit
from ingero.store.selection import Selection

ID = "memory-pressure"
TITLE = "Memory pressure (page faults, swap) stalls the training loop"


@dataclass(frozen=True)
class Thresholds:
    # Per second of window: any real swap traffic (1 MB/s) or 100 major
    # faults/s is reclaim at work; an idle box shows ~0 of both.
    swap_bytes_per_s: float = 1e6
    major_faults_per_s: float = 100.0
    # Memory use at which the kernel reclaims aggressively (signal 1), scaled
    # from 80% (signal 0: page cache still gives back easily).
    mem_pct: float = 95.0
    mem_floor_pct: float = 80.0
    # The traced processes' own page faults count as a cause when they exceed
    # this many per second and this multiple of their quiet-window median.
    faults_per_s: float = 2000.0
    faults_ratio: float = 5.0
    # When the tracer times faults: fault handling this share of a window is
    # direct evidence (an unpressured loop spends well under 1% in faults).
    min_fault_share: float = 0.05
    high_fault_share: float = 0.20
    # Paging D state: the loop in D state at least min_io_share of a window,
    # taking page faults, while the host has at least this many major faults
    # per second (an idle box: 0-1/s).  Its D state is then page-ins (an
    # evicted mmap, swapped-out heap), not explicit I/O.
    paging_major_faults_per_s: float = 10.0
    # Effect needed: D-state share or a time-aligned throughput drop.
    min_io_share: float = 0.05
    high_io_share: float = 0.20
    min_drop: float = 0.15
    high_drop: float = 0.30


T = Thresholds()

SYS_SQL = "SELECT w, swap_io_bytes, major_faults, mem_pct FROM ing_sys"

FAULTERS_SQL = """
SELECT pid, sum(n) AS n FROM ing_faults WHERE list_contains($ws, w)
GROUP BY pid ORDER BY n DESC LIMIT 4
"""


# Who holds the memory (process_memory: top RSS processes per second plus
# the traced ones), from the start of the range to the end of the last
# evidence window: the largest RSS growth, else the largest RSS.
HOLDERS_SQL = f"""
SELECT pid, any_value(comm) AS comm, max(rss_bytes) AS peak,
       arg_max(rss_bytes, timestamp) - arg_min(rss_bytes, timestamp) AS growth
FROM process_memory
WHERE {Selection.where(pids=False)} AND rss_bytes IS NOT NULL
GROUP BY pid ORDER BY greatest(growth, 0) DESC, peak DESC LIMIT 3
"""


def holders(con, ctx: Context, end_ns: int) -> list[tuple[int, str, float, float]]:
    """[(pid, comm, peak RSS, RSS growth)] biggest first; [] when the database has no process_memory."""
    if not procs.has_column(con, "process_memory", "rss_bytes"):
        return []
    rows = con.execute(HOLDERS_SQL, {"sid": ctx.session_id, "t0": ctx.start_ns, "t1": end_ns}).fetchall()
    return [(int(p), c or "", float(peak or 0), float(g or 0)) for p, c, peak, g in rows]


def host_memory(con) -> dict[int, tuple[float, float, float]]:
    """w -> (swap bytes, major faults, mem %) from ing_sys."""
    return {int(w): (float(s or 0), float(m or 0), float(p or 0)) for w, s, m, p in con.execute(SYS_SQL).fetchall()}


def paging(r: baseline.Row, sysw: dict[int, tuple[float, float, float]]) -> bool:
    """The loop's D state in this window is page-ins (shared with io-stall, which defers)."""
    wall = r["wall_ns"]
    if not wall or r["faults_n"] == 0:
        return False
    swap, majors, _ = sysw.get(int(r["w"]), (0.0, 0.0, 0.0))
    secs = wall / 1e9
    return r["io_ns"] / wall >= T.min_io_share and (
        majors / secs >= T.paging_major_faults_per_s or swap / secs >= T.swap_bytes_per_s
    )


def evaluate(con, ctx: Context) -> list[Chain]:
    sysw = host_memory(con)
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        chain = _evaluate_pid(con, ctx, pid, rows, sysw)
        if chain:
            chains.append(chain)
    return chains


def _evaluate_pid(con, ctx, pid, rows, sysw) -> Chain | None:
    fault_rates = [r["faults_n"] / (r["wall_ns"] / 1e9) for r in rows]
    quiet = sorted(fault_rates)[: max(1, len(rows) // 4)]
    quiet_rate = baseline.median(quiet)
    for r, rate in zip(rows, fault_rates):
        swap, majors, mem = sysw.get(int(r["w"]), (0.0, 0.0, 0.0))
        secs = r["wall_ns"] / 1e9
        r["mem_signal"] = max(
            swap / secs / T.swap_bytes_per_s,
            majors / secs / T.major_faults_per_s,
            max(0.0, (mem - T.mem_floor_pct) / (T.mem_pct - T.mem_floor_pct)),
            min(rate / T.faults_per_s, rate / (T.faults_ratio * quiet_rate) if quiet_rate else rate / T.faults_per_s),
            r["faults_ns"] / r["wall_ns"] / T.min_fault_share if r["wall_ns"] else 0.0,
            r["io_ns"] / r["wall_ns"] / T.min_io_share if paging(r, sysw) else 0.0,
        )
        r["fault_rate"] = rate
    s = baseline.split(rows, lambda r: r["mem_signal"], 1.0)
    if not s.evidence:
        return None
    io_share = baseline.mean_share(s.evidence, "io_ns")
    fault_share = baseline.mean_share(s.evidence, "faults_ns")
    base_rate, ev_rate, drop = baseline.throughput(s)
    corr = baseline.evidence_correlation(s, lambda r: r["mem_signal"], baseline.ops_rate, expect=-1)
    if not (io_share >= T.min_io_share or fault_share >= T.min_fault_share
            or (s.has_baseline and drop >= T.min_drop)):
        return None
    lost = io_share + fault_share
    severity = ("HIGH" if lost >= T.high_io_share or fault_share >= T.high_fault_share or drop >= T.high_drop
                else "MEDIUM")
    ws = [int(r["w"]) for r in s.evidence]
    wall = sum(r["wall_ns"] for r in s.evidence)
    swap = sum(sysw.get(w, (0, 0, 0))[0] for w in ws)
    majors = sum(sysw.get(w, (0, 0, 0))[1] for w in ws)
    mem = max(sysw.get(w, (0, 0, 0))[2] for w in ws)
    faulters = con.execute(FAULTERS_SQL, {"ws": ws}).fetchall()
    names = procs.lookup(con, [pid] + [f[0] for f in faulters])
    me = names[pid]
    ev_fault_rate = baseline.median([r["fault_rate"] for r in s.evidence])
    root = []
    if swap or majors:
        root.append(f"{units.size(swap)} swapped in/out and {units.count(majors)} major faults host-wide "
                    f"in {len(ws)} windows")
    paged = [r for r in s.evidence if paging(r, sysw)]
    if paged:
        root.append(
            f"{me.label} took page faults while in D state {units.pct(baseline.mean_share(paged, 'io_ns'))} "
            f"of wall clock in {len(paged)} windows: its pages are read back from disk"
        )
    if mem:
        root.append(f"memory in use up to {mem:.1f}%")
    if faulters:
        root.append(
            f"{names[faulters[0][0]].label}: {units.count(ev_fault_rate)} page faults/s "
            f"(quiet windows: {units.count(quiet_rate)}/s)"
        )
    effect = []
    io_ns = sum(r["io_ns"] for r in s.evidence)
    faults_ns = sum(r["faults_ns"] for r in s.evidence)
    copy_faults = sum(r["copy_faults_n"] for r in s.evidence)
    if faults_ns:
        effect.append(f"{me.label} handled page faults {units.ns(faults_ns)} of {units.ns(wall)} "
                      f"({units.pct(fault_share)})")
    if copy_faults:
        effect.append(f"{units.count(copy_faults)} faults inside copy calls: the copy source is paged in while copying")
    if io_ns:
        effect.append(f"{me.label} in D state (faults, reclaim) {units.ns(io_ns)} of {units.ns(wall)} "
                      f"({units.pct(io_share)})")
    if s.has_baseline and drop > 0:
        effect.append(
            f"CUDA ops/s down {units.pct(drop)} under pressure ({units.count(base_rate)} → {units.count(ev_rate)})"
        )
    fix = ["lower host memory use: smaller batch or prefetch_factor, fewer DataLoader workers (each holds a copy)"]
    culprits = []
    held = holders(con, ctx, ctx.window_bounds(ws[-1])[1])
    if held:
        hp, _, peak, growth = held[0]
        hnames = procs.lookup(con, [hp])
        h = hnames[hp]
        mine = hp == pid or h.child_of(pid)
        who = h.role(pid) if hp != pid else h.name
        grew = f", grew {units.size(growth)} over the range" if growth > 0 else ""
        root.append(f"memory held by {who} (PID {hp}): RSS up to {units.size(peak)}{grew}")
        culprits.append(Culprit(hp, who, f"RSS {units.size(peak)}{grew}"))
        if not mine:
            fix.append(
                f"stop PID {hp} ({h.name}) or cap it: "
                f"systemd-run --scope -p MemoryMax=<limit> {h.command}   (it holds {units.size(peak)})"
            )
        else:
            fix.append(f"PID {hp} is the job itself{' (a worker)' if hp != pid else ''}: "
                       f"it holds {units.size(peak)}; shrink what it keeps resident")
    else:
        fix.append(
            "find what holds the memory: ps -eo pid,rss,comm --sort=-rss | head   (then stop it, or cap it with "
            "systemd-run --scope -p MemoryMax=...)"
        )
    fix.append(f"reuse buffers instead of allocating per step in {me.command}; pre-allocate pinned buffers once")
    return baseline.chain(
        ID, TITLE, ctx, pid, s,
        severity=severity,
        root=root,
        effect=effect,
        contributing=[f"{names[f[0]].name} (PID {f[0]}): {units.count(f[1])} page faults" for f in faulters[1:3]],
        fix=fix,
        culprits=culprits,
        corr=corr,
        corr_note='CUDA ops/s fall as memory pressure rises',
        impact=lost,
        numbers={
            "io_wait_share": round(io_share, 4),
            "fault_share": round(fault_share, 4),
            "swap_bytes": swap,
            "major_faults": majors,
            "faults_per_s": round(ev_fault_rate, 1),
            "faults_per_s_quiet": round(quiet_rate, 1),
            "throughput_drop": round(drop, 4),
        },
    )
