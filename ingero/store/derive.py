"""events.in_call / events.queued derived from the stored CUDA calls (schema 5).

Since schema 5 the BPF side tags every sched_switch and page_fault row with
the thread's CUDA state at that moment (bpf/events.h call_op, call_flags).
Rows written before it get the same meaning from SQL over the stored calls,
in one definition used twice:

* the v4 -> v5 migration (``MIGRATION``, run by store/db.py) fills the
  columns of existing rows;
* ``derived_events_view`` gives explain the v5 columns over an older file it
  opened read-only (a TEMP VIEW: nothing is written to the file).

The derivation.  Calls of one thread never overlap in the store (a call made
inside another probed call is not stored), so for a host row at time t the
last call the same thread started at or before t is the only one it can be
inside: ``in_call`` = its op when it ended after t.  Each call leaves the
thread's queued bit set (a launch or async copy that returned 0), cleared (a
sync or synchronous copy, whatever it returned) or as it was; a window over
the thread's calls carries the bit before and after each call, and the host
row takes the "before" state when it is inside the call (the bit changes at
return, as in bpf/cuda.bpf.c) and the "after" state otherwise.  No call
started before t: the thread had made no traced CUDA call, queued is NULL.

Where it differs from what BPF records: a call whose return was never seen
(longjmp, exception: sessions.stale_calls) has no row, so rows of the time the
thread was inside it get in_call NULL here, and the call's own entry already
counted as "made a call" for BPF.
"""

from __future__ import annotations

import duckdb

from ingero.events.ops import ASYNC_OPS, CUDA_OP_NAMES, DRAINING_OPS

# Rows that carry the call state (the others keep NULL in both columns).
TAGGED_OPS = ("sched_switch", "page_fault")
CALL_STATE_COLUMNS = ("in_call", "queued")
DEFAULT_VIEW = "ing_events_v5"


def _in_list(ops: object) -> str:
    # Literals, not parameters: a view body cannot hold parameters, and these
    # are the fixed op names of events/ops.py, never user input.
    return "(" + ", ".join(f"'{name}'" for name in sorted(ops)) + ")"  # type: ignore[call-overload]


# The calls carry their op as a 1-byte index into this list, named again on the
# matched rows only: sorting and joining ~7 M strings cost ~20% of the whole.
_CUDA_LIST = "[" + ", ".join(f"'{name}'" for name in CUDA_OP_NAMES) + "]"


def _tagged_sql(where: str, host_columns: str) -> str:
    """SELECT of ``host_columns``, in_call, queued for every tagged row of ``events`` matching ``where``.

    Threads are told apart by (session_id, tid): thread ids are unique host-wide
    while the thread lives (a tid reused by a later thread of the same session
    would inherit the earlier one's calls here, where BPF starts it afresh).
    """
    return f"""
WITH calls AS (
    SELECT session_id, tid, timestamp, timestamp + coalesce(duration_ns, 0) AS end_ns,
           list_position({_CUDA_LIST}, op)::UTINYINT AS op_index,
           CASE WHEN op IN {_in_list(ASYNC_OPS)} AND ret = 0 THEN TRUE
                WHEN op IN {_in_list(DRAINING_OPS)} THEN FALSE END AS effect
    FROM events WHERE {where} AND op IN {_in_list(CUDA_OP_NAMES)}
), state AS (
    SELECT *, coalesce(last_value(effect IGNORE NULLS) OVER (
               PARTITION BY session_id, tid ORDER BY timestamp
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), FALSE) AS q_before
    FROM calls
), host AS (
    SELECT {host_columns} FROM events e WHERE {where} AND op IN {_in_list(TAGGED_OPS)}
)
SELECT h.*,
       CASE WHEN c.end_ns > h.timestamp THEN {_CUDA_LIST}[c.op_index] END AS in_call,
       CASE WHEN c.timestamp IS NULL THEN NULL
            WHEN c.end_ns > h.timestamp THEN c.q_before
            ELSE coalesce(c.effect, c.q_before) END AS queued
FROM host h
ASOF LEFT JOIN state c ON h.session_id = c.session_id AND h.tid = c.tid AND h.timestamp >= c.timestamp
"""


def _fill_sql(where: str) -> str:
    """UPDATE setting in_call and queued of the tagged rows matching ``where``."""
    return f"""
UPDATE events SET in_call = d.in_call, queued = d.queued
FROM ({_tagged_sql(where, "rowid AS rid, session_id, pid, tid, timestamp")}) d
WHERE events.rowid = d.rid
"""


# The v4 -> v5 migration after the two ALTER TABLEs: fills the tagged rows of every session.
MIGRATION = _fill_sql("TRUE")


def fill_call_state(con: duckdb.DuckDBPyConnection, session_id: int) -> int:
    """Set in_call and queued of session ``session_id``'s sched_switch / page_fault rows from its CUDA calls.

    For rows written without them on a schema 5 store (synthetic replays, imports): the
    migration's SQL for one session.  Returns the rows set.
    """
    row = con.execute(_fill_sql("session_id = $sid"), {"sid": int(session_id)}).fetchone()
    return int(row[0]) if row else 0


def has_call_state(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the connection's ``events`` table has the schema 5 columns in_call and queued."""
    return set(CALL_STATE_COLUMNS) <= set(_events_columns(con))


def _events_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The events table's columns in order.  pragma_table_info of the one table: ~2 ms,
    where information_schema.columns (every column of every table) took ~34 on a fresh connection."""
    return [r[0] for r in con.execute("SELECT name FROM pragma_table_info('events') ORDER BY cid").fetchall()]


def derived_events_view(con: duckdb.DuckDBPyConnection, session_id: int, name: str = DEFAULT_VIEW) -> str:
    """Create TEMP VIEW ``name``: the rows of ``session_id`` with the columns of a schema 5 ``events``.

    in_call and queued are derived from the stored CUDA calls (the migration's
    SQL); every other column is the stored one.  Works on a read-only
    connection.  Returns ``name``.
    """
    if not name.isidentifier():
        raise ValueError(f"not a view name: {name!r}")
    # int(): the session id goes into the view body as a literal (views take no parameters)
    where = f"session_id = {int(session_id)}"
    cols = [c for c in _events_columns(con) if c not in CALL_STATE_COLUMNS]
    plain = ", ".join(f'e."{c}"' for c in cols)
    con.execute(f"""
CREATE OR REPLACE TEMP VIEW {name} AS
SELECT {plain}, NULL::VARCHAR AS in_call, NULL::BOOLEAN AS queued
FROM events e WHERE {where} AND e.op NOT IN {_in_list(TAGGED_OPS)}
UNION ALL
SELECT * FROM ({_tagged_sql(where, plain)})
""")
    return name


def events_relation(con: duckdb.DuckDBPyConnection, session_id: int) -> str:
    """What to read events from: ``events`` on a schema 5 file, else a derived view of ``session_id``."""
    return "events" if has_call_state(con) else derived_events_view(con, session_id)
