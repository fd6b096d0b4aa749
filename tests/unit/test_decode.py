"""Kernel records -> Arrow -> the events table, on hand-made records (no BPF)."""

from __future__ import annotations

import numpy as np

from ingero.collect.decode import EVENTS_SCHEMA, events_table, monotonic_offset_ns, stream_ops
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, Kind
from ingero.store.db import Store

OFFSET = 1_700_000_000_000_000_000


def rec(**fields) -> np.ndarray:
    r = np.zeros(1, dtype=EVENT_DTYPE)
    r["stack_id"] = -1
    r["kind"] = int(Kind.NONE)
    for k, v in fields.items():
        r[k] = v
    return r


def records() -> np.ndarray:
    return np.concatenate(
        [
            rec(ts_ns=100, duration_ns=5000, arg=4096, stream=0x10, pid=42, tid=43, ret=35,
                op=int(Op.CUDA_MEMCPY_ASYNC), kind=int(Kind.H2D), cpu=1),
            rec(ts_ns=200, duration_ns=7000, arg=2500, pid=42, tid=44, other_pid=99,
                op=int(Op.SCHED_SWITCH), kind=int(Kind.PREEMPTED), stack_id=12),
            rec(ts_ns=300, duration_ns=9000, arg=0, pid=42, tid=44, other_pid=0,
                op=int(Op.SCHED_SWITCH), kind=int(Kind.SLEEP)),
            rec(ts_ns=400, duration_ns=1_000_000, arg=65536, pid=7, tid=7, other_pid=(254 << 20),
                ret=0, op=int(Op.BLOCK_IO), kind=int(Kind.READ)),
            rec(ts_ns=500, duration_ns=300, arg=1 << 20, stream=0xdead, pid=42, tid=43, ret=0,
                op=int(Op.CUDA_MALLOC)),
            rec(ts_ns=600, duration_ns=10, stream=0x77, pid=42, tid=43, ret=0, op=int(Op.CUDA_LAUNCH_KERNEL)),
        ]
    )


def test_columns_follow_the_op() -> None:
    t = events_table(records(), session_id=3, offset_ns=OFFSET)
    assert t.schema == EVENTS_SCHEMA
    rows = t.to_pylist()
    copy, pre, sleep, bio, malloc, launch = rows
    assert copy["timestamp"] == OFFSET + 100
    assert (copy["op"], copy["kind"], copy["bytes"], copy["stream"], copy["ret"], copy["cpu"]) == (
        "cudaMemcpyAsync", "H2D", 4096, 0x10, 35, 1)
    assert copy["runq_ns"] is None and copy["preempted"] is None and copy["other_pid"] is None
    assert copy["stack_id"] is None
    # sched_switch: arg is the runqueue latency, not bytes; no stream, no ret
    assert (pre["op"], pre["kind"], pre["preempted"], pre["runq_ns"], pre["bytes"]) == (
        "sched_switch", "preempted", True, 2500, None)
    assert (pre["other_pid"], pre["stack_id"], pre["stream"], pre["ret"]) == (99, 12, None, None)
    assert (sleep["kind"], sleep["preempted"], sleep["runq_ns"]) == ("sleep", False, 0)
    assert (bio["op"], bio["kind"], bio["bytes"], bio["other_pid"], bio["duration_ns"]) == (
        "block_io", "read", 65536, 254 << 20, 1_000_000)
    # allocations: bytes yes, stream no (cudaMalloc takes none)
    assert (malloc["bytes"], malloc["stream"], malloc["kind"]) == (1 << 20, None, None)
    # a launch's stream is not read by default: the record's 0 is stored as NULL
    assert (launch["op"], launch["stream"], launch["bytes"]) == ("cudaLaunchKernel", None, None)
    assert {r["session_id"] for r in rows} == {3}


def test_resolved_stack_ids_replace_kernel_ids() -> None:
    t = events_table(records(), session_id=1, offset_ns=0, stack_ids=np.array([-1, 555, -1, -1, 9, -1]))
    assert t.column("stack_id").to_pylist() == [None, 555, None, None, 9, None]


def test_empty_batch() -> None:
    t = events_table(np.zeros(0, dtype=EVENT_DTYPE), session_id=1, offset_ns=0)
    assert t.num_rows == 0 and t.schema == EVENTS_SCHEMA


def test_appends_to_the_store_by_name() -> None:
    store = Store.memory()
    n = store.append("events", events_table(records(), session_id=1, offset_ns=OFFSET))
    assert n == 6
    got = store.con.execute(
        "SELECT op, kind, bytes, runq_ns, preempted FROM events ORDER BY timestamp"
    ).fetchall()
    assert got[0] == ("cudaMemcpyAsync", "H2D", 4096, None, None)
    assert got[1] == ("sched_switch", "preempted", None, 2500, True)
    assert got[3] == ("block_io", "read", 65536, None, None)


def test_monotonic_offset_maps_monotonic_to_wall_clock() -> None:
    import time

    off = monotonic_offset_ns()
    assert abs(time.monotonic_ns() + off - time.time_ns()) < 50_000_000


def test_storage_order_groups_ops_and_keeps_arrival_order_within_each_run() -> None:
    from ingero.collect.decode import storage_order

    r = records()
    out = storage_order(np.concatenate([r, r]))
    ops = out["op"].tolist()
    assert ops == sorted(ops)
    assert len(out) == 12 and sorted(out["ts_ns"].tolist()) == sorted(np.concatenate([r, r])["ts_ns"].tolist())
    # the two kinds of switch are runs of their own; each keeps arrival order, or has it
    # reversed (every other run is: test_storage_order.py)
    switches = out[out["op"] == int(Op.SCHED_SWITCH)]["ts_ns"].tolist()
    assert switches in ([200, 200, 300, 300], [300, 300, 200, 200])
    assert out.dtype == EVENT_DTYPE


def test_call_state_becomes_in_call_and_queued_on_switches_and_faults_only() -> None:
    from ingero.events.records import CallFlag

    seen, queued = int(CallFlag.SEEN), int(CallFlag.SEEN | CallFlag.QUEUED)
    sync = int(Op.CUDA_STREAM_SYNC)
    r = np.concatenate(
        [
            # inside a sync, work queued / outside every call, nothing queued / never called CUDA
            rec(ts_ns=1, pid=1, tid=2, op=int(Op.SCHED_SWITCH), kind=int(Kind.SLEEP), call_op=sync, call_flags=queued),
            rec(ts_ns=2, pid=1, tid=2, op=int(Op.SCHED_SWITCH), kind=int(Kind.SLEEP), call_op=0, call_flags=seen),
            rec(ts_ns=3, pid=1, tid=3, op=int(Op.SCHED_SWITCH), kind=int(Kind.SLEEP), call_op=0, call_flags=0),
            rec(ts_ns=4, pid=1, tid=2, op=int(Op.PAGE_FAULT), ret=6, call_op=int(Op.CUDA_MALLOC), call_flags=queued),
            rec(ts_ns=5, pid=1, tid=2, op=int(Op.PAGE_FAULT), ret=-32768 + 6, call_op=0, call_flags=queued),
            # other records leave the bytes unset: whatever they hold is not stored
            rec(ts_ns=6, pid=1, tid=2, op=int(Op.BLOCK_IO), ret=-5, call_op=sync, call_flags=queued),
            rec(ts_ns=7, pid=1, tid=2, op=int(Op.CUDA_LAUNCH_KERNEL), ret=999, call_op=sync, call_flags=queued),
        ]
    )
    t = events_table(r, session_id=1, offset_ns=0)
    assert t.schema.field("in_call").type == t.schema.field("op").type
    got = [(x["in_call"], x["queued"], x["ret"]) for x in t.to_pylist()]
    assert got == [
        ("cudaStreamSync", True, None),
        (None, False, None),
        (None, None, None),
        ("cudaMalloc", True, 6),
        (None, True, -32762),
        (None, None, -5),
        (None, None, 999),
    ]
    store = Store.memory()
    store.append("events", t)
    assert store.con.execute(
        "SELECT count(*) FILTER (queued), count(*) FILTER (NOT queued), count(in_call) FROM events"
    ).fetchone() == (3, 1, 2)


def test_batch_without_switches_or_faults_has_null_call_state() -> None:
    t = events_table(rec(op=int(Op.CUDA_MALLOC), call_op=5, call_flags=3), session_id=1, offset_ns=0)
    assert t.column("in_call").null_count == 1 and t.column("queued").null_count == 1
    assert t.schema == EVENTS_SCHEMA


def test_call_state_of_a_strided_view_of_records() -> None:
    from ingero.events.records import CallFlag

    r = np.concatenate([rec(op=int(Op.SCHED_SWITCH), kind=int(Kind.SLEEP), call_op=int(Op.CUDA_MEMCPY),
                            call_flags=int(CallFlag.SEEN)), rec(op=int(Op.BLOCK_IO), call_op=1, call_flags=3)] * 3)
    t = events_table(r[::2], session_id=1, offset_ns=0)
    assert [(x["in_call"], x["queued"]) for x in t.to_pylist()] == [("cudaMemcpy", False)] * 3


def _streams(launch_streams: bool) -> dict[str, int | None]:
    r = np.concatenate(
        [
            rec(ts_ns=1, op=int(Op.CUDA_LAUNCH_KERNEL), stream=0x5150),
            rec(ts_ns=2, op=int(Op.CU_LAUNCH_KERNEL), stream=0x7E57),
            rec(ts_ns=3, op=int(Op.CUDA_MEMCPY_ASYNC), kind=int(Kind.D2H), stream=0x5150),
            rec(ts_ns=4, op=int(Op.CU_STREAM_SYNC), stream=0),  # the legacy default stream: 0, not NULL
            rec(ts_ns=5, op=int(Op.CUDA_GRAPH_LAUNCH), stream=0x99),
            rec(ts_ns=6, op=int(Op.CUDA_MALLOC), stream=0xdead),  # takes no stream: whatever is there is not stored
        ]
    )
    t = events_table(r, session_id=1, offset_ns=0, stream_ops=stream_ops(launch_streams))
    return {x["op"]: x["stream"] for x in t.to_pylist()}


def test_launch_streams_are_null_unless_they_were_read() -> None:
    assert _streams(launch_streams=False) == {
        "cudaLaunchKernel": None, "cuLaunchKernel": None,
        "cudaMemcpyAsync": 0x5150, "cuStreamSynchronize": 0, "cudaGraphLaunch": 0x99, "cudaMalloc": None,
    }
    assert _streams(launch_streams=True) == {
        "cudaLaunchKernel": 0x5150, "cuLaunchKernel": 0x7E57,
        "cudaMemcpyAsync": 0x5150, "cuStreamSynchronize": 0, "cudaGraphLaunch": 0x99, "cudaMalloc": None,
    }


def test_a_launch_on_the_default_stream_is_0_with_streams() -> None:
    t = events_table(rec(op=int(Op.CUDA_LAUNCH_KERNEL), stream=0), session_id=1, offset_ns=0,
                     stream_ops=stream_ops(True))
    assert t.column("stream").to_pylist() == [0]
