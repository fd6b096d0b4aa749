"""output-bound: the loop blocks writing its output (a log piped to a slow reader) while the GPU idles.

Physics: a write into a full pipe or socket buffer blocks until the other
end reads: a training loop printing a line a step into `| tee`, a log
shipper or a terminal that reads slower, or a server answering a slow
client.  The loop blocks in write / sendmsg outside any CUDA call, and the
consumer's read wakes it (waits.py: via_call a write, via_fd pipe or socket,
via_pid the reader).  It waits for its output to drain, not for input, so it
is not input-bound.  The cause metric is the loop's sleeps outside CUDA calls
that cost GPU time (input-bound's idle_wait_ns), the share of them spent in
blocked writes to a pipe or socket.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, units, waits
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit
from ingero.analyze.rules.input_bound import idle_wait_ns

ID = "output-bound"
TITLE = "The loop blocks writing its output (a pipe or socket that drains slowly) → the GPU idles"


@dataclass(frozen=True)
class Thresholds:
    # Evidence window: blocked writes cost GPU time at least this share of wall clock
    # (a pipe that keeps up never blocks the writer: a loop logging to a terminal waits ~0).
    min_share: float = 0.20
    high_share: float = 0.40


T = Thresholds()


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        out = waits.output_fraction(con, pid)
        if not any(out.values()):
            continue
        for r in rows:
            r["output_ns"] = idle_wait_ns(r) * out.get(int(r["w"]), 0.0)

        def share(r: baseline.Row) -> float:
            return r["output_ns"] / r["wall_ns"] if r["wall_ns"] else 0.0

        s = baseline.split(rows, share, T.min_share)
        if not s.evidence:
            continue
        ws = [int(r["w"]) for r in s.evidence]
        wall = sum(r["wall_ns"] for r in s.evidence)
        blocked = sum(r["output_ns"] for r in s.evidence)
        impact = blocked / wall if wall else 0.0
        found = waits.consumers(con, pid, ws)
        readers = [c for c in found if c[0] not in (0, -1, pid)]
        names = procs.lookup(con, [pid] + [c[0] for c in readers])
        me = names[pid]
        n = sum(c[3] for c in found)
        root = [f"{me.label}: its loop thread blocked writing into a full pipe or socket "
                f"{units.count(n)} times, {units.ns(blocked)} of {units.ns(wall)} ({units.pct(impact)} of the "
                f"loop's time in {len(ws)} of {len(rows)} windows), with nothing queued on the device"]
        if readers:
            top = readers[0]
            doing = {"sleep": "sleeping", "on-cpu": "on CPU", "cpu": "waiting for a CPU"}.get(top[4], top[4])
            root.append(f"the other end, {names[top[0]].label}, made room each time: it reads slower than the "
                        f"loop writes (mostly {doing} in between)")
        else:
            root.append("the other end is not traced (a remote peer, or a process outside the trace)")
        base_rate, ev_rate, drop = baseline.throughput(s)
        effect = [f"the loop launches nothing while its write waits: the GPU idles {units.pct(impact)} of wall clock"]
        if s.has_baseline and drop > 0:
            effect.append(f"CUDA ops/s down {units.pct(drop)} from clean windows "
                          f"({units.count(base_rate)} → {units.count(ev_rate)})")
        fix = ["log less per step, or off the loop thread: logging.handlers.QueueHandler with a QueueListener "
               "(the listener thread blocks, not the loop)",
               "write the log to a file instead of a pipe, and read that file with tail -f"]
        if readers:
            fix.append(f"or make the reader, PID {readers[0][0]}, keep up (it drains the pipe the loop writes into)")
        chains.append(baseline.chain(
            ID, TITLE, ctx, pid, s,
            severity="HIGH" if impact >= T.high_share else "MEDIUM",
            root=root, effect=effect, fix=fix,
            culprits=[Culprit(c[0], names[c[0]].name, f"{units.ns(c[2])} of the loop's blocked writes")
                      for c in readers[:3]],
            corr=baseline.evidence_correlation(s, share, baseline.ops_rate, expect=-1),
            corr_note="CUDA ops/s fall as the loop's blocked writes grow",
            impact=impact,
            numbers={"output_wait_share": round(impact, 4), "output_wait_ns": blocked, "blocked_writes": n},
        ))
    return chains
