"""How long `ingero explain` takes over 1 M and 10 M stored events.

Builds DuckDB files synthetically (numpy -> Arrow -> Store.append) with the
mix a traced training job produces (launches, syncs, copies, off-CPU
intervals of the loop and its workers, page faults, block I/O, per-second
host and per-process samples), then times ``explain(con, Options())`` on a
read-only connection, as the CLI runs it.  Prints a markdown table.  The
loop's off-CPU and fault rows carry in_call / queued as the tracer tags them
(schema 5), from its CUDA calls, which never overlap (one thread is in one
call at a time: each is clipped at the next).  Rows are stored in the
tracer's order: each once-a-second flush grouped by op (decode.storage_order,
for compression), which lets explain's scans skip whole vectors of other ops;
``--interleaved`` stores plain time order instead, the worst case.

    python bench/bench_explain.py                 # 1 M and 10 M
    python bench/bench_explain.py --sizes 1e6 --repeat 5 --dir /tmp/ingero-bench
    python -m bench.bench_explain --sizes 1e7 --keep --statements   # + where the time goes
    python -m bench.bench_explain --sizes 1e6 --day 0        # skip the day store

Each size is measured twice: a store without per-second summaries (an imported
session or one recorded before schema 11: explain summarises its range on the
fly) and one with them, written chunk by chunk as the tracer's hook writes them
per flush.  ``--day N`` (default 864e6: a daemon's 10 k events/s) then times
`explain --since 120s` and `--since 24h` over a day of summaries (``day_store``:
one generated 10-minute block stored as the tracer stores it, its summaries
repeated over the day).

``--statements`` also prints, per size, the best-of-N wall and CPU time of
every SQL statement explain runs (window tables by name, rules by module), so
a change can be aimed at the statement that costs most.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.collect.session import FLUSH_INTERVAL_S
from ingero.events.ops import OP_NAMES
from ingero.events.units import NS
from ingero.store.db import Store

T0 = 1_763_800_000 * NS
EVENTS_PER_S = 30_000  # a busy traced job: ~30k events/s (launch-heavy loop + host events)
LOOP_PID = 1000
WORKERS = (1001, 1002, 1003, 1004)
HOGS = (2001, 2002)

# op mix: (op, kind, share, median duration ns); the first four are the loop's CUDA calls
MIX = (
    ("cudaLaunchKernel", None, 0.62, 6_000),
    ("cudaStreamSync", None, 0.04, 2_000_000),
    ("cudaMemcpyAsync", "H2D", 0.04, 12_000),
    ("cudaMemcpy", "D2H", 0.01, 400_000),
    ("sched_switch", "sleep", 0.12, 1_500_000),
    ("sched_switch", "preempted", 0.06, 800_000),
    ("sched_switch", "io", 0.01, 3_000_000),
    ("page_fault", None, 0.08, 2_000),
    ("block_io", "write", 0.02, 5_000_000),
)


# Op ids (records.Op) of MIX, the tracer's sort key within a flush.
_OP_ID = {name: op for op, name in OP_NAMES.items()}
OP_IDS = np.array([_OP_ID[m[0]] for m in MIX], dtype=np.uint8)

N_CUDA = 4
# What a CUDA call leaves queued on the device (events.queued, contract v5): a launch or an
# async copy queues work, a sync or a synchronous copy drains it.
QUEUES = np.array([True, False, True, False])


class CallState:
    """The loop thread's CUDA call state across chunks, as the tracer keeps it (contract v5).

    ``queued``: whether the thread's last CUDA call left work queued; None before its first.
    """

    def __init__(self) -> None:
        self.queued: bool | None = None

    def tag(self, ts: np.ndarray, dur: np.ndarray, which: np.ndarray, pid: np.ndarray, hi: int
            ) -> tuple[np.ndarray, np.ndarray]:
        """in_call (op index, -1 outside) and queued (0/1, -1 NULL) of every row of one chunk.

        Clips ``dur`` of the loop's CUDA calls in place so that they never overlap (one
        thread is inside one call at a time; the last one ends by ``hi``, the chunk's end).
        """
        m = len(ts)
        in_call = np.full(m, -1, dtype=np.int64)
        queued = np.full(m, -1, dtype=np.int8)
        ci = np.nonzero(which < N_CUDA)[0]
        if len(ci):
            c_ts = ts[ci]
            dur[ci] = np.minimum(dur[ci], np.append(c_ts[1:], hi) - c_ts)
            c_end = c_ts + dur[ci]
            after = QUEUES[which[ci]].astype(np.int8)
            before = np.concatenate(([-1 if self.queued is None else int(self.queued)], after[:-1]))
        host = np.nonzero((which >= N_CUDA) & (which <= 7) & (pid == LOOP_PID))[0]
        if len(ci) and len(host):
            k = np.searchsorted(c_ts, ts[host], side="right") - 1
            started = k >= 0
            kk = np.maximum(k, 0)
            inside = started & (c_end[kk] > ts[host])
            in_call[host] = np.where(inside, which[ci[kk]], -1)
            queued[host] = np.where(started, np.where(inside, before[kk], after[kk]),
                                    -1 if self.queued is None else int(self.queued))
        elif len(host) and self.queued is not None:
            queued[host] = int(self.queued)
        if len(ci):
            self.queued = bool(after[-1])
        return in_call, queued


def build(path: Path, n: int, seed: int = 0, interleaved: bool = False, summarise: bool = False,
          rate: int = EVENTS_PER_S, only_summaries: bool = False, t0: int = T0) -> float:
    """Write an n-event DB at path; returns seconds taken.

    Rows are stored as the tracer stores them (each flush grouped by op);
    ``interleaved`` keeps plain time order across ops instead, a layout the
    tracer never writes: the worst case for explain's scans.  ``summarise``:
    also write the per-second summaries of each appended chunk, as the tracer's
    hook does per flush (analyze/summaries/__init__.py, the same SQL); ``only_summaries``:
    write the summaries of the generated events but not the events themselves
    (a day of summaries without a day of raw rows to store)."""
    t = time.perf_counter()
    if path.exists():
        path.unlink()
    rng = np.random.default_rng(seed)
    span_ns = int(n / rate * NS)
    store = Store.open(path)
    store.con.execute(
        "INSERT INTO sessions (session_id, started_ns, ended_ns, status, events, ncpu)"
        " VALUES (1, $t0, $t1, 'closed', $n, 2)",
        {"t0": t0, "t1": t0 + span_ns, "n": n},
    )
    chunk = 2_000_000
    if summarise or only_summaries:
        from ingero.analyze import summaries
    shares = np.array([m[2] for m in MIX])
    shares /= shares.sum()
    state = CallState()
    op_names = np.array([x[0] for x in MIX], dtype=object)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        which = rng.choice(len(MIX), size=m, p=shares)
        # timestamps: this chunk's slice of the span, sorted (as the tracer appends)
        lo = t0 + span_ns * start // n
        hi = t0 + span_ns * (start + m) // n
        ts = np.sort(rng.integers(lo, hi, size=m))
        med = np.array([x[3] for x in MIX], dtype=np.float64)[which]
        dur = (med * rng.lognormal(0.0, 0.5, size=m)).astype(np.int64)
        ops = np.array([x[0] for x in MIX], dtype=object)[which]
        kinds = np.array([x[1] for x in MIX], dtype=object)[which]
        cuda = which < N_CUDA
        sched = (which >= 4) & (which <= 6)
        pid = np.where(cuda, LOOP_PID, rng.choice(np.array((LOOP_PID,) + WORKERS), size=m))
        pid = np.where(which == 8, rng.choice(np.array(HOGS + (LOOP_PID,)), size=m), pid)
        in_call, queued = state.tag(ts, dur, which, pid, hi)
        nbytes = np.where((which == 2) | (which == 3), 8 << 20, np.where(which == 8, 1 << 20, 0))
        preempted = which == 5
        other = np.where(preempted, rng.choice(np.array(HOGS), size=m), 0)
        runq = np.where(sched, (dur * np.where(preempted, 1.0, 0.01)).astype(np.int64), 0)
        # Row order as the tracer stores it: each flush (one per FLUSH_INTERVAL_S
        # at this rate) grouped by op id, time order within an op
        # (decode.storage_order).  Explain's scans skip the vectors of other ops.
        flush = (ts - t0) // int(FLUSH_INTERVAL_S * NS)
        order = np.arange(m) if interleaved else np.lexsort((ts, OP_IDS[which], flush))
        ts, dur, which, ops, kinds, pid, in_call, queued, nbytes, preempted, other, runq, cuda, sched = (
            a[order] for a in (ts, dur, which, ops, kinds, pid, in_call, queued, nbytes, preempted, other, runq,
                               cuda, sched))
        table = pa.table({
            "session_id": pa.array(np.ones(m, dtype=np.int32)),
            "timestamp": pa.array(ts),
            "duration_ns": pa.array(dur),
            "pid": pa.array(pid.astype(np.int32)),
            "tid": pa.array(pid.astype(np.int32)),
            "op": pa.array(ops, type=pa.string()),
            "kind": pa.array(kinds, type=pa.string()),
            "bytes": pa.array(nbytes.astype(np.int64)),
            "preempted": pa.array(np.where(sched, preempted, None), type=pa.bool_()),
            "other_pid": pa.array(other.astype(np.int32)),
            "runq_ns": pa.array(runq),
            "ret": pa.array(np.zeros(m, dtype=np.int32), mask=~cuda),
            "in_call": pa.array(np.where(in_call >= 0, op_names[np.maximum(in_call, 0)], None), type=pa.string()),
            "queued": pa.array(queued == 1, mask=queued < 0),
        })
        if not only_summaries:
            store.append("events", table)
        if summarise or only_summaries:
            store.con.register("_chunk", table)
            summaries.summarise(store.con, "_chunk", session_id=1, stored="_chunk" if only_summaries else "events")
            store.con.unregister("_chunk")
    secs = span_ns // NS + 1
    sample_ts = t0 + (np.arange(secs) + 1) * NS
    store.append("system_metrics", pa.table({
        "session_id": np.ones(secs, dtype=np.int32), "timestamp": sample_ts,
        "cpu_pct": np.full(secs, 70.0), "mem_pct": np.full(secs, 40.0), "load1": np.full(secs, 2.0),
        "ncpu": np.full(secs, 2, dtype=np.int32),
    }))
    pids = np.array((LOOP_PID,) + WORKERS + HOGS, dtype=np.int32)
    store.append("process_cpu", pa.table({
        "session_id": np.ones(secs * len(pids), dtype=np.int32),
        "timestamp": np.repeat(sample_ts, len(pids)),
        "interval_ns": np.full(secs * len(pids), NS),
        "pid": np.tile(pids, secs),
        "comm": pa.array(np.tile(np.array(["python3"] * 5 + ["stress"] * 2, dtype=object), secs), type=pa.string()),
        "oncpu_ns": np.full(secs * len(pids), NS // 2),
    }))
    store.upsert_process_names([
        {"pid": int(p), "name": f"proc {p}", "comm": "python3", "cmdline": "python3 train.py",
         "session_id": 1, "seen_ns": t0} for p in pids
    ])
    store.con.execute("CHECKPOINT")
    store.close()
    return time.perf_counter() - t


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_TABLE = re.compile(r"CREATE\s+OR\s+REPLACE\s+TEMP\s+TABLE\s+(\w+)", re.I)


def _statement_label(sql: str) -> str:
    """'ing_sched' for a window table; 'rule cpu_contention' etc. for the module that ran it."""
    m = _TABLE.search(sql)
    if m:
        return m.group(1)
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("ingero.analyze.rules."):
            return "rule " + name.rsplit(".", 1)[1]
        if name.startswith("ingero.analyze.") and name != "ingero.analyze.windows":
            return name.rsplit(".", 1)[1]
        frame = frame.f_back
    return "other"


def _timed(spent: dict[str, list[float]], sql: str, run):
    """run(), its wall and CPU seconds added to spent[the statement's label] ([wall, cpu])."""
    c, t = _cpu_s(), time.perf_counter()
    result = run()
    got = spent.setdefault(_statement_label(sql), [0.0, 0.0])
    got[0] += time.perf_counter() - t
    got[1] += _cpu_s() - c
    return result


class _TimedConnection:
    """Forwards to a DuckDB connection, adding each execute's wall and CPU seconds to ``spent``
    (label -> [wall, cpu]); the result is consumed by the caller, so fetch time of big
    results would be missed, but explain only ever fetches small window-level results."""

    def __init__(self, con, spent: dict[str, list[float]]):
        self._con = con
        self._spent = spent

    def execute(self, sql, *args, **kwargs):
        return _timed(self._spent, sql, lambda: self._con.execute(sql, *args, **kwargs))

    def sql(self, query, *args, **kwargs):
        """A relation runs when it is fetched (analyze/device/__init__.py fetches its calls as Arrow): timed then."""
        return _TimedRelation(self._con.sql(query, *args, **kwargs), query, self._spent)

    def __getattr__(self, name):
        return getattr(self._con, name)


class _TimedRelation:
    def __init__(self, rel, query: str, spent: dict[str, list[float]]):
        self._rel, self._query, self._spent = rel, query, spent

    def to_arrow_table(self):
        return _timed(self._spent, self._query, self._rel.to_arrow_table)


def time_explain(path: Path, repeat: int, statements: dict[str, list[float]] | None = None,
                 opts: Options | None = None) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of each run (CPU time: this machine is shared, wall time is noisy).
    With ``statements``, fills it with the best (over runs) wall and CPU seconds per statement label."""
    times, cpus = [], []
    chains = 0
    for _ in range(repeat):
        store = Store.open(path, read_only=True)
        spent: dict[str, list[float]] = {}
        con = _TimedConnection(store.con, spent) if statements is not None else store.con
        c, t = _cpu_s(), time.perf_counter()
        report = explain(con, opts or Options())
        times.append(time.perf_counter() - t)
        cpus.append(_cpu_s() - c)
        chains = len(report.chains)
        store.close()
        if statements is not None:
            for label, (wall, cpu) in spent.items():
                best = statements.setdefault(label, [wall, cpu])
                best[0], best[1] = min(best[0], wall), min(best[1], cpu)
    return times, cpus, chains


def print_statements(size: int, statements: dict[str, list[float]], min_s: float = 0.005) -> None:
    print(f"\nper statement at {size:,} events (best of runs; statements under {min_s * 1000:.0f} ms left out)\n")
    print("| statement | wall s | CPU s |")
    print("|---|---:|---:|")
    for label, (wall, cpu) in sorted(statements.items(), key=lambda kv: -kv[1][1]):
        if max(wall, cpu) >= min_s:
            print(f"| {label} | {wall:.3f} | {cpu:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated event counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ingero-bench")
    ap.add_argument("--keep", action="store_true", help="reuse existing DB files of the right size")
    ap.add_argument("--statements", action="store_true", help="also time every SQL statement of explain")
    ap.add_argument("--interleaved", action="store_true",
                    help="store rows in time order across ops (the tracer groups each flush by op): worst case")
    ap.add_argument("--day", default="864e6", help="events of the day store (0: skip it)")
    args = ap.parse_args()
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    per_statement = {}
    for size in (int(float(s)) for s in args.sizes.split(",")):
        for summarise in (False, True):
            path = out / (f"explain-{size}{'-interleaved' if args.interleaved else ''}"
                          f"{'-summaries' if summarise else ''}.duckdb")
            built = 0.0 if (args.keep and path.exists()) else build(path, size, interleaved=args.interleaved,
                                                                      summarise=summarise)
            statements: dict[str, list[float]] | None = {} if args.statements else None
            times, cpus, chains = time_explain(path, args.repeat, statements)
            rows.append((size, summarise, built, min(times), statistics.median(times), min(cpus), chains,
                         path.stat().st_size))
            per_statement[(size, summarise)] = statements
    load = os.getloadavg()[0]
    layout = ("time order across ops (worst case)" if args.interleaved
              else "each flush grouped by op, as the tracer stores")
    print(f"explain over N stored events ({os.cpu_count()} CPUs, load {load:.1f}, best of {args.repeat} runs, "
          f"read-only file DB; rows: {layout})\n")
    print("| events | summaries | build s | explain wall min s | wall median s | CPU s (min) | ns per event | chains "
          "| DB MB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for size, summarise, built, best, med, cpu, chains, nbytes in rows:
        print(f"| {size:,} | {'stored' if summarise else 'on the fly'} | {built:.1f} | {best:.3f} | {med:.3f} | "
              f"{cpu:.3f} | {best / size * 1e9:.0f} | {chains} | {nbytes / 1e6:.0f} |")
    for (size, summarise), statements in per_statement.items():
        if statements is not None:
            print_statements(size, statements)
    day = int(float(args.day))
    if day:
        big_store(out, day, args)


DAEMON_EVENTS_PER_S = 10_000  # the always-on daemon: 864 M events a day
DAY_S = 86_400
BLOCK_S = 600  # the day is one generated block of this long, its summaries repeated


def day_store(path: Path, n_day: int) -> tuple[float, int]:
    """A day at n_day / 86400 events/s, as explain reads it: per-second summaries of all of it,
    raw events of its last BLOCK_S.  The last block is generated and stored as the tracer
    stores it (events + per-flush summaries); the earlier ones are copies of its summary rows
    shifted back in time (generating 864 M raw events would take this shared VM hours):
    explain over the day reads as many summary rows as a real day's.  Returns (build s, events
    summarised)."""
    t = time.perf_counter()
    rate = n_day // DAY_S
    block_n = rate * BLOCK_S
    day_t0 = T0 - (DAY_S - BLOCK_S) * NS
    build(path, block_n, summarise=True, rate=rate, t0=T0)
    store = Store.open(path)
    blocks = DAY_S // BLOCK_S
    shift = ", ".join(f"({k * BLOCK_S * NS})" for k in range(1, blocks))
    con = store.con
    con.execute(f"""INSERT INTO windows SELECT * EXCLUDE (k)
                    REPLACE (start_ns - k AS start_ns, first_ns - k AS first_ns,
                            last_ns - k AS last_ns)
                    FROM windows, (VALUES {shift}) v(k)""")
    con.execute(f"""INSERT INTO window_late_waits SELECT * EXCLUDE (k) REPLACE (start_ns - k AS start_ns)
                    FROM window_late_waits, (VALUES {shift}) v(k)""")
    con.execute("UPDATE sessions SET started_ns = $t0", {"t0": day_t0})
    con.execute("CHECKPOINT")
    total = con.execute("SELECT sum(events_n) FROM windows").fetchone()[0]
    store.close()
    return time.perf_counter() - t, int(total)


def big_store(out: Path, n: int, args: argparse.Namespace) -> None:
    """`explain --since 120s` and `--since 24h` on a day of summaries (day_store)."""
    path = out / f"explain-day-{n}.duckdb"
    built, total = (0.0, 0) if (args.keep and path.exists()) else day_store(path, n)
    size = path.stat().st_size
    print(f"\nexplain over a day at {n // DAY_S:,} events/s: {total:,} events summarised "
          f"(raw rows of the last {BLOCK_S} s, {n // DAY_S * BLOCK_S:,}; built in {built:.0f} s; "
          f"{size / 1e6:.0f} MB; load {os.getloadavg()[0]:.1f}, best of {args.repeat})\n")
    print("| range | events in range | explain wall min s | wall median s | CPU s (min) | chains |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, since in (("--since 120s", 120.0), ("--since 24h", float(DAY_S))):
        statements: dict[str, list[float]] | None = {} if args.statements else None
        times, cpus, chains = time_explain(path, args.repeat, statements, Options(since_s=since))
        in_range = min(n, int(since * n // DAY_S))
        print(f"| {label} | {in_range:,} | {min(times):.3f} | {statistics.median(times):.3f} | {min(cpus):.3f} | "
              f"{chains} |", flush=True)
        if statements:
            print_statements(in_range, statements)
    if not args.keep:
        path.unlink()


if __name__ == "__main__":
    main()
