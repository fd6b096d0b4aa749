"""The trace's per-second summaries (analyze/summaries.py), written once per flush.

A TraceHook joins the tracer (collect: the stored batch as Arrow) and the
window metrics (analyze: the SQL that defines them); only the command layer
may import both, so the hook lives here and `ingero trace` always wires it.
"""

from __future__ import annotations

from typing import Any

from ingero.analyze import summaries
from ingero.collect import decode
from ingero.collect.hooks import TraceHook

BATCH = "_ingero_summary_batch"


class SummaryHook(TraceHook):
    """Summarise each flush's rows right after they are committed, in a transaction of their own.

    No lag is needed: summaries add up, so the rows of a second stored by two
    flushes (or a row that arrives late: an off-CPU interval is stored when it
    ends, a call when it returns) are more rows for that second, summed by the
    reader.  A late wait is found when its sync is stored, after its intervals.
    """

    def on_flush(self, sess: Any, recs: Any, flush_s: float) -> None:
        if len(recs) == 0:
            return
        # the columns the summary reads, as the flush stored them (dictionary-encoded ops: no strings built)
        table = decode.events_table(recs, session_id=sess.session_id, offset_ns=sess.offset_ns,
                                    stream_ops=sess.stream_ops)
        con = sess.store.con
        con.register(BATCH, table)
        try:
            with sess.store.transaction():
                summaries.summarise(con, BATCH, session_id=sess.session_id)
        finally:
            con.unregister(BATCH)
