"""`ingero import` of a large Kineto trace: MB/s of uncompressed JSON and peak resident memory.

Run from the repo root: ``.venv/bin/python -m bench.bench_import [--mb 2048] [--no-gzip]``.

By default the built trace is written gzip-compressed (level 1) and the .json.gz
imported: a 2 GB trace then takes 223 MB on disk (this box's disk is nearly
full), and the figures are still per MB of *uncompressed* JSON (the importer
inflates it as it streams).  ``--no-gzip`` measures plain JSON.

The trace is built by repeating the steps of a real one (tests/data/kineto/
v100_rank0.pt.trace.json.gz, 15 MB, 68,692 events): each copy's events are
shifted by the trace's span and get new correlation ids and step numbers, and
are written one per line as Kineto writes them.  The import runs as a separate
`ingero import` process into a fresh DuckDB file; its peak RSS is the child's
ru_maxrss, its CPU time the child's user + system time (all threads): on a
shared box the wall time says as much about the neighbours as about the
import.  Targets (issue 26): >= 50 MB/s of uncompressed JSON, < 2 GB RSS for a
2 GB trace.  The stored rows are checked against the copies' counts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "data" / "kineto" / "v100_rank0.pt.trace.json.gz"
TARGET_MB_S = 50.0
TARGET_RSS_BYTES = 2 << 30


def build(path: Path, size_mb: int, gz: bool = False) -> tuple[int, int, dict[str, int]]:
    """Write a trace of about ``size_mb`` MB (gzip level 1 with ``gz``); (uncompressed bytes, copies,
    rows expected per table)."""
    with gzip.open(SOURCE, "rt") as f:
        trace = json.load(f)  # 15 MB of test data: fine here, never in the importer
    events = trace.pop("traceEvents")
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    span_us = max(e["ts"] + e.get("dur", 0) for e in xs) - min(e["ts"] for e in xs) + 1000
    max_corr = max((e.get("args", {}).get("correlation", 0) for e in events), default=0) + 1
    per_copy = {
        "calls": sum(1 for e in xs if e.get("cat") == "cuda_runtime"),
        "device": sum(1 for e in xs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        "spans": sum(1 for e in xs if e.get("cat") in ("cpu_op", "user_annotation")),
    }
    head = json.dumps({k: v for k, v in trace.items() if k not in ("INFO", "traceName")}, indent=2)
    size = size_mb << 20
    copies = 0
    total = 0
    with (gzip.open(path, "wt", compresslevel=1) if gz else open(path, "w")) as out:
        out.write(head[:-2] + ',\n  "traceEvents": [\n')
        written = 0
        first = True
        while written < size:
            shift = copies * span_us
            lines = []
            for e in events:
                e = dict(e)
                if "ts" in e and isinstance(e["ts"], (int, float)):
                    e["ts"] = round(e["ts"] + shift, 3)
                args = e.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e["args"] = {**args, "correlation": args["correlation"] + copies * max_corr}
                if isinstance(e.get("id"), int):
                    e["id"] = e["id"] + copies * max_corr
                name = e.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name[13:]) + copies * 1000}"
                lines.append(json.dumps(e))
            chunk = ("  " if first else ",\n  ") + ",\n  ".join(lines)
            first = False
            out.write(chunk)
            written += len(chunk)
            copies += 1
        tail = '\n  ],\n  "traceName": "bench",\n  "displayTimeUnit": "ms"\n}\n'
        out.write(tail)
        total = len(head[:-2].encode()) + len(',\n  "traceEvents": [\n') + written + len(tail)
    expected = {k: v * copies for k, v in per_copy.items()}
    return (total if gz else path.stat().st_size), copies, expected


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
    ap.add_argument("--mb", type=int, default=2048, help="size of the built trace in MB (default 2048)")
    ap.add_argument("--gzip", action=argparse.BooleanOptionalAction, default=True,
                    help="build and import a .json.gz, level 1 (default: a 2 GB trace is 223 MB on disk); "
                         "--no-gzip writes the JSON as it is")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the trace and DB (default: a temp dir)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ingero-bench-import-", dir=args.dir) as tmp:
        trace = Path(tmp) / ("big.pt.trace.json.gz" if args.gzip else "big.pt.trace.json")
        db = Path(tmp) / "import.duckdb"
        t0 = time.monotonic()
        size, copies, expected = build(trace, args.mb, args.gzip)
        build_s = time.monotonic() - t0
        wall, cpu, rss = run_import(trace, db)
        con = duckdb.connect(str(db), read_only=True)
        got = {
            "calls": con.execute("SELECT count(*) FROM events").fetchone()[0],
            "device": con.execute("SELECT count(*) FROM device_activity").fetchone()[0],
            "spans": con.execute("SELECT count(*) FROM spans").fetchone()[0],
        }
        unused_calls = sum(v for k, v in json.loads(con.execute("SELECT import_unused FROM sessions").fetchone()[0])
                           .items() if k.startswith("CUDA calls without an op name"))
        con.close()
        got["calls"] += unused_calls  # calls without an op name are counted, not stored
        mb_s = size / 1e6 / wall
        on_disk = f", {trace.stat().st_size / 1e6:,.0f} MB gzip'd on disk" if args.gzip else ""
        print(f"trace: {size / 1e6:,.0f} MB uncompressed{on_disk}, {copies} copies of {SOURCE.name} "
              f"(built in {build_s:.0f} s)\n")
        print("| measure | value | target | met |")
        print("|---|---|---|---|")
        print(f"| import throughput | {mb_s:.1f} MB/s ({wall:.1f} s) | >= {TARGET_MB_S:.0f} MB/s | "
              f"{'yes' if mb_s >= TARGET_MB_S else 'NO'} |")
        rss_ok = rss < TARGET_RSS_BYTES or size < (2 << 30) * 0.9
        print(f"| CPU time of the import (all its threads) | {cpu:.1f} s: {size / 1e6 / cpu:.1f} MB per CPU-second "
              f"| (wall time on a busy box is CPU-starved) | |")
        print(f"| peak RSS | {rss / 2**20:,.0f} MiB | < 2048 MiB for a 2 GB trace | "
              f"{'yes' if rss < TARGET_RSS_BYTES else 'NO'} |")
        print(f"| rows stored (calls, device, spans) | {got['calls']:,} / {got['device']:,} / {got['spans']:,} | "
              f"{expected['calls']:,} / {expected['device']:,} / {expected['spans']:,} | "
              f"{'yes' if got == expected else 'NO'} |")
        print(f"\nload average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        return 0 if got == expected and rss_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
