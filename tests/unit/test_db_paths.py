"""Issue 41.8-9: `--db` naming a FIFO, a device, a socket or a directory is refused at once with one
line (never opened: an open() of a FIFO blocked `explain` for good), and a database whose creation
fails (a full disk) leaves no file behind for the next command to refuse."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import duckdb
import pytest

from ingero.cli import main
from ingero.errors import IngeroError
from ingero.store import db as store_db
from ingero.store.db import Store


def run_cli(args: list[str]) -> int:
    """main(args) on a thread: a command that blocks on a FIFO fails the test instead of hanging it."""
    out: dict[str, int] = {}
    t = threading.Thread(target=lambda: out.setdefault("rc", main(args)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), f"ingero {' '.join(args)} is still running: it opened the path"
    return out["rc"]


@pytest.fixture
def nodes(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    directory = tmp_path / "dir"
    directory.mkdir()
    yield {"fifo": (fifo, "a FIFO (named pipe)"), "socket": (sock_path, "a socket"),
           "device": (Path("/dev/null"), "a character device"), "directory": (directory, "a directory")}
    sock.close()


KINDS = ("fifo", "socket", "device", "directory")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", [["explain"], ["query", "SELECT 1"], ["status"], ["export", "--format", "parquet"]])
def test_a_db_that_is_not_a_file_is_refused_with_one_line(nodes, kind, command, capsys, monkeypatch, tmp_path):
    path, what = nodes[kind]
    before = os.stat(path)
    monkeypatch.setenv("INGERO_DB", str(path))  # the environment reaches the store past click's own checks
    if command[0] == "export":
        command = [*command, "-o", str(tmp_path / "out")]
    assert run_cli(command) == 2
    err = capsys.readouterr().err
    assert err == (f"ingero: --db {path} is {what}, not a database file — pass --db with an ingero DuckDB file, "
                   "or a new path for one\n")
    after = os.stat(path)
    assert (stat.S_IFMT(after.st_mode), after.st_ino, after.st_rdev) == (
        stat.S_IFMT(before.st_mode), before.st_ino, before.st_rdev)


@pytest.mark.parametrize("kind", KINDS)
def test_writers_refuse_them_too(nodes, kind):
    path, what = nodes[kind]
    for opener in (Store.open, store_db.open_for_user_sql):
        with pytest.raises(IngeroError) as exc:
            opener(path)
        assert exc.value.message == f"--db {path} is {what}, not a database file"


def test_a_wal_that_is_a_fifo_is_refused_before_duckdb_replays_it(tmp_path: Path):
    db = tmp_path / "t.duckdb"
    Store.open(db).close()
    wal = tmp_path / "t.duckdb.wal"
    wal.unlink(missing_ok=True)
    os.mkfifo(wal)
    for opener in (lambda: Store.open(db), lambda: Store.open(db, read_only=True)):
        with pytest.raises(IngeroError) as exc:
            opener()
        assert exc.value.message == f"the WAL of --db {wal} is a FIFO (named pipe), not a database file"


def test_a_symlink_to_a_database_is_followed(tmp_path: Path):
    db = tmp_path / "real.duckdb"
    Store.open(db).close()
    link = tmp_path / "link.duckdb"
    link.symlink_to(db)
    Store.open(link, read_only=True).close()


def test_a_missing_db_is_still_the_missing_db_line(tmp_path: Path, capsys):
    assert run_cli(["explain", "--db", str(tmp_path / "none.duckdb")]) == 2
    assert capsys.readouterr().err.startswith(f"ingero: no ingero database at {tmp_path / 'none.duckdb'}")


# -- creation that fails -------------------------------------------------------------------

ENOSPC = "IO Error: Could not write all bytes to file: No space left on device"


def test_a_schema_that_cannot_be_written_leaves_no_file_and_the_next_open_works(tmp_path: Path, monkeypatch):
    db = tmp_path / "new.duckdb"
    real = Store._apply_schema

    def full_disk(self):
        self.con.execute("CREATE TABLE half (x INTEGER)")  # part of the schema got written
        self.con.execute("CHECKPOINT")
        raise duckdb.IOException(ENOSPC)

    monkeypatch.setattr(Store, "_apply_schema", full_disk)
    with pytest.raises(duckdb.IOException):
        Store.open(db)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(Store, "_apply_schema", real)
    store = Store.open(db)
    assert store.con.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() == ("ingero",)
    store.close()


def test_a_file_duckdb_could_not_create_is_removed(tmp_path: Path, monkeypatch):
    db = tmp_path / "new.duckdb"

    def connect(path, *a, **k):
        Path(path).write_bytes(b"")  # the 0-byte file a full disk leaves
        raise duckdb.IOException(ENOSPC)

    monkeypatch.setattr(store_db.duckdb, "connect", connect)
    with pytest.raises(IngeroError, match="its disk is full"):
        Store.open(db)
    assert not db.exists()


def test_an_existing_file_is_never_removed_when_an_open_fails(tmp_path: Path, monkeypatch):
    db = tmp_path / "old.duckdb"
    Store.open(db).close()
    size = db.stat().st_size

    def connect(path, *a, **k):
        raise duckdb.IOException(ENOSPC)

    monkeypatch.setattr(store_db.duckdb, "connect", connect)
    with pytest.raises(IngeroError, match="its disk is full"):
        Store.open(db)
    assert db.stat().st_size == size


def test_a_file_another_process_holds_is_not_removed(tmp_path: Path, monkeypatch):
    # between our stat and our connect another process created the file and holds it: it is theirs
    db = tmp_path / "race.duckdb"

    def connect(path, *a, **k):
        Path(path).write_bytes(b"theirs")
        raise duckdb.IOException('Could not set lock on file "x": Conflicting lock is held in pid 1')

    monkeypatch.setattr(store_db.duckdb, "connect", connect)
    with pytest.raises(store_db.DatabaseLocked):
        Store.open(db)
    assert db.read_bytes() == b"theirs"
