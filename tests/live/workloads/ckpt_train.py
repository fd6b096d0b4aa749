#!/usr/bin/env python3
"""A training loop that checkpoints to disk every N steps (shape: fsync on the loop thread).

Per step: one pinned batch copy, the step's kernels, one sync.  Every
``--ckpt-every`` steps the loop saves its "model state" the careful way:
write it to ``checkpoint.pt.tmp`` in 8 MiB chunks, ``os.fsync``, then
``os.replace`` onto ``checkpoint.pt`` (what torch.save + an atomic rename
does, on the training thread).  Each save writes a new file whole (the
replaced one's blocks are freed: discards on a disk mounted with discard).

The steps that checkpoint stall on the disk: the write copies the state
into the page cache (on CPU), the fsync waits for the device to take it
(uninterruptible sleep, block I/O issued from this thread).

With ``--background`` the save runs on a thread of its own (a snapshot of the
state, at most one save in flight: the async-save fix), so the loop never
waits for the disk: the look-alike that must not be read as the loop's stall.
At exit one JSON line on stdout (and in --truth): steps, checkpoints, bytes
written, the time in write() and in fsync(), the wall clock, the mean step
with and without a checkpoint, and the loop's CUDA calls by op.  The
checkpoint file is removed at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import ctcuda

CHUNK = 8 << 20


def save(path: Path, state: bytearray) -> tuple[float, float]:
    """Write, fsync, rename; returns (seconds in write, seconds in fsync)."""
    tmp = path.with_name(path.name + ".tmp")
    view = memoryview(state)
    t0 = time.perf_counter()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for off in range(0, len(state), CHUNK):
            os.write(fd, view[off:off + CHUNK])
        t1 = time.perf_counter()
        os.fsync(fd)
        t2 = time.perf_counter()
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return t1 - t0, t2 - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ctcuda.DEFAULT_LIB))
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--kernels", type=int, default=8)
    ap.add_argument("--kernel-us", type=int, default=1000)
    ap.add_argument("--batch-bytes", type=int, default=2 << 20)
    ap.add_argument("--ckpt-every", type=int, default=50, help="steps between checkpoints")
    ap.add_argument("--ckpt-mib", type=int, default=128)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--background", action="store_true",
                    help="save from a thread of its own (the fix: the loop never waits for the disk)")
    ap.add_argument("--truth")
    args = ap.parse_args()

    path = Path(args.ckpt_dir) / "checkpoint.pt"
    state = bytearray(os.urandom(1 << 20)) * args.ckpt_mib
    cuda = ctcuda.Cuda(args.lib)
    stream = cuda.stream()
    host, dev = cuda.malloc_host(args.batch_bytes), cuda.malloc(args.batch_bytes)

    t0 = time.monotonic()
    steps = ckpts = written = 0
    times: list[tuple[float, float]] = []  # (write, fsync) seconds of each save
    saver: threading.Thread | None = None
    plain_ms, ckpt_ms = [], []
    try:
        while time.monotonic() - t0 < args.duration:
            ts = time.perf_counter()
            cuda.copy_async(dev, host, args.batch_bytes, ctcuda.H2D, stream)
            for _ in range(args.kernels):
                cuda.launch(args.kernel_us, stream)
            cuda.sync(stream)
            steps += 1
            if steps % args.ckpt_every == 0 and not (saver and saver.is_alive()):
                state[steps % len(state)] ^= 0xFF  # the optimizer moved the weights (a little)
                if args.background:  # a snapshot saved by a thread: at most one save in flight
                    snap = bytearray(state)
                    saver = threading.Thread(target=lambda: times.append(save(path, snap)), name="ckpt-saver")
                    saver.start()
                else:
                    times.append(save(path, state))
                ckpts += 1
                written += len(state)
                ckpt_ms.append((time.perf_counter() - ts) * 1e3)
            else:
                plain_ms.append((time.perf_counter() - ts) * 1e3)
        wall = time.monotonic() - t0
        if saver:
            saver.join()
        write_s, fsync_s = sum(w for w, _ in times), sum(f for _, f in times)
    finally:
        for p in (path, path.with_name(path.name + ".tmp")):
            p.unlink(missing_ok=True)
    truth = {
        "shape": "checkpoint-fsync", "pid": os.getpid(), "loop_tid": threading.get_native_id(),
        "steps": steps, "checkpoints": ckpts, "ckpt_every": args.ckpt_every, "bytes_written": written,
        "write_s": round(write_s, 3), "fsync_s": round(fsync_s, 3), "wall_s": round(wall, 3),
        "step_ms_mean": round(statistics.fmean(plain_ms), 3) if plain_ms else None,
        "ckpt_step_ms_mean": round(statistics.fmean(ckpt_ms), 3) if ckpt_ms else None,
        "ckpt_dir": str(path.parent), "counts": dict(cuda.counts()),
    }
    line = json.dumps(truth)
    print(line, flush=True)
    if args.truth:
        with open(args.truth, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
