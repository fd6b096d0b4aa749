"""Export rate and peak memory: `ingero export` (perfetto, parquet) and `ingero report` over 1 M events.

Builds the store with bench_explain.build (the mix a traced training job
produces), made to hold what the tracer stores (``as_traced``: bytes only on
copies and block I/O, NULL elsewhere; one thread off the CPU once at a time,
each off-CPU interval ending by the thread's next one), then runs each export
in its own process (the CLI's path: read-only store, explain, write) and
reports wall time, events per second, bytes per event in the output and the
child's peak RSS (ru_maxrss).  Prints a markdown table.

The box is shared (2 cores, load 5-20 from other jobs): beside the wall time it
prints the child's CPU time (user + system, all its threads) and events per
CPU-second, the rate a quiet core would give, and the load average at each run.

    python -m bench.bench_export                  # 10 M events (the targets are for 10 M)
    python -m bench.bench_export --sizes 1e6,1e7 --dir /tmp/ingero-bench --keep
    python -m bench.bench_export --sizes 1e7 --only perfetto --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.bench_explain import build

# Issue 18's targets for the Perfetto export of 10 M events.
TARGET_EVENTS_S = 1_000_000
TARGET_BYTES_PER_EVENT = 30

RUNS = (("perfetto", ["export", "--format", "perfetto"], "trace.pftrace"),
        ("parquet", ["export", "--format", "parquet"], "parquet"),
        ("report", ["report", "--html"], "report.html"))


def as_traced(db: Path) -> None:
    """What the tracer would have stored of bench_explain's draws (its generator draws each row alone)."""
    import duckdb

    con = duckdb.connect(str(db))
    con.execute("UPDATE events SET bytes = NULL WHERE op NOT IN ('cudaMemcpy', 'cudaMemcpyAsync', 'block_io')")
    # a thread leaves the CPU once at a time: an off-CPU interval ends by the thread's next one
    con.execute("""UPDATE events SET duration_ns = least(events.duration_ns, n.next_ts - events.timestamp)
                   FROM (SELECT rowid AS id, lead(timestamp) OVER (PARTITION BY pid, tid ORDER BY timestamp) AS next_ts
                         FROM events WHERE op = 'sched_switch') n
                   WHERE events.rowid = n.id AND n.next_ts IS NOT NULL""")
    con.execute("CHECKPOINT")
    con.close()


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_one(db: Path, args: list[str], out: Path) -> tuple[float, int, int, float]:
    """(wall seconds, output bytes, peak RSS bytes, CPU seconds) of one CLI run in a child process."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "ingero", *args, "--db", str(db), "-o", str(out)],
                             stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage: its peak RSS
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if child.returncode != 0:
        raise SystemExit(f"ingero {' '.join(args)} failed (exit {child.returncode})")
    return wall, _size(out), usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e7", help="comma-separated event counts")
    ap.add_argument("--dir", default="/tmp/ingero-bench-export")
    ap.add_argument("--keep", action="store_true", help="reuse an existing DB file of the right size")
    ap.add_argument("--only", choices=[r[0] for r in RUNS], help="run one export only")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each export (each printed)")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| events | output | load | wall s | events/s | CPU s (all threads) | events per CPU-s | output MB "
          "| bytes/event | peak RSS MB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in (int(float(s)) for s in args.sizes.split(",")):
        db = d / f"export-{n}.duckdb"
        if not (args.keep and db.exists()):
            build(db, n)
            as_traced(db)
        for name, cli, fname in RUNS:
            if args.only and name != args.only:
                continue
            for _ in range(args.repeat):
                load = os.getloadavg()[0]
                wall, size, rss, cpu = run_one(db, cli, d / fname)
                met = ""
                if name == "perfetto":
                    met = (f" (targets: >= {TARGET_EVENTS_S:,} events/s: wall "
                           f"{'met' if n / wall >= TARGET_EVENTS_S else 'NOT met'}, per CPU-s "
                           f"{'met' if n / cpu >= TARGET_EVENTS_S else 'NOT met'}; <= {TARGET_BYTES_PER_EVENT} "
                           f"B/event {'met' if size / n <= TARGET_BYTES_PER_EVENT else 'NOT met'})")
                print(f"| {n:,} | {name}{met} | {load:.1f} | {wall:.1f} | {n / wall:,.0f} | {cpu:.1f} "
                      f"| {n / cpu:,.0f} | {size / 1e6:.1f} | {size / n:.1f} | {rss / 1e6:.0f} |", flush=True)
        if not args.keep:
            os.unlink(db)


if __name__ == "__main__":
    main()
