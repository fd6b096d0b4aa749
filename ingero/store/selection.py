"""The rows a reader looks at: one session, a time range [t0, t1), optionally some processes.

Explain's windows and summaries, the call sites of ``--stack``, every export and a
fleet segment read the store through one ``Selection``: its SQL filter names
parameters only ($sid, $t0, $t1, $all_pids, $pids), and ``params()`` gives their
values, so a filter and its values cannot disagree and nothing is ever formatted
into SQL text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Far bounds: every row of a session (timestamps are ns since the epoch, far inside).
ALL_T0, ALL_T1 = -(1 << 62), 1 << 62


@dataclass(frozen=True)
class Selection:
    session_id: int
    t0: int  # ns since the epoch, inclusive
    t1: int  # exclusive
    pids: tuple[int, ...] = ()  # empty: every process

    @classmethod
    def whole(cls, session_id: int, pids: tuple[int, ...] = ()) -> Selection:
        """Every row of the session (of ``pids``)."""
        return cls(session_id, ALL_T0, ALL_T1, pids)

    @staticmethod
    def where(alias: str = "", *, time: str = "timestamp", pids: bool = True) -> str:
        """The filter of the selected rows of a table with session_id, a time column and pid
        (``alias``: its name in the query, ``e`` for ``e.session_id``); ``pids=False``: the
        session and range only (a table of the host, or every process on purpose)."""
        c = f"{alias}." if alias else ""
        sql = f"{c}session_id = $sid AND {c}{time} >= $t0 AND {c}{time} < $t1"
        return f"{sql} AND {Selection.pid_filter(alias)}" if pids else sql

    @staticmethod
    def pid_filter(alias: str = "") -> str:
        """The processes part of the filter alone."""
        c = f"{alias}." if alias else ""
        return f"($all_pids OR list_contains($pids, {c}pid))"

    def params(self, *, pids: bool = True, **more: Any) -> dict[str, Any]:
        """The values of the filter's parameters (``pids=False``: of ``where(pids=False)``; DuckDB
        refuses a parameter the query does not name), plus ``more``."""
        p: dict[str, Any] = {"sid": self.session_id, "t0": self.t0, "t1": self.t1}
        if pids:
            # [0], not []: a list of integers even when no pid is chosen (no process is pid 0)
            p.update(all_pids=not self.pids, pids=list(self.pids) or [0])
        return {**p, **more}
