"""ingero demo, live: each scenario traced with real eBPF is diagnosed as itself.

Every scenario runs the real workload (demos/workloads/train.py) on the
simulated CUDA runtime under `ingero trace`, beside real interference
processes (one traced run of RUN_S plus BPF compile time each).

What is tested here is the diagnosis, which the trace determines: the
expected rule fires (HIGH or MEDIUM) about the workload's own process, and
names the interference where the rule has culprits.  Other load on this
shared 2-core box may add chains of its own (a neighbour's test preempting
the loop is real contention), so neither the rank of the chain nor the
absence of host-caused chains is asserted.  Whether the fix makes the job
faster is a measurement, not a pass/fail: bench/bench_demo.py (make bench)
runs slow and fixed runs and reports the speed-up in the README's table.
"""

from __future__ import annotations

import subprocess

import pytest

import prereqs
from ingero.analyze.rules import cpu_contention
from ingero.demo import runner, scenarios

pytestmark = pytest.mark.live

# One traced run per scenario (the slow one): BASELINE_SHARE of it clean, the rest with the cause.
# 14 s (20 s before 2026-11-27): explain's windows are 1 s either way (its minimum), so the
# run has 4 baseline windows and 10 with the cause instead of 6 and 14.  At 14 s, with
# scripts/busy_core.py running, the other seven scenarios were diagnosed in 4 of 4 runs at
# loads 1-14, with the severity of a 20 s run beside each (docs/benchmarks.md, "Test suite time").
RUN_S = 14.0
# These keep 20 s.  The straggler: at 14 s and a load of 6-7 one run of three saw both ranks
# equally late (rank 0 waited 14.1 ms per step for rank 1, rank 1 7.3 ms: no straggler).
# Healthy asserts device busy > 60%: 67.3% at 14 s against 71.6% at 20 s at a load of 9.
RUN_S_BY_SCENARIO = {"straggler": 20.0, "healthy": 20.0}
# The keep_db test counts rows (32 syncs in every step, all traced), which any length shows.
KEEP_DB_RUN_S = 8.0
# Rules whose cause can be any process on the host, the test's neighbours included.
HOST_RULES = {"cpu-contention", "io-stall", "memory-pressure"}


@pytest.fixture
def started(monkeypatch) -> list[subprocess.Popen]:
    """The interference processes the runner starts in this test (and only those)."""
    procs: list[subprocess.Popen] = []
    real_start = runner.start_interference

    def recording_start(*a, **kw):
        out = real_start(*a, **kw)
        procs.extend(p for p in out if p not in procs)
        return out

    monkeypatch.setattr(runner, "start_interference", recording_start)
    yield procs
    # the runner stops what it started, whatever happened
    assert [p.pid for p in procs if p.poll() is None] == []


def _strong(chains: list[dict]) -> list[dict]:
    return [c for c in chains if c["severity"] in ("HIGH", "MEDIUM")]


def _run_live(name: str, started: list[subprocess.Popen], **kw) -> runner.DemoResult:
    result = runner.run(name, **kw)
    assert result.mode == "live", result.reason
    if result.scenario.interference and not started:
        # runner._live_run starts the cause only once the workload's first step is done
        pytest.fail(f"the tracer never started the workload within {runner.WORKLOAD_START_TIMEOUT_S:.0f} s, "
                    f"so the interference never ran: this run shows no cause, nothing to diagnose "
                    f"(trace log: {result.before.trace_note!r})", pytrace=False)
    return result


@pytest.mark.parametrize("name", [s.name for s in scenarios.SCENARIOS if s.expected_rule is not None])
def test_scenario_is_diagnosed_live(name, started):
    result = _run_live(name, started, duration_s=RUN_S_BY_SCENARIO.get(name, RUN_S), fix=False)
    # the workload's process: a multi-rank job's ranks (the launcher makes no CUDA calls)
    pids = [r["pid"] for r in result.before.summary.get("per_rank", [])] or [result.before.summary["pid"]]
    strong = _strong(result.chains)
    summary = [(c["rule_id"], c["severity"], c["pids"]) for c in strong]
    mine = [c for c in strong if c["rule_id"] == result.scenario.expected_rule and set(pids) & set(c["pids"])]
    if name == "straggler":
        # The hogs make rank 1 late only while the box has CPU to spare: saturated by other work
        # (load ~30 here), the scheduler balances that work onto rank 0's core and both ranks are
        # equally late - no straggler, and explain rightly says contention.  The simulated NCCL's
        # truth (how long each rank's all-reduces waited for the other) says which run this was.
        waits = result.before.summary["collective_wait_ms_by_rank"]
        if not mine and not waits[0] >= 2 * waits[1]:
            prereqs.missing("a box quiet enough for the hogs to make rank 1 the straggler",
                            f"the simulated NCCL measured rank 0 waiting {waits[0]} ms per step for rank 1 "
                            f"and rank 1 {waits[1]} ms for rank 0: no straggler in this run; {summary}")
    if name == "launch-bound" and not mine:
        # Launch-bound stands down where the loop waits for a CPU (its premise is a host that
        # runs flat out): with another process keeping the loop's core half busy (CI's load)
        # the loop waits ~8% of the time, and 27% was seen (2026-11-27, with a simulator change
        # since reverted); past 10% the run's cause is cpu-contention, named with the process
        # that took the CPU.  Held to that, not skipped.
        contended = [c for c in strong if c["rule_id"] == "cpu-contention" and set(pids) & set(c["pids"])
                     and c["numbers"]["cpu_wait_share"] >= cpu_contention.T.min_wait_share and c["culprits"]]
        assert contended, summary
        return
    assert mine, summary
    if name == "straggler":
        # the hogs share rank 1's core: rank 1 is the late one, and its preemptors are named
        assert mine[0]["pids"] == [pids[1]] and mine[0]["numbers"]["late_rank"] == 1, mine[0]["root"]
        hogs = {p.pid for p in started}
        assert hogs & {c["pid"] for c in mine[0]["culprits"]}, (mine[0]["culprits"], sorted(hogs))
    if name == "cpu-contention":
        hogs = {p.pid for p in started}
        named = {c["pid"] for c in mine[0]["culprits"]}
        assert hogs & named, (mine[0]["culprits"], sorted(hogs))


def test_healthy_has_no_workload_chain(started):
    """Nothing in the healthy workload itself is flagged; a neighbour's load may be (HOST_RULES)."""
    result = _run_live("healthy", started, duration_s=RUN_S_BY_SCENARIO["healthy"], fix=False)
    strong = [(c["rule_id"], c["severity"], c["root"]) for c in _strong(result.chains)
              if c["rule_id"] not in HOST_RULES]
    assert strong == []
    assert result.before.summary["steps"] > 0
    assert result.before.summary["device_busy_pct"] > 60


def test_keep_db_holds_the_trace_of_the_workload(tmp_path, started):
    db = tmp_path / "demo.duckdb"
    result = _run_live("sync-heavy", started, duration_s=KEEP_DB_RUN_S, keep_db=db, fix=False)
    from ingero.store.db import Store

    store = Store.open(db, read_only=True)
    try:
        n_sync, = store.con.execute(
            "SELECT count(*) FROM events WHERE pid = $p AND op = 'cudaStreamSync'",
            {"p": result.before.summary["pid"]}).fetchone()
    finally:
        store.close()
    # 32 syncs per step, every step traced (the tracer starts the workload)
    assert result.before.summary["steps"] > 0
    assert n_sync == 32 * result.before.summary["steps"]


def test_interrupt_leaves_no_interference_running(monkeypatch, started):
    """Ctrl-C in the middle of a run: the hogs' process groups are killed."""
    recording_start = runner.start_interference

    def start_then_interrupt(*a, **kw):
        recording_start(*a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "start_interference", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        runner.run("cpu-contention", duration_s=10, fix=False)
    assert started  # the interrupt came after the hogs were running
    for p in started:
        assert p.poll() is not None
