"""Reading the fleet dataset: which files a question needs, their versions, a DuckDB over them.

``catalog`` walks ROOT's hive directories level by level and prunes as it
goes: a job that is not asked for is never listed below its directory, a
date or hour partition outside the time range is never opened, and a file
whose name says its segment started before the range is left out.  Files of
a segment whose ``nodes`` row has a fleet schema this ingero does not know
are left out too, and the answer says so (a stated partial answer); a
dataset with nothing this ingero can read is one line, exit 2.

``connect`` registers the kept files of each table as a pyarrow dataset in
an in-memory DuckDB (``events``, ``windows``, ``chains``, ``processes``,
``ranks``, ``nodes``, with job/node/date/hour columns from the paths); DuckDB
pushes filters into the scan.  Works for a directory and for any pyarrow
filesystem URL alike; DuckDB itself touches no file (external access off).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from ingero.errors import IngeroError, first_line
from ingero.events.units import NS
from ingero.fleet import layout, schema
from ingero.fleet.publish import MAX_SEGMENT_S
from ingero.store.query import lock_down

HOUR_NS = 3600 * NS
MAX_SEGMENT_NS = int(MAX_SEGMENT_S * NS)
DEFAULT_SINCE_S = 3600.0
PARTITIONING = ds.partitioning(pa.schema([(p, pa.string()) for p in schema.PARTITIONS]), flavor="hive")


@dataclass(frozen=True)
class FileRef:
    table: str
    path: str
    job: str
    node: str
    session_id: int
    first_ts: int
    seq: int

    @property
    def segment(self) -> tuple[str, str, int, int]:
        return (self.job, self.node, self.session_id, self.first_ts)


@dataclass
class Catalog:
    root: layout.Root
    files: dict[str, list[FileRef]]
    job: str | None
    start_ns: int | None
    end_ns: int | None
    notes: list[str] = field(default_factory=list)
    listed_dirs: int = 0
    pruned_dirs: int = 0  # partitions (job / date / hour) never listed because of the job or the time range
    pruned_files: int = 0  # files whose segment lies outside the range (by name)
    unknown_segments: int = 0

    def count(self, tables: Iterable[str] | None = None) -> int:
        return sum(len(self.files.get(t, [])) for t in (tables or self.files))


def _ls(root: layout.Root, path: str) -> list[pafs.FileInfo]:
    try:
        return root.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as exc:
        raise IngeroError(f"cannot read the dataset at {root.url}: {first_line(exc)}",
                          "check the mount / URL and this user's permissions") from None


def _value(info: pafs.FileInfo, key: str) -> str | None:
    name = info.base_name
    return name[len(key) + 1:] if info.type == pafs.FileType.Directory and name.startswith(key + "=") else None


def check_root(root: layout.Root) -> None:
    try:
        info = root.fs.get_file_info(root.path)
    except OSError as exc:
        raise IngeroError(f"cannot read the dataset at {root.url}: {first_line(exc)}",
                          "check the mount / URL and this user's permissions") from None
    if info.type == pafs.FileType.NotFound:
        raise IngeroError(f"no fleet dataset at {root.url}: it does not exist",
                          "pass the ROOT nodes publish to (`ingero trace --publish ROOT`)")
    if info.type != pafs.FileType.Directory:
        raise IngeroError(f"no fleet dataset at {root.url}: not a directory", "pass the dataset's ROOT directory")
    names = {i.base_name for i in _ls(root, root.path)}
    if "table=nodes" not in names:
        raise IngeroError(f"no fleet dataset at {root.url}: it holds no table=nodes directory",
                          "pass the ROOT nodes publish to (`ingero trace --publish ROOT`)")


def jobs(root: layout.Root) -> dict[str, int]:
    """job -> the newest hour partition's start (ns) among its nodes."""
    out: dict[str, int] = {}
    for j in _ls(root, root.join("table=nodes")):
        job = _value(j, "job")
        if job is None:
            continue
        newest = 0
        for n in _ls(root, j.path):
            if _value(n, "node") is None:
                continue
            dates = sorted(d for d in _ls(root, n.path) if _value(d, "date") is not None)
            if not dates:
                continue
            last = max(dates, key=lambda d: d.base_name)
            hours = [h for h in _ls(root, last.path) if _value(h, "hour") is not None]
            if hours:
                h = max(hours, key=lambda h: h.base_name)
                newest = max(newest, _hour_start(_value(last, "date"), _value(h, "hour")))
        out[job] = newest
    return out


def _hour_start(date: str | None, hour: str | None) -> int:
    try:
        t = datetime.strptime(f"{date} {hour}", "%Y-%m-%d %H").replace(tzinfo=timezone.utc)
    except (TypeError, ValueError):
        return -1
    return int(t.timestamp()) * NS


def catalog(url: str, *, tables: Iterable[str] = schema.TABLES, job: str | None = None,
            since_s: float | None = None, whole: bool = False) -> Catalog:
    """The files a question reads.  ``whole``: every file of the job(s) (fleet query, status);
    otherwise the last ``since_s`` (default 1 h) before the end of the job's newest data."""
    root = layout.open_root(url)
    check_root(root)
    notes: list[str] = []
    all_jobs = jobs(root)
    if not all_jobs:
        raise IngeroError(f"the fleet dataset at {root.url} holds no segments yet",
                          "nodes publish their first segment a segment length after `ingero trace --publish` starts")
    if job is not None and layout.safe(job) not in all_jobs:
        raise IngeroError(f"no job {job!r} in the fleet dataset at {root.url}",
                          f"jobs there: {', '.join(sorted(all_jobs))}")
    if job is None and not whole:
        job = max(all_jobs, key=lambda j: (all_jobs[j], j))
        if len(all_jobs) > 1:
            notes.append(f"job {job}: the newest of {len(all_jobs)} jobs in the dataset (pass --job for another)")
    start = end = None
    if not whole:
        end = _newest_data_end(root, layout.safe(job), all_jobs[layout.safe(job)] + HOUR_NS)
        span = since_s if since_s is not None else DEFAULT_SINCE_S
        start = max(0, end - int(span * NS))
    cat = Catalog(root, {}, job, start, end, notes)
    for table in tables:
        cat.files[table] = _walk(cat, table, None if job is None else layout.safe(job))
    _drop_unknown_versions(cat)
    return cat


# What a nodes row says of where its data ends: the segment's end, or the end of its loop's
# last active window when the loop stopped before it (a trace that ended mid-segment).
_END_COLUMNS = pa.schema([("segment_end_ns", pa.int64()), ("loop_last_ns", pa.int64()), ("segment_ns", pa.int64())])
LOOP_WINDOW_NS = NS  # a segment's windows are one second (segment.py)


def _newest_data_end(root: layout.Root, job: str, hour_end: int) -> int:
    """The end of the job's newest data: over each node's newest segment in the newest hour
    partition, its nodes row's end (the segment's end, or the loop's last window's when the loop
    stopped before it).  ``--since`` counts back from here.  A file that cannot be read counts
    to its segment's start plus the longest segment (what its name alone allows)."""
    newest: dict[str, list[tuple[int, str]]] = {}  # node -> [(first_ts, path)] of its newest segment
    start = hour_end - HOUR_NS
    t = datetime.fromtimestamp(start / NS, tz=timezone.utc)
    for n in _ls(root, root.join("table=nodes", f"job={job}")):
        if _value(n, "node") is None:
            continue
        files = [(int(m["first_ts"]), f.path) for f in _ls(root, f"{n.path}/date={t:%Y-%m-%d}/hour={t:%H}")
                 if f.type == pafs.FileType.File and (m := layout.NAME_RE.match(f.base_name))]
        if files:
            top = max(ts for ts, _ in files)
            newest[n.path] = [x for x in files if x[0] == top]
    if not newest:
        return hour_end
    ends = []
    for files in newest.values():
        try:
            tab = ds.dataset([p for _, p in files], schema=_END_COLUMNS, filesystem=root.fs,
                             format="parquet").to_table()
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError):
            ends.append(files[0][0] + MAX_SEGMENT_NS)
            continue
        for seg_end, loop_last, seg_ns in zip(*(tab.column(c).to_pylist() for c in _END_COLUMNS.names)):
            if seg_end is None:
                seg_end = files[0][0] + (seg_ns or MAX_SEGMENT_NS)
            ends.append(min(seg_end, loop_last + LOOP_WINDOW_NS) if loop_last is not None else seg_end)
    return max(ends) if ends else hour_end


def _walk(cat: Catalog, table: str, job: str | None) -> list[FileRef]:
    root = cat.root
    out: list[FileRef] = []
    lo = None if cat.start_ns is None else cat.start_ns - MAX_SEGMENT_NS  # a segment may start before the range
    for j in _ls(root, root.join(f"table={table}")):
        jv = _value(j, "job")
        if jv is None:
            continue
        if job is not None and jv != job:
            cat.pruned_dirs += 1
            continue
        cat.listed_dirs += 1
        for n in _ls(root, j.path):
            nv = _value(n, "node")
            if nv is None:
                continue
            for d in _ls(root, n.path):
                dv = _value(d, "date")
                if dv is None:
                    continue
                day = _hour_start(dv, "00")
                if lo is not None and (day + 24 * HOUR_NS <= lo or day >= cat.end_ns):
                    cat.pruned_dirs += 1
                    continue
                for h in _ls(root, d.path):
                    hv = _value(h, "hour")
                    if hv is None:
                        continue
                    hs = _hour_start(dv, hv)
                    if lo is not None and (hs + HOUR_NS <= lo or hs >= cat.end_ns):
                        cat.pruned_dirs += 1
                        continue
                    cat.listed_dirs += 1
                    for f in _ls(root, h.path):
                        m = layout.NAME_RE.match(f.base_name)
                        if f.type != pafs.FileType.File or m is None:
                            continue  # a temporary file being written, or something else
                        ts = int(m["first_ts"])
                        if lo is not None and (ts < lo or ts >= cat.end_ns):
                            cat.pruned_files += 1
                            continue
                        out.append(FileRef(table, f.path, jv, nv, int(m["session"]), ts, int(m["seq"])))
    return out


def _drop_unknown_versions(cat: Catalog) -> None:
    """Keep the segments whose nodes row has this ingero's fleet schema; say what was left out."""
    files = cat.files.get("nodes")
    if files is None:
        cat.files["nodes"] = files = _walk(cat, "nodes", None if cat.job is None else layout.safe(cat.job))
    if not files:
        where = f" for job {cat.job}" if cat.job else ""
        raise IngeroError(f"the fleet dataset at {cat.root.url} holds no segments{where} in the range",
                          "widen --since, or check `ingero fleet status ROOT`")
    try:
        d = ds.dataset([f.path for f in files], filesystem=cat.root.fs, format="parquet")
        if "fleet_schema" not in d.schema.names:
            versions = {f.path: None for f in files}
        else:
            t = d.to_table(columns=["fleet_schema", "__filename"])
            versions = dict(zip(t.column("__filename").to_pylist(), t.column("fleet_schema").to_pylist()))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise IngeroError(f"cannot read the nodes table of {cat.root.url}: {first_line(exc)}",
                          "files of an unknown format or schema version; "
                          "check `ingero --version` on the nodes") from None
    bad = {f.segment: versions.get(f.path) for f in files if versions.get(f.path) != schema.FLEET_SCHEMA_VERSION}
    if not bad:
        return
    found = sorted({str(v) for v in bad.values()})
    if len(bad) == len(files):
        raise IngeroError(f"the fleet dataset at {cat.root.url} has fleet schema version {', '.join(found)}; this "
                          f"ingero reads version {schema.FLEET_SCHEMA_VERSION}",
                          "read it with the ingero version that wrote it (nodes.ingero_version)")
    nodes = sorted({seg[1] for seg in bad})
    cat.unknown_segments = len(bad)
    cat.notes.append(f"partial answer: {len(bad)} of {len(files)} segments (node {', '.join(nodes)}) have fleet "
                     f"schema version {', '.join(found)}, which this ingero (version {schema.FLEET_SCHEMA_VERSION}) "
                     "cannot read: they are left out")
    for table, refs in cat.files.items():
        cat.files[table] = [f for f in refs if f.segment not in bad]


def connect(cat: Catalog, tables: Iterable[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with each table's kept files registered; no file access of its own."""
    con = duckdb.connect(config={"threads": "2"})
    for table in tables:
        files = [f.path for f in cat.files.get(table, [])]
        sch = schema.TABLES[table]
        full = pa.schema([*sch, *[(p, pa.string()) for p in schema.PARTITIONS]])
        base = cat.root.join(f"table={table}")
        d = ds.dataset(files, schema=full, filesystem=cat.root.fs, format="parquet", partitioning=PARTITIONING,
                       partition_base_dir=base)
        con.register(table, d)
    lock_down(con)  # the caps every user-SQL path has (store/query.py): no files, memory, threads, locked
    return con


def now_ns() -> int:
    return time.time_ns()


def iso(ns: int | None) -> str:
    if ns is None:
        return "?"
    return (datetime.fromtimestamp(ns / NS, tz=timezone.utc) + timedelta(0)).strftime("%Y-%m-%d %H:%M:%S UTC")
