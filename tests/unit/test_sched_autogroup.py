"""sessions.sched_autogroup: recorded at start, migrated onto older files as unknown (NULL)."""

from __future__ import annotations

from pathlib import Path

from old_schemas import write_old_file

from ingero.store.db import SCHEMA_VERSION, Store, sched_autogroup_enabled


def test_reads_the_kernel_switch(tmp_path: Path) -> None:
    f = tmp_path / "sched_autogroup_enabled"
    f.write_text("1\n")
    assert sched_autogroup_enabled(str(f)) is True
    f.write_text("0\n")
    assert sched_autogroup_enabled(str(f)) is False
    assert sched_autogroup_enabled(str(tmp_path / "absent")) is False  # kernel built without autogroups


def test_a_new_session_records_this_hosts_setting(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.duckdb")
    sid = store.begin_session(command="test", targets="t")
    row = store.con.execute("SELECT sched_autogroup FROM sessions WHERE session_id = $s", {"s": sid}).fetchone()
    assert row == (sched_autogroup_enabled(),)
    store.close()


def test_a_version_3_file_gains_the_column_with_null_for_old_sessions(tmp_path: Path) -> None:
    path = tmp_path / "v3.duckdb"
    write_old_file(path, version=3)
    store = Store.open(path)
    assert store.con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    assert store.con.execute("SELECT session_id, sched_autogroup FROM sessions").fetchall() == [(1, None)]
    store.close()
