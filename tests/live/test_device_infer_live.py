"""Live: device activity and steps inferred from a traced loop on the simulated runtime.

demos/workloads/train.py runs issue 21's loop (batches decoded inline, 50
kernels of 20 µs, a 64 KiB copy, one sync per step) under `ingero trace
--cmd`, with a sleeping (block) and a spinning (spin) sync.  Its JSON summary
is the truth: its step count, and the simulated device's busy share
(simcudaDeviceBusyNs over the loop's wall clock).

Only deterministic properties are asserted: the steps counted exactly (one
drain per step, plus the final cudaDeviceSynchronize), the upper bound at or
above the true busy share (the compute engine runs only between a
submission and the drain that waits for it), the breakdown adding up to the
mean step.  How close the point estimate comes is host-dependent (the
wake-up latency of a sleeping sync is not device time): bench/bench_device_infer.py
measures it, docs/benchmarks.md has the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import workloads

from ingero.analyze import device, traced_steps
from ingero.analyze.context import Options

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[2]
SHAPE = ["--kernel-us", "20", "--kernels-per-step", "50", "--workers", "0", "--host-us", "50",
         "--batch-bytes", "64KiB", "--duration", "4"]


@pytest.fixture(scope="module", params=["block", "spin"])
def run(request, tmp_path_factory, simcuda: Path):
    tmp = tmp_path_factory.mktemp(f"devinfer-{request.param}")
    db, summary = tmp / "t.duckdb", tmp / "summary.json"
    cmd = [sys.executable, str(REPO / "demos" / "workloads" / "train.py"), "--lib", str(simcuda),
           "--summary-json", str(summary), *SHAPE]
    proc = subprocess.run([sys.executable, "-m", "ingero", "trace", "--no-serve", "--db", str(db),
                           "--cuda-lib", str(simcuda), "--cmd", " ".join(cmd)],
                          cwd=REPO, capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S,
                          env={**os.environ, "SIMCUDA_SCHEDULE": request.param})
    assert proc.returncode == 0, proc.stderr
    truth = json.loads(summary.read_text())
    con = duckdb.connect(str(db), read_only=True)
    ctx, act = device.analyse(con, Options())
    st = traced_steps.detect(ctx, act) if act else None
    cost = con.execute("SELECT call_cost_ns FROM sessions").fetchall()
    yield truth, act, st, cost
    con.close()


def test_steps_are_counted_exactly(run):
    truth, act, st, _ = run
    assert act is not None and act.pid == truth["pid"]
    assert st is not None and st.drains_per_step == 1
    assert st.count == truth["steps"]


def test_the_upper_bound_holds_the_true_busy_share(run):
    truth, act, _, _ = run
    # the summary rounds to 0.1 point
    assert 100 * act.high >= truth["device_busy_pct"] - 0.05
    assert act.low <= act.busy_share <= act.high


def test_the_breakdown_adds_up_to_the_step(run):
    _, _, st, _ = run
    b = st.breakdown
    assert b is not None
    assert b.total_ms == pytest.approx(st.mean_ms, rel=1e-9)
    assert min(getattr(b, f"{p}_ms") for p in traced_steps.PARTS) >= 0
    # 50 launches and one copy per step, every step: both show
    assert b.launch_ms > 0 and b.copy_ms > 0


def test_the_trace_calibrated_what_a_traced_call_costs(run):
    # one session; a uprobe pair on a push-entry launch costs ~1-2 µs here (entry_cost.py)
    *_, cost = run
    assert len(cost) == 1
    assert 200 < cost[0][0] < 100_000
