"""The stack watcher's drain (StackResolver._drain_early) on a stand-in BPF map: what it keeps
for the decode path, and what it gives back so a long session never fills the map."""

from __future__ import annotations

import subprocess
import threading
import time

from ingero.collect import stacks


class _Key:
    def __init__(self, value: int):
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.value == self.value


class _Table(dict):
    Key = _Key


def _record(tgid: int) -> stacks.StackRecord:
    rec = stacks.StackRecord()
    rec.tgid = tgid
    return rec


def _resolver(table: _Table, frames_of) -> stacks.StackResolver:
    r = stacks.StackResolver.__new__(stacks.StackResolver)  # no BPF program, no watcher thread
    r.bpf = type("Bpf", (), {"get_table": lambda self, name: table})()
    r._lock = threading.RLock()
    r._early = {}
    r._ids = {}
    r._retry = set()
    r._frames_of = frames_of
    return r


def _gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


FRAMES = [("python", "step", "/x/a.py", "/x/a.py", 3, None)]


def test_a_gone_process_record_that_resolves_to_nothing_is_given_back():
    alive, gone = subprocess.Popen(["sleep", "30"]), _gone_pid()
    try:
        table = _Table({_Key(1): _record(alive.pid), _Key(2): _record(gone), _Key(3): _record(gone)})
        r = _resolver(table, lambda rec, pid: FRAMES if rec is table[_Key(3)] else [])
        r._drain_early()
        # kept: the live process' record (it may resolve later); gone: the dead one's, and the
        # one resolved ahead (its frames wait in _early for the decode path)
        assert [k.value for k in table] == [1]
        assert list(r._early) == [3] and r._early[3][1] == FRAMES
    finally:
        alive.kill()


def test_frames_are_not_kept_for_a_record_the_decode_path_resolved_meanwhile():
    table = _Table({_Key(7): _record(4242)})
    r = _resolver(table, None)

    def frames_of(rec, pid):  # resolve() reads and stores it while the watcher reads it
        r._ids[(4242, 7)] = 99
        return FRAMES

    r._frames_of = frames_of
    r._drain_early()
    assert r._early == {}  # nothing would ever pop it
    assert not table


def test_frames_nobody_asked_for_are_dropped_when_old_or_too_many(monkeypatch):
    r = _resolver(_Table(), None)
    now = time.monotonic()
    r._early = {1: (now - stacks.EARLY_TTL_S - 1, FRAMES), 2: (now, FRAMES), 3: (now, FRAMES)}
    r._drain_early()
    assert list(r._early) == [2, 3]
    monkeypatch.setattr(stacks, "MAX_EARLY", 1)
    r._drain_early()
    assert list(r._early) == []  # at the cap the oldest go first, leaving room for one new entry


def test_a_stack_with_an_unreadable_frame_is_read_again_while_its_process_runs():
    import numpy as np

    alive, gone = subprocess.Popen(["sleep", "30"]), _gone_pid()
    try:
        r = _resolver(_Table(), None)
        r.prepare = lambda pids: []
        r._stored, r.stats, r._write = set(), {"missing": 0, "stacks": 0, "frames": 0}, lambda rows: None
        partial = [("python", stacks.UNREADABLE, None, None, None, None)] + FRAMES
        records = {5: partial, 6: partial, 8: FRAMES}  # what the BPF map holds now
        r.frames = lambda bpf_id, pid: records.pop(bpf_id, [])
        first = r.resolve(np.array([5, 6, 8]), np.array([alive.pid, gone, alive.pid]))
        assert (first >= 0).all()
        # only the live process' partial stack is read again; a gone one's is all there will be
        assert r._retry == {(alive.pid, 5)}
        # the record is gone (nothing recurred yet): the stack read before is still the answer
        again = r.resolve(np.array([5, 6, 8]), np.array([alive.pid, gone, alive.pid]))
        assert (again == first).all() and r.stats["missing"] == 0
        # the call site recurred and reads whole now: that stack from here on
        records[5] = FRAMES
        third = r.resolve(np.array([5]), np.array([alive.pid]))
        assert third[0] == first[2] != first[0] and r._retry == set()
    finally:
        alive.kill()
