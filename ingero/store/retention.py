"""Keeping an always-on tracer's database bounded: by age (--retain) and by size (--max-db).

Called by the query daemon's trace hook (daemon/hook.py) on the writer's thread every RETENTION_INTERVAL_S:

    retention = Retention(retain_s=24 * 3600, max_db_bytes=10 * 10**9)
    info = retention.apply(store.con, now_ns)   # {'deleted': {...}, 'checkpoint': bool, ...}

DuckDB never shrinks its file, but after a DELETE and a CHECKPOINT the freed
blocks are reused by later appends.  So the size bound is enforced on the
*used* part (used blocks + WAL) with head-room (see CHECKPOINT_SLACK_BYTES):
the oldest data is dropped in time order.  The file
then stops growing at about the bound (measured: see tests/unit/test_retention.py
and the report).

Stacks (--stack) are not time series: a stack is kept while any event row
refers to it.  Whenever events were deleted, the stacks no event refers to any
more are deleted too, and their ids returned (``info['pruned_stack_ids']``) so
that the running tracer's resolver writes them again if the call site recurs.
"""

from __future__ import annotations

import os
from typing import Any

import duckdb
import numpy as np

from ingero.store.files import db_file_of

# Time-series tables pruned by age; all have a `timestamp` column in ns since the epoch.
TIME_TABLES = ("events", "process_cpu", "system_metrics", "gpu_metrics", "cgroup_cpu", "switch_counts")

# How often the session loop should call apply(): often enough that a 10 GB bound
# is not overrun by minutes of a fast trace (DuckDB takes ~5 M rows/s, about
# 100 MB/s of file here), rare enough that the CHECKPOINT it may do stays cheap.
RETENTION_INTERVAL_S = 10.0

# When used bytes (blocks + WAL) pass bound - slack, the oldest data is dropped
# in time order until they are under that minus another HEADROOM.  slack must
# cover what the file can grow beyond the used bytes, measured on duckdb 2.0
# (scripts in the report): the WAL itself, up to DuckDB's checkpoint_threshold;
# the same data again when a checkpoint writes it into new blocks before old
# ones are freed; and the row groups a checkpoint rewrites after a DELETE (the
# file peaked 4-6 MB above used bytes with bounds of 8-64 MB, about two
# 122,880-row row groups: CHECKPOINT_SLACK_BYTES).  For large bounds
# HEADROOM_FRACTION of the bound dominates and also absorbs the appends made
# between two apply() calls.
HEADROOM_FRACTION = 0.2
CHECKPOINT_SLACK_BYTES = 8 * 10**6
# DuckDB's default WAL size that triggers an automatic checkpoint (16 MiB); the
# connection's actual checkpoint_threshold is read at each apply().  Lowering it
# for small bounds made things worse (a checkpoint per append fragmented the
# file: 39 MB peaks for 20 MB of data), so it is left alone.
DEFAULT_WAL_THRESHOLD_BYTES = 16 << 20
# Below this the WAL and checkpoint slack leave too little room for data
# (64 MB keeps 12-24 MB of data; measured peak of file + WAL: 37.5 MB).
MIN_MAX_DB_BYTES = 64 * 10**6
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


_UNITS = {"bytes": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def _wal_threshold(con: duckdb.DuckDBPyConnection) -> int:
    """DuckDB's checkpoint_threshold in bytes (it reads back as e.g. '16.0 MiB')."""
    text = con.execute("SELECT current_setting('checkpoint_threshold')").fetchall()[0][0]
    try:
        number, unit = str(text).split()
        return int(float(number) * _UNITS[unit.lower()])
    except (ValueError, KeyError):
        return DEFAULT_WAL_THRESHOLD_BYTES


# One anti-join of stacks against events.stack_id, deleting the frames of every
# stack no event refers to.  Cost (bench/bench_retention.py, shared 2-core VM at
# loadavg ~5, duckdb 2.0, one thread, file-backed): 1 M events / 100 k stacks of
# 8 frames, half of the events just deleted -> 400 k frames of 50 k stacks in
# 0.39 s; nothing to delete: 0.06 s.  Only possible without an index on stacks
# (schema 3): with its PRIMARY KEY the same DELETE took 21-35 s.
PRUNE_STACKS_SQL = (
    "DELETE FROM stacks WHERE stack_id IN "
    "(SELECT stack_id FROM stacks ANTI JOIN events USING (stack_id)) RETURNING stack_id"
)


def prune_stacks(con: duckdb.DuckDBPyConnection) -> tuple[int, np.ndarray]:
    """Delete stacks no event refers to: (frames deleted, distinct stack ids deleted)."""
    ids = con.execute(PRUNE_STACKS_SQL).fetchnumpy()["stack_id"]
    ids = np.asarray(ids, dtype=np.int64)
    return len(ids), np.unique(ids)


def _delete_older(con: duckdb.DuckDBPyConnection, cutoff_ns: int, deleted: dict[str, int]) -> int:
    total = 0
    for table in TIME_TABLES:
        n = con.execute(f"DELETE FROM {table} WHERE timestamp < $cutoff", {"cutoff": cutoff_ns}).fetchall()[0][0]
        deleted[table] = deleted.get(table, 0) + int(n)
        total += int(n)
    # spans (NVTX ranges of a traced --cmd, imported annotations) go once they have ended before the cutoff
    n = con.execute("DELETE FROM spans WHERE end_ns < $cutoff", {"cutoff": cutoff_ns}).fetchall()[0][0]
    deleted["spans"] = deleted.get("spans", 0) + int(n)
    # a name is only useful next to that process's events
    n = con.execute("DELETE FROM process_names WHERE last_seen_ns < $cutoff", {"cutoff": cutoff_ns}).fetchall()[0][0]
    deleted["process_names"] = deleted.get("process_names", 0) + int(n)
    return total


class Retention:
    """Age and size bounds for a long-running tracer's DuckDB file."""

    def __init__(self, retain_s: float | None, max_db_bytes: int | None) -> None:
        if retain_s is not None and retain_s <= 0:
            raise ValueError("retain_s must be positive")
        if max_db_bytes is not None and max_db_bytes < MIN_MAX_DB_BYTES:
            raise ValueError(f"max_db_bytes must be at least {MIN_MAX_DB_BYTES // 10**6} MB "
                             "(DuckDB allocates in 256 KB blocks and rewrites row groups on checkpoint)")
        self.retain_s = retain_s
        self.max_db_bytes = max_db_bytes

    def apply(self, con: duckdb.DuckDBPyConnection, now_ns: int) -> dict[str, Any]:
        """Delete what is out of bounds; returns deleted rows per table (stacks: frames), the
        stack ids deleted (``pruned_stack_ids``), whether it checkpointed, sizes."""
        deleted: dict[str, int] = {}
        out: dict[str, Any] = {"deleted": deleted, "checkpoint": False, "cutoff_ns": None}
        removed = 0
        if self.retain_s is not None:
            cutoff = now_ns - int(self.retain_s * 1e9)
            out["cutoff_ns"] = cutoff
            removed += _delete_older(con, cutoff, deleted)
        if self.max_db_bytes is not None:
            removed += self._enforce_size(con, deleted, out)
        out["pruned_stack_ids"] = np.empty(0, dtype=np.int64)
        if deleted.get("events"):
            frames, out["pruned_stack_ids"] = prune_stacks(con)
            deleted["stacks"] = frames
            removed += frames
        if removed and (not out["checkpoint"] or deleted.get("stacks")):
            con.execute("CHECKPOINT")  # frees the deleted blocks for reuse
            out["checkpoint"] = True
        used, file_bytes, wal = _db_usage(con)
        out.update(used_bytes=used, file_bytes=file_bytes, wal_bytes=wal)
        return out

    def _enforce_size(self, con: duckdb.DuckDBPyConnection, deleted: dict[str, int], out: dict[str, Any]) -> int:
        assert self.max_db_bytes is not None
        headroom = max(HEADROOM_FRACTION * self.max_db_bytes, CHECKPOINT_SLACK_BYTES)
        slack = max(headroom, 2 * _wal_threshold(con) + CHECKPOINT_SLACK_BYTES)
        high = self.max_db_bytes - slack
        low = max(high - headroom, high / 2)
        used, _, wal = _db_usage(con)
        if used + wal <= high:
            return 0
        removed = 0
        # Delete first, then CHECKPOINT: checkpointing first would fold the WAL into new
        # blocks before any were freed and grow the file past the bound.
        for _ in range(MAX_PRUNE_ROUNDS):
            total = used + wal
            frac = min(1.0, max(0.0, 1.0 - low / total))
            row = con.execute(
                "SELECT approx_quantile(timestamp, $q::FLOAT), count(*) FROM events", {"q": frac}
            ).fetchall()[0]
            if row[0] is None or row[1] == 0:
                break  # nothing left to prune by time; the rest is schema and metadata
            cutoff = int(row[0]) + 1
            out["cutoff_ns"] = max(out["cutoff_ns"] or 0, cutoff)
            n = _delete_older(con, cutoff, deleted)
            con.execute("CHECKPOINT")  # frees whole row groups' blocks for reuse
            out["checkpoint"] = True
            removed += n
            used, _, wal = _db_usage(con)
            if n == 0 or used + wal <= (low + high) / 2:
                break
        return removed
