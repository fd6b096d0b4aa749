"""`ingero mcp`: the tools of ingero.mcpserver.tools served over stdio with the official MCP SDK.

A tool's IngeroError (bad value, refused SQL, no such session) reaches the
client as one tool error carrying the message and the hint, the same line
the CLI prints; any other exception is a bug and is reported by the SDK as a
crash (its traceback goes to this process' stderr, never to stdout, which
carries the protocol).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from ingero import __version__
from ingero.errors import IngeroError
from ingero.mcpserver import tools

INSTRUCTIONS = """ingero traces CUDA calls and the host events around them (scheduling, page faults,
block I/O) with eBPF into DuckDB, and explains why a GPU job is slow as causal chains.
Start with the `investigate` prompt, or: check -> status -> explain -> stacks / query.
Every result carries `evidence`: the windows (ns since the epoch) and SQL to rerun with
`ingero query`. Everything here is read-only."""

INVESTIGATE = """Investigate why the GPU job traced by ingero is slow{about}.

1. Call `check` only if no session exists yet: it says whether this machine can trace
   (root, BTF, BCC, kernel headers) and what to fix.
2. Call `status`: is a tracer running, which session, how many events, drops. Drops mean
   missing data: say so in the answer.
3. Call `list_sessions` if the user did not name a session; pick the newest that recorded
   events unless told otherwise.
4. Call `explain` (since="{since}"{pid_arg}). Each chain has a severity, a root cause, the
   effect on CUDA calls, the share of wall clock it explains and a concrete fix. "No causal
   chains" with what was analysed is a real answer: say the run looks healthy.
5. Drill down on the top chain: run its `evidence.chains[i].sql` with `query` and compare
   with `evidence.sql` over the whole range; call `stacks` (op = the slow CUDA op) for the
   source lines, if the trace was recorded with --stack.
6. Answer with the cause, the numbers behind it (windows, counts, latencies), the fix
   command from the chain, and the SQL the user can rerun."""

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)


def _tool_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """IngeroError -> ToolError with its one line (message; hint)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except IngeroError as exc:
            raise ToolError(f"{exc.message}" + (f" ({exc.hint})" if exc.hint else "")) from None

    return wrapper


def build(db: Path) -> MCPServer:
    """The server for one database (chosen by `ingero mcp --db`: no tool takes a path)."""
    server: MCPServer = MCPServer("ingero", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def tool(description: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            server.tool(name=fn.__name__, description=description, annotations=READ_ONLY)(_tool_errors(fn))
            return fn

        return register

    @tool("Causal chains (host cause -> slow CUDA calls -> fix) over a session or its last DURATION, as "
          "`ingero explain --json`, plus the text view and evidence (windows, SQL). since: e.g. '2m'; "
          "pid: one process; session: id (default the latest).")
    def explain(since: str | None = None, pid: int | None = None, session: int | None = None) -> dict[str, Any]:
        return tools.explain(db, since=since, pid=pid, session=session)

    @tool("Run one read-only SQL statement (SELECT, DESCRIBE, EXPLAIN, describing PRAGMAs) over the ingero "
          f"tables (events, sessions, process_names, stacks, ...). At most {tools.MAX_ROWS} rows "
          f"(default {tools.DEFAULT_ROWS}); time limit timeout_s (default {tools.DEFAULT_TIMEOUT_S:g} s). "
          "No file, network, extension or settings access.")
    def query(sql: str, max_rows: int = tools.DEFAULT_ROWS,
              timeout_s: float = tools.DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        return tools.query(db, sql, max_rows=max_rows, timeout_s=timeout_s)

    @tool("Is a tracer running: session, since when, targets, events, events/s, drops, DB size.")
    def status() -> dict[str, Any]:
        return tools.status(db)

    @tool("Can this machine trace: root, kernel, BTF, tracepoints, uprobes, BCC, headers, a real BPF load, "
          "CUDA libraries, NVIDIA driver, the database.")
    def check() -> dict[str, Any]:
        return tools.check(db)

    @tool("Top call sites (source lines) of the slowest CUDA calls and the lines most preempted, from a "
          "trace recorded with --stack. op: a CUDA op name such as cudaStreamSync.")
    def stacks(pid: int | None = None, op: str | None = None, since: str | None = None,
               session: int | None = None) -> dict[str, Any]:
        return tools.stacks(db, pid=pid, op=op, since=since, session=session)

    @tool("The recorded sessions, newest first: id, status, start/end, events, drops, command, targets.")
    def list_sessions() -> dict[str, Any]:
        return tools.list_sessions(db)

    @server.prompt(name="investigate", description="Walk through check -> status -> explain -> drill-down "
                   "queries to find why a GPU job is slow.")
    def investigate(question: str = "", since: str = "5m", pid: str = "") -> str:
        return INVESTIGATE.format(about=f" ({question})" if question else "", since=since,
                                  pid_arg=f", pid={pid}" if pid else "")

    return server


def serve(db: Path) -> None:
    """Serve over stdio until the client closes stdin."""
    build(db).run("stdio")
