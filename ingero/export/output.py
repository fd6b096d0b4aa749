"""Where exports land: private files, written whole or not at all.

A file is written under a temporary name in the destination directory and
renamed into place when complete, so an interrupted export never leaves a
half-written file under the name the user asked for.  Files are 0600, or
0640 with group ``ingero`` when that group exists (a team reading traces).
"""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ingero.errors import IngeroError

GROUP = "ingero"


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


def check_target(path: Path, force: bool) -> None:
    """Refuse an existing target without --force and a directory that is not writable."""
    if path.exists() and not force:
        raise IngeroError(f"{path} already exists", "pass --force to overwrite it, or choose another -o")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise IngeroError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise IngeroError(f"cannot write {path}: directory {parent} is not writable")


@contextlib.contextmanager
def atomic_file(path: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it becomes ``path``, on error it is removed."""
    check_target(path, force)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    except OSError as exc:
        raise IngeroError(f"cannot write {path}: {exc.strerror}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _protect(tmp_path)
        if path.is_dir():  # --force over a directory of an earlier parquet export
            shutil.rmtree(path)
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: Path, force: bool) -> Iterator[Path]:
    """Like atomic_file for a directory tree (the Parquet export)."""
    check_target(path, force)
    try:
        tmp_path = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent))
    except OSError as exc:
        raise IngeroError(f"cannot write {path}: {exc.strerror}") from None
    try:
        yield tmp_path
        for p in [tmp_path, *tmp_path.rglob("*")]:
            _protect(p)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        os.replace(tmp_path, path)
    except BaseException:
        shutil.rmtree(tmp_path, ignore_errors=True)
        raise
