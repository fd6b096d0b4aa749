"""failed-calls: CUDA calls that returned an error are named first and never timed.

NVIDIA's runtime without a driver fails every call with cudaErrorInsufficientDriver in about
a microsecond; a loop of such calls read as "[HIGH] launch-bound".  The window tables keep
failed calls apart (windows.SPLIT_FAILED_SQL), the failed-calls notice counts them by op and
error name, before every timing chain, and the timing rules read only the calls that
succeeded.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path

import pytest

import prereqs
from analyze_helpers import MAIN_PID, MAIN_TID, NOT_CUDA_OPS, T0, US, S, Trace, chains_of
from ingero.analyze import return_codes
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.rules import failed_calls
from ingero.render import counts, json as json_view, terminal

INSUFFICIENT_DRIVER = 35
INVALID_HANDLE = 400
# A launch-bound loop (as test_launch_bound_fires'): 100 launches of 8 µs 80 µs apart (~10,000/s),
# 1 ms of Python, one sync
LAUNCH_BOUND = {"launches": 100, "launch_us": 8, "launch_gap_us": 80, "device_ms": 1, "cpu_ms": 1}
SECONDS = 6
TIMING_RULES = {"cpu-contention", "input-bound", "host-bound", "transfer-bound", "io-stall", "memory-pressure",
                "launch-bound", "sync-heavy", "gpu-idle", "straggler"}


def base(seconds: float = SECONDS) -> Trace:
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    return tr.system(0, seconds)


def cuda_rows(tr: Trace) -> list[dict]:
    return [e for e in tr.events if e["op"] not in NOT_CUDA_OPS]


def every_call_fails(ret: int = INSUFFICIENT_DRIVER) -> Trace:
    tr = base().loop(0, SECONDS, **LAUNCH_BOUND)
    for e in cuda_rows(tr):
        e["ret"] = ret
    return tr


def with_failed_launches(tr: Trace, per_launch: int = 1, dur_us: float = 1.0) -> int:
    """After every launch of the loop, ``per_launch`` launches on a stream that does not exist
    (cudaErrorInvalidResourceHandle), in the gap before the next call; returns how many."""
    added = 0
    for e in [e for e in tr.events if e["op"] == "cudaLaunchKernel"]:
        for k in range(per_launch):
            tr.ev(e["timestamp"] + e["duration_ns"] + (1 + 2 * k) * US, "cudaLaunchKernel", e["pid"], e["tid"],
                  dur_us * US, ret=INVALID_HANDLE)
            added += 1
    return added


@pytest.mark.parametrize("source", ["summaries", "events"])
def test_every_call_failed_is_named_with_its_error_and_no_timing_chain(source):
    tr = every_call_fails()
    n = len(cuda_rows(tr))
    by_op = Counter(e["op"] for e in cuda_rows(tr))
    launches = by_op["cudaLaunchKernel"]
    assert set(by_op) == {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSync"}
    store = tr.store()
    report = explain(store.con, Options(window_s=1), source=source)
    # the same loop with calls that succeed is a HIGH launch-bound chain (test_launch_bound_fires)
    assert [c.rule_id for c in report.chains] == ["failed-calls"], [c.title for c in report.chains]
    [chain] = report.chains
    assert chain.severity == "HIGH"
    assert chain.headline == f"{n:,} of {n:,} CUDA calls failed"
    assert chain.numbers["failed_calls"] == chain.numbers["calls"] == n
    assert chain.numbers["every_call_failed"] is True
    assert chain.numbers["errors"] == {"cudaErrorInsufficientDriver": n}
    assert chain.numbers["failed_by_op"] == dict(by_op)
    assert chain.root[0] == f"python3 (train.py) (PID {MAIN_PID}): {n:,} of {n:,} CUDA calls returned an error (100.0%)"
    steps = by_op["cudaStreamSync"]
    assert chain.root[1] == (f"cudaErrorInsufficientDriver (35): {n:,} calls (cudaLaunchKernel {launches:,}, "
                             f"cudaMemcpyAsync {steps:,}, cudaStreamSync {steps:,})")
    assert f"cudaLaunchKernel: {launches:,} of {launches:,} failed" in chain.effect
    assert any("no timing chain is built on them" in line for line in chain.effect)
    assert chain.fix[0].startswith("the NVIDIA driver is missing, or older than the CUDA runtime")
    assert chain.pids == [MAIN_PID] and chain.culprits == []
    # (the last step ends past it)
    assert len(chain.evidence_windows) == chain.windows_total == report.analysed.windows == SECONDS + 1
    # the calls are still counted, and the process is still the one traced
    assert report.analysed.cuda_events == n
    assert report.analysed.processes == [f"python3 (train.py) (PID {MAIN_PID})"]
    assert store.con.execute("SELECT count(*) FROM ing_win").fetchone() == (0,)
    assert store.con.execute("SELECT sum(n) FROM ing_failed").fetchone() == (n,)


def test_failed_launches_are_out_of_the_timing_and_the_notice_comes_first():
    tr = base().loop(0, SECONDS, **LAUNCH_BOUND)
    good = sum(1 for e in tr.events if e["op"] == "cudaLaunchKernel")
    calls = len(cuda_rows(tr))
    bad = with_failed_launches(tr)
    store = tr.store()
    report = explain(store.con, Options(window_s=1))
    assert report.chains[0].rule_id == "failed-calls"
    notice = report.chains[0]
    assert notice.severity == "MEDIUM"  # 100 of 202 calls a step: under half
    assert notice.numbers["failed_calls"] == bad and notice.numbers["calls"] == calls + bad
    assert notice.numbers["errors"] == {"cudaErrorInvalidResourceHandle": bad}
    assert f"the timing chains read only the {calls:,} calls that succeeded" in notice.effect
    assert notice.fix[0].startswith("the job passes an invalid argument")
    # the loop's windows count the launches that succeeded, with their own 8 µs each
    launch_n, launch_ns, ops_n = store.con.execute(
        "SELECT sum(launch_n), sum(launch_ns), sum(ops_n) FROM ing_win").fetchone()
    assert launch_n == good and launch_ns == good * 8 * US and ops_n == calls
    [chain] = chains_of(report, "launch-bound")
    assert chain.numbers["launch_mean_ns"] == pytest.approx(8000)  # 1 µs failed launches would pull it to 4.5
    assert report.analysed.cuda_events == calls + bad
    # the same rows read from the raw events give the same window table
    raw = explain(store.con, Options(window_s=1), source="events")
    assert [(c.rule_id, c.severity, c.numbers.get("failed_calls")) for c in raw.chains] == \
        [(c.rule_id, c.severity, c.numbers.get("failed_calls")) for c in report.chains]


def test_sync_heavy_is_judged_on_the_calls_that_succeeded():
    # a sync after every 4 launches (0.25 a launch: sync-heavy) and a failed launch after each
    # good one: counted, the failed launches would halve the ratio below sync-heavy's 0.2
    tr = base().loop(0, SECONDS, launches=4, launch_us=8, launch_gap_us=20, device_ms=0.05, cpu_ms=1)
    bad = with_failed_launches(tr)
    report = tr.explain(window_s=1)
    assert report.chains[0].rule_id == "failed-calls" and report.chains[0].numbers["failed_calls"] == bad
    [chain] = chains_of(report, "sync-heavy")
    assert chain.numbers["syncs_per_launch"] == 0.25
    assert "one per 4.0 kernel launches" in chain.root[0]


def test_a_few_failures_are_low_and_teardown_errors_stay_low():
    tr = base().loop(0, SECONDS, **LAUNCH_BOUND)
    rows = cuda_rows(tr)
    for e in rows[:40]:  # 40 of ~62,000 calls
        e["ret"] = INVALID_HANDLE
    [notice] = chains_of(tr.explain(window_s=1), "failed-calls")
    assert notice.severity == "LOW" and notice.numbers["failed_calls"] == 40
    # every call failing with cudaErrorCudartUnloading (the runtime unloading at exit): harmless
    tr = base(5).loop(0, 5, **LAUNCH_BOUND)
    for e in cuda_rows(tr):
        e["ret"] = 4
    [notice] = chains_of(tr.explain(window_s=1), "failed-calls")
    assert notice.severity == "LOW" and notice.numbers["errors"] == {"cudaErrorCudartUnloading": len(cuda_rows(tr))}


def test_a_run_without_failures_has_no_notice():
    tr = base().loop(0, SECONDS, **LAUNCH_BOUND)
    store = tr.store()
    report = explain(store.con, Options(window_s=1))
    assert [c.rule_id for c in report.chains] == ["launch-bound"]
    assert store.con.execute("SELECT count(*) FROM ing_failed").fetchone() == (0,)
    assert report.analysed.cuda_events == len(cuda_rows(tr))


def test_driver_and_nccl_codes_are_named_by_their_own_family():
    tr = base(5).loop(0, 5, **LAUNCH_BOUND)
    t = T0 + 2 * S
    for k in range(30):
        tr.ev(t + k * 100 * US, "cuLaunchKernel", MAIN_PID, MAIN_TID, 2 * US, ret=100)
    for k in range(7):
        tr.ev(t + k * 100 * US + 50 * US, "ncclAllReduce", MAIN_PID, MAIN_TID, 2 * US, ret=2)
    for k in range(5):  # a non-blocking communicator's call still running: no failure
        tr.ev(t + k * 100 * US + 70 * US, "ncclAllReduce", MAIN_PID, MAIN_TID, 2 * US, ret=7)
    [notice] = chains_of(tr.explain(window_s=1), "failed-calls")
    assert notice.numbers["errors"] == {"CUDA_ERROR_NO_DEVICE": 30, "ncclSystemError": 7}
    assert notice.numbers["failed_by_op"] == {"cuLaunchKernel": 30, "ncclAllReduce": 7}
    assert "ncclAllReduce: 7 of 12 failed" in notice.effect
    assert notice.fix[0].startswith("CUDA_ERROR_NO_DEVICE: no usable GPU for the process")
    assert notice.fix[1].startswith("ncclSystemError: NCCL failed")


def test_terminal_and_json_list_the_notice_before_every_timing_chain():
    tr = base().loop(0, SECONDS, **LAUNCH_BOUND)
    with_failed_launches(tr)
    report = tr.explain(window_s=1)
    assert {c.rule_id for c in report.chains[1:]} <= TIMING_RULES and len(report.chains) >= 2
    out = io.StringIO()
    terminal.write(report, out)
    heads = [line for line in out.getvalue().splitlines() if line.startswith("[")]
    n = report.chains[0].numbers
    assert heads[0] == (f"[MEDIUM] {failed_calls.TITLE} — {n['failed_calls']:,} of {n['calls']:,} CUDA calls failed")
    assert heads[1].startswith("[HIGH] Launch-bound") and heads[1].endswith("of the loop's time in the range")
    data = json_view.to_dict(report)
    assert [c["rule_id"] for c in data["chains"]][0] == "failed-calls"
    assert data["chains"][0]["numbers"]["errors"] == {"cudaErrorInvalidResourceHandle": n["failed_calls"]}


def test_the_end_of_a_trace_says_how_many_calls_failed():
    tr = every_call_fails()
    n = len(cuda_rows(tr))
    store = tr.store()
    failures = return_codes.session_failures(store.con, 1)
    assert failures == {"cudaErrorInsufficientDriver": n}
    assert counts.failed_calls_sentence(failures, n) == (
        f"{n:,} of {n:,} CUDA calls failed (cudaErrorInsufficientDriver {n:,}): `ingero explain` lists them by op "
        "and times only the calls that succeeded")
    assert return_codes.session_failures(base(2).loop(0, 2).store().con, 1) == {}


def _enum(text: str, head: str) -> dict[int, str]:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    body = re.search(head + r"\s*\{(.*?)\}", text, re.S)
    assert body, head
    out = {}
    for item in body.group(1).split(","):
        m = re.fullmatch(r"\s*(\w+)\s*=\s*(\d+)\s*", item)
        if m and int(m.group(2)) != 0:
            out[int(m.group(2))] = m.group(1)
    return out


def test_the_tables_are_nvidias_headers():
    import glob
    import importlib.util

    found = sorted(glob.glob("/usr/local/cuda*/include/driver_types.h"))
    inc = prereqs.needs(Path(found[-1]).parent if found else None,
                        "the CUDA toolkit's headers (driver_types.h, cuda.h)",
                        "install the CUDA toolkit (/usr/local/cuda*/include)")
    spec = importlib.util.find_spec("nvidia")
    nccl = next((Path(b, "nccl", "include", "nccl.h") for b in (spec.submodule_search_locations if spec else [])
                 if Path(b, "nccl", "include", "nccl.h").exists()), None)
    nccl = prereqs.needs(nccl, "NCCL's nccl.h (the nvidia-nccl-cu12 wheel)",
                         "pip install nvidia-nccl-cu12, or make setup")
    runtime = _enum((inc / "driver_types.h").read_text(), r"enum\s+__device_builtin__\s+cudaError")
    driver = _enum((inc / "cuda.h").read_text(), r"typedef\s+enum\s+cudaError_enum")
    nccl_codes = {k: v for k, v in _enum(nccl.read_text(), r"typedef\s+enum").items() if v != "ncclNumResults"}
    # the toolkit here is 13.0: every code it defines is in the table (a newer one may add more)
    assert {k: return_codes.RUNTIME.get(k) for k in runtime} == runtime
    assert {k: return_codes.DRIVER.get(k) for k in driver} == driver
    assert return_codes.NCCL == nccl_codes
    assert return_codes.NCCL[return_codes.NCCL_IN_PROGRESS] == "ncclInProgress"
    assert (return_codes.name("cudaMalloc", 35), return_codes.name("cuMemAlloc", 35)) == \
        ("cudaErrorInsufficientDriver", "CUresult 35")  # (the driver API has no code 35)
