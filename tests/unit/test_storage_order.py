"""decode.storage_order: the rows the tracer stores are the records it read, in an order chosen for size.

storage_order groups a flush's records by op, process and the few-valued
attributes (stream, bytes, other_pid / peer, kind, thread, call state) and
reverses every other run (docs/benchmarks.md, bytes per event).  What must
hold: the same records come out, nothing altered; the grouping is what the
hooks rely on (one slice per op; a summary row's records in few runs); the
stored rows and every documented query read the same as for
the records stored in arrival order; the NCCL join does not depend on it.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_op_enum import PROMISED, documented_queries

from bench.bench_ingest import _realistic
from ingero.collect import decode, ranks
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, NCCL_EXT_DTYPE
from ingero.store.db import Store

OFFSET = 1_700_000_000 * 10**9
_RAW = np.dtype((np.void, EVENT_DTYPE.itemsize))


def _as_set(recs: np.ndarray) -> np.ndarray:
    return np.sort(np.ascontiguousarray(recs).view(_RAW))


def _attrs(r: np.ndarray) -> tuple:
    op = int(r["op"])
    state = op in (Op.SCHED_SWITCH, Op.PAGE_FAULT)
    return (int(r["stream"]), int(r["arg"]) if decode._BYTES_MASK[op] else None,
            int(r["other_pid"]) if decode._OTHER_MASK[op] or decode._PEER_MASK[op] else None, int(r["kind"]),
            None if op == Op.BLOCK_IO else int(r["tid"]),
            (int(r["call_op"]), int(r["call_flags"])) if state else None)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1000, 70_000])
def test_the_same_records_come_out_grouped_by_op(n: int) -> None:
    recs = _realistic(n, seed=n) if n else np.zeros(0, EVENT_DTYPE)
    out = decode.storage_order(recs)
    assert out.dtype == EVENT_DTYPE and len(out) == n
    assert np.array_equal(_as_set(out), _as_set(recs))  # byte for byte, as a multiset
    assert (np.diff(out["op"].astype(int)) >= 0).all()  # Aggregates.add and the hooks take one slice per op


def test_arbitrary_bytes_come_out_unaltered() -> None:
    """Every field any value (ops masked to real ones): a permutation, nothing else."""
    rng = np.random.default_rng(5)
    recs = np.frombuffer(rng.bytes(EVENT_DTYPE.itemsize * 5000), dtype=EVENT_DTYPE).copy()
    recs["op"] = rng.choice([int(o) for o in Op], len(recs))
    out = decode.storage_order(recs)
    assert np.array_equal(_as_set(out), _as_set(recs))


def test_runs_of_one_op_pid_and_attributes_alternate_direction() -> None:
    recs = _realistic(20_000, seed=3)
    recs["ts_ns"] = np.arange(len(recs), dtype=np.uint64)  # arrival order = ts order
    out = decode.storage_order(recs)
    keys = [(int(r["op"]), int(r["pid"]) & 0xFFFF, _attrs(r)) for r in out]
    runs, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            runs.append((keys[start], out["ts_ns"][start:i]))
            start = i
    assert len({k for k, _ in runs}) == len(runs), "a key's records are one run"
    assert len(runs) > 20
    for i, (_, ts) in enumerate(runs):
        d = np.diff(ts.astype(np.int64))
        assert (d > 0).all() if i % 2 == 0 else (d < 0).all(), f"run {i}: arrival order, every other one reversed"


def test_too_many_runs_are_left_in_arrival_order() -> None:
    """A flush of thousands of distinct copy sizes: grouped, no run reversed (the loop would cost)."""
    n = 2 * decode._MAX_REVERSED_RUNS + 10
    recs = np.zeros(n, EVENT_DTYPE)
    recs["op"], recs["pid"], recs["stack_id"] = int(Op.CUDA_MEMCPY), 42, -1
    recs["arg"] = np.arange(n) % (decode._MAX_REVERSED_RUNS + 5) + 1
    recs["ts_ns"] = np.arange(n)
    out = decode.storage_order(recs)
    assert np.array_equal(_as_set(out), _as_set(recs))
    for size in (1, 7, 100):
        assert np.diff(out["ts_ns"][out["arg"] == size].astype(np.int64)).min() > 0


def _store(recs: np.ndarray, *, ordered: bool) -> Store:
    store = Store.memory()
    for i in range(0, len(recs), 7_000):  # several flushes, as the tracer stores them
        batch = recs[i : i + 7_000]
        if ordered:
            batch = decode.storage_order(batch)
        store.append("events", decode.events_table(batch, session_id=1, offset_ns=OFFSET))
    store.con.execute("INSERT INTO process_names (pid, name) VALUES (4300, 'python3 (worker)'), (911, 'stress')")
    store.con.execute("INSERT INTO process_history (pid, from_ns, name) VALUES (4242, 0, 'python3 (train.py)')")
    return store


@pytest.fixture(scope="module")
def stores():
    recs = _realistic(30_000, seed=9)
    recs["ts_ns"] = (10**12 + np.arange(len(recs)) * 1_000_000).astype(np.uint64)  # no two at one ns: ORDER BY is total
    return _store(recs, ordered=True), _store(recs, ordered=False)


def test_stored_rows_are_the_records_in_arrival_order_stored(stores) -> None:
    a, b = (s.con.execute("SELECT * FROM events ORDER BY ALL").fetchall() for s in stores)
    assert len(a) == 30_000 and a == b


@pytest.mark.parametrize("query", PROMISED + documented_queries())
def test_documented_queries_read_the_same(stores, query) -> None:
    ordered, arrival = stores
    params = {"p": 4242, "t": 10**19} if "$p" in query else None
    a = ordered.con.execute(query, params).fetchall()
    b = arrival.con.execute(query, params).fetchall()
    if "ORDER BY" not in query.upper():
        a, b = sorted(a, key=repr), sorted(b, key=repr)
    assert a == b


def _call(op: Op, ts: int) -> np.ndarray:
    r = np.zeros(1, EVENT_DTYPE)
    r["op"], r["tid"], r["pid"], r["ts_ns"], r["duration_ns"], r["stack_id"], r["kind"] = int(op), 7, 5, ts, 10, -1, 15
    return r


def _ext(op: Op, ts: int, comm: int, uid: tuple, color: int = -1) -> np.ndarray:
    x = np.zeros(1, NCCL_EXT_DTYPE)
    x["op"], x["call_op"], x["tid"], x["pid"], x["ts_ns"] = int(Op.NCCL_EXT), int(op), 7, 5, ts
    x["comm"], x["rank"], x["nranks"], x["color"], x["id"] = comm, 0, 2, color, uid
    return x.view(EVENT_DTYPE)


@pytest.mark.parametrize("before", [0, 1, 2])
def test_the_nccl_join_reads_calls_in_time_order(before: int) -> None:
    """Two inits make a comm at one address (the first destroyed in between): a later split
    is named after the second, whether storage_order reversed the inits' run or not."""
    other = [_call(Op.CUDA_MEMCPY, ts=50 + i) for i in range(before)]  # shifts the inits' run's parity
    for r, o in zip(other, (Op.CUDA_MEMCPY, Op.CUDA_MALLOC)):
        r["op"] = int(o)
    join = ranks.NcclJoin(session_id=1, offset_ns=0)
    _, _, rows = join.join(decode.storage_order(np.concatenate([
        *other,
        _ext(Op.NCCL_COMM_INIT_RANK, 100, 0xC0, (1, 1)), _call(Op.NCCL_COMM_INIT_RANK, 100),
        _ext(Op.NCCL_COMM_INIT_RANK, 200, 0xC0, (2, 2)), _call(Op.NCCL_COMM_INIT_RANK, 200),
        _ext(Op.NCCL_COMM_SPLIT, 300, 0x5B, (0xC0, 5), color=3), _call(Op.NCCL_COMM_SPLIT, 300),
    ])))
    split = [r for r in rows if r["comm"] == 0x5B]
    assert [r["comm_id"] for r in split] == [(2).to_bytes(8, "little").hex() * 2 + "/3"]
