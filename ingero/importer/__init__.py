"""``ingero import``: PyTorch-profiler (Kineto) traces into the store, one session per file.

``import_trace(store, path)`` stages the trace's events (raw.py: DuckDB's JSON
reader, a streaming fallback), then in one transaction writes a sessions row
(imported_from, rank, world size, device properties, what was not used), the
CUDA calls as ``events`` with the tracer's op names, the device's kernels,
copies and memsets as ``device_activity``, and CPU operators and annotations
as ``spans`` (load.py).  Any error leaves the store as it was.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from ingero import __version__
from ingero.errors import IngeroError, first_line
from ingero.importer import load, raw
from ingero.store.db import Store

# Bounds DuckDB's own memory while it reads a large trace; the rest spills to its temp directory.
MEMORY_LIMIT = "1GB"


@dataclass
class ImportResult:
    session_id: int
    path: Path
    calls: int
    device: int
    spans: int
    pids: list[int]
    started_ns: int | None
    ended_ns: int | None
    rank: int | None
    world_size: int | None
    devices: list[str]
    unused: dict[str, int] = field(default_factory=dict)
    joined: Any = None  # join.Alignment when attached to a traced session


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _base_ns(meta: dict[str, Any]) -> int:
    """baseTimeNanoseconds: newer Kineto writes ts relative to it (0: ts are epoch microseconds)."""
    base = meta.get("baseTimeNanoseconds")
    if isinstance(base, str) and base.isdigit():
        base = int(base)
    return base if isinstance(base, int) and not isinstance(base, bool) else 0


def import_trace(store: Store, path: Path | str, *, calls_only: bool = False, command: str = "ingero import",
                 join: bool = True) -> ImportResult:
    """Import one trace file into ``store``; raises IngeroError for bad input (nothing written).

    With ``join`` (the default), a session `ingero trace` recorded of the same process gets the
    trace's device timeline and spans instead of a new session (join.py aligns the clocks).
    """
    path = Path(path)
    con = store.con
    con.execute("SET memory_limit = $m", {"m": MEMORY_LIMIT})
    con.execute("SET preserve_insertion_order = false")
    try:
        meta = raw.stage(con, path)
        counts = load.prepare(con, base_ns=_base_ns(meta), calls_only=calls_only)
        if counts.calls + counts.device + counts.spans == 0:
            raise IngeroError(f"{path} has no events ingero can use (no CUDA calls, device activity or CPU operators)",
                              "pass a torch.profiler trace recorded with activities=[CPU] and/or [CUDA]")
        dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
        props = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
        result = ImportResult(
            session_id=0, path=path, calls=counts.calls, device=counts.device, spans=counts.spans,
            pids=counts.pids, started_ns=counts.started_ns, ended_ns=counts.ended_ns,
            rank=_int_or_none(dist.get("rank")), world_size=_int_or_none(dist.get("world_size")),
            devices=[str(d.get("name")) for d in props if isinstance(d, dict) and d.get("name")],
            unused=counts.unused)
        alignment = None
        if join:
            from ingero.importer import join as joiner

            alignment = joiner.align(con, counts.pids)
        load.matched_calls(con, alignment.pairs if alignment is not None else [])
        try:
            with store.transaction():
                if alignment is not None:
                    session_id, offset = alignment.session_id, alignment.offset_ns
                    _mark_joined(con, session_id, path, meta, counts, offset)
                    # the traced session has the calls already: only the device timeline and spans come in
                    load.insert(con, session_id, offset_ns=offset, calls_only=calls_only, calls=False)
                else:
                    session_id = _insert_session(con, path, meta, counts, command)
                    load.insert(con, session_id, offset_ns=0, calls_only=calls_only)
                    if counts.names:
                        store.upsert_process_names([
                            {"pid": pid, "name": name, "comm": name[:15], "cmdline": None,
                             "session_id": session_id, "seen_ns": counts.ended_ns}
                            for pid, name in counts.names.items() if pid is not None])
        except duckdb.Error as exc:
            raise IngeroError(f"cannot import {path}: {first_line(exc)}",
                              "free disk space, or pass --db with another path") from None
        result.session_id = session_id
        result.joined = alignment
        return result
    finally:
        load.cleanup(con)


def _session_fields(path: Path, meta: dict[str, Any], counts: load.Counts) -> dict[str, Any]:
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    props = meta.get("deviceProperties")
    return {
        "src": str(path.resolve()),
        "rank": _int_or_none(dist.get("rank")),
        "ws": _int_or_none(dist.get("world_size")),
        "props": json.dumps(props) if props is not None else None,
        "unused": json.dumps(counts.unused),
    }


def _insert_session(con: duckdb.DuckDBPyConnection, path: Path, meta: dict[str, Any], counts: load.Counts,
                    command: str) -> int:
    session_id = int(con.execute("SELECT coalesce(max(session_id), 0) + 1 FROM sessions").fetchone()[0])
    pids = ", ".join(str(p) for p in counts.pids) or "none"
    host = meta.get("host_name") if isinstance(meta.get("host_name"), str) else None
    con.execute(
        """INSERT INTO sessions (session_id, started_ns, ended_ns, status, hostname, ingero_version, command,
               targets, tracer_pid, heartbeat_ns, events, imported_from, rank, world_size, device_properties,
               import_unused, clock_offset_ns)
           VALUES ($id, $start, $end, 'closed', $host, $ver, $cmd, $targets, $pid, $end, $events, $src, $rank,
                   $ws, $props, $unused, 0)""",
        {"id": session_id, "start": counts.started_ns or 0, "end": counts.ended_ns, "host": host,
         "ver": __version__, "cmd": command, "targets": f"imported trace {path.name} (pid {pids})",
         "pid": os.getpid(), "events": counts.calls, **_session_fields(path, meta, counts)})
    return session_id


def _mark_joined(con: duckdb.DuckDBPyConnection, session_id: int, path: Path, meta: dict[str, Any],
                 counts: load.Counts, offset_ns: int) -> None:
    con.execute(
        """UPDATE sessions SET imported_from = $src, rank = $rank, world_size = $ws, device_properties = $props,
               import_unused = $unused, clock_offset_ns = $offset WHERE session_id = $id""",
        {"id": session_id, "offset": offset_ns, **_session_fields(path, meta, counts)})
