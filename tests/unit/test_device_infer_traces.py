"""On real GPU traces (../shared/traces), the inferred bounds contain the measured busy share.

The traces' CUDA runtime calls are loaded as the tracer records them
(kineto_calls.py, until `ingero import --calls-only` replaces it); the device
timeline they also hold is the truth: the union of kernel, memcpy and memset
intervals over the steps' span.
"""

from __future__ import annotations

import os

import pytest
from kineto_calls import FILES, TRACES, load

from ingero.analyze import context, device, windows

# measured busy share of each trace (computed here from its device timeline; pinned so a
# change of the loader shows), and what its calls say
EXPECTED = {
    "alexnet_a100.json.gz": dict(measured=0.0015, steps=0),
    "v100_rank0.pt.trace.json.gz": dict(measured=0.9744, steps=5),
    "a100_nccl_rank0.json.gz": dict(measured=0.2361, steps=3),
    "sampled_rank0_ws128.json.gz": dict(measured=0.4451, steps=2),
}


def _have_traces() -> bool:
    if all((TRACES / f).exists() for f in FILES):
        return True
    if os.environ.get("CI"):
        pytest.fail(f"the shared traces are not in {TRACES} (set INGERO_SHARED_TRACES)")
    return False


pytestmark = pytest.mark.skipif(not _have_traces(), reason="shared GPU traces not present")


def infer(name: str):
    k = load(name)
    store = k.store()
    ctx = context.resolve(store.con, context.Options(from_ns=k.start_ns, to_ns=k.end_ns))
    windows.build(ctx)
    act = device.main_process(ctx, device.infer(ctx, span=(k.start_ns, k.end_ns)))
    return k, act


@pytest.mark.parametrize("name", FILES)
def test_bounds_contain_the_measured_busy_share(name):
    k, act = infer(name)
    assert k.steps == EXPECTED[name]["steps"]
    assert k.measured_busy == pytest.approx(EXPECTED[name]["measured"], abs=0.0005)
    assert act is not None
    assert act.low <= k.measured_busy <= act.high, (act.low, k.measured_busy, act.high)
    assert act.low <= act.busy_share <= act.high


def test_v100_backpressure_is_seen_in_runs_of_long_launches():
    # the GPU-bound V100 job: the host sits in 60-2000 µs launches while the device runs
    _, act = infer("v100_rank0.pt.trace.json.gz")
    assert act.backpressure_launches > 50
    assert act.low > 0.02 and act.busy_share > 0.9


def test_isolated_slow_launches_are_not_backpressure():
    # alexnet's 3 s first launch (module loading) and the A100 jobs' lone 30-75 µs launches
    for name in ("alexnet_a100.json.gz", "a100_nccl_rank0.json.gz", "sampled_rank0_ws128.json.gz"):
        _, act = infer(name)
        assert act.backpressure_launches == 0, name


def test_event_syncs_of_the_nccl_job_are_not_drains():
    _, act = infer("a100_nccl_rank0.json.gz")
    assert act.drains == 0 and act.high > 0.99
