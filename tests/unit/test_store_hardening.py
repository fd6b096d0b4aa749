"""The store refuses other applications' files, creates private files, and tells a storage fault
from a bug (issue 25 findings 11, 14; issue 16's session.py:302)."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import duckdb
import pytest

from ingero.collect import session
from ingero.errors import IngeroError
from ingero.store.db import FORMAT_KEY, FORMAT_VALUE, Store
from ingero.store.faults import StorageFault

from test_session_flush import records, sess  # noqa: F401 - the fixture


def _private_mode() -> int:
    try:
        grp.getgrnam("ingero")
        return 0o640
    except KeyError:
        return 0o600


def _app_db(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE orders (id INT)")
    con.execute("INSERT INTO orders VALUES (1)")
    con.close()


def test_another_applications_duckdb_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    app = tmp_path / "app.duckdb"
    _app_db(app)
    for read_only in (False, True):
        with pytest.raises(IngeroError) as err:
            Store.open(app, read_only=read_only)
        assert str(err.value).startswith(f"{app} is not an ingero database: it is another DuckDB file with 1 table "
                                         "(orders) and no ingero marker")
    con = duckdb.connect(str(app), read_only=True)
    assert [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()] == ["orders"]
    con.close()


def test_ingero_files_carry_the_marker_and_older_ones_are_still_recognised(tmp_path: Path) -> None:
    db = tmp_path / "i.duckdb"
    Store.open(db).close()
    ro = Store.open(db, read_only=True)
    assert ro.con.execute("SELECT value FROM meta WHERE key = $k", {"k": FORMAT_KEY}).fetchall() == [(FORMAT_VALUE,)]
    ro.close()
    con = duckdb.connect(str(db))  # a file from before the marker: schema_version alone
    con.execute("DELETE FROM meta WHERE key = $k", {"k": FORMAT_KEY})
    con.close()
    Store.open(db).close()  # recognised, and marked now
    ro = Store.open(db, read_only=True)
    assert ro.con.execute("SELECT count(*) FROM meta WHERE key = $k", {"k": FORMAT_KEY}).fetchall() == [(1,)]
    ro.close()


def test_an_ingero_file_of_an_unreadable_older_format_gets_the_upgrade_hint(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    Store.open(db).close()
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(IngeroError, match=r"older format \(schema version 0\).*upgrade it with `sudo ingero trace"):
        Store.open(db, read_only=True)


def test_new_files_are_private_and_an_existing_mode_is_kept(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        db = tmp_path / "new.duckdb"
        store = Store.open(db)
        store.begin_session(command="t", targets="t")  # a write: the WAL exists now
        wal = db.with_name(db.name + ".wal")
        assert stat.S_IMODE(db.stat().st_mode) == _private_mode()
        assert wal.exists() and stat.S_IMODE(wal.stat().st_mode) & 0o037 == 0
        store.close()
        assert os.umask(0o022) == 0o022  # close() gave the process its umask back
        os.chmod(db, 0o644)
        Store.open(db).close()
        assert stat.S_IMODE(db.stat().st_mode) == 0o644
    finally:
        os.umask(before)


def test_a_storage_error_stops_with_one_line_and_a_bug_keeps_its_traceback(sess, monkeypatch) -> None:  # noqa: F811
    sess.reader.queue = records(10)
    sess.poll()

    def full(*_a, **_k):
        raise duckdb.IOException('Could not write file "x.wal": No space left on device')

    monkeypatch.setattr(sess.store, "append", full)
    with pytest.raises(StorageFault, match="stopped writing: the disk holding .* is full"):
        sess.flush()

    def bug(*_a, **_k):
        raise duckdb.BinderException("Referenced column \"nope\" not found")

    sess.reader.queue = records(5, start=100)
    sess.poll()
    monkeypatch.setattr(sess.store, "append", bug)
    with pytest.raises(duckdb.BinderException):  # was "stopped writing ...": a schema bug posing as a full disk
        sess.flush()
    assert session.STORAGE_ERRORS
