"""`ingero fleet status` and `ingero fleet query`: the dataset's nodes, and SQL over all of them."""

from __future__ import annotations

from ingero.daemon.access import run_interruptible
from ingero.daemon.sqlguard import check_sql
from ingero.fleet import dataset, findings, schema
from ingero.store.query import DEFAULT_TIMEOUT_S, QueryResult, check_sql_text, run_on

STATUS_SQL = """
WITH s AS (
    SELECT job, node, session_id, count(*) AS segments, max(segment_end_ns) AS last_end,
           max(written_ns) AS written, max(drops_kernel) AS dk, max(drops_user) AS du, sum(events) AS events,
           bool_and(clock_synced) AS synced, max(clock_max_error_us) AS err, arg_max(clock_sync, written_ns) AS sync,
           max(ncpu) AS ncpu, max(gpus) AS gpus
    FROM nodes GROUP BY ALL
)
SELECT job, node, sum(segments) AS segments, count(*) AS sessions, sum(events) AS events,
       max(last_end) AS last_segment_end_ns, max(written) AS last_written_ns,
       sum(dk) AS drops_kernel, sum(du) AS drops_user, max(ncpu) AS ncpu, max(gpus) AS gpus,
       arg_max(sync, last_end) AS clock_sync, bool_and(synced) AS clock_synced, max(err) AS clock_max_error_us
FROM s GROUP BY ALL ORDER BY job, node
"""


# The times of a status row, printed as UTC times for a reader (--json keeps the ns).
TIME_COLUMNS = ("last_segment_end_ns", "last_written_ns")


def readable(result: QueryResult) -> QueryResult:
    """``result`` with its ns timestamps as UTC times ('2026-11-19 10:00:00 UTC'), named without _ns."""
    idx = [i for i, c in enumerate(result.columns) if c in TIME_COLUMNS]
    cols = [c[:-3] if i in idx else c for i, c in enumerate(result.columns)]
    types = ["VARCHAR" if i in idx else t for i, t in enumerate(result.types)]
    rows = [tuple(dataset.iso(None if v is None else int(v)) if i in idx else v for i, v in enumerate(r))
            for r in result.rows]
    return QueryResult(cols, types, rows, result.truncated)


def status(url: str, job: str | None = None, *, times: str = "ns") -> tuple[QueryResult, list[str]]:
    """One row per node, and notes (partial answers, the skew between nodes).  ``times``: 'ns'
    (epoch nanoseconds, --json) or 'utc' (readable, the text table)."""
    cat = dataset.catalog(url, tables=("nodes",), job=job, whole=True)
    con = dataset.connect(cat, ("nodes",))
    cur = con.execute(STATUS_SQL)
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()
    result = QueryResult(cols, [str(d[1]) for d in cur.description], rows, False)
    notes = list(cat.notes)
    idx = {c: i for i, c in enumerate(cols)}
    unsynced = sorted(r[idx["node"]] for r in rows if not r[idx["clock_synced"]])
    errs = sorted((int(r[idx["clock_max_error_us"]] or 0) for r in rows), reverse=True)
    skew_ms = sum(errs[:2]) / 1000
    if unsynced:
        notes.append(f"clock skew: unknown: {len(unsynced)} node(s) not synchronised ({', '.join(unsynced[:5])}); "
                     f"the kernels' error bounds add up to {skew_ms:.1f} ms")
    else:
        notes.append(f"clock skew between nodes: at most {skew_ms:.3f} ms (the two largest adjtimex error bounds)")
    notes.append(f"read {cat.count(('nodes',))} nodes files")
    return (readable(result) if times == "utc" else result), notes


def query(url: str, sql: str, max_rows: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[QueryResult, list[str]]:
    """User SQL over every table of the dataset: one read-only statement (the same guard as `ingero query`),
    on a DuckDB that can reach no file, network or extension, under the same caps (store/query.py):
    rows, row and reply bytes, DuckDB memory, ``timeout_s``, and Ctrl-C."""
    check_sql_text(sql)
    cat = dataset.catalog(url, whole=True)
    con = dataset.connect(cat, schema.TABLES)
    result = run_interruptible(con, lambda c: run_on(c, check_sql(c, sql), max_rows), timeout_s)
    return result, cat.notes


def explain(url: str, *, job: str | None, since_s: float | None):
    cat = dataset.catalog(url, tables=("nodes", "chains"), job=job, since_s=since_s)
    con = dataset.connect(cat, ("nodes", "chains"))
    return findings.explain(con, cat)
