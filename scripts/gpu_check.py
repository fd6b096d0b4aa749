#!/usr/bin/env python3
"""The first run on a real GPU: four loops under `ingero trace --cmd` (CUPTI) and torch.profiler, one table.

scripts/gpu-check.sh sets the machine up offline and calls this.  For each loop
of scripts/gpu_check_loops.py:

  1. ``ingero trace --cmd`` (CUPTI on): explain's busy share, measured by CUPTI,
     and its top chain; the same session with its device_activity taken out
     (a copy of the store): the busy share inferred from the calls alone;
  2. torch.profiler over the same loop, a run of its own (two CUPTI clients in one
     process take the activity API from each other): the profiler's trace,
     imported (`ingero import`), gives the busy share its timeline measured.

With ``--dry`` the loops run on the simulated runtime and its CUPTI stand-in
(no torch, no GPU: demos/build), and the profiler's column is the simulator's
own truth (its compute and copy engines' busy time over the traced span).

One markdown table on stdout (and OUT/table.md, OUT/results.json).  Loops run
while the deadline allows (--deadline-s, 8 minutes by default, counted from the
start of gpu-check.sh when it passes INGERO_GPU_CHECK_T0): a loop that would
not finish in time is left out, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOOPS = ("healthy", "dataloader", "cpu-hogs", "pageable")
SIM_LIB = REPO / "demos" / "build" / "libcudart.so.12"


def explain_json(db: Path, drop_device: bool = False) -> dict:
    """explain --json over ``db`` (a copy without device_activity rows when ``drop_device``)."""
    import duckdb

    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain

    path = db
    if drop_device:
        path = db.with_name(db.stem + "-inferred.duckdb")
        shutil.copy(db, path)
        con = duckdb.connect(str(path))
        con.execute("DELETE FROM device_activity")
        con.close()
    con = duckdb.connect(str(path), read_only=True)
    try:
        return explain(con, Options()).to_dict()
    finally:
        con.close()


def top_chain(report: dict) -> str:
    chains = report.get("chains") or []
    return f"{chains[0]['rule_id']} ({chains[0]['severity']})" if chains else "none"


def busy(report: dict) -> float | None:
    d = report.get("device")
    return d["busy_share"] if d else None


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def run_loop(loop: str, args, out: Path, ingero: list[str], py: str) -> dict:
    db = out / f"{loop}.duckdb"
    for stale in out.glob(f"{loop}*"):
        stale.unlink()
    summary = out / f"{loop}.json"
    backend = ["--backend", "sim", "--lib", str(SIM_LIB)] if args.dry else ["--backend", "torch"]
    cmd = f"{py} {HERE / 'gpu_check_loops.py'} {loop} {' '.join(backend)} --seconds {args.seconds} --summary {summary}"
    trace = [*ingero, "trace", "--no-serve", "--db", str(db), "--cmd", cmd]
    if args.dry:
        trace[len(ingero) + 1:len(ingero) + 1] = ["--cuda-lib", str(SIM_LIB)]
    t0 = time.monotonic()
    proc = subprocess.run(trace, capture_output=True, text=True, cwd=REPO)
    (out / f"{loop}.trace.log").write_text(proc.stdout + proc.stderr)
    row: dict = {"loop": loop, "trace_s": round(time.monotonic() - t0, 1)}
    if proc.returncode != 0:
        row["error"] = f"ingero trace exited {proc.returncode} (see {loop}.trace.log)"
        return row
    cupti_line = next((ln for ln in (proc.stdout + proc.stderr).splitlines() if "ingero: cupti:" in ln), "")
    row["cupti_line"] = cupti_line.removeprefix("ingero: ")
    measured = explain_json(db)
    inferred = explain_json(db, drop_device=True)
    d = measured.get("device") or {}
    row.update(cupti_busy=busy(measured) if d.get("measured_by") == "CUPTI" else None,
               source=d.get("source"), inferred_busy=busy(inferred), top_chain=top_chain(measured),
               top_chain_inferred=top_chain(inferred), span_ns=d.get("span_ns"))
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    row["device_rows"] = dict(con.execute("SELECT kind, count(*) FROM device_activity GROUP BY kind").fetchall())
    row["joined"] = con.execute("""SELECT count(*) FROM device_activity d JOIN events e
                                   ON e.tid = d.call_tid AND e.timestamp = d.call_ns
                                   WHERE d.kind <> 'sync'""").fetchone()[0]
    con.close()
    truth = json.loads(summary.read_text()) if summary.exists() else {}
    row["steps"] = truth.get("steps")
    if args.dry:
        if d.get("span_ns") and "simcudaDeviceBusyNs" in truth:
            row["reference_busy"] = (truth["simcudaDeviceBusyNs"] + truth["simcudaCopyBusyNs"]) / d["span_ns"]
        row["kernels_queued"] = truth.get("simcudaKernelsQueued")
        return row
    # torch.profiler over the same loop, alone in its process
    trace_json = out / f"{loop}.prof.json"
    t1 = time.monotonic()
    prof = subprocess.run([py, str(HERE / "gpu_check_loops.py"), loop, "--backend", "torch", "--seconds",
                           str(args.seconds), "--profile", str(trace_json)], capture_output=True, text=True)
    (out / f"{loop}.prof.log").write_text(prof.stdout + prof.stderr)
    if prof.returncode != 0 or not trace_json.exists():
        row["profiler_error"] = f"torch.profiler run exited {prof.returncode}"
        return row
    pdb = out / f"{loop}-prof.duckdb"
    imp = subprocess.run([*ingero, "import", "--db", str(pdb), str(trace_json)], capture_output=True, text=True)
    if imp.returncode != 0:
        row["profiler_error"] = f"ingero import exited {imp.returncode}: {imp.stderr.strip()[-300:]}"
        return row
    row["reference_busy"] = busy(explain_json(pdb))
    row["profiler_s"] = round(time.monotonic() - t1, 1)
    trace_json.unlink()  # (large: the busy share and the store keep what matters)
    return row


def table(rows: list[dict], dry: bool) -> str:
    ref = "simulator's truth" if dry else "torch.profiler busy"
    lines = [f"| loop | CUPTI busy | {ref} | inferred busy | top chain (CUPTI) | top chain (inferred) | "
             "device rows (joined) |", "|---|---:|---:|---:|---|---|---:|"]
    for r in rows:
        if "error" in r or "skipped" in r:
            lines.append(f"| {r['loop']} | {r.get('error') or r.get('skipped')} | | | | | |")
            continue
        rows_n = sum(v for k, v in r["device_rows"].items() if k != "sync")
        lines.append(f"| {r['loop']} | {pct(r['cupti_busy'])} | {pct(r.get('reference_busy'))}"
                     f"{' (' + r['profiler_error'] + ')' if 'profiler_error' in r else ''} "
                     f"| {pct(r['inferred_busy'])} | "
                     f"{r['top_chain']} | {r['top_chain_inferred']} | {rows_n:,} ({r['joined']:,}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="the simulated runtime and its CUPTI stand-in, no GPU")
    ap.add_argument("--seconds", type=float, default=10.0, help="each loop's run (default 10)")
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--out", type=Path, default=Path("/tmp/ingero-gpu-check"))
    ap.add_argument("--deadline-s", type=float, default=480.0)
    ap.add_argument("--python", default=sys.executable, help="the interpreter the loops run in (torch's)")
    args = ap.parse_args(argv)
    t_start = float(os.environ.get("INGERO_GPU_CHECK_T0") or time.time())
    args.out.mkdir(parents=True, exist_ok=True)
    ingero = [sys.executable, "-m", "ingero"]
    loops = [x for x in args.loops.split(",") if x]
    rows: list[dict] = []
    per_loop_s = None
    for loop in loops:
        left = args.deadline_s - (time.time() - t_start)
        if per_loop_s is not None and left < 1.2 * per_loop_s:
            rows.append({"loop": loop, "skipped": f"skipped: {left:.0f} s left of the deadline"})
            continue
        t0 = time.time()
        rows.append(run_loop(loop, args, args.out, ingero, args.python))
        per_loop_s = max(per_loop_s or 0.0, time.time() - t0)
        print(f"gpu-check: {loop} done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    text = table(rows, args.dry)
    print(text)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        if r.get("cupti_line"):
            print(f"  {r['loop']}: {r['cupti_line']}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
