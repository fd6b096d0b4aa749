"""What writing the per-second summaries costs the tracer: CPU per event, with and without the hook.

The tracer's flush, as collect/session.py does it (decode.storage_order ->
decode.events_table -> Store.append in one transaction), is timed on
bench_ingest's realistic rows at a given rate (events per simulated second,
flushed once a second or every FLUSH_ROWS, whichever comes first), then the same
with the trace command's SummaryHook (its rows made before the transaction,
appended inside it), interleaved rounds.  CPU seconds of this process
(DuckDB's threads included), not wall time.

    python -m bench.bench_summaries                      # 30 k and 300 k events/s
    python -m bench.bench_summaries --rates 1e6 --seconds 4
    python -m bench.bench_summaries --live 3              # + the real tracer (root): its own account

``--live N`` also runs the real tracer N times (`ingero trace --cmd` on train.py's
launch-bound loop, bench_publish's machinery) and reads what the summaries cost
from the trace's own line ("summaries: N flushes summarised in X CPU-s": the
hook's thread CPU making the rows plus the session's storing them), against the
tracer's whole CPU after attach: the share of the real tracer, within one run.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench.bench_ingest import _realistic
from ingero.collect import decode
from ingero.collect.session import FLUSH_ROWS
from ingero.analyze.summaries.hook import SummaryHook
from ingero.events.units import NS
from ingero.store.db import Store

OFFSET_NS = 1_700_000_000 * NS
MAX_EVENTS = 20_000_000


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def one_run(recs: np.ndarray, rate: int, hook: bool, tmp: Path) -> tuple[float, float]:
    """(CPU s of the flushes, of which the hook's) for ``recs`` spread at ``rate`` events/s."""
    db = tmp / f"s-{rate}-{hook}.duckdb"
    db.unlink(missing_ok=True)
    store = Store.open(db)
    sess = SimpleNamespace(session_id=1, offset_ns=OFFSET_NS, store=store, notes=[], derived_cpu_s=0.0)
    h = SummaryHook()
    per_flush = min(rate, FLUSH_ROWS)
    total = hook_cpu = 0.0
    for i in range(0, len(recs), per_flush):
        c = _cpu_s()
        batch = decode.storage_order(recs[i : i + per_flush])
        table = decode.events_table(batch, session_id=1, offset_ns=OFFSET_NS)
        c1 = _cpu_s()
        derived = h.flush_rows(sess, batch) if hook else []
        c2 = _cpu_s()
        with store.transaction():
            store.append("events", table)
            c3 = _cpu_s()
            for name, rows in derived:
                store.append(name, rows)
            c4 = _cpu_s()
        total += _cpu_s() - c
        hook_cpu += (c2 - c1) + (c4 - c3)
    if hook:  # the rows still held at the end, written as the trace's end writes them
        c = _cpu_s()
        h.on_end(sess)
        total += _cpu_s() - c
        hook_cpu += _cpu_s() - c
    store.close()
    db.unlink(missing_ok=True)
    return total, hook_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="3e4,3e5", help="events per simulated second, comma-separated")
    ap.add_argument("--seconds", type=float, default=10, help="simulated seconds per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--live", type=int, default=0, metavar="N", help="also N runs of the real tracer (root)")
    ap.add_argument("--live-duration", type=float, default=20, help="seconds of workload per live run")
    args = ap.parse_args()
    # one line and exit 2 for what cannot be run (a NaN fails every comparison: checked as "not ok")
    if not args.rounds >= 1:
        ap.error(f"--rounds must be at least 1, not {args.rounds}")
    if not (math.isfinite(args.seconds) and args.seconds > 0):
        ap.error(f"--seconds must be a positive number, not {args.seconds}")
    if not args.live >= 0:
        ap.error(f"--live must be 0 or more, not {args.live}")
    if not (math.isfinite(args.live_duration) and args.live_duration > 0):
        ap.error(f"--live-duration must be a positive number, not {args.live_duration}")
    try:
        rates = [int(float(r)) for r in args.rates.split(",")]
    except (ValueError, OverflowError):
        ap.error(f"--rates must be numbers separated by commas, not {args.rates!r}")
    if not all(r >= 1 for r in rates):
        ap.error(f"--rates must each be at least 1, not {args.rates!r}")
    if max(rates) * args.seconds > MAX_EVENTS:  # 56 bytes a record, held twice
        ap.error(f"--rates x --seconds is at most {MAX_EVENTS:,} events a round, not {max(rates) * args.seconds:,.0f}")
    print(f"summaries hook cost per flushed event ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start, "
          f"{args.rounds} interleaved rounds, CPU seconds of the writer)\n")
    print("| events/s | events | flush µs/event | with hook µs/event | hook µs/event | hook share of flush CPU |")
    print("|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="ingero-sum-", dir="/var/tmp") as d:
        tmp = Path(d)
        for rate in rates:
            n = int(rate * args.seconds)
            recs = _realistic(n)
            # the realistic mix's timestamps run at ~500 k/s: respace them to the rate
            recs["ts_ns"] = (10**12 + np.arange(n, dtype=np.uint64) * np.uint64(NS // rate)).astype(np.uint64)
            # warm-up: one-time costs (imports, first calls)
            one_run(recs[: 2 * min(rate, FLUSH_ROWS)], rate, True, tmp)
            base, with_hook, hooks = [], [], []
            for _ in range(args.rounds):
                base.append(one_run(recs, rate, False, tmp)[0] / n)
                t, hc = one_run(recs, rate, True, tmp)
                with_hook.append(t / n)
                hooks.append(hc / n)
            b, w, hk = statistics.median(base), statistics.median(with_hook), statistics.median(hooks)
            print(f"| {rate:,} | {n:,} | {b * 1e6:.3f} | {w * 1e6:.3f} | {hk * 1e6:.3f} | {hk / b * 100:.1f}% |",
                  flush=True)
    print(f"\n(load {os.getloadavg()[0]:.1f} at the end; {time.strftime('%H:%M UTC', time.gmtime())})")
    if args.live:
        live(args.live, args.live_duration)


def live(runs: int, duration: float) -> None:
    import re
    import shutil

    from bench.bench_publish import WORKLOADS, one_run

    print(f"\nThe real tracer, `ingero trace --cmd` on the {WORKLOADS['launches']!r} loop, {duration:g} s per run:\n")
    print("| run | events | events/s | tracer CPU-s after attach | summaries CPU-s | share of the tracer | load |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for i in range(runs):
        tmp = Path(tempfile.mkdtemp(prefix="ingero-bench-summaries-", dir="/var/tmp"))
        try:
            r = one_run(tmp, "plain", duration, 300, "launches")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        m = next((re.search(r"summaries: ([\d,]+) flushes summarised in ([0-9.]+) CPU-s", n) for n in r["notes"]
                  if n.startswith("summaries:")), None)
        if m is None:
            raise SystemExit(f"the trace printed no summaries line: {r['notes']}")
        cpu = float(m[2])
        print(f"| {i + 1} | {r['events']:,} | {r['events'] / r['wall_s']:,.0f} | {r['tracer_cpu_s']:.2f} | {cpu:.3f} | "
              f"{cpu / r['tracer_cpu_s']:.1%} | {r['load']} |", flush=True)


if __name__ == "__main__":
    main()
