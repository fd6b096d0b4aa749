"""The three calls that run the query daemon beside a trace (made by ``daemon/hook.py``).

    daemon = Daemon(store, retain_s=..., max_db_bytes=...).start()
    ...  in the run loop, on the writer's thread, once a second:
    daemon.tick()                      # applies retention every RETENTION_INTERVAL_S
    ...  on exit (before store.close()):
    daemon.stop()

``start()`` locks the database down (memory limit, no external access, locked
configuration) and serves queries on the socket; ``tick()`` never blocks on
clients; both run on the thread that owns ``store.con``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ingero.store.retention import RETENTION_INTERVAL_S, Retention
from ingero.daemon.server import DEFAULT_MEMORY_LIMIT_BYTES, QueryServer, default_socket_path, lock_down
from ingero.errors import IngeroError
from ingero.store.db import Store


class Daemon:
    """Query server + retention around one open, writable Store."""

    def __init__(
        self,
        store: Store,
        *,
        retain_s: float | None = None,
        max_db_bytes: int | None = None,
        serve: bool = True,
        socket_path: Path | str | None = None,
        memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
        retention_interval_s: float = RETENTION_INTERVAL_S,
    ) -> None:
        try:
            self.retention = Retention(retain_s, max_db_bytes) if (retain_s or max_db_bytes) else None
        except ValueError as exc:
            raise IngeroError(f"bad --retain/--max-db: {exc}") from None
        self.store = store
        self.server = (
            QueryServer(store.con.cursor, socket_path or default_socket_path(store.path),
                        memory_limit_bytes=memory_limit_bytes) if serve else None
        )
        self._memory_limit = memory_limit_bytes
        self._interval_s = retention_interval_s
        self._next = time.monotonic() + retention_interval_s
        self.last_retention: dict[str, Any] | None = None

    def start(self) -> "Daemon":
        if self.server is not None:
            self.server.start()
        else:
            lock_down(self.store.con, memory_limit_bytes=self._memory_limit)
        return self

    def tick(self, now_ns: int | None = None) -> dict[str, Any] | None:
        """Apply retention when due; returns what it deleted (or None when not due / no bounds)."""
        if self.retention is None or time.monotonic() < self._next:
            return None
        self._next = time.monotonic() + self._interval_s
        self.last_retention = self.retention.apply(self.store.con, now_ns if now_ns is not None else time.time_ns())
        return self.last_retention

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    @property
    def socket_path(self) -> Path | None:
        return self.server.socket_path if self.server is not None else None
