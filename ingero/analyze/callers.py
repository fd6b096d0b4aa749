"""Which lines of the user's code the slow CUDA calls and the preemptions came from.

Reads ``events`` joined to ``stacks`` (written with ``ingero trace --stack``).
The *call site* of a stack is its innermost Python frame (depth closest to
0); a stack without Python frames (a C++ program) uses its innermost
symbolised native frame below the CUDA entry point.  A stack whose innermost
Python frame is ``[unreadable]`` has no call site (and is not counted).

Both functions take ``sel``, the store ``Selection`` of the rows to read (a
session, a time range, the processes; explain passes its Context's).

``top_callers(con, sel, limit=10) -> list[dict]``, one dict per (call site,
CUDA op), ordered by ``total_ns`` (time spent in that op from that line):

    file, line, function, source   the call site (source = text of the line, or None)
    frame_kind                     'python' | 'native'
    op                             CUDA op name (events.op)
    calls                          calls of op from this site
    avg_ns, max_ns, total_ns       duration of those calls
    slow_calls                     calls slower than the op's p90 over the whole range
    pids                           sorted list of pids that made them

``most_preempted_lines(con, sel, limit=10) -> list[dict]``, one dict per call
site where a traced thread was switched out while still runnable
(sched_switch, preempted = true), ordered by ``preemptions``:

    file, line, function, source, frame_kind   as above
    preemptions                    times switched out involuntarily at this site
    offcpu_ns                      total time off CPU after those switches
    avg_offcpu_ns, max_offcpu_ns
    pids                           sorted list of pids
"""

from __future__ import annotations

from typing import Any

import duckdb

from ingero.events.ops import CUDA_OP_NAMES
from ingero.store.selection import Selection

# Slow = above this percentile of the same op's durations in the range: the
# usual "tail" cut used by the rest of explain (p90), kept here as a number a
# reader can find.
SLOW_PERCENTILE = 0.90
DEFAULT_LIMIT = 10


# The call site of every stack: its innermost Python frame, else (no Python
# frame at all) its innermost known native frame at or below
# $min_native_depth.  An innermost Python frame that was unreadable
# ('[unreadable]', file NULL) leaves the stack without a site: the frame
# outside it is its caller, not the line that made the call.
_SITES = """
sites AS (
    SELECT stack_id,
           count(*) FILTER (WHERE frame_kind = 'python') AS py_frames,
           arg_min_null(file, depth) FILTER (WHERE frame_kind = 'python') AS py_file,
           arg_min_null(line, depth) FILTER (WHERE frame_kind = 'python') AS py_line,
           arg_min_null(function, depth) FILTER (WHERE frame_kind = 'python') AS py_function,
           arg_min_null(source, depth) FILTER (WHERE frame_kind = 'python') AS py_source,
           arg_min(module, depth) FILTER (WHERE frame_kind = 'native' AND depth >= $min_native_depth
                                          AND function <> '[unknown]') AS nat_module,
           arg_min(function, depth) FILTER (WHERE frame_kind = 'native' AND depth >= $min_native_depth
                                            AND function <> '[unknown]') AS nat_function
    FROM stacks
    WHERE stack_id IN (SELECT DISTINCT stack_id FROM ev)
    GROUP BY stack_id
),
site AS (
    SELECT stack_id,
           CASE WHEN py_frames > 0 THEN 'python' ELSE 'native' END AS frame_kind,
           CASE WHEN py_frames > 0 THEN py_file ELSE nat_module END AS file,
           py_line AS line,
           CASE WHEN py_frames > 0 THEN py_function ELSE nat_function END AS function,
           py_source AS source
    FROM sites
    WHERE CASE WHEN py_frames > 0 THEN py_file IS NOT NULL ELSE nat_function IS NOT NULL END
)
"""

_FILTER = f"stack_id IS NOT NULL AND {Selection.where()}"

TOP_CALLERS_SQL = f"""
WITH ev AS (
    SELECT pid, op, duration_ns, stack_id FROM events
    WHERE list_contains($ops, op) AND {_FILTER}
),
p AS (
    SELECT op, quantile_cont(duration_ns, $pct) AS p_slow FROM ev GROUP BY op
),
{_SITES}
SELECT s.file, s.line, s.function, s.source, s.frame_kind, ev.op,
       count(*) AS calls,
       avg(ev.duration_ns) AS avg_ns,
       max(ev.duration_ns) AS max_ns,
       sum(ev.duration_ns) AS total_ns,
       count(*) FILTER (WHERE ev.duration_ns > p.p_slow) AS slow_calls,
       list_sort(list_distinct(list(ev.pid))) AS pids
FROM ev JOIN site s USING (stack_id) JOIN p USING (op)
GROUP BY s.file, s.line, s.function, s.source, s.frame_kind, ev.op
ORDER BY total_ns DESC, calls DESC, s.file, s.line
LIMIT $limit
"""

PREEMPTED_SQL = f"""
WITH ev AS (
    SELECT pid, duration_ns, stack_id FROM events
    WHERE op = 'sched_switch' AND preempted AND {_FILTER}
),
{_SITES}
SELECT s.file, s.line, s.function, s.source, s.frame_kind,
       count(*) AS preemptions,
       sum(ev.duration_ns) AS offcpu_ns,
       avg(ev.duration_ns) AS avg_offcpu_ns,
       max(ev.duration_ns) AS max_offcpu_ns,
       list_sort(list_distinct(list(ev.pid))) AS pids
FROM ev JOIN site s USING (stack_id)
GROUP BY s.file, s.line, s.function, s.source, s.frame_kind
ORDER BY preemptions DESC, offcpu_ns DESC, s.file, s.line
LIMIT $limit
"""


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    out = []
    for row in cur.fetchall():
        d = dict(zip(names, row))
        for k in ("avg_ns", "avg_offcpu_ns"):
            if k in d and d[k] is not None:
                d[k] = float(d[k])
        for k in ("calls", "max_ns", "total_ns", "slow_calls", "preemptions", "offcpu_ns", "max_offcpu_ns"):
            if k in d and d[k] is not None:
                d[k] = int(d[k])
        out.append(d)
    return out


def top_callers(con: duckdb.DuckDBPyConnection, sel: Selection, limit: int = DEFAULT_LIMIT) -> list[dict]:
    """Call sites of CUDA ops, by time spent in them (see the module docstring for keys)."""
    # Depth 0 of a CUDA op's stack is the CUDA entry point itself: the caller
    # is at depth >= 1.
    params = sel.params(limit=int(limit), ops=list(CUDA_OP_NAMES), pct=SLOW_PERCENTILE, min_native_depth=1)
    return _rows(con, TOP_CALLERS_SQL, params)


def most_preempted_lines(con: duckdb.DuckDBPyConnection, sel: Selection, limit: int = DEFAULT_LIMIT) -> list[dict]:
    """Call sites where traced threads were preempted most (see the module docstring for keys)."""
    return _rows(con, PREEMPTED_SQL, sel.params(limit=int(limit), min_native_depth=0))
