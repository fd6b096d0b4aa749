"""lock-contention: the loop waits for a lock (the GIL) that another thread of its process holds.

Physics: a Python thread that wants the GIL waits on a condition variable
(a futex) 5 ms at a time, then asks the holder to drop it; a thread that
serialises metrics, decodes images or logs in pure Python holds it between
those requests.  A C++ mutex held across work blocks the same way.  The
trace shows it without guessing (waits.py): the loop's futex waits end when
a sibling thread wakes it (it released the lock), or run out while that
sibling was on CPU.  The cause metric is the loop's blocked time, outside
CUDA calls, whose root is another thread of the same process on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, cpu_samples, procs, units, waits
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit

ID = "lock-contention"
TITLE = "A lock or the GIL held by another thread of the process → the training loop waits"


@dataclass(frozen=True)
class Thresholds:
    # Evidence window: the loop waits for a sibling thread this share of its wall clock.  A
    # loop whose helper threads take the GIL briefly (a logger flushing once a second) waits
    # a few percent at most.
    min_share: float = 0.10
    high_share: float = 0.30
    # Waits that ran out while the holder ran: this share of the lock time says "the GIL"
    # (CPython's 5 ms interval) rather than a mutex or a queue the thread fills.
    gil_timed_out_share: float = 0.3


T = Thresholds()

HOLDERS_SQL = """
SELECT b.root_tid, sum(b.ns), sum(b.ns) FILTER (b.detail = 'futex (timed out)'), sum(b.n),
       any_value(t.name)
FROM ing_block b LEFT JOIN thread_names t ON t.pid = b.pid AND t.tid = b.root_tid
WHERE b.pid = $pid AND b.tid = $tid AND list_contains($ws, b.w) AND b.root = 'on-cpu' AND b.root_pid = b.pid
  AND b.root_tid <> b.tid
GROUP BY b.root_tid ORDER BY sum(b.ns) DESC
"""


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    loops = baseline.loop_threads(ctx)
    for pid, rows in baseline.windows_by_pid(ctx).items():
        tid = loops.get(pid)
        if tid is None:
            continue
        held = waits.lock_wait_by_window(con, pid, tid)
        for r in rows:
            r["lock_ns"] = held.get(int(r["w"]), 0.0)

        def share(r: baseline.Row) -> float:
            return r["lock_ns"] / r["wall_ns"] if r["wall_ns"] else 0.0

        s = baseline.split(rows, share, T.min_share)
        if not s.evidence:
            continue
        ws = [int(r["w"]) for r in s.evidence]
        wall = sum(r["wall_ns"] for r in s.evidence)
        lock = sum(r["lock_ns"] for r in s.evidence)
        impact = lock / wall if wall else 0.0
        holders = con.execute(HOLDERS_SQL, {"pid": pid, "tid": tid, "ws": ws}).fetchall()
        if not holders:
            continue
        me = procs.lookup(con, [pid])[pid]
        timed_out = sum(float(h[2] or 0) for h in holders)
        gil = timed_out >= T.gil_timed_out_share * lock
        what = "the GIL" if gil else "a lock"
        top_tid, top_ns, _, _, top_name = holders[0]
        label = f"thread {top_name or '?'} (TID {top_tid})"
        root = [f"{me.label}: its loop thread (TID {tid}) waited for {what} held by {label} "
                f"{units.ns(lock)} of {units.ns(wall)} ({units.pct(impact)} of the loop's time in {len(ws)} of "
                f"{len(rows)} windows)"]
        if gil:
            root.append(f"{units.ns(timed_out)} of it in GIL-style waits that ran out while the holder ran "
                        f"(CPython asks the holder to drop the GIL every 5 ms)")
        if len(holders) > 1:
            root.append("also held by " + ", ".join(f"thread {h[4] or '?'} (TID {h[0]}) {units.ns(h[1])}"
                                                 for h in holders[1:4]))
        base_rate, ev_rate, drop = baseline.throughput(s)
        effect = [f"the loop launches nothing while it waits: CUDA calls stall {units.pct(impact)} of wall clock"]
        if s.has_baseline and drop > 0:
            effect.append(f"CUDA ops/s down {units.pct(drop)} from clean windows "
                          f"({units.count(base_rate)} → {units.count(ev_rate)})")
        contributing = []
        sampled, lines = cpu_samples.user_lines(ctx, int(top_tid), ws)
        if sampled:
            contributing.append(f"{label} sampled on CPU {sampled:,} times at ~99 Hz; its own lines:")
            contributing += [f"  {n / sampled * 100:4.1f}%  {site.short()}  {site.function}"
                             + (f": {site.source.strip()}" if site.source else "") for site, n in lines]
        else:
            contributing.append(f"trace with --stack to name the Python line {label} runs")
        fix = [f"py-spy dump --pid {pid}   (the Python line {label} runs while it holds {what})"]
        if gil:
            fix.append(f"move {label}'s work out of the process or out of Python: a multiprocessing worker or a "
                       "queue to a logger process, orjson/msgspec for serialisation, or a C extension that "
                       "releases the GIL")
            fix.append("do it less often: aggregate metrics and serialise once every N steps")
        else:
            fix.append(f"shorten the critical section {label} holds, or hand the loop its data without the lock")
        chains.append(baseline.chain(
            ID, TITLE, ctx, pid, s,
            severity="HIGH" if impact >= T.high_share else "MEDIUM",
            root=root, effect=effect, fix=fix,
            contributing=contributing,
            culprits=[Culprit(pid, f"thread {h[4] or '?'}", f"{units.ns(h[1])} of the loop's wait",
                              tid=int(h[0])) for h in holders[:4]],
            corr=baseline.evidence_correlation(s, share, baseline.ops_rate, expect=-1),
            corr_note="CUDA ops/s fall as the wait for the lock grows",
            impact=impact,
            numbers={"lock_wait_share": round(impact, 4), "lock_wait_ns": lock, "gil": float(gil),
                     "holder_tid": int(top_tid), "timed_out_ns": timed_out},
        ))
    return chains
