"""Turning a failed write into one clear line (disk full, file gone, DB invalidated).

Owned by the store, since every writer (the tracer, the synthetic daemon,
the start-up that marks dead sessions) meets the same failures. The session loop catches an exception from Store.append / update_session and
calls ``write_error(exc, db_path)`` to get the IngeroError to stop with.
What was committed before stays readable: every append is its own DuckDB
transaction, written to the WAL before it is acknowledged.
"""

from __future__ import annotations

import errno
from pathlib import Path

from ingero.errors import IngeroError, first_line

_DISK_FULL_TEXT = ("No space left on device", "Disk full", "ENOSPC", "could not write all bytes", "Quota exceeded")


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return any(t.lower() in text.lower() for t in _DISK_FULL_TEXT)


def write_error(exc: BaseException, db_path: Path | str) -> IngeroError:
    """The error a tracer stops with when writing to its database fails."""
    if is_disk_full(exc):
        return IngeroError(
            f"stopped writing: the disk holding {db_path} is full; events written before this are kept",
            "free space or pass --max-db to bound the database, then restart `ingero trace`",
        )
    return IngeroError(
        f"stopped writing to {db_path}: {first_line(exc)}; events written before this are kept",
        "check the disk and the file, then restart `ingero trace`",
    )


def open_error(exc: BaseException, db_path: Path | str) -> IngeroError:
    """The error a tracer fails to start with when its first write (marking dead sessions) fails."""
    if is_disk_full(exc):
        return IngeroError(
            f"cannot write to {db_path}: its disk is full",
            "free space (or pick another --db), then run `ingero trace` again",
        )
    return IngeroError(f"cannot write to {db_path}: {first_line(exc)}", "check the disk and the file")


def describe_write_error(exc: BaseException, db_path: Path | str) -> str:
    return str(write_error(exc, db_path))
