"""What CUPTI under `trace --cmd` costs: the traced process per kernel, the tracer per record.

Two tables (markdown):

1. End to end, on the simulated runtime and its CUPTI stand-in: a launch-bound
   ctypes loop (steps of LAUNCHES launches of 10 µs kernels and one sync)
   under `ingero trace --cmd`, with CUPTI and with --no-cupti, runs
   alternating.  Per kernel: the loop's own time per launch, with and without
   (the difference holds the stand-in's bookkeeping too, which is not NVIDIA's:
   real CUPTI's cost per kernel is measured on a GPU by scripts/gpu-check.sh);
   the injection library's own CPU per CUPTI record (its ring header: the time
   spent turning CUPTI's buffers into ring records, on CUPTI's thread); and the
   tracer's own CPU (user + system of its threads, not its command's) with and
   without, the difference divided by the device_activity rows stored.
2. The tracer's side in isolation: DeviceJoin (decode, clock mapping, the
   ASOF match of each call against a stored events table, the corr join, the
   Arrow rows) and Ring.read over RECORDS synthetic kernels with their launch
   records, CPU per record (the process', DuckDB on one thread as in the tracer).

    python -m bench.bench_cupti                 # both tables
    python -m bench.bench_cupti --runs 5 --steps 400
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from ingero.collect import cupti
from ingero.store.db import Store

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "demos" / "build" / "libcudart.so.12"
LAUNCHES = 200

LOOP = r"""
import ctypes, json, sys, time
lib = ctypes.CDLL(sys.argv[1])
class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
p = ctypes.c_void_p
lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(p), ctypes.c_size_t, p]
k = ctypes.cast(lib.simcudaTimedKernel, p)
us = ctypes.c_uint32(10); args = (p * 1)(ctypes.cast(ctypes.pointer(us), p))
g = Dim3(1, 1, 1)
steps, launches = int(sys.argv[2]), int(sys.argv[3])
lib.cudaDeviceSynchronize()
t0, c0 = time.perf_counter(), time.thread_time()
for i in range(steps):
    for j in range(launches):
        lib.cudaLaunchKernel(k, g, g, args, 0, None)
    lib.cudaDeviceSynchronize()
wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
n = steps * launches
print(json.dumps({"launch_us": 1e6 * wall / n, "launch_cpu_us": 1e6 * cpu / n}), file=open(sys.argv[4], "w"))
"""


def traced(tmp: Path, steps: int, cupti_on: bool, k: int) -> dict:
    db, out, loop = tmp / f"t{k}.duckdb", tmp / f"loop{k}.json", tmp / "loop.py"
    loop.write_text(LOOP)
    cpu = tmp / f"cpu{k}.json"
    cmd = [sys.executable, "-c", TRACER, str(cpu), "trace", "--no-serve", "--db", str(db), "--cuda-lib", str(LIB),
           *([] if cupti_on else ["--no-cupti"]), "--cmd",
           f"{sys.executable} {loop} {LIB} {steps} {LAUNCHES} {out}"]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "SIMCUDA_SCHEDULE": "block"})
    if proc.returncode != 0:
        raise SystemExit(f"ingero trace exited {proc.returncode}: {proc.stdout[-2000:]}")
    res = json.loads(out.read_text())
    m = re.search(r"cupti: ([\d,]+) device records .*cost the process (\d+) ns CPU each", proc.stdout)
    res["rows"] = int(m.group(1).replace(",", "")) if m else 0
    res["inject_ns"] = int(m.group(2)) if m else None
    res["tracer_cpu_s"] = json.loads(cpu.read_text())["cpu_s"]
    return res


# `ingero` run in-process, writing its own CPU (every thread, not its command's) at exit.
TRACER = """
import atexit, json, resource, runpy, sys
out = sys.argv[1]
sys.argv = ["ingero", *sys.argv[2:]]
def done():
    u = resource.getrusage(resource.RUSAGE_SELF)
    open(out, "w").write(json.dumps({"cpu_s": u.ru_utime + u.ru_stime}))
atexit.register(done)
runpy.run_module("ingero", run_name="__main__")
"""


def end_to_end(runs: int, steps: int) -> None:
    subprocess.run(["make", "-C", str(REPO / "demos")], check=True, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="ingero-bench-cupti-") as d:
        tmp = Path(d)
        got: dict[bool, list[dict]] = {True: [], False: []}
        for k in range(runs):
            for on in (True, False) if k % 2 == 0 else (False, True):
                got[on].append(traced(tmp, steps, on, len(got[True]) + len(got[False])))
    med = {on: {key: float(np.median([r[key] for r in rs])) for key in ("launch_us", "launch_cpu_us", "tracer_cpu_s")}
           for on, rs in got.items()}
    rows = int(np.median([r["rows"] for r in got[True]]))
    inject = float(np.median([r["inject_ns"] for r in got[True] if r["inject_ns"] is not None]))
    kernels = steps * LAUNCHES
    print(f"End to end: {runs} runs each, alternating; {steps} steps of {LAUNCHES} launches of 10 µs kernels "
          f"(blocking syncs), medians.\n")
    print("| | per launch (µs) | loop thread's CPU per launch (µs) | tracer CPU (s) | device_activity rows |")
    print("|---|---:|---:|---:|---:|")
    for on, label in ((False, "--no-cupti"), (True, "CUPTI")):
        print(f"| {label} | {med[on]['launch_us']:.2f} | {med[on]['launch_cpu_us']:.2f} | "
              f"{med[on]['tracer_cpu_s']:.2f} | {rows if on else 0:,} |")
    added_cpu = med[True]["tracer_cpu_s"] - med[False]["tracer_cpu_s"]
    print(f"\nPer kernel: {med[True]['launch_us'] - med[False]['launch_us']:+.2f} µs of the loop's time, "
          f"{med[True]['launch_cpu_us'] - med[False]['launch_cpu_us']:+.2f} µs of its CPU (the stand-in's "
          f"bookkeeping included); the injection library {inject:.0f} ns CPU per CUPTI record; "
          f"the tracer +{1e9 * added_cpu / max(rows, 1):.0f} ns CPU per row "
          f"({kernels:,} kernels asked).\n")


def isolated(records: int) -> None:
    t0 = 100 * cupti.DELAY_NS
    skew = 1_763_000_000 * 10**9
    gap = 15_000
    starts = t0 + gap * np.arange(records, dtype=np.int64)
    store = Store.memory()
    store.con.execute("SET threads = 1")  # as the tracer's session runs DuckDB
    store.append("events", pa.table({
        "session_id": pa.array(np.ones(records, np.int32)), "timestamp": pa.array(starts),
        "duration_ns": pa.array(np.full(records, 8_000)), "pid": pa.array(np.full(records, 42, np.int32)),
        "tid": pa.array(np.full(records, 43, np.int32)), "op": pa.array(["cudaLaunchKernel"] * records)}))
    recs = np.zeros(2 * records + 2, cupti.RECORD_DTYPE)
    recs["type"][0] = recs["type"][-1] = cupti.REC_CLOCK
    recs["start"][0], recs["end"][0] = t0 + skew, t0
    recs["start"][-1], recs["end"][-1] = t0 + 10**10 + skew, t0 + 10**10
    api, ker = recs[1:records + 1], recs[records + 1:-1]
    api["type"], api["kind"], api["tid"] = cupti.REC_API, 2, 43
    api["name"] = (2 << 32) | 211
    api["correlation"] = ker["correlation"] = np.arange(1, records + 1)
    api["start"], api["end"] = starts + 1_000 + skew, starts + 7_000 + skew
    ker["type"], ker["name"] = cupti.REC_KERNEL, 0x1000
    ker["start"], ker["end"] = starts + 9_000 + skew, starts + 19_000 + skew
    names = np.zeros(2, cupti.NAME_DTYPE)
    names[0] = (cupti.REC_NAME, 0, 22, 1, 0, (2 << 32) | 211, 0, b"cudaLaunchKernel_v7000")
    names[1] = (cupti.REC_NAME, 0, 6, 1, 0, 0x1000, 0, b"kernel")
    feed = np.concatenate([names.view(cupti.RECORD_DTYPE), recs])
    # the ring: written as the injection library does, read as the hook does
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "42.ring"
        cap = 1 << 20
        hdr = np.zeros(1, cupti.RING_HEADER_DTYPE)
        hdr["magic"], hdr["version"], hdr["rec_size"], hdr["capacity"] = cupti.MAGIC, cupti.VERSION, 64, cap
        hdr["pid"], hdr["head"] = 42, len(feed)
        body = np.zeros(cap, cupti.RECORD_DTYPE)
        body[:len(feed)] = feed
        path.write_bytes(hdr.tobytes() + body.tobytes())
        ring = cupti.Ring(path, 42)
        c0 = time.process_time()
        got = ring.read()
        read_s = time.process_time() - c0
        ring.close()
    assert len(got) == len(feed)
    j = cupti.DeviceJoin(1, 0)
    c0 = time.process_time()
    j.feed(42, got)
    feed_s = time.process_time() - c0
    c0 = time.process_time()
    table = j.take(store.con, now_mono=t0 + 10**12)
    take_s = time.process_time() - c0
    store.close()
    assert table is not None and table.num_rows == records and j.joined == records, (table.num_rows, j.joined)
    per = 1e9 / (2 * records)
    print(f"The tracer's side alone: {records:,} kernels and their {records:,} launch records "
          f"({2 * records:,} ring records), one process, a stored events table of their launches.\n")
    print("| step | CPU ns per ring record |")
    print("|---|---:|")
    print(f"| Ring.read (copy out of the shared ring) | {read_s * per:.0f} |")
    print(f"| DeviceJoin.feed (decode, clock mapping) | {feed_s * per:.0f} |")
    print(f"| DeviceJoin.take (ASOF match in DuckDB, correlation join, Arrow rows) | {take_s * per:.0f} |")
    print(f"| total | {(read_s + feed_s + take_s) * per:.0f} |")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--no-trace", action="store_true", help="only the isolated table (no root needed)")
    args = ap.parse_args(argv)
    isolated(args.records)
    if not args.no_trace:
        end_to_end(args.runs, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
