"""explain on imported profiler traces: the measured device timeline, marked steps, the
DataLoader, and what a trace without the scheduler cannot tell."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingero.analyze.context import Options
from ingero.analyze.explain import DEVICE_BUSY_NOT_HIGH, explain
from ingero.importer import import_trace
from ingero.render import json as render_json
from ingero.store.db import Store

DATA = Path(__file__).resolve().parents[1] / "data"
KINETO = DATA / "kineto"


def _report(*files: Path, calls_only: bool = False):
    store = Store.memory()
    sessions = [import_trace(store, f, calls_only=calls_only).session_id for f in files]
    return [explain(store.con, Options(session=sid)) for sid in sessions]


def _shared(name: str) -> Path:
    found = sorted(KINETO.glob(name + "*"))
    assert found, f"{name} missing under {KINETO}"
    return found[0]


def test_gpu_bound_v100_trace_is_measured_busy_and_gets_no_chain():
    # 97.4% busy over the 5 steps' span: a full launch queue, not a launch-bound host
    [report] = _report(_shared("v100_rank0"))
    assert report.device.source == "measured"
    assert report.device.busy_share == pytest.approx(0.974, abs=0.01)
    assert report.device.busy_share >= DEVICE_BUSY_NOT_HIGH
    assert (report.steps.count, report.steps.source) == (5, "marked")
    assert [c.rule_id for c in report.chains] == []
    d = render_json.to_dict(report)
    assert set(d["device"]) >= {"busy_share", "low", "high", "source"}
    assert set(d["steps"]) >= {"count", "median_ms", "p99_ms"}


def test_imported_sessions_say_once_what_they_cannot_judge():
    [report] = _report(_shared("a100_nccl_rank0"))
    lacking = [n for n in report.notes if "cannot be judged" in n]
    assert len(lacking) == 1 and "cpu-contention" in lacking[0] and "launch-bound" in lacking[0]
    assert "launch-bound" not in [c.rule_id for c in report.chains]


def test_inline_data_loading_in_a_torch_trace_is_input_bound_and_names_the_dataloader():
    w0, w2 = _report(DATA / "torch_cpu_workers0.json.gz", DATA / "torch_cpu_workers2.json.gz")
    [chain] = [c for c in w0.chains if c.rule_id == "input-bound"]
    assert "enumerate(DataLoader)" in chain.root[0] and "num_workers=0" in chain.root[0]
    assert chain.fix[0].startswith("DataLoader(num_workers=")
    assert chain.numbers["inline_loading"] == 1.0
    assert chain.share == pytest.approx(w0.steps.breakdown["data_wait"], abs=1e-3)
    # the same loop with two workers keeps up: no input-bound
    assert [c.rule_id for c in w2.chains if c.rule_id == "input-bound"] == []


def _kineto(tmp_path: Path) -> Path:
    """One 1000 µs step, every part known: the DataLoader 50 µs; launches of 5, 5 and 50 µs, the
    long one returning while a kernel runs (45 µs above the 5 µs median: held by the queue); a
    copy call of 100 µs whose transfer took 20; a 100 µs stream sync; a 10 µs cudaMalloc."""
    import json

    base = 1_700_000_000_000_000.0  # µs, as Kineto writes them

    def x(name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "pid": 7, "tid": 7, "ts": base + ts, "dur": dur,
                "args": args}

    def dev(name, cat, ts, dur, corr):
        return {"ph": "X", "name": name, "cat": cat, "pid": 0, "tid": 7, "ts": base + ts, "dur": dur,
                "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 4096}}

    events = [
        x("ProfilerStep#1", "user_annotation", 0, 1000),
        x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 0, 50),
        x("cudaLaunchKernel", "cuda_runtime", 100, 5, correlation=1),
        x("cudaLaunchKernel", "cuda_runtime", 110, 5, correlation=2),
        x("cudaLaunchKernel", "cuda_runtime", 200, 50, correlation=3),
        x("cudaMemcpyAsync", "cuda_runtime", 500, 100, correlation=4),
        x("cudaStreamSynchronize", "cuda_runtime", 700, 100, correlation=5),
        x("cudaMalloc", "cuda_runtime", 900, 10, correlation=6),
        dev("k1", "kernel", 120, 300, 1),
        dev("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 580, 20, 4),
    ]
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_marked_steps_break_down_into_the_traces_own_calls(tmp_path):
    [report] = _report(_kineto(tmp_path))
    assert (report.steps.count, report.steps.source) == (1, "marked")
    parts = {k: round(v * 1000, 1) for k, v in report.steps.breakdown.items()}  # µs of the 1000 µs step
    assert parts == {"data_wait": 50.0, "launch": 15.0, "copy": 20.0, "device_wait": 225.0,
                     "other_cuda": 10.0, "host": 680.0}
    assert sum(report.steps.breakdown.values()) == pytest.approx(1.0, abs=1e-3)


def test_real_a100_steps_idle_in_the_hosts_operators_is_host_bound():
    # measured: the device ran nothing 76.4% of the three 222 ms steps; 61.3% of them the
    # process was inside CPU operators outside every CUDA call (no sync: real PyTorch)
    [report] = _report(_shared("a100_nccl_rank0"))
    [chain] = [c for c in report.chains if c.rule_id == "host-bound"]
    assert chain.severity == "HIGH"
    assert (len(chain.evidence_windows), chain.windows_total) == (3, 3)
    assert chain.numbers["host_idle_share"] == pytest.approx(0.6128, abs=5e-4)
    assert chain.numbers["device_busy_share"] == pytest.approx(report.device.busy_share, abs=5e-3)
    # two sweeps agree
    assert chain.numbers["device_idle_share"] == pytest.approx(1 - report.device.busy_share, abs=1e-3)
    named = [line.split()[1] for line in chain.contributing[1:]]
    assert named == ["aten::batch_norm", "aten::unflatten_dense_tensors",
                     "autograd::engine::evaluate_function:"]
    assert "CUDA graphs" in chain.fix[1]


def _host_trace(tmp_path: Path, kernel_us: float) -> Path:
    """One 1000 µs step: a launch at 0 (its kernel from 20 for ``kernel_us``), a 600 µs CPU
    operator from 100 with a nested one, a launch at 700 whose kernel runs 710-1000."""
    import json

    base = 1_700_000_000_000_000.0

    def x(name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "pid": 7, "tid": 7, "ts": base + ts, "dur": dur,
                "args": args}

    def dev(name, ts, dur, corr):
        return {"ph": "X", "name": name, "cat": "kernel", "pid": 0, "tid": 7, "ts": base + ts, "dur": dur,
                "args": {"device": 0, "stream": 7, "correlation": corr}}

    events = [
        x("ProfilerStep#1", "user_annotation", 0, 1000),
        x("cudaLaunchKernel", "cuda_runtime", 0, 10, correlation=1),
        x("aten::slow_host", "cpu_op", 100, 600),
        x("aten::inner", "cpu_op", 200, 100),
        x("cudaLaunchKernel", "cuda_runtime", 700, 10, correlation=2),
        dev("k1", 20, kernel_us, 1),
        dev("k2", 710, 290, 2),
    ]
    path = tmp_path / f"host{kernel_us:.0f}.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_device_idle_inside_a_cpu_operator_is_host_bound_and_names_the_outermost_operator(tmp_path):
    # idle: [0, 20) = 10 µs in the launch + 10 unrecorded; [100, 710) = 600 in the operator + 10 launch
    [report] = _report(_host_trace(tmp_path, 80))
    [chain] = [c for c in report.chains if c.rule_id == "host-bound"]
    assert chain.severity == "HIGH"
    assert {k: chain.numbers[k] for k in ("host_idle_share", "device_idle_share", "launch_idle_share",
                                          "unrecorded_idle_share", "device_busy_share")} == {
        "host_idle_share": 0.6, "device_idle_share": 0.63, "launch_idle_share": 0.02,
        "unrecorded_idle_share": 0.01, "device_busy_share": 0.37}
    assert chain.contributing[1].split() == ["100.0%", "aten::slow_host", "(0.6", "ms)"]


def test_the_same_operator_under_a_running_kernel_is_not_host_bound(tmp_path):
    # the kernel covers the operator (20-990): the host works while the device does
    [report] = _report(_host_trace(tmp_path, 970))
    assert [c.rule_id for c in report.chains] == []
