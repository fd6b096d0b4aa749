from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from ingero.errors import IngeroError
from ingero.store import db
from ingero.store.db import SCHEMA_VERSION, Store, default_db_path


def test_default_path_follows_ingero_db(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INGERO_DB", str(tmp_path / "x.duckdb"))
    assert default_db_path() == tmp_path / "x.duckdb"


def test_default_path_is_sudo_users_home(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    monkeypatch.delenv("INGERO_DB", raising=False)
    someone = next(p for p in pwd.getpwall() if p.pw_uid != 0 and p.pw_dir not in ("", "/"))
    monkeypatch.setenv("SUDO_USER", someone.pw_name)
    assert default_db_path() == Path(someone.pw_dir) / ".ingero" / "ingero.duckdb"


def test_open_creates_schema_and_version(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "a" / "t.duckdb")
    assert s.con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    s.close()
    s = Store.open(tmp_path / "a" / "t.duckdb", read_only=True)
    assert s.read_only
    s.close()


def test_append_arrow_by_name_and_session_lifecycle(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "t.duckdb")
    sid = s.begin_session(command="ingero trace", targets="all")
    batch = pa.table({"op": ["cudaMemcpy", "sched_switch"], "pid": [1, 2], "timestamp": [10, 20],
                      "session_id": [sid, sid]})
    assert s.append("events", batch) == 2
    s.end_session(sid, events=2, drops_kernel=0, drops_user=1)
    row = s.con.execute("SELECT status, events, drops_user, ended_ns IS NOT NULL FROM sessions").fetchone()
    assert row == ("closed", 2, 1, True)
    assert s.con.execute("SELECT op, pid FROM events ORDER BY timestamp").fetchall() == [
        ("cudaMemcpy", 1), ("sched_switch", 2)]


def test_crashed_session_detected(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "t.duckdb")
    sid = s.begin_session(command="x", targets="y")
    s.con.execute("UPDATE sessions SET tracer_pid = 999999999 WHERE session_id = $s", {"s": sid})
    assert s.mark_crashed_sessions() == 1
    assert s.con.execute("SELECT status FROM sessions").fetchone() == ("crashed",)


def test_upsert_process_names(tmp_path: Path) -> None:
    s = Store.memory()
    s.upsert_process_names([{"pid": 5, "name": "python3 (a.py)", "comm": "python3", "cmdline": "python3 a.py",
                             "session_id": 1, "seen_ns": 1}])
    s.upsert_process_names([{"pid": 5, "name": "python3 (b.py)", "comm": "python3", "cmdline": "python3 b.py",
                             "session_id": 2, "seen_ns": 9}])
    assert s.con.execute("SELECT name, first_seen_ns, last_seen_ns FROM process_names").fetchall() == [
        ("python3 (b.py)", 1, 9)]


def test_missing_and_corrupt_db_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(IngeroError, match="no ingero database"):
        Store.open(tmp_path / "none.duckdb", read_only=True)
    bad = tmp_path / "bad.duckdb"
    bad.write_text("not a database")
    with pytest.raises(IngeroError, match="cannot open database"):
        Store.open(bad, read_only=True)


def test_newer_schema_refused(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "t.duckdb")
    s.con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    s.close()
    with pytest.raises(IngeroError, match="newer than this ingero"):
        Store.open(tmp_path / "t.duckdb")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_db_belongs_to_sudo_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pwd

    someone = next(p for p in pwd.getpwall() if p.pw_uid != 0 and p.pw_dir not in ("", "/"))
    monkeypatch.setenv("SUDO_USER", someone.pw_name)
    path = tmp_path / "owned" / "t.duckdb"
    Store.open(path).close()
    assert path.stat().st_uid == someone.pw_uid
    assert db.invoking_user() is not None
