"""The synthetic trace generator's rows are what a tracer could record: internally consistent,
and with the physics of the wait policy (spin, yield, block)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from ingero.demo import scenarios, synthetic
from ingero.demo.timeline import POLL_NS, WAKE_NS
from ingero.store.db import Store

START_NS = 10**18
POLICIES = ("spin", "yield", "block")
WAITING_CALLS = {"cudaStreamSync", "cudaMemcpy"}


def _rows(name: str, policy: str, steps: int = 80, fixed: bool = False) -> list[dict]:
    r = synthetic.generate(scenarios.get(name), steps=steps, start_ns=START_NS, policy=policy, fixed=fixed)
    return r.events.table(1).to_pylist()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", scenarios.names())
def test_off_cpu_intervals_and_calls_of_a_thread_never_overlap(name, policy):
    rows = _rows(name, policy)
    off: dict[int, list[tuple[int, int]]] = defaultdict(list)
    calls: dict[int, list[tuple[int, int]]] = defaultdict(list)  # per thread (a multi-rank job has several)
    for r in rows:
        if r["op"] == "sched_switch":
            off[r["tid"]].append((r["timestamp"], r["timestamp"] + r["duration_ns"]))
        elif r["op"].startswith(("cuda", "nccl")):
            calls[r["tid"]].append((r["timestamp"], r["timestamp"] + r["duration_ns"]))
    for spans in [*off.values(), *calls.values()]:
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["cpu-contention", "memcpy-bottleneck", "healthy"])
def test_off_cpu_rows_lie_inside_the_call_they_name(name, policy):
    rows = _rows(name, policy)
    calls = sorted((r["timestamp"], r["timestamp"] + r["duration_ns"], r["op"]) for r in rows
                   if r["op"].startswith("cuda"))
    for r in rows:
        if r["op"] != "sched_switch" or r["pid"] != synthetic.LOOP_PID:
            continue
        inside = [op for s, e, op in calls if s <= r["timestamp"] < e]
        assert inside == ([r["in_call"]] if r["in_call"] else [])
        if r["in_call"]:
            s, e, _ = next(c for c in calls if c[0] <= r["timestamp"] < c[1])
            assert r["timestamp"] + r["duration_ns"] <= e


@pytest.mark.parametrize("policy", POLICIES)
def test_in_call_is_what_the_store_derives_from_the_calls(policy):
    """The generator's in_call equals store.derive's (the SQL BPF's tags are checked against)."""
    sc = scenarios.get("cpu-contention")
    r = synthetic.generate(sc, steps=60, start_ns=START_NS, policy=policy)
    store = Store.memory()
    sid = synthetic.write(store, sc, r, label="t")
    want = sorted(((x["tid"], x["timestamp"], x["in_call"]) for x in r.events.table(sid).to_pylist()
                   if x["op"] == "sched_switch"), key=lambda x: (x[0], x[1], x[2] or ""))
    got = store.con.execute("SELECT tid, timestamp, in_call FROM events WHERE op = 'sched_switch' "
                            "ORDER BY tid, timestamp, coalesce(in_call, '')").fetchall()
    assert got == want


def _inside(rows: list[dict], kind: str, calls=WAITING_CALLS) -> list[dict]:
    return [r for r in rows if r["op"] == "sched_switch" and r["kind"] == kind and r["in_call"] in calls]


@pytest.mark.parametrize("name", ["healthy", "sync-heavy", "memcpy-bottleneck", "cpu-contention"])
def test_sleeps_inside_waits_only_when_blocking(name):
    assert _inside(_rows(name, "spin"), "sleep") == []
    assert _inside(_rows(name, "yield"), "sleep") == []
    blocked = _inside(_rows(name, "block"), "sleep")
    assert blocked and all(r["runq_ns"] >= WAKE_NS for r in blocked)


def test_blocking_sync_is_one_sleep_per_sync_that_waits():
    rows = _rows("healthy", "block", steps=40)
    syncs = [r for r in rows if r["op"] == "cudaStreamSync"]
    assert len(syncs) == 40
    assert len(_inside(rows, "sleep", {"cudaStreamSync"})) == 40  # 16 ms of kernels: every sync waits


@pytest.mark.parametrize("policy", ["spin", "yield"])
def test_alone_on_its_core_a_spinning_or_yielding_loop_never_leaves_the_cpu_inside_a_wait(policy):
    rows = _rows("healthy", policy)
    assert [r for r in rows if r["op"] == "sched_switch" and r["pid"] == synthetic.LOOP_PID] == []
    syncs = [r for r in rows if r["op"] == "cudaStreamSync"]
    assert syncs and min(r["duration_ns"] for r in syncs) > 10_000_000  # spins through ~16 ms of kernels


def test_contention_preempts_a_spinning_sync_and_every_yield_switches_out():
    """Under contention: spin is preempted inside syncs now and then; yield leaves the CPU at
    every poll while a hog is runnable, so every sync that waits holds preemption rows."""
    spin = _rows("cpu-contention", "spin", steps=150)
    yld = _rows("cpu-contention", "yield", steps=150)
    base = int(150 * scenarios.BASELINE_SHARE)
    for rows in (spin, yld):
        pre = _inside(rows, "preempted", {"cudaStreamSync"})
        assert pre and all(r["preempted"] and r["other_pid"] >= synthetic.HOG_PID0 for r in pre)
    syncs = sorted((r["timestamp"], r["timestamp"] + r["duration_ns"]) for r in yld if r["op"] == "cudaStreamSync")
    caused = syncs[base:]
    pre_ts = sorted(r["timestamp"] for r in _inside(yld, "preempted", {"cudaStreamSync"}))
    with_switch = sum(any(s <= t < e for t in pre_ts) for s, e in caused)
    assert with_switch == len(caused)
    # a yield switch-out ends in the next poll; back-to-back they fill the sync but a poll
    assert len(_inside(yld, "preempted", {"cudaStreamSync"})) > len(_inside(spin, "preempted", {"cudaStreamSync"}))


def test_spinning_sync_returns_late_only_when_off_cpu_at_the_device_finish():
    """A preemption inside a spinning sync delays its return only when the device finished while
    the thread was off the CPU: then it returns a poll after the preemption ends, else a poll
    after the device is done."""
    sc = scenarios.get("cpu-contention")
    r = synthetic.generate(sc, steps=150, start_ns=START_NS, policy="spin")
    rows = r.events.table(1).to_pylist()
    pre = [(x["timestamp"], x["timestamp"] + x["duration_ns"]) for x in _inside(rows, "preempted", {"cudaStreamSync"})]
    syncs = sorted((x["timestamp"], x["timestamp"] + x["duration_ns"]) for x in rows if x["op"] == "cudaStreamSync")
    assert len(syncs) == len(r.sync_device_done_ns) == 150
    late = 0
    for (start, end), done in zip(syncs, r.sync_device_done_ns):
        off_at_done = [e for s, e in pre if s <= done < e and start <= s < end]
        if off_at_done:
            late += 1
            assert end == off_at_done[0] + POLL_NS
        else:
            assert end == max(done, start) + POLL_NS
    assert late  # some syncs were preempted across the device finish, and only those are late


def test_unknown_policy_is_a_one_line_error():
    from ingero.errors import IngeroError

    with pytest.raises(IngeroError, match="unknown wait policy 'sleepy'"):
        synthetic.generate(scenarios.get("healthy"), steps=2, policy="sleepy")


def test_event_batch_spreads_n_replayed_rows_over_the_span():
    import numpy as np

    t = synthetic.event_batch(7, START_NS, START_NS + 10**9, 5000, np.random.default_rng(1))
    assert t.num_rows == 5000
    ts = t["timestamp"].to_pylist()
    assert ts == sorted(ts) and ts[0] == START_NS and ts[-1] < START_NS + 10**9
    assert set(t["session_id"].to_pylist()) == {7}
    ops = set(t["op"].to_pylist())
    assert {"cudaLaunchKernel", "cudaStreamSync", "cudaMemcpyAsync", "sched_switch"} <= ops
    store = Store.memory()
    assert store.append("events", t) == 5000
