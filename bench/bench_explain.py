"""How long `ingero explain` takes over 1 M and 10 M stored events.

Builds DuckDB files synthetically (numpy -> Arrow -> Store.append) with the
mix a traced training job produces (launches, syncs, copies, off-CPU
intervals of the loop and its workers, page faults, block I/O, per-second
host and per-process samples), then times ``explain(con, Options())`` on a
read-only connection, as the CLI runs it.  Prints a markdown table.

    python bench/bench_explain.py                 # 1 M and 10 M
    python bench/bench_explain.py --sizes 1e6 --repeat 5 --dir /tmp/ingero-bench
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.store.db import Store

NS = 1_000_000_000
T0 = 1_763_800_000 * NS
EVENTS_PER_S = 30_000  # a busy traced job: ~30k events/s (launch-heavy loop + host events)
LOOP_PID = 1000
WORKERS = (1001, 1002, 1003, 1004)
HOGS = (2001, 2002)

# op mix: (op, kind, share, median duration ns)
MIX = (
    ("cudaLaunchKernel", None, 0.62, 6_000),
    ("cudaStreamSync", None, 0.04, 2_000_000),
    ("cudaMemcpyAsync", "H2D", 0.04, 12_000),
    ("cudaMemcpy", "D2H", 0.01, 400_000),
    ("sched_switch", "sleep", 0.12, 1_500_000),
    ("sched_switch", "preempted", 0.06, 800_000),
    ("sched_switch", "io", 0.01, 3_000_000),
    ("page_fault", None, 0.08, 2_000),
    ("block_io", "write", 0.02, 5_000_000),
)


def build(path: Path, n: int, seed: int = 0) -> float:
    """Write an n-event DB at path; returns seconds taken."""
    t = time.perf_counter()
    if path.exists():
        path.unlink()
    rng = np.random.default_rng(seed)
    span_ns = int(n / EVENTS_PER_S * NS)
    store = Store.open(path)
    store.con.execute(
        "INSERT INTO sessions (session_id, started_ns, ended_ns, status, events, ncpu)"
        " VALUES (1, $t0, $t1, 'closed', $n, 2)",
        {"t0": T0, "t1": T0 + span_ns, "n": n},
    )
    chunk = 2_000_000
    shares = np.array([m[2] for m in MIX])
    shares /= shares.sum()
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        which = rng.choice(len(MIX), size=m, p=shares)
        # timestamps: this chunk's slice of the span, sorted (as the tracer appends)
        lo = T0 + span_ns * start // n
        hi = T0 + span_ns * (start + m) // n
        ts = np.sort(rng.integers(lo, hi, size=m))
        med = np.array([x[3] for x in MIX], dtype=np.float64)[which]
        dur = (med * rng.lognormal(0.0, 0.5, size=m)).astype(np.int64)
        ops = np.array([x[0] for x in MIX], dtype=object)[which]
        kinds = np.array([x[1] for x in MIX], dtype=object)[which]
        cuda = which <= 3
        sched = (which >= 4) & (which <= 6)
        pid = np.where(cuda, LOOP_PID, rng.choice(np.array((LOOP_PID,) + WORKERS), size=m))
        pid = np.where(which == 8, rng.choice(np.array(HOGS + (LOOP_PID,)), size=m), pid)
        nbytes = np.where((which == 2) | (which == 3), 8 << 20, np.where(which == 8, 1 << 20, 0))
        preempted = which == 5
        other = np.where(preempted, rng.choice(np.array(HOGS), size=m), 0)
        runq = np.where(sched, (dur * np.where(preempted, 1.0, 0.01)).astype(np.int64), 0)
        table = pa.table({
            "session_id": pa.array(np.ones(m, dtype=np.int32)),
            "timestamp": pa.array(ts),
            "duration_ns": pa.array(dur),
            "pid": pa.array(pid.astype(np.int32)),
            "tid": pa.array(pid.astype(np.int32)),
            "op": pa.array(ops, type=pa.string()),
            "kind": pa.array(kinds, type=pa.string()),
            "bytes": pa.array(nbytes.astype(np.int64)),
            "preempted": pa.array(np.where(sched, preempted, None), type=pa.bool_()),
            "other_pid": pa.array(other.astype(np.int32)),
            "runq_ns": pa.array(runq),
        })
        store.append("events", table)
    secs = span_ns // NS + 1
    sample_ts = T0 + (np.arange(secs) + 1) * NS
    store.append("system_metrics", pa.table({
        "session_id": np.ones(secs, dtype=np.int32), "timestamp": sample_ts,
        "cpu_pct": np.full(secs, 70.0), "mem_pct": np.full(secs, 40.0), "load1": np.full(secs, 2.0),
        "ncpu": np.full(secs, 2, dtype=np.int32),
    }))
    pids = np.array((LOOP_PID,) + WORKERS + HOGS, dtype=np.int32)
    store.append("process_cpu", pa.table({
        "session_id": np.ones(secs * len(pids), dtype=np.int32),
        "timestamp": np.repeat(sample_ts, len(pids)),
        "interval_ns": np.full(secs * len(pids), NS),
        "pid": np.tile(pids, secs),
        "comm": pa.array(np.tile(np.array(["python3"] * 5 + ["stress"] * 2, dtype=object), secs), type=pa.string()),
        "oncpu_ns": np.full(secs * len(pids), NS // 2),
    }))
    store.upsert_process_names([
        {"pid": int(p), "name": f"proc {p}", "comm": "python3", "cmdline": "python3 train.py",
         "session_id": 1, "seen_ns": T0} for p in pids
    ])
    store.con.execute("CHECKPOINT")
    store.close()
    return time.perf_counter() - t


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def time_explain(path: Path, repeat: int) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of each run (CPU time: this machine is shared, wall time is noisy)."""
    times, cpus = [], []
    chains = 0
    for _ in range(repeat):
        store = Store.open(path, read_only=True)
        c, t = _cpu_s(), time.perf_counter()
        report = explain(store.con, Options())
        times.append(time.perf_counter() - t)
        cpus.append(_cpu_s() - c)
        chains = len(report.chains)
        store.close()
    return times, cpus, chains


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated event counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ingero-bench")
    ap.add_argument("--keep", action="store_true", help="reuse existing DB files of the right size")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in (int(float(s)) for s in args.sizes.split(",")):
        path = out / f"explain-{size}.duckdb"
        built = 0.0 if (args.keep and path.exists()) else build(path, size)
        times, cpus, chains = time_explain(path, args.repeat)
        rows.append((size, built, min(times), statistics.median(times), min(cpus), chains, path.stat().st_size))
    load = os.getloadavg()[0]
    print(f"explain over N stored events ({os.cpu_count()} CPUs, load {load:.1f}, best of {args.repeat} runs, "
          "read-only file DB)\n")
    print("| events | build s | explain wall min s | wall median s | CPU s (min) | ns per event | chains | DB MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size, built, best, med, cpu, chains, nbytes in rows:
        print(f"| {size:,} | {built:.1f} | {best:.3f} | {med:.3f} | {cpu:.3f} | {best / size * 1e9:.0f} | "
              f"{chains} | {nbytes / 1e6:.0f} |")


if __name__ == "__main__":
    main()
