"""Readable process identities for chain text and fixes: names, command lines."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str  # 'python3 (train.py)', else comm, else 'pid N'
    comm: str
    cmdline: str  # '' when unknown

    @property
    def label(self) -> str:
        return f"{self.name} (PID {self.pid})"

    @property
    def command(self) -> str:
        """What a user would type to start it again (for taskset / ionice fixes)."""
        return self.cmdline or self.comm or self.name


NAMES_SQL = """
SELECT p.pid, n.name, coalesce(n.comm, c.comm) AS comm, n.cmdline
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
    for pid, name, comm, cmdline in con.execute(NAMES_SQL, {"pids": pids}).fetchall():
        comm = (comm or "").strip()
        label = name or comm or (f"pid {pid}" if pid else "idle")
        out[int(pid)] = Proc(int(pid), label, comm, (cmdline or "").strip())
    return out
