"""ingero demo: the scenario registry, the synthetic replay's events, the CLI's bad input."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from ingero.cli import cli, main
from ingero.demo import interference, runner, scenarios, synthetic
from ingero.demo.scenarios import Physics, Scenario
from ingero.errors import IngeroError
from ingero.store.db import Store

REQUIRED = {"cpu-contention", "memcpy-bottleneck", "dataloader-starvation", "io-stall",
            "memory-pressure", "launch-bound", "sync-heavy", "healthy"}


def test_registry_has_every_required_scenario_once():
    names = scenarios.names()
    assert REQUIRED <= set(names)
    assert len(names) == len(set(names))


def test_every_scenario_expects_a_rule_and_has_a_fix_except_healthy():
    from ingero.analyze.rules import registry

    rule_ids = {r.ID for r in registry()}
    for s in scenarios.SCENARIOS:
        if s.name == "healthy":
            assert s.expected_rule is None
            assert s.workload == s.fix_workload
            continue
        assert s.expected_rule in rule_ids, s.name
        assert s.workload != s.fix_workload or s.fix_interference is not None or s.fix_renice, s.name


def test_interference_kinds_and_placeholders_are_known():
    for s in scenarios.SCENARIOS:
        for item in s.interference:
            assert item.kind in interference.KINDS
        for arg in (*s.workload, *s.fix_workload, *(a for i in s.interference for a in i.args)):
            if arg.startswith("{"):
                assert arg in ("{dataset}", "{workdir}")
                if arg == "{dataset}":
                    assert s.needs_dataset, s.name


def test_workload_flags_parse_with_train_py():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train", runner.TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    parser = train.build_parser()
    paths = {"dataset": "/x/dataset.bin", "workdir": "/x"}
    for s in scenarios.SCENARIOS:
        for flags in (s.workload, s.fix_workload):
            args = parser.parse_args(runner._expand(flags, paths))
            assert args.kernels_per_step > 0, s.name


def test_unknown_scenario_raises_with_the_list():
    with pytest.raises(IngeroError) as exc:
        scenarios.get("gpu-on-fire")
    text = str(exc.value)
    assert "gpu-on-fire" in text
    for name in REQUIRED:
        assert name in text


def test_cli_unknown_scenario_exits_2_and_lists_scenarios(capsys):
    code = main(["demo", "gpu-on-fire"])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown demo scenario 'gpu-on-fire'" in err
    for name in REQUIRED:
        assert name in err


def test_cli_unknown_scenario_through_clirunner():
    result = CliRunner().invoke(cli, ["demo", "gpu-on-fire"])
    assert isinstance(result.exception, IngeroError)
    assert IngeroError.exit_code == 2
    assert "memcpy-bottleneck" in result.output


def test_cli_list():
    result = CliRunner().invoke(cli, ["demo", "--list"])
    assert result.exit_code == 0
    lines = [line.split()[0] for line in result.output.splitlines()[1:]]
    assert lines == scenarios.names()


def test_cli_list_json():
    result = CliRunner().invoke(cli, ["demo", "--list", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert [d["name"] for d in data] == scenarios.names()


# ---- synthetic replay ---------------------------------------------------------

PLAIN = Scenario(name="t", title="t", story="t", expected_rule=None, workload=(), fix_workload=(), fix="",
                 physics=Physics(kernels=8, syncs=2), fix_physics=Physics(kernels=8, syncs=2))


def _ops(replay):
    from collections import Counter

    return Counter(replay.events.op)


def test_synthetic_exact_counts_per_step():
    r = synthetic.generate(PLAIN, steps=50, start_ns=10**18)
    ops = _ops(r)
    assert r.steps == 50
    assert ops["cudaLaunchKernel"] == 50 * 8
    assert ops["cudaStreamSync"] == 50 * 2
    assert ops["cudaMemcpyAsync"] == 50
    assert ops["cudaMemcpy"] == 0
    assert ops["page_fault"] == 0 and ops["block_io"] == 0
    # no contention: no preemptions
    assert not any(k == "preempted" for k in r.events.kind)


def test_synthetic_is_deterministic_for_a_seed():
    a = synthetic.generate(PLAIN, steps=20, start_ns=10**18, seed=3)
    b = synthetic.generate(PLAIN, steps=20, start_ns=10**18, seed=3)
    assert a.events.timestamp == b.events.timestamp
    assert a.events.duration_ns == b.events.duration_ns


def test_synthetic_timestamps_inside_the_run_and_monotonic_for_cuda_calls():
    r = synthetic.generate(PLAIN, steps=30, start_ns=10**18)
    cuda_ts = [t for t, op in zip(r.events.timestamp, r.events.op) if op.startswith("cuda")]
    assert cuda_ts == sorted(cuda_ts)
    assert min(r.events.timestamp) >= r.start_ns
    assert max(cuda_ts) <= r.end_ns


def test_synthetic_pageable_copies_are_synchronous_and_slower():
    s = scenarios.get("memcpy-bottleneck")
    slow = synthetic.generate(s, steps=40, start_ns=10**18)
    fast = synthetic.generate(s, steps=40, start_ns=10**18, fixed=True)
    base = int(40 * scenarios.BASELINE_SHARE)
    assert _ops(slow)["cudaMemcpy"] == 40 - base
    assert _ops(slow)["cudaMemcpyAsync"] == base
    assert _ops(fast)["cudaMemcpy"] == 0
    assert slow.summary()["step_ms_mean"] > fast.summary()["step_ms_mean"]


def test_synthetic_contention_has_preemptions_by_hogs_only_after_the_baseline():
    s = scenarios.get("cpu-contention")
    r = synthetic.generate(s, steps=100, start_ns=10**18)
    pre = [(t, o) for t, k, o in zip(r.events.timestamp, r.events.kind, r.events.other_pid) if k == "preempted"]
    assert pre
    assert {o for _, o in pre} == {synthetic.HOG_PID0 + h for h in range(s.physics.hogs)}
    first_cause_step_start = r.start_ns + sum(r.step_ns[: int(100 * scenarios.BASELINE_SHARE)])
    assert min(t for t, _ in pre) >= first_cause_step_start - max(r.step_ns)


def test_synthetic_faults_and_block_io_counts():
    mp = scenarios.get("memory-pressure")
    r = synthetic.generate(mp, steps=10, start_ns=10**18)
    base = int(10 * scenarios.BASELINE_SHARE)
    assert _ops(r)["page_fault"] == (10 - base) * mp.physics.faults_per_step
    io = scenarios.get("io-stall")
    r = synthetic.generate(io, steps=10, start_ns=10**18)
    assert _ops(r)["block_io"] == (10 - base) * io.physics.block_ios_per_step


def test_synthetic_write_fills_the_store_as_one_closed_session():
    s = scenarios.get("cpu-contention")
    store = Store.memory()
    r = synthetic.generate(s, steps=60, start_ns=10**18)
    sid = synthetic.write(store, s, r, label="before")
    n, = store.con.execute("SELECT count(*) FROM events WHERE session_id = $s", {"s": sid}).fetchone()
    assert n == len(r.events.timestamp)
    status, started, ended, events = store.con.execute(
        "SELECT status, started_ns, ended_ns, events FROM sessions WHERE session_id = $s", {"s": sid}).fetchone()
    assert (status, started, ended, events) == ("closed", r.start_ns, r.end_ns, n)
    names = dict(store.con.execute("SELECT pid, name FROM process_names").fetchall())
    assert names[synthetic.LOOP_PID] == "python3 (train.py)"
    assert names[synthetic.HOG_PID0] == "cpu-hog"
    preempted, = store.con.execute(
        "SELECT count(*) FROM events WHERE op = 'sched_switch' AND preempted").fetchone()
    assert preempted > 0


def test_run_synthetic_end_to_end(tmp_path):
    db = tmp_path / "demo.duckdb"
    result = runner.run("memcpy-bottleneck", duration_s=6, keep_db=db, synthetic_only=True)
    assert result.mode == "synthetic"
    assert result.reason == "asked with --synthetic"
    assert db.exists()
    assert result.after is not None
    assert result.after.summary["step_ms_mean"] < result.before.summary["step_ms_mean"]
    d = result.to_dict()
    assert d["scenario"] == "memcpy-bottleneck" and d["before"]["explain"]["format_version"] >= 1


def test_cli_synthetic_prints_the_reason_line(tmp_path):
    result = CliRunner().invoke(cli, ["demo", "healthy", "--synthetic", "--duration", "4s"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "synthetic replay (why: asked with --synthetic)"


def test_live_unavailable_gives_a_reason_when_not_root(monkeypatch):
    monkeypatch.setattr(runner.os, "geteuid", lambda: 1000)
    assert runner.live_unavailable().startswith("not root")


# Whether each scenario's replay is explained as its scenario, under every wait policy, and
# its fixed run stays healthy: tests/unit/test_policy_matrix.py.


def test_cli_prints_the_wait_policy():
    result = CliRunner().invoke(cli, ["demo", "healthy", "--synthetic", "--duration", "2s"])
    assert result.exit_code == 0, result.output
    assert "CUDA wait policy: auto -> spin" in result.output.splitlines()


def test_live_run_gives_the_workload_the_scenarios_wait_policy(monkeypatch, tmp_path):
    """The workload runs under the tracer (--cmd) and inherits its environment."""
    seen = {}

    class Started(Exception):
        pass

    def popen(cmd, **kw):
        seen.update(kw["env"])
        raise Started

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    with pytest.raises(Started):
        runner._live_run(scenarios.get("healthy"), "before", False, 1.0, tmp_path / "x.duckdb", tmp_path, {},
                         lambda _m: None)
    assert seen["SIMCUDA_SCHEDULE"] == "auto"


def test_live_unavailable_without_a_compiler_when_the_library_is_not_built(monkeypatch, tmp_path):
    monkeypatch.setattr(runner.os, "geteuid", lambda: 0)
    monkeypatch.setattr(runner.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(runner, "LIBCUDART", tmp_path / "libcudart.so.12")  # not built
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    assert runner.live_unavailable() == "no C compiler (cc) or make to build the simulated CUDA runtime"


def test_run_falls_back_to_a_synthetic_replay_with_the_reason(monkeypatch):
    monkeypatch.setattr(runner, "live_unavailable", lambda: "BCC is not installed (apt install python3-bpfcc)")
    result = runner.run("sync-heavy", duration_s=4, fix=False)
    assert result.mode == "synthetic"
    assert result.reason == "BCC is not installed (apt install python3-bpfcc)"
    assert result.after is None
    assert result.before.summary["steps"] > 0


def test_reading_scenarios_read_the_dataset():
    for s in scenarios.SCENARIOS:
        for flags in (s.workload, s.fix_workload):
            if "--reads-per-batch" in flags:
                assert flags[flags.index("--read-path") + 1] == "{dataset}", s.name


def test_cli_synthetic_renders_diagnosis_and_before_after():
    result = CliRunner().invoke(cli, ["demo", "memcpy-bottleneck", "--synthetic", "--duration", "8s"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "[HIGH] " in out
    assert "Diagnosis: named the cause" in out
    assert "Fix applied: pinned memory" in out
    steps = next(line for line in out.splitlines() if line.strip().startswith("throughput"))
    assert re.fullmatch(r"  throughput +\d+\.\d\d steps/s +\d+\.\d\d steps/s  "
                        r"\d\.\d\d× faster \(\+\d+%\)", steps), steps
    assert "After the fix, explain finds no causal chains" in out
