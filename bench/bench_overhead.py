"""Tracer overhead: workload throughput untraced vs traced vs the kernel floor.

Run as root from the repo root: ``.venv/bin/python -m bench.bench_overhead``.

Three modes, each workload run REPEATS times per mode, modes interleaved
(so load from other users of the machine spreads over all of them), median
kept:

* untraced  - nothing attached;
* floor     - the same object compiled with -DINGERO_EMPTY (every program
              returns at once) at the same probe points: the price of a
              uprobe / tracepoint hit itself, which no tracer avoids;
* traced    - the real thing: `ingero trace` (default mode for the CUDA
              workload, --comm for the context-switch one), storing rows.

Workloads (tests/live/workloads): cudart_calls (NVIDIA's libcudart, 9
probed calls per iteration) and pingpong (two processes bouncing a byte
over pipes: two sched_switch + wakeups per round trip, traced via --comm).

Reported, both in wall time and in the workload's own CPU time (which
holds the BPF programs' cost and is far less sensitive to other load on a
shared machine): our cost above the floor = (traced - floor) / floor.
Target: <= 10 %.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingero.collect.loader import BpfSettings, load_program

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "tests" / "live" / "workloads"
REPEATS = 5
TARGET_ABOVE_FLOOR_PCT = 10.0  # from the issue
CUDA_ITERS = 5000  # 9 probed calls each: 45,000 calls, ~0.5 s untraced here (each call fails driver init: ~9 us)
PINGPONG_TRIPS = 20000


def _build(name: str, tmp: Path) -> Path:
    out = tmp / name
    subprocess.run(["cc", "-O2", "-o", str(out), str(WORKLOADS / f"{name}.c"), "-ldl", "-lpthread"], check=True)
    return out


def _libcudart() -> Path:
    import nvidia.cuda_runtime  # type: ignore[import-not-found]

    for base in nvidia.cuda_runtime.__path__:
        for p in sorted(Path(base, "lib").glob("libcudart.so.*")):
            return p
    raise SystemExit("nvidia-cuda-runtime-cu12 is not installed")


def _time_cmd(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the workload's processes).

    CPU time includes the BPF programs (they run in the workload's context)
    but not time spent waiting for a CPU, so it stays readable on a shared,
    loaded machine where wall time is mostly other people's load.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}")
    cpu = ru.ru_utime + ru.ru_stime  # wait4 rusage: the child and its waited-for children
    if argv[0].endswith("pingpong"):
        elapsed = float(out.strip())  # its own clock: excludes process start
    return elapsed, cpu


STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
PROG_TYPES = {"2", "5"}  # BPF_PROG_TYPE_KPROBE (uprobes) and BPF_PROG_TYPE_TRACEPOINT


def _prog_stats(pid: int) -> tuple[int, int]:
    """(runs, ns) summed over the uprobe and tracepoint programs ``pid`` holds (fdinfo; bpf_stats_enabled)."""
    runs = ns = 0
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("prog_type", "").strip() not in PROG_TYPES:
            continue
        runs += int(fields.get("run_cnt", "0"))
        ns += int(fields.get("run_time_ns", "0"))
    return runs, ns


class _Floor:
    """Empty programs at the same probe points, attached in this process."""

    def __enter__(self) -> "_Floor":
        from ingero.collect.libs import find_cuda_libraries

        self.program = load_program(BpfSettings(empty=True))
        for lib in find_cuda_libraries():
            self.program.attach_library(lib.path, lib.kind, lib.identity, lib.symbols)
        return self

    def __exit__(self, *exc: object) -> None:
        self.program.close()


class _Traced:
    """`ingero trace` in the background, started and stopped around the runs."""

    def __init__(self, db: Path, *args: str):
        self.argv = [sys.executable, "-m", "ingero", "trace", "--json", "--db", str(db), *args]

    def __enter__(self) -> "_Traced":
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if '"type": "start"' in line:
                break
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.communicate(timeout=60)


def _measure(name: str, argv: list[str], traced_args: list[str], tmp: Path) -> dict[str, tuple[float, float]]:
    """mode -> (median wall s, median workload CPU s)."""
    _time_cmd(argv)  # warm the page cache and the dynamic loader
    with _Floor():
        floor = [_time_cmd(argv) for _ in range(REPEATS)]
        floor_prog = _prog_stats(os.getpid())
    untraced = [_time_cmd(argv) for _ in range(REPEATS)]
    with _Traced(tmp / f"{name}.duckdb", *traced_args) as tr:
        traced = [_time_cmd(argv) for _ in range(REPEATS)]
        traced_prog = _prog_stats(tr.proc.pid)
    out: dict = {"prog_ns": (floor_prog[1] / max(floor_prog[0], 1), traced_prog[1] / max(traced_prog[0], 1))}
    for mode, runs in (("untraced", untraced), ("floor", floor), ("traced", traced)):
        out[mode] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
    return out


def main() -> int:
    if os.geteuid() != 0:
        print("bench_overhead needs root (eBPF)", file=sys.stderr)
        return 2
    stats_before = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        return _run()
    finally:
        STATS_SYSCTL.write_text(stats_before)


def _run() -> int:
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        calls = _build("cudart_calls", tmp)
        pingpong = _build("pingpong", tmp)
        lib = _libcudart()
        cases = [
            ("libcudart calls", [str(calls), str(lib), str(CUDA_ITERS), "4096"], [], CUDA_ITERS * 9),
            ("pipe ping-pong", [str(pingpong), str(PINGPONG_TRIPS)], ["--comm", "pingpong"], PINGPONG_TRIPS),
        ]
        print(f"median of {REPEATS} runs per mode; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
        print("| workload | measure | untraced | floor | traced | traced vs untraced | above floor | target |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        prog_rows = []
        for name, argv, targs, ops in cases:
            m = _measure(name.split()[0], argv, targs, tmp)
            prog_rows.append((name, *m.pop("prog_ns")))
            for i, what in ((0, "wall ops/s"), (1, "workload CPU µs/op")):
                u, f, t = m["untraced"][i], m["floor"][i], m["traced"][i]
                above = (t - f) / f * 100
                total = (t - u) / u * 100
                vals = (ops / u, ops / f, ops / t) if i == 0 else (u / ops * 1e6, f / ops * 1e6, t / ops * 1e6)
                fmt = "{:,.0f}" if i == 0 else "{:.2f}"
                print(f"| {name} | {what} | " + " | ".join(fmt.format(v) for v in vals) +
                      f" | {total:+.0f}% time | {above:+.1f}% | <= {TARGET_ABOVE_FLOOR_PCT:.0f}% "
                      f"{'ok' if above <= TARGET_ABOVE_FLOOR_PCT else 'MISSED'} |", flush=True)
        print("\nBPF time per program run, uprobes and tracepoints, host-wide while the runs went on (kernel.bpf_stats_enabled, which adds ~40 ns to both):\n")
        print("| workload | floor ns/run | traced ns/run |\n|---|---:|---:|")
        for name, f_ns, t_ns in prog_rows:
            print(f"| {name} | {f_ns:.0f} | {t_ns:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
