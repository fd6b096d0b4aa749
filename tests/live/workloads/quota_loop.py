#!/usr/bin/env python3
"""An inference-like serving loop on a CUDA runtime (ctypes), for the CPU-quota tests.

Per request: host work (tokenising / pre-processing: SHA-256 over a fixed
number of bytes, so a throttled or preempted loop is slowed the way real code
is), an H2D copy of the input, ``--kernels`` launches of ``--kernel-us`` each,
and a synchronous D2H copy of the result (it waits for the kernels), then a
little bookkeeping.  Not the project's demo loop: no DataLoader, no
cudaStreamSynchronize, a copy that waits.

The amount of host work is calibrated on the thread's own CPU clock
(``time.thread_time``), which a CPU quota or a competitor does not stretch.

Prints one JSON line at the end (and writes it to --summary-json): pid,
requests, wall and CPU seconds of the process.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import signal
import time

CUDA_H2D, CUDA_D2H = 1, 2


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    p, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(ctypes.c_void_p), sz, p]
    lib.cudaMemcpy.argtypes = [p, p, sz, ctypes.c_int]
    lib.cudaMalloc.argtypes = [ctypes.POINTER(p), sz]
    return lib


def bytes_per_cpu_us() -> float:
    """SHA-256 throughput on this thread's CPU clock (best of five)."""
    buf = b"\x5a" * (256 * 1024)
    best = 0.0
    for _ in range(5):
        t = time.thread_time_ns()
        hashlib.sha256(buf).digest()
        dt = max(1, time.thread_time_ns() - t) / 1000
        best = max(best, len(buf) / dt)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--host-us", type=float, default=3000.0, help="CPU work per request")
    ap.add_argument("--kernels", type=int, default=4)
    ap.add_argument("--kernel-us", type=int, default=500)
    ap.add_argument("--summary-json")
    args = ap.parse_args()

    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    lib = load(args.lib)
    lib.simcudaSetKernelUs(ctypes.c_uint(args.kernel_us)) if hasattr(lib, "simcudaSetKernelUs") else None
    work = int(bytes_per_cpu_us() * args.host_us)
    buf = b"\xa5" * work
    host_in = ctypes.create_string_buffer(64 << 10)
    host_out = ctypes.create_string_buffer(4096)
    dev = ctypes.c_void_p()
    lib.cudaMalloc(ctypes.byref(dev), 1 << 20)
    kernel = ctypes.c_void_p(0x1000)
    grid, block = Dim3(1, 1, 1), Dim3(128, 1, 1)
    requests = 0
    t0 = time.monotonic()
    c0 = os.times()
    while not stop and time.monotonic() - t0 < args.duration:
        hashlib.sha256(buf).digest()  # pre-processing
        lib.cudaMemcpy(dev, host_in, len(host_in), CUDA_H2D)
        for _ in range(args.kernels):
            lib.cudaLaunchKernel(kernel, grid, block, None, 0, None)
        lib.cudaMemcpy(host_out, dev, len(host_out), CUDA_D2H)  # waits for the kernels
        requests += 1
    wall = time.monotonic() - t0
    c1 = os.times()
    out = {"pid": os.getpid(), "requests": requests, "wall_s": round(wall, 3),
           "cpu_s": round((c1.user - c0.user) + (c1.system - c0.system), 3)}
    line = json.dumps(out)
    print(line, flush=True)
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            f.write(line)


if __name__ == "__main__":
    main()
