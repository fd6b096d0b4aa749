"""`ingero export --format perfetto` of a store holding a time before 1970: one line, exit 2, no file.

Perfetto's timestamps are unsigned; a store can hold a negative one (written by hand, or
damaged).  The export used to end in ``ValueError: Value out of range``.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from export_helpers import START_NS, decode, make_db
from ingero.cli import main


def _export(db: Path, out: Path, *extra: str) -> int:
    return main(["export", "--db", str(db), "--format", "perfetto", "-o", str(out), *extra])


def _shift(db: Path, shift: int) -> None:
    con = duckdb.connect(str(db))
    for t in ("events", "system_metrics", "gpu_metrics", "process_memory", "process_cpu"):
        con.execute(f"UPDATE {t} SET timestamp = timestamp - {shift}")
    con.execute(f"UPDATE sessions SET started_ns = started_ns - {shift}, ended_ns = ended_ns - {shift}, "
                f"heartbeat_ns = heartbeat_ns - {shift}")
    con.close()


def test_a_time_before_1970_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "neg.duckdb", duration_s=3)
    _shift(db, START_NS + 20 * 10**9)  # the whole session ends up before 1970
    con = duckdb.connect(str(db))
    earliest = con.execute("SELECT min(timestamp) FROM events").fetchone()[0]
    con.close()
    assert earliest < 0
    out = tmp_path / "t.pftrace"
    assert _export(db, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"holds a time before 1970 ({earliest:,} ns since the epoch)" in err, err
    assert "--format parquet" in err
    assert sorted(os.listdir(tmp_path)) == ["neg.duckdb"]


def test_past_the_negative_times_the_export_works(tmp_path: Path, capsys) -> None:
    """A store starting before 1970, --since narrowing it to times after: written, every slice at t >= 0."""
    db = make_db(tmp_path / "neg.duckdb", duration_s=12)
    _shift(db, START_NS + 10**9)  # the first second before 1970
    con = duckdb.connect(str(db))
    n = con.execute("SELECT count(*) FROM events WHERE timestamp >= 0 AND op NOT IN ('page_fault', 'block_io')"
                    ).fetchone()[0]
    con.close()
    out = tmp_path / "t.pftrace"
    assert _export(db, out, "--since", "6s") == 0, capsys.readouterr().err
    d = decode(out)
    slices = [s for s in d.slices if d.tracks[s.track].HasField("thread")]
    assert 0 < len(slices) <= n and all(s.ts >= 0 for s in slices)
    assert all(ts >= 0 for samples in d.counters.values() for ts, _ in samples)
