"""Readable process identities for chain text and fixes: names, command lines."""

from __future__ import annotations

import os
from dataclasses import dataclass

import duckdb


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str  # 'python3 (train.py)', else comm, else 'pid N'
    comm: str
    cmdline: str  # '' when unknown
    known: bool = False  # has a process_names row
    ppid: int | None = None  # parent pid (None: unknown, older databases)

    def child_of(self, parent: int) -> bool:
        """A child of ``parent`` (a DataLoader worker of the training process)."""
        return self.ppid is not None and self.ppid == parent and parent != self.pid

    def role(self, parent: int) -> str:
        """``name`` plus ", worker (child of PID N)" when it is a child of ``parent``."""
        return f"{self.name}, worker (child of PID {parent})" if self.child_of(parent) else self.name

    @property
    def label(self) -> str:
        return f"{self.name} (PID {self.pid})"

    @property
    def command(self) -> str:
        """What a user would type to start it again (for taskset fixes), shortened to
        program + script + '…' when the full command line would not fit on a line."""
        if not self.cmdline:
            return self.comm or self.name
        if len(self.cmdline) <= MAX_COMMAND_CHARS:
            return self.cmdline
        argv = self.cmdline.split()
        head = [os.path.basename(argv[0])]
        for arg in argv[1:]:
            head.append(os.path.basename(arg) if "/" in arg else arg)
            if not arg.startswith("-"):
                break
        return " ".join(head) + " …"

    @property
    def is_kernel_thread(self) -> bool:
        """Kernel threads have no command line (and cannot be reniced usefully)."""
        return self.known and not self.cmdline


# Longer command lines are shortened in fix text (the PID is given too).
MAX_COMMAND_CHARS = 100

NAMES_SQL = """
SELECT p.pid, n.name, coalesce(n.comm, c.comm) AS comm, n.cmdline, n.pid IS NOT NULL AS known, {ppid} AS ppid
FROM (SELECT unnest($pids) AS pid) p
LEFT JOIN process_names n ON n.pid = p.pid
LEFT JOIN (SELECT pid, any_value(comm) AS comm FROM process_cpu
           WHERE list_contains($pids, pid) GROUP BY pid) c ON c.pid = p.pid
"""


# duckdb_columns() lists every column of every table (the window tables
# too): ~4 ms a call, 30 ms on a fresh connection, and explain asks on every
# name lookup.  One table's columns cost ~1 ms; it must exist first (a
# missing table is an error, and an error aborts the read transaction the
# daemon runs explain in).
HAS_TABLE_SQL = "SELECT count(*) FROM duckdb_tables() WHERE table_name = $table"
HAS_COLUMN_SQL = "SELECT count(*) FROM pragma_table_info($table) WHERE name = $column"


def has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """Older databases lack newer columns/tables: rules degrade instead of failing."""
    if not con.execute(HAS_TABLE_SQL, {"table": table}).fetchone()[0]:
        return False
    return bool(con.execute(HAS_COLUMN_SQL, {"table": table, "column": column}).fetchone()[0])


def lookup(con: duckdb.DuckDBPyConnection, pids: list[int]) -> dict[int, Proc]:
    pids = sorted({int(p) for p in pids})
    if not pids:
        return {}
    sql = NAMES_SQL.format(ppid="n.ppid" if has_column(con, "process_names", "ppid") else "NULL::INTEGER")
    out: dict[int, Proc] = {}
    for pid, name, comm, cmdline, known, ppid in con.execute(sql, {"pids": pids}).fetchall():
        comm = (comm or "").strip()
        label = name or comm or (f"pid {pid}" if pid else "idle")
        out[int(pid)] = Proc(int(pid), label, comm, (cmdline or "").strip(), bool(known),
                             int(ppid) if ppid is not None else None)
    return out
