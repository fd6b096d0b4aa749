"""Retention prunes stacks no event refers to any more, and the tracer's resolver forgets them."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ingero.collect.stacks import StackResolver
from ingero.store.retention import Retention, prune_stacks
from ingero.store.db import SCHEMA_VERSION, Store
from old_schemas import write_old_file

S = 1_000_000_000
T0 = 1_700_000_000 * S
OLD, BOTH, NEW, NEVER = 11, 22, 33, 44  # stack ids: used by old events only, old and new, new only, none


def _events(store: Store, rows: list[tuple[int, int | None]]) -> None:
    """rows: (seconds after T0, stack_id or None)."""
    ts = [T0 + t * S for t, _ in rows]
    store.append("events", pa.table({
        "session_id": pa.array([1] * len(rows), pa.int32()),
        "timestamp": pa.array(ts, pa.int64()),
        "pid": pa.array([7] * len(rows), pa.int32()),
        "op": pa.array(["cudaStreamSync"] * len(rows)),
        "stack_id": pa.array([sid for _, sid in rows], pa.int64()),
    }))


def _stack(store: Store, stack_id: int, frames: int) -> None:
    store.append("stacks", pa.table({
        "stack_id": pa.array([stack_id] * frames, pa.int64()),
        "depth": pa.array(list(range(frames)), pa.int32()),
        "function": pa.array([f"f{d}" for d in range(frames)]),
    }))


def _stack_ids(store: Store) -> dict[int, int]:
    return dict(store.con.execute("SELECT stack_id, count(*) FROM stacks GROUP BY stack_id").fetchall())


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "r.duckdb")
    for sid, frames in ((OLD, 3), (BOTH, 2), (NEW, 4), (NEVER, 5)):
        _stack(s, sid, frames)
    # old: t=0..9 s, new: t=100..109 s; None = an event without a stack
    _events(s, [(t, OLD) for t in range(10)] + [(t, BOTH) for t in range(5)] + [(t, None) for t in range(3)])
    _events(s, [(100 + t, BOTH) for t in range(10)] + [(100 + t, NEW) for t in range(10)] + [(105, None)])
    yield s
    s.close()


def test_stacks_only_deleted_events_used_are_pruned_with_their_frames(store: Store) -> None:
    info = Retention(retain_s=50, max_db_bytes=None).apply(store.con, T0 + 110 * S)
    assert info["deleted"]["events"] == 18
    # OLD lost its last event; NEVER never had one; BOTH and NEW are still used
    assert info["deleted"]["stacks"] == 3 + 5
    assert sorted(info["pruned_stack_ids"].tolist()) == [OLD, NEVER]
    assert _stack_ids(store) == {BOTH: 2, NEW: 4}
    assert info["checkpoint"] is True
    # every remaining event's stack still resolves
    dangling = store.con.execute(
        "SELECT count(*) FROM events e WHERE stack_id IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM stacks s WHERE s.stack_id = e.stack_id)").fetchall()[0][0]
    assert dangling == 0


def test_nothing_pruned_when_no_event_was_deleted(store: Store) -> None:
    """Pruning runs only after events were deleted (cheap ticks); NEVER waits for the next one."""
    info = Retention(retain_s=3600, max_db_bytes=None).apply(store.con, T0 + 110 * S)
    assert sum(info["deleted"].values()) == 0 and "stacks" not in info["deleted"]
    assert len(info["pruned_stack_ids"]) == 0
    assert set(_stack_ids(store)) == {OLD, BOTH, NEW, NEVER}


def test_all_events_gone_takes_every_stack(store: Store) -> None:
    store.con.execute("DELETE FROM events")
    frames, ids = prune_stacks(store.con)
    assert frames == 3 + 2 + 4 + 5 and sorted(ids.tolist()) == [OLD, BOTH, NEW, NEVER]
    assert _stack_ids(store) == {}


def _resolver() -> StackResolver:
    """A StackResolver's cache alone (no BPF, no watcher thread): what forget_stacks() works on."""
    r = object.__new__(StackResolver)
    r._lock = threading.RLock()
    r._ids = {(7, 1): OLD, (8, 1): OLD, (7, 2): BOTH, (7, 3): NEW}
    r._stored = {OLD, BOTH, NEW}
    r._retry = {(8, 1), (7, 3)}
    return r


def test_the_resolver_forgets_pruned_stacks_so_a_recurring_site_is_written_again() -> None:
    r = _resolver()
    r.forget_stacks(np.array([OLD, NEVER], dtype=np.int64))
    assert r._ids == {(7, 2): BOTH, (7, 3): NEW}
    assert r._stored == {BOTH, NEW}
    assert r._retry == {(7, 3)}


def test_version_2_file_loses_the_stacks_key_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "v2.duckdb"
    write_old_file(path, version=2)
    store = Store.open(path)
    assert store.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    assert store.con.execute("SELECT stack_id, depth, function FROM stacks ORDER BY depth").fetchall() == [
        (77, 0, "inner"), (77, 1, "outer")]
    kinds = store.con.execute(
        "SELECT constraint_type FROM duckdb_constraints() WHERE table_name = 'stacks' ORDER BY ALL").fetchall()
    assert kinds == [("NOT NULL",), ("NOT NULL",)]  # stack_id, depth; no PRIMARY KEY
    assert store.con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_stacks%'").fetchone() == (0,)
    frames, ids = prune_stacks(store.con)  # no events: the migrated stack goes
    assert (frames, ids.tolist()) == (2, [77])
    store.close()
