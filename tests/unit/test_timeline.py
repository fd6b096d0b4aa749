"""analyze/device/imported.py on the four real traces against truth computed from their JSON, and on hand-made rows."""

from __future__ import annotations

import pytest

from ingero.analyze.device import imported
from ingero.importer import import_trace
from ingero.store.db import Store
import kineto_truth as truth


@pytest.fixture(scope="module")
def imported_runs():
    store = Store.memory()
    sessions = {name: import_trace(store, truth.DATA / name).session_id for name in truth.TRACES}
    yield store, sessions
    store.close()


@pytest.mark.parametrize("name", truth.TRACES)
def test_measured_busy_share_matches_the_union_of_device_intervals(imported_runs, name):
    store, sessions = imported_runs
    trace = truth.load(name)
    expected = truth.busy_share(trace)
    dev = imported.device(store.con, sessions[name])
    assert dev is not None
    assert dev.span_source == ("steps" if truth.steps(trace) else "calls")
    assert abs(dev.busy_share - expected) * 100 < 1.0, (dev.busy_share, expected)


@pytest.mark.parametrize("name", truth.TRACES)
def test_steps_counted_exactly_with_durations_within_one_percent(imported_runs, name):
    store, sessions = imported_runs
    expected = truth.steps(truth.load(name))
    got = imported.steps(store.con, sessions[name])
    if not expected:
        assert got is None
        return
    assert got.count == len(expected)
    assert [s.number for s in got.steps] == [n for n, _, _ in expected]
    for step, (_, s, e) in zip(got.steps, expected):
        assert abs(step.duration_ms - (e - s) / 1e6) <= 0.01 * (e - s) / 1e6
        assert step.dataloader_ns == 0  # none of these traces marks data loading
        assert 0 <= step.device_busy_ns <= step.end_ns - step.start_ns
        assert step.device_busy_share == step.device_busy_ns / (step.end_ns - step.start_ns)


def test_v100_is_gpu_bound_and_its_steps_are_about_95_ms(imported_runs):
    """The figures issue 26 quotes: busy 97.4% of the steps' span; 5 steps."""
    store, sessions = imported_runs
    dev = imported.device(store.con, sessions["v100_rank0.pt.trace.json.gz"])
    assert round(dev.busy_share * 100, 1) == 97.4
    steps = imported.steps(store.con, sessions["v100_rank0.pt.trace.json.gz"])
    assert steps.count == 5 and round(steps.median_ms) == 96


MS = 1_000_000


def _store_with(rows_device, rows_spans=()):
    store = Store.memory()
    for r in rows_device:
        store.con.execute("INSERT INTO device_activity (session_id, device, stream, kind, start_ns, end_ns) "
                          "VALUES (1, 0, $stream, 'kernel', $s, $e)", dict(zip(("stream", "s", "e"), r)))
    for r in rows_spans:
        store.con.execute("INSERT INTO spans (session_id, pid, tid, start_ns, end_ns, name, category) "
                          "VALUES (1, 10, 10, $s, $e, $name, 'user_annotation')", dict(zip(("name", "s", "e"), r)))
    return store


def test_per_stream_busy_and_overlap_on_hand_made_rows():
    # stream 7: [0,10) and [5,20) -> busy 20; stream 9: [15,30) -> busy 15; both run in [15,20)
    store = _store_with([(7, 0, 10 * MS), (7, 5 * MS, 20 * MS), (9, 15 * MS, 30 * MS)],
                        [("ProfilerStep#1", 0, 40 * MS)])
    dev = imported.device(store.con, 1)
    assert (dev.span_start_ns, dev.span_end_ns, dev.span_source) == (0, 40 * MS, "steps")
    assert dev.busy_ns == 30 * MS and dev.busy_share == 0.75
    assert dev.overlap_ns == 5 * MS
    assert [(s.stream, s.busy_ns, s.overlap_ns) for s in dev.streams] == [(7, 20 * MS, 5 * MS), (9, 15 * MS, 5 * MS)]


def test_range_clips_the_span_and_the_intervals():
    store = _store_with([(7, 0, 10 * MS), (9, 15 * MS, 30 * MS)], [("ProfilerStep#1", 0, 40 * MS)])
    dev = imported.device(store.con, 1, start_ns=5 * MS, end_ns=25 * MS)
    assert (dev.span_start_ns, dev.span_end_ns) == (5 * MS, 25 * MS)
    assert dev.busy_ns == 15 * MS  # [5,10) + [15,25)


def test_steps_with_dataloader_time():
    spans = [("ProfilerStep#3", 0, 100 * MS), ("ProfilerStep#4", 100 * MS, 300 * MS),
             ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 40 * MS),
             ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100 * MS, 250 * MS)]
    store = _store_with([], spans)
    st = imported.steps(store.con, 1)
    assert st.count == 2 and [s.number for s in st.steps] == [3, 4]
    assert [s.dataloader_ns for s in st.steps] == [40 * MS, 150 * MS]
    assert [s.device_busy_ns for s in st.steps] == [None, None]  # no device timeline: not measured
    assert st.steps[0].device_busy_share is None
    assert st.median_ms == 150.0 and st.p99_ms == pytest.approx(199.0)
    assert st.steps[1].dataloader_share == 0.75
    assert imported.device(store.con, 1) is None


def test_no_steps_no_device():
    store = Store.memory()
    assert imported.steps(store.con, 1) is None
    assert imported.device(store.con, 1) is None
    assert imported.analysed_span(store.con, 1) is None
