"""On real GPU traces (tests/data/kineto), the inferred bounds contain the measured busy share.

Each trace is imported with `--calls-only` (the importer keeps the host's CUDA
calls and drops the device timeline), so device activity is inferred from the
calls exactly as on an eBPF trace; the truth is computed from the trace's own
JSON (kineto_truth.py): the union of its kernel, memcpy and memset intervals
over the steps' span.
"""

from __future__ import annotations

import pytest
from kineto_truth import DATA, TRACES, busy_share, load

from ingero.analyze import device

from ingero.analyze.device import imported
from ingero.analyze.context import Options
from ingero.importer import import_trace
from ingero.store.db import Store

# the measured busy share of each trace (pinned so a change of the truth's computation shows)
MEASURED = {
    "alexnet_a100.json.gz": 0.0015,
    "v100_rank0.pt.trace.json.gz": 0.9744,
    "a100_nccl_rank0.json.gz": 0.2361,
    "sampled_rank0_ws128.json.gz": 0.4451,
}


def infer(name: str) -> device.DeviceActivity:
    store = Store.memory()
    res = import_trace(store, DATA / name, calls_only=True)
    a, b, _ = imported.analysed_span(store.con, res.session_id)
    _, act = device.analyse(store.con, Options(session=res.session_id, from_ns=a, to_ns=b), span=(a, b))
    assert act is not None
    return act


@pytest.mark.parametrize("name", TRACES)
def test_bounds_contain_the_measured_busy_share(name):
    measured = busy_share(load(name))
    assert measured == pytest.approx(MEASURED[name], abs=0.0005)
    act = infer(name)
    assert act.low <= measured <= act.high, (act.low, measured, act.high)
    assert act.low <= act.busy_share <= act.high


def test_v100_backpressure_is_seen_in_runs_of_long_launches():
    # the GPU-bound V100 job: the host sits in 60-2000 µs launches while the device runs
    act = infer("v100_rank0.pt.trace.json.gz")
    assert act.backpressure_launches > 50
    assert act.low > 0.02 and act.busy_share > 0.9


def test_isolated_slow_launches_are_not_backpressure():
    # alexnet's 3 s first launch (module loading) and the A100 jobs' lone 30-75 µs launches
    for name in ("alexnet_a100.json.gz", "a100_nccl_rank0.json.gz", "sampled_rank0_ws128.json.gz"):
        assert infer(name).backpressure_launches == 0, name


def test_event_syncs_of_the_nccl_job_are_not_drains():
    act = infer("a100_nccl_rank0.json.gz")
    assert act.drains == 0 and act.high > 0.99
