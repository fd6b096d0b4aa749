"""sessions.stale_calls: stored, migrated into version-1 files, shown by the trace summary and status.

The count itself comes from BPF (CNT_STALE_CALLS, see tests/live/test_stale_calls_live.py);
here: where it goes once read.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import duckdb
import pytest

from ingero.traceapi import OpStats, TickStats, TraceSummary
from ingero.daemon.state import collect_status
from ingero.render.status import lines as format_status
from ingero.render.live import LiveView
from ingero.store.db import SCHEMA_VERSION, Store
from old_schemas import write_old_file


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    return con.execute(
        "SELECT column_name, data_type, column_default FROM duckdb_columns() "
        "WHERE table_name = $t AND schema_name = 'main' ORDER BY column_index", {"t": table}
    ).fetchall()


def test_version_1_file_gains_the_column_on_open(tmp_path: Path) -> None:
    path = tmp_path / "v1.duckdb"
    write_old_file(path)
    assert "stale_calls" not in [c[0] for c in _columns(duckdb.connect(str(path), read_only=True), "sessions")]
    store = Store.open(path)
    assert store.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    # the old session was never counted: NULL, not a made-up 0
    assert store.con.execute("SELECT stale_calls FROM sessions WHERE session_id = 1").fetchone() == (None,)
    sid = store.begin_session(command="ingero trace", targets="all")
    assert store.con.execute("SELECT stale_calls FROM sessions WHERE session_id = $s", {"s": sid}).fetchone() == (0,)
    store.end_session(sid, events=0, drops_kernel=0, drops_user=0, stale_calls=3)
    assert store.con.execute("SELECT stale_calls FROM sessions WHERE session_id = $s", {"s": sid}).fetchone() == (3,)
    migrated = _columns(store.con, "sessions")
    store.close()
    # migrating is what a fresh file gets from schema.sql: same columns, types and defaults
    assert migrated == _columns(Store.memory().con, "sessions")
    again = Store.open(path)  # opening again changes nothing
    assert again.con.execute("SELECT count(*), sum(stale_calls) FROM sessions").fetchone() == (2, 3)
    again.close()


def test_a_version_1_file_read_only_reports_no_count(tmp_path: Path) -> None:
    """`ingero status` opens read-only (no migration): the missing column is None, not an error."""
    path = tmp_path / "v1.duckdb"
    write_old_file(path)
    ro = Store.open(path, read_only=True)
    st = collect_status(ro.con)
    ro.close()
    assert st["session"]["stale_calls"] is None
    assert not any("stale" in line for line in format_status(st))


def test_status_shows_the_count(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.duckdb")
    sid = store.begin_session(command="ingero trace", targets="all")
    store.end_session(sid, events=0, drops_kernel=2, drops_user=0, stale_calls=4)
    st = collect_status(store.con)
    store.close()
    assert st["session"]["stale_calls"] == 4
    drops = [line for line in format_status(st) if line.startswith("drops:")]
    assert drops == ["drops: 2 in kernel, 0 in user space; 4 stale CUDA calls "
                     "(never returned: longjmp or exception; not in events)"]


def test_running_session_row_carries_the_count_between_flushes(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.duckdb")
    sid = store.begin_session(command="ingero trace", targets="all")
    store.update_session(sid, stale_calls=7, drops_kernel=1)
    st = collect_status(store.con)
    store.close()
    assert (st["session"]["stale_calls"], st["session"]["drops_kernel"]) == (7, 1)


def _summary(stale: int) -> TraceSummary:
    return TraceSummary(session_id=3, db_path="/tmp/x.duckdb", elapsed_s=2.0, events=10, drops_kernel=0,
                        drops_user=0, nest_skipped=0, ops={"cudaStreamSync": OpStats(count=10)},
                        ended_by="command exited", stale_calls=stale)


@pytest.mark.parametrize("stale", [1, 5])
def test_trace_summary_says_how_many_calls_never_returned(stale: int) -> None:
    out = io.StringIO()
    LiveView(stream=out, err=io.StringIO()).finish(_summary(stale))
    lines = [ln for ln in out.getvalue().splitlines() if "never returned" in ln]
    calls = "1 CUDA call never returned" if stale == 1 else "5 CUDA calls never returned"
    assert len(lines) == 1 and lines[0].startswith(f"ingero: {calls} (left by longjmp or a C++ exception)")
    assert "sessions.stale_calls" in lines[0]


def test_trace_summary_is_quiet_without_stale_calls() -> None:
    out = io.StringIO()
    LiveView(stream=out, err=io.StringIO()).finish(_summary(0))
    assert "never returned" not in out.getvalue()


def test_json_summary_and_ticks_carry_the_count() -> None:
    out = io.StringIO()
    view = LiveView(as_json=True, stream=out)
    view.tick(TickStats(elapsed_s=1.0, events=3, events_per_s=3.0, drops_kernel=0, drops_user=0, nest_skipped=0,
                        ops={}, notes=[], stale_calls=1))
    view.finish(_summary(2))
    tick, summary = (json.loads(line) for line in out.getvalue().splitlines())
    assert (tick["type"], tick["stale_calls"]) == ("tick", 1)
    assert (summary["type"], summary["stale_calls"]) == ("summary", 2)


def test_explains_analysed_line_shows_the_count_once_the_report_carries_it() -> None:
    """render/terminal reads Analysed.stale_calls when analyze provides it (requested of its owner)."""
    from ingero.analyze.model import Analysed
    from ingero.render.terminal import analysed_line

    a = Analysed(session_id=1, start_ns=0, end_ns=60 * 10**9, window_s=5.0, windows=12, events=100,
                 cuda_events=40, processes=["python3 (train.py) (PID 1)"])
    report = type("R", (), {"analysed": a})()
    assert "stale" not in analysed_line(report)
    a.stale_calls = 2  # what analyze's Analysed will carry (an attribute until then)
    assert analysed_line(report).endswith(
        "drops: 0 kernel, 0 user; 2 stale CUDA calls (never returned: longjmp or exception; not in events)")
