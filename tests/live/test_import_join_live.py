"""Join a profiler trace to `ingero trace`'s session of the same process, without a GPU.

The runtime-call sequence of a real trace (v100_rank0: 5,951 calls the tracer
has op names for, on two threads) is replayed, with its gaps, through the
simulated runtime (demos/build/libcudart.so.12, via ctypes) while `ingero
trace` records the replaying process.  The replay notes the wall-clock time
(time.time_ns) at which it made each call, as a profiler in the process would;
the test writes those calls as a Kineto trace whose clock runs KNOWN_NS ahead,
imports it into the traced DB and checks that every call is matched and the
offset recovered.

Run as a script, this file is the replay: ``python test_import_join_live.py LIB GO CALLS OUT``.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "data" / "kineto" / "v100_rank0.pt.trace.json.gz"
KNOWN_NS = 2_345_678_901  # the trace's clock minus the host's
REPLAYED = {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaDeviceSynchronize"}  # v100's calls with op names


# ---- the replay (runs inside the traced process) ---------------------------------------------

def _replay(lib_path: str, go: str, calls_file: str, out_file: str) -> None:
    import ctypes

    class Dim3(ctypes.Structure):
        _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]

    lib = ctypes.CDLL(lib_path)
    lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    src, dst = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.cudaMalloc(ctypes.byref(src), 1 << 16) == 0 and lib.cudaMalloc(ctypes.byref(dst), 1 << 16) == 0
    one = Dim3(1, 1, 1)
    threads = json.loads(Path(calls_file).read_text())
    while not Path(go).exists():
        time.sleep(0.01)
    result = {"pid": __import__("os").getpid(), "threads": []}

    def run(calls: list) -> None:
        done = []
        t0 = time.perf_counter()
        base_us = calls[0][0]
        for ts_us, name in calls:
            while time.perf_counter() - t0 < (ts_us - base_us) / 1e6:  # keep the trace's gaps
                pass
            now = time.time_ns()
            if name == "cudaLaunchKernel":
                rc = lib.cudaLaunchKernel(None, one, one, None, 0, None)
            elif name == "cudaMemcpyAsync":
                rc = lib.cudaMemcpyAsync(dst, src, 256, 3, None)  # cudaMemcpyDeviceToDevice, as in the trace
            else:
                rc = lib.cudaDeviceSynchronize()
            assert rc == 0, (name, rc)
            done.append((now, name, time.time_ns() - now))
        result["threads"].append({"tid": threading.get_native_id(), "calls": done})

    for calls in threads:  # one OS thread per traced thread, one after the other
        t = threading.Thread(target=run, args=(calls,))
        t.start()
        t.join()
    Path(out_file).write_text(json.dumps(result))


# ---- the test -------------------------------------------------------------------------------

def _source_threads() -> list[list[tuple[float, str]]]:
    with gzip.open(SOURCE, "rt") as f:
        events = json.load(f)["traceEvents"]
    by_tid: dict[int, list] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and e["name"] in REPLAYED:
            by_tid.setdefault(e["tid"], []).append((e["ts"], e["name"]))
    return [sorted(v) for _, v in sorted(by_tid.items())]


def _write_trace(replay: dict, path: Path) -> int:
    """The replayed calls as a Kineto trace on a clock KNOWN_NS ahead, a kernel after each launch."""
    events, corr = [], 0
    for th in replay["threads"]:
        for now, name, _ in th["calls"]:
            corr += 1
            ts = (now + KNOWN_NS) / 1000
            events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": replay["pid"], "tid": th["tid"],
                           "ts": ts, "dur": 4.0, "args": {"correlation": corr}})
            if name == "cudaLaunchKernel":
                events.append({"ph": "X", "cat": "kernel", "name": "replayed", "pid": 0, "tid": 7, "ts": ts + 20,
                               "dur": 5.0, "args": {"correlation": corr, "device": 0, "stream": 7}})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return corr


@pytest.mark.live
@pytest.mark.exact  # times nothing: runs beside another exact test (Makefile)
def test_replayed_calls_are_matched_and_the_offset_recovered(tmp_path, simcuda, monkeypatch):
    import workloads
    from workloads import Tracer, query

    # compiling the BPF programs took over 40 s here while other suites loaded both cores
    monkeypatch.setattr(workloads, "START_TIMEOUT_S", 240)

    from ingero.importer import import_trace
    from ingero.store.db import Store

    calls_file, go, out, db = tmp_path / "calls.json", tmp_path / "go", tmp_path / "replay.json", tmp_path / "t.duckdb"
    calls_file.write_text(json.dumps(_source_threads()))
    # --no-cupti: the import's own device rows are what this checks (with CUPTI's live timeline the
    # trace's would not be stored again: test_import_join.py)
    tracer = Tracer(db, "--cuda-lib", str(simcuda), "--duration", "120s", "--no-cupti",
                    "--cmd", f"{sys.executable} {Path(__file__).resolve()} {simcuda} {go} {calls_file} {out}",
                    env={"SIMCUDA_KERNEL_US": "5", "SIMCUDA_LAUNCH_US": "1"})
    tracer.wait_started()
    go.touch()
    summary = tracer.finish(sig=None, timeout=180)
    replay = json.loads(out.read_text())
    n = _write_trace(replay, tmp_path / "trace.json")
    assert n == 5951
    traced = query(db, """SELECT count(*) FROM events WHERE pid = $p AND op IN
                          ('cudaLaunchKernel', 'cudaMemcpyAsync', 'cudaDeviceSync')""", {"p": replay["pid"]})[0][0]
    assert traced == n  # the tracer saw every replayed call

    store = Store.open(db)
    try:
        r = import_trace(store, tmp_path / "trace.json")
    finally:
        store.close()
    a = r.joined
    assert a is not None and r.session_id == summary["session_id"] and a.pid == replay["pid"]
    # every call matched, but one whose thread lost the CPU between time_ns() and the probe for
    # longer than the join's tolerance (a busy box): its own bracket says so
    from ingero.importer.join import TOLERANCE_NS
    unsure = sum(1 for th in replay["threads"] for _, _, took in th["calls"] if took >= TOLERANCE_NS // 2)
    assert a.trace_calls == n and n - unsure <= a.matched <= n, (a.matched, unsure)
    # the residual is the time between time_ns() and the probe at the call's entry: µs, not ms
    assert abs(a.offset_ns + KNOWN_NS) < 1_000_000 and a.residual_median_ns < 1_000_000
    print(f"\njoin: offset {a.offset_ns} ns (known {-KNOWN_NS}), residual median {a.residual_median_ns} ns, "
          f"{a.matched}/{a.trace_calls} matched")
    sessions = query(db, "SELECT session_id, imported_from, clock_offset_ns FROM sessions")
    assert sessions == [(summary["session_id"], str((tmp_path / "trace.json").resolve()), a.offset_ns)]
    linked = query(db, """SELECT count(*), count(e.timestamp) FROM device_activity d LEFT JOIN events e
                          ON e.session_id = d.session_id AND e.tid = d.call_tid AND e.timestamp = d.call_ns""")[0]
    # each kernel points at the traced launch that submitted it, but a kernel of a call its own
    # bracket left unsure (above) may point at the trace's time of it instead
    assert linked[0] == 4350 and 4350 - unsure <= linked[1] <= 4350, (linked, unsure)


if __name__ == "__main__":
    _replay(*sys.argv[1:5])
