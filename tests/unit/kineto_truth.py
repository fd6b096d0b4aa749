"""Ground truth computed straight from a Kineto trace's JSON, independently of ingero's importer.

The trace is small (test data), so json.load is fine here; the importer itself never does it.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
TRACES = ("alexnet_a100.json.gz", "v100_rank0.pt.trace.json.gz", "a100_nccl_rank0.json.gz",
          "sampled_rank0_ws128.json.gz")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load(name: str) -> dict[str, Any]:
    with gzip.open(DATA / name, "rt") as f:
        return json.load(f)


def ns(trace: dict[str, Any], ts: float) -> int:
    return int(trace.get("baseTimeNanoseconds", 0)) + round(float(ts) * 1000)


def union_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def steps(trace: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(N, start_ns, end_ns) of each ProfilerStep#N annotation."""
    return sorted((int(e["name"].split("#")[1]), ns(trace, e["ts"]), ns(trace, e["ts"]) + round(e["dur"] * 1000))
                  for e in trace["traceEvents"]
                  if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))


def busy_share(trace: dict[str, Any]) -> float:
    """Union of device intervals over the analysed span (steps' span, else the runtime calls' span)."""
    ev = trace["traceEvents"]
    st = steps(trace)
    if st:
        lo, hi = min(s for _, s, _ in st), max(e for _, _, e in st)
    else:
        calls = [(ns(trace, e["ts"]), ns(trace, e["ts"]) + round(e["dur"] * 1000)) for e in ev
                 if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"]
        lo, hi = min(s for s, _ in calls), max(e for _, e in calls)
    dev = [(ns(trace, e["ts"]), ns(trace, e["ts"]) + round(e["dur"] * 1000)) for e in ev
           if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    return union_ns(dev, lo, hi) / (hi - lo)


def counts(trace: dict[str, Any]) -> Counter:
    return Counter((e.get("ph"), e.get("cat"), e.get("name") if e.get("cat") == "cuda_runtime" else None)
                   for e in trace["traceEvents"])
