"""Cost of --stack: workload throughput and events/s with and without it.

Run as root from the repo root: ``.venv/bin/python -m bench.bench_stack``.

Workload: a Python loop calling NVIDIA's libcudart (cudaMalloc, which fails
fast without a driver) through ctypes from STACK_DEPTH nested Python
functions -- a PyTorch training step sits 20-40 frames deep.  Three modes,
interleaved REPEATS times (the machine is shared: medians, and the load is
printed), each through the real CLI:

* untraced           - the workload alone;
* trace              - ``ingero trace --cmd``;
* trace --stack      - ``ingero trace --stack --cmd``.

Reported: CUDA calls/s of the workload (= CUDA events/s stored), the cost
of --stack per call (stack - trace), and from the --stack database the
share of native frames left unknown.  A second table compares walking the
Python frames in BPF (what --stack does, cost measured above) with walking
them from user space through /proc/PID/mem, as a tracer would have to per
event if it did not walk in BPF.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from ingero.collect import pyframes

REPEATS = 3
SECONDS = 3.0          # per run: long enough for ~10k calls traced
STACK_DEPTH = 24       # Python frames under the CUDA call (module + main + 22 nested)
WALK_SAMPLES = 2000

WORKLOAD = r'''
import ctypes, json, sys, time
cudart = ctypes.CDLL(sys.argv[1])
seconds = float(sys.argv[2])
depth = int(sys.argv[3])
ptr = ctypes.c_void_p()
def call(d):
    if d:
        return call(d - 1)
    return cudart.cudaMalloc(ctypes.byref(ptr), 64)
def main():
    n = 0
    end = time.monotonic() + seconds
    t = time.monotonic()
    while time.monotonic() < end:
        call(depth)
        n += 1
    print(json.dumps({"calls": n, "seconds": time.monotonic() - t}), flush=True)
main()
'''

PARKED = r'''
import sys, threading
def call(d):
    if d:
        return call(d - 1)
    print(threading.get_native_id(), flush=True)
    sys.stdin.readline()
call(int(sys.argv[1]))
'''


def libcudart() -> str:
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec else []:
        p = Path(base) / "cuda_runtime" / "lib" / "libcudart.so.12"
        if p.exists():
            return str(p)
    sys.exit("nvidia-cuda-runtime-cu12 is not installed (pip install nvidia-cuda-runtime-cu12)")


def _last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no result line in: {text[-500:]!r}")


def tracer_env(tmp: Path) -> dict:
    """A private query socket: another tracer on the machine must not refuse ours."""
    return {**os.environ, "INGERO_SOCKET": str(tmp / "ingero.sock")}


def run(mode: str, script: Path, lib: str, tmp: Path, k: int) -> dict:
    cmd = [sys.executable, str(script), lib, str(SECONDS), str(STACK_DEPTH - 2)]
    if mode == "untraced":
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
        return _last_json(out)
    db = tmp / f"{mode.replace(' ', '_')}-{k}.duckdb"
    argv = [sys.executable, "-m", "ingero", "trace", "--cmd", " ".join(cmd), "--duration", "120", "--db", str(db)]
    if mode == "trace --stack":
        argv.insert(4, "--stack")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=tracer_env(tmp))
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    out = _last_json(res.stdout)
    con = duckdb.connect(str(db), read_only=True)
    out["stored"] = con.execute("SELECT count(*) FROM events WHERE op = 'cudaMalloc'").fetchone()[0]
    if mode == "trace --stack":
        with_stack, native, unknown = con.execute(
            "SELECT (SELECT count(stack_id) FROM events WHERE op = 'cudaMalloc'),"
            " count(*) FILTER (WHERE frame_kind = 'native'),"
            " count(*) FILTER (WHERE frame_kind = 'native' AND function = '[unknown]') FROM stacks").fetchone()
        exact = con.execute(
            "SELECT count(*) FROM events e WHERE op = 'cudaMalloc' AND EXISTS (SELECT 1 FROM stacks s "
            "WHERE s.stack_id = e.stack_id AND s.frame_kind = 'python' AND s.function = 'call')").fetchone()[0]
        out.update(with_stack=with_stack, native_frames=native, native_unknown=unknown, python_resolved=exact)
    con.close()
    return out


def bench_throughput(tmp: Path) -> None:
    lib = libcudart()
    script = tmp / "workload.py"
    script.write_text(WORKLOAD)
    modes = ["untraced", "trace", "trace --stack"]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    load = [os.getloadavg()[0]]
    for k in range(REPEATS):
        for m in modes:
            results[m].append(run(m, script, lib, tmp, k))
            load.append(os.getloadavg()[0])
    print(f"Workload: {STACK_DEPTH} Python frames deep, cudaMalloc via ctypes, {SECONDS:.0f} s per run, "
          f"median of {REPEATS}, modes interleaved; load average during the runs "
          f"{min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores.\n")
    print("| mode | CUDA calls/s (workload) | us per call | events stored per run |")
    print("|---|---:|---:|---:|")
    per_call = {}
    for m in modes:
        rate = statistics.median(r["calls"] / r["seconds"] for r in results[m])
        per_call[m] = 1e6 / rate
        stored = statistics.median(r.get("stored", 0) for r in results[m]) if m != "untraced" else "-"
        print(f"| {m} | {rate:,.0f} | {per_call[m]:.1f} | {stored if stored == '-' else f'{stored:,.0f}'} |")
    print(f"\n--stack costs {per_call['trace --stack'] - per_call['trace']:.1f} us per CUDA call "
          f"({(per_call['trace --stack'] / per_call['trace'] - 1) * 100:.0f} % of a traced call) "
          f"for a {STACK_DEPTH}-frame Python stack walked in BPF (CPython processes: no native walk).")
    st = results["trace --stack"]
    calls = sum(r["stored"] for r in st)
    print(f"Events with a stack id: {sum(r['with_stack'] for r in st):,} of {calls:,}; "
          f"with the Python call site resolved: {sum(r['python_resolved'] for r in st):,} "
          f"(the rest: before the new process was examined, ~20 ms after its first event).")
    nat = sum(r["native_frames"] for r in st)
    unk = sum(r["native_unknown"] for r in st)
    print(f"Native frames stored: {nat:,}, unknown: {unk:,} ({100 * unk / max(nat, 1):.0f} %) -- only "
          "from events before the process was examined: CPython processes get Python frames only.")


def bench_user_space_walk() -> None:
    """What a user-space walk at event time would cost (per event, 3+ preads per frame)."""
    child = subprocess.Popen([sys.executable, "-c", PARKED, str(STACK_DEPTH - 3)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        tid = int(child.stdout.readline())
        interp = pyframes.find_interpreter(child.pid)
        with pyframes.ProcessMemory(child.pid) as mem:
            reader = pyframes.CodeReader(mem, interp)
            t = time.perf_counter()
            frames = pyframes.walk_thread(mem, interp, tid)
            [reader.frame(c, i) for c, i in frames]
            cold = time.perf_counter() - t
            walks = []
            for _ in range(WALK_SAMPLES):
                t = time.perf_counter()
                pyframes.walk_thread(mem, interp, tid)
                walks.append(time.perf_counter() - t)
            resolve = []
            for _ in range(WALK_SAMPLES):
                t = time.perf_counter()
                for c, i in frames:
                    reader.frame(c, i)
                resolve.append(time.perf_counter() - t)
    finally:
        child.communicate("x\n", timeout=30)
    print(f"\nUser-space alternative, {len(frames)} frames, median of {WALK_SAMPLES}:\n")
    print("| step | time |")
    print("|---|---:|")
    print(f"| walk thread list + frame chain via /proc/PID/mem (per event) | {statistics.median(walks) * 1e6:.0f} us |")
    print("| resolve frames to file:line, code objects cached (per new stack) | "
          f"{statistics.median(resolve) * 1e6:.0f} us |")
    print(f"| first resolve, cold code cache | {cold * 1e6:.0f} us |")
    print("\nA user-space walk also reads the stack when the ring buffer is drained, not when the "
          "call happened: the thread has moved on, so the lines would be wrong. The BPF walk is "
          "both cheaper and correct; user space only resolves each distinct stack once.")


NATIVE_CALLER = r'''
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
typedef int (*malloc_fn)(void **, unsigned long);
__attribute__((noinline)) int issue(malloc_fn f) { void *p; return f(&p, 64); }
__attribute__((noinline)) int step(malloc_fn f) { return issue(f) + 1; }
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) return 1;
    malloc_fn f = (malloc_fn)dlsym(h, "cudaMalloc");
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long n = 0;
    do { step(f); n++; clock_gettime(CLOCK_MONOTONIC, &b); } while (b.tv_sec - a.tv_sec < 1);
    printf("{\"calls\": %ld}\n", n);
    return 0;
}
'''


def bench_native_unknown(tmp: Path) -> None:
    """Share of unknown native frames for a C++-style caller, with and without frame pointers."""
    lib = libcudart()
    src = tmp / "caller.c"
    src.write_text(NATIVE_CALLER)
    print("\nNative stacks of a C caller (main -> step -> issue -> cudaMalloc), 1 s traced with --stack:\n")
    print("| build | native frames stored | unknown | share | caller chain found |")
    print("|---|---:|---:|---:|---|")
    for label, flags in (("-O2", ["-O2"]), ("-O2 -fno-omit-frame-pointer", ["-O2", "-fno-omit-frame-pointer"])):
        exe = tmp / ("caller" + str(len(flags)))
        subprocess.run(["cc", *flags, "-o", str(exe), str(src), "-ldl"], check=True)
        db = tmp / f"native{len(flags)}.duckdb"
        res = subprocess.run([sys.executable, "-m", "ingero", "trace", "--stack", "--cmd", f"{exe} {lib}",
                              "--duration", "60", "--db", str(db)], capture_output=True, text=True, timeout=300,
                             env=tracer_env(tmp))
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        con = duckdb.connect(str(db), read_only=True)
        total, unknown = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE function = '[unknown]') FROM stacks s "
            "WHERE frame_kind = 'native' AND stack_id IN "
            "(SELECT stack_id FROM events WHERE op = 'cudaMalloc')").fetchone()
        chain = [r[0] for r in con.execute(
            "SELECT function FROM stacks WHERE stack_id = (SELECT any_value(stack_id) FROM events "
            "WHERE op = 'cudaMalloc') ORDER BY depth").fetchall()]
        con.close()
        print(f"| {label} | {total} | {unknown} | {100 * unknown / max(total, 1):.0f} % | {' <- '.join(chain[:5])} |")


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("bench_stack needs root (eBPF)")
    with tempfile.TemporaryDirectory(prefix="ingero-bench-stack-") as tmp:
        bench_throughput(Path(tmp))
        bench_native_unknown(Path(tmp))
    bench_user_space_walk()


if __name__ == "__main__":
    main()
