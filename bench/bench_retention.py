"""What pruning unreferenced stacks adds to a retention pass, at 1 M events / 100 k stacks.

Run from the repo root: ``.venv/bin/python -m bench.bench_retention`` (any user).

A file-backed store with one DuckDB thread, as the tracer runs it, holds
EVENTS events (half with a stack id) over STACKS stacks of FRAMES frames,
the older half of the events using the older half of the stacks.  Timed:
prune_stacks right after an age pass deleted the older half (about half the
stacks go), prune_stacks again with nothing left to delete, and the whole
Retention.apply of that age pass (events + stacks + CHECKPOINT) for scale.
Each figure is the best of REPEATS fresh stores (the box is shared).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from ingero.store.retention import Retention, prune_stacks
from ingero.store.db import Store

EVENTS = 1_000_000
STACKS = 100_000
FRAMES = 8  # a typical resolved CUDA-call stack: a few native + Python frames
REPEATS = 3
S = 10**9
T0 = 1_700_000_000 * S


def _store(path: Path) -> tuple[Store, int]:
    store = Store.open(path)
    store.con.execute("SET threads = 1")
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 2**62, STACKS, dtype=np.int64)
    ts = T0 + np.arange(EVENTS, dtype=np.int64) * (100 * S // EVENTS)  # 100 s of events
    pick = np.minimum(np.arange(EVENTS) * STACKS // EVENTS + rng.integers(0, 50, EVENTS), STACKS - 1)
    stack = np.where(rng.random(EVENTS) < 0.5, -1, ids[pick])
    store.append("events", pa.table({
        "session_id": pa.array(np.ones(EVENTS, np.int32)), "timestamp": pa.array(ts),
        "pid": pa.array(np.full(EVENTS, 7, np.int32)), "op": pa.array(["cudaLaunchKernel"] * EVENTS),
        "stack_id": pa.array(stack, mask=stack < 0),
    }))
    n = STACKS * FRAMES
    store.append("stacks", pa.table({
        "stack_id": pa.array(np.repeat(ids, FRAMES)),
        "depth": pa.array(np.tile(np.arange(FRAMES, dtype=np.int32), STACKS)),
        "frame_kind": pa.array(["native"] * n), "function": pa.array([f"fn_{i % 5000}" for i in range(n)]),
        "module": pa.array(["/usr/lib/x86_64-linux-gnu/libcudart.so.12"] * n),
    }))
    store.con.execute("CHECKPOINT")
    return store, int(ts[EVENTS // 2])


def main() -> int:
    best = {"apply": 1e9, "prune": 1e9, "prune_again": 1e9}
    frames = stacks = events = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(REPEATS):
            # the whole age pass: events deleted, stacks pruned, CHECKPOINT
            store, cutoff = _store(Path(tmp) / f"a{i}.duckdb")
            t = time.perf_counter()
            info = Retention(retain_s=1.0, max_db_bytes=None).apply(store.con, cutoff + S)
            best["apply"] = min(best["apply"], time.perf_counter() - t)
            events, frames, stacks = info["deleted"]["events"], info["deleted"]["stacks"], len(info["pruned_stack_ids"])
            t = time.perf_counter()
            assert prune_stacks(store.con)[0] == 0
            best["prune_again"] = min(best["prune_again"], time.perf_counter() - t)
            store.close()
            # the pruning alone, after the same DELETE of events
            store, cutoff = _store(Path(tmp) / f"p{i}.duckdb")
            store.con.execute("DELETE FROM events WHERE timestamp < $c", {"c": cutoff})
            t = time.perf_counter()
            prune_stacks(store.con)
            best["prune"] = min(best["prune"], time.perf_counter() - t)
            store.close()
    print(f"retention over {EVENTS:,} events / {STACKS:,} stacks x {FRAMES} frames, one DuckDB thread, "
          f"best of {REPEATS}, loadavg {Path('/proc/loadavg').read_text().strip()}\n")
    print("| step | seconds |\n|---|---:|")
    print(f"| prune_stacks after {events:,} events deleted ({stacks:,} stacks, {frames:,} frames go) "
          f"| {best['prune']:.3f} |")
    print(f"| prune_stacks with nothing to delete | {best['prune_again']:.3f} |")
    print(f"| whole age pass (delete events + prune stacks + CHECKPOINT) | {best['apply']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
