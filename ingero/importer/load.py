"""From the staged trace (``_imp_raw``, raw.py) into the store's tables, in SQL.

A Kineto event is used when it is a complete event (ph 'X') of a category
below, or a process_name metadata event; everything else is counted by kind in
``Counts.unused`` (flows, instants, thread metadata, CUDA calls the tracer has
no op name for, device-side sync markers ...), never dropped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb

from ingero.collect.probes import CUDA_PROBES
from ingero.collect.records import OP_NAMES, Op

CALL_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
SPAN_CATS = ("cpu_op", "user_annotation", "python_function")
SYNC_CAT = "cuda_sync"  # device-side sync markers: carry the stream a sync call waited on

# What the tracer fills per op (bpf/cuda.bpf.c arguments): copies carry bytes and direction,
# these carry the stream.  Kineto records no call arguments; the submitted activity has them.
COPY_OPS = tuple(OP_NAMES[o] for o in (Op.CUDA_MEMCPY, Op.CUDA_MEMCPY_ASYNC, Op.CU_MEMCPY, Op.CU_MEMCPY_ASYNC))
STREAM_OPS = tuple(OP_NAMES[o] for o in (
    Op.CUDA_MEMCPY_ASYNC, Op.CUDA_STREAM_SYNC, Op.CUDA_GRAPH_LAUNCH, Op.CU_MEMCPY_ASYNC, Op.CU_STREAM_SYNC,
    Op.CUDA_LAUNCH_KERNEL, Op.CU_LAUNCH_KERNEL))

def _sql_list(names: tuple[str, ...] | list[str]) -> str:
    """A SQL list of this module's own constant names (views take no parameters)."""
    assert all(re.fullmatch(r"[A-Za-z_]+", n) for n in names)
    return "(" + ", ".join(f"'{n}'" for n in names) + ")"


_CATS = {"calls": _sql_list(CALL_CATS), "device": _sql_list(list(DEVICE_CATS)), "spans": _sql_list(SPAN_CATS),
         "sync": f"'{SYNC_CAT}'"}

_BY_SYMBOL = {p.symbol: p.op_name for p in CUDA_PROBES}
_VARIANT = re.compile(r"(_ptds|_ptsz)$")


def op_for(name: str) -> str | None:
    """The events.op the tracer stores for a CUDA call named ``name`` (its symbol), or None."""
    base = _VARIANT.sub("", name)
    for cand in (base, base + "_v2", base.removesuffix("_v2")):
        if cand in _BY_SYMBOL:
            return _BY_SYMBOL[cand]
    return None


# The staged rows with times in ns on the trace's clock ({base}: baseTimeNanoseconds when the
# trace has it, a number this module formats).  ts and dur are microseconds; the whole
# microseconds and the fraction are converted apart so the product stays exact.
VIEW = """CREATE OR REPLACE TEMP VIEW _imp_v AS
SELECT ph, cat, name, arg_name, correlation, device, stream, bytes, pid, tid,
       {base}::BIGINT + CAST(floor(ts) AS BIGINT) * 1000 + CAST(round((ts - floor(ts)) * 1000) AS BIGINT) AS start_ns,
       CAST(round(dur * 1000) AS BIGINT) AS dur_ns
FROM _imp_raw"""

# How each staged row is used ('call', 'device', 'span', 'name') or why not (any other text).
USE = """CREATE OR REPLACE TEMP TABLE _imp_use AS
SELECT v.*, o.op,
    CASE
      WHEN ph = 'M' AND name = 'process_name' AND pid IS NOT NULL AND arg_name IS NOT NULL THEN 'name'
      WHEN ph IN ('s', 't', 'f') THEN 'flow arrows: ' || coalesce(cat, name, '?')
      WHEN ph = 'M' THEN 'metadata: ' || coalesce(name, '?')
      WHEN ph IN ('i', 'I') THEN 'instant events: ' || coalesce(name, '?')
      WHEN ph IS DISTINCT FROM 'X' THEN 'events of phase ' || coalesce(ph, 'none') || ': ' || coalesce(cat, name, '?')
      WHEN cat = {sync} THEN 'cuda_sync events (device-side sync markers; their stream fills the sync calls'' stream)'
      WHEN cat IS NULL OR (cat NOT IN {calls} AND cat NOT IN {device} AND cat NOT IN {spans}) THEN coalesce(cat, 'no category') || ' events'
      WHEN start_ns IS NULL OR dur_ns IS NULL OR dur_ns < 0 THEN cat || ' events without a usable ts/dur'
      WHEN cat IN {calls} AND o.op IS NULL THEN 'CUDA calls without an op name: ' || name
      WHEN cat IN {device} AND {calls_only} THEN cat || ' (device timeline dropped: --calls-only)'
      WHEN (cat IN {calls} OR cat IN {spans}) AND (pid IS NULL OR tid IS NULL) THEN cat || ' events without a numeric pid/tid'
      WHEN cat IN {calls} THEN 'call'
      WHEN cat IN {device} THEN 'device'
      ELSE 'span'
    END AS use
FROM _imp_v v LEFT JOIN _imp_ops o ON o.symbol = v.name AND v.cat IN {calls}"""

SUBMITTED = """(SELECT correlation, any_value(stream) FILTER (WHERE stream >= 0) AS stream, sum(bytes) AS bytes,
        any_value(copy_kind) AS copy_kind
    FROM (SELECT correlation, stream, bytes, {copy_kind} AS copy_kind FROM _imp_use
          WHERE ph = 'X' AND (cat IN {device} OR cat = {sync}) AND correlation IS NOT NULL)
    GROUP BY correlation)""".replace("{device}", _CATS["device"]).replace("{sync}", _CATS["sync"])
COPY_KIND = """CASE regexp_extract(name, 'Memcpy (HtoD|DtoH|DtoD|HtoH|PtoP)', 1)
    WHEN 'HtoD' THEN 'H2D' WHEN 'DtoH' THEN 'D2H' WHEN 'DtoD' THEN 'D2D' WHEN 'PtoP' THEN 'D2D'
    WHEN 'HtoH' THEN 'H2H' END"""

INSERT_EVENTS = f"""INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op, kind, bytes, stream)
SELECT $sid, c.start_ns + $offset, c.dur_ns, c.pid, c.tid, c.op,
       CASE WHEN list_contains($copy_ops, c.op) THEN d.copy_kind END,
       CASE WHEN list_contains($copy_ops, c.op) THEN d.bytes END,
       CASE WHEN list_contains($stream_ops, c.op) THEN d.stream END
FROM _imp_use c LEFT JOIN {SUBMITTED.format(copy_kind=COPY_KIND)} d USING (correlation)
WHERE c.use = 'call'
ORDER BY c.start_ns"""

INSERT_DEVICE = f"""INSERT INTO device_activity (session_id, device, stream, kind, copy_kind, bytes, start_ns, end_ns,
                             name, correlation, call_tid, call_ns, pid)
SELECT $sid, coalesce(d.device, d.pid), d.stream,
       CASE d.cat WHEN 'kernel' THEN 'kernel' WHEN 'gpu_memcpy' THEN 'memcpy' WHEN 'gpu_memset' THEN 'memset' END,
       {COPY_KIND}, d.bytes,
       d.start_ns + $offset, d.start_ns + d.dur_ns + $offset, d.name, d.correlation, c.tid,
       coalesce(m.traced_ns, c.start_ns + $offset), c.pid
FROM _imp_use d LEFT JOIN (SELECT correlation, any_value(tid) AS tid, any_value(start_ns) AS start_ns,
                                  any_value(pid) AS pid
                           FROM _imp_use WHERE ph = 'X' AND cat IN {_CATS["calls"]} AND correlation IS NOT NULL
                           GROUP BY correlation) c USING (correlation)
     LEFT JOIN _imp_match m ON m.tid = c.tid AND m.trace_ns = c.start_ns
WHERE d.use = 'device'
ORDER BY d.start_ns"""

INSERT_SPANS = """INSERT INTO spans
SELECT $sid, pid, tid, start_ns + $offset, start_ns + dur_ns + $offset, name, cat
FROM _imp_use WHERE use = 'span' AND name IS NOT NULL ORDER BY start_ns"""


@dataclass
class Counts:
    calls: int = 0
    device: int = 0
    spans: int = 0
    pids: list[int] = field(default_factory=list)
    started_ns: int | None = None
    ended_ns: int | None = None
    unused: dict[str, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # pid -> process name (metadata events)


def prepare(con: duckdb.DuckDBPyConnection, *, base_ns: int, calls_only: bool) -> Counts:
    """Views over ``_imp_raw``; counts of what will be stored and of what will not."""
    con.execute(VIEW.format(base=int(base_ns)))
    con.execute("CREATE OR REPLACE TEMP TABLE _imp_ops (symbol VARCHAR, op VARCHAR)")
    names = [r[0] for r in con.execute(
        "SELECT DISTINCT name FROM _imp_raw WHERE list_contains($calls, cat) AND name IS NOT NULL",
        {"calls": list(CALL_CATS)}).fetchall()]
    ops = [(n, op_for(n)) for n in names if op_for(n)]
    if ops:
        con.executemany("INSERT INTO _imp_ops VALUES (?, ?)", ops)
    con.execute(USE.format(**_CATS, calls_only="TRUE" if calls_only else "FALSE"))
    con.execute("DROP TABLE _imp_raw")  # _imp_use has all of it, typed: keep one copy
    counts = Counts()
    for use, n in con.execute("SELECT use, count(*) FROM _imp_use GROUP BY use").fetchall():
        if use == "call":
            counts.calls = n
        elif use == "device":
            counts.device = n
        elif use == "span":
            counts.spans = n
        elif use != "name":
            counts.unused[use] = n
    row = con.execute("""SELECT min(start_ns), max(start_ns + dur_ns) FROM _imp_use
                         WHERE use IN ('call', 'device', 'span')""").fetchone()
    counts.started_ns, counts.ended_ns = row
    counts.pids = [r[0] for r in con.execute(
        "SELECT DISTINCT pid FROM _imp_use WHERE use IN ('call', 'span') ORDER BY pid").fetchall()]
    other_names = 0
    for pid, name, n in con.execute(
            "SELECT pid, any_value(arg_name), count(*) FROM _imp_use WHERE use = 'name' GROUP BY pid").fetchall():
        if pid in counts.pids:
            counts.names[pid] = name
            other_names += n - 1
        else:
            other_names += n  # the device 'processes' (GPU 0 ...) and processes without calls or spans
    if other_names:
        counts.unused["metadata: process_name (not a traced process, or repeated)"] = other_names
    counts.unused = dict(sorted(counts.unused.items(), key=lambda kv: (-kv[1], kv[0])))
    return counts


def insert(con: duckdb.DuckDBPyConnection, session_id: int, *, offset_ns: int, calls_only: bool,
           calls: bool = True) -> None:
    """Append the prepared rows to events (unless not ``calls``), device_activity and spans.

    Runs inside the caller's transaction; ``offset_ns`` is added to every time.
    """
    p = {"sid": session_id, "offset": offset_ns}
    if calls:
        con.execute(INSERT_EVENTS, {**p, "copy_ops": list(COPY_OPS), "stream_ops": list(STREAM_OPS)})
    if not calls_only:
        con.execute(INSERT_DEVICE, p)
    con.execute(INSERT_SPANS, {"sid": session_id, "offset": offset_ns})


def matched_calls(con: duckdb.DuckDBPyConnection, pairs: list[tuple[int, int, int]]) -> None:
    """The joined session's calls each trace call matched: device_activity.call_ns takes the traced time."""
    con.execute("CREATE OR REPLACE TEMP TABLE _imp_match (tid INTEGER, trace_ns BIGINT, traced_ns BIGINT)")
    if pairs:
        import pyarrow as pa

        tids, trace_ns, traced_ns = zip(*pairs)
        con.register("_imp_pairs", pa.table({"tid": pa.array(tids, pa.int32()), "trace_ns": pa.array(trace_ns, pa.int64()),
                                             "traced_ns": pa.array(traced_ns, pa.int64())}))
        try:
            con.execute("INSERT INTO _imp_match SELECT * FROM _imp_pairs")
        finally:
            con.unregister("_imp_pairs")


def cleanup(con: duckdb.DuckDBPyConnection) -> None:
    for stmt in ("DROP TABLE IF EXISTS _imp_use", "DROP TABLE IF EXISTS _imp_match", "DROP VIEW IF EXISTS _imp_v", "DROP TABLE IF EXISTS _imp_ops",
                 "DROP TABLE IF EXISTS _imp_raw"):
        con.execute(stmt)
