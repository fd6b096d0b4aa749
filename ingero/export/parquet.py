"""Parquet files of a selection: events, processes, the session and explain's chains.

Hive layout, as the fleet work will use: ``DIR/node=<host>/session=<id>/<table>.parquet``,
so ``read_parquet('DIR/**/*.parquet', hive_partitioning = true)`` in DuckDB (or
pandas, Spark, Polars) gets node and session as columns.  Events stream from
DuckDB to the file in record batches (bounded memory).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.export.selection import WHERE, bounded_memory, reader, run
from ingero.store.selection import Selection

ROWS = 262_144

_EVENTS_SQL = f"SELECT * FROM events WHERE {WHERE} ORDER BY timestamp"
# The named processes of a selection: those with events in it and those that ran instead of them
# (a fleet segment publishes the same table).
PROCESSES_SQL = f"""
SELECT * FROM process_names WHERE pid IN (
    SELECT pid FROM events WHERE {WHERE}
    UNION SELECT other_pid FROM events WHERE {WHERE} AND op = 'sched_switch' AND other_pid IS NOT NULL)
ORDER BY pid
"""
_SESSION_SQL = "SELECT * FROM sessions WHERE session_id = $sid"

CHAIN_SCHEMA = pa.schema([
    ("rank", pa.int32()), ("rule_id", pa.string()), ("severity", pa.string()), ("title", pa.string()),
    ("share", pa.float64()), ("impact", pa.float64()), ("correlation", pa.float64()),
    ("pids", pa.list_(pa.int32())), ("culprits", pa.string()),
    ("evidence_windows", pa.list_(pa.struct([("start_ns", pa.int64()), ("end_ns", pa.int64())]))),
    ("root", pa.list_(pa.string())), ("effect", pa.list_(pa.string())), ("fix", pa.list_(pa.string())),
    ("numbers", pa.string()),  # JSON: key numbers of the rule
])


TABLES = ("events", "processes", "sessions", "chains")


def is_ours(root: Path) -> bool:
    """Whether the directory ``root`` holds an export of ours and nothing else: only
    ``node=*/session=*/<table>.parquet`` files, no links, no other files (--force deletes it)."""
    found = False
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        want = ("node=", "session=")
        for d in dirnames:
            if depth >= 2 or not d.startswith(want[depth]) or os.path.islink(os.path.join(dirpath, d)):
                return False
        for name in filenames:
            full = os.path.join(dirpath, name)
            if depth != 2 or name.removesuffix(".parquet") not in TABLES or not name.endswith(".parquet") \
                    or os.path.islink(full):
                return False
            found = True
    return found


def export(con: duckdb.DuckDBPyConnection, sel: Selection, opts: Options, root: Path) -> dict[str, int]:
    """Write the four tables under ``root`` (the chains: explain with ``opts``, the options ``sel``
    was resolved from); return rows per file (relative path -> rows)."""
    params = sel.params()
    host = run(con, "SELECT any_value(hostname) FROM sessions WHERE session_id = $sid", params).fetchall()[0][0]
    part = root / f"node={_safe(host or 'unknown')}" / f"session={sel.session_id}"
    part.mkdir(parents=True)
    rows = {}
    for name, sql in zip(TABLES, (_EVENTS_SQL, PROCESSES_SQL, _SESSION_SQL)):
        rows[f"{part.relative_to(root)}/{name}.parquet"] = _stream(con, sql, params, part / f"{name}.parquet")
    chains = explain(con, opts).chains
    table = pa.Table.from_pylist([chain_row(i, c) for i, c in enumerate(chains, 1)], schema=CHAIN_SCHEMA)
    pq.write_table(table, part / "chains.parquet")
    rows[f"{part.relative_to(root)}/chains.parquet"] = table.num_rows
    return rows


def _stream(con: duckdb.DuckDBPyConnection, sql: str, params: dict, path: Path) -> int:
    n = 0
    with bounded_memory(con):
        batches = reader(con, sql, params, ROWS)
        with pq.ParquetWriter(path, batches.schema, compression="zstd") as w:
            for b in batches:
                w.write_batch(b)
                n += b.num_rows
    return n


def chain_row(rank: int, c) -> dict:
    """A chain as a row of CHAIN_SCHEMA (``rank``: its place in explain's order, from 1)."""
    return {"rank": rank, "rule_id": c.rule_id, "severity": c.severity, "title": c.title,
            "share": c.share, "impact": c.impact, "correlation": c.correlation, "pids": c.pids,
            "culprits": json.dumps([dataclasses.asdict(x) for x in c.culprits]),
            "evidence_windows": [dataclasses.asdict(w) for w in c.evidence_windows],
            "root": c.root, "effect": c.effect, "fix": c.fix, "numbers": json.dumps(c.numbers)}


def _safe(s: str) -> str:
    """A hostname as one path component."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in s)
