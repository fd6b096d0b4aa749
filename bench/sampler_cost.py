"""The --stack CPU sampler's own cost (bpf/sample.bpf.c), as docs/rules.md reports it.

Runs `ingero trace --stack` on tests/live/sample_burn.py (one Python thread burning
CPU_S CPU-seconds on one line) with kernel.bpf_stats_enabled=1 for the run (restored to 0
after: it is host-wide), and reads the cpu_sample program's run_time_ns / run_cnt from the
tracer's /proc/PID/fdinfo every 0.5 s.  Root only.

    python -m bench.sampler_cost [CPU_S]
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
PERF_EVENT_PROG = re.compile(r"prog_type:\s+7\b")  # BPF_PROG_TYPE_PERF_EVENT


def main() -> None:
    cpu_s = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    db = os.path.join(tempfile.mkdtemp(), "cost.duckdb")
    subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"], check=True)
    snaps: list[tuple[float, int, int]] = []
    try:
        load0 = Path("/proc/loadavg").read_text().split()[:3]
        p = subprocess.Popen([sys.executable, "-m", "ingero", "trace", "--stack", "--db", db, "--cmd",
                              f"{sys.executable} {REPO / 'tests/live/sample_burn.py'} {cpu_s}"],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while p.poll() is None:
            time.sleep(0.5)
            for fd in glob.glob(f"/proc/{p.pid}/fdinfo/*"):
                try:
                    txt = Path(fd).read_text()
                except OSError:
                    continue
                if PERF_EVENT_PROG.search(txt):
                    rt = int(re.search(r"run_time_ns:\s+(\d+)", txt).group(1))
                    rc = int(re.search(r"run_cnt:\s+(\d+)", txt).group(1))
                    snaps.append((time.monotonic(), rt, rc))
    finally:
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"], check=True)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    if len(snaps) < 2:
        raise SystemExit("the cpu_sample program was never seen: is --stack's sampler attached?")
    secs = snaps[-1][0] - snaps[0][0]
    rt, rc = snaps[-1][1], snaps[-1][2]
    print(f"cpu_sample: {rc:,} runs, {rt / 1e6:.2f} ms BPF time, {rt / max(rc, 1):.0f} ns per run, "
          f"over {secs:.1f} s ({rc / secs:.0f} runs/s, {rt / secs / 1e9 * 100:.3f}% of one CPU)")
    d = [(b[2] - a[2], b[1] - a[1], b[0] - a[0]) for a, b in zip(snaps, snaps[1:]) if b[2] > a[2]]
    for runs, ns, dt in sorted(d, key=lambda x: x[1] / x[0])[-5:]:
        print(f"  busiest interval {dt:.2f} s: {runs} runs, {ns / 1e3:.1f} us, {ns / runs:.0f} ns per run")
    print(f"load before {' '.join(load0)}, after {' '.join(load1)}")
    con = duckdb.connect(db, read_only=True)
    n, stacked, cpu = con.execute("SELECT count(*), count(stack_id), sum(duration_ns) / 1e9 FROM events "
                                  "WHERE op = 'cpu_sample'").fetchone()
    print(f"cpu_sample rows: {n:,} ({stacked:,} with a stack), {cpu or 0:.2f} CPU-s estimated")


if __name__ == "__main__":
    main()
