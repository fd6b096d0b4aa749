"""Schema 5: events.in_call / events.queued derived for rows written before it.

The migration and explain's read-only view (ingero/store/derive.py) must give
old rows what BPF records for new ones: the CUDA call the thread was inside,
and whether device work it queued may still be running.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from old_schemas import write_old_file

from ingero.store import derive
from ingero.store.db import SCHEMA_VERSION, Store

PID = 10
CUDA_TID = 11
HELPER_TID = 12

# (session, tid, timestamp, duration, op, ret, expected in_call, expected queued)
ROWS = [
    (1, CUDA_TID, 100, 5, "sched_switch", None, None, None),           # before the thread's first call
    (1, CUDA_TID, 200, 10, "cudaLaunchKernel", 0, None, None),
    (1, CUDA_TID, 300, 5, "sched_switch", None, None, True),           # launched, no sync yet
    (1, CUDA_TID, 400, 100, "cudaStreamSync", 0, None, None),
    (1, CUDA_TID, 450, 20, "sched_switch", None, "cudaStreamSync", True),  # waiting in the sync: still queued
    (1, CUDA_TID, 460, 0, "page_fault", 6, "cudaStreamSync", True),
    (1, CUDA_TID, 600, 5, "sched_switch", None, None, False),          # the sync returned
    (1, CUDA_TID, 700, 5, "cudaLaunchKernel", 35, None, None),         # failed: queued nothing
    (1, CUDA_TID, 800, 5, "sched_switch", None, None, False),
    (1, CUDA_TID, 900, 10, "cudaMemcpyAsync", 0, None, None),
    (1, CUDA_TID, 1000, 50, "cudaMalloc", 0, None, None),              # neither queues nor drains
    (1, CUDA_TID, 1020, 0, "page_fault", 4, "cudaMalloc", True),
    (1, CUDA_TID, 1100, 10, "cudaMemcpy", 35, None, None),             # a sync clears whatever it returns
    (1, CUDA_TID, 1200, 5, "sched_switch", None, None, False),
    (1, HELPER_TID, 300, 5, "sched_switch", None, None, None),         # never calls CUDA
    (1, HELPER_TID, 310, 0, "page_fault", 4, None, None),
    (1, CUDA_TID, 320, 1000, "block_io", 0, None, None),               # not a tagged op
    (2, CUDA_TID, 5000, 5, "sched_switch", None, None, None),          # same tid, next session: no call yet there
    (2, CUDA_TID, 5100, 10, "cuLaunchKernel", 0, None, None),
    (2, CUDA_TID, 5200, 5, "sched_switch", None, None, True),
]


def _old_file(path: Path) -> None:
    write_old_file(path, version=4)
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO sessions (session_id, started_ns, status) VALUES (2, 4000, 'closed')")
    for sid, tid, ts, dur, op, ret, _, _ in ROWS:
        con.execute(
            "INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op, ret) "
            "VALUES ($sid, $ts, $dur, $pid, $tid, $op, $ret)",
            {"sid": sid, "ts": ts, "dur": dur, "pid": PID, "tid": tid, "op": op, "ret": ret},
        )
    con.close()


def _expected(session: int | None = None) -> list[tuple]:
    return sorted((sid, tid, ts, op, inc, q) for sid, tid, ts, _, op, _, inc, q in ROWS if session in (None, sid))


def test_migration_fills_in_call_and_queued_from_the_stored_calls(tmp_path: Path) -> None:
    path = tmp_path / "v4.duckdb"
    _old_file(path)
    store = Store.open(path)
    assert store.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    got = store.con.execute(
        "SELECT session_id, tid, timestamp, op, in_call, queued FROM events ORDER BY ALL"
    ).fetchall()
    assert got == _expected()
    assert derive.has_call_state(store.con)
    assert derive.events_relation(store.con, 1) == "events"
    store.close()


def test_read_only_view_over_an_old_file_matches_a_v5_events(tmp_path: Path) -> None:
    path = tmp_path / "v4.duckdb"
    _old_file(path)
    con = duckdb.connect(str(path), read_only=True)
    assert not derive.has_call_state(con)
    name = derive.events_relation(con, 1)
    assert name == derive.DEFAULT_VIEW
    got = con.execute(f"SELECT session_id, tid, timestamp, op, in_call, queued FROM {name} ORDER BY ALL").fetchall()
    assert got == _expected(session=1)
    # the same columns, in the same order and of the same types, as a schema 5 events table
    # (today's events minus what schema 10 appended: comm, peer; and 15: what a switch waited for)
    later = ("comm", "peer", "syscall", "wait_fd", "fd_target", "waker_pid", "waker_tid")
    v5 = [c for c in Store.memory().con.execute("DESCRIBE events").fetchall() if c[0] not in later]
    view = con.execute(f"DESCRIBE {name}").fetchall()
    # (since schema 11 op, kind and in_call are ENUMs; an older file keeps VARCHAR)
    as_text = [(c[0], "VARCHAR" if c[1].startswith("ENUM(") else c[1]) for c in v5]
    assert [(c[0], c[1]) for c in view] == as_text
    # nothing was written to the file
    con.close()
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    con.close()


def test_view_of_a_session_without_cuda_calls_has_null_state(tmp_path: Path) -> None:
    path = tmp_path / "v4.duckdb"
    _old_file(path)
    con = duckdb.connect(str(path), read_only=True)
    name = derive.derived_events_view(con, 3, name="ing_empty")
    assert con.execute(f"SELECT count(*) FROM {name}").fetchone() == (0,)
    with pytest.raises(ValueError):
        derive.derived_events_view(con, 1, name="x; DROP TABLE events")
    con.close()


def test_fill_call_state_sets_one_session_of_a_v5_store(tmp_path: Path) -> None:
    path = tmp_path / "v4.duckdb"
    _old_file(path)
    store = Store.open(path)
    store.con.execute("UPDATE events SET in_call = NULL, queued = NULL")
    tagged_in_1 = sum(1 for r in ROWS if r[0] == 1 and r[4] in derive.TAGGED_OPS)
    assert derive.fill_call_state(store.con, 1) == tagged_in_1
    got = store.con.execute("SELECT session_id, tid, timestamp, op, in_call, queued FROM events "
                            "ORDER BY ALL").fetchall()
    # session 2 untouched (its expected values would differ: queued TRUE after its launch)
    assert [g for g in got if g[0] == 1] == _expected(session=1)
    assert {(g[4], g[5]) for g in got if g[0] == 2} == {(None, None)}
    store.close()
