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
SELECT p.pid, n.name, coalesce(n.comm, c.comm) AS comm, n.cmdline, n.pid IS NOT NULL AS known
FROM (SELECT unnest($pids) AS pid) p
LEFT JOIN process_names n ON n.pid = p.pid
LEFT JOIN (SELECT pid, any_value(comm) AS comm FROM process_cpu
           WHERE list_contains($pids, pid) GROUP BY pid) c ON c.pid = p.pid
"""


def lookup(con: duckdb.DuckDBPyConnection, pids: list[int]) -> dict[int, Proc]:
    pids = sorted({int(p) for p in pids})
    if not pids:
        return {}
    out: dict[int, Proc] = {}
    for pid, name, comm, cmdline, known in con.execute(NAMES_SQL, {"pids": pids}).fetchall():
        comm = (comm or "").strip()
        label = name or comm or (f"pid {pid}" if pid else "idle")
        out[int(pid)] = Proc(int(pid), label, comm, (cmdline or "").strip(), bool(known))
    return out
