"""Cost of `ingero trace --metrics-port`: the writer's work per event with metrics on vs off,
and one /metrics scrape of a tracer following 50 processes.

Run from the repo root: ``.venv/bin/python -m bench.bench_metrics`` (no root needed).

1. Per event: the flush path of TraceSession (storage order, Arrow table, DuckDB append and
   commit into a file) over realistic batches (CUDA calls of 10 processes, their switches and
   faults, host block I/O), with metrics off, then on (the same plus Aggregates.add and
   set_health: what TraceSession.flush's hook does).  Interleaved REPEATS times; medians.
   Metrics add nothing inside the traced process or in BPF: the uprobes are the same.
2. Scrape: 8 (a host's GPUs) and 50 real processes (``sleep``, so the liveness check per scrape
   is real), each with 8 CUDA ops, off-CPU, faults; diagnosis gauges for a chain on each; the
   tracer's /metrics server on a free port; SCRAPES GETs of /metrics (plain, and gzip as
   Prometheus asks), median and max.  Target: <= 50 ms.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from ingero.collect import decode
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, Kind
from ingero.metrics.aggregate import Aggregates
from ingero.metrics.diagnosis import ActiveChain, DiagnosisState
from ingero.metrics.server import MetricsServer
from ingero.store.db import Store

REPEATS = 7
BATCHES = (10_000, 245_760)  # a quiet second; FLUSH_ROWS (two DuckDB row groups) at high rates
PROCS = (8, 50)
SCRAPES = 50
CUDA = [Op.CUDA_LAUNCH_KERNEL, Op.CUDA_MEMCPY_ASYNC, Op.CUDA_STREAM_SYNC, Op.CUDA_MALLOC, Op.CUDA_FREE,
        Op.CUDA_MEMCPY, Op.CUDA_EVENT_SYNC, Op.CUDA_DEVICE_SYNC]


def batch(n: int, pids: list[int], rng: np.random.Generator) -> np.ndarray:
    """60% CUDA calls, 30% switches, 8% faults, 2% block I/O; durations log-uniform 1 us .. 100 ms."""
    r = np.zeros(n, dtype=EVENT_DTYPE)
    kind = rng.random(n)
    op = np.where(kind < 0.6, rng.choice([int(o) for o in CUDA], n),
                  np.where(kind < 0.9, int(Op.SCHED_SWITCH),
                           np.where(kind < 0.98, int(Op.PAGE_FAULT), int(Op.BLOCK_IO))))
    r["op"] = op
    r["pid"] = rng.choice(pids, n)
    r["tid"] = r["pid"]
    r["ts_ns"] = np.sort(rng.integers(0, 10**9, n))
    r["duration_ns"] = (10 ** rng.uniform(3, 8, n)).astype(np.uint64)
    r["kind"] = np.where(op == int(Op.SCHED_SWITCH), rng.choice([int(Kind.PREEMPTED), int(Kind.SLEEP)], n),
                         np.where(op == int(Op.BLOCK_IO), int(Kind.READ), int(Kind.NONE)))
    r["arg"] = rng.integers(0, 10**6, n).astype(np.uint64)
    r["stack_id"] = -1
    return r


def flush_cost(store: Store, recs: np.ndarray, agg: Aggregates | None) -> float:
    """ns per event of TraceSession.flush's work on ``recs`` (with the metrics hook when ``agg``)."""
    t0 = time.perf_counter_ns()
    ordered = decode.storage_order(recs)
    table = decode.events_table(ordered, session_id=1, offset_ns=0)
    with store.transaction():
        store.append("events", table)
    if agg is not None:
        agg.add(ordered, {})
        agg.set_health(events=len(recs), drops_kernel=0, drops_user=0, stale_calls=0, db_bytes=0,
                       flush_s=(time.perf_counter_ns() - t0) / 1e9)
    return (time.perf_counter_ns() - t0) / len(recs)


def per_event() -> list[str]:
    rng = np.random.default_rng(1)
    pids = list(range(1000, 1010))
    alive = set(pids)
    rows = ["| batch (events) | flush, metrics off, ns/event | flush, metrics on, ns/event | difference "
            "| the hook alone (Aggregates.add), ns/event |",
            "| ---: | ---: | ---: | ---: | ---: |"]
    with tempfile.TemporaryDirectory(prefix="ingero-bench-metrics-") as tmp:
        store = Store.open(Path(tmp) / "b.duckdb")
        store.con.execute("SET threads = 1")  # as the tracer's writer
        try:
            for n in BATCHES:
                recs = batch(n, pids, rng)
                ordered = decode.storage_order(recs)  # what the session hands the hook
                agg = Aggregates(alive=alive.__contains__)
                flush_cost(store, recs, agg)  # warm-up: first appends and allocations
                off, on, alone = [], [], []
                for i in range(REPEATS):
                    # alternate which goes first: the file grows under both alike
                    pair = [(off, None), (on, agg)][:: 1 if i % 2 else -1]
                    for out, a in pair:
                        out.append(flush_cost(store, recs, a))
                    t0 = time.perf_counter_ns()
                    agg.add(ordered, {})
                    alone.append((time.perf_counter_ns() - t0) / n)
                m_off, m_on = statistics.median(off), statistics.median(on)
                rows.append(f"| {n:,} | {m_off:.0f} | {m_on:.0f} | {m_on - m_off:+.0f} "
                            f"| {statistics.median(alone):.1f} |")
        finally:
            store.close()
    return rows


def scrape(nprocs: int, gzip: bool) -> str:
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(nprocs)]
    srv = MetricsServer.bind("127.0.0.1", 0)
    try:
        pids = [p.pid for p in procs]
        rng = np.random.default_rng(2)
        srv.aggregates.add(batch(200_000, pids, rng), {p: f"python3 (worker{i}.py)" for i, p in enumerate(pids)})

        class Fixed:  # the diagnosis timer's last result: a chain on every process
            def snapshot(self) -> DiagnosisState:
                return DiagnosisState([ActiveChain("cpu-contention", p, "", "HIGH", 0.4) for p in pids], runs=1,
                                      last_run_s=time.time())

        srv.collector.diagnosis = Fixed()
        times = []
        size = 0
        headers = {"Accept-Encoding": "gzip"} if gzip else {}
        cpu0 = time.process_time()
        for _ in range(SCRAPES):
            t0 = time.perf_counter()
            with urllib.request.urlopen(urllib.request.Request(srv.url, headers=headers), timeout=30) as r:
                body = r.read()
            times.append((time.perf_counter() - t0) * 1e3)
            size = len(body)
        # CPU of this process (server threads + the client's read) per scrape: on a shared box
        # the wall time also holds waits for a core
        cpu_ms = (time.process_time() - cpu0) / SCRAPES * 1e3
        text = body if not gzip else urllib.request.urlopen(srv.url, timeout=30).read()
        series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    finally:
        srv.close()
        for p in procs:
            p.kill()
            p.wait()
    return (f"| {nprocs} | {'gzip' if gzip else 'plain'} | {series:,} | {size:,} | {statistics.median(times):.1f} "
            f"| {max(times):.1f} | {cpu_ms:.1f} | <= 50 ms |")


def main() -> int:
    load = os.getloadavg()[0]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load:.1f} on {os.cpu_count()} cores\n")
    print("\n".join(per_event()))
    print()
    print("| processes | encoding | series | bytes | scrape median, ms | scrape max, ms | CPU per scrape, ms "
          "| target |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for n in PROCS:
        for gzip in (False, True):
            print(scrape(n, gzip), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
