"""Readable process identities for chain text and fixes: names, command lines."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import duckdb


# Every kernel thread is kthreadd or a child of it.
KTHREADD_PID = 2


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
        """kthreadd (PID 2) and its children: no command line, and no renice or taskset fix.

        A missing command line alone does not make one: a process that exited before
        /proc was read has none either (a CPU hog killed before the trace ended), and
        its known parent says it is a user process."""
        if self.pid == KTHREADD_PID or self.ppid == KTHREADD_PID:
            return True
        if self.ppid is not None:
            return False
        return self.known and not self.cmdline  # parent unknown (older databases): all there is


# Longer command lines are shortened in fix text (the PID is given too).
MAX_COMMAND_CHARS = 100

# A pid's name as of a time: its process_history row in effect then (the
# latest from_ns at or before it; the earliest row when the time comes before
# them all), else process_names (databases before schema 9, or a pid never
# named by a tracer that kept history), else the comm process_cpu saw.
NAMES_SQL = """
WITH p AS (SELECT unnest($pids) AS pid),
t AS (SELECT p.pid, {at} AS at_ns FROM p),
h AS (
    SELECT h.pid, coalesce(
        arg_max({{'name': h.name, 'comm': h.comm, 'cmdline': h.cmdline, 'ppid': h.ppid}}, h.from_ns)
            FILTER (WHERE h.from_ns <= t.at_ns),
        arg_min({{'name': h.name, 'comm': h.comm, 'cmdline': h.cmdline, 'ppid': h.ppid}}, h.from_ns)) AS r
    FROM {history} h JOIN t ON h.pid = t.pid
    GROUP BY h.pid
)
SELECT p.pid,
       CASE WHEN h.pid IS NULL THEN n.name ELSE h.r.name END AS name,
       coalesce(CASE WHEN h.pid IS NULL THEN n.comm ELSE h.r.comm END, c.comm) AS comm,
       CASE WHEN h.pid IS NULL THEN n.cmdline ELSE h.r.cmdline END AS cmdline,
       h.pid IS NOT NULL OR n.pid IS NOT NULL AS known,
       CASE WHEN h.pid IS NULL THEN {ppid} ELSE coalesce(h.r.ppid, {ppid}) END AS ppid
FROM p
LEFT JOIN h ON h.pid = p.pid
LEFT JOIN process_names n ON n.pid = p.pid
LEFT JOIN (SELECT pid, any_value(comm) AS comm FROM process_cpu
           WHERE list_contains($pids, pid) GROUP BY pid) c ON c.pid = p.pid
"""
# No history table (a database older than schema 9, opened read-only): no rows.
NO_HISTORY = ("(SELECT NULL::INTEGER AS pid, NULL::BIGINT AS from_ns, NULL AS name, NULL AS comm, "
              "NULL AS cmdline, NULL::INTEGER AS ppid)")

# explain names each process as of the end of its last window with CUDA
# calls in the range (the image that made them: a pyenv shim's python3, not
# its bash), and every other process as of the range's end (a pid reused
# after the range is not named after its later owner).  The row with a NULL
# pid holds the range's end.
AS_OF_SQL = """
CREATE OR REPLACE TEMP TABLE ing_asof AS
SELECT pid, least($t0 + (max(w) + 1) * $wns, $t1) AS at_ns FROM ing_cuda GROUP BY pid
UNION ALL SELECT NULL, $t1
"""
AT_FROM_ASOF = ("coalesce((SELECT a.at_ns FROM ing_asof a WHERE a.pid = p.pid), "
                "(SELECT a.at_ns FROM ing_asof a WHERE a.pid IS NULL))")


def name_as_of_cuda_calls(con: duckdb.DuckDBPyConnection, params: dict) -> None:
    """From now on ``lookup`` on ``con`` names pids as they were when they made CUDA calls.

    ``params``: the window parameters (t0, t1, wns) of the range ing_cuda was built over."""
    con.execute(AS_OF_SQL, {k: params[k] for k in ("t0", "t1", "wns")})
    once = _read_once(con)
    if once is not None:
        once.names = {}  # (named again as of the calls)
        if once.tables is not None:
            once.tables.add("ing_asof")  # (the catalog otherwise as read: not read again, ~0.7 ms)


# duckdb_columns() lists every column of every table (the window tables
# too): ~4 ms a call, 30 ms on a fresh connection, and explain asks on every
# name lookup.  One table's columns cost ~1 ms; it must exist first (a
# missing table is an error, and an error aborts the read transaction the
# daemon runs explain in).
HAS_TABLE_SQL = "SELECT count(*) FROM duckdb_tables() WHERE table_name = $table"
HAS_COLUMN_SQL = "SELECT count(*) FROM pragma_table_info($table) WHERE name = $column"
TABLES_SQL = "SELECT DISTINCT table_name FROM duckdb_tables()"
COLUMNS_SQL = "SELECT name FROM pragma_table_info($table)"


class _ReadOnce:
    """What one explain reads once on its connection: the tables, the columns of each table asked
    about, and each pid's name (as of its CUDA calls: ``lookup`` without ``at_ns``)."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self.tables: set[str] | None = None
        self.columns: dict[str, set[str]] = {}
        self.names: dict[int, Proc] = {}

    def has_table(self, table: str) -> bool:
        if self.tables is None:
            self.tables = {r[0] for r in self.con.execute(TABLES_SQL).fetchall()}
        return table in self.tables

    def has_column(self, table: str, column: str) -> bool:
        if table not in self.columns:
            self.columns[table] = {r[0] for r in self.con.execute(COLUMNS_SQL, {"table": table}).fetchall()}
        return column in self.columns[table]


# One explain asks ~17 times whether a table or column exists (each name lookup: ing_asof,
# process_history, process_names.ppid; rules degrading on older schemas), ~1 ms a probe, and
# looks names up ~3 times, ~8 ms a query however few the pids: ~0.035 CPU-s of `explain --since
# 120s`.  Within ``read_once(con)`` (one explain) the catalog is read once (first by
# summaries.has_summaries, in context.resolve): nothing explain asks about is created or altered
# meanwhile but its own ing_asof, which name_as_of_cuda_calls creates and adds to the read (the
# other ing_* tables it builds are never asked about).  A pid's name does not depend on the
# other pids of the query, so names are kept (explain asks for those of every process in its
# window tables at once).  (A context variable: a daemon runs explains in several threads.)
_READ_ONCE: ContextVar[_ReadOnce | None] = ContextVar("ingero_read_once", default=None)


@contextmanager
def read_once(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    token = _READ_ONCE.set(_ReadOnce(con))
    try:
        yield
    finally:
        _READ_ONCE.reset(token)


def _read_once(con: duckdb.DuckDBPyConnection) -> _ReadOnce | None:
    once = _READ_ONCE.get()
    return once if once is not None and once.con is con else None


def has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """Older databases lack newer columns/tables: rules degrade instead of failing."""
    if not has_table(con, table):
        return False
    once = _read_once(con)
    if once is not None:
        return once.has_column(table, column)
    return bool(con.execute(HAS_COLUMN_SQL, {"table": table, "column": column}).fetchone()[0])


def lookup(con: duckdb.DuckDBPyConnection, pids: list[int], at_ns: int | None = None) -> dict[int, Proc]:
    """Each pid's name, command line and parent as of ``at_ns`` (default: as explain set with
    ``name_as_of_cuda_calls``, else the latest)."""
    pids = sorted({int(p) for p in pids})
    if not pids:
        return {}
    once = _read_once(con) if at_ns is None else None
    if once is None:
        return _lookup(con, pids, at_ns)
    missing = [p for p in pids if p not in once.names]
    if missing:
        once.names.update(_lookup(con, missing, None))
    return {p: once.names[p] for p in pids if p in once.names}


def _lookup(con: duckdb.DuckDBPyConnection, pids: list[int], at_ns: int | None) -> dict[int, Proc]:
    params: dict = {"pids": pids}
    if at_ns is not None:
        at, params["at"] = "$at", int(at_ns)
    elif has_table(con, "ing_asof"):
        at = AT_FROM_ASOF
    else:
        at = "9223372036854775807::BIGINT"  # the latest row
    sql = NAMES_SQL.format(
        at=at,
        history="process_history" if has_table(con, "process_history") else NO_HISTORY,
        ppid="n.ppid" if has_column(con, "process_names", "ppid") else "NULL::INTEGER",
    )
    out: dict[int, Proc] = {}
    for pid, name, comm, cmdline, known, ppid in con.execute(sql, params).fetchall():
        comm = (comm or "").strip()
        label = name or comm or (f"pid {pid}" if pid else "idle")
        out[int(pid)] = Proc(int(pid), label, comm, (cmdline or "").strip(), bool(known),
                             int(ppid) if ppid is not None else None)
    return out


def has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    once = _read_once(con)
    if once is not None:
        return once.has_table(table)
    return bool(con.execute(HAS_TABLE_SQL, {"table": table}).fetchone()[0])


# Ranks of one job share their launcher's run id (TORCHELASTIC_RUN_ID, a Slurm job, a
# rendezvous address) or a communicator.
SAME_RANKS_JOB_SQL = """
SELECT count(*) > 0 FROM ranks a JOIN ranks b
  ON (a.job IS NOT NULL AND a.job = b.job) OR (a.comm_id IS NOT NULL AND a.comm_id = b.comm_id)
WHERE a.pid = $a AND b.pid = $b
"""
MAX_ANCESTRY = 8  # parents followed up from a process (a launcher, a shell, a container's init)


def _ancestors(con: duckdb.DuckDBPyConnection, pid: int) -> list[int]:
    out, seen = [], {pid}
    p = lookup(con, [pid]).get(pid)
    while p is not None and p.ppid and p.ppid not in seen and len(out) < MAX_ANCESTRY:
        out.append(p.ppid)
        seen.add(p.ppid)
        p = lookup(con, [p.ppid]).get(p.ppid)
    return out


def tracer_pid(con: duckdb.DuckDBPyConnection, session_id: int | None) -> int | None:
    """The ingero process that recorded the session: its CPU is the tracer's own cost, never a
    culprit to renice or move (under --cmd it is also the job's parent, so no "same job" either)."""
    if session_id is None:
        return None
    row = con.execute("SELECT tracer_pid FROM sessions WHERE session_id = $s", {"s": session_id}).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def same_job(con: duckdb.DuckDBPyConnection, a: int, b: int) -> bool:
    """Whether ``b`` belongs to ``a``'s job: one descends from the other (DataLoader workers, ranks
    spawned by the script), or both are ranks of one launch (a shared run id or communicator).
    Two scripts a shell or a test harness started side by side are two jobs, traced or not."""
    if a == b:
        return True
    if b in _ancestors(con, a) or a in _ancestors(con, b):
        return True
    return has_table(con, "ranks") and bool(con.execute(SAME_RANKS_JOB_SQL, {"a": a, "b": b}).fetchone()[0])
