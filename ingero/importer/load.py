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
from ingero.events.ops import COPY_OPS, OP_NAMES, Op
from ingero.importer.raw import BAD_FIELD_NAMES, INT_FIELDS, RAW_TABLE, SCRATCH, detach_scratch

CALL_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
SPAN_CATS = ("cpu_op", "user_annotation", "python_function")
SYNC_CAT = "cuda_sync"  # device-side sync markers: carry the stream a sync call waited on

# Categories of torch.profiler before PyTorch 1.10 (Kineto's names then; HTA and TensorBoard's
# plugin read both), stored under today's names.  'Operator' held CPU operators and the ranges
# PyTorch opens with record_function alike; the latter are told apart by ANNOTATION_PREFIXES.
OLD_CATEGORIES = {"Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset",
                  "Python": "python_function", "gpu_user_Annotation": "gpu_user_annotation"}
OPERATOR_CATS = ("Operator", "cpu_op")
# record_function ranges of PyTorch itself (user_annotation since 1.10: steps, data loading,
# optimizer and DDP phases, NCCL collectives); an operator with such a name (PyTorch 1.9 wrote
# steps as cpu_op) is one of these ranges, not host work inside the step
ANNOTATION_PREFIXES = ("ProfilerStep#", "enumerate(DataLoader)", "Optimizer.", "DistributedDataParallel.", "nccl:")

# Times: ns since the Unix epoch in [0, MAX_NS] (the year 2116), durations in [0, MAX_DUR_NS]
# (73 years), so a start plus its duration never overflows 64 bits; anything else (1e308,
# NaN, a ts near 2^63 ns, a negative time) is a bad number: its event is counted, not stored.
MAX_NS = 1 << 62
MAX_DUR_NS = 1 << 61
MAX_UNUSED_KINDS = 50  # kinds of unused events named one by one; the rest summed (hostile names)
KIND_CHARS = 120  # a name quoted in a kind of unused event is cut to this many characters
MAX_PIDS = 1024  # processes named in a session's targets (a real trace has one, or a few)
NAME_CHARS = 256  # an imported process name is cut to this

# What the tracer fills per op (bpf/cuda.bpf.c arguments): copies (COPY_OPS) carry bytes and
# direction, these carry the stream.  Kineto records no call arguments; the submitted activity has them.
STREAM_OPS = tuple(OP_NAMES[o] for o in (
    Op.CUDA_MEMCPY_ASYNC, Op.CUDA_STREAM_SYNC, Op.CUDA_GRAPH_LAUNCH, Op.CU_MEMCPY_ASYNC, Op.CU_STREAM_SYNC,
    Op.CUDA_LAUNCH_KERNEL, Op.CU_LAUNCH_KERNEL))


def _sql_list(names: tuple[str, ...] | list[str]) -> str:
    """A SQL list of this module's own constant names (views take no parameters)."""
    assert all(re.fullmatch(r"[A-Za-z_.#():]+", n) for n in names)
    return "(" + ", ".join(f"'{n}'" for n in names) + ")"


def _category_sql() -> str:
    """The normalized category of a staged row (``cat``, ``name`` of _imp_raw)."""
    _sql_list([*OLD_CATEGORIES, *OLD_CATEGORIES.values(), *ANNOTATION_PREFIXES])  # asserts: no quotes
    old = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in OLD_CATEGORIES.items())
    ann = " OR ".join(f"starts_with(name, '{p}')" for p in ANNOTATION_PREFIXES)
    return (f"CASE WHEN cat IN {_sql_list(OPERATOR_CATS)} THEN CASE WHEN {ann} THEN 'user_annotation' "
            f"ELSE 'cpu_op' END ELSE CASE cat {old} ELSE cat END END")


_CATS = {"calls": _sql_list(CALL_CATS), "device": _sql_list(list(DEVICE_CATS)), "spans": _sql_list(SPAN_CATS),
         "sync": f"'{SYNC_CAT}'", "k": str(KIND_CHARS)}

_BY_SYMBOL = {p.symbol: p.op_name for p in CUDA_PROBES}
_VARIANT = re.compile(r"(_ptds|_ptsz)$")


def op_for(name: str) -> str | None:
    """The events.op the tracer stores for a CUDA call named ``name`` (its symbol), or None."""
    base = _VARIANT.sub("", name)
    for cand in (base, base + "_v2", base.removesuffix("_v2")):
        if cand in _BY_SYMBOL:
            return _BY_SYMBOL[cand]
    return None


def op_table() -> list[tuple[str, str]]:
    """(name, op) for every name op_for maps: a finite table (~500 names), so the call names are
    joined in SQL by equality (a trace of a million distinct names never reaches Python)."""
    bases = {k for s in _BY_SYMBOL for k in (s, s + "_v2", s.removesuffix("_v2"))}
    keys = {b + suffix for b in bases for suffix in ("", "_ptds", "_ptsz")}
    return sorted((k, op) for k in keys if (op := op_for(k)) is not None)


# The staged rows with times in ns on the trace's clock ({base}: baseTimeNanoseconds when the
# trace has it, a number this module formats, checked to be in [0, MAX_NS]).  ts and dur are
# microseconds; the whole microseconds and the fraction are converted apart so the product
# stays exact.  A time outside [0, MAX_NS], a duration outside [0, MAX_DUR_NS], NaN and the
# infinities give NULL (the double comparisons first: no cast below can overflow).
VIEW = """CREATE OR REPLACE TEMP VIEW _imp_v AS
SELECT ph, {category} AS cat, name, arg_name, correlation, ext_id, device, stream, bytes, pid, tid, ts, dur, bad,
       CASE WHEN isfinite(ts) AND ts * 1000 + {base} BETWEEN 0 AND {max_ns}
            THEN {base}::BIGINT + CAST(floor(ts) AS BIGINT) * 1000 + CAST(round((ts - floor(ts)) * 1000) AS BIGINT)
       END AS start_ns,
       CASE WHEN isfinite(dur) AND dur BETWEEN 0 AND {max_dur_us} THEN CAST(round(dur * 1000) AS BIGINT) END AS dur_ns
FROM _imp_raw"""

# How each staged row is used ('call', 'device', 'span', 'name') or why not (any other text).
# ``link`` ties a call to the device activity it submitted: the correlation id, or (link_by_external_id)
# a key made from the external id where the trace has none.
USE_TABLE = f"{SCRATCH}._imp_use"  # read through the TEMP view _imp_use
USE = """CREATE OR REPLACE TABLE {use_table} AS
SELECT v.* EXCLUDE (ts, dur, bad), o.op, v.correlation AS link,
    CASE
      WHEN ph = 'M' AND name = 'process_name' AND pid IS NOT NULL AND arg_name IS NOT NULL THEN 'name'
      WHEN ph IN ('s', 't', 'f') THEN 'flow arrows: ' || left(coalesce(cat, name, '?'), {k})
      WHEN ph = 'M' THEN 'metadata: ' || left(coalesce(name, '?'), {k})
      WHEN ph IN ('i', 'I') THEN 'instant events: ' || left(coalesce(name, '?'), {k})
      WHEN ph IS DISTINCT FROM 'X' THEN 'events of phase ' || left(coalesce(ph, 'none'), {k}) || ': '
                                        || left(coalesce(cat, name, '?'), {k})
      WHEN cat = {sync} THEN 'cuda_sync events (device-side sync markers; their stream fills the sync calls'' stream)'
      WHEN cat IS NULL OR (cat NOT IN {calls} AND cat NOT IN {device} AND cat NOT IN {spans})
           THEN left(coalesce(cat, 'no category'), {k}) || ' events'
      WHEN start_ns IS NULL OR dur_ns IS NULL THEN cat || ' events without a usable ts/dur'
      WHEN cat IN {calls} AND o.op IS NULL THEN 'CUDA calls without an op name: ' || left(coalesce(name, '?'), {k})
      WHEN cat IN {device} AND {calls_only} THEN cat || ' (device timeline dropped: --calls-only)'
      WHEN (cat IN {calls} OR cat IN {spans}) AND (pid IS NULL OR tid IS NULL)
        THEN cat || ' events without a numeric pid/tid'
      WHEN cat IN {calls} THEN 'call'
      WHEN cat IN {device} THEN 'device'
      ELSE 'span'
    END AS use
FROM _imp_v v LEFT JOIN _imp_ops o ON o.symbol = v.name AND v.cat IN {calls}"""

# Bad numbers: a ts/dur that gave no time, and the bits raw.py set (raw.INT_FIELDS' order)
BAD_SQL = ("SELECT count(*) FILTER (ts IS NOT NULL AND start_ns IS NULL), "
           "count(*) FILTER (dur IS NOT NULL AND dur_ns IS NULL), "
           + ", ".join(f"count(*) FILTER (bad & {1 << i} <> 0)" for i in range(len(INT_FIELDS)))
           + " FROM _imp_v")

# Device activity without a correlation id but with an external id (the id of the operator that
# submitted it): the k-th of an external id's device rows, in time order, was submitted by the
# k-th of its calls that submit work (launches, copies, memsets), in time order; both get the
# same link, a negative number (correlations are positive).
LINK_BY_EXTERNAL_ID = """
UPDATE {use_table} SET link = f.link FROM (
    WITH d AS (SELECT rowid AS rid, ext_id,
                      row_number() OVER (PARTITION BY ext_id ORDER BY start_ns, stream, rowid) AS k
               FROM {use_table} WHERE use = 'device' AND link IS NULL AND ext_id IS NOT NULL AND ext_id <> 0),
    c AS (SELECT rowid AS rid, ext_id, row_number() OVER (PARTITION BY ext_id ORDER BY start_ns, tid, rowid) AS k
          FROM {use_table} u WHERE ph = 'X' AND cat IN {calls} AND start_ns IS NOT NULL
            AND ext_id IN (SELECT ext_id FROM d) AND regexp_matches(name, 'Launch|Memcpy|Memset')
            AND (link IS NULL OR NOT EXISTS (SELECT 1 FROM _imp_use x WHERE x.use = 'device' AND x.link = u.link))),
    pairs AS (SELECT d.rid AS drid, c.rid AS crid, -row_number() OVER (ORDER BY d.rid) AS link
              FROM d JOIN c USING (ext_id, k))
    SELECT drid AS rid, link FROM pairs UNION ALL SELECT crid, link FROM pairs
) f WHERE {use_table}.rowid = f.rid""".replace("{calls}", _CATS["calls"]).replace("{use_table}", USE_TABLE)

SUBMITTED = """(SELECT link, any_value(stream) FILTER (WHERE stream >= 0) AS stream,
        CASE WHEN sum(bytes) <= 9223372036854775807 THEN sum(bytes) END AS bytes, any_value(copy_kind) AS copy_kind
    FROM (SELECT link, stream, bytes, {copy_kind} AS copy_kind FROM _imp_use
          WHERE ph = 'X' AND (cat IN {device} OR cat = {sync}) AND link IS NOT NULL)
    GROUP BY link)""".replace("{device}", _CATS["device"]).replace("{sync}", _CATS["sync"])
COPY_KIND = """CASE regexp_extract(name, 'Memcpy (HtoD|DtoH|DtoD|HtoH|PtoP)', 1)
    WHEN 'HtoD' THEN 'H2D' WHEN 'DtoH' THEN 'D2H' WHEN 'DtoD' THEN 'D2D' WHEN 'PtoP' THEN 'D2D'
    WHEN 'HtoH' THEN 'H2H' END"""

INSERT_EVENTS = f"""INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op, kind, bytes, stream)
SELECT $sid, c.start_ns + $offset, c.dur_ns, c.pid, c.tid, c.op,
       CASE WHEN list_contains($copy_ops, c.op) THEN d.copy_kind END,
       CASE WHEN list_contains($copy_ops, c.op) THEN d.bytes END,
       CASE WHEN list_contains($stream_ops, c.op) THEN d.stream END
FROM _imp_use c LEFT JOIN {SUBMITTED.format(copy_kind=COPY_KIND)} d USING (link)
WHERE c.use = 'call'
ORDER BY c.start_ns"""

INSERT_DEVICE = f"""INSERT INTO device_activity (session_id, device, stream, kind, copy_kind, bytes, start_ns, end_ns,
                             name, correlation, call_tid, call_ns, pid)
SELECT $sid, coalesce(d.device, d.pid), d.stream,
       CASE d.cat WHEN 'kernel' THEN 'kernel' WHEN 'gpu_memcpy' THEN 'memcpy' WHEN 'gpu_memset' THEN 'memset' END,
       {COPY_KIND}, d.bytes,
       d.start_ns + $offset, d.start_ns + d.dur_ns + $offset, d.name, d.correlation, c.tid,
       coalesce(m.traced_ns, c.start_ns + $offset), c.pid
FROM _imp_use d LEFT JOIN (SELECT link, any_value(tid) AS tid, any_value(start_ns) AS start_ns,
                                  any_value(pid) AS pid
                           FROM _imp_use WHERE ph = 'X' AND cat IN {_CATS["calls"]} AND link IS NOT NULL
                           GROUP BY link) c USING (link)
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
    pids: list[int] = field(default_factory=list)  # the first MAX_PIDS, in order
    n_pids: int = 0  # all of them
    started_ns: int | None = None
    ended_ns: int | None = None
    unused: dict[str, int] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # pid -> process name (metadata events)
    bad: dict[str, int] = field(default_factory=dict)  # field -> values skipped (bad numbers)


def prepare(con: duckdb.DuckDBPyConnection, *, base_ns: int, calls_only: bool) -> Counts:
    """Views over ``_imp_raw``; counts of what will be stored and of what will not.

    Every query here returns a bounded number of rows, whatever the trace holds (a hostile
    trace's million distinct names or pids stay in DuckDB)."""
    if not 0 <= base_ns <= MAX_NS:
        raise ValueError(f"base_ns {base_ns} out of range")  # __init__ refuses it first
    con.execute(VIEW.format(base=int(base_ns), category=_category_sql(), max_ns=MAX_NS, max_dur_us=MAX_DUR_NS / 1000))
    symbols, ops = zip(*op_table())
    con.execute("CREATE OR REPLACE TEMP TABLE _imp_ops AS SELECT unnest($s::VARCHAR[]) AS symbol, "
                "unnest($o::VARCHAR[]) AS op", {"s": list(symbols), "o": list(ops)})
    counts = Counts()
    bad = con.execute(BAD_SQL).fetchone()
    names = ("ts", "dur", *(BAD_FIELD_NAMES[f[0]] for f in INT_FIELDS))
    counts.bad = {k: int(n) for k, n in zip(names, bad) if n}
    con.execute(USE.format(**_CATS, use_table=USE_TABLE, calls_only="TRUE" if calls_only else "FALSE"))
    con.execute(f"CREATE OR REPLACE TEMP VIEW _imp_use AS SELECT * FROM {USE_TABLE}")
    con.execute("DROP VIEW _imp_v")
    con.execute("DROP VIEW _imp_raw")
    con.execute(f"DROP TABLE {RAW_TABLE}")  # _imp_use has all of it, typed: keep one copy
    if con.execute("SELECT count(*) FROM _imp_use WHERE use = 'device' AND link IS NULL AND ext_id IS NOT NULL "
                   "AND ext_id <> 0").fetchone()[0]:
        con.execute(LINK_BY_EXTERNAL_ID)
    counts.calls, counts.device, counts.spans = con.execute(
        "SELECT count(*) FILTER (use = 'call'), count(*) FILTER (use = 'device'), count(*) FILTER (use = 'span') "
        "FROM _imp_use").fetchone()
    unused = "use NOT IN ('call', 'device', 'span', 'name')"
    for use, n in con.execute(f"SELECT use, count(*) AS n FROM _imp_use WHERE {unused} GROUP BY use "
                              "ORDER BY n DESC, use LIMIT $k", {"k": MAX_UNUSED_KINDS}).fetchall():
        counts.unused[use] = n
    if len(counts.unused) == MAX_UNUSED_KINDS:
        kinds, total = con.execute(f"SELECT count(DISTINCT use), count(*) FROM _imp_use WHERE {unused}").fetchone()
        if kinds > MAX_UNUSED_KINDS:
            counts.unused[f"events of {kinds - MAX_UNUSED_KINDS:,} other kinds"] = total - sum(counts.unused.values())
    row = con.execute("""SELECT min(start_ns), max(start_ns + dur_ns) FROM _imp_use
                         WHERE use IN ('call', 'device', 'span')""").fetchone()
    counts.started_ns, counts.ended_ns = row
    counts.n_pids, = con.execute(
        "SELECT count(DISTINCT pid) FROM _imp_use WHERE use IN ('call', 'span')").fetchone()
    counts.pids = [r[0] for r in con.execute(
        "SELECT DISTINCT pid FROM _imp_use WHERE use IN ('call', 'span') ORDER BY pid LIMIT $n",
        {"n": MAX_PIDS}).fetchall()]
    other_names, = con.execute("SELECT count(*) FROM _imp_use WHERE use = 'name'").fetchone()
    for pid, name in con.execute(
            """SELECT pid, left(any_value(arg_name), $chars) FROM _imp_use
               WHERE use = 'name' AND list_contains($pids, pid) GROUP BY pid""",
            {"pids": counts.pids, "chars": NAME_CHARS}).fetchall():
        counts.names[pid] = name
    # the device 'processes' (GPU 0 ...), processes without calls or spans, repeats
    other_names -= len(counts.names)
    if other_names:
        counts.unused["metadata: process_name (not a traced process, or repeated)"] = other_names
    counts.unused = dict(sorted(counts.unused.items(), key=lambda kv: (-kv[1], kv[0])))
    return counts


def measured_live(con: duckdb.DuckDBPyConnection, session_id: int, pid: int) -> bool:
    """Whether the traced session holds a device timeline CUPTI measured live for ``pid``."""
    cols = {r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'device_activity'").fetchall()}
    if "pid" not in cols:
        return False
    return con.execute("SELECT count(*) > 0 FROM device_activity WHERE session_id = $s AND pid = $p",
                       {"s": session_id, "p": pid}).fetchone()[0]


def insert(con: duckdb.DuckDBPyConnection, session_id: int, *, offset_ns: int, calls_only: bool,
           calls: bool = True, device: bool = True) -> None:
    """Append the prepared rows to events (unless not ``calls``), device_activity (unless not
    ``device``) and spans.

    Runs inside the caller's transaction; ``offset_ns`` is added to every time.
    """
    p = {"sid": session_id, "offset": offset_ns}
    if calls:
        con.execute(INSERT_EVENTS, {**p, "copy_ops": list(COPY_OPS), "stream_ops": list(STREAM_OPS)})
    if device and not calls_only:
        con.execute(INSERT_DEVICE, p)
    con.execute(INSERT_SPANS, {"sid": session_id, "offset": offset_ns})


def matched_calls(con: duckdb.DuckDBPyConnection, pairs: list[tuple[int, int, int]]) -> None:
    """The joined session's calls each trace call matched: device_activity.call_ns takes the traced time."""
    con.execute("CREATE OR REPLACE TEMP TABLE _imp_match (tid INTEGER, trace_ns BIGINT, traced_ns BIGINT)")
    if pairs:
        import pyarrow as pa

        tids, trace_ns, traced_ns = zip(*pairs)
        con.register("_imp_pairs", pa.table({"tid": pa.array(tids, pa.int32()),
                                             "trace_ns": pa.array(trace_ns, pa.int64()),
                                             "traced_ns": pa.array(traced_ns, pa.int64())}))
        try:
            con.execute("INSERT INTO _imp_match SELECT * FROM _imp_pairs")
        finally:
            con.unregister("_imp_pairs")


def cleanup(con: duckdb.DuckDBPyConnection) -> None:
    for stmt in ("DROP VIEW IF EXISTS _imp_use", "DROP TABLE IF EXISTS _imp_match", "DROP VIEW IF EXISTS _imp_v",
                 "DROP TABLE IF EXISTS _imp_ops", "DROP VIEW IF EXISTS _imp_raw"):
        con.execute(stmt)
    detach_scratch(con)  # its tables with it
