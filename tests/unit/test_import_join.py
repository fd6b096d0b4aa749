"""Joining a profiler trace to a traced session of the same process (hand-made rows, known offset)."""

from __future__ import annotations

import json
import random

from ingero.importer import import_trace, join
from ingero.store.db import Store

PID, TIDS = 4242, (4242, 4250)
T0 = 1_750_000_000_000_000_000  # ns, on the traced session's clock
OFFSET = -3_456_789  # ns: the trace's clock minus the traced session's
STEP = ["cudaLaunchKernel"] * 12 + ["cudaMemcpyAsync", "cudaLaunchKernel", "cudaStreamSynchronize"]
OP = {"cudaStreamSynchronize": "cudaStreamSync"}


def _calls():
    """Per thread: 12 steps of the same op sequence, irregular gaps; the traced times."""
    rng = random.Random(7)
    out = {}
    for tid in TIDS:
        t, calls = T0 + tid, []
        for _ in range(12):
            for name in STEP:
                t += rng.randint(5_000, 120_000)
                calls.append((t, name))
        out[tid] = calls
    return out


def _make(tmp_path, *, profiled_steps=slice(3, 8)):
    store = Store.open(tmp_path / "t.duckdb")
    sid = store.begin_session(command="ingero trace", targets="test")
    calls = _calls()
    for tid, rows in calls.items():
        for t, name in rows:
            store.con.execute("INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op) "
                              "VALUES ($s, $t, 3000, $pid, $tid, $op)",
                              {"s": sid, "t": t, "pid": PID, "tid": tid, "op": OP.get(name, name)})
    # the profiler saw steps 3..7 of each thread, with its clock OFFSET away and +-2 µs of jitter
    rng = random.Random(11)
    events, corr = [], 0
    per_step = len(STEP)
    for tid, rows in calls.items():
        window = rows[profiled_steps.start * per_step: profiled_steps.stop * per_step]
        for t, name in window:
            corr += 1
            ts_ns = t + OFFSET + rng.randint(-2000, 2000)
            events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid,
                           "ts": ts_ns / 1000, "dur": 3.0, "args": {"correlation": corr}})
            if name == "cudaLaunchKernel":
                events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts_ns / 1000 + 50,
                               "dur": 40.0, "args": {"correlation": corr, "device": 0, "stream": 7}})
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return store, sid, path, calls


def test_the_trace_is_attached_to_the_traced_session_with_its_offset(tmp_path):
    store, sid, path, _ = _make(tmp_path)
    events_before = store.con.execute("SELECT count(*) FROM events").fetchone()[0]
    r = import_trace(store, path)
    a = r.joined
    assert a is not None and r.session_id == sid and a.pid == PID
    assert a.trace_calls == a.matched == 2 * 5 * len(STEP)  # every call matched
    assert abs(a.offset_ns - (-OFFSET)) < 2000  # recovered within the jitter
    assert a.residual_median_ns <= 2000
    assert store.con.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1  # no new session
    assert store.con.execute("SELECT count(*) FROM events").fetchone()[0] == events_before  # calls not doubled
    row = store.con.execute("SELECT imported_from, clock_offset_ns FROM sessions").fetchone()
    assert row == (str(path.resolve()), a.offset_ns)
    # each kernel points at the traced call that submitted it
    n, linked = store.con.execute(
        """SELECT count(*), count(e.timestamp) FROM device_activity d LEFT JOIN events e
           ON e.session_id = d.session_id AND e.tid = d.call_tid AND e.timestamp = d.call_ns
              AND e.op = 'cudaLaunchKernel'""").fetchone()
    assert n == linked == 2 * 5 * 13


def test_unrelated_sessions_are_not_joined(tmp_path):
    store, sid, path, _ = _make(tmp_path)
    store.con.execute("UPDATE events SET pid = pid + 1")  # another process
    r = import_trace(store, path)
    assert r.joined is None and r.session_id != sid


def test_a_periodic_loop_takes_the_smallest_shift():
    """Every step repeats the op sequence: shifting the trace by whole steps matches nearly as well."""
    calls = _calls()
    trace = {tid: [(t + OFFSET, OP.get(n, n)) for t, n in rows[45:105]] for tid, rows in calls.items()}
    traced = {tid: [(t, OP.get(n, n)) for t, n in rows] for tid, rows in calls.items()}
    offset, pairs = join._align_threads(trace, traced)
    assert offset == -OFFSET and len(pairs) == 120


def test_a_timeline_cupti_measured_live_is_kept_and_the_traces_not_stored_again(tmp_path):
    """`trace --cmd` stored the process' kernels from CUPTI; a profiler trace of the same run joins its
    spans and calls' alignment but not a second copy of every kernel (each count would double)."""
    from ingero.importer.report import summary_lines

    store, sid, path, calls = _make(tmp_path)
    launches = [t for t, name in calls[TIDS[0]] if name == "cudaLaunchKernel"]
    for t in launches:  # the live timeline: one kernel per launch of the first thread
        store.con.execute("INSERT INTO device_activity (session_id, device, stream, kind, start_ns, end_ns, name, "
                          "call_tid, call_ns, pid) VALUES ($s, 0, 7, 'kernel', $t + 50000, $t + 90000, 'k', $tid, "
                          "$t, $pid)", {"s": sid, "t": t, "tid": TIDS[0], "pid": PID})
    r = import_trace(store, path)
    assert r.joined is not None and r.session_id == sid
    assert (r.device, r.device_measured_live) == (0, 2 * 5 * 13)
    assert store.con.execute("SELECT count(*) FROM device_activity").fetchone()[0] == len(launches) == 12 * 13
    lines = summary_lines(r)
    assert any("kept the one CUPTI measured live" in ln and "130 kernels/copies/memsets were not stored" in ln
               for ln in lines), lines


def test_an_imported_timeline_without_a_live_one_is_stored(tmp_path):
    """Rows an earlier import stored (pid NULL before schema 15) are not a live timeline."""
    store, sid, path, _ = _make(tmp_path)
    store.con.execute("INSERT INTO device_activity (session_id, device, kind, start_ns, end_ns) "
                      "VALUES ($s, 0, 'kernel', $t, $t + 1)", {"s": sid, "t": T0})
    r = import_trace(store, path)
    assert (r.device, r.device_measured_live) == (2 * 5 * 13, 0)
