"""Live: the device's own timeline under `ingero trace --cmd`, CUPTI's, on the simulated runtime.

The simulated runtime loads CUDA_INJECTION64_PATH at its first call, as the
driver does at cuInit; ingero's injection library then loads the CUPTI
stand-in beside the runtime (demos/build/libcupti.so.13), which records every
kernel and copy with the start and end the simulator's virtual device gave
it.  demos/workloads/train.py runs two loops under a wrapper that, at the end,
reads the simulator's own truth (kernels queued, compute and copy engines'
busy ns):

* issue 21's loop (batches decoded inline, 50 kernels of 20 µs, a 64 KiB
  pageable copy, one sync per step; CUDA's default wait): one device_activity
  row per kernel and per copy, each joined to its call's row, and the busy
  share explain prints within 1 point of the truth over the same span;
* the launch-bound loop under blocking syncs (200 kernels of 10 µs a step),
  the cell where the inference read 93% for a true 57% (#21): within 2 points.

The truth is the compute engine's busy time plus the copy engine's
(simcudaDeviceBusyNs + simcudaCopyBusyNs: one stream, they never overlap),
over explain's span (the process' first device call to its last return: all
of the device's work lies inside it).  Both loops make fewer calls than explain
analyses exactly, so that span is the whole of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import prereqs
import workloads

from ingero.analyze.context import Options
from ingero.analyze.device import DEVICE_OPS
from ingero.analyze.explain import explain

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "demos" / "workloads" / "train.py"
SHAPES = {
    "inline-loading": ("auto", ["--kernel-us", "20", "--kernels-per-step", "50", "--workers", "0", "--host-us", "50",
                                "--batch-bytes", "64KiB", "--steps", "400"]),
    "launch-bound-block": ("block", ["--kernel-us", "10", "--kernels-per-step", "200", "--host-us", "100",
                                     "--batch-bytes", "64KiB", "--steps", "300"]),
}
# (a number of steps, not a duration: under 100,000 calls explain analyses every call, where the
# shares are of the whole span, not of each window's first slice; device.T.max_exact_calls)
# Runs train.py, then adds the simulator's truth to its summary file.
WRAPPER = """
import ctypes, json, runpy, sys
from pathlib import Path
lib, summary = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[3:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
sim = ctypes.CDLL(lib)
truth = {}
for name in ("simcudaCopyBusyNs", "simcudaDeviceBusyNs", "simcudaKernelsQueued"):
    getattr(sim, name).restype = ctypes.c_uint64
    truth[name] = int(getattr(sim, name)())
d = json.loads(Path(summary).read_text())
d.update(truth)
Path(summary).write_text(json.dumps(d))
"""


@pytest.fixture(scope="module", params=list(SHAPES))
def run(request, tmp_path_factory, simcuda: Path):
    prereqs.needs((simcuda.parent / "libcupti.so.13").exists(), "the CUPTI stand-in (demos/build/libcupti.so.13)",
                  "make -C demos, with the CUDA toolkit's CUPTI headers")
    policy, shape = SHAPES[request.param]
    tmp = tmp_path_factory.mktemp(f"cupti-{request.param}")
    db, summary, wrapper = tmp / "t.duckdb", tmp / "summary.json", tmp / "wrap.py"
    wrapper.write_text(WRAPPER)
    cmd = [sys.executable, str(wrapper), str(simcuda), str(summary), str(TRAIN), "--lib", str(simcuda),
           "--summary-json", str(summary), *shape]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_INJECTION64_PATH", "INGERO_CUPTI_LIB")}
    proc = subprocess.run([sys.executable, "-m", "ingero", "trace", "--no-serve", "--db", str(db),
                           "--cuda-lib", str(simcuda), "--cmd", " ".join(cmd)],
                          cwd=REPO, capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S,
                          env={**env, "SIMCUDA_SCHEDULE": policy})
    assert proc.returncode == 0, proc.stderr
    truth = json.loads(summary.read_text())
    con = duckdb.connect(str(db), read_only=True)
    report = explain(con, Options())
    yield request.param, truth, con, report, proc.stdout + proc.stderr
    con.close()


@pytest.mark.exact
def test_one_row_per_kernel_and_copy_each_joined_to_its_call(run):
    _, truth, con, _, output = run
    pid = truth["pid"]
    rows = dict(con.execute("SELECT kind, count(*) FROM device_activity WHERE pid = $pid GROUP BY kind",
                            {"pid": pid}).fetchall())
    calls = dict(con.execute("SELECT op, count(*) FROM events WHERE pid = $pid AND op LIKE 'cuda%' GROUP BY op",
                             {"pid": pid}).fetchall())
    assert rows["kernel"] == truth["simcudaKernelsQueued"] == calls["cudaLaunchKernel"]
    # (64 KiB: a pageable copy is one staged chunk, one record)
    assert rows["memcpy"] == calls.get("cudaMemcpy", 0) + calls.get("cudaMemcpyAsync", 0) > 0
    joined = dict(con.execute(
        """SELECT d.kind, count(*) FROM device_activity d JOIN events e
             ON e.session_id = d.session_id AND e.tid = d.call_tid AND e.timestamp = d.call_ns AND e.pid = d.pid
           WHERE d.kind IN ('kernel', 'memcpy') GROUP BY d.kind""").fetchall())
    assert joined == {"kernel": rows["kernel"], "memcpy": rows["memcpy"]}
    # each kernel and copy ran after its call began, a synchronous copy's before it returned
    bad = con.execute("""SELECT count(*) FILTER (d.start_ns < e.timestamp),
                                count(*) FILTER (e.op = 'cudaMemcpy' AND d.end_ns > e.timestamp + e.duration_ns)
                         FROM device_activity d JOIN events e ON e.tid = d.call_tid AND e.timestamp = d.call_ns
                         WHERE d.kind IN ('kernel', 'memcpy')""").fetchone()
    assert bad == (0, 0)
    line = next(ln for ln in output.splitlines() if ln.startswith("ingero: cupti: "))
    assert f"{rows['kernel']:,} kernels" in line and "dropped" not in line


def test_explain_reads_the_measured_busy_share(run):
    shape, truth, con, report, _ = run
    d = report.device
    assert (d.source, d.measured_by) == ("measured", "CUPTI")
    lo, hi = con.execute("""SELECT min(timestamp), max(timestamp + duration_ns) FROM events WHERE pid = $pid
                            AND list_contains($ops, op)""", {"pid": truth["pid"], "ops": DEVICE_OPS}).fetchone()
    assert d.span_ns == hi - lo
    true_share = (truth["simcudaDeviceBusyNs"] + truth["simcudaCopyBusyNs"]) / d.span_ns
    points = {"inline-loading": 1.0, "launch-bound-block": 2.0}[shape]
    assert abs(100 * d.busy_share - 100 * true_share) <= points, (d.busy_share, true_share)
