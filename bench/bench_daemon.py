"""Daemon mode over a sustained run: memory stays bounded, the DB stays under
--max-db, and live queries over the socket stay fast while the writer writes.

Uses the BPF-free synthetic tracer (bench/synthetic_writer.py), which writes
through the same Store.append / Retention / QueryServer code as `ingero trace`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingero.daemon import client

# the BPF-free writer process (not part of the package: run by path)
WRITER = Path(__file__).resolve().with_name("synthetic_writer.py")

DURATION_S = 60
RATE = 30_000            # events/s: a busy training host
MAX_DB = 64_000_000      # the smallest bound retention accepts
QUERY = "SELECT op, count(*), quantile_cont(duration_ns, 0.99) FROM events GROUP BY op"


def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="ingero-bench-daemon-"))
    sock = d / "q.sock"
    env = {**os.environ, "INGERO_SOCKET": str(sock)}
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), "--db", str(d / "d.duckdb"), "--rate", str(RATE),
         "--flush-s", "0.5", "--duration", str(DURATION_S), "--max-db", str(MAX_DB), "--retention-every", "5",
         "--serve"],
        stdout=subprocess.PIPE, text=True, env=env)
    latencies, sizes = [], []
    lines: list[dict] = []
    t_end = time.monotonic() + DURATION_S + 30
    while writer.poll() is None and time.monotonic() < t_end:
        time.sleep(2)
        if sock.exists():
            t = time.perf_counter()
            try:
                client.query(QUERY, socket_path=sock)
                latencies.append(time.perf_counter() - t)
            except Exception:
                pass
        db = d / "d.duckdb"
        sizes.append(sum(p.stat().st_size for p in (db, Path(str(db) + ".wal")) if p.exists()))
    out, _ = writer.communicate(timeout=60)
    for line in out.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    rss = [x["rss_bytes"] for x in lines if "rss_bytes" in x]
    acked = max((x.get("acked", x.get("events", 0)) for x in lines), default=0)
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| run | {DURATION_S} s at {RATE:,} events/s, --max-db {MAX_DB / 1e6:.0f} MB, a query every 2 s |")
    print(f"| events written | {acked:,} |")
    if rss:
        print(f"| writer RSS first / max / last | {rss[0] / 1e6:.0f} / {max(rss) / 1e6:.0f} / {rss[-1] / 1e6:.0f} MB |")
    print(f"| DB file + WAL max | {max(sizes) / 1e6:.1f} MB (bound {MAX_DB / 1e6:.0f} MB) |")
    if latencies:
        print(f"| live query latency median / max | {statistics.median(latencies) * 1e3:.0f} / "
              f"{max(latencies) * 1e3:.0f} ms ({len(latencies)} queries) |")


if __name__ == "__main__":
    main()
