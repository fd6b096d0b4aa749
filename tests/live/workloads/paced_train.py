#!/usr/bin/env python3
"""A training loop that waits on itself each step: a paced loop or a loop logging into a slow pipe.

Per step: one pinned batch copy, the step's kernels, one sync, then:

* ``--pace-ms N``: ``time.sleep(N ms)``, a rate limit (the loop sleeps on its own timer; nobody
  else makes it wait, and the device has nothing queued meanwhile);
* ``--log-bytes N``: one log line of N bytes written (and flushed) into a pipe whose reader, a
  child process this loop starts (python -c, never calling CUDA), reads 4 KiB then sleeps
  ``--reader-sleep-ms``: with a sleep the pipe fills and the loop blocks in write(); without
  one the reader keeps up (the look-alike: a pipe that never blocks the writer).

At exit the reader gets EOF and exits; one JSON line on stdout (and in --truth): steps, the
time spent in the step's own wait (the sleep, the writes), the wall clock, the reader's pid and
the loop's CUDA calls by op.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import ctcuda

READER = """
import os, sys, time
pause = float(sys.argv[1]) / 1000
while os.read(0, 4096):
    if pause:
        time.sleep(pause)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ctcuda.DEFAULT_LIB))
    ap.add_argument("--duration", type=float, default=7.0)
    ap.add_argument("--kernels", type=int, default=6)
    ap.add_argument("--kernel-us", type=int, default=500)
    ap.add_argument("--batch-bytes", type=int, default=1 << 20)
    ap.add_argument("--pace-ms", type=float, default=0.0, help="sleep this long after each step")
    ap.add_argument("--log-bytes", type=int, default=0, help="write a log line this long each step into a pipe")
    ap.add_argument("--reader-sleep-ms", type=float, default=50.0, help="the pipe's reader sleeps this per 4 KiB")
    ap.add_argument("--truth")
    args = ap.parse_args()

    reader = None
    if args.log_bytes:
        reader = subprocess.Popen([sys.executable, "-c", READER, str(args.reader_sleep_ms)], stdin=subprocess.PIPE)
    cuda = ctcuda.Cuda(args.lib)
    stream = cuda.stream()
    host, dev = cuda.malloc_host(args.batch_bytes), cuda.malloc(args.batch_bytes)
    line = (b"step %08d loss=0.1234 " + b"x" * max(0, args.log_bytes - 32) + b"\n") if args.log_bytes else b""

    t0 = time.monotonic()
    steps = 0
    waited = 0.0
    while time.monotonic() - t0 < args.duration:
        cuda.copy_async(dev, host, args.batch_bytes, ctcuda.H2D, stream)
        for _ in range(args.kernels):
            cuda.launch(args.kernel_us, stream)
        cuda.sync(stream)
        steps += 1
        tw = time.perf_counter()
        if args.pace_ms:
            time.sleep(args.pace_ms / 1000)
        if reader is not None:
            reader.stdin.write(line.replace(b"%08d", b"%08d" % steps, 1))
            reader.stdin.flush()
        waited += time.perf_counter() - tw
    wall = time.monotonic() - t0
    reader_pid = None
    if reader is not None:
        reader_pid = reader.pid
        reader.stdin.close()  # EOF: the reader drains what is left and exits
        reader.wait(timeout=120)
    truth = {
        "shape": "paced" if args.pace_ms else "logging-into-a-pipe", "pid": os.getpid(),
        "loop_tid": threading.get_native_id(), "steps": steps, "wait_s": round(waited, 3), "wall_s": round(wall, 3),
        "reader_pid": reader_pid, "counts": dict(cuda.counts()),
    }
    out = json.dumps(truth)
    print(out, flush=True)
    if args.truth:
        with open(args.truth, "w") as f:
            f.write(out + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
