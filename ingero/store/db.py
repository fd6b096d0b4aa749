"""The DuckDB store: where the DB lives, opening it, appending, sessions.

The only module that runs DDL (from schema.sql, next to it).  Writers append
Arrow batches; readers open read-only; SQL typed by a user goes through
``open_for_user_sql`` which has no file, network or extension access and a
locked configuration, because ingero often runs as root.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from ingero import __version__
from ingero.errors import IngeroError, first_line
# re-exported: callers imported them from here before they moved to ingero.host
from ingero.host import group_gid, invoking_user, pid_alive, private_umask, sched_autogroup_enabled  # noqa: F401
from ingero.store import derive
from ingero.store.query import USER_SQL_SETTINGS
from ingero.store.faults import STORAGE_ERRORS, check_room_to_start, is_disk_full, open_error, write_error

if TYPE_CHECKING:  # readers (explain, query, status) never load pyarrow: ~0.17 s per command
    import pyarrow as pa

SCHEMA_VERSION = 17
# The oldest schema a read-only open understands (explain reads older files without migrating them).
MIN_READ_VERSION = 1

# Stands for "run schema.sql again" in a migration: it creates (IF NOT EXISTS)
# a table the migration renamed away, with the DDL of schema.sql, the one source.
REAPPLY_SCHEMA = "-- schema.sql"

# version -> statements that bring a DB from version-1 to it, run in one
# transaction.  Columns are only added (the tables are a public API);
# schema.sql already has them for new DBs.  Changelog:
#   2: sessions.stale_calls (BPF counter CNT_STALE_CALLS).  Sessions recorded
#      before it keep NULL (never counted), new ones start at 0.
#   3: stacks loses its PRIMARY KEY (same columns, same rows): retention
#      deletes from it, ~400x slower with the index (see schema.sql).
#   4: sessions.sched_autogroup (whether renice reaches across sessions on the
#      traced host; explain's CPU-contention fix depends on it).
#   5: events.in_call, events.queued (the thread's CUDA state, tagged by BPF on
#      sched_switch and page_fault rows); existing rows get them derived from
#      the stored CUDA calls (store/derive.py, the same SQL explain uses on a
#      file it reads without migrating).
#   6: sessions.probe_misses (runs of our BPF programs the kernel skipped:
#      losses no ring-buffer counter sees).  NULL for sessions before it.
#   7: device_activity and spans (imported profiler traces), sessions.imported_from,
#      rank, world_size, device_properties, import_unused, clock_offset_ns.
#   8: sessions.notes (what the trace could not see and why, one line each:
#      programs with a stripped CUDA runtime linked in).
#   9: process_history (a process's names over time, one row per exec'd
#      image); older sessions have none, and analyze names them from
#      process_names as before.
#  10: NCCL: events.comm, events.peer (collectives' communicator, send/recv
#      peer or root) and ranks (each process' rank per communicator and its
#      torchrun/Slurm environment).
#  11: windows and window_late_waits: per-second summaries of the events, written
#      at each flush (analyze/summaries/__init__.py); explain reads them instead of the raw
#      rows.  Sessions recorded before it have none and are summarised on the fly.
#  12: sampling (the overhead budget's attached and detached periods).
#  13: sessions.summaries_pending_ns: the tracer writes the windows rows of a few
#      flushes at once; the seconds it still held at its last flush are read from
#      events (a tracer still running, or killed before writing them).
#  14: sessions.call_cost_ns: what tracing one CUDA call costs its thread,
#      calibrated at the trace's start.
#  15: cgroup_cpu: each traced process's cgroup CPU quota and throttling
#      counters, once a second (sample/cgroup.py).  Older sessions have none.
#      device_activity.pid (live traces store the device timeline of every
#      traced process, from CUPTI); rows imported before it keep NULL.
#  16: switch_counts (the overhead budget's counted off-CPU intervals of threads
#      that make no CUDA call).
#  17: sessions.switch_holder: a blocked sched_switch row's other_pid names the
#      process the thread waited behind for a CPU once woken, not who ran next at
#      its switch-out.  NULL for sessions recorded before.
MIGRATIONS: dict[int, list[str]] = {
    2: [
        "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS stale_calls BIGINT",
        "ALTER TABLE sessions ALTER COLUMN stale_calls SET DEFAULT 0",
    ],
    3: [
        "ALTER TABLE stacks RENAME TO _stacks_v2",
        REAPPLY_SCHEMA,
        "INSERT INTO stacks BY NAME SELECT * FROM _stacks_v2",
        "DROP TABLE _stacks_v2",
    ],
    4: ["ALTER TABLE sessions ADD COLUMN IF NOT EXISTS sched_autogroup BOOLEAN"],
    5: [
        "ALTER TABLE events ADD COLUMN IF NOT EXISTS in_call VARCHAR",
        "ALTER TABLE events ADD COLUMN IF NOT EXISTS queued BOOLEAN",
        derive.MIGRATION,
    ],
    6: [
        "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS probe_misses BIGINT",
        "ALTER TABLE sessions ALTER COLUMN probe_misses SET DEFAULT 0",
    ],
    7: [REAPPLY_SCHEMA] + [f"ALTER TABLE sessions ADD COLUMN IF NOT EXISTS {c}" for c in (
        "imported_from VARCHAR", "rank INTEGER", "world_size INTEGER", "device_properties VARCHAR",
        "import_unused VARCHAR", "clock_offset_ns BIGINT")],
    8: ["ALTER TABLE sessions ADD COLUMN IF NOT EXISTS notes VARCHAR"],
    9: [REAPPLY_SCHEMA],  # creates process_history
    10: [
        "ALTER TABLE events ADD COLUMN IF NOT EXISTS comm UBIGINT",
        "ALTER TABLE events ADD COLUMN IF NOT EXISTS peer INTEGER",
        REAPPLY_SCHEMA,  # creates ranks
    ],
    11: [REAPPLY_SCHEMA],  # creates windows, window_late_waits
    12: [REAPPLY_SCHEMA],  # creates sampling (the overhead budget's periods)
    13: ["ALTER TABLE sessions ADD COLUMN IF NOT EXISTS summaries_pending_ns BIGINT"],
    14: ["ALTER TABLE sessions ADD COLUMN IF NOT EXISTS call_cost_ns DOUBLE"],
    15: [f"ALTER TABLE events ADD COLUMN IF NOT EXISTS {c}" for c in (
        "syscall VARCHAR", "wait_fd INTEGER", "fd_target VARCHAR", "waker_pid INTEGER", "waker_tid INTEGER")]
        + ["ALTER TABLE device_activity ADD COLUMN IF NOT EXISTS pid INTEGER"]
        + [REAPPLY_SCHEMA],  # creates thread_names and cgroup_cpu
    16: [REAPPLY_SCHEMA],  # creates switch_counts
    17: ["ALTER TABLE sessions ADD COLUMN IF NOT EXISTS switch_holder BOOLEAN"],
}

DEFAULT_DB_NAME = "ingero.duckdb"



_PARAM = re.compile(r"\$(\w+)")


def named_params(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``params`` that ``sql`` names as $name: DuckDB refuses a statement
    given parameters it does not use, and analyze and export pass one dict to many."""
    names = set(_PARAM.findall(sql))
    return {k: v for k, v in params.items() if k in names}


def default_db_path() -> Path:
    """INGERO_DB, else ~/.ingero/ingero.duckdb of the invoking user (SUDO_USER's home under sudo)."""
    env = os.environ.get("INGERO_DB")
    if env:
        return Path(env).expanduser()
    user = invoking_user()
    home = Path(user.pw_dir) if user else Path.home()
    return home / ".ingero" / DEFAULT_DB_NAME


def _give_to_invoking_user(path: Path) -> None:
    """Under sudo, files we create belong to the user who ran sudo, so they can read them later;
    with an `ingero` group they are group-owned by it (mode 0640 from private_umask)."""
    user = invoking_user()
    gid = group_gid()
    if os.geteuid() != 0 or (user is None and gid is None):
        return
    uid = user.pw_uid if user else -1
    gid = gid if gid is not None else user.pw_gid  # user is not None here
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            os.chown(p, uid, gid)
        except FileNotFoundError:
            pass


def schema_sql() -> str:
    """The DDL of schema.sql, shipped as package data."""
    return resources.files("ingero.store").joinpath("schema.sql").read_text()


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_db_path(path: Path) -> bool:
    """Whether a database file exists at ``path``; refused with one line when ``path`` (or its WAL)
    is a directory, FIFO, device or socket.

    Checked with stat, which never opens the file: DuckDB's open() of a FIFO blocks until a writer
    comes (`explain --db FIFO` hung, deaf to Ctrl-C), and a device node is not ours to write.
    A symlink to a regular file is followed, as DuckDB would.
    """
    for p, what in ((path, "--db"), (path.with_name(path.name + ".wal"), "the WAL of --db")):
        try:
            st = os.stat(p)
        except (FileNotFoundError, NotADirectoryError):
            if p is path:
                return False
            continue
        except PermissionError:
            raise DatabaseUnreadable(path) from None
        except OSError as exc:  # a symlink loop, a name too long
            raise IngeroError(f"cannot use --db {path}: {exc.strerror or exc}", "pass --db with a file path") from None
        if not stat.S_ISREG(st.st_mode):
            raise IngeroError(
                f"{what} {p} is {_kind(st.st_mode)}, not a database file",
                "pass --db with an ingero DuckDB file, or a new path for one",
            )
    return True


def _require_existing(path: Path) -> None:
    """Readers never create a database: a missing file is the user's to fix."""
    if not check_db_path(path):
        raise IngeroError(
            f"no ingero database at {path}",
            "run `sudo ingero trace` (or `ingero demo`) first, or pass --db PATH",
        )


def _remove_created(path: Path) -> None:
    """A database this open created and could not finish (a full disk): removed with its WAL, so
    that no empty or half-written file is left for the next command to refuse."""
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            if stat.S_ISREG(os.lstat(p).st_mode):
                p.unlink()
        except OSError:
            pass


class DatabaseLocked(IngeroError):
    """Another process (a running tracer, usually) holds the file: ask it over its socket."""

    def __init__(self, path: Path, detail: str):
        super().__init__(f"database {path} is locked by another process ({detail})",
                         "while `ingero trace` writes it, query through the running tracer or pass another --db")
        self.path = path


class DatabaseUnreadable(IngeroError):
    """The file exists but this user may not read it (a root tracer's DB, mode 0600/0640)."""

    def __init__(self, path: Path):
        super().__init__(f"permission denied reading {path}",
                         "run as its owner or root, or join the 'ingero' group when the tracer uses it")
        self.path = path


def _raise_open_error(path: Path, exc: Exception) -> None:
    text = first_line(exc)
    if "Could not set lock" in text or "Conflicting lock" in text:
        raise DatabaseLocked(path, text) from None
    if isinstance(exc, PermissionError) or "Permission denied" in text:
        raise DatabaseUnreadable(path) from None
    if is_disk_full(exc):
        raise open_error(exc, path) from None
    raise IngeroError(
        f"cannot open database {path}: {text}",
        "pass --db with an ingero DuckDB file (or remove the damaged file)",
    ) from None


# The marker row in meta that makes a DuckDB file ingero's (schema_version says which format).
FORMAT_KEY, FORMAT_VALUE = "format", "ingero"


def _foreign(path: Path, con: duckdb.DuckDBPyConnection) -> IngeroError | None:
    """None when the file is ingero's (or empty); else the one-line refusal saying what is in it."""
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND NOT internal ORDER BY table_name").fetchall()]
    if not tables:
        return None
    if "meta" in tables:
        keys = {r[0]: r[1] for r in con.execute("SELECT * FROM meta").fetchall() if len(r) >= 2}
        if keys.get(FORMAT_KEY) == FORMAT_VALUE or "schema_version" in keys:
            return None
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return IngeroError(
        f"{path} is not an ingero database: it is another DuckDB file with {len(tables)} "
        f"table{'s' if len(tables) != 1 else ''} ({shown}) and no ingero marker",
        "pass --db with a new path; ingero never writes into another application's database",
    )


@dataclass
class Store:
    """An open ingero database."""

    con: duckdb.DuckDBPyConnection
    path: Path
    read_only: bool
    _old_umask: int | None = None  # a writable open tightens the umask until close()
    _columns: dict[str, list[str]] = field(default_factory=dict)  # table -> its columns, in order

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str | None = None, *, read_only: bool = False) -> "Store":
        """Open (creating and migrating when writable) the store at ``path``."""
        path = Path(path) if path is not None else default_db_path()
        if read_only:
            _require_existing(path)
            try:
                con = duckdb.connect(str(path), read_only=True)
            except duckdb.Error as exc:
                _raise_open_error(path, exc)
            store = cls(con, path, True)
            store._check_version()
            return store
        created = not check_db_path(path)
        # Traces hold every traced process's command line: the DB, and the WAL DuckDB
        # creates again after each checkpoint, are 0600 (0640 with an `ingero` group).
        # Process-wide, since the WAL appears later; an existing file keeps its mode.
        old_umask = os.umask(private_umask())
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if created:
                _give_to_invoking_user(path.parent)
            con = duckdb.connect(str(path))
        except (duckdb.Error, OSError) as exc:
            os.umask(old_umask)
            locked = "lock" in first_line(exc).lower()  # another process made it and holds it: theirs
            if created and not locked:
                _remove_created(path)
            _raise_open_error(path, exc)
        store = cls(con, path, False)
        store._old_umask = old_umask
        foreign = None if created else _foreign(path, con)
        if foreign is not None:
            store.close()
            raise foreign
        try:
            store._apply_schema()
        except BaseException:
            store.close()
            if created:  # we hold it (DuckDB's lock): a new file left without the schema and marker goes
                _remove_created(path)
            raise
        if created:
            _give_to_invoking_user(path)
        return store

    @classmethod
    def memory(cls) -> "Store":
        """A throwaway in-memory store with the schema applied (tests, synthetic replays)."""
        store = cls(duckdb.connect(":memory:"), Path(":memory:"), False)
        store._apply_schema()
        return store

    def _apply_schema(self) -> None:
        try:
            self.con.execute(schema_sql())
        except duckdb.Error as exc:
            if is_disk_full(exc):
                raise open_error(exc, self.path) from None
            raise IngeroError(
                f"{self.path} is not an ingero database ({str(exc).splitlines()[0]})",
                "pass --db with another path",
            ) from None
        row = self.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else 0
        if version == 0:
            self._set_version(SCHEMA_VERSION)
            self._mark()
            return
        if version > SCHEMA_VERSION:
            raise IngeroError(
                f"{self.path} has schema version {version}, newer than this ingero ({SCHEMA_VERSION})",
                "upgrade ingero or pass another --db",
            )
        for v in range(version + 1, SCHEMA_VERSION + 1):
            # one transaction per version: a failed step leaves the file at v - 1, not half-way
            try:
                with self.transaction():
                    for stmt in MIGRATIONS.get(v, []):
                        self.con.execute(schema_sql() if stmt == REAPPLY_SCHEMA else stmt)
                    self._set_version(v)
            except duckdb.Error as exc:
                raise IngeroError(
                    f"cannot upgrade {self.path} from schema version {v - 1} to {v}: {first_line(exc)}",
                    "free disk space, or pass --db with another path",
                ) from None
        self._mark()

    def _mark(self) -> None:
        """The format marker (files from before it have schema_version alone); written once."""
        if not self.con.execute("SELECT 1 FROM meta WHERE key = $k", {"k": FORMAT_KEY}).fetchall():
            self.con.execute("INSERT INTO meta VALUES ($k, $v)", {"k": FORMAT_KEY, "v": FORMAT_VALUE})

    def _set_version(self, version: int) -> None:
        self.con.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', $v)", {"v": str(version)}
        )

    def _check_version(self) -> None:
        foreign = _foreign(self.path, self.con)
        if foreign is not None:
            self.con.close()
            raise foreign
        try:
            row = self.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except duckdb.Error:
            self.con.close()
            raise IngeroError(f"{self.path} is an empty DuckDB file, not an ingero database",
                              "pass --db with a file written by `ingero trace`") from None
        version = int(row[0]) if row else 0
        if version < MIN_READ_VERSION:
            self.con.close()
            raise IngeroError(
                f"{self.path} is an ingero database of an older format (schema version {version}), "
                f"which this ingero reads only after upgrading it",
                f"upgrade it with `sudo ingero trace --db {self.path} --duration 1s`")
        if version > SCHEMA_VERSION:
            raise IngeroError(
                f"{self.path} has schema version {version}, newer than this ingero ({SCHEMA_VERSION})",
                "upgrade ingero",
            )

    @contextmanager
    def user_umask(self) -> Iterator[None]:
        """The umask from before this store tightened it (for a process we start, e.g. --cmd)."""
        if self._old_umask is None:
            yield
            return
        tight = os.umask(self._old_umask)
        try:
            yield
        finally:
            os.umask(tight)

    def close(self) -> None:
        self.con.close()
        if self._old_umask is not None:
            os.umask(self._old_umask)
            self._old_umask = None

    # -- writing -------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Writes in one transaction (one commit); on any error rolled back, never left open."""
        self.con.begin()
        try:
            yield
            self.con.commit()
        except BaseException:
            try:
                self.con.rollback()
            except duckdb.Error:
                pass  # a connection a full disk invalidated has nothing to roll back
            raise

    def append(self, table: str, batch: pa.Table | pa.RecordBatch) -> int:
        """Append an Arrow batch to ``table``, matching columns by name; returns rows added."""
        if batch.num_rows == 0:
            return 0
        if table not in TABLES:
            raise ValueError(f"unknown table {table}")
        if table not in self._columns:
            self._columns[table] = [r[0] for r in self.con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = $t AND schema_name = 'main' "
                "ORDER BY column_index", {"t": table}).fetchall()]
        if batch.schema.names == self._columns[table]:
            # the table's own column order: inserted as it stands, without registering a view or
            # binding by name (~1.5 ms less a statement; the per-flush summaries are a few hundred rows)
            self.con.from_arrow(batch).insert_into(table)
            return batch.num_rows
        self.con.register("_ingero_batch", batch)
        try:
            self.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _ingero_batch")
        finally:
            self.con.unregister("_ingero_batch")
        return batch.num_rows

    def begin_session(self, *, command: str, targets: str) -> int:
        """Insert a 'running' session row and return its id; on a full disk a StorageFault and no row."""
        check_room_to_start(self.path)
        try:
            return self._insert_session(command=command, targets=targets)
        except STORAGE_ERRORS as exc:
            raise open_error(exc, self.path) from None

    def _insert_session(self, *, command: str, targets: str) -> int:
        now = time.time_ns()
        row = self.con.execute("SELECT coalesce(max(session_id), 0) + 1 FROM sessions").fetchone()
        session_id = int(row[0])
        self.con.execute(
            """INSERT INTO sessions (session_id, started_ns, status, hostname, kernel,
                   ingero_version, command, targets, tracer_pid, heartbeat_ns, ncpu, sched_autogroup)
               VALUES ($id, $now, 'running', $host, $kernel, $ver, $cmd, $targets, $pid, $now, $ncpu,
                       $autogroup)""",
            {
                "id": session_id,
                "now": now,
                "host": socket.gethostname(),
                "kernel": platform.release(),
                "ver": __version__,
                "cmd": command,
                "targets": targets,
                "pid": os.getpid(),
                "ncpu": os.cpu_count(),
                "autogroup": sched_autogroup_enabled(),
            },
        )
        return session_id

    def update_session(self, session_id: int, **fields: Any) -> None:
        """Set columns of a session row (events, drops_*, heartbeat_ns, targets ...)."""
        allowed = {"events", "drops_kernel", "drops_user", "stale_calls", "probe_misses", "heartbeat_ns", "targets",
                   "status", "ended_ns", "notes", "summaries_pending_ns", "call_cost_ns",
                   "switch_holder"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"not updatable: {sorted(bad)}")
        sets = ", ".join(f"{k} = ${k}" for k in fields)
        self.con.execute(
            f"UPDATE sessions SET {sets} WHERE session_id = $session_id",
            {**fields, "session_id": session_id},
        )

    def end_session(self, session_id: int, *, events: int, drops_kernel: int, drops_user: int,
                    stale_calls: int = 0, probe_misses: int = 0) -> None:
        now = time.time_ns()
        self.update_session(
            session_id,
            status="closed",
            ended_ns=now,
            heartbeat_ns=now,
            events=events,
            drops_kernel=drops_kernel,
            drops_user=drops_user,
            stale_calls=stale_calls,
            probe_misses=probe_misses,
        )
        self.con.execute("CHECKPOINT")

    def mark_crashed_sessions(self) -> int:
        """Sessions left 'running' by a tracer that is gone are marked 'crashed'."""
        rows = self.con.execute(
            "SELECT session_id, tracer_pid FROM sessions WHERE status = 'running'"
        ).fetchall()
        crashed = [sid for sid, pid in rows if pid is None or not pid_alive(int(pid))]
        try:
            for sid in crashed:
                self.con.execute(
                    "UPDATE sessions SET status = 'crashed' WHERE session_id = $sid", {"sid": sid}
                )
        except duckdb.Error as exc:
            # The first write of a tracer's start: a full disk must be one line, not a traceback.
            raise open_error(exc, self.path) from exc
        return len(crashed)

    def upsert_process_names(self, rows: list[dict[str, Any]]) -> None:
        """rows: pid, name, comm, cmdline, session_id, seen_ns, and ppid and from_ns when known.

        process_names keeps the latest row per pid; each row is also added to
        process_history from ``from_ns`` (the exec time; seen_ns by default)."""
        if not rows:
            return
        import pyarrow as pa

        batch = pa.Table.from_pylist([{"ppid": None, "from_ns": None, **r} for r in rows])
        self.con.register("_ingero_names", batch)
        try:
            self._upsert_names()
        except STORAGE_ERRORS as exc:  # called from the poll loop too, outside the flush's handling
            raise write_error(exc, self.path) from None
        finally:
            self.con.unregister("_ingero_names")

    def _upsert_names(self) -> None:
        self.con.execute(
            """INSERT INTO process_history (session_id, pid, from_ns, name, comm, cmdline, ppid)
               SELECT session_id, pid, coalesce(from_ns, seen_ns), name, comm, cmdline, ppid::INTEGER
               FROM _ingero_names"""
        )
        self.con.execute(
            """INSERT INTO process_names
                   (pid, name, comm, cmdline, ppid, session_id, first_seen_ns, last_seen_ns)
                   SELECT pid, name, comm, cmdline, ppid::INTEGER, session_id, seen_ns, seen_ns FROM _ingero_names
               ON CONFLICT (pid) DO UPDATE SET
                   name = excluded.name, comm = excluded.comm, cmdline = excluded.cmdline,
                   ppid = coalesce(excluded.ppid, process_names.ppid),
                   session_id = excluded.session_id, last_seen_ns = excluded.last_seen_ns"""
        )


TABLES = (
    "meta",
    "sessions",
    "events",
    "process_names",
    "process_history",
    "thread_names",
    "process_cpu",
    "process_memory",
    "stacks",
    "system_metrics",
    "gpu_metrics",
    "probes",
    "device_activity",
    "spans",
    "ranks",
    "windows",
    "window_late_waits",
    "sampling",
    "cgroup_cpu",
    "switch_counts",
)


def open_for_user_sql(path: Path | str | None = None) -> duckdb.DuckDBPyConnection:
    """A read-only connection for SQL typed by a user: no files, network, extensions or SET, and the
    memory and threads of store.query's caps."""
    path = Path(path) if path is not None else default_db_path()
    _require_existing(path)
    try:
        return duckdb.connect(str(path), read_only=True, config=dict(USER_SQL_SETTINGS))
    except duckdb.Error as exc:
        _raise_open_error(path, exc)
        raise  # unreachable: _raise_open_error always raises
