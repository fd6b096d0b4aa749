#!/usr/bin/env python3
"""A vision-transformer fine-tuning loop: host-side augmentation, a big pinned copy, long kernels.

One of two independent training jobs that a shared box runs side by side
(the other: lm_pretrain.py).  Per step: augment the image batch on the host
(random crops and flips as byte shuffles, ``--augment-ms`` of CPU,
calibrated at start), copy it from pinned memory (cudaMemcpyAsync), run
``--kernels`` long kernels and a small metric kernel (the accuracy), then
read loss and accuracy together (one sync).  Syncs spin (the runtime's
default), so the process wants its CPU all the time.

``--ready FILE`` is created once the set-up calls are made; ``--go FILE``
waits for FILE before the timed loop.  At exit one JSON line
on stdout (and in --truth): pid, loop tid, steps, wall clock, process CPU
seconds, the simulated device's busy share, the timed loop's CUDA calls by op.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time

import ctcuda


def augment(img: bytearray, rng: random.Random, crops: int) -> int:
    n = len(img)
    s = 0
    for _ in range(crops):
        a = rng.randrange(n - 64)
        tile = img[a:a + 64]
        tile.reverse()  # a horizontal flip
        img[a:a + 64] = tile
        s += tile[0]
    return s


def calibrate(img: bytearray, ms: float) -> int:
    rng = random.Random(0)
    best = min(_timed(img, rng, 2000) for _ in range(5))
    return max(100, int(2000 * ms / 1e3 / best))


def _timed(img, rng, crops) -> float:
    t = time.perf_counter()
    augment(img, rng, crops)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ctcuda.DEFAULT_LIB))
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--kernels", type=int, default=8)
    ap.add_argument("--kernel-us", type=int, default=1500)
    ap.add_argument("--augment-ms", type=float, default=3.0)
    ap.add_argument("--image-bytes", type=int, default=8 << 20)
    ap.add_argument("--ready", help="create this file once set up (its CUDA set-up calls made)")
    ap.add_argument("--go")
    ap.add_argument("--truth")
    args = ap.parse_args()

    cuda = ctcuda.Cuda(args.lib)
    stream = cuda.stream()
    host, dev = cuda.malloc_host(args.image_bytes), cuda.malloc(args.image_bytes)
    img = bytearray(os.urandom(1 << 20))
    crops = calibrate(img, args.augment_ms)
    rng = random.Random(1)
    if args.ready:
        open(args.ready, "w").close()
    while args.go and not os.path.exists(args.go):
        time.sleep(0.01)
    cuda.counts().clear()  # the truth counts the timed loop's calls

    cpu0, t0 = time.process_time(), time.monotonic()
    busy0 = cuda.device_busy_ns()
    steps = 0
    while time.monotonic() - t0 < args.duration:
        augment(img, rng, crops)
        cuda.copy_async(dev, host, args.image_bytes, ctcuda.H2D, stream)
        for _ in range(args.kernels):
            cuda.launch(args.kernel_us, stream)
        cuda.launch(50, stream)  # accuracy
        cuda.sync(stream)  # torch.stack([loss, acc]).tolist()
        steps += 1
    wall = time.monotonic() - t0
    busy = cuda.device_busy_ns()
    truth = {
        "shape": "two-jobs", "job": "vit_finetune", "pid": os.getpid(), "loop_tid": threading.get_native_id(),
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
