"""The trace's per-second summaries (analyze/record_summaries.py), written with each flush.

A TraceHook joins the tracer (collect: the batch about to be stored) and the
window metrics (analyze: their definition); only the command layer may import
both, so the hook lives here and `ingero trace` always wires it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ingero.analyze import summaries
from ingero.analyze.record_summaries import Summariser
from ingero.traceapi import TraceHook


class SummaryHook(TraceHook):
    """Summarise each batch from its records; the rows are stored in the batch's own transaction.

    No lag is needed: summaries add up, so the rows of a second stored by two
    flushes (or a row that arrives late: an off-CPU interval is stored when it
    ends, a call when it returns) are more rows for that second, summed by the
    reader.  A late wait is found when its sync is stored, after its intervals.

    A failure to summarise is a bug, but it must not cost the batch: the
    session's summaries are then deleted and no more are written, so explain
    summarises the raw rows instead (as it does an imported session's), and
    the session's notes say why.
    """

    def __init__(self) -> None:
        self.summariser: Summariser | None = None
        self.failed: str | None = None
        self.flushes = 0
        self.cpu_s = 0.0  # making the rows (the session counts storing them: derived_cpu_s)

    def flush_rows(self, sess: Any, recs: np.ndarray) -> list[tuple[str, Any]]:
        if self.failed or len(recs) == 0:
            return []
        if self.summariser is None:
            self.summariser = Summariser(sess.session_id, sess.offset_ns)
        c0 = time.thread_time()
        try:
            windows, late = self.summariser.rows(recs)
            rows = [(summaries.WINDOWS_TABLE, windows), (summaries.LATE_TABLE, late)]
            self.flushes += 1
            self.cpu_s += time.thread_time() - c0
            return rows
        except Exception as exc:  # noqa: BLE001 - the rows first; the bug is said, not hidden
            self.failed = f"{type(exc).__name__}: {exc}".rstrip(": ")
            for table in (summaries.WINDOWS_TABLE, summaries.LATE_TABLE):
                sess.store.con.execute(f"DELETE FROM {table} WHERE session_id = $sid", {"sid": sess.session_id})
            sess.notes.append(f"summaries: failed ({self.failed}); explain summarises this session's events instead")
            return []

    def on_end(self, sess: Any) -> None:
        if self.flushes:  # what they cost, said like every add-on's (bench/bench_summaries.py --live reads it)
            sess.notes.append(f"summaries: {self.flushes:,} flushes summarised in "
                              f"{self.cpu_s + sess.derived_cpu_s:.2f} CPU-s")
