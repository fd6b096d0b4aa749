"""What a traced call costs, by the kind of the probed function's first instruction (collect/entry_cost.py)."""

from __future__ import annotations

import pytest

from ingero.collect.entry_cost import OTHER, PROGRAM_NS, PUSH, CallCosts, calibrate, entry_kind


@pytest.mark.parametrize("code, kind", [
    (bytes.fromhex("55 48 89 e5"), PUSH),  # push %rbp: NVIDIA's libcudart 12 and 13 launches
    (bytes.fromhex("53 31 f6"), PUSH),  # push %rbx: the simulated runtime's sync
    (bytes.fromhex("41 57 41 56"), PUSH),  # push %r15: libc's bsearch
    (bytes.fromhex("41 89 c6"), OTHER),  # mov %eax,%r14d: a REX prefix, not a push
    (bytes.fromhex("b8 6e 00 00 00 0f 05"), OTHER),  # mov $0x6e,%eax: libc's getppid
    (bytes.fromhex("f3 0f 1e fa 55"), OTHER),  # endbr64: single-stepped on 6.18 (docs/benchmarks.md)
    (b"", OTHER),
])
def test_entry_kinds(code, kind):
    assert entry_kind(code) == kind


def _timer(costs_by_symbol: dict[str, float], timed: list[str]):
    def time_target(symbol, args):
        timed.append(symbol)
        return costs_by_symbol[symbol], 0.01
    return time_target


def test_each_kind_is_timed_on_a_target_that_begins_that_way():
    timed: list[str] = []
    costs = CallCosts()
    calibrate(costs, _timer({"bsearch": 1500.0, "getppid": 11000.0}, timed),
              {"bsearch": bytes.fromhex("4157"), "getppid": bytes.fromhex("b86e000000")}.__getitem__)
    assert timed == ["bsearch", "getppid"]
    assert costs.by_kind == {PUSH: 1500.0 + PROGRAM_NS, OTHER: 11000.0 + PROGRAM_NS}
    assert costs.calibration_s == pytest.approx(0.02)


def test_a_target_of_another_kind_in_this_libc_is_passed_over_and_its_kind_not_measured():
    # a libc built with CET: bsearch begins with endbr64, so nothing times the push kind
    timed: list[str] = []
    costs = CallCosts()
    calibrate(costs, _timer({"getppid": 11000.0}, timed),
              {"bsearch": bytes.fromhex("f30f1efa4157"), "getppid": bytes.fromhex("b86e000000")}.__getitem__)
    assert timed == ["getppid"] and costs.by_kind == {OTHER: 11000.0 + PROGRAM_NS}
    # launches that begin with a push have no measured cost: none is claimed
    costs.note_launch_entry(bytes.fromhex("55"))
    assert costs.ns is None


def test_no_target_timed_is_an_error_naming_each():
    def fails(symbol, args):
        raise OSError(f"no link for {symbol}")
    with pytest.raises(OSError, match="bsearch: no link for bsearch; getppid: no link for getppid"):
        calibrate(CallCosts(), fails, lambda s: bytes.fromhex("4157" if s == "bsearch" else "b86e"))


def test_the_cost_is_that_of_the_kind_most_launch_entries_begin_with():
    costs = CallCosts(by_kind={PUSH: 1700.0, OTHER: 11200.0})
    assert costs.ns == 1700.0  # no launch linked yet: a push, as every CUDA runtime seen
    costs.note_launch_entry(bytes.fromhex("b8"))
    assert costs.ns == 11200.0
    costs.note_launch_entry(bytes.fromhex("55"))
    costs.note_launch_entry(bytes.fromhex("4154"))
    assert costs.launch_kinds == {PUSH: 2, OTHER: 1} and costs.ns == 1700.0
    assert CallCosts().ns is None  # not calibrated

