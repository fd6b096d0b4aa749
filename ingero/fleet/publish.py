"""`ingero trace --publish ROOT`: a TraceHook that publishes closed segments of the trace to ROOT.

The tracer keeps writing its local store as always; a worker thread (its own
DuckDB cursor, so the session's writer thread never waits for Parquet) turns
each closed segment into files (segment.py) and writes them atomically under
idempotent names (layout.py).  What has been published is kept beside the
store, in ``<db>.fleet.json``: per session, ROOT, node, job and the next
segment to write.  So:

- ROOT unreachable (a lost mount): the segment stays due, tracing goes on
  locally, and the next attempt (every second) publishes it and the ones
  after it, in order;
- a publisher killed (kill -9): its session's remaining segments are
  published by the next `ingero trace --publish` on the same store, from
  the store; a file it had already renamed is skipped by name, a temporary
  file it left is removed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from ingero.events.records import Counter
from ingero.events.units import NS
from ingero.traceapi import TraceHook
from ingero.errors import IngeroError, first_line
from ingero.fleet import layout, segment
from ingero.fleet.facts import NodeFacts, clock_state, node_facts, sync_daemon

# Each segment costs one explain over its span (windows and chains): ~0.2-0.4 CPU-s whatever its
# length, measured here (bench_publish).  Five minutes keeps that near 1% of a tracer's CPU at
# ~2 k events/s; one minute costs ~10% (docs/benchmarks.md).  Fresher fleet answers are a flag away.
DEFAULT_SEGMENT_S = 300.0
MIN_SEGMENT_S, MAX_SEGMENT_S = 5.0, 600.0
# A segment is closed this long after its end: the tracer flushes once a second, and an
# event is stored when it ends (a call at its return, an off-CPU interval when the thread runs).
GRACE_NS = 3 * NS
JOB_ENV = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


def default_job(environ: dict[str, str] = os.environ) -> str | None:  # type: ignore[assignment]
    for key in JOB_ENV:
        if environ.get(key):
            return environ[key]
    return None


def state_path(db_path: Path) -> Path:
    return Path(str(db_path) + ".fleet.json")


class Publisher(TraceHook):
    def __init__(self, root_url: str, db_path: Path, *, node: str | None = None, job: str | None = None,
                 segment_s: float = DEFAULT_SEGMENT_S) -> None:
        self.root = layout.open_root(root_url)
        self.db_path = Path(db_path)
        self.node = node
        self.job = job or default_job()
        self.segment_ns = int(segment_s * NS)
        self.published = 0  # segments written by this process
        self.skipped = 0  # files that existed already (published before a crash)
        self.last_error: str | None = None
        self.failures = 0
        self._state: dict[str, dict[str, Any]] = {}
        self._session: int | None = None
        self._closed_until = 0  # current session: segments ending before this are closed
        self._ended = False
        self._drops = (0, 0)
        self._facts: NodeFacts | None = None
        self._daemon = "none"
        self._cleaned: set[str] = set()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._con: Any = None
        self.crash: BaseException | None = None
        self.cpu_s = 0.0  # the worker thread's CPU time: what publishing cost this tracer

    @classmethod
    def bind(cls, root_url: str, db_path: Path, **kw: Any) -> "Publisher":
        """Check ROOT before anything is attached: a ROOT that cannot be created is one line, exit 2."""
        self = cls(root_url, db_path, **kw)
        try:
            self.root.fs.create_dir(self.root.path, recursive=True)
        except OSError as exc:
            raise IngeroError(f"cannot publish to {root_url}: {first_line(exc)}",
                              "pass a directory this user can write (the shared mount), or a writable URL") from None
        return self

    # -- the session's hook (its writer thread) ------------------------------------

    def on_flush(self, sess: Any, recs: Any, flush_s: float) -> None:
        if self._thread is None:
            self._start(sess)
        self._note(sess)

    def every_second(self, sess: Any) -> None:
        if self._thread is None:
            self._start(sess)
        self._note(sess)
        self._closed_until = time.time_ns() - GRACE_NS
        self._wake.set()

    def on_end(self, sess: Any) -> None:
        if self._thread is None:
            self._start(sess)
        self._note(sess)
        self._ended = True
        self._stop = True
        self._wake.set()
        self._thread.join()  # the rest of the session, published now (or left due: ROOT unreachable)
        self._release()
        if self.crash is not None:
            raise self.crash  # the publisher's bug: shown with its traceback, after the store is safe

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=30)
        self._release()

    def _release(self) -> None:
        """Close the worker's cursor: the session's closing CHECKPOINT waits for no transaction of ours."""
        if self._con is not None and (self._thread is None or not self._thread.is_alive()):
            try:
                self._con.close()
            except Exception:  # noqa: BLE001 - already closed with its connection
                pass
            self._con = None

    # -- state ---------------------------------------------------------------------

    def _note(self, sess: Any) -> None:
        counters = sess.last_counters
        self._drops = (int(counters[Counter.RB_DROPS]) if counters is not None else 0, int(sess.drops_user))

    def _start(self, sess: Any) -> None:
        self._session = int(sess.session_id)
        self._con = sess.store.con.cursor()
        self._facts = node_facts()
        self._daemon = sync_daemon()
        if self.node is None:
            self.node = self._facts.hostname
        # the first flush may hold events from before the session row (block I/O issued while the
        # programs were loading): the first segment starts at the earliest of both
        started = self._con.execute(
            "SELECT least((SELECT min(started_ns) FROM sessions WHERE session_id = $s), "
            "(SELECT min(timestamp + coalesce(duration_ns, 0)) FROM events WHERE session_id = $s))",
            {"s": self._session}).fetchall()[0][0] or time.time_ns()
        self._state = _load(state_path(self.db_path))
        self._state[str(self._session)] = {
            "root": self.root.url, "node": self.node, "job": self.job, "segment_ns": self.segment_ns,
            "next_t0": int(started) // self.segment_ns * self.segment_ns, "done": False}
        self._save()
        self._thread = threading.Thread(target=self._run, name="ingero-publish", daemon=True)
        self._thread.start()

    def _save(self) -> None:
        path = state_path(self.db_path)
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"sessions": self._state}, indent=1))
        os.replace(tmp, path)

    # -- the worker ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(1.0)
                self._wake.clear()
                stopping = self._stop
                c0 = time.thread_time()
                self._publish_due(final=self._ended)
                self.cpu_s += time.thread_time() - c0
                if stopping:
                    return
        except BaseException as exc:  # a bug: kept for on_end to raise on the session's thread
            self.crash = exc

    def _publish_due(self, final: bool) -> None:
        for sid in sorted(self._state, key=int):
            entry = self._state[sid]
            if entry.get("done"):
                continue
            current = int(sid) == self._session
            try:
                self._publish_session(int(sid), entry, current, final)
            except OSError as exc:  # ROOT gone (a lost mount): keep tracing, try again next second
                self.failures += 1
                self.last_error = f"{entry['root']}: {first_line(exc)}"

    def _publish_session(self, sid: int, entry: dict[str, Any], current: bool, final: bool) -> None:
        root = self.root if entry["root"] == self.root.url else layout.open_root(entry["root"])
        seg_ns = int(entry["segment_ns"])
        if current and not final:
            limit = self._closed_until  # segments ending before it are closed
            last_end = None
        else:
            row = self._con.execute(
                "SELECT max(timestamp + coalesce(duration_ns, 0)) FROM events WHERE session_id = $s", {"s": sid}
            ).fetchall()[0]
            last_end = int(row[0]) if row and row[0] is not None else None
            limit = None
        while True:
            t0 = int(entry["next_t0"])
            if limit is not None and t0 + seg_ns > limit:
                return
            if limit is None and (last_end is None or t0 > last_end):
                entry["done"] = True
                self._save()
                return
            if self._stop and current and not final:
                return
            self._write_segment(root, sid, entry, t0, seg_ns)
            entry["next_t0"] = t0 + seg_ns
            self._save()

    def _write_segment(self, root: layout.Root, sid: int, entry: dict[str, Any], t0: int, seg_ns: int) -> None:
        node = entry["node"]
        if not entry.get("job"):
            entry["job"] = self._job_from_ranks(sid) or "default"
        job = entry["job"]
        names = {t: layout.partition_dir(root, t, job, node, t0) for t in ("nodes",)}
        nodes_file = f"{names['nodes']}/{layout.file_name(node, sid, t0, 0)}"
        if layout.exists(root, nodes_file):  # written whole before (nodes is the segment's last file)
            self.skipped += 1
            return
        drops = self._drops if sid == self._session else self._session_drops(sid)
        seg = segment.build(self._con, sid, t0, seg_ns, facts=self._facts, clock=clock_state(self._daemon),
                            drops=drops, rows_per_file=layout.ROWS_PER_FILE)
        from ingero.fleet.schema import WRITE_ORDER

        for table in WRITE_ORDER:
            directory = layout.partition_dir(root, table, job, node, t0)
            if directory not in self._cleaned:
                layout.remove_stale_temps(root, directory)
                self._cleaned.add(directory)
            for seq, part in enumerate(seg.tables.get(table, [])):
                path = f"{directory}/{layout.file_name(node, sid, t0, seq)}"
                if layout.exists(root, path):
                    self.skipped += 1
                    continue
                layout.write_atomic(root, path, part)
        self.published += 1

    def _job_from_ranks(self, sid: int) -> str | None:
        row = self._con.execute("SELECT any_value(job) FROM ranks WHERE session_id = $s AND job IS NOT NULL",
                                {"s": sid}).fetchall()[0]
        return row[0] if row else None

    def _session_drops(self, sid: int) -> tuple[int, int]:
        row = self._con.execute("SELECT max(drops_kernel), max(drops_user) FROM sessions WHERE session_id = $s",
                                {"s": sid}).fetchall()[0]
        return (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)

    def summary(self) -> str:
        due = sum(1 for e in self._state.values() if not e.get("done"))
        text = (f"published {self.published} segment(s) to {self.root.url} as node {self.node}, "
                f"job {self.job or 'default'} "
                f"({self.cpu_s:.2f} CPU-s)")
        if self.skipped:
            text += f" ({self.skipped} file(s) already there: skipped)"
        if due:
            text += (f"; {due} session(s) not yet fully published ({self.last_error or 'pending'}): the next "
                     "`ingero trace --publish` on this --db publishes them")
        return text


def _load(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    sessions = data.get("sessions") if isinstance(data, dict) else None
    return sessions if isinstance(sessions, dict) else {}
