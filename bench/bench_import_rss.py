"""`ingero import` of millions of small events: peak resident memory against the event count.

Run from the repo root: ``.venv/bin/python -m bench.bench_import_rss [--events 1e6 5e6 10e6] [--gzip]``.

Each trace holds N small events (~150 bytes of JSON each, as issue 41 measured:
5 M events in 0.7 GB): CUDA launches (cuda_runtime) and the kernels they
submitted (kernel, linked by correlation id), alternately.  Each is imported by
`ingero import` in a process of its own into a fresh DuckDB file; its peak RSS
is the child's ru_maxrss.  The importer's memory must not grow with the event
count: the staged rows live in a scratch DuckDB file (source.py, raw.py), DuckDB
works within ingero.importer.MEMORY_LIMIT, and the reader holds a bounded number
of pieces.  The stored rows are checked against the counts written.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
TARGET_RSS_BYTES = 2 << 30  # the README's bound for a 2 GB trace


def build(path: Path, n: int, gz: bool) -> int:
    """Write n events (half launches, half kernels); the uncompressed size in bytes."""
    size = 0
    opener = (lambda p: gzip.open(p, "wt", compresslevel=1)) if gz else (lambda p: open(p, "w"))
    with opener(path) as f:
        head = '{"schemaVersion": 1, "traceEvents": [\n'
        f.write(head)
        size += len(head)
        t0 = 1_700_000_000_000_000
        lines = []
        for i in range(n):
            if i % 2 == 0:
                lines.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                             f'"ts": {t0 + i}, "dur": 1, "args": {{"correlation": {i}}}}},\n')
            else:
                lines.append(f'{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {t0 + i}, '
                             f'"dur": 1, "args": {{"correlation": {i - 1}, "stream": 7}}}},\n')
            if len(lines) == 100_000:
                chunk = "".join(lines)
                f.write(chunk)
                size += len(chunk)
                lines = []
        tail = "".join(lines) + '{"ph": "i", "name": "end", "pid": 1, "tid": 1, "ts": 0}\n]}\n'
        f.write(tail)
        size += len(tail)
    return size


def run_import(trace: Path, db: Path) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS (bytes) of `ingero import` in its own process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ingero", "import", "--db", str(db), str(trace)],
                          env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"import failed: {proc.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss * 1024


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=float, nargs="+", default=[1e6, 5e6], help="event counts (default 1e6 5e6)")
    ap.add_argument("--gzip", action="store_true", help="write and import .json.gz (level 1)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the traces and DBs (default: a temp dir)")
    args = ap.parse_args(argv)
    print("| events | JSON | import wall | CPU | peak RSS | rows stored (events, device_activity) |")
    print("|---|---|---|---|---|---|")
    ok = True
    for n in (int(x) for x in args.events):
        with tempfile.TemporaryDirectory(prefix="ingero-bench-rss-", dir=args.dir) as tmp:
            trace = Path(tmp) / ("small.json.gz" if args.gzip else "small.json")
            db = Path(tmp) / "import.duckdb"
            size = build(trace, n, args.gzip)
            wall, cpu, rss = run_import(trace, db)
            con = duckdb.connect(str(db), read_only=True)
            got = (con.execute("SELECT count(*) FROM events").fetchone()[0],
                   con.execute("SELECT count(*) FROM device_activity").fetchone()[0])
            con.close()
            want = ((n + 1) // 2, n // 2)
            ok &= got == want and rss < TARGET_RSS_BYTES
            print(f"| {n:,} | {size / 1e6:,.0f} MB | {wall:.1f} s | {cpu:.1f} s | {rss / 2**20:,.0f} MiB | "
                  f"{got[0]:,} / {got[1]:,} {'(right)' if got == want else f'(WRONG: want {want})'} |", flush=True)
    print(f"\nload average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
