#!/usr/bin/env python3
"""A training loop on the simulated CUDA runtime, shaped like a PyTorch job.

The main thread is "the training loop": per step it takes a batch from a
DataLoader-like producer (worker processes feeding a queue), copies it to
the device (pinned or pageable host memory), launches the step's kernels,
synchronises (``loss.item()``-like) and does some host work (optimizer
bookkeeping).  Every CUDA call goes through ctypes into libcudart.so.12 (ours
from demos/build, or any other), so uprobes on the library see a real
process making real calls.

Work is measured in amounts, not wall time, so contention slows it down the
way it slows real code: worker decode and host work are SHA-256 over a fixed
number of bytes, calibrated once at start (best of several runs) to the
microseconds asked for.

Prints nothing until the end, then one JSON summary line (steps, step time
mean/p50/p99, data-wait and sync p99, device busy %).  ``--progress N``
prints one line per N steps to stderr.  Stops after --steps or --duration,
or on SIGINT/SIGTERM (the summary is still printed); workers are always
terminated.

With ``--ranks N`` it is a data-parallel job: a launcher (this script)
starts N rank processes the way torchrun does (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/MASTER_PORT, TORCHELASTIC_RUN_ID in each one's
environment), each pinned to its core of ``--rank-cpus``, each with its own
DataLoader workers.  Rank 0 makes the ncclUniqueId (ncclGetUniqueId) and
hands it to the others through a rendezvous directory (torchrun's TCP store
does this for real jobs); every rank joins with ncclCommInitRank and, per
step, all-reduces its gradients (ncclAllReduce of ``--grad-bytes`` on the
step's stream) after its kernels, before the step's stream sync.  With
demos/build/libnccl.so.2 the all-reduce really waits for every rank, so a
late rank makes the others wait in that sync.  All ranks stop at the same
step (the first to pass --duration sets it for all: a collective needs
every rank).  The summary then has one entry per rank (steps, mean step,
time waited in collectives, how often it entered last).

Example:
    python3 demos/workloads/train.py --duration 30 --kernel-us 2000 \\
        --kernels-per-step 8 --batch-bytes 16MiB --pinned --workers 2
    python3 demos/workloads/train.py --ranks 2 --rank-cpus 0,1 --duration 20
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import math
import multiprocessing as mp
import os
import queue as queue_mod
import random
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_LIB = HERE.parent / "build" / "libcudart.so.12"
DEFAULT_NCCL = HERE.parent / "build" / "libnccl.so.2"
NCCL_FLOAT32 = 7
NCCL_SUM = 0
# The launcher's rendezvous directory (what torchrun's TCP store is for a real job).
RDZV_ENV = "INGERO_DEMO_RDZV"

CUDA_H2D = 1
# Work calibration buffer: 256 KiB hashes in ~0.2-0.5 ms here, long enough to
# time and short enough to repeat.
CALIBRATION_BYTES = 256 * 1024
CALIBRATION_RUNS = 5


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def parse_size(text: str) -> int:
    units = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1024, "m": 1e6, "mb": 1e6, "mib": 1 << 20,
             "g": 1e9, "gb": 1e9, "gib": 1 << 30}
    t = text.strip().lower()
    num = t.rstrip("kmgib")
    return int(float(num) * units[t[len(num):]])


def parse_seconds(text: str) -> float:
    """A finite, non-negative number of seconds (NaN or inf would never end a loop)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be finite and at least 0")
    return v


def load_cudart(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    p, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(ctypes.c_void_p), sz, p]
    lib.cudaMemcpy.argtypes = [p, p, sz, i]
    lib.cudaMemcpyAsync.argtypes = [p, p, sz, i, p]
    lib.cudaStreamSynchronize.argtypes = [p]
    lib.cudaMalloc.argtypes = [ctypes.POINTER(p), sz]
    lib.cudaMallocHost.argtypes = [ctypes.POINTER(p), sz]
    lib.cudaFreeHost.argtypes = [p]
    lib.cudaFree.argtypes = [p]
    lib.cudaStreamCreate.argtypes = [ctypes.POINTER(p)]
    lib.cudaEventCreate.argtypes = [ctypes.POINTER(p)]
    lib.cudaEventRecord.argtypes = [p, p]
    lib.cudaEventSynchronize.argtypes = [p]
    for name in ("simcudaDeviceBusyNs", "simcudaUptimeNs", "simcudaWaitLateNs"):
        if hasattr(lib, name):
            getattr(lib, name).restype = ctypes.c_uint64
    return lib


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"train.py: {what} failed with cudaError {rc}")


def calibrate_bytes_per_us() -> float:
    """SHA-256 throughput of this CPU, best of a few runs (least disturbed)."""
    buf = os.urandom(CALIBRATION_BYTES)
    best = float("inf")
    for _ in range(CALIBRATION_RUNS):
        t = time.perf_counter()
        hashlib.sha256(buf).digest()
        best = min(best, time.perf_counter() - t)
    return CALIBRATION_BYTES / max(best * 1e6, 1e-3)


def cpu_work(nbytes: int, buf: bytes) -> bytes:
    """A fixed amount of CPU work: hash nbytes (in slices of buf)."""
    h = hashlib.sha256()
    view = memoryview(buf)  # slices of a view copy nothing (a bytes slice would allocate and fault)
    while nbytes > 0:
        n = min(nbytes, len(buf))
        h.update(view[:n])
        nbytes -= n
    return h.digest()


def worker_main(wid: int, args: argparse.Namespace, work_bytes: int, out: mp.Queue, stop) -> None:
    """One DataLoader worker: per batch, optional file reads, then decode each sample."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    if args.worker_cpus:
        os.sched_setaffinity(0, {int(c) for c in args.worker_cpus.split(",")})
    rng = random.Random(wid)
    scratch = os.urandom(1 << 20)
    flags = os.O_RDONLY | (os.O_DIRECT if args.direct_reads else 0)
    fd = os.open(args.read_path, flags) if args.read_path else -1
    size = os.fstat(fd).st_size if fd >= 0 else 0
    # O_DIRECT needs an aligned buffer: an anonymous map is page-aligned
    aligned = mmap.mmap(-1, args.read_bytes) if args.direct_reads else None
    batch = 0
    try:
        while not stop.is_set():
            for _ in range(args.reads_per_batch if fd >= 0 else 0):
                off = rng.randrange(0, max(1, size - args.read_bytes)) & ~4095
                if args.cold_reads:
                    # a dataset larger than RAM: the block is not in the page cache
                    os.posix_fadvise(fd, off, args.read_bytes, os.POSIX_FADV_DONTNEED)
                if aligned is not None:
                    os.preadv(fd, [aligned], off)
                else:
                    os.pread(fd, args.read_bytes, off)
            digest = b""
            for _ in range(args.batch_size):
                if args.fetch_us:
                    time.sleep(args.fetch_us / 1e6)  # waiting on remote storage, not on the CPU
                digest = cpu_work(work_bytes, scratch)
            while not stop.is_set():
                try:
                    out.put((wid, batch, digest), timeout=0.2)
                    break
                except queue_mod.Full:
                    continue
            batch += 1
    finally:
        if fd >= 0:
            os.close(fd)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("INGERO_DEMO_CUDART", str(DEFAULT_LIB)),
                    help="libcudart.so.12 to load (default: the simulated one in demos/build)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: use --duration)")
    ap.add_argument("--duration", type=parse_seconds, default=10.0, help="seconds to run when --steps is 0")
    ap.add_argument("--kernel-us", type=int, default=2000, help="modelled duration of each kernel")
    ap.add_argument("--kernels-per-step", type=int, default=8)
    ap.add_argument("--batch-bytes", type=parse_size, default=parse_size("8MiB"), help="H2D copy per step")
    mem = ap.add_mutually_exclusive_group()
    mem.add_argument("--pinned", dest="pinned", action="store_true", default=True,
                     help="batch in cudaMallocHost memory, copied with cudaMemcpyAsync (default)")
    mem.add_argument("--pageable", dest="pinned", action="store_false",
                     help="batch in ordinary (pageable) memory: staged, synchronous copies")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (0: load inline)")
    ap.add_argument("--batch-size", type=int, default=8, help="samples per batch")
    ap.add_argument("--decode-us", type=float, default=100.0, help="CPU per sample in a worker")
    ap.add_argument("--fetch-us", type=float, default=0.0,
                    help="per sample, a worker waits this long for its data (object store, network FS)")
    ap.add_argument("--prefetch", type=int, default=2, help="batches queued per worker")
    ap.add_argument("--worker-cpus", default="", help="pin workers to these cores (e.g. 1)")
    ap.add_argument("--syncs-per-step", type=int, default=1,
                    help="cudaStreamSynchronize calls per step, spread over the kernels (.item()-like)")
    ap.add_argument("--host-us", type=float, default=500.0, help="CPU on the loop thread per step")
    ap.add_argument("--read-path", default="", help="file the workers read from per batch")
    ap.add_argument("--reads-per-batch", type=int, default=0)
    ap.add_argument("--read-bytes", type=parse_size, default=parse_size("256KiB"))
    ap.add_argument("--cold-reads", action="store_true", help="drop each block from the page cache first")
    ap.add_argument("--direct-reads", action="store_true",
                    help="read with O_DIRECT (every read goes to the disk, as with a dataset larger than RAM)")
    ap.add_argument("--mmap-path", default="",
                    help="take each batch from a window of this memory-mapped file (mapped per step)")
    ap.add_argument("--fresh-buffers", action="store_true",
                    help="allocate the host batch buffer anew each step (first-touch page faults)")
    ap.add_argument("--cpu", default="", help="pin the training loop to these cores (e.g. 0)")
    ap.add_argument("--progress", type=int, default=0, help="print a line every N steps to stderr")
    ap.add_argument("--summary-json", default="", help="also write the JSON summary to this file")
    ap.add_argument("--ready-file", default="", help="create this file once the first step is done")
    ap.add_argument("--ranks", type=int, default=1,
                    help="data-parallel ranks: start this many rank processes, torchrun-style (default 1: no NCCL)")
    ap.add_argument("--rank-cpus", default="",
                    help="with --ranks: rank i is pinned to the i-th core of this list (cycled), its workers too")
    ap.add_argument("--nccl", default=os.environ.get("INGERO_DEMO_NCCL", str(DEFAULT_NCCL)),
                    help="libnccl.so.2 to load in each rank (default: the simulated one in demos/build); "
                         "a comma list: rank i loads the i-th (cycled), e.g. two copies of one library")
    ap.add_argument("--grad-bytes", type=parse_size, default=parse_size("32MiB"),
                    help="gradients all-reduced per step (float32)")
    ap.add_argument("--wait-timeline", action="store_true",
                    help="with --ranks: each rank's summary lists, per step, the wall clock (ns since the "
                         "epoch, as events.timestamp) and its all-reduces' cumulative wait (simulated NCCL's "
                         "truth), to compare a trace's window with what really happened in it")
    ap.add_argument("--warmup-s", type=parse_seconds, default=0.0,
                    help="the summary counts only steps that start this many seconds after the loop did "
                         "(bench_budget: a tracer's overhead budget engages a few seconds in)")
    ap.add_argument("--measure-from", default="",
                    help="the summary counts only steps that start after this file appears "
                         "(the demo creates it when the interference starts)")
    return ap


class Stop:
    def __init__(self) -> None:
        self.flag = False

    def __call__(self, signum, frame) -> None:  # noqa: ANN001
        self.flag = True


# ---- data parallel: the launcher and each rank's NCCL ------------------------------


def launch_ranks(args: argparse.Namespace, argv: list[str]) -> int:
    """torchrun's job for this script: N rank processes with the torchrun environment, then one summary."""
    import subprocess
    import tempfile
    import uuid

    cpus = [c for c in args.rank_cpus.split(",") if c] if args.rank_cpus else []
    rdzv = Path(tempfile.mkdtemp(prefix="train-rdzv-"))
    run_id = uuid.uuid4().hex[:12]
    procs = []
    stop_signal = Stop()
    signal.signal(signal.SIGTERM, stop_signal)
    signal.signal(signal.SIGINT, stop_signal)
    try:
        for r in range(args.ranks):
            env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(args.ranks),
                   "LOCAL_WORLD_SIZE": str(args.ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                   "TORCHELASTIC_RUN_ID": run_id, RDZV_ENV: str(rdzv)}
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv,
                   "--summary-json", str(rdzv / f"rank{r}.json")]
            if cpus:
                core = cpus[r % len(cpus)]
                cmd += ["--cpu", core]
                if not args.worker_cpus:
                    cmd += ["--worker-cpus", core]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
        while any(p.poll() is None for p in procs):
            if stop_signal.flag:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                stop_signal.flag = False
            time.sleep(0.1)
        per_rank = []
        for r, p in enumerate(procs):
            f = rdzv / f"rank{r}.json"
            if p.returncode != 0 or not f.exists():
                raise SystemExit(f"train.py: rank {r} failed (exit code {p.returncode})")
            per_rank.append(json.loads(f.read_text()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in rdzv.iterdir():
            f.unlink()
        rdzv.rmdir()
    def mean(key: str) -> float | None:
        vals = [r[key] for r in per_rank if r.get(key) is not None]
        return round(sum(vals) / len(vals), 3) if vals else None

    summary = {
        "ranks": args.ranks,
        "steps": min(r["steps"] for r in per_rank),
        "wall_s": max(r["wall_s"] for r in per_rank),
        # the job runs at its slowest rank's pace: the slowest rank's rate, the ranks' mean step
        "steps_per_s": round(min(r["steps_per_s"] for r in per_rank), 2),
        "step_ms_mean": mean("step_ms_mean"),
        "step_ms_p99": max(r["step_ms_p99"] for r in per_rank),
        "sync_ms_p99": max(r["sync_ms_p99"] for r in per_rank),
        "device_busy_pct": mean("device_busy_pct"),
        # per rank: how long its all-reduces waited for the other ranks (the simulated NCCL's truth)
        "collective_wait_ms_mean": mean("collective_wait_ms_mean"),
        "collective_wait_ms_by_rank": [r.get("collective_wait_ms_mean") for r in per_rank],
        "entered_last_by_rank": [r.get("entered_last") for r in per_rank],
        "wait_policy": per_rank[0].get("wait_policy"),
        "pid": os.getpid(),
        "job": run_id,
        "per_rank": per_rank,
    }
    print(json.dumps(summary), flush=True)
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary) + "\n")
    return 0


class Rank:
    """This process' rank of the job: its NCCL communicator and the shared stop step."""

    def __init__(self, path: str, rdzv: Path):
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.rdzv = rdzv
        self.stop_at: int | None = None
        lib = self.lib = ctypes.CDLL(path)
        p, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.ncclGetUniqueId.argtypes = [ctypes.c_char_p]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(p), i, UniqueId, i]
        lib.ncclAllReduce.argtypes = [p, p, sz, i, i, p, p]
        lib.ncclCommDestroy.argtypes = [p]
        for name in ("simncclWaitNs", "simncclLastCount", "simncclCollectives"):
            if hasattr(lib, name):
                getattr(lib, name).restype = ctypes.c_uint64
                getattr(lib, name).argtypes = [p]
        uid = UniqueId()
        path_id = rdzv / "nccl-unique-id"
        if self.rank == 0:
            # rank 0 makes the id and publishes it whole (written aside, then renamed)
            rc = lib.ncclGetUniqueId(ctypes.cast(ctypes.byref(uid), ctypes.c_char_p))
            if rc != 0:
                raise SystemExit(f"train.py: ncclGetUniqueId failed with ncclResult {rc}")
            tmp = rdzv / "nccl-unique-id.tmp"
            tmp.write_bytes(bytes(uid))
            tmp.rename(path_id)
        else:
            deadline = time.monotonic() + 60
            while not path_id.exists():
                if time.monotonic() > deadline:
                    raise SystemExit("train.py: no ncclUniqueId from rank 0 within 60 s")
                time.sleep(0.01)
            ctypes.memmove(ctypes.byref(uid), path_id.read_bytes(), ctypes.sizeof(uid))
        self.comm = ctypes.c_void_p()
        rc = lib.ncclCommInitRank(ctypes.byref(self.comm), self.world, uid, self.rank)
        if rc != 0:
            raise SystemExit(f"train.py: ncclCommInitRank failed with ncclResult {rc}")

    def all_reduce(self, buf: ctypes.c_void_p, nbytes: int, stream: ctypes.c_void_p) -> None:
        rc = self.lib.ncclAllReduce(buf, buf, nbytes // 4, NCCL_FLOAT32, NCCL_SUM, self.comm, stream)
        if rc != 0:
            raise SystemExit(f"train.py: ncclAllReduce failed with ncclResult {rc}")

    def truth(self, name: str) -> int | None:
        fn = getattr(self.lib, name, None)
        return int(fn(self.comm)) if fn is not None else None

    def request_stop(self, step: int) -> None:
        """Stop every rank at the same step: the first rank to ask fixes it at step + 2, which no rank
        has started yet (the all-reduce keeps ranks within one step of each other)."""
        if self.stop_at is not None:
            return
        tmp = self.rdzv / f"stop.{self.rank}"
        tmp.write_text(str(step + 2))
        try:
            os.link(tmp, self.rdzv / "stop")  # atomic: the first link wins
        except FileExistsError:
            pass
        tmp.unlink()
        self.poll_stop()

    def poll_stop(self) -> None:
        if self.stop_at is None and (self.rdzv / "stop").exists():
            self.stop_at = int((self.rdzv / "stop").read_text())

    def close(self) -> None:
        self.lib.ncclCommDestroy(self.comm)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.ranks > 1 and RDZV_ENV not in os.environ:
        return launch_ranks(args, argv)
    if args.cpu:
        os.sched_setaffinity(0, {int(c) for c in args.cpu.split(",")})
    stop_signal = Stop()
    signal.signal(signal.SIGTERM, stop_signal)
    signal.signal(signal.SIGINT, stop_signal)

    # calibrate before the first CUDA call: the trace then shows the loop, not its set-up
    bytes_per_us = calibrate_bytes_per_us()
    host_work = int(args.host_us * bytes_per_us)
    decode_work = int(args.decode_us * bytes_per_us)
    scratch = os.urandom(1 << 20)

    lib = load_cudart(args.lib)
    check(lib.cudaSetDevice(0), "cudaSetDevice")
    stream = ctypes.c_void_p()
    check(lib.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
    dev = ctypes.c_void_p()
    check(lib.cudaMalloc(ctypes.byref(dev), args.batch_bytes), "cudaMalloc")

    host = ctypes.c_void_p()
    keep = None
    if args.pinned and not args.fresh_buffers:
        check(lib.cudaMallocHost(ctypes.byref(host), args.batch_bytes), "cudaMallocHost")
        ctypes.memset(host, 1, args.batch_bytes)
    else:
        keep = ctypes.create_string_buffer(args.batch_bytes)
        host = ctypes.c_void_p(ctypes.addressof(keep))
    mfd = os.open(args.mmap_path, os.O_RDONLY) if args.mmap_path else -1
    msize = os.fstat(mfd).st_size if mfd >= 0 else 0
    rng = random.Random(0)

    rank = None
    if RDZV_ENV in os.environ:
        libs = [x for x in args.nccl.split(",") if x]
        rank = Rank(libs[int(os.environ["RANK"]) % len(libs)], Path(os.environ[RDZV_ENV]))
    grads = ctypes.c_void_p()
    if rank is not None:
        check(lib.cudaMalloc(ctypes.byref(grads), args.grad_bytes), "cudaMalloc")

    kernel_fn = getattr(lib, "simcudaTimedKernel", None)
    kernel_ptr = ctypes.cast(kernel_fn, ctypes.c_void_p) if kernel_fn is not None else ctypes.c_void_p()
    us = ctypes.c_uint32(args.kernel_us)
    kargs = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(us), ctypes.c_void_p))
    grid, block = Dim3(64, 1, 1), Dim3(256, 1, 1)
    syncs = max(0, args.syncs_per_step)
    sync_every = max(1, args.kernels_per_step // syncs) if syncs else 0

    ctx = mp.get_context("fork")
    stop = ctx.Event()
    q: mp.Queue = ctx.Queue(maxsize=max(1, args.workers * args.prefetch))
    workers = [ctx.Process(target=worker_main, args=(w, args, decode_work, q, stop), daemon=True)
               for w in range(args.workers)]
    for w in workers:
        w.start()

    step_ms: list[float] = []
    wait_ms: list[float] = []
    sync_ms: list[float] = []
    coll0 = {k: rank.truth(k) or 0 for k in ("simncclWaitNs", "simncclLastCount")} if rank else {}
    device_busy_ns = getattr(lib, "simcudaDeviceBusyNs", None)  # only the simulated runtime has it
    busy0 = device_busy_ns() if device_busy_ns else 0
    # how late waits returned past the device's finish (CPU wait inside waits), simulated runtime only
    wait_late_ns = getattr(lib, "simcudaWaitLateNs", None)
    late0 = wait_late_ns() if wait_late_ns else 0
    t_start = time.perf_counter()
    deadline = t_start + args.warmup_s + args.duration  # --duration is what the summary measures
    step = 0
    measure_from = Path(args.measure_from) if args.measure_from else None
    warmup_until = t_start + args.warmup_s if args.warmup_s > 0 else None
    measured_from_step = 0
    timeline = [] if args.wait_timeline and rank is not None else None
    try:
        while True:
            if rank is not None:
                # every rank must run the same steps: a collective needs all of them
                if stop_signal.flag or (not args.steps and time.perf_counter() >= deadline):
                    rank.request_stop(step)
                rank.poll_stop()
                if (rank.stop_at is not None and step >= rank.stop_at) or (args.steps and step >= args.steps):
                    break
            elif stop_signal.flag:
                break
            elif args.steps and step >= args.steps:
                break
            elif not args.steps and time.perf_counter() >= deadline:
                break
            t0 = time.perf_counter()
            if ((measure_from is not None and measure_from.exists())
                    or (warmup_until is not None and t0 >= warmup_until)):
                # the clean lead-in (or the warm-up) is over: the summary describes the run from here
                measure_from = warmup_until = None
                for samples in (step_ms, wait_ms, sync_ms):
                    samples.clear()
                measured_from_step, t_start = step, t0
                busy0 = device_busy_ns() if device_busy_ns else 0
                late0 = wait_late_ns() if wait_late_ns else 0
                if rank is not None:
                    coll0 = {k: rank.truth(k) or 0 for k in coll0}
            # -- data: from the workers, or loaded inline
            if args.workers:
                while not stop_signal.flag:
                    try:
                        q.get(timeout=0.2)
                        break
                    except queue_mod.Empty:
                        continue
            else:
                for _ in range(args.batch_size):
                    cpu_work(decode_work, scratch)
            t1 = time.perf_counter()
            # -- host -> device copy
            window = None
            src = host
            if args.fresh_buffers:
                keep = ctypes.create_string_buffer(args.batch_bytes)  # fresh pages, first touch faults
                src = ctypes.c_void_p(ctypes.addressof(keep))
            if mfd >= 0:
                length = min(args.batch_bytes, msize)
                off = rng.randrange(0, max(1, msize - length)) & ~(mmap.ALLOCATIONGRANULARITY - 1)
                # a private writable map so ctypes can take its address; only read here
                window = mmap.mmap(mfd, length, flags=mmap.MAP_PRIVATE,
                                   prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
                anchor = ctypes.c_char.from_buffer(window)
                src = ctypes.c_void_p(ctypes.addressof(anchor))
            if args.pinned and mfd >= 0:
                # collate into pinned memory (what pin_memory does), then an async copy
                n = min(args.batch_bytes, msize)
                ctypes.memmove(host, src, n)
                check(lib.cudaMemcpyAsync(dev, host, n, CUDA_H2D, stream), "cudaMemcpyAsync")
            elif args.pinned and not args.fresh_buffers:
                check(lib.cudaMemcpyAsync(dev, src, args.batch_bytes, CUDA_H2D, stream), "cudaMemcpyAsync")
            else:
                n = min(args.batch_bytes, msize) if mfd >= 0 else args.batch_bytes
                check(lib.cudaMemcpy(dev, src, n, CUDA_H2D), "cudaMemcpy")
            if window is not None:
                del anchor  # the export must go before the map can close
                window.close()
            # -- forward/backward: kernels, with syncs spread among them
            for k in range(args.kernels_per_step):
                check(lib.cudaLaunchKernel(kernel_ptr, grid, block, kargs, 0, stream), "cudaLaunchKernel")
                if rank is not None and k == args.kernels_per_step - 1:
                    # backward done: all-reduce the gradients on the step's stream (DDP's bucket)
                    rank.all_reduce(grads, args.grad_bytes, stream)
                if sync_every and (k + 1) % sync_every == 0 and (k + 1) // sync_every <= syncs:
                    ts = time.perf_counter()
                    check(lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
                    sync_ms.append((time.perf_counter() - ts) * 1e3)
            # -- optimizer bookkeeping on the host
            if host_work:
                cpu_work(host_work, scratch)
            t2 = time.perf_counter()
            step_ms.append((t2 - t0) * 1e3)
            wait_ms.append((t1 - t0) * 1e3)
            step += 1
            if timeline is not None:
                timeline.append((time.time_ns(), rank.truth("simncclWaitNs") or 0))
            if step == 1 and args.ready_file:
                Path(args.ready_file).touch()
            if args.progress and step % args.progress == 0:
                print(f"step {step}: {step_ms[-1]:.2f} ms (data wait {wait_ms[-1]:.2f} ms)",
                      file=sys.stderr, flush=True)
        lib.cudaDeviceSynchronize()
        if rank is not None:
            coll = {k: (rank.truth(k) or 0) - coll0.get(k, 0) for k in coll0}
            rank.close()
    finally:
        stop.set()
        for w in workers:
            w.terminate()
        for w in workers:
            w.join(timeout=2)
        q.cancel_join_thread()
        if mfd >= 0:
            os.close(mfd)
    wall = time.perf_counter() - t_start
    busy = (device_busy_ns() - busy0) / 1e9 if device_busy_ns else None
    late = (wait_late_ns() - late0) / 1e9 if wait_late_ns else None
    schedule = lib.simcudaSchedule() if hasattr(lib, "simcudaSchedule") else None
    measured = step - measured_from_step
    summary = {
        "steps": measured,
        "measured_from_step": measured_from_step,
        "wall_s": round(wall, 3),
        "steps_per_s": round(measured / wall, 2) if wall else 0.0,
        "step_ms_mean": round(sum(step_ms) / len(step_ms), 3) if step_ms else 0.0,
        "step_ms_p50": round(percentile(step_ms, 50), 3),
        "step_ms_p99": round(percentile(step_ms, 99), 3),
        "data_wait_ms_mean": round(sum(wait_ms) / len(wait_ms), 3) if wait_ms else 0.0,
        "sync_ms_p99": round(percentile(sync_ms, 99), 3),
        "device_busy_pct": round(100 * busy / wall, 1) if busy is not None and wall else None,
        # share of wall clock the loop's waits returned after the device was done (off CPU then)
        "wait_late_pct": round(100 * late / wall, 2) if late is not None and wall else None,
        "wait_policy": {1: "spin", 2: "yield", 4: "block"}.get(schedule) if schedule is not None else None,
        "pid": os.getpid(),
    }
    if rank is not None:
        summary.update({
            "rank": rank.rank,
            "world_size": rank.world,
            # how long this rank's all-reduces stood waiting for the other ranks (simulated NCCL's truth)
            "collective_wait_ms_mean": round(coll["simncclWaitNs"] / 1e6 / measured, 3) if measured else 0.0,
            "collective_wait_pct": round(100 * coll["simncclWaitNs"] / 1e9 / wall, 2) if wall else 0.0,
            "entered_last": coll["simncclLastCount"],
            **({"collective_wait_timeline": timeline} if timeline is not None else {}),
        })
    if rank is None or RDZV_ENV not in os.environ:
        print(json.dumps(summary), flush=True)
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
