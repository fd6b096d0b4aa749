"""Exports and reports never replace or delete what ingero did not write, ``--force`` included (issue 41).

``ingero export --format perfetto --force -o /dev/null`` once replaced the host's /dev/null with a
0600 regular file, and ``--force -o DIR`` deleted an unrelated directory's files.  Each target here
is a stand-in made in the test's own directory (a character device with /dev/null's numbers, a
FIFO, a socket, a symlink, somebody's file and directory), so a regression harms nothing.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from ingero.cli import main
from ingero.export import parquet, perfetto, report_html
from export_helpers import make_db

pytestmark = pytest.mark.xdist_group("replays")

FORMATS = {  # argv after --db: how each output is asked for
    "perfetto": ["export", "--format", "perfetto"],
    "parquet": ["export", "--format", "parquet"],
    "report": ["report", "--html"],
}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return make_db(tmp_path_factory.mktemp("targets") / "cpu.duckdb", duration_s=10)


def _run(db: Path, fmt: str, out: Path, *extra: str) -> int:
    return main([*FORMATS[fmt][:1], "--db", str(db), *FORMATS[fmt][1:], "-o", str(out), *extra])


def _one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for w in words:
        assert w in err, err
    return err


def _tree(path: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


def _char_device(path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("making a character device needs root (CI runs as root)") if not os.environ.get("CI") \
            else pytest.fail("CI runs as root: mknod must work")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers, in the test's own dir
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


SPECIALS = {"character device": _char_device, "FIFO": _fifo, "socket": _socket}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("what", SPECIALS)
def test_a_special_file_is_never_replaced(db: Path, tmp_path: Path, capsys, fmt: str, what: str) -> None:
    target = SPECIALS[what](tmp_path / "node")
    before = os.lstat(target)
    for extra in ((), ("--force",)):
        assert _run(db, fmt, target, *extra) == 2
        _one_line(capsys, str(target), f"is a {what}")
        after = os.lstat(target)
        assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert os.listdir(tmp_path) == ["node"]  # no temporary file left beside it


def test_dev_null_itself_is_refused_before_any_work(db: Path, capsys) -> None:
    before = os.stat("/dev/null")
    assert _run(db, "perfetto", Path("/dev/null"), "--force") == 2
    _one_line(capsys, "/dev/null is a character device")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_foreign_directory_is_never_deleted(db: Path, tmp_path: Path, capsys, fmt: str) -> None:
    mine = tmp_path / "results"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    (mine / "sub" / "model.pt").write_bytes(b"\x00weights")
    before = _tree(mine)
    assert _run(db, fmt, mine, "--force") == 2
    if fmt == "parquet":
        _one_line(capsys, str(mine), "is not a Parquet export written by ingero", "--force replaces only those")
    else:
        _one_line(capsys, str(mine), "is a directory")
    assert _tree(mine) == before
    assert os.listdir(tmp_path) == ["results"]


def test_a_directory_that_only_looks_like_an_export_is_kept(db: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pq"
    assert _run(db, "parquet", out) == 0
    extra = next(out.glob("node=*/session=*")) / "mine.csv"  # somebody's file inside an earlier export
    extra.write_text("a,b\n")
    before = _tree(out)
    assert _run(db, "parquet", out, "--force") == 2
    _one_line(capsys, "is not a Parquet export written by ingero")
    assert _tree(out) == before


@pytest.mark.parametrize("fmt", ["perfetto", "report"])
def test_a_foreign_file_is_never_replaced(db: Path, tmp_path: Path, capsys, fmt: str) -> None:
    theirs = tmp_path / "out.bin"
    theirs.write_bytes(b"\x0a\x03abc somebody's data")  # starts like a protobuf field 1 too
    assert _run(db, fmt, theirs, "--force") == 2
    name = "Perfetto trace" if fmt == "perfetto" else "HTML report"
    _one_line(capsys, str(theirs), f"is not a {name} written by ingero")
    assert theirs.read_bytes() == b"\x0a\x03abc somebody's data"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_symlink_is_never_followed_or_replaced(db: Path, tmp_path: Path, capsys, fmt: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "link"
    link.symlink_to(victim)
    assert _run(db, fmt, link, "--force") == 2
    _one_line(capsys, str(link), "is a symbolic link")
    assert link.is_symlink() and victim.read_text() == "precious"


@pytest.mark.parametrize("fmt", FORMATS)
def test_force_replaces_an_earlier_output_of_ours(db: Path, tmp_path: Path, capsys, fmt: str) -> None:
    out = tmp_path / "out"
    assert _run(db, fmt, out) == 0
    first = _tree(out) if out.is_dir() else out.read_bytes()
    assert _run(db, fmt, out) == 2
    _one_line(capsys, "already exists", "--force")
    assert _run(db, fmt, out, "--force") == 0
    assert (_tree(out) if out.is_dir() else out.read_bytes()) == first  # the same selection, written again
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing left aside


def test_the_recognisers_read_content_not_names(db: Path, tmp_path: Path) -> None:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    assert _run(db, "perfetto", tmp_path / "t.pftrace") == 0
    assert perfetto.is_ours(tmp_path / "t.pftrace")
    # an export of an earlier version: its first packet interned the arg names
    old = pb.TracePacket(trusted_packet_sequence_id=1)
    for i, name in enumerate(perfetto.ARG_NAMES, 1):
        old.interned_data.debug_annotation_names.add(iid=i, name=name)
    (tmp_path / "old.pftrace").write_bytes(pb.Trace(packet=[old]).SerializeToString())
    assert perfetto.is_ours(tmp_path / "old.pftrace")
    other = pb.TracePacket(timestamp=5)
    other.system_info.tracing_service_version = "perfetto v50"
    (tmp_path / "theirs.pftrace").write_bytes(pb.Trace(packet=[other]).SerializeToString())
    assert not perfetto.is_ours(tmp_path / "theirs.pftrace")
    (tmp_path / "empty").write_bytes(b"")
    assert not perfetto.is_ours(tmp_path / "empty") and not report_html.is_ours(tmp_path / "empty")
    (tmp_path / "page.html").write_text("<!DOCTYPE html><html><head><title>my page</title>")
    assert not report_html.is_ours(tmp_path / "page.html")
    (tmp_path / "emptydir").mkdir()
    assert not parquet.is_ours(tmp_path / "emptydir")


@pytest.mark.parametrize("what", ["text", "FIFO", "symlink"])
def test_demo_keep_db_replaces_only_a_duckdb_database(tmp_path: Path, capsys, what: str) -> None:
    target = tmp_path / "kept.duckdb"
    if what == "text":
        target.write_text("my notes, not a database\n")
    elif what == "FIFO":
        os.mkfifo(target)
    else:
        (tmp_path / "victim").write_text("precious")
        target.symlink_to(tmp_path / "victim")
    before = os.lstat(target)
    assert main(["demo", "memcpy-bottleneck", "--synthetic", "--duration", "4", "--keep-db", str(target)]) == 2
    _one_line(capsys, f"--keep-db {target} exists and is not a")
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_size) == (before.st_mode, before.st_ino, before.st_size)


def test_demo_keep_db_replaces_an_earlier_database(tmp_path: Path, capsys) -> None:
    target = tmp_path / "kept.duckdb"
    argv = ["demo", "memcpy-bottleneck", "--synthetic", "--duration", "4", "--no-fix", "--keep-db", str(target)]
    import duckdb

    assert main(argv) == 0
    assert main(argv) == 0  # an earlier demo's database is replaced, as the option promises
    capsys.readouterr()
    con = duckdb.connect(str(target), read_only=True)
    assert con.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM events").fetchone()[0] > 0
