"""The record ring reader on hand-made ring memory (no BPF).

The ring's two arrays are stand-ins here: memfd files of the same layout,
written the way bpf/ingero.bpf.c's producers write them (claim a position,
fill the slot, seq = position + 1 last).
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from ingero.events.records import EVENT_DTYPE
from ingero.collect.ringbuf import (
    BUSY_BIT,
    POSITIONS_TAIL_OFFSET,
    RECORD_DTYPE,
    RECORD_STRIDE,
    RingReader,
    complete_prefix,
    span_into,
)

SLOTS = 64  # one 4 KiB page of 64-byte slots


def test_a_slot_is_the_seq_then_the_event_in_one_cache_line() -> None:
    assert EVENT_DTYPE.itemsize == 56
    assert RECORD_STRIDE == 64
    assert RECORD_DTYPE.fields["seq"][1] == 0
    assert RECORD_DTYPE.fields["event"][1] == 8


def records(first_pos: int, n: int, *, busy: tuple[int, ...] = (), unwritten: tuple[int, ...] = ()) -> np.ndarray:
    """Slots for positions first_pos.. as producers leave them; event i has ts_ns = 1000 + position."""
    buf = np.zeros(n, dtype=RECORD_DTYPE)
    pos = first_pos + np.arange(n, dtype=np.uint64)
    buf["seq"] = pos + 1
    buf["event"]["ts_ns"] = 1000 + pos
    for i in busy:  # claimed, being written
        buf["seq"][i] |= np.uint64(BUSY_BIT)
    for i in unwritten:  # claimed, nothing written yet: the slot still holds the last lap's record
        buf["seq"][i] = first_pos + i + 1 - SLOTS if first_pos + i >= SLOTS else 0
    return np.frombuffer(buf.tobytes(), dtype=RECORD_DTYPE)  # raw memory, as the reader sees it


def test_complete_records_are_counted_up_to_the_first_incomplete_one() -> None:
    assert complete_prefix(records(0, 5), 0) == 5
    assert complete_prefix(records(100, 6, busy=(3,)), 100) == 3
    assert complete_prefix(records(100, 6, unwritten=(0,)), 100) == 0
    # a slot of the previous lap (position - SLOTS) is not the record of this position
    assert complete_prefix(records(SLOTS, 4, unwritten=(2,)), SLOTS) == 2


def test_a_span_read_at_the_wrong_position_is_not_complete() -> None:
    """The seq names the position: memory of another position never passes for it."""
    assert complete_prefix(records(10, 4), 11) == 0


def test_span_into_copies_the_complete_prefix_at_most_len_out() -> None:
    out = np.zeros(3, dtype=EVENT_DTYPE)
    assert span_into(records(7, 5), 7, out) == 3
    assert out["ts_ns"].tolist() == [1007, 1008, 1009]
    out = np.ones(6, dtype=EVENT_DTYPE)
    assert span_into(records(7, 6, busy=(2,)), 7, out) == 2
    assert out["ts_ns"].tolist() == [1007, 1008, 1, 1, 1, 1]  # the rest of out untouched


class FakeRing:
    """memfd stand-ins for the two BPF arrays, and a producer writing into them."""

    def __init__(self) -> None:
        self.ring_fd = os.memfd_create("ring")
        os.ftruncate(self.ring_fd, SLOTS * RECORD_STRIDE)
        self.pos_fd = os.memfd_create("ring_pos")
        os.ftruncate(self.pos_fd, mmap.PAGESIZE)
        self._ring = mmap.mmap(self.ring_fd, SLOTS * RECORD_STRIDE)
        self._pos = mmap.mmap(self.pos_fd, mmap.PAGESIZE)
        self.slots = np.frombuffer(self._ring, dtype=RECORD_DTYPE)
        self.head = np.frombuffer(self._pos, dtype=np.uint64, count=1)
        self.tail = np.frombuffer(self._pos, dtype=np.uint64, count=1, offset=POSITIONS_TAIL_OFFSET)

    def produce(self, n: int, *, complete: bool = True) -> list[int]:
        """Claim n positions and write their records (left BUSY unless complete)."""
        first = int(self.head[0])
        self.head[0] = first + n
        for p in range(first, first + n):
            slot = self.slots[p % SLOTS]
            slot["event"]["ts_ns"] = 1000 + p
            slot["seq"] = (p + 1) | (0 if complete else BUSY_BIT)
        return list(range(first, first + n))

    def complete(self, p: int) -> None:
        self.slots["seq"][p % SLOTS] = p + 1


@pytest.fixture
def fake() -> FakeRing:
    return FakeRing()


def reader(fake: FakeRing) -> RingReader:
    return RingReader(fake.ring_fd, fake.pos_fd, SLOTS * RECORD_STRIDE)


def test_the_reader_consumes_what_it_copied_and_writes_the_tail(fake: FakeRing) -> None:
    r = reader(fake)
    fake.produce(5)
    got = r.read()
    assert got["ts_ns"].tolist() == [1000, 1001, 1002, 1003, 1004]
    assert int(fake.tail[0]) == 5
    assert r.positions() == (5 * RECORD_STRIDE, 5 * RECORD_STRIDE)
    assert len(r.read()) == 0


def test_a_record_still_being_written_waits_with_everything_after_it(fake: FakeRing) -> None:
    r = reader(fake)
    fake.produce(2)
    (busy,) = fake.produce(1, complete=False)
    fake.produce(3)
    assert r.read()["ts_ns"].tolist() == [1000, 1001]
    assert r.pending_bytes() == 4 * RECORD_STRIDE
    fake.complete(busy)
    assert r.read()["ts_ns"].tolist() == [1002, 1003, 1004, 1005]


def test_a_span_that_wraps_around_the_end_is_read_whole_and_in_order(fake: FakeRing) -> None:
    r = reader(fake)
    fake.produce(SLOTS - 3)
    r.read()
    fake.produce(7)  # 3 slots up to the end, 4 from the start
    assert r.read()["ts_ns"].tolist() == [1000 + p for p in range(SLOTS - 3, SLOTS + 4)]
    assert int(fake.tail[0]) == SLOTS + 4


def test_an_incomplete_record_after_the_wrap_stops_the_second_piece(fake: FakeRing) -> None:
    r = reader(fake)
    fake.produce(SLOTS - 2)
    r.read()
    fake.produce(3)
    fake.produce(1, complete=False)  # position SLOTS + 1: the second slot from the start
    out = np.zeros(10, dtype=EVENT_DTYPE)
    assert r.read_into(out) == 3
    assert out["ts_ns"][:3].tolist() == [1000 + SLOTS - 2, 1000 + SLOTS - 1, 1000 + SLOTS]


def test_read_into_takes_at_most_len_out(fake: FakeRing) -> None:
    r = reader(fake)
    fake.produce(10)
    out = np.zeros(4, dtype=EVENT_DTYPE)
    assert r.read_into(out) == 4
    assert int(fake.tail[0]) == 4
    assert r.records_read == 4


def test_a_ring_size_that_is_not_a_power_of_two_pages_is_refused(fake: FakeRing) -> None:
    with pytest.raises(ValueError, match="power-of-two number of pages"):
        RingReader(fake.ring_fd, fake.pos_fd, 3 * mmap.PAGESIZE)


def test_a_slot_written_a_lap_ahead_is_counted_lost_and_skipped(fake: FakeRing) -> None:
    """More producers than the margin passing the full check at once would overwrite an
    unread slot: the reader must not wait for that position forever."""
    r = reader(fake)
    fake.produce(3)
    fake.slots["seq"][1] = 1 + SLOTS + 1  # position 1 + SLOTS wrote slot 1
    assert r.read()["ts_ns"].tolist() == [1000]
    assert r.take_lapped() == 1
    assert r.read()["ts_ns"].tolist() == [1002]
    assert r.take_lapped() == 0
