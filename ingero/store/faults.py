"""Turning a failed write into one clear line (disk full, file gone, DB invalidated).

Owned by the store, since every writer (the tracer, the synthetic daemon,
the start-up that marks dead sessions) meets the same failures.  The session
loop catches STORAGE_ERRORS (what the disk and the file raise; a schema or
code bug raises something else and keeps its traceback) from Store.append /
update_session and raises ``write_error(exc, db_path)``, a StorageFault.
What was committed before stays readable: every append is its own DuckDB
transaction, written to the WAL before it is acknowledged.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import duckdb

from ingero.errors import IngeroError, first_line

# What a full disk, a removed or unwritable file, or a connection DuckDB invalidated after
# one of those raises: IOException (write/fsync), TransactionException ("Could not write file
# ...wal": the commit), FatalException ("database has been invalidated"), OSError (our files).
STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.IOException, duckdb.TransactionException, duckdb.FatalException, OSError)


class StorageFault(IngeroError):
    """The tracer's storage failed (disk full, file gone): one line; the traced job is not ours to end."""

_DISK_FULL_TEXT = ("No space left on device", "Disk full", "ENOSPC", "could not write all bytes", "Quota exceeded")


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return any(t.lower() in text.lower() for t in _DISK_FULL_TEXT)


def write_error(exc: BaseException, db_path: Path | str) -> StorageFault:
    """The error a tracer stops with when writing to its database fails."""
    if is_disk_full(exc):
        return StorageFault(
            f"stopped writing: the disk holding {db_path} is full; events written before this are kept",
            "free space or pass --max-db to bound the database, then restart `ingero trace`",
        )
    return StorageFault(
        f"stopped writing to {db_path}: {first_line(exc)}; events written before this are kept",
        "check the disk and the file, then restart `ingero trace`",
    )


def open_error(exc: BaseException, db_path: Path | str) -> StorageFault:
    """The error a tracer fails to start with when its first write (marking dead sessions) fails."""
    if is_disk_full(exc):
        return StorageFault(
            f"cannot write to {db_path}: its disk is full",
            "free space (or pick another --db), then run `ingero trace` again",
        )
    return StorageFault(f"cannot write to {db_path}: {first_line(exc)}", "check the disk and the file")


# A session starts only with this much free space: its row, the probe and name rows and
# the WAL of its first flushes must fit.  Below it a start on a full disk wrote a session
# row and died on the next write, leaving a dead row on every try.
MIN_FREE_START_BYTES = 4 << 20


def check_room_to_start(db_path: Path | str) -> None:
    """StorageFault when the file system holding ``db_path`` has too little room for a session to start."""
    try:
        st = os.statvfs(Path(db_path).parent)
    except OSError:
        return  # cannot tell: the writes themselves will say
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_START_BYTES:
        raise StorageFault(
            f"cannot start tracing into {db_path}: its disk has {free >> 20} MiB free, "
            f"a session needs at least {MIN_FREE_START_BYTES >> 20} MiB to start",
            "free space (or pick another --db), then run `ingero trace` again")


def describe_write_error(exc: BaseException, db_path: Path | str) -> str:
    return str(write_error(exc, db_path))
