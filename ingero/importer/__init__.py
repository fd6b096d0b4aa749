"""``ingero import``: PyTorch-profiler (Kineto) traces into the store, one session per input.

``import_trace(store, source)`` reads one input (source.py: a file, standard
input or a pipe, gzip'd or not, within the limits), stages the trace's events
(raw.py: DuckDB's JSON reader, a streaming fallback), then in one transaction
writes a sessions row (imported_from, rank, world size, device properties, what
was not used), the CUDA calls as ``events`` with the tracer's op names, the
device's kernels, copies and memsets as ``device_activity``, and CPU operators
and annotations as ``spans`` (load.py).  Any error leaves the store as it was.

Every torch.profiler format since PyTorch 1.8 is read: the old category names
(Runtime, Kernel, Memcpy, Memset, Operator, Python ...), pids and tids as numbers
or strings ("tid": "1234", "stream 7"), device activity linked to its call by
correlation id or, without one, by external id (load.py).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from ingero import __version__
from ingero.errors import IngeroError, first_line
from ingero.importer import load, raw
from ingero.importer.source import Limits, Source, as_source
from ingero.store.db import Store

# Bounds DuckDB's own memory while it reads a large trace: the staged rows are in a scratch file
# (raw.py), sorts and joins beyond it spill to DuckDB's temp directory.  10 M small events: peak
# RSS 350 MiB at 256MB, 596 at 512MB, 1,088 at 1GB, the same CPU time (docs/benchmarks.md).
MEMORY_LIMIT = "256MB"
META_DEPTH = 32  # deviceProperties / distributedInfo deeper than this are cut (stored as JSON text)


@dataclass
class ImportResult:
    session_id: int
    path: Path  # as given ('-': standard input)
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
    label: str = ""  # the input in messages: its path, or 'standard input'
    name: str = ""  # the input in summaries: its file name, or '-'
    n_pids: int = 0  # processes with calls or spans (pids holds the first load.MAX_PIDS)
    skipped: dict[str, int] = field(default_factory=dict)  # field -> bad numbers skipped
    # joined to a session whose process has a device timeline CUPTI measured live: the trace's
    # device rows (this many) were not stored a second time
    device_measured_live: int = 0


def _int32(v: Any, what: str, skipped: dict[str, int]) -> int | None:
    """A rank or world size: an int in [0, 2^31), else None (a value of another type is counted)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31:
        return v
    if v is not None:
        skipped[what] = skipped.get(what, 0) + 1
    return None


def _base_ns(meta: dict[str, Any], label: str) -> int:
    """baseTimeNanoseconds: newer Kineto writes ts relative to it (0: ts are epoch microseconds).

    Every time of the trace is offset by it: one that is not a time (10^30, "1e999", -5)
    makes the whole trace unreadable, so it is refused (one line), not skipped."""
    if "baseTimeNanoseconds" not in meta:
        return 0
    base = meta["baseTimeNanoseconds"]
    if isinstance(base, str) and base.isascii() and base.isdigit():
        base = int(base)
    elif isinstance(base, float) and base.is_integer():
        base = int(base)
    if isinstance(base, int) and not isinstance(base, bool) and 0 <= base <= load.MAX_NS:
        return base
    shown = repr(base) if len(repr(base)) <= 40 else repr(base)[:40] + "..."
    raise IngeroError(f"{label}: baseTimeNanoseconds {shown} is not a time in ns "
                      f"(it must be a whole number from 0 to {load.MAX_NS})",
                      "the trace is damaged; Kineto writes the epoch time in ns there")


def _json_safe(value: Any, skipped: dict[str, int], depth: int = 0) -> Any:
    """``value`` with non-finite numbers (NaN, 1e999) as null and nesting cut at META_DEPTH, so
    json.dumps gives strict JSON (DuckDB's JSON functions read it) and cannot recurse too deep."""
    if isinstance(value, float) and not math.isfinite(value):
        skipped["deviceProperties"] = skipped.get("deviceProperties", 0) + 1
        return None
    if isinstance(value, (dict, list)) and depth >= META_DEPTH:
        skipped["deviceProperties"] = skipped.get("deviceProperties", 0) + 1
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v, skipped, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v, skipped, depth + 1) for v in value]
    return value


def import_trace(store: Store, source: Source | Path | str, *, calls_only: bool = False,
                 command: str = "ingero import", join: bool = True, limits: Limits | None = None) -> ImportResult:
    """Import one trace (a path, '-' for standard input, or a Source) into ``store``; raises
    IngeroError for bad input (nothing written).

    With ``join`` (the default), a session `ingero trace` recorded of the same process gets the
    trace's device timeline and spans instead of a new session (join.py aligns the clocks).
    """
    src, own = as_source(source, limits)
    try:
        return _import(store, src, calls_only=calls_only, command=command, join=join)
    finally:
        if own:
            src.close()


def _import(store: Store, src: Source, *, calls_only: bool, command: str, join: bool) -> ImportResult:
    path = Path(src.label) if src.label != "standard input" else Path("-")
    con = store.con
    con.execute("SET memory_limit = $m", {"m": MEMORY_LIMIT})
    con.execute("SET preserve_insertion_order = false")
    try:
        meta = raw.stage(con, src)
        counts = load.prepare(con, base_ns=_base_ns(meta, src.label), calls_only=calls_only)
        if counts.calls + counts.device + counts.spans == 0:
            raise IngeroError(f"{src.label} has no events ingero can use "
                              "(no CUDA calls, device activity or CPU operators)",
                              "pass a torch.profiler trace recorded with activities=[CPU] and/or [CUDA]")
        skipped = dict(counts.bad)
        dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
        if "deviceProperties" in meta:
            meta["deviceProperties"] = _json_safe(meta["deviceProperties"], skipped)
        props = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
        result = ImportResult(
            session_id=0, path=path, calls=counts.calls, device=counts.device, spans=counts.spans,
            pids=counts.pids, started_ns=counts.started_ns, ended_ns=counts.ended_ns,
            rank=_int32(dist.get("rank"), "distributedInfo.rank", skipped),
            world_size=_int32(dist.get("world_size"), "distributedInfo.world_size", skipped),
            devices=[str(d.get("name"))[:load.NAME_CHARS] for d in props if isinstance(d, dict) and d.get("name")],
            unused=counts.unused, label=src.label, name=src.name, n_pids=counts.n_pids, skipped=skipped)
        alignment = None
        if join:
            from ingero.importer import join as joiner

            alignment = joiner.align(con, counts.pids)
        load.matched_calls(con, alignment.pairs if alignment is not None else [])
        try:
            with store.transaction():
                if alignment is not None:
                    session_id, offset = alignment.session_id, alignment.offset_ns
                    _mark_joined(con, session_id, src, meta, result, offset)
                    # the traced session has the calls already: only the device timeline and spans come in,
                    # and not the timeline where CUPTI measured it live in the process (on the host's own
                    # clock, every kernel, not a profiled window shifted by the estimated offset): two
                    # copies of each kernel would double every count of what the device ran
                    live = load.measured_live(con, session_id, alignment.pid)
                    load.insert(con, session_id, offset_ns=offset, calls_only=calls_only, calls=False,
                                device=not live)
                    if live:
                        result.device_measured_live, result.device = result.device, 0
                else:
                    session_id = _insert_session(con, src, meta, counts, result, command)
                    load.insert(con, session_id, offset_ns=0, calls_only=calls_only)
                    if counts.names:
                        store.upsert_process_names([
                            {"pid": pid, "name": name, "comm": name[:15], "cmdline": None,
                             "session_id": session_id, "seen_ns": counts.ended_ns}
                            for pid, name in counts.names.items() if pid is not None])
        except duckdb.Error as exc:
            raise IngeroError(f"cannot import {src.label}: {first_line(exc)}",
                              "free disk space, or pass --db with another path") from None
        result.session_id = session_id
        result.joined = alignment
        return result
    finally:
        load.cleanup(con)


def _session_fields(src: Source, meta: dict[str, Any], result: ImportResult) -> dict[str, Any]:
    props = meta.get("deviceProperties")
    unused = {**result.unused, **{f"bad numbers skipped: {k}": n for k, n in result.skipped.items()}}
    return {
        "src": src.stored,
        "rank": result.rank,
        "ws": result.world_size,
        "props": json.dumps(props, allow_nan=False) if props is not None else None,
        "unused": json.dumps(unused),
    }


def _targets(src: Source, counts: load.Counts) -> str:
    shown = counts.pids[:8]
    pids = ", ".join(str(p) for p in shown) or "none"
    if counts.n_pids > len(shown):
        pids += f" and {counts.n_pids - len(shown):,} more"
    return f"imported trace {src.name} (pid {pids})"


def _insert_session(con: duckdb.DuckDBPyConnection, src: Source, meta: dict[str, Any], counts: load.Counts,
                    result: ImportResult, command: str) -> int:
    session_id = int(con.execute("SELECT coalesce(max(session_id), 0) + 1 FROM sessions").fetchone()[0])
    host = meta.get("host_name") if isinstance(meta.get("host_name"), str) else None
    con.execute(
        """INSERT INTO sessions (session_id, started_ns, ended_ns, status, hostname, ingero_version, command,
               targets, tracer_pid, heartbeat_ns, events, imported_from, rank, world_size, device_properties,
               import_unused, clock_offset_ns)
           VALUES ($id, $start, $end, 'closed', $host, $ver, $cmd, $targets, $pid, $end, $events, $src, $rank,
                   $ws, $props, $unused, 0)""",
        {"id": session_id, "start": counts.started_ns or 0, "end": counts.ended_ns,
         "host": host[:load.NAME_CHARS] if host else None,
         "ver": __version__, "cmd": command, "targets": _targets(src, counts),
         "pid": os.getpid(), "events": counts.calls, **_session_fields(src, meta, result)})
    return session_id


def _mark_joined(con: duckdb.DuckDBPyConnection, session_id: int, src: Source, meta: dict[str, Any],
                 result: ImportResult, offset_ns: int) -> None:
    con.execute(
        """UPDATE sessions SET imported_from = $src, rank = $rank, world_size = $ws, device_properties = $props,
               import_unused = $unused, clock_offset_ns = $offset WHERE session_id = $id""",
        {"id": session_id, "offset": offset_ns, **_session_fields(src, meta, result)})
