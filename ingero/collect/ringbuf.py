"""Read the record ring (bpf/ingero.bpf.c) in batches, straight from its memory.

The ring is ours, not a BPF_RINGBUF_OUTPUT (whose reserve + submit cost two
helper calls and a lock per record): two mmap'able BPF arrays,

* ``ring``: RING_SLOTS slots of 64 bytes, ``u64 seq`` + struct ingero_event
  (56 bytes), slot = position % RING_SLOTS;
* ``ring_pos``: ``head`` (positions claimed by BPF producers, one atomic add
  each) and, a cache line further, ``tail`` (positions consumed: written here
  only; producers read it to see whether the ring is full).

A producer claims position p, writes the event, then sets seq = p + 1
(while writing: p + 1 with BUSY_BIT).  A record is complete when its seq is
exactly its position + 1; the first that is not stops the read, and it and
everything after it wait for the next poll.  A seq beyond it means a producer
a lap ahead wrote the slot (more than the ring's margin of producers passed
its full check at once: not seen, guarded anyway): that record is lost,
counted in ``lapped`` and skipped, so the reader never waits on it forever.
The whole span between tail and head is one numpy array with a 64-byte
stride (two pieces where it wraps).
"""

from __future__ import annotations

import mmap

import numpy as np

from ingero.events.records import EVENT_DTYPE

BUSY_BIT = 1 << 63
HEADER_BYTES = 8
RECORD_STRIDE = HEADER_BYTES + EVENT_DTYPE.itemsize  # 64: one cache line per record
POSITIONS_TAIL_OFFSET = 64  # struct ring_positions: head at 0, tail a cache line further

RECORD_DTYPE = np.dtype(
    {
        "names": ["seq", "event"],
        "formats": [np.uint64, EVENT_DTYPE],
        "offsets": [0, HEADER_BYTES],
        "itemsize": RECORD_STRIDE,
    }
)


# Events copied as opaque 56-byte items: numpy then copies each with one
# memcpy instead of field by field (~3x faster than copying the structured field).
_OPAQUE = np.dtype((np.void, EVENT_DTYPE.itemsize))


def complete_prefix(raw: np.ndarray, first_pos: int) -> int:
    """How many records of ``raw`` (RECORD_DTYPE, positions first_pos, first_pos + 1, ...)
    are complete before the first that is not.  Pure function (unit-tested on hand-made bytes)."""
    want = np.arange(first_pos + 1, first_pos + 1 + len(raw), dtype=np.uint64)
    bad = np.flatnonzero(raw["seq"] != want)
    return int(bad[0]) if bad.size else len(raw)


def span_into(raw: np.ndarray, first_pos: int, out: np.ndarray) -> int:
    """Copy the complete records at the start of ``raw`` into ``out`` (EVENT_DTYPE); returns how many.

    Reads the seqs before the payloads they guard (x86 keeps loads in order;
    the producer stores the payload before the seq), at most len(out) records.
    """
    raw = raw[: len(out)]
    n = complete_prefix(raw, first_pos)
    out.view(_OPAQUE)[:n] = raw["event"][:n].view(_OPAQUE)
    return n


class RingReader:
    """Consumer of the record ring: the fds of its two arrays and its size in bytes."""

    def __init__(self, ring_fd: int, positions_fd: int, size: int):
        if size <= 0 or size & (size - 1) or size % mmap.PAGESIZE:
            raise ValueError(f"ring size {size} is not a power-of-two number of pages")
        self.size = size
        self.slots = size // RECORD_STRIDE
        self._ring = mmap.mmap(ring_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        self._positions = mmap.mmap(positions_fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._records = np.frombuffer(self._ring, dtype=RECORD_DTYPE)
        # head and tail as one-element u64 arrays: each load and store is one
        # aligned 8-byte access.  (struct.pack_into zero-fills its bytes before
        # writing the value: a producer reading the position in that moment saw
        # 0, and with the kernel's ring buffer took the ring for full: 96 drops
        # in a 10.8 M-call trace with the ring never a tenth full.)
        self._head = np.frombuffer(self._positions, dtype=np.uint64, count=1, offset=0)
        self._tail = np.frombuffer(self._positions, dtype=np.uint64, count=1, offset=POSITIONS_TAIL_OFFSET)
        self.records_read = 0
        self.lapped = 0  # records overwritten before they were read (counted as user-space drops)

    def positions(self) -> tuple[int, int]:
        """(consumer, producer) positions in bytes since the ring was created."""
        return int(self._tail[0]) * RECORD_STRIDE, int(self._head[0]) * RECORD_STRIDE

    def pending_bytes(self) -> int:
        cons, prod = self.positions()
        return prod - cons

    def read_into(self, out: np.ndarray) -> int:
        """Copy up to len(out) complete events into ``out`` (EVENT_DTYPE) and consume them; returns how many."""
        tail, head = int(self._tail[0]), int(self._head[0])
        n = min(head - tail, len(out))
        done = 0
        while done < n:  # at most two pieces: up to the end of the array, then from its start
            start = (tail + done) % self.slots
            piece = min(n - done, self.slots - start)
            got = span_into(self._records[start : start + piece], tail + done, out[done : done + piece])
            done += got
            if got < piece:
                break
        skipped = 0
        if done < n and int(self._records["seq"][(tail + done) % self.slots]) & ~BUSY_BIT > tail + done + 1:
            skipped = 1  # lapped: taken for the next poll's first record otherwise, forever
            self.lapped += 1
        if done or skipped:
            self._tail[0] = tail + done + skipped
        self.records_read += done
        return done

    def take_lapped(self) -> int:
        """Records lost to lapping since the last call."""
        n, self.lapped = self.lapped, 0
        return n

    def read(self, max_records: int = 1 << 20) -> np.ndarray:
        """Copy out up to ``max_records`` complete events (EVENT_DTYPE) into a new array and consume them."""
        cons, prod = self.positions()
        out = np.empty(max(0, min((prod - cons) // RECORD_STRIDE, max_records)), EVENT_DTYPE)
        return out[: self.read_into(out)]

    def close(self) -> None:
        del self._head, self._tail, self._records  # views of the mappings
        for m in (self._ring, self._positions):
            try:
                m.close()
            except BufferError:  # a view is still alive somewhere; the OS unmaps at exit
                pass
