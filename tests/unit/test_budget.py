"""The overhead budget: the duty-cycle decision, the option, and the scaling explain does on a sampled trace."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from ingero.analyze import launch_sampling
from ingero.analyze.context import Options, resolve
from ingero.analyze.explain import explain
from ingero.cli import main
from ingero.collect import budget
from ingero.collect.budget import BudgetHook, Second, attached_ratio
from ingero.events.records import SwitchCount
from ingero.demo import scenarios
from ingero.events.units import NS
from ingero.store.db import Store
from ingero.values import BadValue, parse_percent

import replays
from analyze_helpers import count_switches, sample_store

# replays.py's cache serves this module and the other replay users on one worker
pytestmark = pytest.mark.xdist_group("replays")

START_NS = 1_763_800_000 * 10**9


# ---------------------------------------------------------------- the decision


def test_host_bound_loop_gets_the_slice_its_budget_pays_for():
    # the host-bound loop: 59 k launches/s at 7 us each, one core busy
    r = attached_ratio(59_000, 7_000, 1.0, 2.0)
    assert r == pytest.approx(0.02 / (59_000 * 7e-6))
    assert 0.048 < r < 0.049


def test_cheap_loops_are_traced_whole():
    # the GPU-bound demo: 500 calls/s cost 0.35% of its core: no sampling
    assert attached_ratio(500, 7_000, 1.0, 2.0) == 1.0
    assert attached_ratio(9_000, 7_000, 4.0, 2.0) == 1.0  # 6.3% of one core, 1.6% of the four it uses
    assert attached_ratio(0, 7_000, 1.0, 2.0) == 1.0


def test_never_below_the_minimum_ratio():
    assert attached_ratio(1_000_000, 7_000, 1.0, 0.1) == budget.MIN_RATIO
    assert attached_ratio(1_000_000, 7_000, 1.0, 0.1, min_ratio=0.01) == 0.01


def test_cpu_below_the_probes_own_cost_is_not_a_smaller_budget():
    # a thread's measured CPU holds its traps: never take less than their own cost as the base
    assert attached_ratio(100_000, 10_000, 0.1, 5.0) == pytest.approx(0.05)


def _second(**kw) -> Second:
    base = dict(dt_s=1.0, attached_s=1.0, launches=0, other_calls=0, switch_rows=0, counted=0,
                tracepoint_ns=0.0, cpu_s=1.0)
    return Second(**{**base, **kw})


def test_a_cheap_trace_is_traced_whole():
    # the GPU-bound demo: 500 launches and 100 syncs a second at 7 us, 1,000 switches costing 2 ms
    s = _second(launches=500, other_calls=100, switch_rows=1_000, tracepoint_ns=2e6)
    d = budget.decide([s] * 3, 7_000.0, 2.0, counting=True)
    assert (d.count_switches, d.ratio) == (False, 1.0)
    # the launches' rate per attached second less their traps' own 3.5 ms
    assert d.cost_share == pytest.approx(2e-3 + 500 / (1.0 - 3.5e-3) * 7e-6 + 0.7e-3)


def test_switches_of_threads_without_cuda_calls_are_counted_first():
    # 75 k switch rows a second (the simulated runtime's device thread) cost 22.5 ms of 1 CPU-s: over
    # 2%; counted, they would cost 75 k x ROW_NS less, which fits: launches keep every probe
    s = _second(launches=500, other_calls=100, switch_rows=75_000, tracepoint_ns=75_000 * 300.0)
    d = budget.decide([s] * 3, 7_000.0, 2.0, counting=False)
    assert (d.count_switches, d.ratio) == (True, 1.0)


def test_then_the_launches_are_sampled_with_what_is_left():
    # a host-bound loop: 5,900 launches at 7 us in a 100 ms slice (41 ms of it their traps: 100 k/s
    # untraced), syncs and copies 500/s, switches counted at 5 ms/s of tracepoint time; a 5% budget
    s = _second(attached_s=0.1, launches=5_900, other_calls=500, counted=75_000, tracepoint_ns=5e6)
    d = budget.decide([s] * 5, 7_000.0, 5.0, counting=True)
    assert d.count_switches
    allowed = 0.05 * 1.0
    full_rate = 5_900 / (0.1 - 5_900 * 7e-6)
    assert d.ratio == pytest.approx((allowed - 5e-3 - 500 * 7e-6) / (full_rate * 7e-6))
    assert 0.05 < d.ratio < 0.07
    # nothing left for them: the floor
    s = _second(attached_s=0.1, launches=5_900, other_calls=1_180, counted=75_000, tracepoint_ns=30e6)
    assert budget.decide([s], 7_000.0, 2.0, counting=True).ratio == budget.MIN_RATIO


def test_counting_stops_only_with_room_to_spare():
    # everything traced would cost 1.6%: under 2%, but not under RELAX_SHARE of it
    s = _second(switch_rows=0, counted=20_000, tracepoint_ns=13e6)  # 13 + 20 k x 0.15 us = 16 ms
    assert budget.decide([s], 7_000.0, 2.0, counting=True).count_switches
    assert not budget.decide([s], 7_000.0, 2.0, counting=False).count_switches


def test_no_launch_seen_keeps_the_launch_share():
    # a job still starting (its calls so far a few allocations): its launches are not known to be cheap
    s = _second(other_calls=50, counted=200, tracepoint_ns=1e6, cpu_s=0.03)
    d = budget.decide([s], 10_000.0, 2.0, counting=True, ratio=budget.MIN_RATIO)
    assert (d.count_switches, d.ratio) == (True, budget.MIN_RATIO)
    # cheap as it is, switches are stored again; the launch share still waits for launches
    s = _second(other_calls=50, counted=200, tracepoint_ns=1e5, cpu_s=1.0)
    d = budget.decide([s], 10_000.0, 2.0, counting=True, ratio=budget.MIN_RATIO)
    assert (d.count_switches, d.ratio) == (False, budget.MIN_RATIO)


def test_nothing_measured_keeps_the_state():
    assert budget.decide([], 7_000.0, 2.0, counting=True) is None


def test_a_hook_starts_at_its_cheapest():
    hook = BudgetHook(2.0)
    assert hook.counting and hook.ratio == budget.MIN_RATIO


# ---------------------------------------------------------------- the option


@pytest.mark.parametrize("text, pct", [("2", 2.0), ("2%", 2.0), (" 0.5 % ", 0.5), ("off", 0.0), ("0", 0.0),
                                       (100, 100.0)])
def test_parse_percent(text, pct):
    assert parse_percent(text) == pct


@pytest.mark.parametrize("text", ["abc", "nan", "-1", "0.01", "101", "inf%", True])
def test_parse_percent_refuses(text):
    with pytest.raises(BadValue):
        parse_percent(text)


def test_daemon_mode_has_the_suggested_budget_unless_told_otherwise():
    assert budget.budget_in_force(None, daemon=True) == budget.SUGGESTED_PCT == 2.0
    assert budget.budget_in_force(None, daemon=False) == 0.0  # --duration or --cmd: every call traced
    assert budget.budget_in_force(0.0, daemon=True) == 0.0  # --overhead-budget off
    assert budget.budget_in_force(0.5, daemon=False) == 0.5


@pytest.mark.parametrize("value", ["abc", "200%", "nan"])
def test_bad_budget_is_one_line_exit_2(value, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("INGERO_DB", str(tmp_path / "none.duckdb"))
    assert main(["trace", "--overhead-budget", value]) == 2
    err = capsys.readouterr().err
    assert "bad --overhead-budget" in err and err.count("\n") == 1, err


# ---------------------------------------------------------------- sampled traces


def _replay(name: str, duration_s: float = 30, policy: str = "spin") -> Store:
    return replays.write(Store.memory(), name, duration_s, policy, start_ns=START_NS, label=f"sampled {name}")


def test_detached_time_per_window():
    rows = np.array([[0, 1000, 0, 100], [1000, 2000, 1000, 1100]])
    # windows of 500 ns: [0,500) detached 400, [500,1000) 500, [1000,1500) 400, [1500,2000) 500
    assert launch_sampling.detached_ns_per_window(rows, 0, 500, 4).tolist() == [400, 500, 400, 500]


def test_explain_scales_launches_and_says_so():
    full = _replay("launch-bound")
    sampled = _replay("launch-bound")
    before, after = sample_store(sampled, 0.1)
    assert 0.05 < after / before < 0.15

    def launches(store):
        ctx = resolve(store.con, Options())
        from ingero.analyze import windows

        windows.build(ctx)
        return store.con.execute("SELECT sum(launch_n) FROM ing_win").fetchone()[0], ctx

    n_full, _ = launches(full)
    n_sampled, ctx = launches(sampled)
    assert n_sampled == pytest.approx(n_full, rel=0.05)
    report = explain(sampled.con, Options())
    assert any("estimated from a 10% sample" in n for n in report.notes), report.notes
    assert not any("sample" in n for n in explain(full.con, Options()).notes)


def budget_ratio(store: Store, pct: float, cost_ns: float = 7_000.0) -> float:
    """The share the budget would give the replay's launches: the issue's 7 us per call, one busy core."""
    n, span_ns = store.con.execute(
        "SELECT count(*) FILTER (list_contains($ops, op)), max(timestamp) - min(timestamp) FROM events",
        {"ops": budget.SWITCHED_NAMES.split(",")}).fetchone()
    return attached_ratio(n / (span_ns / NS), cost_ns, 1.0, pct)


# 2%: what a daemon should use (SUGGESTED_PCT); 0.1%: the tightest --overhead-budget takes, which samples every scenario
@pytest.mark.parametrize("pct", [2.0, 0.1])
@pytest.mark.parametrize("name", scenarios.names())
def test_diagnosis_unchanged_on_a_sampled_trace(name, pct):
    """The policy matrix's first column again, the launch probes duty-cycled as the budget would."""
    sc = scenarios.get(name)
    store = _replay(name)
    ratio = budget_ratio(store, pct)
    if ratio < 1.0:
        before, after = sample_store(store, ratio, phase_ns=NS // 3)
        assert after < before
    _assert_diagnosed(store, sc)


def test_the_sampled_matrix_samples():
    """The default budget samples the launch-bound replay (~7.6%), the tightest samples every scenario."""
    assert 0.05 < budget_ratio(_replay("launch-bound"), 2.0) < 0.1
    assert all(budget_ratio(_replay(n, duration_s=5), 0.1) < 1.0 for n in scenarios.names())


def test_metrics_scale_sampled_launches():
    from ingero.events.records import EVENT_DTYPE
    from ingero.metrics.aggregate import Aggregates

    recs = np.zeros(10, dtype=EVENT_DTYPE)
    recs["op"] = int(budget.Op.CUDA_LAUNCH_KERNEL)
    recs["pid"] = 4242
    recs["duration_ns"] = 1000
    agg = Aggregates(alive=lambda pid: True)
    agg.add(recs, {4242: "python3"}, {int(budget.Op.CUDA_LAUNCH_KERNEL): 1 / 0.05})
    h = agg.cuda[(4242, "cudaLaunchKernel")]
    assert h.count == 200 and h.sum_ns == 200_000 and int(h.buckets.sum()) == 200
    agg.add(recs, {4242: "python3"})  # a whole second: counted as stored
    assert agg.cuda[(4242, "cudaLaunchKernel")].count == 210


def test_launch_additions_count_against_the_other_calls():
    # (pid, tid, window, inside a slice, launch, rows)
    counts = [
        (7, 7, 0, True, True, 1000), (7, 7, 0, True, False, 100),    # slice: 10 launches per other call
        (7, 7, 0, False, False, 900), (7, 7, 0, False, True, 30),    # detached: 900 syncs, 30 edge launch rows
        (7, 7, 1, True, True, 50), (7, 7, 1, True, False, 2),        # too few in its slice: the thread's ratio
        (7, 7, 1, False, False, 10),
        (7, 9, 0, True, True, 400), (7, 9, 0, False, True, 5),       # a thread that launches only
    ]
    adds, no_anchor = launch_sampling.launch_additions(counts)
    assert no_anchor == {9}
    assert adds[(7, 7, 0)] == pytest.approx(10 * 900 - 30)
    assert adds[(7, 7, 1)] == pytest.approx(1050 / 102 * 10)
    assert (7, 9, 0) not in adds


def _loop_store(slice_step_ns: int, free_step_ns: int, launches_per_step: int = 10) -> tuple[Store, int, int]:
    """One 1 s window of a loop (launches then one sync per step), its launch probes attached for
    the first 100 ms, in which a step takes slice_step_ns (the traps slow it), free_step_ns after;
    launch rows only in the slice.  (store, session, the loop's true launches)."""
    store = Store.memory()
    sid = store.begin_session(command="test", targets="test")
    t0, a1 = START_NS, START_NS + NS // 10
    steps = [t0 + i * slice_step_ns for i in range((a1 - t0) // slice_step_ns)]
    steps += [a1 + i * free_step_ns for i in range((t0 + NS - a1) // free_step_ns)]
    gap = slice_step_ns // (launches_per_step + 1)
    launches = [(s + k * gap) for s in steps if s < a1 for k in range(launches_per_step)]
    store.con.execute("""INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op)
                         SELECT $sid, unnest($ts), 1000, 7, 7, 'cudaLaunchKernel'""", {"sid": sid, "ts": launches})
    store.con.execute("""INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op)
                         SELECT $sid, unnest($ts), 1000, 7, 7, 'cudaStreamSync'""",
                      {"sid": sid, "ts": [s - 1 for s in steps[1:]] + [t0 + NS - 1]})  # each step's end
    store.con.execute("INSERT INTO sampling VALUES ($sid, $t0, $t1, $t0, $a1, $a1, 0.1, $ops, 10000.0)",
                      {"sid": sid, "t0": t0, "t1": t0 + NS, "a1": a1, "ops": budget.SWITCHED_NAMES})
    return store, sid, len(steps) * launches_per_step


def test_a_slowed_slice_still_scales_to_the_loops_launches():
    """The traps halve the loop's pace in its slice: scaling by time would read 47% low; counted
    against the syncs (one a step, never sampled) the window's launches are exact."""
    store, _, truth = _loop_store(slice_step_ns=1_000_000, free_step_ns=500_000)
    from ingero.analyze import windows

    ctx = resolve(store.con, Options(from_ns=START_NS, to_ns=START_NS + NS, window_s=1.0))
    for source in ("events", "summaries"):
        windows.build(ctx, source)
        assert store.con.execute("SELECT sum(n) FROM ing_cuda WHERE cat = 'launch'").fetchone()[0] == truth == 19_000


def test_a_thread_without_other_calls_is_scaled_by_attached_time():
    """The fallback: n launches in a slice of a host-bound thread took n x cost of it in traps: the
    rate without the probes is n / (slice - n x cost), and that is what the detached rest ran at."""
    store = Store.memory()
    sid = store.begin_session(command="test", targets="test")
    t0 = START_NS
    # one 1 s window; the probes attached for its first 100 ms; 5,000 launches seen, 10 us each in traps
    store.con.execute("""INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op)
                         SELECT $sid, $t0 + i * 20000, 5000, 7, 7, 'cudaLaunchKernel' FROM range(5000) t(i)""",
                      {"sid": sid, "t0": t0})
    store.con.execute("INSERT INTO events (session_id, timestamp, duration_ns, pid, tid, op) "
                      "VALUES ($sid, $t, 1000, 7, 7, 'cudaStreamSync')", {"sid": sid, "t": t0 + NS - 1000})
    store.con.execute("INSERT INTO sampling VALUES ($sid, $t0, $t1, $t0, $a1, $a1, 0.1, $ops, 10000.0)",
                      {"sid": sid, "t0": t0, "t1": t0 + NS, "a1": t0 + NS // 10, "ops": budget.SWITCHED_NAMES})
    from ingero.analyze import windows

    ctx = resolve(store.con, Options(from_ns=t0, to_ns=t0 + NS, window_s=1.0))
    windows.build(ctx)
    n = store.con.execute("SELECT sum(n) FROM ing_cuda WHERE cat = 'launch'").fetchone()[0]
    # 5,000 / (0.1 s - 5,000 x 10 us = 0.05 s) = 100 k/s over the 1 s window
    assert n == 100_000


# ---------------------------------------------------------------- counted switches


@pytest.mark.parametrize("name", scenarios.names())
def test_diagnosis_unchanged_with_counted_switches(name):
    """The budget's first two losses together: switches of threads that make no CUDA call counted per
    second (the workers, the helpers), the launches sampled at the default budget's share."""
    sc = scenarios.get(name)
    store = _replay(name)
    count_switches(store)
    ratio = budget_ratio(store, 2.0)
    if ratio < 1.0:
        sample_store(store, ratio, phase_ns=NS // 3)
    _assert_diagnosed(store, sc)


def _off_cpu(store: Store) -> dict[tuple[int, str], tuple[int, float]]:
    from ingero.analyze import windows

    ctx = resolve(store.con, Options(window_s=1.0))
    windows.build(ctx)
    return {(tid, kind): (n, off) for tid, kind, n, off in store.con.execute(
        "SELECT tid, kind, sum(n)::BIGINT, sum(off_ns) FROM ing_sched GROUP BY ALL").fetchall()}


def test_counted_switches_keep_the_off_cpu_totals_and_explain_says_so():
    full = _replay("io-stall")
    counted = _replay("io-stall")
    n = count_switches(counted)
    assert n > 1_000  # the checkpoint writer's switches
    before, after = _off_cpu(full), _off_cpu(counted)
    assert before.keys() == after.keys()
    for key, (n_full, off_full) in before.items():
        assert after[key][0] == n_full, key
        assert after[key][1] == pytest.approx(off_full, rel=1e-9), key
    notes = explain(counted.con, Options()).notes
    assert any(f"{n:,} off-CPU intervals of" in x and "counted per second" in x for x in notes), notes
    assert not any("counted per second" in x for x in explain(full.con, Options()).notes)


class _FakeProgram:
    """The switch_counts map as BPF leaves it: totals per thread since its entry was made."""

    def __init__(self):
        self.entries: dict[int, SwitchCount] = {}
        self.forgotten: list[int] = []

    def put(self, tid, tgid, n, off_ns, runq_ns):
        self.entries[tid] = SwitchCount((ctypes.c_uint64 * 4)(*n), (ctypes.c_uint64 * 4)(*off_ns),
                                        (ctypes.c_uint64 * 4)(*runq_ns), tgid, 0)

    def switch_counts(self):
        return list(self.entries.items())

    def forget_switch_counts(self, tids):
        for tid in tids:
            self.forgotten.append(tid)
            self.entries.pop(tid, None)


class _FakeSession:
    def __init__(self, store):
        self.store = store
        self.session_id = store.begin_session(command="test", targets="test")


def test_counted_switches_are_stored_as_per_second_deltas():
    store = Store.memory()
    sess = _FakeSession(store)
    prog = _FakeProgram()
    hook = BudgetHook(2.0)
    hook.program = prog
    me = os.getpid()
    prog.put(me, me, (3, 10, 0, 0), (300, 5_000, 0, 0), (300, 40, 0, 0))  # a live thread (this one)
    prog.put(999_999_999, me, (1, 0, 2, 0), (7, 0, 90, 0), (7, 0, 0, 0))  # one that is gone
    hook._harvest(sess)
    prog.put(me, me, (3, 14, 0, 0), (300, 6_000, 0, 0), (300, 52, 0, 0))  # 4 more sleeps
    hook._harvest(sess)  # the gone thread's entry is read once more, then deleted
    hook._harvest(sess)
    rows = store.con.execute("SELECT tid, kind, switches, off_cpu_ns, runq_ns FROM switch_counts "
                             "ORDER BY timestamp, tid, kind").fetchall()
    assert rows == [(me, "preempted", 3, 300, 300), (me, "sleep", 10, 5_000, 40),
                    (999_999_999, "io", 2, 90, 0), (999_999_999, "preempted", 1, 7, 7),
                    (me, "sleep", 4, 1_000, 12)]
    assert prog.forgotten == [999_999_999]
    assert hook.counted_total == 20 and hook.counted_threads == {me, 999_999_999}
    assert store.con.execute("SELECT count(DISTINCT pid) FROM switch_counts").fetchone() == (1,)


def _assert_diagnosed(store, sc) -> None:
    """The scenario's diagnosis: its rule first and HIGH, or no HIGH/MEDIUM chain for a healthy one."""
    chains = explain(store.con, Options()).chains
    shown = [f"[{c.severity}] {c.rule_id}" for c in chains]
    if sc.expected_rule is None:
        assert [c for c in chains if c.severity in ("HIGH", "MEDIUM")] == [], shown
    else:
        assert chains and chains[0].rule_id == sc.expected_rule, shown
        assert chains[0].severity == "HIGH", shown
