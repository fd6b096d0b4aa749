"""Live: CUDA calls that fail are named first, by op and error, and never timed.

NVIDIA's real libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel) without a driver fails every
call with cudaErrorInsufficientDriver (35) in about a microsecond; a ctypes loop of them read
as "[HIGH] launch-bound".  Now explain names N of N failed with the error's name and builds no
timing chain, and the trace's last lines say how many failed.  On the simulated runtime a loop
whose every launch is followed by one on a stream that does not exist (400,
cudaErrorInvalidResourceHandle) syncs once per 4 good launches: sync-heavy on the calls that
succeeded (counted, the failed launches would halve the ratio below its threshold).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import workloads
from workloads import Tracer

pytestmark = pytest.mark.live

WORKLOAD = workloads.HERE / "failing_calls.py"


def _trace(tmp, lib, *args: object) -> tuple[dict, dict, dict]:
    """Trace the workload with ``args``; (its own count of calls, the trace summary, explain --json)."""
    db = tmp / "t.duckdb"
    cmd = " ".join(str(a) for a in (sys.executable, WORKLOAD, lib, *args))
    tracer = Tracer(db, "--cuda-lib", str(lib), "--cmd", cmd)
    tracer.wait_started()
    summary = tracer.finish(sig=None)
    # under --json the command's output is on the tracer's stderr
    made = next(json.loads(line) for line in tracer.stderr.splitlines() if line.startswith('{"pid"'))
    assert summary["drops_kernel"] == summary["drops_user"] == 0
    out = subprocess.run([*workloads.INGERO, "explain", "--db", str(db), "--json", "--window", "1"],
                         capture_output=True, text=True, cwd=workloads.REPO)
    assert out.returncode == 0, out.stderr
    return made, summary, json.loads(out.stdout)


@pytest.mark.exact
def test_every_call_failing_on_nvidias_runtime_is_named_and_never_timed(tmp_path):
    lib = workloads.libcudart()
    launches, sync_every = 120_000, 50
    made, summary, report = _trace(tmp_path, lib, launches, sync_every, 0)
    syncs = launches // sync_every
    assert made["calls"] == [["cudaLaunchKernel", 35, launches], ["cudaStreamSync", 35, syncs]]
    total = launches + syncs
    # the same loop read as [HIGH] launch-bound before: now the notice alone, no timing chain
    assert [c["rule_id"] for c in report["chains"]] == ["failed-calls"], json.dumps(report["chains"], indent=1)
    [chain] = report["chains"]
    assert chain["severity"] == "HIGH" and chain["pids"] == [made["pid"]]
    assert chain["headline"] == f"{total:,} of {total:,} CUDA calls failed"
    n = chain["numbers"]
    assert (n["failed_calls"], n["calls"], n["every_call_failed"]) == (total, total, True)
    assert n["errors"] == {"cudaErrorInsufficientDriver": total}
    assert n["failed_by_op"] == {"cudaLaunchKernel": launches, "cudaStreamSync": syncs}
    assert chain["root"][1] == (f"cudaErrorInsufficientDriver (35): {total:,} calls "
                                f"(cudaLaunchKernel {launches:,}, cudaStreamSync {syncs:,})")
    assert chain["fix"][0].startswith("the NVIDIA driver is missing")
    assert report["analysed"]["cuda_events"] == total
    assert [p for p in report["analysed"]["processes"] if f"(PID {made['pid']})" in p]
    # the trace's own last lines say it
    assert f"{total:,} of {total:,} CUDA calls failed (cudaErrorInsufficientDriver {total:,})" in \
        " ".join(summary["notes"]), summary["notes"]


def test_some_calls_failing_leave_the_timing_to_the_calls_that_succeeded(tmp_path, simcuda):
    good, sync_every = 40_000, 4
    made, _, report = _trace(tmp_path, simcuda, good, sync_every, 1, 1)  # 1 µs kernels
    syncs = good // sync_every
    assert made["calls"] == [["cudaLaunchKernel", 0, good], ["cudaLaunchKernel", 400, good],
                             ["cudaStreamSync", 0, syncs]]
    rules = [c["rule_id"] for c in report["chains"]]
    assert rules[0] == "failed-calls", rules
    n = report["chains"][0]["numbers"]
    assert (n["failed_calls"], n["calls"], n["every_call_failed"]) == (good, 2 * good + syncs, False)
    assert n["errors"] == {"cudaErrorInvalidResourceHandle": good}
    assert n["failed_by_op"] == {"cudaLaunchKernel": good}
    assert report["chains"][0]["severity"] == "MEDIUM"  # 44% of the calls
    assert report["analysed"]["cuda_events"] == 2 * good + syncs
    # one sync per 4 launches that succeeded (0.25 a launch: sync-heavy); with the failed
    # launches counted it would be one per 8 (0.125, under the rule's 0.2)
    [heavy] = [c for c in report["chains"] if c["rule_id"] == "sync-heavy"]
    assert "one per 4.0 kernel launches" in heavy["root"][0], heavy["root"]
