"""Per-program cost of the CUDA uprobe path, for comparing BPF variants.

Run as root from the repo root, under the benchmark lock::

    flock /tmp/ingero-bench.lock .venv/bin/python -m bench.bench_probe_cost [NAME=BPF_DIR ...]

Each NAME=BPF_DIR is a directory holding a variant of bpf/ (default: the
repo's bpf/ as "repo").  Rounds interleave the variants (the order rotates
each round); in each block ``ingero trace --comm ... --cuda-lib <private
copy>`` runs with INGERO_BPF_DIR pointing at the variant, then the
libcudart calls workload of bench_overhead runs once with
kernel.bpf_stats_enabled on (runs and ns/run per program from the tracer's
fdinfo) and TIMED_RUNS times with it off (the workload's CPU per call, which
holds the programs and everything else tracing costs in its context).  One
floor block (the empty programs, attached in this process) gives the
ns/run a program costs for doing nothing at the same point.

``--workload driver`` runs the driver API instead: driver_calls against the
live tests' stand-in libcuda (8 rows per iteration, one of them through
cuLaunchKernel_ptsz, which calls cuLaunchKernel inside: the nested path
every launch takes in a real CUDA stack, runtime -> driver).

``--helpers`` instead loads each variant in this process and lists, per CUDA
program, the instructions left after the verifier and the helper functions
it still calls (an inlined helper leaves no call): what the JIT will run.

The stats add ~20-40 ns to every run (floor and variants alike); compare
variants with each other and with the floor, measured in the same session.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from bench.bench_overhead import (CUDA_CALLS_PER_ITER, REPO, STATS_SYSCTL, WORK_COMM, WORKLOADS, Workload, _build,
                                  _Floor, _foreign_tracers, _Ingero, _private_libcudart, _labels, _stats_pass,
                                  _tag_names)
from ingero.collect import probes
from ingero.collect.loader import BpfSettings, load_program

# 30 k iterations x 9 calls: ~0.35 s with the probes; enough runs per program
# (30 k) for a stable ns/run, short enough for many interleaved blocks.
ITERS = 30_000
TIMED_RUNS = 2
DRIVER_ROWS_PER_ITER = 8  # driver_calls.c: 8 calls per iteration, plus one nested cuLaunchKernel
ROUNDS = 3
SETTINGS = BpfSettings(trace_all_cuda=False, target_comm=WORK_COMM)  # what bench_overhead's tracer compiles
# The previous block's tracer leaves a closer process detaching its uprobes
# (~0.1 s each, loader._close_in_background): their programs still fire
# until it is done.
CLOSER_WAIT_S = 30.0

# ---------------------------------------------------------------- helper calls left after the verifier

_BPF_OBJ_GET_INFO_BY_FD = 15
_BPF_CALL = 0x85


class _ProgInfo(ctypes.Structure):
    # the head of struct bpf_prog_info (uapi/linux/bpf.h); the kernel fills only what info_len covers
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8),
                ("jited_prog_len", ctypes.c_uint32), ("xlated_prog_len", ctypes.c_uint32),
                ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


def _prog_info(fd: int, info: _ProgInfo) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    attr = _InfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info))
    if libc.syscall(321, _BPF_OBJ_GET_INFO_BY_FD, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:  # __NR_bpf
        raise OSError(ctypes.get_errno(), "BPF_OBJ_GET_INFO_BY_FD")


def _kallsyms() -> dict[int, str]:
    out = {}
    for line in Path("/proc/kallsyms").read_text().splitlines():
        addr, kind, name = line.split()[:3]
        if kind in "tTwW":
            out[int(addr, 16)] = name
    return out


def xlated_calls(fd: int, syms: dict[int, str]) -> tuple[int, list[str]]:
    """(instructions after the verifier, names of the helpers still called) of a loaded program."""
    info = _ProgInfo()
    _prog_info(fd, info)
    n = info.xlated_prog_len
    buf = (ctypes.c_uint8 * n)()
    info2 = _ProgInfo(xlated_prog_len=n, xlated_prog_insns=ctypes.addressof(buf))
    _prog_info(fd, info2)
    raw = bytes(buf)
    base = next(a for a, s in syms.items() if s == "__bpf_call_base")
    calls = []
    for i in range(0, n, 8):
        code, regs = raw[i], raw[i + 1]
        imm = int.from_bytes(raw[i + 4:i + 8], "little", signed=True)
        if code == _BPF_CALL and (regs >> 4) == 0:  # src_reg 0: a helper (imm = its address - __bpf_call_base)
            calls.append(syms.get(base + imm, hex(base + imm)))
    return n // 8, calls


def _wait_closers(tmp: Path) -> int:
    """Wait (bounded) until no tracer of ours (its command line names ``tmp``) is attached; returns
    how many other tracers hold BPF programs or perf events on the host (their probes may run too)."""
    deadline = time.monotonic() + CLOSER_WAIT_S
    while True:
        others = _foreign_tracers({os.getpid()})
        ours = [p for p in others if str(tmp) in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        if not ours or time.monotonic() > deadline:
            return len(others) - len(ours)
        time.sleep(0.5)


@contextmanager
def _bpf_dir(path: Path) -> Iterator[None]:
    before = os.environ.get("INGERO_BPF_DIR")
    os.environ["INGERO_BPF_DIR"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("INGERO_BPF_DIR", None)
        else:
            os.environ["INGERO_BPF_DIR"] = before


def show_helpers(variants: dict[str, Path]) -> None:
    from bcc import BPF

    syms = _kallsyms()
    fns = [probes.RETURN_FN] + sorted({p.entry_fn for p in probes.CUDA_PROBES})
    for name, path in variants.items():
        with _bpf_dir(path):
            prog = load_program(SETTINGS)
        try:
            print(f"## {name} ({path})")
            for fn in fns:
                fd = prog.bpf.load_func(fn.encode(), BPF.KPROBE).fd
                n, calls = xlated_calls(fd, syms)
                print(f"{fn}: {n} insns, {len(calls)} calls: {', '.join(calls)}")
        finally:
            prog.close()


# ---------------------------------------------------------------- timing


def _block(ctx: object, work: Workload, timed: int) -> tuple[dict[str, tuple[int, int]], list[float]]:
    """One stats-on run (runs, ns per program) and ``timed`` stats-off runs (CPU s each)."""
    work.run()  # warm: page cache, dynamic loader, the thread's task storage
    return _stats_pass(ctx, work), [work.run()[1] for _ in range(timed)]


class _FedWorkload(Workload):
    """A workload that waits for a line on stdin before its calls (driver_calls)."""

    def run(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                text=True)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.close()
        _, status, ru = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{self.argv[0]} exited {os.waitstatus_to_exitcode(status)}")
        return elapsed, ru.ru_utime + ru.ru_stime


def _workload(kind: str, iters: int, tmp: Path) -> tuple[Workload, Path]:
    """(workload, the library the tracer is pointed at)."""
    if kind == "cudart":
        lib = _private_libcudart(tmp)
        return Workload("libcudart calls", [str(_build("cudart_calls", tmp)), str(lib), str(iters), "4096"],
                        iters * CUDA_CALLS_PER_ITER, "call"), lib
    lib = tmp / "libcuda.so.1"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(WORKLOADS / "fake_libcuda.c")], check=True)
    return _FedWorkload("driver calls", [str(_build("driver_calls", tmp)), str(lib), str(iters), "4096"],
                        iters * DRIVER_ROWS_PER_ITER, "call"), lib


def measure(variants: dict[str, Path], rounds: int, iters: int, timed: int,
            extra_args: dict[str, list[str]], workload: str = "cudart") -> None:
    tag_names = {}
    labels = {}  # the floor's programs named as the variants name them (the last variant wins a conflict)
    for name, path in variants.items():
        with _bpf_dir(path):
            tag_names[name] = _tag_names(SETTINGS)
        labels.update(_labels(tag_names[name]))
    stats: dict[str, list[dict[str, tuple[int, int]]]] = {n: [] for n in variants}
    cpu: dict[str, list[float]] = {n: [] for n in variants}
    loads: list[float] = []
    noisy = 0
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        work, lib = _workload(workload, iters, tmp)
        calls = work.ops
        noisy += _wait_closers(tmp) > 0
        with _Floor(lib, labels) as floor:
            floor_stats, floor_cpu = _block(floor, work, timed)
        names = list(variants)
        for rnd in range(rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                noisy += _wait_closers(tmp) > 0
                loads.append(os.getloadavg()[0])
                tracer = _Ingero(tmp / f"{name}-{rnd}.duckdb", lib, tag_names[name])
                tracer.argv += extra_args.get(name, [])
                with _bpf_dir(variants[name]), tracer as ing:
                    s, c = _block(ing, work, timed)
                stats[name].append(s)
                cpu[name] += c
                per_call = sum(ns for r, ns in s.values()) / calls
                print(f"round {rnd + 1}/{rounds} {name}: load {loads[-1]:.2f}, BPF {per_call:.0f} ns/call, "
                      f"CPU {statistics.median(c) / calls * 1e9:.0f} ns/call", file=sys.stderr, flush=True)
    progs = sorted({p for runs in stats.values() for s in runs for p in s if s[p][0] >= 1000},
                   key=lambda p: (p != probes.RETURN_FN, p))
    print(f"\n{work.name}: {rounds} rounds, {iters:,} iterations, {calls:,} rows; load {min(loads):.2f}-"
          f"{max(loads):.2f}; {noisy} of {len(loads) + 1} blocks started with another tracer attached on the host.  "
          "ns/run with kernel.bpf_stats_enabled, median (min-max) over rounds; "
          f"CPU: the workload's CPU per call with stats off, median (min-max) of {timed} runs x {rounds} rounds.\n")
    print("| program | runs/round | empty | " + " | ".join(variants) + " |")
    print("|---|---:|---:|" + "---:|" * len(variants))

    def cell(vals: list[float]) -> str:
        return f"{statistics.median(vals):.0f} ({min(vals):.0f}-{max(vals):.0f})" if vals else "-"

    for p in progs:
        runs = max(s.get(p, (0, 0))[0] for v in stats.values() for s in v)
        fr, fns = floor_stats.get(p, (0, 0))
        cols = [cell([s[p][1] / s[p][0] for s in stats[n] if s.get(p, (0, 0))[0]]) for n in variants]
        print(f"| {p} | {runs:,} | {fns / max(fr, 1):.0f} | " + " | ".join(cols) + " |")
    floor_call = sum(ns for _, ns in floor_stats.values()) / calls
    cols = [cell([sum(ns for _, ns in s.values()) / calls - floor_call for s in stats[n]]) for n in variants]
    print("| BPF above empty, ns per call | | 0 | " + " | ".join(cols) + " |")
    cols = [cell([c / calls * 1e9 for c in cpu[n]]) for n in variants]
    print(f"| workload CPU, ns per call | | {statistics.median(floor_cpu) / calls * 1e9:.0f} | "
          + " | ".join(cols) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="*",
                    help="NAME=BPF_DIR[,TRACE_ARG...] (default: repo=bpf/); e.g. small=bpf,--ring-mb,8")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--iters", type=int, default=ITERS)
    ap.add_argument("--timed", type=int, default=TIMED_RUNS)
    ap.add_argument("--workload", choices=("cudart", "driver"), default="cudart")
    ap.add_argument("--helpers", action="store_true", help="list the helper calls left after the verifier")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_probe_cost needs root (eBPF)", file=sys.stderr)
        return 2
    specs = {v.split("=", 1)[0]: v.split("=", 1)[1].split(",") for v in a.variants}
    variants = {n: Path(s[0]).resolve() for n, s in specs.items()} or {"repo": REPO / "bpf"}
    extra_args = {n: s[1:] for n, s in specs.items()}
    if a.helpers:
        show_helpers(variants)
        return 0
    stats_before = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("0")
    try:
        measure(variants, a.rounds, a.iters, a.timed, extra_args, a.workload)
    finally:
        STATS_SYSCTL.write_text(stats_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
