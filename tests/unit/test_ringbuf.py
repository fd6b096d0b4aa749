"""The ring buffer span reader on hand-made kernel ring layouts (no BPF)."""

from __future__ import annotations

import numpy as np
import pytest

from ingero.collect.records import EVENT_DTYPE
from ingero.collect.ringbuf import (
    BUSY_BIT,
    DISCARD_BIT,
    RECORD_DTYPE,
    RECORD_STRIDE,
    RecordSizeError,
    span_into,
    take_span,
)


def ring(n: int, *, busy: tuple[int, ...] = (), discard: tuple[int, ...] = (), size: int = EVENT_DTYPE.itemsize) -> np.ndarray:
    """n consecutive ring records as the kernel lays them out; event i has ts_ns = 1000 + i."""
    buf = np.zeros(n, dtype=RECORD_DTYPE)
    buf["len"] = size
    buf["event"]["ts_ns"] = 1000 + np.arange(n)
    buf["event"]["pid"] = 7
    for i in busy:
        buf["len"][i] |= BUSY_BIT
    for i in discard:
        buf["len"][i] |= DISCARD_BIT
    # round-trip through bytes: the reader sees raw memory, not our array
    return np.frombuffer(buf.tobytes(), dtype=RECORD_DTYPE)


def test_stride_is_header_plus_event_rounded_to_8() -> None:
    assert EVENT_DTYPE.itemsize == 56
    assert RECORD_STRIDE == 64
    assert RECORD_DTYPE.fields["event"][1] == 8


def test_all_submitted_records_are_returned_in_order() -> None:
    events, consumed = take_span(ring(5))
    assert consumed == 5
    assert events.dtype == EVENT_DTYPE
    assert events["ts_ns"].tolist() == [1000, 1001, 1002, 1003, 1004]
    assert (events["pid"] == 7).all()


def test_a_busy_record_stops_the_read_and_is_not_consumed() -> None:
    events, consumed = take_span(ring(6, busy=(3,)))
    assert consumed == 3
    assert events["ts_ns"].tolist() == [1000, 1001, 1002]


def test_a_busy_first_record_reads_nothing() -> None:
    events, consumed = take_span(ring(4, busy=(0,)))
    assert consumed == 0
    assert len(events) == 0


def test_discarded_records_are_consumed_but_not_returned() -> None:
    events, consumed = take_span(ring(5, discard=(1, 3)))
    assert consumed == 5
    assert events["ts_ns"].tolist() == [1000, 1002, 1004]


def test_busy_after_discard() -> None:
    events, consumed = take_span(ring(5, discard=(0,), busy=(2,)))
    assert consumed == 2
    assert events["ts_ns"].tolist() == [1001]


def test_a_record_of_another_size_is_an_error_not_garbage() -> None:
    with pytest.raises(RecordSizeError, match="48 bytes"):
        take_span(ring(3, size=48))


def test_wrapped_span_reads_through_the_double_mapping() -> None:
    """The kernel maps the data area twice: a span starting near the end continues at offset 0."""
    slots = 8
    data = np.zeros(slots, dtype=RECORD_DTYPE)
    data["len"] = EVENT_DTYPE.itemsize
    data["event"]["ts_ns"] = np.arange(slots)
    doubled = np.frombuffer(data.tobytes() * 2, dtype=RECORD_DTYPE)
    start = 6  # consumer at slot 6, producer 4 records later (wrapped)
    events, consumed = take_span(doubled[start : start + 4])
    assert consumed == 4
    assert events["ts_ns"].tolist() == [6, 7, 0, 1]


def test_span_into_copies_at_most_len_out_and_consumes_only_those() -> None:
    out = np.zeros(3, dtype=EVENT_DTYPE)
    stored, consumed = span_into(ring(5), out)
    assert (stored, consumed) == (3, 3)
    assert out["ts_ns"].tolist() == [1000, 1001, 1002]


def test_span_into_packs_kept_records_at_the_front_of_out() -> None:
    out = np.zeros(6, dtype=EVENT_DTYPE)
    out["ts_ns"] = 1
    stored, consumed = span_into(ring(6, discard=(0, 2), busy=(4,)), out)
    assert (stored, consumed) == (2, 4)
    assert out["ts_ns"].tolist() == [1001, 1003, 1, 1, 1, 1]  # the rest of out untouched
