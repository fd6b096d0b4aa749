"""What `ingero status` reports, computed from the store.

The same function serves both sides: the running tracer answers
``{"op": "status"}`` with it (on a cursor of its own connection), and
``ingero status`` uses it on a read-only open of the file when no tracer is
running (then it describes the last session: closed or crashed).
"""

from __future__ import annotations

import time
from typing import Any

import duckdb

from ingero.host import pid_alive
from ingero.store.files import db_file_of, file_sizes
from ingero.store.sessions import latest_session

# events/s is measured over the last RATE_WINDOW_S seconds of event
# timestamps.  The writer flushes every <= 1 s, so the newest second is
# partly missing: the window ends FLUSH_LAG_S before now.
RATE_WINDOW_S = 10.0
FLUSH_LAG_S = 1.0



# The session fields status reports (a column an older file lacks reads as None).
_SESSION_COLS = ("session_id", "started_ns", "ended_ns", "status", "hostname", "command",
                 "targets", "tracer_pid", "heartbeat_ns", "events", "drops_kernel", "drops_user",
                 "stale_calls", "probe_misses")


def collect_status(con: duckdb.DuckDBPyConnection, *, tracer_pid: int | None = None,
                   now_ns: int | None = None) -> dict[str, Any]:
    """Status of the session written by ``tracer_pid`` (the daemon itself), else of the last session.

    ``running`` is True only when asked on behalf of a live tracer (tracer_pid given and its
    session is 'running').  A 'running' row whose tracer is dead is reported as 'crashed'.
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    if tracer_pid is not None:
        row = latest_session(con, "tracer_pid = $pid AND status = 'running'", {"pid": tracer_pid})
    else:
        row = latest_session(con)
    db_path = db_file_of(con)
    db_bytes, wal_bytes = file_sizes(db_path)
    out: dict[str, Any] = {
        "running": False,
        "source": "daemon" if tracer_pid is not None else "database",
        "db_path": str(db_path) if db_path else None,
        "db_bytes": db_bytes,
        "wal_bytes": wal_bytes,
        "session": None,
    }
    if row is None:
        return out
    s = {c: row.get(c) for c in _SESSION_COLS}
    status = s["status"]
    if status == "running" and tracer_pid is None and (s["tracer_pid"] is None or not pid_alive(int(s["tracer_pid"]))):
        status = "crashed"
    stored = con.execute(
        "SELECT count(*) FROM events WHERE session_id = $sid", {"sid": s["session_id"]}
    ).fetchall()[0][0]
    end_ns = now_ns if status == "running" else (s["ended_ns"] or s["heartbeat_ns"] or now_ns)
    rate = None
    if status == "running" and tracer_pid is not None:
        hi = now_ns - int(FLUSH_LAG_S * 1e9)
        # a young session has less than a full window behind it
        window_s = max(1e-3, min(RATE_WINDOW_S, (hi - s["started_ns"]) / 1e9))
        lo = hi - int(window_s * 1e9)
        n = con.execute(
            "SELECT count(*) FROM events WHERE session_id = $sid AND timestamp >= $lo AND timestamp < $hi",
            {"sid": s["session_id"], "lo": lo, "hi": hi},
        ).fetchall()[0][0]
        rate = n / window_s
        out["running"] = True
    out["session"] = {
        **s,
        "status": status,
        "events": max(int(s["events"] or 0), int(stored)),
        "events_stored": int(stored),
        "events_per_s": rate,
        "rate_window_s": RATE_WINDOW_S,
        "duration_s": max(0.0, (end_ns - s["started_ns"]) / 1e9),
        # how stale the last flush is: after a crash, roughly what was lost
        "heartbeat_age_s": (now_ns - s["heartbeat_ns"]) / 1e9 if s["heartbeat_ns"] else None,
    }
    return out
