"""`ingero status` as text: the lines for the payload daemon.state.collect_status builds
(the same payload whether the running tracer or the file answered)."""

from __future__ import annotations

import time
from typing import Any

from ingero.render import counts, safe


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _fmt_time(ns: int | None) -> str:
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def lines(st: dict[str, Any]) -> list[str]:
    """Human-readable lines for ``ingero status`` (the command prints them); the targets hold traced
    processes' names and the payload may come from a tracer's socket: each line is sanitised."""
    return [safe.text(line) for line in _lines(st)]


def _lines(st: dict[str, Any]) -> list[str]:
    s = st.get("session")
    size = _fmt_bytes(st["db_bytes"]) + (f" + WAL {_fmt_bytes(st['wal_bytes'])}" if st["wal_bytes"] else "")
    if st.get("source") == "none":
        return [f"ingero: not running; no database at {st['db_path']}",
                "start tracing with `sudo ingero trace` (or pass --db PATH)"]
    if s is None:
        return ["ingero: not running; no sessions recorded", f"database: {st['db_path']} ({size})"]
    if st["running"]:
        head = f"ingero: running (pid {s['tracer_pid']}) since {_fmt_time(s['started_ns'])}, {s['duration_s']:.0f} s"
    elif s["status"] == "crashed":
        head = (f"ingero: not running; last session {s['session_id']} CRASHED (did not close cleanly; "
                f"last flush {_fmt_time(s['heartbeat_ns'])})")
    else:
        head = (f"ingero: not running; last session {s['session_id']} {s['status']} at "
                f"{_fmt_time(s['ended_ns'] or s['heartbeat_ns'])} after {s['duration_s']:.0f} s")
    lines = [head, f"targets: {s['targets'] or '-'}"]
    ev = f"events: {s['events']:,}"
    if s["events_stored"] != s["events"]:
        ev += f" ({s['events_stored']:,} kept after retention)"
    if s["events_per_s"] is not None:
        ev += f", {s['events_per_s']:,.0f}/s over the last {s.get('rate_window_s') or 10:.0f} s"
    lines.append(ev)
    drops = f"drops: {s['drops_kernel'] or 0:,} in kernel, {s['drops_user'] or 0:,} in user space"
    if s.get("stale_calls"):
        drops += "; " + counts.stale_calls_clause(s["stale_calls"])
    if s.get("probe_misses"):
        drops += "; " + counts.probe_misses_clause(s["probe_misses"])
    lines.append(drops)
    lines.append(f"database: {st['db_path']} ({size})")
    return lines
