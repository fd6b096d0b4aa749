"""events.op / events.in_call as an ENUM (schema 11): every documented query reads the same.

The documented queries (README's ```sql blocks and `ingero query "..."` lines,
docs/schema.md's SELECT examples) and the comparisons the schema promises
(=, LIKE, IN, a name that is no op, SELECT, GROUP BY, ORDER BY) run on a store
made by today's schema (ENUM) and on one whose events table has VARCHAR op
and in_call (a file recorded before schema 11, which the migration leaves as
it is), with the same rows: the results must be equal.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from old_schemas import old_schema

from bench.bench_ingest import _realistic
from ingero.collect import decode
from ingero.events import ops
from ingero.store.db import MIGRATIONS, SCHEMA_VERSION, Store, schema_sql

ROOT = Path(__file__).resolve().parents[2]
OFFSET = 1_700_000_000 * 10**9

PROMISED = [
    "SELECT count(*) FROM events WHERE op = 'sched_switch'",
    "SELECT count(*) FROM events WHERE op LIKE 'cuda%'",
    "SELECT count(*) FROM events WHERE op IN ('cudaMemcpy', 'cudaStreamSync', 'no_such_op')",
    "SELECT count(*) FROM events WHERE op = 'no_such_op'",
    "SELECT count(*) FROM events WHERE op <> 'cudaLaunchKernel'",
    "SELECT op, count(*) FROM events GROUP BY op ORDER BY op",
    "SELECT DISTINCT op FROM events ORDER BY op DESC",
    "SELECT op, in_call, count(*) FROM events WHERE in_call IS NOT NULL GROUP BY ALL ORDER BY ALL",
    "SELECT count(*) FROM events WHERE in_call = 'cudaStreamSync'",
    "SELECT op || ':' || coalesce(kind, '') AS k, count(*) FROM events GROUP BY k ORDER BY k",
    "SELECT upper(op), length(op) FROM events GROUP BY ALL ORDER BY ALL",
    "SELECT count(*) FROM events WHERE list_contains(['cudaMemcpyAsync', 'page_fault'], op)",
    "SELECT op FROM events ORDER BY timestamp, op LIMIT 20",
    "SELECT kind, count(*) FROM events WHERE kind IN ('H2D', 'preempted', 'nope') GROUP BY kind ORDER BY kind",
    "SELECT count(*) FROM events WHERE kind = 'sleep' AND op = 'sched_switch'",
    "SELECT op, kind, count(*) FROM events GROUP BY ALL ORDER BY ALL",
]


def documented_queries() -> list[str]:
    schema = (ROOT / "docs" / "schema.md").read_text()
    found = []
    # docs/fleet.md's queries read the fleet dataset (its own tables), not a store
    for doc in [ROOT / "README.md", *sorted(d for d in (ROOT / "docs").glob("*.md") if d.name != "fleet.md")]:
        text = doc.read_text()
        found += [q.strip().rstrip(";") for q in re.findall(r"```sql\n(.*?)```", text, re.S)]
        found += re.findall(r'ingero query "([^"]+)"', text)
    found += [m.strip() for m in re.findall(r"(SELECT [^\n`]*?FROM [^\n`]*?)(?:\n|$|`)", schema)]
    return found


def test_the_documented_queries_are_found():
    qs = documented_queries()
    assert any("e.op = 'sched_switch'" in q for q in qs)
    assert any("GROUP BY op" in q for q in qs)
    assert any("process_history" in q for q in qs)


def _fill(store: Store) -> None:
    recs = _realistic(20_000)
    recs["ts_ns"] = (10**12 + np.arange(len(recs)) * 1_000_000).astype(np.uint64)
    store.append("events", decode.events_table(decode.storage_order(recs), session_id=1, offset_ns=OFFSET))
    store.con.execute("INSERT INTO process_names (pid, name) VALUES (4300, 'python3 (worker)'), (911, 'stress')")
    store.con.execute("INSERT INTO process_history (pid, from_ns, name) VALUES (4242, 0, 'python3 (train.py)')")


@pytest.fixture(scope="module")
def stores():
    enum = Store.memory()
    assert "ENUM" in enum.con.execute("SELECT data_type FROM information_schema.columns "
                                      "WHERE table_name = 'events' AND column_name = 'op'").fetchall()[0][0]
    old = Store.memory()
    # the same DB with events as schema 10 made it: drop it and create the VARCHAR one
    old.con.execute("DROP TABLE events")
    ddl = old_schema(10)
    events_ddl = re.search(r"CREATE TABLE IF NOT EXISTS events \(.*?\n\);", ddl, re.S).group(0)
    assert "op VARCHAR NOT NULL" in events_ddl and "in_call VARCHAR" in events_ddl and "kind VARCHAR" in events_ddl
    old.con.execute(events_ddl)
    for stmt in MIGRATIONS[15]:  # the columns added since, as that migration adds them
        old.con.execute(stmt)
    for s in (enum, old):
        _fill(s)
    return enum, old


@pytest.mark.parametrize("query", PROMISED + documented_queries())
def test_query_reads_the_same_on_enum_and_varchar(stores, query):
    enum, old = stores
    params = {"p": 4242, "t": 10**19} if "$p" in query else None
    a = enum.con.execute(query, params).fetchall()
    b = old.con.execute(query, params).fetchall()
    if "ORDER BY" not in query.upper():  # rows of a GROUP BY come in no set order
        a, b = sorted(a, key=repr), sorted(b, key=repr)
    assert a == b
    assert a, "a documented query that returns nothing here compares nothing"


def test_the_enum_is_ops_vocabulary_sorted():
    m = re.search(r"CREATE TYPE IF NOT EXISTS OP_NAME AS ENUM \((.*?)\);", schema_sql(), re.S)
    # NVTX records become spans rows (collect/nvtx.py), never events rows: not in events.op's ENUM
    stored = set(ops.OP_NAMES.values()) - {ops.OP_NAMES[o] for o in ops.NVTX_OPS}
    assert re.findall(r"'([^']+)'", m.group(1)) == sorted(stored)


def test_the_kind_enum_is_the_records_vocabulary_sorted():
    m = re.search(r"CREATE TYPE IF NOT EXISTS EVENT_KIND AS ENUM \((.*?)\);", schema_sql(), re.S)
    assert re.findall(r"'([^']+)'", m.group(1)) == sorted(set(k for k in decode._KIND_DICT.to_pylist() if k))


def test_old_files_keep_varchar_and_still_take_rows(tmp_path):
    """The v10 -> v11 migration adds tables, never rewrites events: appends still work."""
    from old_schemas import write_old_file

    path = tmp_path / "v10.duckdb"
    write_old_file(path, version=10)
    store = Store.open(path)
    assert store.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [
        (str(SCHEMA_VERSION),)]
    assert store.con.execute("SELECT data_type FROM information_schema.columns WHERE table_name = 'events' "
                             "AND column_name = 'op'").fetchall() == [("VARCHAR",)]
    _fill(store)
    assert store.con.execute("SELECT count(*) FROM events WHERE op = 'sched_switch'").fetchall()[0][0] > 0
    store.close()
