#!/usr/bin/env python3
"""The four training loops of scripts/gpu-check.sh, on a real GPU (PyTorch) or the simulated runtime.

Each loop has one shape, whatever the backend; what a kernel or a copy is
differs:

  healthy     per step a pinned host-to-device copy, KERNELS kernels, one sync: GPU-bound
  dataloader  batches from a DataLoader with num_workers=0 whose items each take CPU work
              (inline, on the loop's thread), then a copy, a few kernels, a sync (.item()):
              the device waits for the host
  cpu-hogs    the healthy loop pinned to one core, with host work per step, and HOGS busy
              processes pinned to the same core: waiting for a CPU
  pageable    per step copies from pageable host memory (staged, synchronous), a few
              kernels, one sync: transfer-bound

Backends: ``torch`` (kernels are bf16 matrix products, copies ``Tensor.copy_``,
syncs ``torch.cuda.synchronize``/``.item()``; ``--profile FILE`` records
the run with torch.profiler (its Kineto JSON, the steps marked), and
``sim`` (ctypes on the simulated libcudart, no torch: kernels of a set
length, ``cudaMemcpy``/``cudaMemcpyAsync``); with sim the summary holds the
simulator's truth (kernels queued, the compute and copy engines' busy ns).

    python3 scripts/gpu_check_loops.py healthy --backend torch --seconds 10 --summary out.json
    python3 scripts/gpu_check_loops.py pageable --backend sim --lib demos/build/libcudart.so.12 --seconds 3
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import multiprocessing as mp
import os
import signal
import sys
import time

LOOPS = ("healthy", "dataloader", "cpu-hogs", "pageable")
HOGS = 3
ITEM_BYTES = 256 * 1024  # CPU work per DataLoader item: SHA-256 over this many bytes (~0.5 ms here)
ITEMS_PER_BATCH = 16


def item_work(buf: bytes) -> int:
    """One dataset item's CPU work (decode, augment): a hash, measured in bytes, not in time."""
    return hashlib.sha256(buf).digest()[0]


def hog(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    x = 0
    while True:
        x += 1


class Sim:
    """The simulated runtime through ctypes: what train.py does, in the four shapes."""

    def __init__(self, lib: str) -> None:
        self.lib = ctypes.CDLL(lib)
        p = ctypes.c_void_p

        class Dim3(ctypes.Structure):
            _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]

        self.g = Dim3(1, 1, 1)
        self.lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(p), ctypes.c_size_t, p]
        self.lib.cudaMemcpy.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int]
        self.lib.cudaMemcpyAsync.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int, p]
        self.kernel = ctypes.cast(self.lib.simcudaTimedKernel, p)
        self.us = ctypes.c_uint32(1000)
        self.args = (p * 1)(ctypes.cast(ctypes.pointer(self.us), p))
        self.dev = p()
        self.lib.cudaMalloc(ctypes.byref(self.dev), 64 << 20)
        self.pinned = p()
        self.lib.cudaMallocHost(ctypes.byref(self.pinned), 8 << 20)
        self.pageable = ctypes.create_string_buffer(2 << 20)
        for name in ("simcudaDeviceBusyNs", "simcudaCopyBusyNs", "simcudaKernelsQueued"):
            getattr(self.lib, name).restype = ctypes.c_uint64

    def kernels(self, n: int, us: int) -> None:
        self.us.value = us
        for _ in range(n):
            self.lib.cudaLaunchKernel(self.kernel, self.g, self.g, self.args, 0, None)

    def copy_pinned(self) -> None:
        self.lib.cudaMemcpyAsync(self.dev, self.pinned, 4 << 20, 1, None)

    def copy_pageable(self) -> None:
        # 2 MiB: one staged chunk, so the copy engine's truth is the copy's own time
        self.lib.cudaMemcpy(self.dev, ctypes.addressof(self.pageable), 2 << 20, 1)

    def sync(self) -> None:
        self.lib.cudaDeviceSynchronize()

    def truth(self) -> dict:
        return {k: int(getattr(self.lib, k)()) for k in ("simcudaDeviceBusyNs", "simcudaCopyBusyNs",
                                                          "simcudaKernelsQueued")}


class Torch:
    """PyTorch on the GPU: kernels are bf16 matrix products of N x N."""

    def __init__(self, n: int = 8192) -> None:
        import torch

        self.torch = torch
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.small = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        self.dst = torch.empty(16 << 20, device="cuda", dtype=torch.float32)  # 64 MiB
        self.pinned = torch.empty(1 << 20, dtype=torch.float32).pin_memory()  # 4 MiB
        self.pageable = torch.empty(16 << 20, dtype=torch.float32)  # 64 MiB, pageable
        self.pageable.fill_(1.0)
        torch.cuda.synchronize()

    def kernels(self, n: int, us: int) -> None:
        # (us: the sim's kernel length; here, big products for long kernels, small ones for short)
        x, y = (self.a, self.b) if us >= 500 else (self.small, self.small)
        for _ in range(n):
            self.torch.mm(x, y)

    def copy_pinned(self) -> None:
        self.dst[: self.pinned.numel()].copy_(self.pinned, non_blocking=True)

    def copy_pageable(self) -> None:
        self.dst.copy_(self.pageable)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def truth(self) -> dict:
        return {}


def batches(dev, stop_at: float):
    """What DataLoader(dataset, batch_size=ITEMS_PER_BATCH, num_workers=0) yields: each item's work
    done inline, on the loop's thread (the real one with torch, the same logic without)."""
    buf = os.urandom(ITEM_BYTES)
    if isinstance(dev, Torch):
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Items(Dataset):
            def __len__(self) -> int:
                return 1 << 30

            def __getitem__(self, i: int):
                return torch.tensor(item_work(buf), dtype=torch.float32)

        for batch in DataLoader(Items(), batch_size=ITEMS_PER_BATCH, num_workers=0):
            yield batch
            if time.monotonic() >= stop_at:
                return
    while time.monotonic() < stop_at:
        yield [item_work(buf) for _ in range(ITEMS_PER_BATCH)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("loop", choices=LOOPS)
    ap.add_argument("--backend", choices=("torch", "sim"), default="torch")
    ap.add_argument("--lib", help="sim: the simulated libcudart.so.12")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--summary", help="write the run's summary (JSON) here")
    ap.add_argument("--profile", help="torch: record the run with torch.profiler into this Kineto JSON")
    ap.add_argument("--cpu", type=int, default=0, help="cpu-hogs: the core the loop and the hogs share")
    args = ap.parse_args(argv)
    if args.backend == "sim" and not args.lib:
        ap.error("--backend sim needs --lib")
    dev = Sim(args.lib) if args.backend == "sim" else Torch()
    hogs: list = []
    if args.loop == "cpu-hogs":
        os.sched_setaffinity(0, {args.cpu})
        ctx = mp.get_context("fork")
        hogs = [ctx.Process(target=hog, args=(args.cpu,), daemon=True) for _ in range(HOGS)]
        for h in hogs:
            h.start()
    prof = None
    if args.profile:
        import torch

        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            schedule=torch.profiler.schedule(wait=2, warmup=2, active=20, repeat=1))
        prof.__enter__()
    host = os.urandom(ITEM_BYTES)
    steps = 0
    t0 = time.monotonic()
    stop_at = t0 + args.seconds
    try:
        if args.loop == "dataloader":
            for _ in batches(dev, stop_at):
                dev.copy_pinned()
                dev.kernels(4, 1000)
                dev.sync()  # the loss' .item()
                steps += 1
                if prof is not None:
                    prof.step()
        else:
            while time.monotonic() < stop_at:
                if args.loop == "pageable":
                    for _ in range(4):
                        dev.copy_pageable()
                    dev.kernels(4, 1000)
                else:
                    dev.copy_pinned()
                    dev.kernels(8, 2000 if args.loop == "healthy" else 1000)
                if args.loop == "cpu-hogs":
                    for _ in range(8):  # the step's host work: optimizer bookkeeping, logging
                        item_work(host)
                dev.sync()
                steps += 1
                if prof is not None:
                    prof.step()
        dev.sync()
    finally:
        for h in hogs:
            h.terminate()
        if prof is not None:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(args.profile)
    summary = {"loop": args.loop, "backend": args.backend, "steps": steps, "wall_s": time.monotonic() - t0,
               "pid": os.getpid(), **dev.truth()}
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
