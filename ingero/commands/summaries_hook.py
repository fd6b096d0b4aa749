"""The trace's per-second summaries (analyze/summaries.py), written once per flush.

A TraceHook joins the tracer (collect: the stored batch) and the window
metrics (analyze: the SQL that defines them); only the command layer may
import both, so the hook lives here and `ingero trace` always wires it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ingero.analyze import summaries
from ingero.collect import decode
from ingero.traceapi import TraceHook

BATCH = "_ingero_summary_batch"

# The flush's rows, read back from the table: appended last, they are its last
# rowids.  A scan of them in DuckDB's own storage costs less than one of the
# flush's Arrow table (0.39 us per event on a 245 k-row flush: every branch of
# the summary converts its dictionary columns again).  Checked against the batch
# (count, first and last start, summed durations) before use; when another
# writer or a compaction got in between, the Arrow table is summarised instead.
TAIL_SQL = "SELECT count(*) FROM events"
CHECK_SQL = ("SELECT count(*), min(timestamp), max(timestamp), sum(duration_ns) FROM events "
             "WHERE rowid >= $first")


class SummaryHook(TraceHook):
    """Summarise each flush's rows right after they are committed, in a transaction of their own.

    No lag is needed: summaries add up, so the rows of a second stored by two
    flushes (or a row that arrives late: an off-CPU interval is stored when it
    ends, a call when it returns) are more rows for that second, summed by the
    reader.  A late wait is found when its sync is stored, after its intervals.
    """

    def __init__(self) -> None:
        self.from_table = 0  # flushes summarised from the table's last rows
        self.from_arrow = 0  # ... from the flush's Arrow table (the check failed)

    def on_flush(self, sess: Any, recs: Any, flush_s: float) -> None:
        n = len(recs)
        if n == 0:
            return
        con = sess.store.con
        first = int(con.execute(TAIL_SQL).fetchone()[0]) - n
        got = con.execute(CHECK_SQL, {"first": first}).fetchone()
        ts = recs["ts_ns"].view(np.int64)
        want = (n, int(ts.min()) + sess.offset_ns, int(ts.max()) + sess.offset_ns,
                int(recs["duration_ns"].view(np.int64).sum()))
        with sess.store.transaction():
            if first >= 0 and tuple(int(x) if x is not None else None for x in got) == want:
                self.from_table += 1
                summaries.summarise(con, f"(SELECT * FROM events WHERE rowid >= {first})",
                                    session_id=sess.session_id)
                return
            self.from_arrow += 1
            table = decode.events_table(recs, session_id=sess.session_id, offset_ns=sess.offset_ns,
                                        stream_ops=sess.stream_ops)
            con.register(BATCH, table)
            try:
                summaries.summarise(con, BATCH, session_id=sess.session_id)
            finally:
                con.unregister(BATCH)
