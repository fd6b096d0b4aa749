#!/usr/bin/env python3
"""A loop fed by DataLoader-like worker processes through a multiprocessing.Queue.

Two worker processes (children, forked after the CUDA runtime is up, as
PyTorch's DataLoader forks its workers) each "decode" a batch with CPU work
(SHA-256 rounds over a buffer, calibrated once on the loop's core to
``--decode-ms``) and put it on a bounded queue (``--prefetch`` batches, as
prefetch_factor x num_workers).  The main thread takes a batch, copies it
(pageable cudaMemcpy), launches the step's kernels and syncs.

The job pins itself: the loop to ``--loop-cpu``, its workers to
``--worker-cpu`` (what a worker_init_fn with os.sched_setaffinity does).  Two
workers on one core produce a batch every decode_ms / 2 with the core to
themselves, faster than the step's kernels take; anything else runnable on
that core slows them, and the loop then waits in the queue's get.

At exit one JSON line on stdout (and in --truth): the pid, the workers'
pids and CPU seconds, batches, steps, the loop's time waiting in get(), the
wall clock, the simulated device's busy share and the loop's CUDA calls.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import multiprocessing as mp
import os
import queue as queue_mod
import threading
import time

import ctcuda

CHUNK = 64 << 10


def decode(buf: bytes, rounds: int) -> bytes:
    h = hashlib.sha256()
    for _ in range(rounds):
        h.update(buf)
    return h.digest()


def calibrate(buf: bytes, ms: float) -> int:
    """Rounds of decode() that take ``ms`` on this core (best of 5)."""
    best = min(_timed(buf, 200) for _ in range(5))
    return max(1, round(ms / 1e3 / (best / 200)))


def _timed(buf: bytes, rounds: int) -> float:
    t = time.perf_counter()
    decode(buf, rounds)
    return time.perf_counter() - t


def worker(q, stop, cpu: int, rounds: int, batch_bytes: int, seed: int) -> None:
    os.sched_setaffinity(0, {cpu})
    q.cancel_join_thread()  # exit without waiting for the loop to drain the queue
    buf = bytes((seed + i) % 251 for i in range(CHUNK))
    while not stop.is_set():
        digest = decode(buf, rounds)
        batch = digest * (batch_bytes // len(digest))
        try:
            q.put(batch, timeout=0.2)
        except queue_mod.Full:
            continue


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ctcuda.DEFAULT_LIB))
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--decode-ms", type=float, default=6.0, help="CPU per batch in a worker")
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--kernels", type=int, default=7)
    ap.add_argument("--kernel-us", type=int, default=1000)
    ap.add_argument("--batch-bytes", type=int, default=256 << 10)
    ap.add_argument("--loop-cpu", type=int, default=0)
    ap.add_argument("--worker-cpu", type=int, default=1)
    ap.add_argument("--truth")
    args = ap.parse_args()

    os.sched_setaffinity(0, {args.loop_cpu})
    cuda = ctcuda.Cuda(args.lib)
    stream = cuda.stream()
    dev = cuda.malloc(args.batch_bytes)
    rounds = calibrate(bytes(CHUNK), args.decode_ms)

    q = mp.Queue(args.prefetch)
    stop = mp.Event()
    procs = [mp.Process(target=worker, args=(q, stop, args.worker_cpu, rounds, args.batch_bytes, i), daemon=True)
             for i in range(args.workers)]
    for p in procs:
        p.start()

    t0 = time.monotonic()
    steps = 0
    wait_s = 0.0
    try:
        while time.monotonic() - t0 < args.duration:
            tw = time.perf_counter()
            batch = q.get()
            wait_s += time.perf_counter() - tw
            src = ctypes.c_char_p(batch)
            cuda.copy(dev, src, len(batch), ctcuda.H2D)
            for _ in range(args.kernels):
                cuda.launch(args.kernel_us, stream)
            cuda.sync(stream)
            steps += 1
        wall = time.monotonic() - t0
        worker_cpu = {p.pid: round(cpu_seconds(p.pid), 2) for p in procs}
    finally:
        stop.set()
        for p in procs:
            p.join(2)
            if p.is_alive():
                p.terminate()
                p.join()
    truth = {
        "shape": "starved-workers", "pid": os.getpid(), "loop_tid": threading.get_native_id(),
        "loop_cpu": args.loop_cpu, "worker_cpu": args.worker_cpu, "workers": [p.pid for p in procs],
        "worker_cpu_s": worker_cpu, "decode_rounds": rounds, "steps": steps,
        "data_wait_s": round(wait_s, 3), "wall_s": round(wall, 3), "counts": dict(cuda.counts()),
    }
    line = json.dumps(truth)
    print(line, flush=True)
    if args.truth:
        with open(args.truth, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
