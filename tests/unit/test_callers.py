"""top_callers / most_preempted_lines on hand-made events + stacks."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ingero.analyze.callers import most_preempted_lines, top_callers
from ingero.store.db import Store
from ingero.store.selection import Selection

MS = 1_000_000


def stack(sid, frames):
    """frames: innermost first, (kind, function, module, file, line, source)."""
    return [dict(stack_id=sid, depth=d, frame_kind=k, function=fn, module=mod, file=f, line=ln, source=src)
            for d, (k, fn, mod, f, ln, src) in enumerate(frames)]


CUDART = "/x/libcudart.so.12"
STACKS = (
    stack(1, [("native", "cudaStreamSynchronize", CUDART, None, None, None),
              ("native", "[unknown]", "/x/libffi.so", None, None, None),
              ("python", "train_step", "train.py", "train.py", 42, "loss.item()"),
              ("python", "<module>", "train.py", "train.py", 90, "train()")])
    + stack(2, [("native", "cudaMemcpy", CUDART, None, None, None),
                ("python", "load", "data.py", "data.py", 7, "x.cuda()"),
                ("python", "<module>", "train.py", "train.py", 90, "train()")])
    + stack(3, [("native", "cudaLaunchKernel", CUDART, None, None, None),
                ("native", "launch", "/x/app", None, None, None),
                ("native", "main", "/x/app", None, None, None)])
    + stack(4, [("native", "_PyEval_EvalFrameDefault", "/usr/bin/python3.11", None, None, None),
                ("python", "augment", "data.py", "data.py", 19, "img = img.flip()"),
                ("python", "<module>", "train.py", "train.py", 90, "train()")])
    + stack(5, [("python", "train_step", "train.py", "train.py", 44, "opt.step()")])
)


def ev(ts, op, dur, stack_id, pid=100, preempted=None, session=1):
    return dict(session_id=session, timestamp=ts, duration_ns=dur, pid=pid, tid=pid, op=op,
                preempted=preempted, stack_id=stack_id)


@pytest.fixture
def con():
    store = Store.memory()
    store.append("stacks", pa.Table.from_pylist(STACKS))
    events = (
        [ev(i * MS, "cudaStreamSync", 10 * MS, 1) for i in range(10)]        # 100 ms from train.py:42
        + [ev(i * MS, "cudaMemcpy", 1 * MS, 2) for i in range(30)]           # 30 ms from data.py:7
        + [ev(5 * MS, "cudaMemcpy", 40 * MS, 2, pid=101)]                     # one slow copy, other pid
        + [ev(i * MS, "cudaLaunchKernel", 100, 3) for i in range(5)]         # C++ caller
        + [ev(i * MS, "cudaLaunchKernel", 100, None) for i in range(50)]     # no stack: ignored
        + [ev(i * MS, "sched_switch", 2 * MS, 4, preempted=True) for i in range(6)]
        + [ev(i * MS, "sched_switch", 3 * MS, 5, preempted=True) for i in range(2)]
        + [ev(i * MS, "sched_switch", 50 * MS, 5, preempted=False) for i in range(9)]  # sleeps: not preemptions
        + [ev(i * MS, "cudaStreamSync", 10 * MS, 1, session=2) for i in range(99)]    # other session
    )
    store.append("events", pa.Table.from_pylist(events))
    return store.con


def test_top_callers_rank_by_time_and_name_the_line(con):
    rows = top_callers(con, Selection.whole(1))
    assert [(r["file"], r["line"], r["op"]) for r in rows] == [
        ("train.py", 42, "cudaStreamSync"), ("data.py", 7, "cudaMemcpy"), ("/x/app", None, "cudaLaunchKernel")]
    sync, copy, launch = rows
    assert sync["source"] == "loss.item()" and sync["function"] == "train_step" and sync["frame_kind"] == "python"
    assert (sync["calls"], sync["avg_ns"], sync["max_ns"], sync["total_ns"]) == (10, 10.0 * MS, 10 * MS, 100 * MS)
    assert (copy["calls"], copy["max_ns"], copy["total_ns"], copy["pids"]) == (31, 40 * MS, 70 * MS, [100, 101])
    assert copy["slow_calls"] == 1  # only the 40 ms copy is above the p90 of cudaMemcpy
    # C++ caller: innermost symbolised native frame below the CUDA entry point.
    assert (launch["function"], launch["frame_kind"], launch["calls"]) == ("launch", "native", 5)


def test_top_callers_filters_time_pid_and_limit(con):
    rows = top_callers(con, Selection(1, 0, 5 * MS, (100,)), limit=1)
    assert len(rows) == 1
    assert (rows[0]["line"], rows[0]["calls"]) == (42, 5)
    assert top_callers(con, Selection.whole(1, (101,)))[0]["calls"] == 1
    assert top_callers(con, Selection.whole(3)) == []


def test_most_preempted_lines_count_only_involuntary_switches(con):
    rows = most_preempted_lines(con, Selection.whole(1))
    assert [(r["file"], r["line"], r["preemptions"]) for r in rows] == [("data.py", 19, 6), ("train.py", 44, 2)]
    top = rows[0]
    assert top["source"] == "img = img.flip()"
    assert (top["offcpu_ns"], top["avg_offcpu_ns"], top["max_offcpu_ns"]) == (12 * MS, 2.0 * MS, 2 * MS)
    assert top["pids"] == [100]


def test_reads_the_selection_of_explains_context(con):
    from ingero.analyze.context import Context

    ctx = Context(con=con, session_id=1, start_ns=0, end_ns=100 * MS, window_ns=MS)
    assert ctx.selection == Selection(1, 0, 100 * MS, ())
    assert top_callers(con, ctx.selection)[0]["line"] == 42
    assert most_preempted_lines(con, ctx.selection)[0]["line"] == 19


def test_an_unreadable_innermost_frame_leaves_the_stack_without_a_call_site():
    """The frame outside an unreadable one is the caller: taking it for the call site would name
    the wrong line (`main()` instead of the line inside step() that made the call)."""
    store = Store.memory()
    store.append("stacks", pa.Table.from_pylist(
        stack(1, [("python", "step", "loop.py", "loop.py", 13, "cudart.cudaMalloc(p, n)"),
                  ("python", "<module>", "loop.py", "loop.py", 33, "main()")])
        + stack(2, [("python", "[unreadable]", None, None, None, None),
                    ("python", "<module>", "loop.py", "loop.py", 33, "main()")])
        # an unreadable frame further out does not matter: the call site is still readable
        + stack(3, [("python", "step", "loop.py", "loop.py", 14, "cudart.cudaStreamSynchronize(None)"),
                    ("python", "[unreadable]", None, None, None, None)])))
    store.append("events", pa.Table.from_pylist(
        [ev(i * MS, "cudaMalloc", MS, 1) for i in range(3)]
        + [ev(i * MS, "cudaMalloc", 50 * MS, 2) for i in range(5)]
        + [ev(i * MS, "cudaStreamSync", MS, 3) for i in range(2)]
        + [ev(i * MS, "sched_switch", MS, 2, preempted=True) for i in range(4)]))
    rows = top_callers(store.con, Selection.whole(1))
    assert [(r["op"], r["line"], r["calls"]) for r in rows] == [("cudaMalloc", 13, 3), ("cudaStreamSync", 14, 2)]
    assert most_preempted_lines(store.con, Selection.whole(1)) == []
