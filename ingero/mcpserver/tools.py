"""What `ingero mcp`'s tools answer: plain functions over one database, no MCP in here.

Every read goes through daemon.access: the file opened read-only when no
tracer holds it, else the running tracer's socket.  SQL from a client goes
through daemon.sqlguard (one read-only statement, no acting table functions)
on either path, then runs on a connection with file, network and extension
access off (the file) or in the tracer's read-only transaction (the socket),
under a row and a time limit.  The database is the one `ingero mcp --db`
named: no tool takes a path.

Each result carries ``evidence``: the windows it rests on and SQL a user can
rerun with `ingero query` (the tools' own numbers are parameters, so the
evidence SQL is built only from integers and op names read back from the
store and checked here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ingero import values
from ingero.daemon import access, client, protocol
from ingero.daemon.sqlguard import check_sql
from ingero.errors import IngeroError
from ingero.events.ops import CUDA_OP_NAMES

# An assistant reads every row it gets: the socket's defaults suit a terminal, these a context window
# (the other caps, time, DuckDB memory, a row's size, are store.query's, as on every path).
DEFAULT_ROWS = 200
MAX_ROWS = 2_000
MAX_REPLY_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = protocol.DEFAULT_TIMEOUT_S

SESSIONS_SQL = ("SELECT session_id, status, to_timestamp(started_ns / 1e9) AS started, "
                "to_timestamp(ended_ns / 1e9) AS ended, events, drops_kernel, drops_user, command, targets "
                "FROM sessions ORDER BY session_id DESC LIMIT 100")


def _jsonable(value: Any) -> Any:
    """Rows as JSON values (timestamps, decimals, lists of them): what a client can read."""
    return json.loads(json.dumps(value, default=str))


# -- SQL -----------------------------------------------------------------------------


def query(db: Path, sql: str, max_rows: Any = DEFAULT_ROWS, timeout_s: Any = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """One read-only statement through the guard: columns, rows, truncated; evidence: the SQL."""
    from ingero.store.query import check_sql_text, from_reply, run_on

    check_sql_text(sql)  # before anything quotes it back (evidence, errors)
    rows_cap = values.parse_count(max_rows, "max_rows", cap=MAX_ROWS)
    limit_s = values.parse_duration(timeout_s, "timeout_s", cap_s=protocol.MAX_TIMEOUT_S)

    def local(con: Any) -> Any:
        return run_on(con, check_sql(con, sql), rows_cap, MAX_REPLY_BYTES)

    def remote(sock: Path) -> Any:
        return from_reply(client.query_reply(sql, socket_path=sock, max_rows=rows_cap, timeout_s=limit_s,
                                             max_bytes=MAX_REPLY_BYTES))

    res = access.read(db, user_sql=True, timeout_s=limit_s, local=local, remote=remote)
    return {"columns": res.columns, "types": res.types, "rows": _jsonable([list(r) for r in res.rows]),
            "truncated": res.truncated, "evidence": {"sql": sql.strip()}}


def list_sessions(db: Path) -> dict[str, Any]:
    """The last 100 sessions, newest first (through the same guarded path as query)."""
    out = query(db, SESSIONS_SQL, max_rows=100)
    out["sessions"] = [dict(zip(out["columns"], r)) for r in out.pop("rows")]
    return out


# -- explain and stacks ----------------------------------------------------------------


def _explain(db: Path, *, since: Any = None, pid: Any = None, session: Any = None, stack: bool = False,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """explain's payload ({"json", "text"}), from the file or the running tracer."""
    from dataclasses import asdict

    from ingero.analyze.context import Options

    opts = Options(
        session=None if session is None else values.parse_count(session, "session"),
        since_s=None if since is None else values.parse_duration(since, "since"),
        pids=() if pid is None else (values.parse_count(pid, "pid", cap=2**22),),
        stack=stack,
    )
    args = {k: v for k, v in asdict(opts).items() if v not in (None, (), False)}
    if "pids" in args:
        args["pids"] = list(args["pids"])

    def local(con: Any) -> dict[str, Any]:
        from ingero.analyze.explain import explain
        from ingero.render.json import explain_payload

        return explain_payload(explain(con, opts))

    return access.read(db, timeout_s=timeout_s, local=local,
                       remote=lambda sock: client.explain(socket_path=sock, timeout_s=timeout_s, **args))


def explain(db: Path, since: Any = None, pid: Any = None, session: Any = None) -> dict[str, Any]:
    """`ingero explain --json`'s report, plus the text view and the evidence behind each chain."""
    payload = _explain(db, since=since, pid=pid, session=session)
    report = payload["json"]
    return {**report, "text": payload["text"], "evidence": explain_evidence(report)}


def explain_evidence(report: dict[str, Any]) -> dict[str, Any]:
    """The analysed range, each chain's windows, and SQL over exactly those rows."""
    a = report.get("analysed") or {}
    sid = a.get("session_id")
    out: dict[str, Any] = {"analysed": {"session_id": sid, "start_ns": a.get("start_ns"), "end_ns": a.get("end_ns"),
                                        "window_s": a.get("window_s")}, "chains": []}
    if sid is None or a.get("start_ns") is None:
        return out
    out["sql"] = _ops_sql(int(sid), int(a["start_ns"]), int(a["end_ns"]), [])
    for ch in report.get("chains") or []:
        wins = ch.get("evidence_windows") or []
        item: dict[str, Any] = {"rule_id": ch.get("rule_id"), "windows": wins}
        if wins:
            lo = min(int(w["start_ns"]) for w in wins)
            hi = max(int(w["end_ns"]) for w in wins)
            item["sql"] = _ops_sql(int(sid), lo, hi, [int(p) for p in ch.get("pids") or []])
        out["chains"].append(item)
    return out


def _ops_sql(sid: int, start_ns: int, end_ns: int, pids: list[int]) -> str:
    """Per process and op over a range: counts, time, p99 (for `ingero query`; ints only go in)."""
    where = f"session_id = {sid} AND timestamp >= {start_ns} AND timestamp < {end_ns}"
    if pids:
        where += f" AND pid IN ({', '.join(str(p) for p in pids)})"
    return ("SELECT pid, op, count(*) AS n, sum(duration_ns) AS total_ns, "
            "quantile_cont(duration_ns, 0.99) AS p99_ns, count(*) FILTER (WHERE preempted) AS preemptions "
            f"FROM events WHERE {where} GROUP BY pid, op ORDER BY total_ns DESC")


def stacks(db: Path, pid: Any = None, op: Any = None, since: Any = None, session: Any = None) -> dict[str, Any]:
    """Call sites of the slowest CUDA calls (and the lines most preempted), from `trace --stack` data."""
    if op is not None and op not in CUDA_OP_NAMES:
        raise IngeroError(f"unknown CUDA op {str(op)[:40]!r}", "one of: " + ", ".join(sorted(CUDA_OP_NAMES)))
    payload = _explain(db, since=since, pid=pid, session=session, stack=True)
    st = payload["json"].get("stack") or {}
    callers = [c for c in st.get("top_callers") or [] if op is None or c.get("op") == op]
    a = payload["json"].get("analysed") or {}
    out: dict[str, Any] = {"top_callers": callers, "preempted_lines": st.get("preempted_lines") or [],
                           "note": st.get("note")}
    if not callers and not out["preempted_lines"]:
        out["note"] = out["note"] or "no call stacks in this range: record them with `sudo ingero trace --stack`"
    sid = a.get("session_id")
    if sid is not None:
        where = [f"e.session_id = {int(sid)}", f"e.timestamp >= {int(a['start_ns'])}",
                 f"e.timestamp < {int(a['end_ns'])}"]
        if pid is not None:
            where.append(f"e.pid = {values.parse_count(pid, 'pid')}")
        if op is not None:
            where.append(f"e.op = '{op}'")  # one of CUDA_OP_NAMES, checked above
        out["evidence"] = {
            "analysed": {"session_id": sid, "start_ns": a.get("start_ns"), "end_ns": a.get("end_ns")},
            # the innermost Python frame; an unreadable one (file NULL) leaves the stack without a site
            "sql": ("WITH site AS (SELECT stack_id, arg_min_null(file, depth) AS file, "
                    "arg_min_null(line, depth) AS line, "
                    "arg_min_null(source, depth) AS source FROM stacks WHERE frame_kind = 'python' GROUP BY stack_id "
                    "HAVING arg_min_null(file, depth) IS NOT NULL) "
                    "SELECT site.file, site.line, site.source, e.op, count(*) AS calls, "
                    "sum(e.duration_ns) AS total_ns, "
                    "max(e.duration_ns) AS max_ns FROM events e JOIN site USING (stack_id) "
                    f"WHERE {' AND '.join(where)} GROUP BY ALL ORDER BY total_ns DESC LIMIT 10"),
        }
    return out


# -- status and check -----------------------------------------------------------------


def status(db: Path) -> dict[str, Any]:
    """`ingero status --json`: the running tracer's, else the file's last session."""
    st = access.current_status(db)
    sid = (st.get("session") or {}).get("session_id")
    ev: dict[str, Any] = {"source": st.get("source")}
    if sid is not None:
        ev["sql"] = f"SELECT op, count(*) AS n FROM events WHERE session_id = {int(sid)} GROUP BY op ORDER BY n DESC"
    return {**_jsonable(st), "evidence": ev}


def check(db: Path) -> dict[str, Any]:
    """`ingero check --json`: can this machine trace (root, BTF, BCC, headers, a real BPF load ...)."""
    from ingero.check import as_dict, run_checks

    return {**as_dict(run_checks(db)), "evidence": {"command": "sudo ingero check"}}
