"""The trace's per-second summaries (analyze/summaries/records.py), written every few flushes.

A TraceHook joins the tracer (collect: the batch about to be stored) and the
window metrics (analyze: their definition); only the command layer may import
both, so the hook lives here and `ingero trace` always wires it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from ingero.analyze import summaries
from ingero.analyze.summaries.records import Summariser
from ingero.events.units import NS
from ingero.store.faults import STORAGE_ERRORS, write_error
from ingero.traceapi import TraceHook

# The windows rows of this many flushes are stored together, in the last one's transaction.
# An INSERT costs 0.5-2 ms here whatever its size (264 rows 1.1 ms, 54 rows 0.5 ms: DuckDB's
# work per statement), which was half of what the summaries cost the tracer: 0.10-0.12 CPU-s
# over 20 flushes of 50 k events, 0.07-0.08 writing every fourth (docs/benchmarks.md).
WRITE_EVERY_FLUSHES = 4
# ... or once the oldest rows held are this old (a trace that flushes rarely: written once a
# second by every_second), or this many are held (memory: ~200 B a row).
WRITE_AFTER_S = 4.0
MAX_HELD_ROWS = 100_000
# A flush's rows of a second this much older than its newest are written with it (see flush_rows).
OLD_ROW_S = 4.0


class SummaryHook(TraceHook):
    """Summarise each batch from its records; store the rows with a batch's transaction.

    No lag is needed: summaries add up, so the rows of a second stored by two
    flushes (or a row that arrives late: an off-CPU interval is stored when it
    ends, a call when it returns) are more rows for that second, summed by the
    reader.  A late wait is found when its sync is stored, after its intervals.

    The ``windows`` rows of a flush are held and written with those of the
    next few (WRITE_EVERY_FLUSHES).  Meanwhile the session row says from which
    second on they are incomplete (``summaries_pending_ns``, set in each
    flush's transaction): every stored event not yet summarised in the table
    starts in a second held, so the seconds before the first one held are
    whole, and readers summarise the rest from events (summaries.relations).
    A tracer killed before writing its rows loses nothing but that speed, and
    the next tracer on the file summarises those seconds into the table.
    The late waits are few and are written with their flush: complete always.

    A failure to summarise is a bug, but it must not cost the batch: the
    session's summaries are then deleted and no more are written, so explain
    summarises the raw rows instead (as it does an imported session's), and
    the session's notes say why.
    """

    def __init__(self) -> None:
        self.summariser: Summariser | None = None
        self.failed: str | None = None
        self.flushes = 0
        self.writes = 0  # windows INSERTs
        self.cpu_s = 0.0  # making the rows (the session counts storing them: derived_cpu_s) ...
        self.own_write_cpu_s = 0.0  # ... but for those this hook stores itself (every_second, on_end)
        self._held: list[pa.Table] = []
        self._held_rows = 0
        self._held_flushes = 0
        self._held_since = 0.0  # monotonic time the oldest rows held were made
        self._pending_ns: int | None = None  # the first second held

    def on_start(self, sess: Any) -> list[str] | None:
        # a tracer killed with rows held left its session marked (crashed sessions are marked by
        # now): its last seconds are summarised from its events into the table, while they are
        # still there (retention deletes events, never summaries)
        for sid, pending in summaries.pending_sessions(sess.store.con, "crashed"):
            with sess.store.transaction():
                summaries.complete_pending(sess.store.con, sid, pending)
                sess.store.update_session(sid, summaries_pending_ns=None)
        return None

    def flush_rows(self, sess: Any, recs: np.ndarray) -> list[tuple[str, Any]]:
        if self.failed or len(recs) == 0:
            return []
        if self.summariser is None:
            self.summariser = Summariser(sess.session_id, sess.offset_ns)
        c0 = time.thread_time()
        try:
            windows, late = self.summariser.rows(recs)
        except Exception as exc:  # noqa: BLE001 - the rows first; the bug is said, not hidden
            self.failed = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self._drop()
            for table in (summaries.WINDOWS_TABLE, summaries.LATE_TABLE):
                sess.store.con.execute(f"DELETE FROM {table} WHERE session_id = $sid", {"sid": sess.session_id})
            sess.notes.append(f"summaries: failed ({self.failed}); explain summarises this session's events instead")
            return []
        self.flushes += 1
        rows = [(summaries.LATE_TABLE, late)]
        if windows.num_rows:
            # rows of a second long before the flush's newest (an off-CPU interval stored when it
            # ended, after a long sleep) go with the flush: held, they would set the mark back by
            # their whole age, and readers summarise everything after the mark from the events
            start = windows.column("start_ns").to_numpy()
            old = start < int(start.max()) - int(OLD_ROW_S * NS)
            if old.any():
                rows.append((summaries.WINDOWS_TABLE, windows.filter(old)))
                windows, start = windows.filter(~old), start[~old]
            if not self._held:
                self._held_since = time.monotonic()
            self._held.append(windows)  # (never empty: the newest second is not old)
            self._held_rows += windows.num_rows
            first = int(start.min())
            self._pending_ns = first if self._pending_ns is None else min(self._pending_ns, first)
        self._held_flushes += 1
        if self._held and (self._held_flushes >= WRITE_EVERY_FLUSHES or self._held_rows >= MAX_HELD_ROWS
                           or time.monotonic() - self._held_since >= WRITE_AFTER_S):
            rows.append((summaries.WINDOWS_TABLE, self._take()))
        self.cpu_s += time.thread_time() - c0
        return rows

    def session_fields(self, sess: Any) -> dict[str, Any]:
        # (after flush_rows: NULL in the transaction that writes what was held)
        return {} if self.summariser is None else {"summaries_pending_ns": self._pending_ns}

    def every_second(self, sess: Any) -> None:
        if self._held and time.monotonic() - self._held_since >= WRITE_AFTER_S:
            self._write_held(sess)  # a trace that flushes rarely: its rows are not held for long

    def on_end(self, sess: Any) -> None:
        if self._held:
            self._write_held(sess)
        if self.flushes:  # what they cost, said like every add-on's (bench/bench_summaries.py --live reads it)
            stored = sess.derived_cpu_s + self.own_write_cpu_s
            sess.notes.append(f"summaries: {self.flushes:,} flushes summarised in {self.cpu_s + stored:.2f} CPU-s "
                              f"(making the rows {self.cpu_s:.2f}, storing them {stored:.2f}; "
                              f"{self.writes:,} writes)")

    def _take(self) -> pa.Table:
        """The rows held, as one table, to be written; none held after."""
        rows = pa.concat_tables(self._held)
        self.writes += 1
        self._drop()
        return rows

    def _drop(self) -> None:
        self._held, self._held_rows, self._held_flushes, self._pending_ns = [], 0, 0, None

    def _write_held(self, sess: Any) -> None:
        """The rows held, stored now in their own transaction with the session row's mark cleared."""
        c0 = time.thread_time()
        pending, rows = self._pending_ns, self._take()
        try:
            with sess.store.transaction():
                sess.store.append(summaries.WINDOWS_TABLE, rows)
                sess.store.update_session(sess.session_id, summaries_pending_ns=None)
        except STORAGE_ERRORS as exc:  # rolled back: the session row still marks them pending
            self._held, self._held_rows, self._pending_ns = [rows], rows.num_rows, pending
            raise write_error(exc, sess.store.path) from None
        self.own_write_cpu_s += time.thread_time() - c0
