"""explain on a file older than schema 5, opened read-only (no in_call / queued columns).

explain reads the call state from a TEMP view that derives it from the stored
CUDA calls (ingero/store/derive.py); the chains must be the ones the same file
gives after its migration, and the ones the tracer's own tagging gives.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from analyze_helpers import MAIN_PID, MAIN_TID, SESSION, S, T0, Trace, chains_of, with_call_state, silent
from old_schemas import old_schema

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.store.db import Store
from ingero.store.derive import has_call_state


def write_v4(tr: Trace, path) -> None:
    """``tr`` as ingero with schema 4 stored it: events without in_call / queued."""
    con = duckdb.connect(str(path))
    con.execute(old_schema(4))
    con.execute("INSERT INTO meta VALUES ('schema_version', '4')")
    con.execute(
        """INSERT INTO sessions (session_id, started_ns, ended_ns, status, events, drops_kernel, drops_user, ncpu,
               sched_autogroup, stale_calls)
           VALUES ($sid, $t0, $end, 'closed', $n, 0, 0, $ncpu, false, 0)""",
        {"sid": SESSION, "t0": T0, "end": tr.end_ns, "n": len(tr.events), "ncpu": tr.ncpu},
    )
    for table, rows in (("events", tr.events), ("process_cpu", tr.pcpu), ("system_metrics", tr.sysm),
                        ("process_names", tr.names)):
        if table == "events":  # the columns of schema 15 (what a thread blocked in) are not in 4
            rows = [{k: v for k, v in r.items() if k not in ("syscall", "fd_target")} for r in rows]
        if rows:
            arrow = pa.Table.from_pylist(rows)  # noqa: F841 (read by the SQL below)
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM arrow")
    con.close()


def mixed() -> Trace:
    """Serial waits for data, then an overlapped GPU-bound stretch, then copies preempted by a hog:
    every use of in_call and queued explain makes."""
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(5000, "python3 (train.py)", "pt_data_worker", "python3 train.py", ppid=MAIN_PID)
    tr.worker(5000, 0, 30, oncpu=0.95)
    tr.name(7000, "stress", "stress", "stress --cpu 2").competitor(7000, "stress", 20, 30)
    tr.loop(0, 10, wait_ms=24, device_ms=30.5)
    # each stretch starts where the last step of the one before ended (one thread makes one call at a time)
    tr.loop(_now(tr), 20, wait_ms=20, device_ms=40, overlap=True)
    tr.loop(_now(tr), 30, copy_op="cudaMemcpyAsync", copy_bytes=64 << 20, copy_ms=25, copy_preempt_ms=24,
            preempt_by=7000, faults=3)
    return tr.system(0, 30)


def _now(tr: Trace) -> float:
    """Seconds into the trace at which the loop thread's last event ended."""
    return max(e["timestamp"] + e["duration_ns"] for e in tr.events if e["tid"] == MAIN_TID) / S - T0 / S


def test_a_v4_file_read_only_gives_the_chains_of_the_migrated_file_and_of_the_tracer(tmp_path):
    tr = mixed()
    path = tmp_path / "v4.duckdb"
    write_v4(tr, path)
    old = Store.open(path, read_only=True)
    assert not has_call_state(old.con)
    before = explain(old.con, Options())
    old.close()
    # the view is TEMP: the read-only file was not changed
    check = duckdb.connect(str(path), read_only=True)
    assert check.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    check.close()

    migrated = Store.open(path)  # writable: migrates to schema 5, deriving both columns
    assert has_call_state(migrated.con)
    after = explain(migrated.con, Options())
    migrated.close()
    tagged = tr.explain()  # schema 5 rows as the tracer tags them (analyze_helpers)

    assert {c.rule_id for c in before.chains} >= {"input-bound", "cpu-contention"}
    assert silent(before, "transfer-bound")  # the copies were slow for want of a CPU
    assert before.chains == after.chains == tagged.chains
    assert before.analysed == after.analysed


def test_the_derived_columns_equal_the_tracers_tagging_row_for_row():
    tr = mixed()
    store = Store.memory()
    store.con.execute("INSERT INTO sessions (session_id, started_ns, status) VALUES (1, 0, 'closed')")
    rows = [{k: v for k, v in r.items() if k not in ("in_call", "queued")} for r in tr.events]
    store.append("events", pa.Table.from_pylist(rows))
    from ingero.store.derive import derived_events_view

    view = derived_events_view(store.con, SESSION)
    got = store.con.execute(f"SELECT timestamp, tid, op, in_call, queued FROM {view} "
                            "WHERE op IN ('sched_switch', 'page_fault') ORDER BY ALL").fetchall()
    want = sorted((r["timestamp"], r["tid"], r["op"], r["in_call"], r["queued"])
                  for r in with_call_state(tr.events) if r["op"] in ("sched_switch", "page_fault"))
    assert len(got) == len(want) > 1000
    assert got == want
    assert {r[3] for r in got} == {None, "cudaStreamSync", "cudaMemcpyAsync"}
    assert {r[4] for r in got} == {None, True, False}


@pytest.mark.parametrize("overlap", [False, True])
def test_input_bound_is_the_same_on_old_and_new_files(tmp_path, overlap):
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py").system(0, 30)
    tr.loop(0, 30, wait_ms=40, device_ms=20, overlap=overlap)
    write_v4(tr, tmp_path / "v4.duckdb")
    old = Store.open(tmp_path / "v4.duckdb", read_only=True)
    [chain] = chains_of(explain(old.con, Options()), "input-bound")
    old.close()
    assert chain.numbers == chains_of(tr.explain(), "input-bound")[0].numbers
    assert (chain.numbers["queued_wait_share"] > 0) == overlap
