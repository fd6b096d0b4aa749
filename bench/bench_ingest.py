"""Sustained events/s from the kernel into DuckDB with zero drops, and bytes per stored event.

Run as root from the repo root: ``.venv/bin/python -m bench.bench_ingest``.

Ingest: bench.bpf.c (compiled into the real object with -DINGERO_BENCH)
emits BURST records into the real ring buffer per getppid() of a generator
process pinned to one CPU; the real user-space path (RingReader -> decode ->
Store.append into a DuckDB file, the TraceSession loop) runs pinned to the
other CPU.  The generator's rate steps up until records are dropped; the
table shows every step.  Target: >= 1,000,000 events/s with zero drops.

Bytes per event: the DuckDB file size (after CHECKPOINT) over the rows in
it, for a realistic mix of records (see _realistic) -- synthetic bench
records are too regular to say anything about compression.  Target: <= 16.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ingero.collect import decode
from ingero.collect.loader import BpfSettings, load_program
from ingero.collect.records import EVENT_DTYPE, Counter, Kind, Op
from ingero.collect.session import FLUSH_INTERVAL_S, FLUSH_ROWS, POLL_INTERVAL_S, READ_BATCH, TraceOptions, TraceSession
from ingero.store.db import Store

REPO = Path(__file__).resolve().parents[1]
GEN_SRC = REPO / "tests" / "live" / "workloads" / "getppid_gen.c"
BURST = 32  # records per getppid (bench.bpf.c BENCH_BURST)
STEP_SECONDS = 4.0
RATES = (250_000, 500_000, 1_000_000, 1_500_000, 2_000_000, 3_000_000)  # records/s asked of the generator
TARGET_EVENTS_PER_S = 1_000_000  # from the issue: one core must keep up with 1 M/s
TARGET_BYTES_PER_EVENT = 16.0
REALISTIC_ROWS = 2_000_000


def _build_gen(tmp: Path) -> Path:
    out = tmp / "getppid_gen"
    subprocess.run(["cc", "-O2", "-o", str(out), str(GEN_SRC)], check=True)
    return out


def _cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[-1]) if len(cpus) > 1 else (cpus[0], cpus[0])


def ingest_step(gen: Path, rate: float, db: Path) -> dict:
    """One run at ``rate`` records/s; returns what was generated, stored and dropped."""
    consumer_cpu, gen_cpu = _cpus()
    os.sched_setaffinity(0, {consumer_cpu})
    proc = subprocess.Popen(
        ["taskset", "-c", str(gen_cpu), str(gen), str(rate / BURST), str(STEP_SECONDS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    program = load_program(BpfSettings(bench_pid=proc.pid, bench_burst=BURST))
    store = Store.open(db)
    sid = store.begin_session(command="bench_ingest", targets=f"bench pid {proc.pid}")
    sess = TraceSession(TraceOptions(db_path=db, samplers=False), store, program, sid)
    try:
        assert proc.stdin is not None
        proc.stdin.write("x")
        proc.stdin.close()
        t0 = time.monotonic()
        cpu0 = _cpu_s()
        next_flush = t0 + FLUSH_INTERVAL_S
        while proc.poll() is None:
            n = sess.poll()
            now = time.monotonic()
            if now >= next_flush or sess.pending_rows >= FLUSH_ROWS:
                sess.flush()
                next_flush = now + FLUSH_INTERVAL_S
            if n < READ_BATCH:
                time.sleep(POLL_INTERVAL_S)
        sess.drain()
        elapsed = time.monotonic() - t0
        cpu = _cpu_s() - cpu0
        calls = int(proc.stdout.read().strip() or 0) if proc.stdout else 0
        drops = int(sess.counters()[Counter.RB_DROPS])
        store.end_session(sid, events=sess.events, drops_kernel=drops, drops_user=sess.drops_user)
        stored = store.con.execute("SELECT count(*) FROM events WHERE session_id = $s", {"s": sid}).fetchone()[0]
    finally:
        program.close()
        store.close()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return {
        "asked": rate,
        "generated": calls * BURST,
        "stored": stored,
        "drops": drops,
        "seconds": elapsed,
        "per_s": stored / STEP_SECONDS,
        "cpu_us_per_event": cpu / max(stored, 1) * 1e6,
    }


def _cpu_s() -> float:
    """CPU seconds used by this process (every thread: the reader and DuckDB's)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _realistic(n: int, seed: int = 1) -> np.ndarray:
    """A training-loop-like mix: launches, async copies, syncs, off-CPU intervals, a few processes."""
    rng = np.random.default_rng(seed)
    r = np.zeros(n, dtype=EVENT_DTYPE)
    ops = np.array([Op.CUDA_LAUNCH_KERNEL, Op.CUDA_MEMCPY_ASYNC, Op.CUDA_STREAM_SYNC, Op.SCHED_SWITCH,
                    Op.CUDA_MEMCPY, Op.PAGE_FAULT, Op.BLOCK_IO], dtype=np.uint8)
    op = rng.choice(ops, n, p=[0.45, 0.12, 0.1, 0.2, 0.05, 0.06, 0.02])
    r["op"] = op
    r["ts_ns"] = 10**12 + np.cumsum(rng.exponential(2_000, n)).astype(np.uint64)  # ~500 k events/s
    r["duration_ns"] = rng.lognormal(9, 1.5, n).astype(np.uint64)  # ~8 us median, long tail
    pid = rng.choice([4242, 4300, 4301, 4302], n, p=[0.7, 0.1, 0.1, 0.1]).astype(np.uint32)
    r["pid"] = pid
    r["tid"] = pid + rng.integers(0, 4, n).astype(np.uint32)
    r["cpu"] = rng.integers(0, 8, n)
    r["stack_id"] = -1
    r["kind"] = int(Kind.NONE)
    copy = (op == Op.CUDA_MEMCPY_ASYNC) | (op == Op.CUDA_MEMCPY)
    r["kind"][copy] = rng.choice([int(Kind.H2D), int(Kind.D2H)], copy.sum())
    r["arg"][copy] = rng.choice([4 << 20, 16 << 20, 512 << 10], copy.sum())
    stream_ops = (op == Op.CUDA_LAUNCH_KERNEL) | (op == Op.CUDA_MEMCPY_ASYNC) | (op == Op.CUDA_STREAM_SYNC)
    r["stream"][stream_ops] = rng.choice([0, 0x55d0a0c0, 0x55d0a1c0], stream_ops.sum())
    sw = op == Op.SCHED_SWITCH
    r["kind"][sw] = rng.choice([int(Kind.PREEMPTED), int(Kind.SLEEP), int(Kind.IO)], sw.sum(), p=[0.3, 0.65, 0.05])
    r["arg"][sw] = rng.lognormal(8, 2, sw.sum()).astype(np.uint64)
    r["other_pid"][sw] = rng.choice([0, 911, 1200, 4300], sw.sum())
    bio = op == Op.BLOCK_IO
    r["kind"][bio] = int(Kind.READ)
    r["arg"][bio] = rng.choice([4096, 131072], bio.sum())
    r["other_pid"][bio] = 254 << 20
    r["ret"][~sw & ~bio & (op != Op.PAGE_FAULT)] = 0
    r["ret"][op == Op.PAGE_FAULT] = rng.choice([4, 6, 20], (op == Op.PAGE_FAULT).sum())
    return r


def bytes_per_event(db: Path, n: int = REALISTIC_ROWS) -> tuple[float, int]:
    store = Store.open(db)
    recs = _realistic(n)
    for i in range(0, n, 500_000):  # the tracer appends about once a second, grouped by op like TraceSession.flush
        batch = decode.storage_order(recs[i : i + 500_000])
        store.append("events", decode.events_table(batch, session_id=1, offset_ns=1_700_000_000 * 10**9))
    store.con.execute("CHECKPOINT")
    store.close()
    return db.stat().st_size / n, db.stat().st_size


def main() -> int:
    if os.geteuid() != 0:
        print("bench_ingest needs root (eBPF)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        gen = _build_gen(tmp)
        print(f"ingest: generator on CPU {_cpus()[1]}, ring buffer -> decode -> DuckDB on CPU {_cpus()[0]}, "
              f"{STEP_SECONDS:.0f} s per step, {BURST} records per syscall, load {os.getloadavg()[0]:.1f}\n")
        print("| asked events/s | generated | stored | drops | stored events/s | consumer CPU µs/event |")
        print("|---:|---:|---:|---:|---:|---:|")
        best = 0.0
        cpu_costs = []
        for rate in RATES:
            r = ingest_step(gen, rate, tmp / f"ingest{rate}.duckdb")
            cpu_costs.append(r["cpu_us_per_event"])
            print(f"| {rate:,.0f} | {r['generated']:,} | {r['stored']:,} | {r['drops']:,} | {r['per_s']:,.0f} "
                  f"| {r['cpu_us_per_event']:.2f} |", flush=True)
            if r["drops"] == 0 and r["stored"] == r["generated"]:
                best = max(best, r["per_s"])
            else:
                break
        bpe, size = bytes_per_event(tmp / "size.duckdb")
    ok_rate = best >= TARGET_EVENTS_PER_S
    ok_size = bpe <= TARGET_BYTES_PER_EVENT
    print(f"\n| metric | value | target | |\n|---|---:|---:|---|")
    print(f"| sustained events/s, zero drops | {best:,.0f} | {TARGET_EVENTS_PER_S:,} | {'ok' if ok_rate else 'MISSED'} |")
    # what one whole core would sustain at the measured CPU cost (the box is shared: the
    # consumer rarely gets its core to itself, see the load average above)
    print(f"| events/s per consumer CPU-second (best step) | {1e6 / min(cpu_costs):,.0f} | | |")
    print(f"| bytes per stored event ({REALISTIC_ROWS:,} realistic rows, {size / 1e6:.1f} MB) | {bpe:.2f} | "
          f"{TARGET_BYTES_PER_EVENT:.0f} | {'ok' if ok_size else 'MISSED'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
