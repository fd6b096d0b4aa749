#!/usr/bin/env python3
"""An inference server: request-handler threads, each with its own CUDA stream.

``--threads`` handler threads (named handler-0.., comm too) serve requests
from a backlog that never runs dry (a saturated server): per request, copy
the input from pinned memory (cudaMemcpyAsync), run the model's
``--kernels`` kernels on the handler's own stream, copy the output back
(cudaMemcpyAsync) and wait for that stream (cudaStreamSynchronize: the
response needs the result), then serialise a small JSON response.  The
process asks for blocking syncs (cudaSetDeviceFlags(BlockingSync), what
servers sharing a GPU between threads do), so a handler sleeps while its
stream runs.

Nothing else competes: the device's compute engine, shared by the four
streams, is the bottleneck, as it should be.

At exit one JSON line on stdout (and in --truth): pid, the handlers' tids,
names and request counts, the wall clock, the simulated device's busy share,
and each handler's CUDA calls by op.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import ctcuda


def handler(cuda: ctcuda.Cuda, i: int, args, stop: threading.Event, out: dict) -> None:
    name = f"handler-{i}"
    ctcuda.name_this_thread(name)
    tid = threading.get_native_id()
    stream = cuda.stream()
    h_in, d_in = cuda.malloc_host(args.input_bytes), cuda.malloc(args.input_bytes)
    h_out, d_out = cuda.malloc_host(4096), cuda.malloc(4096)
    served = 0
    while not stop.is_set():
        cuda.copy_async(d_in, h_in, args.input_bytes, ctcuda.H2D, stream)
        for _ in range(args.kernels):
            cuda.launch(args.kernel_us, stream)
        cuda.copy_async(h_out, d_out, 4096, ctcuda.D2H, stream)
        cuda.sync(stream)
        json.dumps({"id": served, "label": served % 1000, "score": 0.5})
        served += 1
    out[i] = {"tid": tid, "name": name, "comm": ctcuda.thread_comm(tid), "requests": served,
              "counts": dict(cuda.counts())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ctcuda.DEFAULT_LIB))
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--kernels", type=int, default=3)
    ap.add_argument("--kernel-us", type=int, default=300)
    ap.add_argument("--input-bytes", type=int, default=64 << 10)
    ap.add_argument("--truth")
    args = ap.parse_args()

    cuda = ctcuda.Cuda(args.lib)
    cuda.set_device_flags(ctcuda.SCHEDULE_BLOCKING_SYNC)
    stop = threading.Event()
    out: dict = {}
    threads = [threading.Thread(target=handler, args=(cuda, i, args, stop, out), name=f"handler-{i}")
               for i in range(args.threads)]
    busy0 = cuda.device_busy_ns()
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(args.duration)
    stop.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    busy = cuda.device_busy_ns()
    truth = {
        "shape": "healthy-server", "pid": os.getpid(), "main_tid": threading.get_native_id(),
        "handlers": [out[i] for i in sorted(out)], "wall_s": round(wall, 3),
        "device_busy_pct": None if busy is None else round(100 * (busy - busy0) / 1e9 / wall, 1),
        "main_counts": dict(cuda.counts()),
    }
    line = json.dumps(truth)
    print(line, flush=True)
    if args.truth:
        with open(args.truth, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
