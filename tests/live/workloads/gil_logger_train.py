#!/usr/bin/env python3
"""A training loop with a metrics-logger thread in the same process (shape: the GIL).

The main thread trains: per step it copies a pinned batch to the device
(cudaMemcpyAsync), launches the step's kernels on its stream and syncs once
(the loss read-back).  A second Python thread, named "metrics-logger" (its
comm too, through prctl: Python 3.11 leaves the OS thread "python3"),
refreshes a per-layer metrics dict and serialises it with
``json.dumps(indent=2)`` to a log, as a home-made experiment tracker does.

The logger is pure Python: it holds the GIL while it runs and gives it up
only when the interpreter's switch interval (5 ms) asks it to.  Every CUDA
call of the main thread releases the GIL (ctypes, as PyTorch's bindings) and
must take it back on return, so with ``--log-every 0`` (dump after dump) the
main thread waits for the logger's GIL after nearly every launch: the
device idles while the loop waits for a lock another thread of its own
process holds.

The look-alike (``--log-every 0.05 --log-layers 20``): the same thread
sleeps 50 ms between small dumps, holding the GIL well under 1% of the time;
the loop is then bounded by its kernels.

At exit one JSON line on stdout (and in --truth): the pid, the loop's and
the logger's tids, the logger's comm, its CPU time (time.thread_time()) and
dumps, the steps, the wall clock, the simulated device's busy share and the
loop thread's CUDA calls by op.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time

import ctcuda


def layer_metrics(n: int, rng: random.Random) -> dict:
    return {
        f"blocks.{i}": {"grad_norm": rng.random(), "weight_norm": rng.random(), "update_ratio": rng.random() * 1e-3,
                        "act_hist": [rng.random() for _ in range(16)], "dtype": "bfloat16"}
        for i in range(n)
    }


class MetricsLogger(threading.Thread):
    def __init__(self, path: str, every_s: float, layers: int):
        super().__init__(name="metrics-logger", daemon=True)
        self.path, self.every_s, self.layers = path, every_s, layers
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.dumps = self.bytes = 0
        self.cpu_s = 0.0
        self.tid = 0
        self.comm = ""

    def run(self) -> None:
        ctcuda.name_this_thread(self.name)
        self.tid = threading.get_native_id()
        self.comm = ctcuda.thread_comm(self.tid)
        self.ready.set()
        rng = random.Random(7)
        with open(self.path, "w") as log:
            while not self.stop.is_set():
                record = {"time": time.time(), "step_metrics": layer_metrics(self.layers, rng)}
                text = json.dumps(record, indent=2, sort_keys=True)
                log.write(text)
                self.dumps += 1
                self.bytes += len(text)
                if self.every_s:
                    self.stop.wait(self.every_s)
        self.cpu_s = time.thread_time()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ctcuda.DEFAULT_LIB))
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--kernels", type=int, default=12, help="kernels per step")
    ap.add_argument("--kernel-us", type=int, default=400)
    ap.add_argument("--batch-bytes", type=int, default=1 << 20)
    ap.add_argument("--log-every", type=float, default=0.0, help="seconds the logger sleeps between dumps")
    ap.add_argument("--log-layers", type=int, default=1000, help="layers in each dumped record")
    ap.add_argument("--log-file", default=os.devnull)
    ap.add_argument("--truth", help="also write the exit line here")
    args = ap.parse_args()

    cuda = ctcuda.Cuda(args.lib)
    stream = cuda.stream()
    host, dev = cuda.malloc_host(args.batch_bytes), cuda.malloc(args.batch_bytes)
    logger = MetricsLogger(args.log_file, args.log_every, args.log_layers)
    logger.start()
    logger.ready.wait()

    busy0 = cuda.device_busy_ns()
    t0 = time.monotonic()
    steps, losses = 0, []
    while time.monotonic() - t0 < args.duration:
        cuda.copy_async(dev, host, args.batch_bytes, ctcuda.H2D, stream)
        for _ in range(args.kernels):
            cuda.launch(args.kernel_us, stream)
        cuda.sync(stream)  # loss.item()
        losses.append(1.0 / (steps + 1))
        steps += 1
    wall = time.monotonic() - t0
    busy = cuda.device_busy_ns()
    counts = dict(cuda.counts())
    logger.stop.set()
    logger.join()
    truth = {
        "shape": "gil" if not args.log_every else "gil-look-alike",
        "pid": os.getpid(), "loop_tid": threading.get_native_id(),
        "logger_tid": logger.tid, "logger_name": logger.name, "logger_comm": logger.comm,
        "logger_cpu_s": round(logger.cpu_s, 3), "logger_dumps": logger.dumps, "logger_bytes": logger.bytes,
        "steps": steps, "wall_s": round(wall, 3),
        "device_busy_pct": None if busy is None else round(100 * (busy - busy0) / 1e9 / wall, 1),
        "counts": counts,
    }
    line = json.dumps(truth)
    print(line, flush=True)
    if args.truth:
        with open(args.truth, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
