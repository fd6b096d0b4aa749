"""loop-sleep: the loop sleeps on its own timer while the GPU idles: nobody else makes it wait.

Physics: a loop that calls time.sleep between steps (a rate limit, a poll of a
file or a flag every few ms, a "give the GPU a rest") blocks in nanosleep /
clock_nanosleep and is woken by the timer, not by another thread (waits.py:
root 'sleep', woken from an interrupt).  With nothing queued on the device
the GPU idles through every such sleep.  No other process is a culprit; the
fix is in the loop's own code.  The cause metric is the loop's sleeps outside
CUDA calls that cost GPU time (input-bound's idle_wait_ns), the share of them
spent in its own timed sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, units, waits
from ingero.analyze.context import Context
from ingero.analyze.model import Chain
from ingero.analyze.rules.input_bound import idle_wait_ns

ID = "loop-sleep"
TITLE = "The loop sleeps on its own timer → the GPU idles while it sleeps"


@dataclass(frozen=True)
class Thresholds:
    # Evidence window: the loop's own sleeps cost GPU time at least this share of wall clock
    # (as input-bound's waits for data: a loop that naps 1 ms a step loses a few percent).
    min_share: float = 0.20
    high_share: float = 0.40


T = Thresholds()

SLEEPS_SQL = """
SELECT via_call, sum(ns), sum(n) FROM ing_block
WHERE pid = $pid AND list_contains($ws, w) AND root = 'sleep' AND list_contains($sleep_calls, via_call)
  AND via_pid IN (0, pid)
GROUP BY via_call ORDER BY sum(ns) DESC
"""


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        own = waits.own_sleep_fraction(con, pid)
        if not own:
            continue
        for r in rows:
            r["own_sleep_ns"] = idle_wait_ns(r) * own.get(int(r["w"]), 0.0)

        def share(r: baseline.Row) -> float:
            return r["own_sleep_ns"] / r["wall_ns"] if r["wall_ns"] else 0.0

        s = baseline.split(rows, share, T.min_share)
        if not s.evidence:
            continue
        ws = [int(r["w"]) for r in s.evidence]
        wall = sum(r["wall_ns"] for r in s.evidence)
        slept = sum(r["own_sleep_ns"] for r in s.evidence)
        impact = slept / wall if wall else 0.0
        calls = con.execute(SLEEPS_SQL, {"pid": pid, "ws": ws, "sleep_calls": sorted(waits.SLEEP_CALLS)}).fetchall()
        n = sum(float(c[2]) for c in calls)
        me = procs.lookup(con, [pid])[pid]
        how = ", ".join(f"{c[0]} {units.count(float(c[2]))} times" for c in calls[:3]) or "a sleep call"
        root = [f"{me.label}: its loop thread slept on its own timer ({how}) with nothing queued on the device: "
                f"{units.ns(slept)} of {units.ns(wall)} ({units.pct(impact)} of the loop's time in {len(ws)} of "
                f"{len(rows)} windows)"]
        if n:
            root.append(f"{units.ns(sum(float(c[1]) for c in calls) / n)} a sleep, woken by the timer: "
                        "no other thread or process made it wait")
        base_rate, ev_rate, drop = baseline.throughput(s)
        effect = [f"the GPU has no work while the loop sleeps: {units.pct(impact)} of wall clock"]
        if s.has_baseline and drop > 0:
            effect.append(f"CUDA ops/s down {units.pct(drop)} from clean windows "
                          f"({units.count(base_rate)} → {units.count(ev_rate)})")
        fix = [f"py-spy dump --pid {pid}   (the line that sleeps: time.sleep, a rate limit or a polling loop)",
               "remove the sleep, or wait for what it polls for (a threading.Event or Condition, a queue's "
               "get()) instead of sleeping a fixed time; to hold a rate, queue the next step's work before "
               "sleeping so the GPU keeps running"]
        chains.append(baseline.chain(
            ID, TITLE, ctx, pid, s,
            severity="HIGH" if impact >= T.high_share else "MEDIUM",
            root=root, effect=effect, fix=fix,
            corr=baseline.evidence_correlation(s, share, baseline.ops_rate, expect=-1),
            corr_note="CUDA ops/s fall as the loop sleeps longer",
            impact=impact,
            numbers={"own_sleep_share": round(impact, 4), "own_sleep_ns": slept, "sleeps": n},
        ))
    return chains
