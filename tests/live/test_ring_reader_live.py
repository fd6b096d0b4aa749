"""Live: the ring reader loses nothing once the ring has wrapped around.

The consumer position is shared memory that BPF producers read on every
reservation.  Written byte by byte (struct.pack_into zero-fills first), a
producer could see it as 0 for a moment, take the ring for full and drop a
record, with the ring nearly empty: 96 drops in a 10.8 M-call trace with the
ring never more than a tenth full (05:50 UTC, 2026-11-23).  Such drops start
only after the first lap, when the producer position exceeds the ring size,
so this test produces several laps of a small ring at a rate the reader keeps
up with, and asks for zero drops and every record stored.
"""

from __future__ import annotations

import pytest

from bench.bench_ingest import _build_gen, ingest_step

pytestmark = pytest.mark.live

# Laps matter, not rate: the torn read needs the producer past the ring's size.  A third of the
# reader's ~1 M/s leaves it room on a busy 2-core box, and the ring 1.3 s of slack (a flush of
# 245 k rows takes ~0.2 s idle); 600 k/s in a 0.9 s ring was the thin margin.
RING_MB = 16  # 262 k records: ~1.3 s of slack at RATE
RATE = 200_000  # records/s
SECONDS = 8.0  # 1.6 M records, ~6 laps of the ring


def test_no_drops_after_the_ring_wraps(tmp_path):
    gen = _build_gen(tmp_path)
    r = ingest_step(gen, RATE, tmp_path / "ring.duckdb", ring_mb=RING_MB, step_s=SECONDS)
    laps = r["generated"] * 64 / (RING_MB << 20)
    assert laps > 3, r
    assert (r["drops"], r["drops_user"]) == (0, 0), r
    assert r["stored"] == r["generated"], r
