"""Live: a loop that waits on itself each step, traced as a new user would (`ingero trace --cmd`).

paced_train.py (its own workload: the simulated runtime through ctypes, not the demos' train.py):

1. ``--pace-ms 20``: a rate limit, time.sleep after each step: loop-sleep, no culprit (the timer
   woke it), not input-bound, and the step's time is its own sleep, not a data wait.
2. ``--log-bytes 10000``: a 10 kB log line a step into a pipe whose reader (a child process)
   sleeps 50 ms per 4 KiB: output-bound, naming the reader; not input-bound with a DataLoader fix.
3. the look-alike of 2: the same pipe, a reader that keeps up: the writer never blocks, no chain
   of the loop's own waits and nothing HIGH or MEDIUM.

Each was wrong before these rules: 1 had no chain and a step of "data wait 77%", 2 was
[HIGH] input-bound with `DataLoader(num_workers=22, …)` on a 2-CPU host.
"""

from __future__ import annotations

import pytest
from test_wait_shapes_live import (DURATION_S, Run, assert_quiet, assert_recorded, chains_of, summary, traced_cmd,
                                   traced_ops, workload)

pytestmark = pytest.mark.live

OWN_WAITS = ("loop-sleep", "output-bound")


@pytest.fixture(scope="module")
def paced(tmp_path_factory, simcuda) -> Run:
    tmp = tmp_path_factory.mktemp("paced")
    return traced_cmd(tmp, simcuda, workload("paced_train.py", "--lib", simcuda, "--duration", DURATION_S,
                                             "--pace-ms", 20))


@pytest.fixture(scope="module")
def piped(tmp_path_factory, simcuda) -> Run:
    tmp = tmp_path_factory.mktemp("piped")
    return traced_cmd(tmp, simcuda, workload("paced_train.py", "--lib", simcuda, "--duration", DURATION_S,
                                             "--log-bytes", 10_000, "--reader-sleep-ms", 50))


@pytest.fixture(scope="module")
def piped_fast(tmp_path_factory, simcuda) -> Run:
    tmp = tmp_path_factory.mktemp("piped-fast")
    return traced_cmd(tmp, simcuda, workload("paced_train.py", "--lib", simcuda, "--duration", DURATION_S,
                                             "--log-bytes", 10_000, "--reader-sleep-ms", 0))


def _first(run: Run) -> dict:
    mine = chains_of(run.report, run.truth["pid"])
    assert mine, summary(run.report)
    return mine[0]


def test_paced_workload_made_its_shape(paced):
    t = paced.truth
    assert t["steps"] > 0 and t["wait_s"] > 0.6 * t["wall_s"], t
    assert_recorded(paced, t["loop_tid"], t["counts"])


def test_a_paced_loop_is_named_by_its_own_sleep_with_no_culprit(paced):
    first = _first(paced)
    assert first["rule_id"] == "loop-sleep" and first["severity"] == "HIGH", summary(paced.report)
    assert first["culprits"] == []
    rules = {c["rule_id"] for c in chains_of(paced.report, paced.truth["pid"])}
    assert "input-bound" not in rules, summary(paced.report)
    parts = paced.report["steps"]["breakdown"]
    assert parts["sleep"] > 0.5 > parts["data_wait"], parts


def test_piped_workload_made_its_shape(piped):
    t = piped.truth
    assert t["steps"] > 0 and t["reader_pid"] and t["wait_s"] > 0.6 * t["wall_s"], t
    assert_recorded(piped, t["loop_tid"], t["counts"])


def test_a_loop_blocked_writing_its_log_into_a_slow_pipe_is_output_bound_naming_the_reader(piped):
    t = piped.truth
    first = _first(piped)
    assert first["rule_id"] == "output-bound" and first["severity"] == "HIGH", summary(piped.report)
    assert [k["pid"] for k in first["culprits"]] == [t["reader_pid"]], first["culprits"]
    rules = {c["rule_id"] for c in chains_of(piped.report, t["pid"])}
    assert "input-bound" not in rules, summary(piped.report)
    assert not any("DataLoader" in f for c in piped.report["chains"] for f in c["fix"]), summary(piped.report)
    parts = piped.report["steps"]["breakdown"]
    assert parts["output_wait"] > 0.5 > parts["data_wait"], parts


def test_a_pipe_that_keeps_up_is_not_named(piped_fast):
    t = piped_fast.truth
    assert t["steps"] > 0 and t["reader_pid"] and t["wait_s"] < 0.2 * t["wall_s"], t
    assert not [c for c in piped_fast.report["chains"] if c["rule_id"] in OWN_WAITS], summary(piped_fast.report)
    assert_quiet(piped_fast.report, t["pid"], traced_ops(t["counts"]))
