"""The overhead budget's whole cost (issue 44): untraced vs ``--overhead-budget 2%`` vs ``off``, side by side.

Run as root from the repo root: ``.venv/bin/python -m bench.bench_budget_whole``.

The issue's host-bound loop -- ``demos/workloads/train.py --kernel-us 5
--kernels-per-step 100 --batch-bytes 64KiB --workers 0 --host-us 200 --cpu 0``
-- on two runtimes:

* the simulated runtime (demos/build/libcudart.so.12), whose device thread
  wakes at every launch (~75 k switches/s of the traced process when the
  queue drains often);
* bench/inline_cudart.c, built here: the same calls, every kernel a spin in
  the caller, no device thread (the loop's own switches only).

Each over RUN_SECONDS (8 and 30 s), steps/s counted from the loop's first
step: a budget must hold from the first second, there is no warm-up.  Modes
rotate every round; each run gets a fresh copy of its library under a name
library discovery does not match (another tracer's probes on a shared copy
would slow the untraced runs and refuse our links); the load average is
printed per row.  Per traced run: off-CPU rows stored and intervals counted
(switch_counts) per second, the launch probes' attached share, explain's top
chain.

Environment: WHOLE_ROUNDS (3 for 8 s runs; 30 s runs get one round each),
WHOLE_SECONDS (comma list, "8,30"), WHOLE_LOOPS ("simcuda,inline").
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_budget import QUIET_WAIT_S, _lingering

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "demos" / "workloads" / "train.py"
SIMCUDA = REPO / "demos" / "build" / "libcudart.so.12"
INLINE_SRC = Path(__file__).with_name("inline_cudart.c")
LOOP = ["--kernel-us", "5", "--kernels-per-step", "100", "--batch-bytes", "64KiB", "--workers", "0",
        "--host-us", "200", "--cpu", "0"]
ROUNDS = int(os.environ.get("WHOLE_ROUNDS", "3"))
RUN_SECONDS = [float(s) for s in os.environ.get("WHOLE_SECONDS", "8,30").split(",") if s]
LOOPS = [x for x in os.environ.get("WHOLE_LOOPS", "simcuda,inline").split(",") if x]
MODES = ["untraced", "2", "off"]
TARGET = 0.97  # of untraced steps/s, with the budget (the issue)


def _run(lib: Path, seconds: float, tmp: Path, mode: str, tag: str) -> dict:
    private = tmp / tag / "cudart-private.so"
    private.parent.mkdir()
    shutil.copyfile(lib, private)
    summary = tmp / f"{tag}.json"
    work = [sys.executable, str(TRAIN), "--lib", str(private), "--duration", str(seconds),
            "--summary-json", str(summary), *LOOP]
    end = time.monotonic() + QUIET_WAIT_S  # an earlier tracer's detaching process loads the kernel
    while any(_lingering(old) for old in tmp.glob("*.duckdb")) and time.monotonic() < end:
        time.sleep(0.5)
    out: dict = {"mode": mode, "load": os.getloadavg()[0]}
    if mode == "untraced":
        subprocess.run(work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    else:
        db = tmp / f"{tag}.duckdb"
        argv = [sys.executable, "-m", "ingero", "trace", "--db", str(db), "--cuda-lib", str(private), "--json",
                "--overhead-budget", mode, "--cmd", " ".join(work)]
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, check=True)
        out["db"] = db
    s = json.loads(summary.read_text())
    out["steps_per_s"] = s["steps_per_s"]
    out["pid"] = s["pid"]
    out["wall_s"] = s["wall_s"]
    return out


def _analyse(run: dict) -> None:
    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain
    from ingero.store.db import Store

    store = Store.open(run["db"], read_only=True)
    try:
        con = store.con
        wall = run["wall_s"]
        run["rows_per_s"] = con.execute("SELECT count(*) FROM events WHERE op = 'sched_switch' AND pid = $p",
                                        {"p": run["pid"]}).fetchone()[0] / wall
        run["counted_per_s"] = con.execute("SELECT coalesce(sum(switches), 0) FROM switch_counts WHERE pid = $p",
                                           {"p": run["pid"]}).fetchone()[0] / wall
        span, att = con.execute("SELECT coalesce(sum(to_ns - from_ns), 0), coalesce(sum(attached_to_ns - "
                                "attached_from_ns), 0) FROM sampling").fetchone()
        run["attached"] = (att + max(0.0, wall * 1e9 - span)) / (wall * 1e9)  # unsampled time: attached
        chains = explain(con, Options()).chains
        run["top"] = f"{chains[0].severity} {chains[0].rule_id}" if chains else "none"
    finally:
        store.close()


def _build_inline(tmp: Path) -> Path:
    out = tmp / "libcudart-inline.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(INLINE_SRC)], check=True)
    return out


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    if os.geteuid() != 0:
        print("needs root (ingero trace)")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-whole-"))
    libs = {"simcuda": SIMCUDA, "inline": _build_inline(tmp)}
    labels = {"simcuda": "simulated runtime (device thread)", "inline": "kernels spin in the caller (no device thread)"}
    print(f"# bench_budget_whole: the issue's loop ({' '.join(LOOP)}), modes rotated per round; "
          f"load at start {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)\n")
    t0 = time.monotonic()
    results: dict[tuple[str, float, str], list[dict]] = {}
    n = 0
    for loop in LOOPS:
        for seconds in RUN_SECONDS:
            rounds = ROUNDS if seconds <= 10 else 1
            for r in range(rounds):
                for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                    n += 1
                    run = _run(libs[loop], seconds, tmp, mode, f"{loop}-{seconds:g}-{mode}-{r}")
                    if mode != "untraced":
                        _analyse(run)
                    results.setdefault((loop, seconds, mode), []).append(run)
                    print(f"  {loop} {seconds:g}s round {r} {mode}: {run['steps_per_s']:.1f} steps/s, "
                          f"load {run['load']:.1f}" + (f", rows {run['rows_per_s']:,.0f}/s, counted "
                                                      f"{run['counted_per_s']:,.0f}/s, attached {run['attached']:.0%}, "
                                                      f"top {run['top']}" if mode != "untraced" else ""), flush=True)
    print()
    print("| loop | run | mode | steps/s (median of rounds) | ratio to untraced | off-CPU rows stored /s "
          "| intervals counted /s | launch probes attached | top chain | load |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|")
    verdict = []
    for loop in LOOPS:
        for seconds in RUN_SECONDS:
            base = _med(results[(loop, seconds, "untraced")], "steps_per_s")
            for mode in MODES:
                runs = results[(loop, seconds, mode)]
                sps = _med(runs, "steps_per_s")
                name = {"untraced": "untraced", "off": "`--overhead-budget off`"}.get(
                    mode, f"`--overhead-budget {mode}%`")
                each = ", ".join(f"{r['steps_per_s']:.0f}" for r in runs)
                extra = "| | | | " if mode == "untraced" else (
                    f"| {_med(runs, 'rows_per_s'):,.0f} | {_med(runs, 'counted_per_s'):,.0f} | "
                    f"{_med(runs, 'attached'):.0%} | {', '.join(sorted(set(r['top'] for r in runs)))} | ")
                print(f"| {labels[loop]} | {seconds:g} s x {len(runs)} | {name} | {sps:.1f} ({each}) | "
                      f"{sps / base:.2f} " + extra + f"{_med(runs, 'load'):.1f} |")
                if mode == "2":
                    verdict.append(f"{labels[loop]}, {seconds:g} s, 2% budget: {sps / base:.2f} of untraced steps/s "
                                   f"(target >= {TARGET}): {'met' if sps / base >= TARGET else 'NOT met'}")
    print()
    for line in verdict:
        print(f"- {line}")
    print(f"\n({n} runs, {time.monotonic() - t0:.0f} s; load at end {os.getloadavg()[0]:.1f})")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
