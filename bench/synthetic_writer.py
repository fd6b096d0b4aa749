"""A synthetic tracer process: writes event batches like `ingero trace` does, without BPF.

For the daemon's tests and measurements (retention, memory, kill -9, disk
full, live queries): it holds the DB as the only writer, flushes Arrow
batches through Store.append every FLUSH interval, keeps its session row's
heartbeat, optionally applies Retention and serves a QueryServer.  One JSON
line per flush on stdout tells the parent what was acknowledged (committed).
The rows come from the synthetic trace generator (ingero.demo.synthetic.event_batch).
Not part of the package: run it by path.

    python bench/synthetic_writer.py --db /tmp/x.duckdb --rate 50000 --serve
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np
import pyarrow as pa

from ingero.store.retention import Retention
from ingero.demo.synthetic import event_batch
from ingero.store.db import Store


def metrics_row(session_id: int, ts_ns: int) -> pa.Table:
    return pa.table({"session_id": pa.array([session_id], pa.int32()), "timestamp": pa.array([ts_ns], pa.int64()),
                     "cpu_pct": [50.0], "mem_pct": [40.0], "ncpu": pa.array([2], pa.int32())})


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--rate", type=float, default=20_000, help="events per second")
    ap.add_argument("--flush-s", type=float, default=0.2, help="seconds between appends (the tracer uses <= 1)")
    ap.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: until SIGTERM)")
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="event-time seconds per wall second (simulate days of retention quickly)")
    ap.add_argument("--retain", type=float, default=None, help="retention window, seconds of event time")
    ap.add_argument("--max-db", type=int, default=None, help="bytes")
    ap.add_argument("--retention-every", type=float, default=1.0, help="wall seconds between Retention.apply")
    ap.add_argument("--serve", action="store_true", help="serve a QueryServer (INGERO_SOCKET or default path)")
    ap.add_argument("--memory-limit", type=int, default=None, help="DuckDB memory limit in bytes")
    args = ap.parse_args(argv)

    store = Store.open(args.db)
    store.mark_crashed_sessions()
    sid = store.begin_session(command="synthetic " + " ".join(argv or sys.argv[1:]), targets="synthetic writer")
    server = None
    if args.serve or args.memory_limit:
        from ingero.daemon.server import DEFAULT_MEMORY_LIMIT_BYTES, QueryServer, lock_down
        mem = args.memory_limit or DEFAULT_MEMORY_LIMIT_BYTES
        if args.serve:
            server = QueryServer(store.con.cursor, memory_limit_bytes=mem).start()
        else:
            lock_down(store.con, memory_limit_bytes=mem)
    retention = Retention(args.retain, args.max_db) if (args.retain or args.max_db) else None

    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    rng = np.random.default_rng(os.getpid())
    t_start = time.time_ns()
    wall0 = time.monotonic()
    acked = 0
    last_event_ns = t_start
    last_retention = wall0
    _emit({"ready": True, "session_id": sid, "pid": os.getpid(),
           "socket": str(server.socket_path) if server else None})
    try:
        while not stop:
            time.sleep(args.flush_s)
            elapsed = time.monotonic() - wall0
            now_ev = t_start + int(elapsed * args.time_scale * 1e9)
            n = int(args.rate * args.flush_s)
            batch = event_batch(sid, last_event_ns, now_ev, n, rng)
            store.append("events", batch)
            store.append("system_metrics", metrics_row(sid, now_ev))
            acked += n
            last_event_ns = now_ev
            store.update_session(sid, events=acked, heartbeat_ns=time.time_ns())
            out: dict[str, Any] = {"acked": acked, "event_ns": now_ev, "rss_bytes": _rss_bytes()}
            if retention and time.monotonic() - last_retention >= args.retention_every:
                out["retention"] = retention.apply(store.con, now_ev)
                last_retention = time.monotonic()
            _emit(out)
            if args.duration and elapsed >= args.duration:
                break
    except Exception as exc:  # the point of the disk-full test: say what failed, keep what was committed
        from ingero.store.faults import describe_write_error
        _emit({"error": describe_write_error(exc, args.db), "raw": str(exc).splitlines()[0] if str(exc) else "",
               "acked": acked})
        return 3
    finally:
        if server is not None:
            server.stop()
    store.end_session(sid, events=acked, drops_kernel=0, drops_user=0)
    store.close()
    _emit({"closed": True, "acked": acked})
    return 0


if __name__ == "__main__":
    sys.exit(main())
