"""Real Kineto traces (../shared/traces) as the tracer would have recorded them: CUDA calls only.

A small stand-in for `ingero import --calls-only` (another part of the project
builds the real one): the trace's `cuda_runtime` calls become events rows with
the op names the tracer stores, the device timeline is kept aside as the truth
(the union of kernel / memcpy / memset intervals over the steps' span).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from ingero.store.db import Store

TRACES = Path(os.environ.get("INGERO_SHARED_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces"))
FILES = ("alexnet_a100.json.gz", "v100_rank0.pt.trace.json.gz", "a100_nccl_rank0.json.gz",
         "sampled_rank0_ws128.json.gz")

# Runtime API name -> events.op (collect/records.py OP_NAMES); calls the tracer does not probe are left out.
OPS = {
    "cudaLaunchKernel": "cudaLaunchKernel", "cudaLaunchKernelExC": "cudaLaunchKernel",
    "cudaMemcpy": "cudaMemcpy", "cudaMemcpyAsync": "cudaMemcpyAsync",
    "cudaStreamSynchronize": "cudaStreamSync", "cudaDeviceSynchronize": "cudaDeviceSync",
    "cudaEventSynchronize": "cudaEventSync", "cudaGraphLaunch": "cudaGraphLaunch",
    "cudaMalloc": "cudaMalloc", "cudaFree": "cudaFree", "cudaHostAlloc": "cudaMallocHost",
    "cudaMallocHost": "cudaMallocHost", "cudaHostRegister": "cudaHostRegister",
}
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
KINDS = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D", "HtoH": "H2H"}
SESSION = 1


@dataclass
class KinetoTrace:
    name: str
    events: list[dict]
    start_ns: int  # the analysed span: the steps' span, else the runtime calls' span
    end_ns: int
    steps: int
    measured_busy: float  # share of the span in which any kernel, copy or memset ran

    def store(self) -> Store:
        store = Store.memory()
        store.con.execute(
            "INSERT INTO sessions (session_id, started_ns, ended_ns, status, events, ncpu) "
            "VALUES ($sid, $t0, $t1, 'closed', $n, 8)",
            {"sid": SESSION, "t0": self.events[0]["timestamp"], "t1": self.end_ns, "n": len(self.events)})
        store.append("events", pa.Table.from_pylist(self.events))
        return store


def _ns(us: float) -> int:
    return int(round(us * 1000))


def union_share(intervals: list[tuple[int, int]], a: int, b: int) -> float:
    busy, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        s, e = max(s, a), min(e, b)
        if e <= s:
            continue
        if cur_e is not None and s <= cur_e:
            cur_e = max(cur_e, e)
            continue
        if cur_e is not None:
            busy += cur_e - cur_s
        cur_s, cur_e = s, e
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / (b - a)


def load(name: str) -> KinetoTrace:
    with gzip.open(TRACES / name) as f:
        trace = json.load(f)
    evs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    device = [e for e in evs if e.get("cat") in DEVICE_CATS]
    by_corr = {e["args"].get("correlation"): e for e in device if "args" in e}
    rows = []
    runtime = [e for e in evs if e.get("cat") == "cuda_runtime"]
    for e in runtime:
        op = OPS.get(e["name"])
        if op is None:
            continue
        kind = nbytes = None
        dev = by_corr.get(e.get("args", {}).get("correlation"))
        if dev is not None and dev.get("cat") == "gpu_memcpy":
            kind = next((v for k, v in KINDS.items() if k in dev["name"]), None)
            nbytes = dev.get("args", {}).get("bytes")
        rows.append({"session_id": SESSION, "timestamp": _ns(e["ts"]), "duration_ns": _ns(e["dur"]),
                     "pid": int(e["pid"]), "tid": int(e["tid"]), "op": op, "kind": kind, "bytes": nbytes,
                     "ret": 0})
    rows.sort(key=lambda r: r["timestamp"])
    steps = [e for e in evs
             if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
    if steps:
        a, b = min(_ns(e["ts"]) for e in steps), max(_ns(e["ts"] + e["dur"]) for e in steps)
    else:
        a, b = min(_ns(e["ts"]) for e in runtime), max(_ns(e["ts"] + e["dur"]) for e in runtime)
    busy = union_share([(_ns(e["ts"]), _ns(e["ts"] + e["dur"])) for e in device], a, b)
    return KinetoTrace(name, rows, a, b, len(steps), busy)
