"""The query daemon as a trace hook: serve other shells' queries, apply retention.

DuckDB allows one writer process, so while a trace runs, `ingero query`,
`explain` and `status` from other shells are answered by the tracer itself
over its socket (``on_start``).  Retention (``--retain``/``--max-db``) runs on
the writer's thread once a second, outside the second's transaction since it
may CHECKPOINT (``every_second``); the stack ids it pruned are forgotten by the
session's stack resolver.  ``on_stopping`` stops serving before the final
drain: queries in flight get "interrupted: tracer stopping" and their read
transactions end, so the closing CHECKPOINT has none to wait for.
"""

from __future__ import annotations

from typing import Any

from ingero.daemon.runtime import Daemon
from ingero.traceapi import TraceHook


class DaemonHook(TraceHook):
    def __init__(self, *, retain_s: float | None = None, max_db_bytes: int | None = None, serve: bool = True) -> None:
        self.retain_s = retain_s
        self.max_db_bytes = max_db_bytes
        self.serve = serve
        self.daemon: Daemon | None = None

    def on_start(self, sess: Any) -> list[str] | None:
        sess.daemon = self.daemon = Daemon(sess.store, retain_s=self.retain_s, max_db_bytes=self.max_db_bytes,
                                           serve=self.serve).start()
        return None

    def every_second(self, sess: Any) -> None:
        if self.daemon is None:
            return
        info = self.daemon.tick()  # retention, when due: by age even while no events arrive
        if info is not None and sess.stacks is not None and len(info.get("pruned_stack_ids", ())):
            sess.stacks.forget_stacks(info["pruned_stack_ids"])

    def on_stopping(self, sess: Any) -> None:
        if self.daemon is not None:
            self.daemon.stop()
