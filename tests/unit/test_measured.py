"""explain over a traced session with CUPTI's device timeline (analyze/device/measured.py): measured, not inferred."""

from __future__ import annotations

import pyarrow as pa
import pytest

from analyze_helpers import MAIN_PID, MAIN_TID, SESSION, T0, US, S, Trace, chains_of, silent, named_loop
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.rules import launch_bound
from ingero.render.terminal import device_lines


def base() -> Trace:
    return named_loop(20)


def kernels(tr: Trace, kernel_ns: int, pid: int = MAIN_PID) -> list[dict]:
    """One kernel per launch, as the device ran them: from its launch's return or the previous
    kernel's end, kernel_ns long (the rows CUPTI gives, joined to their launch)."""
    rows, tail = [], 0
    for e in sorted((e for e in tr.events if e["op"] == "cudaLaunchKernel" and e["pid"] == pid),
                    key=lambda e: e["timestamp"]):
        start = max(e["timestamp"] + e["duration_ns"], tail)
        tail = start + kernel_ns
        rows.append({"session_id": SESSION, "pid": pid, "device": 0, "stream": 7, "kind": "kernel",
                     "start_ns": start, "end_ns": tail, "name": "k", "correlation": len(rows) + 1,
                     "call_tid": e["tid"], "call_ns": e["timestamp"]})
    return rows


def union_ns(rows: list[dict], lo: int, hi: int) -> int:
    total, end = 0, lo
    for r in sorted(rows, key=lambda r: r["start_ns"]):
        s, e = max(r["start_ns"], end), min(r["end_ns"], hi)
        if e > s:
            total += e - s
            end = e
    return total


def short_kernels(policy: str) -> Trace:
    """test_rules_launch_sync's loop: 400 launches of 15 µs a step, the sync after the last."""
    tr = base()
    tr.ev(T0 + 1000, "cudaStreamSync", MAIN_PID, MAIN_TID, 2 * US)
    return tr.loop(0.001, 1.5, launches=400, launch_us=15, launch_gap_us=0.5, device_ms=6.2045, cpu_ms=0,
                   policy=policy)


def explained(tr: Trace, rows: list[dict]):
    store = tr.store()
    store.append("device_activity", pa.Table.from_pylist(rows))
    return explain(store.con, Options()), store


def test_the_device_line_is_the_measured_share_of_the_calls_span():
    tr = base().loop(0, 10, launches=40, launch_us=6, launch_gap_us=25, device_ms=4, cpu_ms=4)
    rows = kernels(tr, 40 * US)
    report, _ = explained(tr, rows)
    calls = [e for e in tr.events if e["op"] in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSync")]
    lo = min(e["timestamp"] for e in calls)
    hi = max(e["timestamp"] + e["duration_ns"] for e in calls)
    d = report.device
    assert (d.source, d.measured_by, d.span_ns) == ("measured", "CUPTI", hi - lo)
    assert d.busy_share == d.low == d.high == round(union_ns(rows, lo, hi) / (hi - lo), 4)
    assert device_lines(report)[0] == f"Device: busy {100 * d.busy_share:.1f}% (measured by CUPTI)"
    assert report.steps is not None and report.steps.source == "rhythm"  # the calls still cut the steps


def test_host_waits_cupti_recorded_are_no_device_time():
    tr = base().loop(0, 10, launches=40, launch_us=6, launch_gap_us=25, device_ms=4, cpu_ms=4)
    rows = kernels(tr, 40 * US)
    waits = [dict(rows[0], kind="sync", name="Stream Sync", start_ns=T0, end_ns=T0 + 10 * S, correlation=None)]
    with_waits, _ = explained(tr, rows + waits)
    without, _ = explained(tr, rows)
    assert with_waits.device.busy_share == without.device.busy_share < 0.5


def test_a_process_without_cupti_rows_is_inferred():
    tr = base().loop(0, 10, launches=40, launch_us=6, launch_gap_us=25, device_ms=4, cpu_ms=4)
    other = [dict(r, pid=MAIN_PID + 1) for r in kernels(tr, 40 * US)]  # another process' timeline
    report, _ = explained(tr, other)
    assert report.device.source == "inferred" and report.device.measured_by is None


def test_the_measured_idle_sets_launch_bound_where_the_inference_saw_a_busy_device():
    # issue 21's cell: behind a sleeping sync the inference reads the wake-up as kernel time (busy
    # 99%, launch-bound MEDIUM at most, "may have kept pace"); the device ran 5 µs a launch
    inferred = short_kernels("block").explain()
    assert inferred.device.busy_share >= launch_bound.T.max_device_busy_share
    tr = short_kernels("block")
    rows = kernels(tr, 5 * US)
    report, _ = explained(tr, rows)
    assert report.device.source == "measured"
    assert report.device.busy_share == pytest.approx(5 / 15.5, abs=0.01)
    [chain] = chains_of(report, "launch-bound")
    assert chain.severity == "HIGH" and not any("kept pace" in e for e in chain.effect)


def test_a_measured_busy_device_is_not_launch_bound():
    # the same launches, each kernel as long as the launch interval: the device kept pace
    tr = short_kernels("block")
    report, _ = explained(tr, kernels(tr, 15_500))
    assert report.device.busy_share >= launch_bound.T.max_device_busy_share
    assert silent(report, "launch-bound")
    assert report.analysed.cuda_events > 400  # (something was analysed)


def test_the_windows_split_measured_idle_by_what_was_queued():
    from ingero.analyze import activity, context, windows

    tr = short_kernels("block")
    report, store = explained(tr, kernels(tr, 5 * US))
    ctx = context.resolve(store.con, Options())
    windows.build(ctx)
    act = activity.device_activity(ctx)[MAIN_PID]
    assert act.source == "measured"
    for wb in act.windows:
        # busy as measured; inside the launches' segment the device idled between kernels
        assert wb.low_ns == wb.point_ns <= wb.high_ns <= wb.span_ns
        if wb.span_ns > S // 2:
            assert wb.point_ns / wb.span_ns == pytest.approx(5 / 15.5, abs=0.02)
            assert (wb.high_ns - wb.point_ns) / wb.span_ns > 0.5
