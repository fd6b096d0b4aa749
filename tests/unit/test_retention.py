"""Retention: the age window deletes exactly what is older; the size bound holds over a long run."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from ingero.store.retention import MIN_MAX_DB_BYTES, TIME_TABLES, Retention
from ingero.store.db import Store

S = 1_000_000_000
T0 = 1_700_000_000 * S


def _fill(store: Store, seconds: int, per_s: int) -> None:
    ts = np.repeat(T0 + np.arange(seconds, dtype=np.int64) * S, per_s)
    n = len(ts)
    for table in TIME_TABLES:
        cols = {"session_id": pa.array(np.ones(n, np.int32)), "timestamp": pa.array(ts)}
        if table in ("events", "process_cpu", "cgroup_cpu", "switch_counts"):
            cols["pid"] = pa.array(np.full(n, 7, np.int32))
        if table == "switch_counts":
            cols.update({c: pa.array(np.full(n, 1, np.int64))
                         for c in ("interval_ns", "switches", "off_cpu_ns", "runq_ns")})
            cols["tid"] = pa.array(np.full(n, 8, np.int32))
            cols["kind"] = pa.array(["sleep"] * n)
        if table == "cgroup_cpu":
            cols["cgroup"] = pa.array(["/job"] * n)
        if table == "events":
            cols["op"] = pa.array(["sched_switch"] * n)
        store.append(table, pa.table(cols))
    store.upsert_process_names([
        {"pid": 1, "name": "old", "comm": "old", "cmdline": "old", "session_id": 1, "seen_ns": T0},
        {"pid": 2, "name": "new", "comm": "new", "cmdline": "new", "session_id": 1, "seen_ns": T0 + seconds * S},
    ])


def _count(store: Store, table: str) -> int:
    return store.con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]


def test_age_window_deletes_exactly_the_older_rows(tmp_path):
    store = Store.open(tmp_path / "r.duckdb")
    _fill(store, seconds=100, per_s=10)
    info = Retention(retain_s=30, max_db_bytes=None).apply(store.con, T0 + 100 * S)
    # rows at T0+0..69 s are older than now-30 s = T0+70 s; T0+70..99 s stay
    for table in TIME_TABLES:
        assert info["deleted"][table] == 700, table
        assert _count(store, table) == 300
    assert store.con.execute("SELECT min(timestamp) FROM events").fetchall()[0][0] == T0 + 70 * S
    assert info["deleted"]["process_names"] == 1
    assert [r[0] for r in store.con.execute("SELECT name FROM process_names").fetchall()] == ["new"]
    assert info["checkpoint"] is True
    again = Retention(retain_s=30, max_db_bytes=None).apply(store.con, T0 + 100 * S)
    assert sum(again["deleted"].values()) == 0 and again["checkpoint"] is False
    store.close()


def test_spans_go_once_they_ended_before_the_cutoff(tmp_path):
    store = Store.open(tmp_path / "r.duckdb")
    # NVTX steps of a traced --cmd: [T0 + k s, T0 + k s + 0.5 s)
    start = T0 + np.arange(100, dtype=np.int64) * S
    store.append("spans", pa.table({"session_id": pa.array(np.ones(100, np.int32)), "start_ns": pa.array(start),
                                    "end_ns": pa.array(start + S // 2), "name": ["step"] * 100,
                                    "category": ["nvtx"] * 100}))
    info = Retention(retain_s=30, max_db_bytes=None).apply(store.con, T0 + 100 * S)
    assert info["deleted"]["spans"] == 70
    assert store.con.execute("SELECT min(start_ns) FROM spans").fetchall()[0][0] == T0 + 70 * S
    store.close()


def test_sessions_and_stacks_are_kept(tmp_path):
    store = Store.open(tmp_path / "r.duckdb")
    store.begin_session(command="x", targets="y")
    _fill(store, seconds=10, per_s=1)
    Retention(retain_s=1, max_db_bytes=None).apply(store.con, T0 + 10**6 * S)
    assert _count(store, "events") == 0
    assert _count(store, "sessions") == 1


def test_under_the_bound_nothing_is_deleted(tmp_path):
    store = Store.open(tmp_path / "r.duckdb")
    _fill(store, seconds=10, per_s=10)
    info = Retention(retain_s=None, max_db_bytes=10**9).apply(store.con, T0 + 10 * S)
    assert sum(info["deleted"].values()) == 0
    assert _count(store, "events") == 100


@pytest.mark.parametrize(("retain_s", "max_db"), [(0, None), (-1, None), (None, 0), (None, MIN_MAX_DB_BYTES - 1)])
def test_bad_bounds_are_rejected(retain_s, max_db):
    with pytest.raises(ValueError):
        Retention(retain_s, max_db)


# Size bound: write WRITE_FACTOR x the bound, applying retention after each flush as the tracer
# does; the file plus its WAL never exceeds the bound and the newest data is always kept.
BOUND = MIN_MAX_DB_BYTES
# 3 x keeps this near 12 s on the shared 2-core VM (10 x took 40 s and held too; see the report).
WRITE_FACTOR = 3
BATCH_ROWS = 50_000


def test_size_bound_holds_over_a_run_writing_three_times_the_bound(tmp_path):
    path = tmp_path / "bounded.duckdb"
    store = Store.open(path)
    retention = Retention(retain_s=None, max_db_bytes=BOUND)
    rng = np.random.default_rng(5)
    t = T0
    written = 0
    bytes_per_row = 0.0
    peak = 0
    pruned_rounds = 0
    # stop once the rows written take WRITE_FACTOR x the bound at the bytes/row DuckDB stores them in
    while bytes_per_row == 0 or written * bytes_per_row < WRITE_FACTOR * BOUND:
        store.append("events", _wide_batch(t, BATCH_ROWS, rng))
        written += BATCH_ROWS
        t += S
        info = retention.apply(store.con, t)
        pruned_rounds += bool(info["deleted"].get("events"))
        size = os.path.getsize(path) + (os.path.getsize(f"{path}.wal") if os.path.exists(f"{path}.wal") else 0)
        peak = max(peak, size)
        bytes_per_row = info["used_bytes"] / _count(store, "events")
    assert peak <= BOUND, f"file + WAL peaked at {peak} bytes for a bound of {BOUND}"
    kept = store.con.execute("SELECT min(timestamp), max(timestamp) FROM events").fetchall()[0]
    assert kept[1] == t - S + (S // BATCH_ROWS) * (BATCH_ROWS - 1)  # the newest flush is kept whole
    assert _count(store, "events") >= 2 * BATCH_ROWS  # and not only that
    assert kept[0] > T0  # the oldest data went
    assert pruned_rounds >= WRITE_FACTOR - 1
    store.close()


def _wide_batch(t: int, n: int, rng: np.random.Generator) -> pa.Table:
    """Events whose numbers are random 64-bit values: ~50 bytes a row after DuckDB's compression,
    so the test fills the bound with few rows."""
    def i64() -> pa.Array:
        return pa.array(rng.integers(0, 2**62, n, dtype=np.int64))

    def i32() -> pa.Array:
        return pa.array(rng.integers(0, 2**31 - 1, n, dtype=np.int32))

    return pa.table({
        "session_id": pa.array(np.ones(n, np.int32)),
        "timestamp": pa.array(t + np.arange(n, dtype=np.int64) * (S // n)),
        "pid": i32(), "tid": i32(), "other_pid": i32(), "ret": i32(),
        "op": pa.array(["sched_switch"] * n),
        "duration_ns": i64(), "bytes": i64(), "runq_ns": i64(), "stack_id": i64(),
    })
