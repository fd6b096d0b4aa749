#!/usr/bin/env python3
"""A language-model pretraining loop: many short kernels, host-side token packing.

One of two independent training jobs that a shared box runs side by side
(the other: vit_finetune.py).  Per step: pack the next sequences on the host
(pure Python over a token buffer, ``--pack-ms`` of CPU, calibrated at start),
one pageable copy of the packed batch, ``--kernels`` short kernels (the
layers' forward and backward), an optimizer step of small kernels, and one
sync (the loss).  Syncs spin (the runtime's default with one context per
process), so the process wants its CPU all the time.

``--ready FILE`` is created once the set-up calls are made; ``--go FILE``
waits for FILE before the timed loop (a tracer attaches
first).  At exit one JSON line on stdout (and in --truth): pid, loop tid,
steps, wall clock, process CPU seconds, the simulated device's busy share,
the timed loop's CUDA calls by op.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import threading
import time

import ctcuda


def pack(tokens: list[int], seq: int) -> bytes:
    rows, row = [], []
    for t in tokens:
        row.append(t % 50257)
        if len(row) == seq:
            rows.append(bytes(x & 0xFF for x in row))
            row = []
    return b"".join(rows)


def calibrate(ms: float) -> int:
    """Tokens pack() handles in ``ms`` here (best of 5)."""
    probe = list(range(20000))
    best = min(_timed(probe) for _ in range(5))
    return max(512, int(len(probe) * ms / 1e3 / best))


def _timed(tokens: list[int]) -> float:
    t = time.perf_counter()
    pack(tokens, 512)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ctcuda.DEFAULT_LIB))
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--kernels", type=int, default=24)
    ap.add_argument("--kernel-us", type=int, default=120)
    ap.add_argument("--optim-kernels", type=int, default=8)
    ap.add_argument("--pack-ms", type=float, default=1.5)
    ap.add_argument("--ready", help="create this file once set up (its CUDA set-up calls made)")
    ap.add_argument("--go")
    ap.add_argument("--truth")
    args = ap.parse_args()

    cuda = ctcuda.Cuda(args.lib)
    stream = cuda.stream()
    n_tokens = calibrate(args.pack_ms)
    tokens = list(range(n_tokens))
    dev = cuda.malloc(n_tokens)
    if args.ready:
        open(args.ready, "w").close()
    while args.go and not os.path.exists(args.go):
        time.sleep(0.01)
    cuda.counts().clear()  # the truth counts the timed loop's calls

    cpu0, t0 = time.process_time(), time.monotonic()
    busy0 = cuda.device_busy_ns()
    steps = 0
    while time.monotonic() - t0 < args.duration:
        batch = pack(tokens, 512)
        cuda.copy(dev, ctypes.c_char_p(batch), len(batch), ctcuda.H2D)
        for _ in range(args.kernels):
            cuda.launch(args.kernel_us, stream)
        for _ in range(args.optim_kernels):
            cuda.launch(30, stream)
        cuda.sync(stream)
        tokens.append(tokens.pop(0))
        steps += 1
    wall = time.monotonic() - t0
    busy = cuda.device_busy_ns()
    truth = {
        "shape": "two-jobs", "job": "lm_pretrain", "pid": os.getpid(), "loop_tid": threading.get_native_id(),
        "steps": steps, "wall_s": round(wall, 3), "cpu_s": round(time.process_time() - cpu0, 3),
        "device_busy_pct": None if busy is None else round(100 * (busy - busy0) / 1e9 / wall, 1),
        "counts": dict(cuda.counts()),
    }
    line = json.dumps(truth)
    print(line, flush=True)
    if args.truth:
        with open(args.truth, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
