"""straggler: fires / just below / look-alikes that must not fire.

Two ranks run the same loop (40 launches and one sync per step) for 20 s;
rank 1 (PID 4300) is made slower by waiting for data or for a CPU.  Its
launch rate against the peers' median decides: below max_rate_ratio it is a
straggler (HIGH from high_rate_ratio).  The base step takes ~30 ms, so a
wait of w ms per step gives a ratio of ~30 / (30 + w).
"""

from __future__ import annotations

import pytest

from analyze_helpers import MAIN_PID, Trace, chains_of, silent
from ingero.analyze.rules import straggler

RANK1 = 4300


def ranks(**slow) -> Trace:
    tr = Trace().name(MAIN_PID, "python3 (train.py rank0)", "python3", "torchrun train.py")
    tr.name(RANK1, "python3 (train.py rank1)", "python3", "torchrun train.py")
    tr.system(0, 20).loop(0, 20)
    return tr.loop(0, 20, pid=RANK1, tid=RANK1, **slow)


def test_fires_medium_just_past_the_rate_threshold_and_names_the_input_wait():
    [chain] = chains_of(ranks(wait_ms=11).explain(), "straggler")
    assert chain.pids == [RANK1]
    ratio = chain.numbers["rate_ratio"]
    assert straggler.T.high_rate_ratio < ratio < straggler.T.max_rate_ratio
    assert ratio == pytest.approx(30.1 / 41.1, abs=0.01)
    assert chain.severity == "MEDIUM"
    assert any("waiting outside CUDA calls" in r for r in chain.root)
    assert chain.fix[0].startswith("give python3 (train.py rank1) (PID 4300) more DataLoader workers")
    assert chain.fix[-1] == f"compare: ingero explain --pid {RANK1}"


def test_half_speed_is_high():
    [chain] = chains_of(ranks(wait_ms=31).explain(), "straggler")
    assert chain.numbers["rate_ratio"] <= straggler.T.high_rate_ratio
    assert chain.severity == "HIGH"


def test_just_below_the_rate_threshold_is_silent():
    # ~0.77 of the peers' rate: slower, but within what healthy ranks differ by
    report = ranks(wait_ms=9).explain()
    assert silent(report, "straggler")


def test_the_same_slowdown_one_run_after_the_other_is_not_a_straggler():
    # rank 0 runs 0-10 s, a preempted rank 1 runs 10-20 s: no common windows, nobody waits for it
    tr = Trace().name(MAIN_PID, "python3 (train.py rank0)", "python3", "torchrun train.py")
    tr.name(RANK1, "python3 (train.py rank1)", "python3", "torchrun train.py")
    tr.system(0, 20).loop(0, 10).loop(10, 20, pid=RANK1, tid=RANK1, preempt_ms=60, preempt_by=0)
    assert silent(tr.explain(), "straggler")


def test_a_lone_slow_process_has_no_peers():
    tr = Trace().name(RANK1, "python3 (train.py rank1)", "python3", "torchrun train.py")
    tr.system(0, 20).loop(0, 20, pid=RANK1, tid=RANK1, wait_ms=31)
    assert silent(tr.explain(), "straggler")
