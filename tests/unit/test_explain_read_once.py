"""What one explain reads once (procs.read_once) answers as the probes and queries it replaces."""

from __future__ import annotations

from ingero.analyze import procs
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.store.db import Store

import replays


def _store() -> Store:
    return replays.write(Store.memory(), "cpu-contention", 6, "spin", label="read-once")


def test_catalog_read_once_answers_as_the_probes():
    store = _store()
    con = store.con
    asked = [("events", None), ("process_history", None), ("device_activity", None), ("no_such_table", None),
             ("process_names", "ppid"), ("events", "comm"), ("events", "no_such_column"), ("no_such_table", "x")]
    probed = [procs.has_table(con, t) if c is None else procs.has_column(con, t, c) for t, c in asked]
    with procs.read_once(con):
        assert [procs.has_table(con, t) if c is None else procs.has_column(con, t, c) for t, c in asked] == probed
        # another connection is not answered from this one's read
        other = Store.memory()
        assert procs.has_table(other.con, "ing_asof") is False
        other.close()
    store.close()


def test_names_read_once_are_the_names_looked_up_one_by_one():
    store = _store()
    con = store.con
    report = explain(con, Options())  # leaves ing_asof: names as of the CUDA calls
    pids = [int(r[0]) for r in con.execute("SELECT DISTINCT pid FROM events").fetchall()]
    one_by_one = {p: procs.lookup(con, [p])[p] for p in pids}
    with procs.read_once(con):
        assert procs.lookup(con, pids) == one_by_one
        assert procs.lookup(con, pids[:1]) == {pids[0]: one_by_one[pids[0]]}
        assert procs.lookup(con, [pids[0], 999_999])[999_999] == procs.lookup(con, [999_999])[999_999]
    assert report.analysed.processes
    store.close()


def test_ing_asof_is_in_the_read_once_created():
    """explain reads the catalog before it builds ing_asof (summaries.has_summaries, in resolve):
    name_as_of_cuda_calls adds the table to the read, so names are then looked up as of the calls."""
    store = _store()
    con = store.con
    con.execute("CREATE TEMP TABLE ing_cuda (pid INTEGER, w BIGINT)")
    con.execute("INSERT INTO ing_cuda VALUES (1, 0)")
    with procs.read_once(con):
        assert procs.has_table(con, "events") and not procs.has_table(con, "ing_asof")
        procs.name_as_of_cuda_calls(con, {"t0": 0, "t1": 10**9, "wns": 10**9})
        assert procs.has_table(con, "ing_asof") and procs.has_table(con, "events")
    store.close()
