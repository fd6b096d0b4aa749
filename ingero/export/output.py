"""Where exports land: private files, written whole or not at all, never over what is not ours.

A file is written under a temporary name in the destination directory and
renamed into place when complete, so an interrupted export never leaves a
half-written file under the name the user asked for.  Files are 0600, or
0640 with group ``ingero`` when that group exists (a team reading traces).

``--force`` replaces only an earlier output of the same kind that ingero
wrote, recognised by its content (each format's ``is_ours``): a device node,
a FIFO, a socket, a symbolic link or somebody else's file or directory is
never replaced or deleted (an export once replaced the host's /dev/null).
"""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ingero.errors import IngeroError

GROUP = "ingero"


@dataclass(frozen=True)
class Kind:
    """One kind of output: what it is called, whether it is a directory, how ingero's own is recognised."""

    name: str  # "Perfetto trace", "HTML report", "Parquet export": said in the refusal
    is_dir: bool
    is_ours: Callable[[Path], bool]  # given an existing regular file (or directory when is_dir)


def _group_id() -> int | None:
    try:
        return grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return None


def _protect(path: Path) -> None:
    gid = _group_id()
    if gid is None:
        os.chmod(path, 0o600 if path.is_file() else 0o700)
        return
    os.chown(path, -1, gid)
    os.chmod(path, 0o640 if path.is_file() else 0o750)


_FILE_TYPES = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
               (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"),
               (stat.S_ISREG, "regular file"))


def _type_name(mode: int) -> str:
    return next((name for test, name in _FILE_TYPES if test(mode)), "special file")


def check_target(path: Path, force: bool, kind: Kind) -> None:
    """Refuse a target that is not ours to replace, an existing one without --force, an unwritable directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise IngeroError(f"cannot write {path}: {exc.strerror}") from None
    if st is not None:
        found = _type_name(st.st_mode)
        wanted = "directory" if kind.is_dir else "regular file"
        if found != wanted:
            raise IngeroError(f"{path} is a {found}: ingero writes its {kind.name} only as a new {wanted}"
                              " or over an earlier one of its own", "choose another -o")
        if not force:
            raise IngeroError(f"{path} already exists", "pass --force to overwrite it, or choose another -o")
        if not kind.is_ours(path):
            raise IngeroError(f"{path} is not a {kind.name} written by ingero: --force replaces only those",
                              "choose another -o, or move that one away yourself")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise IngeroError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise IngeroError(f"cannot write {path}: directory {parent} is not writable")


@contextlib.contextmanager
def atomic_file(path: Path, force: bool, kind: Kind) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it becomes ``path``, on error it is removed."""
    check_target(path, force, kind)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:
        raise IngeroError(f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _protect(tmp_path)
        check_target(path, force, kind)  # again: the export took a while, the path may be another thing now
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: Path, force: bool, kind: Kind) -> Iterator[Path]:
    """Like atomic_file for a directory tree (the Parquet export)."""
    check_target(path, force, kind)
    try:
        tmp_path = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent))
    except OSError as exc:
        raise IngeroError(f"cannot write {path}: {exc.strerror}") from None
    try:
        yield tmp_path
        for p in [tmp_path, *tmp_path.rglob("*")]:
            _protect(p)
        check_target(path, force, kind)
        if os.path.lexists(path):  # an earlier export of ours (checked): moved aside, then removed
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "tree")
            os.replace(tmp_path, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp_path, path)
    except BaseException:
        shutil.rmtree(tmp_path, ignore_errors=True)
        raise
