"""store.selection.Selection: the filter and its parameters select exactly the rows they say."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ingero.store.db import Store
from ingero.store.selection import Selection

MS = 1_000_000


@pytest.fixture
def con():
    store = Store.memory()
    rows = [dict(session_id=sid, timestamp=t * MS, duration_ns=1, pid=pid, tid=pid, op="cudaMalloc")
            for sid in (1, 2) for pid in (100, 101, 102) for t in range(10)]
    store.append("events", pa.Table.from_pylist(rows))
    return store.con


def count(con, sel: Selection, **kw) -> int:
    return con.execute(f"SELECT count(*) FROM events e WHERE {Selection.where(**kw)}",
                       sel.params(pids=kw.get("pids", True))).fetchone()[0]


def test_session_range_and_pids(con):
    assert count(con, Selection(1, 0, 10 * MS)) == 30
    assert count(con, Selection(1, 2 * MS, 5 * MS)) == 9  # [2, 5) ms: t0 inclusive, t1 exclusive
    assert count(con, Selection(1, 2 * MS, 5 * MS, (101,))) == 3
    assert count(con, Selection(2, 0, 10 * MS, (100, 102))) == 20
    assert count(con, Selection(3, 0, 10 * MS)) == 0


def test_without_pids_and_with_an_alias(con):
    sel = Selection(1, 0, 3 * MS, (101,))
    assert count(con, sel, pids=False) == 9  # the processes part left out on purpose
    assert count(con, sel, alias="e") == 3
    assert Selection.where("e", pids=False) == "e.session_id = $sid AND e.timestamp >= $t0 AND e.timestamp < $t1"
    assert set(sel.params(pids=False)) == {"sid", "t0", "t1"}  # DuckDB refuses parameters a query does not name


def test_whole_is_every_row_of_the_session(con):
    assert count(con, Selection.whole(2)) == 30
    assert count(con, Selection.whole(2, (100,))) == 10
    assert Selection.whole(2).params(limit=5)["limit"] == 5
