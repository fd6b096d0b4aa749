"""Keeping an always-on tracer's database bounded: by age (--retain) and by size (--max-db).

Called by the session loop on the writer's thread every RETENTION_INTERVAL_S:

    retention = Retention(retain_s=24 * 3600, max_db_bytes=10 * 10**9)
    info = retention.apply(store.con, now_ns)   # {'deleted': {...}, 'checkpoint': bool, ...}

DuckDB never shrinks its file, but after a DELETE and a CHECKPOINT the freed
blocks are reused by later appends.  So the size bound is enforced on the
*used* part (used blocks + WAL) with head-room: when it passes HIGH_WATER of
the bound, the oldest data is dropped until it is under LOW_WATER.  The file
then stops growing at about the bound (measured: see tests/unit/test_retention.py
and the report).
"""

from __future__ import annotations

import os
from typing import Any

import duckdb

from ingero.daemon.state import db_file_of

# Time-series tables pruned by age; all have a `timestamp` column in ns since the epoch.
TIME_TABLES = ("events", "process_cpu", "system_metrics", "gpu_metrics")

# How often the session loop should call apply(): often enough that a 10 GB bound
# is not overrun by minutes of a fast trace (DuckDB takes ~5 M rows/s, about
# 100 MB/s of file here), rare enough that the CHECKPOINT it may do stays cheap.
RETENTION_INTERVAL_S = 10.0

# Prune when used bytes (blocks + WAL) pass HIGH_WATER x bound, down to LOW_WATER x bound.
# The gap is what appends may add before the next apply and the WAL DuckDB keeps
# before its own checkpoint (16 MB by default); 0.2 of a bound leaves room for that
# above ~100 MB.  Measured in test_retention: the file settles near 0.6-0.9 x bound.
HIGH_WATER = 0.8
LOW_WATER = 0.6
# Each round estimates a cutoff from the timestamp distribution; a second or third
# round corrects the estimate when data is unevenly spread in time.
MAX_PRUNE_ROUNDS = 4


def _db_usage(con: duckdb.DuckDBPyConnection) -> tuple[int, int, int]:
    """(used bytes in blocks, file bytes, WAL bytes) of the current database."""
    block_size, total_blocks, used_blocks = con.execute(
        "SELECT block_size, total_blocks, used_blocks FROM pragma_database_size() "
        "WHERE database_name = current_database()"
    ).fetchall()[0]
    path = db_file_of(con)
    wal = 0
    if path is not None:
        try:
            wal = os.stat(str(path) + ".wal").st_size
        except OSError:
            wal = 0
    return int(used_blocks) * int(block_size), int(total_blocks) * int(block_size), wal


def _delete_older(con: duckdb.DuckDBPyConnection, cutoff_ns: int, deleted: dict[str, int]) -> int:
    total = 0
    for table in TIME_TABLES:
        n = con.execute(f"DELETE FROM {table} WHERE timestamp < $cutoff", {"cutoff": cutoff_ns}).fetchall()[0][0]
        deleted[table] = deleted.get(table, 0) + int(n)
        total += int(n)
    # a name is only useful next to that process's events
    n = con.execute("DELETE FROM process_names WHERE last_seen_ns < $cutoff", {"cutoff": cutoff_ns}).fetchall()[0][0]
    deleted["process_names"] = deleted.get("process_names", 0) + int(n)
    return total


class Retention:
    """Age and size bounds for a long-running tracer's DuckDB file."""

    def __init__(self, retain_s: float | None, max_db_bytes: int | None) -> None:
        if retain_s is not None and retain_s <= 0:
            raise ValueError("retain_s must be positive")
        if max_db_bytes is not None and max_db_bytes <= 0:
            raise ValueError("max_db_bytes must be positive")
        self.retain_s = retain_s
        self.max_db_bytes = max_db_bytes

    def apply(self, con: duckdb.DuckDBPyConnection, now_ns: int) -> dict[str, Any]:
        """Delete what is out of bounds; returns deleted rows per table, whether it checkpointed, sizes."""
        deleted: dict[str, int] = {}
        out: dict[str, Any] = {"deleted": deleted, "checkpoint": False, "cutoff_ns": None}
        removed = 0
        if self.retain_s is not None:
            cutoff = now_ns - int(self.retain_s * 1e9)
            out["cutoff_ns"] = cutoff
            removed += _delete_older(con, cutoff, deleted)
        if self.max_db_bytes is not None:
            removed += self._enforce_size(con, deleted, out)
        if removed and not out["checkpoint"]:
            con.execute("CHECKPOINT")  # frees the deleted blocks for reuse
            out["checkpoint"] = True
        used, file_bytes, wal = _db_usage(con)
        out.update(used_bytes=used, file_bytes=file_bytes, wal_bytes=wal)
        return out

    def _enforce_size(self, con: duckdb.DuckDBPyConnection, deleted: dict[str, int], out: dict[str, Any]) -> int:
        assert self.max_db_bytes is not None
        high = HIGH_WATER * self.max_db_bytes
        low = LOW_WATER * self.max_db_bytes
        used, _, wal = _db_usage(con)
        if used + wal <= high:
            return 0
        con.execute("CHECKPOINT")  # fold the WAL into blocks so `used` is what the data takes
        out["checkpoint"] = True
        removed = 0
        for _ in range(MAX_PRUNE_ROUNDS):
            used, _, wal = _db_usage(con)
            if used + wal <= high and removed:
                break
            if used + wal <= low:
                break
            frac = 1.0 - low / (used + wal)
            row = con.execute(
                "SELECT approx_quantile(timestamp, $q), count(*) FROM events", {"q": min(max(frac, 0.0), 1.0)}
            ).fetchall()[0]
            if row[0] is None or row[1] == 0:
                break  # nothing left to prune by time; the rest is schema and metadata
            cutoff = int(row[0]) + 1
            out["cutoff_ns"] = max(out["cutoff_ns"] or 0, cutoff)
            n = _delete_older(con, cutoff, deleted)
            con.execute("CHECKPOINT")
            removed += n
            if n == 0:
                break
        return removed
