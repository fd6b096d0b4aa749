"""Where a segment's files go: ROOT as a pyarrow filesystem, hive paths, names, atomic writes.

  ROOT/table=<t>/job=<j>/node=<n>/date=<YYYY-MM-DD>/hour=<HH>/part-<n>-<session>-<first_ts>-<seq>.parquet

``first_ts`` is the segment's start (ns, aligned to the segment length) and
``seq`` the part within it (a segment's events are cut every ROWS_PER_FILE
rows), so a name says which data it holds: publishing a segment twice writes
the same names, and a name that exists is skipped.  date/hour are the UTC
hour of first_ts.  A file appears whole: written under a hidden temporary
name (``.part-….tmp-<pid>``, which no ``*.parquet`` glob matches) and renamed;
on an object store (s3://, gs://) an object appears whole when its upload
completes, so it is written under its final name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ingero.errors import IngeroError, first_line
from ingero.fleet.schema import FLEET_SCHEMA_VERSION, VERSION_KEY

ROWS_PER_FILE = 1_000_000
TMP_MARK = ".tmp-"

NAME_RE = re.compile(r"^part-(?P<node>.+)-(?P<session>\d+)-(?P<first_ts>\d+)-(?P<seq>\d+)\.parquet$")


@dataclass(frozen=True)
class Root:
    fs: pafs.FileSystem
    path: str  # ROOT inside fs, without a trailing slash
    url: str  # as the user gave it

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def join(self, *parts: str) -> str:
        return "/".join([self.path.rstrip("/"), *parts]) if self.path not in ("", "/") else "/" + "/".join(parts)


def open_root(url: str) -> Root:
    """ROOT as given to --publish / fleet: a directory, or a URL pyarrow's filesystems know."""
    text = str(url).strip()
    if not text:
        raise IngeroError("empty dataset ROOT", "pass a directory or a URL such as s3://bucket/ingero")
    if "://" in text and not text.startswith("file://"):
        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise IngeroError(f"cannot open dataset {text}: {first_line(exc)}",
                              "pass a directory, or a URL of a filesystem pyarrow supports "
                              "(s3://, gs://, hdfs://)") from None
        return Root(fs, path.rstrip("/"), text)
    path = text[len("file://"):] if text.startswith("file://") else text
    return Root(pafs.LocalFileSystem(), os.path.abspath(path), text)


def safe(name: str) -> str:
    """A node or job name as one path component."""
    out = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(name))
    return out.lstrip(".") or "unknown"


def partition_dir(root: Root, table: str, job: str, node: str, first_ts: int) -> str:
    t = datetime.fromtimestamp(first_ts / 1e9, tz=timezone.utc)
    return root.join(f"table={table}", f"job={safe(job)}", f"node={safe(node)}",
                     f"date={t:%Y-%m-%d}", f"hour={t:%H}")


def file_name(node: str, session_id: int, first_ts: int, seq: int) -> str:
    return f"part-{safe(node)}-{int(session_id)}-{int(first_ts)}-{int(seq)}.parquet"


def exists(root: Root, path: str) -> bool:
    return root.fs.get_file_info(path).type == pafs.FileType.File


def write_atomic(root: Root, path: str, table: pa.Table) -> None:
    """Write ``table`` to ``path`` so that a reader sees all of it or nothing (OSError when ROOT is gone)."""
    directory, name = path.rsplit("/", 1)
    root.fs.create_dir(directory, recursive=True)
    meta = dict(table.schema.metadata or {})
    meta[VERSION_KEY] = str(FLEET_SCHEMA_VERSION).encode()
    table = table.replace_schema_metadata(meta)
    target = f"{directory}/.{name}{TMP_MARK}{os.getpid()}" if root.local else path
    with root.fs.open_output_stream(target) as out:
        pq.write_table(table, out, compression="zstd", use_dictionary=_dictionary_columns(table.schema))
    if target != path:
        root.fs.move(target, path)


def _dictionary_columns(sch: pa.Schema) -> list[str]:
    """Dictionary-encode the string columns only (op names, process names: few values); numbers
    compress better plain (timestamps, durations: a dictionary of mostly unique values is wasted
    work).  A dictionary column is a Parquet STRING column like a plain one: engines read strings
    (pyarrow with the dataset's schema too; alone it gives the dictionary type it was written with)."""
    return [f.name for f in sch if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)]


def remove_stale_temps(root: Root, directory: str) -> int:
    """Remove temporary files left in ``directory`` by publishers that died (a kill -9)."""
    removed = 0
    try:
        infos = root.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except OSError:
        return 0
    for info in infos:
        name = info.base_name
        if not name.startswith(".part-") or TMP_MARK not in name:
            continue
        pid = name.rsplit(TMP_MARK, 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and os.path.exists(f"/proc/{pid}"):
            continue  # a live publisher is writing it
        try:
            root.fs.delete_file(info.path)
            removed += 1
        except OSError:
            pass
    return removed
