"""The trace's interface to what rides on it and what shows it; dependency-free, like ingero.events.

``collect/session.py`` records and stores.  The services the trace command
wires in (the query daemon, the host samplers, Prometheus metrics ...)
subclass ``TraceHook`` and are handed in through ``TraceOptions.hooks``; the
live view (``render/live.py``) reads the plain records below.  So collect
imports none of the layers above it, and the view none below it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


class TraceHook:
    """What a service riding on a trace is told; each method is optional work, never per event.

    The session calls them on its own (writer) thread, in ``opts.hooks`` order:

    - ``on_program(program)`` once the BPF program is loaded, before any
      library is attached (``collect.loader.Program``: the overhead budget
      takes its launch probes over here);
    - ``on_start(sess)`` once the session row exists, before the loop; returns
      lines for the start-up output (or None);
    - ``flush_rows(sess, recs)`` before each batch is stored (``recs``: the
      records about to be, in storage order): rows derived from them, as
      (table, Arrow table) pairs that are appended in the batch's own
      transaction, so a crash leaves both or neither;
    - ``session_fields(sess)`` right after: columns of the session row to set
      in that same transaction (store.update_session's names);
    - ``on_flush(sess, recs, flush_s)`` after each batch is committed;
    - ``write_second(sess)`` once a second inside the second's one transaction
      (appends only: one commit for the second's rows);
    - ``every_second(sess)`` once a second, outside any transaction (may
      delete or CHECKPOINT);
    - ``on_stopping(sess)`` once the trace ends, before the final drain, and on
      any error before the store closes (may be called twice: idempotent);
    - ``on_end(sess)`` after the last flush, before the session row is closed.

    ``close()`` is for the hook's owner, once the trace is over.  A hook that
    fails raises: it is the tracer's bug, not the user's.
    """

    def on_program(self, program: Any) -> None:
        pass

    def on_start(self, sess: Any) -> list[str] | None:
        return None

    def flush_rows(self, sess: Any, recs: "np.ndarray") -> list[tuple[str, Any]]:
        return []

    def session_fields(self, sess: Any) -> dict[str, Any]:
        return {}

    def on_flush(self, sess: Any, recs: "np.ndarray", flush_s: float) -> None:
        pass

    def write_second(self, sess: Any) -> None:
        pass

    def every_second(self, sess: Any) -> None:
        pass

    def on_stopping(self, sess: Any) -> None:
        pass

    def on_end(self, sess: Any) -> None:
        pass

    def close(self) -> None:
        """Release what the hook holds (a port, a thread)."""


@dataclass
class OpStats:
    count: int = 0
    p50_ns: float | None = None
    p95_ns: float | None = None
    p99_ns: float | None = None


@dataclass
class StartInfo:
    session_id: int
    db_path: str
    lines: list[str]  # what was attached where, what is traced


@dataclass
class TickStats:
    elapsed_s: float
    events: int  # stored so far
    events_per_s: float  # over the last tick
    drops_kernel: int
    drops_user: int
    nest_skipped: int
    ops: dict[str, OpStats]
    notes: list[str]  # new since the previous tick (new library attached ...)
    stale_calls: int = 0  # CUDA calls whose return never came (BPF counter CNT_STALE_CALLS)


@dataclass
class TraceSummary:
    session_id: int
    db_path: str
    elapsed_s: float
    events: int
    drops_kernel: int
    drops_user: int
    nest_skipped: int
    ops: dict[str, OpStats]
    ended_by: str  # 'duration' | 'SIGINT' | 'SIGTERM' | 'command exited'
    command_exit: int | None = None
    notes: list[str] = field(default_factory=list)
    # CUDA calls whose return probe never fired (left by longjmp or a C++
    # exception), counted by BPF when the thread's next call replaced their
    # state (bpf/cuda.bpf.c); they have no row in events.
    stale_calls: int = 0
    # runs of our BPF programs the kernel skipped (Program.probe_misses)
    probe_misses: int = 0
