"""Device busy inferred from the CUDA call stream, against the truth.

Two tables (markdown):

1. The simulated runtime: demos/workloads/train.py in several shapes under
   ``ingero trace --cmd``, for each wait policy (SIMCUDA_SCHEDULE); the truth
   is the run's own ``device_busy_pct`` (simcudaDeviceBusyNs: the compute
   engine's busy time; taken over the analysed span), and that plus the copy
   engine's busy time (simcudaCopyBusyNs, read by a wrapper when the loop
   ends; one stream, so the two never overlap): what a GPU's measured
   timeline counts (kernels, copies, memsets).
2. The real GPU traces in tests/data/kineto, imported with `--calls-only`;
   the truth is the union of their device intervals (tests/unit/kineto_truth.py).
3. With ``--demos``: every demo scenario's slow run (`ingero demo NAME
   --no-fix`), against the simulator's own timeline of the traced loop
   (SIMCUDA_TIMELINE: every kernel and copy, the union of their intervals over
   the analysed span).

    python -m bench.bench_device_infer                      # every shape, every policy
    python -m bench.bench_device_infer --shapes inline --schedules spin,block --duration 8
    python -m bench.bench_device_infer --demos --no-sim                # the demo scenarios only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

from ingero.analyze import context, device, traced_steps

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "demos" / "build" / "libcudart.so.12"

SHAPES = {
    # the default loop: 8 x 2 ms kernels per step, 8 MiB pinned copy, 2 workers
    "gpu-bound": [],
    # 200 kernels of 10 µs per step: the host's launches set the pace
    "launch-bound": ["--kernel-us", "10", "--kernels-per-step", "200", "--host-us", "100", "--batch-bytes", "64KiB"],
    # issue 21's loop: the batch is decoded inline between steps, the device idles through it
    "inline-loading": ["--kernel-us", "20", "--kernels-per-step", "50", "--workers", "0", "--host-us", "50",
                       "--batch-bytes", "64KiB"],
}
SCHEDULES = ("block", "spin", "yield")

# Runs train.py, then adds the copy engine's busy ns to its summary file.
WRAPPER = '''
import ctypes, json, runpy, sys
from pathlib import Path
lib, summary = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[3:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
copy = ctypes.CDLL(lib).simcudaCopyBusyNs
copy.restype = ctypes.c_uint64
d = json.loads(Path(summary).read_text())
d["copy_busy_ns"] = int(copy())
Path(summary).write_text(json.dumps(d))
'''


def analyse(db: Path, **opts) -> tuple[device.DeviceActivity | None, traced_steps.Steps | None]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        ctx, act = device.analyse(con, context.Options(**opts))
        return act, (traced_steps.detect(ctx, act) if act else None)
    finally:
        con.close()


def run_sim(shape: str, schedule: str, duration: float, tmp: Path) -> dict:
    db, summary = tmp / f"{shape}-{schedule}.duckdb", tmp / f"{shape}-{schedule}.json"
    wrapper = tmp / "wrap.py"
    wrapper.write_text(WRAPPER)
    cmd = [sys.executable, str(wrapper), str(LIB), str(summary),
           str(REPO / "demos" / "workloads" / "train.py"), "--lib", str(LIB),
           "--duration", str(duration), "--summary-json", str(summary), *SHAPES[shape]]
    proc = subprocess.run([sys.executable, "-m", "ingero", "trace", "--no-serve", "--db", str(db), "--cuda-lib",
                           str(LIB), "--cmd", " ".join(cmd)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "SIMCUDA_SCHEDULE": schedule})
    if proc.returncode != 0:
        raise SystemExit(f"ingero trace exited {proc.returncode}: {proc.stderr[-2000:]}")
    truth = json.loads(summary.read_text())
    act, st = analyse(db)
    return {"truth": truth, "act": act, "steps": st}


def sim_table(shapes: list[str], schedules: list[str], duration: float) -> None:
    subprocess.run(["make", "-C", str(REPO / "demos")], check=True, capture_output=True)
    print("| shape | wait policy | compute busy % | + copies % | inferred % | bounds % "
          "| error vs + copies (points) | steps (truth / found) | median step ms (truth / found) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="ingero-devinfer-") as d:
        for shape in shapes:
            for schedule in schedules:
                r = run_sim(shape, schedule, duration, Path(d))
                t, a, st = r["truth"], r["act"], r["steps"]
                # the truth over the analysed span (first device call to the last one's return), not
                # train.py's wall clock, which also holds start-up (forking workers, the first batch)
                # and shutdown; the device is busy only inside the span
                compute_ns = t["device_busy_pct"] / 100 * t["wall_s"] * 1e9
                span = a.end_ns - a.start_ns
                compute = 100 * compute_ns / span
                both = 100 * (compute_ns + t["copy_busy_ns"]) / span
                found = f"{st.count:,}" if st else "none"
                med = f"{st.median_ms:.3f}" if st else "-"
                print(f"| {shape} | {schedule} | {compute:.1f} | {both:.1f} | {100 * a.busy_share:.1f} "
                      f"| {100 * a.low:.1f}-{100 * a.high:.1f} | {100 * a.busy_share - both:+.1f} "
                      f"| {t['steps']:,} / {found} | {t['step_ms_p50']:.3f} / {med} |", flush=True)


def traces_table() -> None:
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from kineto_truth import DATA, TRACES, busy_share, load  # noqa: PLC0415 (the tests' truth, from the JSON)

    from ingero.analyze.device import imported  # noqa: PLC0415
    from ingero.importer import import_trace  # noqa: PLC0415
    from ingero.store.db import Store  # noqa: PLC0415

    print("\n| trace | measured busy % | inferred % | bounds % | inside | drains | back-pressure launches |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for name in TRACES:
        measured = busy_share(load(name))
        store = Store.memory()
        res = import_trace(store, DATA / name, calls_only=True)
        lo, hi, _ = imported.analysed_span(store.con, res.session_id)
        _, a = device.analyse(store.con, context.Options(session=res.session_id, from_ns=lo, to_ns=hi), span=(lo, hi))
        inside = "yes" if a.low <= measured <= a.high else "NO"
        print(f"| {name} | {100 * measured:.1f} | {100 * a.busy_share:.1f} "
              f"| {100 * a.low:.1f}-{100 * a.high:.1f} | {inside} | {a.drains} | {a.backpressure_launches} |")


def timeline_busy_ns(path: Path, lo: int, hi: int, offset_ns: int, engines: str = "01") -> int:
    """The union of the device operations of a SIMCUDA_TIMELINE file within [lo, hi) (epoch ns;
    the file's are CLOCK_MONOTONIC, ``offset_ns`` = wall - monotonic); ``engines``: "0" compute
    only (what simcudaDeviceBusyNs counts), "01" compute and copy."""
    rows = [r for r in (ln.split() for ln in path.read_text().splitlines() if ln.strip()) if r[0] in engines]
    if not rows:
        return 0
    iv = sorted((max(int(a) + offset_ns, lo), min(int(b) + offset_ns, hi)) for _, a, b in rows)
    total, cur_a, cur_b = 0, None, None
    for a, b in iv:
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            total += 0 if cur_b is None else cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + (0 if cur_b is None else cur_b - cur_a)


def demos_table(duration: float, names: list[str] | None = None) -> None:
    from ingero.collect.decode import monotonic_offset_ns  # noqa: PLC0415
    from ingero.demo import scenarios  # noqa: PLC0415

    subprocess.run(["make", "-C", str(REPO / "demos")], check=True, capture_output=True)
    print(f"\n`ingero demo NAME --no-fix --duration {duration:g}s`, the traced loop against its own timeline:\n")
    print("| scenario | wait policy | compute busy % | + copies % (timeline) | inferred % | bounds % "
          "| error vs + copies (points) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="ingero-devinfer-demos-") as d:
        for name in names or scenarios.names():
            db, tl = Path(d) / f"{name}.duckdb", Path(d) / f"{name}-%p.tl"
            proc = subprocess.run([sys.executable, "-m", "ingero", "demo", name, "--no-fix", "--keep-db", str(db),
                                   "--duration", f"{duration:g}s", "--json"], cwd=REPO, capture_output=True, text=True,
                                  env={**os.environ, "SIMCUDA_TIMELINE": str(tl)})
            if proc.returncode != 0:
                raise SystemExit(f"ingero demo {name} exited {proc.returncode}: {proc.stderr[-2000:]}")
            act, _ = analyse(db)
            path = Path(d) / f"{name}-{act.pid}.tl"
            if not path.exists():
                raise SystemExit(f"{name}: no timeline of the loop (pid {act.pid}) in {d}")
            # (the whole span: a trace of many calls is analysed on a share of each window, span_ns)
            span = act.end_ns - act.start_ns
            truth = 100 * timeline_busy_ns(path, act.start_ns, act.end_ns, monotonic_offset_ns()) / span
            compute = 100 * timeline_busy_ns(path, act.start_ns, act.end_ns, monotonic_offset_ns(), "0") / span
            print(f"| {name} | {scenarios.get(name).policy} | {compute:.1f} | {truth:.1f} | {100 * act.busy_share:.1f} "
                  f"| {100 * act.low:.1f}-{100 * act.high:.1f} | {100 * act.busy_share - truth:+.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per run")
    ap.add_argument("--no-sim", action="store_true", help="not the simulated shapes (the real traces need no root)")
    ap.add_argument("--demos", action="store_true", help="also every demo scenario's slow run (root)")
    ap.add_argument("--demo-duration", type=float, default=16.0, help="seconds per demo run")
    ap.add_argument("--demo-names", default="", help="only these scenarios (comma-separated; default: all)")
    args = ap.parse_args()
    if not (math.isfinite(args.demo_duration) and args.demo_duration > 0):
        ap.error(f"--demo-duration must be a positive number of seconds, not {args.demo_duration}")
    if not args.no_sim:
        sim_table(args.shapes.split(","), args.schedules.split(","), args.duration)
    traces_table()
    if args.demos:
        demos_table(args.demo_duration, [n for n in args.demo_names.split(",") if n])


if __name__ == "__main__":
    main()
