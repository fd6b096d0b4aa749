"""Where a store lives on disk and how big it is: the database file and its WAL."""

from __future__ import annotations

from pathlib import Path

import duckdb


def db_file_of(con: duckdb.DuckDBPyConnection) -> Path | None:
    rows = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchall()
    return Path(rows[0][0]) if rows and rows[0][0] else None


def file_sizes(path: Path | None) -> tuple[int, int]:
    """(database file bytes, WAL bytes); 0 for what does not exist."""
    if path is None:
        return 0, 0
    sizes = []
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            sizes.append(p.stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes[0], sizes[1]
