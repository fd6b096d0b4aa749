"""One segment's tables, read from the local store: what a node publishes for [t0, t0 + segment).

Events are filed by when they ended (timestamp + duration_ns): that is when
the tracer could first store them (a call at its return, an off-CPU interval
when the thread ran again), so a segment closed GRACE after its end holds
every event that ended in it, and each event lands in exactly one segment.
Windows and chains come from one explain over the segment's span with
one-second windows: the per-window summaries are explain's own window table
(ingero.analyze.windows' ing_win), not a second definition of the metrics.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from ingero import __version__
from ingero.analyze import summaries
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.procs import has_table
from ingero.errors import IngeroError
from ingero.events.units import NS
from ingero.export.parquet import PROCESSES_SQL, chain_row
from ingero.export.selection import reader
from ingero.fleet import schema
from ingero.fleet.facts import ClockState, NodeFacts
from ingero.store.db import named_params
from ingero.store.derive import events_relation
from ingero.store.selection import Selection

WINDOW_S = 1.0  # per-second summaries, as the store's own
# An event is looked for this long before the segment it ended in (the longest off-CPU
# interval or call a segment can hold without a scan of the whole session).
LONGEST_EVENT_NS = 3600 * NS

EVENTS_SQL = f"""
SELECT {", ".join(schema.EVENTS.names)} FROM events
WHERE session_id = $sid AND timestamp >= $lo AND timestamp < $t1
  AND timestamp + coalesce(duration_ns, 0) >= $t0 AND timestamp + coalesce(duration_ns, 0) < $t1
"""  # in the store's order (as flushed): sorting them costs more than a segment's writing
WINDOWS_SQL = """
SELECT w.*, $sid AS session_id, $t0 + w.w * $wns AS start_ns, $wns AS window_ns, p.name AS process
FROM ing_win w LEFT JOIN process_names p USING (pid) ORDER BY w.w, w.pid
"""
LOOP_SUMS_SQL = "SELECT sum(wall_ns), sum(cpu_wait_ns), sum(ops_n), sum(launch_n), count(*) FROM ing_win"
# the main loop's first and last active window (start-up and teardown are partial windows)
LOOP_EDGES_SQL = """
SELECT $t0 + min(w) * $wns, $t0 + max(w) * $wns FROM ing_win WHERE pid = $pid AND (launch_n > 0 OR sync_n > 0)
"""
# The segment's rows of the other tables: a Selection of every process ($sid, $t0, $t1).
_RANGE = Selection.where(pids=False)
SUMMARIES_SQL = f"SELECT * FROM {{w}} WHERE {Selection.where(time='start_ns', pids=False)} ORDER BY start_ns"
RANKS_SQL = f"SELECT * FROM ranks WHERE {Selection.where(time='seen_ns', pids=False)} ORDER BY seen_ns"
SPAN_SQL = f"""
SELECT min(timestamp), max(timestamp) FROM events
WHERE {_RANGE}
"""
HOST_SQL = f"""
SELECT avg(cpu_pct), avg(load1) FROM system_metrics
WHERE {_RANGE}
"""
# CPU of every process on the host that is not one the tracer followed (no events of its own).
OTHERS_SQL = f"""
SELECT pid, any_value(comm) AS comm, sum(oncpu_ns) / 1e9 AS cpu_s FROM process_cpu
WHERE {_RANGE}
  AND interval_ns <= 5e9  -- a process' first sample covers its whole life before the trace
  AND pid NOT IN (SELECT DISTINCT pid FROM events WHERE {_RANGE})
GROUP BY pid ORDER BY cpu_s DESC
"""
TOP_OTHERS = 3


@dataclass
class Segment:
    """What one segment publishes: table name -> Arrow tables (one file each, seq 0..)."""

    session_id: int
    start_ns: int
    end_ns: int
    tables: dict[str, list[pa.Table]]
    events: int


def build(con: duckdb.DuckDBPyConnection, session_id: int, t0: int, segment_ns: int, *, facts: NodeFacts,
          clock: ClockState, drops: tuple[int, int], rows_per_file: int) -> Segment:
    t1 = t0 + segment_ns
    sel = Selection(session_id, t0, t1)
    p = sel.params(pids=False, lo=t0 - LONGEST_EVENT_NS)
    tables: dict[str, list[pa.Table]] = {}
    parts, events = [], 0
    rd = con.cursor()  # a streamed relation needs a connection with no result left open (explain leaves some)
    try:
        for batch in reader(rd, EVENTS_SQL, p, rows_per_file):
            t = pa.Table.from_batches([batch])
            # the reader's batches hold at most rows_per_file rows: one file each
            parts.append(schema.conform(t, schema.EVENTS))
            events += t.num_rows
    finally:
        rd.close()
    tables["events"] = parts
    report = _explain(con, sel)
    if report is not None:
        win = _arrow(con, WINDOWS_SQL, {"sid": session_id, "t0": t0, "wns": int(WINDOW_S * NS)})
        tables["windows"] = [schema.conform(win, schema.WINDOWS)] if win.num_rows else []
        rows = [{**chain_row(i, c), "session_id": session_id, "segment_start_ns": t0, "segment_end_ns": t1}
                for i, c in enumerate(report.chains, 1)]
        tables["chains"] = [pa.Table.from_pylist(rows, schema=schema.CHAINS)] if rows else []
        loop_pids = [int(r[0]) for r in con.execute("SELECT pid FROM ing_loop ORDER BY cuda_n DESC").fetchall()]
        loop = con.execute(LOOP_SUMS_SQL).fetchall()[0]
        edges = (con.execute(LOOP_EDGES_SQL, {"t0": report.analysed.start_ns, "wns": int(WINDOW_S * NS),
                                              "pid": loop_pids[0]}).fetchall()[0]
                 if loop_pids else (None, None))
    else:
        tables["windows"], tables["chains"], loop_pids, loop, edges = [], [], [], (None,) * 5, (None, None)
    # the store's per-second summaries (schema 11), when this store has them
    summ = None
    if has_table(con, "windows"):
        # the seconds the tracer has not written yet (summaries.pending_from) made from the events;
        # before its first write its rows are all held: pending, none stored
        stored, pending = summaries.has_summaries(con, session_id), summaries.pending_from(con, session_id)
        if stored or pending is not None:
            w, _ = summaries.relations(con, events_relation(con, session_id), session_id, t0, t1,
                                       summarised=stored, pending=pending)
            summ = _arrow(con, SUMMARIES_SQL.format(w=w), sel.params(pids=False))
    tables["summaries"] = [schema.conform(summ, schema.SUMMARIES)] if summ is not None and summ.num_rows else []
    procs = _arrow(con, PROCESSES_SQL, named_params(PROCESSES_SQL, sel.params()))
    tables["processes"] = [schema.conform(procs, schema.PROCESSES)] if procs.num_rows else []
    ranks = _arrow(con, RANKS_SQL, sel.params(pids=False))
    tables["ranks"] = [schema.conform(ranks, schema.RANKS)] if ranks.num_rows else []
    host = con.execute(HOST_SQL, sel.params(pids=False)).fetchall()[0]
    others = con.execute(OTHERS_SQL, sel.params(pids=False)).fetchall()
    steps = report.steps if report is not None else None
    device = report.device if report is not None else None
    row: dict[str, Any] = {
        "fleet_schema": schema.FLEET_SCHEMA_VERSION, "session_id": session_id,
        "segment_start_ns": t0, "segment_end_ns": t1, "segment_ns": segment_ns, "written_ns": time.time_ns(),
        "hostname": facts.hostname, "kernel": facts.kernel, "ncpu": facts.ncpu, "gpus": facts.gpus,
        "gpu_names": facts.gpu_names, "nvml": facts.nvml or None,
        "clock_offset_ns": clock.offset_ns, "clock_sync": clock.sync, "clock_synced": clock.synced,
        "clock_max_error_us": clock.max_error_us, "clock_est_error_us": clock.est_error_us,
        "events": events, "drops_kernel": drops[0], "drops_user": drops[1],
        "steps": steps.count if steps else None, "step_median_ms": steps.median_ms if steps else None,
        "step_p99_ms": steps.p99_ms if steps else None, "device_busy": device.busy_share if device else None,
        "loop_pids": loop_pids, "loop_wall_ns": loop[0], "loop_cpu_wait_ns": loop[1], "loop_ops": loop[2],
        "loop_launches": loop[3], "loop_windows": loop[4], "loop_first_ns": edges[0], "loop_last_ns": edges[1],
        "host_cpu_pct": host[0] if host else None, "load1": host[1] if host else None,
        "others_cpu_s": float(sum(r[2] or 0 for r in others)),
        "others_top": json.dumps([{"pid": int(r[0]), "name": r[1], "cpu_s": round(float(r[2] or 0), 3)}
                                  for r in others[:TOP_OTHERS]]),
        "ingero_version": __version__,
    }
    tables["nodes"] = [pa.Table.from_pylist([row], schema=schema.NODES)]
    return Segment(session_id, t0, t1, tables, events)


def _explain(con: duckdb.DuckDBPyConnection, sel: Selection) -> Any:
    """explain over the segment's events (by start time), one-second windows; None when it holds none."""
    first, last = con.execute(SPAN_SQL, sel.params(pids=False)).fetchall()[0]
    if first is None:
        return None
    try:
        return explain(con, Options(session=sel.session_id, from_ns=sel.t0, to_ns=min(sel.t1, int(last) + 1),
                                    window_s=WINDOW_S))
    except IngeroError:
        return None  # nothing to explain in the range: windows and chains stay empty


def _arrow(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pa.Table:
    """A small result as Arrow, on ``con`` itself (explain's TEMP tables live on it; a relation
    would need a connection without open results, which explain leaves)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "an extra copy of the rows": a few hundred rows
        return con.execute(sql, params).to_arrow_table()
