"""Export rate and peak memory: `ingero export` (perfetto, parquet) and `ingero report` over 1 M events.

Builds the store with bench_explain.build (the mix a traced training job
produces), then runs each export in its own process (the CLI's path: read-only
store, explain, write) and reports wall time, events per second, bytes per
event in the output and the child's peak RSS (ru_maxrss).  Prints a markdown table.

    python -m bench.bench_export                  # 1 M events
    python -m bench.bench_export --sizes 1e6,1e7 --dir /tmp/ingero-bench --keep
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

RUNS = (("perfetto", ["export", "--format", "perfetto"], "trace.pftrace"),
        ("parquet", ["export", "--format", "parquet"], "parquet"),
        ("report", ["report", "--html"], "report.html"))


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_one(db: Path, args: list[str], out: Path) -> tuple[float, int, int]:
    """(wall seconds, output bytes, peak RSS bytes) of one CLI run in a child process."""
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
    return wall, _size(out), usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6", help="comma-separated event counts")
    ap.add_argument("--dir", default="/tmp/ingero-bench-export")
    ap.add_argument("--keep", action="store_true", help="reuse an existing DB file of the right size")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    print("| events | output | wall s | events/s | output MB | bytes/event | peak RSS MB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in (int(float(s)) for s in args.sizes.split(",")):
        db = d / f"export-{n}.duckdb"
        if not (args.keep and db.exists()):
            build(db, n)
        for name, cli, fname in RUNS:
            wall, size, rss = run_one(db, cli, d / fname)
            print(f"| {n:,} | {name} | {wall:.1f} | {n / wall:,.0f} | {size / 1e6:.1f} | {size / n:.1f} "
                  f"| {rss / 1e6:.0f} |", flush=True)
        if not args.keep:
            os.unlink(db)


if __name__ == "__main__":
    main()
