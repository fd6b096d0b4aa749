"""Synthetic replays shared by the unit tests.

Generating a replay costs seconds (the 30 s launch-bound replay is 1.1 M
rows, memory-pressure's 4.8 M), and the policy matrix, the budget, the
export and the summary tests ask for the same ones.  Writing a replay into a
store never changes it, so one generation serves every store made from it.
The modules that share replays (the 30 s spin replay of each scenario) run
on one pytest-xdist worker (the ``replays`` group: ``make test``), so the
cache serves all of them.
"""

from __future__ import annotations

import functools

import numpy as np

from ingero.demo import scenarios, synthetic
from ingero.events.records import EVENT_DTYPE, KIND_NAME_TABLE, OP_NAME_TABLE, CallFlag, Kind
from ingero.store.db import Store

_OP_CODE = {str(name): code for code, name in reversed(list(enumerate(OP_NAME_TABLE)))}
_KIND_CODE = {name: code for code, name in reversed(list(enumerate(KIND_NAME_TABLE))) if name is not None}

START_NS = 1_763_800_000 * 10**9


@functools.lru_cache(maxsize=12)
def replay(name: str, duration_s: float, policy: str, fixed: bool = False,
           start_ns: int = START_NS) -> synthetic.Replay:
    return synthetic.generate(scenarios.get(name), duration_s=duration_s, fixed=fixed, start_ns=start_ns,
                              policy=policy)


def write(store: Store, name: str, duration_s: float, policy: str, *, fixed: bool = False,
          start_ns: int = START_NS, label: str) -> Store:
    """``store`` with the replay written into it as one closed session."""
    synthetic.write(store, scenarios.get(name), replay(name, duration_s, policy, fixed, start_ns), label=label)
    return store


def records_of(con, where: str, params: dict, offset_ns: int, order_by: str = "timestamp") -> np.ndarray:
    """The EVENT_DTYPE records the tracer would have read for the stored rows selected (events.* -> struct)."""
    t = con.sql(f"""
        SELECT timestamp - {offset_ns} AS ts_ns, duration_ns, coalesce(bytes, runq_ns, 0) AS arg,
               coalesce(stream, 0) AS stream, pid, coalesce(tid, 0) AS tid, coalesce(other_pid, peer, 0) AS other_pid,
               op, kind, in_call, queued
        FROM events WHERE {where} ORDER BY {order_by}""", params=params).to_arrow_table()
    r = np.zeros(t.num_rows, dtype=EVENT_DTYPE)
    r["stack_id"] = -1
    for name in ("ts_ns", "duration_ns", "arg", "stream", "pid", "tid", "other_pid"):
        r[name] = t.column(name).to_numpy()
    for name, field, codes, null in (("op", "op", _OP_CODE, 0), ("kind", "kind", _KIND_CODE, int(Kind.NONE)),
                                     ("in_call", "call_op", _OP_CODE, 0)):
        col = t.column(name).combine_chunks()
        lookup = np.array([codes[str(v)] for v in col.dictionary.to_pylist()] + [null], dtype=np.uint8)
        idx = col.indices.fill_null(len(lookup) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
        r[field] = lookup[idx]
    queued = t.column("queued").combine_chunks()
    seen = ~queued.is_null().to_numpy(zero_copy_only=False)
    q = queued.fill_null(False).to_numpy(zero_copy_only=False)
    r["call_flags"] = np.where(seen, int(CallFlag.SEEN), 0) | np.where(q, int(CallFlag.QUEUED), 0)
    return r
