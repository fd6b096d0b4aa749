"""One trace session: load, attach, then drain -> decode -> store until told to stop.

Everything runs on one thread (the DuckDB writes included): the record ring
holds ~2 s of records at 1 M/s (128 MiB), so the loop can afford batched
appends and the odd slow commit (a shared VM disk stalls fsync for a second).  The loop, every POLL_INTERVAL_S:

* copies every complete record from the record ring into one pending
  buffer (ringbuf.RingReader.read_into);
* once a second, or as soon as FLUSH_ROWS are pending (then whole DuckDB row
  groups only), decodes and appends them to ``events`` (so stored data is
  about a second old at most);
* once a second: process_cpu harvest, process names of pids that appeared,
  new CUDA library copies (LibraryWatcher), --comm rescan, the hooks' second
  (ingero/traceapi.py: the query daemon's retention, the samplers, ...), and
  a stats tick for the live view.

--duration, SIGINT and SIGTERM end it the same way: drain the ring, store
every decoded record, close the session with totals and drops.  With --cmd
the trace also ends (after draining) when the command exits.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import duckdb
import numpy as np
import pyarrow as pa

from ingero.collect import (cupti, decode, entry_cost, fdtargets, holds, nvtx, nvtx_inject, prelaunch, probes, ranks,
                            targets)
from ingero.events.ops import NVTX_OPS, Op
from ingero.events.records import EVENT_DTYPE, OP_NAME_TABLE, Counter
from ingero.traceapi import OpStats, StartInfo, TickStats, TraceHook, TraceSummary
from ingero.collect.loader import DEFAULT_RING_MB, BpfSettings, Program, load_program, ring_bytes_from_mb
from ingero.collect.ringbuf import RingReader
from ingero.errors import IngeroError
from ingero.store.db import Store, invoking_user
from ingero.store.faults import STORAGE_ERRORS, StorageFault, write_error

POLL_INTERVAL_S = 0.01  # record ring poll; at 1 M records/s that is 10 k records (640 KiB) a poll
# An empty ring doubles the wait up to this: an idle tracer wakes 20 times a second, not 100.
# The first poll after events resume then holds at most 50 ms of them (3 MiB of the 128 MiB ring
# at 1 M/s), and stop/duration checks are at most this late.
IDLE_POLL_MAX_S = 0.05
FLUSH_INTERVAL_S = 1.0  # everything pending is stored at least this often
# DuckDB's row group (its default row_group_size).  An append of whole row
# groups is written compressed, once; a part group goes through the WAL and
# is rewritten at the next checkpoint.  Measured on cudart-call-shaped rows
# (threads=1, append + commit + the final CHECKPOINT, ns of CPU per row):
# 250,000-row appends 1157, 245,760 (2 groups) 781, 368,640 (3 groups) 737.
ROW_GROUP_ROWS = 122_880
# Or sooner when this many wait: then whole row groups are stored and the
# rest (less than one group) waits for the next flush.  Each append holds up
# reading ~0.2 s at most.
FLUSH_ROWS = 2 * ROW_GROUP_ROWS
READ_BATCH = 1 << 18  # records per ring read (16 MiB of ring)
# Pending records live in one preallocated buffer the ring is copied into
# (one copy per record; no per-poll arrays to concatenate at the flush).
# Flushes keep it below FLUSH_ROWS before each poll, so a whole READ_BATCH fits.
PENDING_CAPACITY = FLUSH_ROWS + READ_BATCH
DRAIN_MAX_S = 0.5  # at the end: give up when nothing new could be read for this long (BPF programs are short)
PCT_WINDOW_S = 10  # live view percentiles cover the last 10 s
# Durations kept per op and second for the live view's percentiles: 20 k per op
# over the window, so its p99 still rests on 200 samples above it.
PCT_SAMPLE = 2_000


@dataclass
class TraceOptions:
    db_path: Path | None = None
    duration_s: float | None = None
    pids: list[int] = field(default_factory=list)
    comm: str | None = None
    cmd: str | None = None
    cuda_libs: list[Path] = field(default_factory=list)
    stack: bool = False
    launch_streams: bool = False  # --streams: read each kernel launch's stream (costs the traced job time)
    ring_mb: int = DEFAULT_RING_MB
    command_line: str = "ingero trace"
    cmd_stdout_to_stderr: bool = False  # --json: the command's output must not mix with the NDJSON
    # --cmd: load ingero's NVTX injection library into the command, its ranges become spans (--no-nvtx: off)
    nvtx: bool = True
    # Stop a process that opens a CUDA / NCCL library (traced: execs a program) until its probes
    # are in (collect/holds.py; --no-hold: off)
    hold: bool = True
    # --cmd: load ingero's CUPTI injection library into the command, the device's kernels and
    # copies become device_activity (--no-cupti: off)
    cupti: bool = True
    # Services the trace command wires in (the query daemon, the samplers, Prometheus
    # metrics ...): see ingero/traceapi.py TraceHook.
    hooks: list["TraceHook"] = field(default_factory=list)


class _Stop:
    """Signal handlers set a reason; the loop checks it."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.reason = self.reason or signal.Signals(signum).name

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _Percentiles:
    """Per-op counts since the start and duration samples of the last PCT_WINDOW_S seconds.

    About PCT_SAMPLE durations per op and second are kept: each record of an
    op is kept with probability PCT_SAMPLE / (the op's count in the previous
    second, or so far in this one if higher), all of them for rarer ops.
    Sampling per poll instead kept every duration (a poll holds fewer records
    than the sample size): add + roll + percentiles cost 272 ns of CPU per
    event at 745 k cudart-shaped records/s with a full window; now 33.
    """

    def __init__(self) -> None:
        self._window: list[tuple[np.ndarray, np.ndarray]] = []  # one entry per second
        self._current: list[tuple[np.ndarray, np.ndarray]] = []
        self.counts = np.zeros(256, dtype=np.int64)
        self._second = np.zeros(256, dtype=np.int64)  # counts in the current second
        self._last_second = np.zeros(256, dtype=np.int64)
        self._rng = np.random.default_rng()

    def add(self, recs: np.ndarray) -> None:
        # a contiguous copy: bincount and take run ~2-5x faster on it, and it never
        # aliases the pending buffer (ascontiguousarray of a 1-record field would)
        op = np.array(recs["op"])
        counts = np.bincount(op, minlength=256)
        self.counts += counts
        self._second += counts
        rate = np.maximum(self._last_second, self._second)
        if (rate[counts > 0] > PCT_SAMPLE).any():
            keep_p = np.minimum(1.0, PCT_SAMPLE / np.maximum(rate, 1)).astype(np.float32)
            idx = np.flatnonzero(self._rng.random(len(op), dtype=np.float32) < np.take(keep_p, op))
            self._current.append((op[idx], recs["duration_ns"][idx]))
        else:
            self._current.append((op, recs["duration_ns"].copy()))

    def roll(self) -> None:
        """Close the current second."""
        self._last_second = self._second
        self._second = np.zeros(256, dtype=np.int64)
        if self._current:
            self._window.append(
                (np.concatenate([c[0] for c in self._current]), np.concatenate([c[1] for c in self._current]))
            )
        self._current = []
        self._window = self._window[-PCT_WINDOW_S:]

    def stats(self) -> dict[str, OpStats]:
        out: dict[str, OpStats] = {}
        parts = self._window + self._current
        ops = np.concatenate([w[0] for w in parts]) if parts else np.empty(0, np.uint8)
        durs = np.concatenate([w[1] for w in parts]) if parts else np.empty(0, np.uint64)
        for op in np.flatnonzero(self.counts):
            if op == Op.NCCL_EXT or op in NVTX_OPS:  # half of an NCCL call's records; NVTX ranges: not calls
                continue
            st = OpStats(count=int(self.counts[op]))
            d = durs[ops == op]
            if d.size:
                st.p50_ns, st.p95_ns, st.p99_ns = (float(x) for x in np.percentile(d, [50, 95, 99]))
            out[str(OP_NAME_TABLE[op])] = st
        return out


class TraceSession:
    """State of one running trace; ``run_trace`` drives it."""

    def __init__(self, opts: TraceOptions, store: Store, program: Program, session_id: int):
        self.opts = opts
        self.store = store
        self.program = program
        self.session_id = session_id
        # One DuckDB thread: the tracer's writes stay on one core and leave the
        # rest to the traced job (and bench_ingest measured it faster on a
        # loaded 2-core box: 0.86 vs 1.1-1.8 s per million rows).
        store.con.execute("SET threads = 1")
        self.offset_ns = decode.monotonic_offset_ns()
        # what the loaded program reads, not what was asked: a launch's 0 is "not read" unless compiled in
        self.stream_ops = decode.stream_ops(program.settings.launch_streams)
        self.reader = RingReader(*program.ring_fds(), program.settings.ring_bytes)
        self.pending_buf = np.empty(PENDING_CAPACITY, dtype=EVENT_DTYPE)
        self.pending_rows = 0
        self.next_flush = time.monotonic() + FLUSH_INTERVAL_S
        self.events = 0
        self.drops_user = 0
        self.named_threads: set[tuple[int, int]] = set()  # (pid, tid) whose thread_names row is written
        self.pct = _Percentiles()
        self.seen_pids: set[int] = set()
        # pids /proc could not be read for -> when their image started (exec time; None: unknown)
        self.nameless: dict[int, int | None] = {}
        self.identities: dict[int, tuple[str, str | None]] = {}  # pid -> (name, cmdline) last stored
        self.notes: list[str] = []
        self.derived_cpu_s = 0.0  # CPU spent storing the hooks' flush_rows (its makers count their own)
        self.runtime_notes: list[str] = []  # stripped runtimes linked in (sessions.notes)
        self.stacks: Any = None
        self.stack_failures = 0  # flushes stored without stacks because resolving them failed
        self._stack_errors: set[str] = set()
        self.daemon: Any = None  # the query daemon, when a hook serves one (ingero.daemon.hook)
        self.traced: set[int] = set()  # the traced pids, as of the last second's rows
        self._proc_prev: dict[int, np.ndarray] = {}
        self._proc_prev_ns = time.monotonic_ns()
        self._probe_rows_written = 0
        self._call_cost_stored: float | None = None  # sessions.call_cost_ns as last written
        self.last_counters: np.ndarray | None = None  # BPF counters as last read (once a second)
        self.probe_misses = 0  # Program.probe_misses as last read, with the counters
        self.nccl = ranks.NcclJoin(session_id, self.offset_ns)
        self.nvtx = nvtx.NvtxSpans(session_id, self.offset_ns)
        self.env_read: set[int] = set()  # pids whose environment was read for ranks (again after an exec)
        self.env_rows: dict[int, tuple] = {}  # pid -> its last 'env' row's values (an exec may keep them)
        self.holder: Any = None  # holds.Holder while processes mapping CUDA are held

    # -- events ----------------------------------------------------------------

    def poll(self) -> int:
        """Copy what the ring holds (up to READ_BATCH records) into the pending buffer; returns how many."""
        start = self.pending_rows
        room = min(READ_BATCH, PENDING_CAPACITY - start)
        n = self.reader.read_into(self.pending_buf[start : start + room])
        self.drops_user += self.reader.take_lapped()
        if n:
            recs = self.pending_buf[start : start + n]
            self.pending_rows += n
            self.pct.add(recs)
            self._note_execs(recs)  # first: a process seen at its exec is named once, as of the exec
            self._note_pids(recs)  # now, while short-lived processes still exist
        return n

    def flush_if_due(self, now: float) -> None:
        """The flush policy: whole row groups once FLUSH_ROWS wait, everything every FLUSH_INTERVAL_S.

        At high rates the size rule fires every fraction of a second and the
        rest (under one row group) rides along with the next flush: stored
        data is then at most ~FLUSH_INTERVAL_S plus one flush old.
        """
        if self.pending_rows >= FLUSH_ROWS:
            self.flush(whole_row_groups=True)
            self.next_flush = now + FLUSH_INTERVAL_S
        elif now >= self.next_flush:
            self.flush()
            self.next_flush = now + FLUSH_INTERVAL_S

    def flush(self, whole_row_groups: bool = False) -> None:
        """Store pending records (all of them, or only whole row groups, keeping the rest pending)."""
        n = self.pending_rows
        if whole_row_groups:
            n -= n % ROW_GROUP_ROWS
        if n == 0:
            return
        t0 = time.monotonic()
        recs = decode.storage_order(self.pending_buf[:n])
        recs, nvtx_spans = self.nvtx.take(recs)
        recs, comm, rank_rows = self.nccl.join(recs)
        stack_ids = None
        if self.stacks is not None:
            stack_ids = self._resolve_stacks(recs)
        fd_targets = fdtargets.resolve(recs["pid"], decode.wait_fds(recs))
        switches = recs[recs["op"] == int(Op.SCHED_SWITCH)]
        names = fdtargets.thread_names(switches["pid"], switches["tid"], self.named_threads)
        table = decode.events_table(recs, session_id=self.session_id, offset_ns=self.offset_ns, stack_ids=stack_ids,
                                    stream_ops=self.stream_ops, comm=comm, fd_targets=fd_targets)
        derived = [rows for hook in self.opts.hooks for rows in hook.flush_rows(self, recs)]
        fields = {k: v for hook in self.opts.hooks for k, v in hook.session_fields(self).items()}
        # the table may hold views of pending_buf: the rest moves down only after the append
        rest = self.pending_rows - n
        self.pending_rows = 0
        # rows and heartbeat in one transaction: one commit (one fsync) per flush, not two
        try:
            with self.store.transaction():
                added = self.store.append("events", table)
                if rank_rows:
                    self.store.append("ranks", pa.Table.from_pylist(rank_rows))
                if nvtx_spans is not None:
                    self.store.append("spans", nvtx_spans)
                if names:
                    self.store.append("thread_names", pa.Table.from_pydict({
                        "session_id": [self.session_id] * len(names), "pid": [n[0] for n in names],
                        "tid": [n[1] for n in names], "name": [n[2] for n in names]}))
                c0 = time.thread_time()
                for name, rows in derived:
                    self.store.append(name, rows)
                self.derived_cpu_s += time.thread_time() - c0
                self.store.update_session(self.session_id, events=self.events + added, heartbeat_ns=time.time_ns(),
                                          **self._counter_fields(), **fields)
        except STORAGE_ERRORS as exc:  # the disk or the file; anything else is a bug and keeps its traceback
            self.drops_user += n + rest
            raise write_error(exc, self.store.path) from None
        del table, derived
        if rest:
            opaque = self.pending_buf.view(_OPAQUE)
            opaque[:rest] = opaque[n : n + rest].copy()
        self.pending_rows = rest
        self.events += added
        flush_s = time.monotonic() - t0
        for hook in self.opts.hooks:  # per flush, never per event
            hook.on_flush(self, recs, flush_s)

    def _resolve_stacks(self, recs: np.ndarray) -> np.ndarray:
        """Stored stack ids for the records; on a resolver failure, none (-1) and a note.

        Stacks enrich rows; a bug or race in resolving them must not cost the
        rows themselves (a KeyError out of resolve once ended a trace and lost
        its pending records: CI, 2026-11-23).  Each distinct error is noted
        once; every flush stored without stacks is counted."""
        try:
            return self.stacks.resolve(recs["stack_id"], recs["pid"])
        except Exception as exc:  # noqa: BLE001 - any failure: rows first, then say why
            self.stack_failures += 1
            why = f"{type(exc).__name__}: {exc}".rstrip(": ")
            if why not in self._stack_errors:
                self._stack_errors.add(why)
                self.notes.append(f"stacks: resolving failed ({why}); {len(recs):,} rows stored without stacks")
            return np.full(len(recs), -1, dtype=np.int64)

    def _note_pids(self, recs: np.ndarray) -> None:
        # Unique pids from the heads of runs of one pid: a thread's records come
        # in long runs, so np.unique sorts a handful instead of every record.
        # A pid's first record dates its first name (process_history.from_ns).
        pid = recs["pid"]
        heads = np.concatenate(([0], np.flatnonzero(pid[1:] != pid[:-1]) + 1))
        pids, first = np.unique(pid[heads], return_index=True)
        first_ns = recs["ts_ns"][heads[first]].astype(np.int64) + self.offset_ns
        since: dict[int, int | None] = dict(zip(pids.tolist(), first_ns.tolist()))
        self._note_env(since)
        switch = recs["op"] == int(Op.SCHED_SWITCH)
        if switch.any():
            for p in np.unique(recs["other_pid"][switch]).tolist():
                since.setdefault(p, None)
        self.upsert_names(since)

    def _note_env(self, pids: dict[int, int | None]) -> None:
        """ranks 'env' rows: the torchrun / Slurm environment of each traced process, read once."""
        rows = []
        now = time.time_ns()
        for pid in pids:
            if pid <= 0 or pid in self.env_read:
                continue
            self.env_read.add(pid)
            env = ranks.read_environ(pid)
            row = ranks.env_row(env, session_id=self.session_id, pid=pid, seen_ns=now) if env else None
            values = tuple(row[k] for k in ("rank", "nranks", "local_rank", "job")) if row else None
            if row is not None and self.env_rows.get(pid) != values:
                self.env_rows[pid] = values
                rows.append(row)
        if rows:
            try:
                self.store.append("ranks", pa.Table.from_pylist(rows))
            except STORAGE_ERRORS as exc:  # called from the poll loop, outside the flush's handling
                raise write_error(exc, self.store.path) from None

    def upsert_names(self, pids: Any) -> None:
        """Name the pids not named yet; ``pids`` may map each to its first record's time (else: now)."""
        since = pids if isinstance(pids, dict) else dict.fromkeys(pids)
        new = {p: t for p, t in since.items() if p > 0 and p not in self.seen_pids}
        if not new:
            return
        self._name_now(new)

    def _note_execs(self, recs: np.ndarray) -> None:
        """Processes that exec'd are named again (a pyenv shim's bash becomes python3).

        /proc is read when the record is, a few ms after the exec: a process
        that exec'd again meanwhile is named after its newest image (the one
        that runs on), and one that is gone by then keeps the comm BPF gave
        it at the exec (named at the next harvest)."""
        execs = recs[recs["op"] == int(Op.PROC_EXEC)]
        if not len(execs):
            return
        last: dict[int, int] = {}
        for pid, ts in zip(execs["pid"].tolist(), (execs["ts_ns"].astype(np.int64) + self.offset_ns).tolist()):
            last[pid] = max(ts, last.get(pid, 0))
        self._name_now(last)
        self.env_read.difference_update(last)  # `env RANK=1 prog`, torchrun's workers: set before the exec
        self._note_env(last)

    def _name_now(self, from_ns: dict[int, int | None]) -> None:
        """Name pids from /proc: process_names (latest) and a process_history row from ``from_ns`` (None: now)."""
        rows = []
        now = time.time_ns()
        for pid, since in from_ns.items():
            info = _process_info(pid)
            if info is None:
                self.nameless[pid] = since  # already gone: named from its kernel comm at the next harvest
                continue
            self.nameless.pop(pid, None)  # a later image was read: the comm of an earlier one must not win
            self.seen_pids.add(pid)
            if self.identities.get(pid) == (info["name"], info["cmdline"]):
                continue  # the same image seen again (an exec read after the next one)
            self.identities[pid] = (info["name"], info["cmdline"])
            rows.append({**info, "session_id": self.session_id, "seen_ns": now, "from_ns": since})
        self.store.upsert_process_names(rows)

    def _name_from_comm(self, pids: np.ndarray, stats: np.ndarray) -> None:
        """Processes that exited before /proc could be read: their kernel comm is the best name left."""
        rows = []
        now = time.time_ns()
        for pid, comm in zip(pids, stats["comm"]):
            pid = int(pid)
            if pid in self.nameless:
                name = bytes(comm).split(b"\0", 1)[0].decode("utf-8", "replace")
                rows.append({"pid": pid, "name": name, "comm": name, "cmdline": None,
                             "session_id": self.session_id, "seen_ns": now, "from_ns": self.nameless.pop(pid)})
                self.seen_pids.add(pid)
                self.identities[pid] = (name, None)
        self.store.upsert_process_names(rows)

    # -- once a second ---------------------------------------------------------

    def harvest_process_cpu(self) -> None:
        """process_cpu rows: per-process deltas since the last harvest (unchanged processes dropped)."""
        now_mono = time.monotonic_ns()
        interval = now_mono - self._proc_prev_ns
        self._proc_prev_ns = now_mono
        pids, stats = self.program.proc_stats()
        if not len(pids):
            return
        if self.nameless:
            self._name_from_comm(pids, stats)
        cur = np.stack([stats["oncpu_ns"], stats["involuntary"], stats["voluntary"], stats["preempted_traced"]],
                       axis=1).astype(np.int64)
        prev = np.array([self._proc_prev.get(int(p), np.zeros(4, np.int64)) for p in pids]).reshape(-1, 4)
        delta = cur - prev
        changed = (delta != 0).any(axis=1)
        for p, row in zip(pids, cur):
            self._proc_prev[int(p)] = row
        gone = [int(p) for p, ch in zip(pids, changed) if not ch and not targets.alive(int(p))]
        if gone:
            self.program.forget_procs(gone)
            for p in gone:
                self._proc_prev.pop(p, None)
        if not changed.any():
            return
        idx = np.flatnonzero(changed)
        comms = [bytes(c).split(b"\0", 1)[0].decode("utf-8", "replace") for c in stats["comm"][idx]]
        table = pa.table(
            {
                "session_id": pa.array(np.full(len(idx), self.session_id, np.int32)),
                "timestamp": pa.array(np.full(len(idx), now_mono + self.offset_ns, np.int64)),
                "interval_ns": pa.array(np.full(len(idx), interval, np.int64)),
                "pid": pa.array(pids[idx].astype(np.int32)),
                "comm": pa.array(comms, pa.string()),
                "oncpu_ns": pa.array(delta[idx, 0]),
                "involuntary": pa.array(delta[idx, 1]),
                "voluntary": pa.array(delta[idx, 2]),
                "preempted_traced": pa.array(delta[idx, 3]),
            }
        )
        self.store.append("process_cpu", table)
        # competitors of traced threads get readable names too
        self.upsert_names(int(p) for p, pt in zip(pids[idx], delta[idx, 3]) if pt > 0)

    def store_call_cost(self) -> None:
        """sessions.call_cost_ns: what one traced launch costs (entry_cost.py), once calibrated and
        again whenever the launch entries linked so far make it another figure."""
        cost = self.program.call_cost_ns
        if cost is not None and cost != self._call_cost_stored:
            self.store.update_session(self.session_id, call_cost_ns=cost)
            self._call_cost_stored = cost

    def write_probe_rows(self) -> None:
        recs = self.program.records[self._probe_rows_written :]
        if not recs:
            return
        self._probe_rows_written = len(self.program.records)
        self.store.append(
            "probes",
            pa.Table.from_pylist(
                [
                    {
                        "session_id": self.session_id,
                        "target": r.target,
                        "symbol": r.symbol,
                        "op": r.op,
                        "probe_kind": r.probe_kind,
                        "attached": r.attached,
                        "error": r.error,
                    }
                    for r in recs
                ]
            ),
        )

    def counters(self) -> np.ndarray:
        self.last_counters = self.program.counters()
        self.probe_misses = self.program.probe_misses()
        return self.last_counters

    def _counter_fields(self) -> dict[str, int]:
        """Session-row totals as of the last counter read, so `ingero status` shows them while tracing."""
        fields = {"drops_user": self.drops_user}
        if self.last_counters is not None:
            fields["drops_kernel"] = int(self.last_counters[Counter.RB_DROPS])
            fields["stale_calls"] = int(self.last_counters[Counter.STALE_CALLS])
            fields["probe_misses"] = self.probe_misses
        return fields

    def drain(self) -> None:
        """Read everything submitted before now, then store it.

        Host-wide events never pause, so "until the ring is empty" may never
        come: drain up to the producer position seen at the stop (records
        still being written there get DRAIN_MAX_S to be submitted).
        """
        _, stop_pos = self.reader.positions()
        give_up = time.monotonic() + DRAIN_MAX_S
        while True:
            progress = self.poll()
            if self.pending_rows >= FLUSH_ROWS:
                self.flush(whole_row_groups=True)
            if progress:
                # a backlog is still being read; timed from after the flush, which
                # can itself outlast DRAIN_MAX_S on a busy disk (the drain then gave
                # up on a full ring: bench_ingest at 2 M/s left ~0.7 M records unread)
                give_up = time.monotonic() + DRAIN_MAX_S
            consumer, _ = self.reader.positions()
            if consumer >= stop_pos or time.monotonic() >= give_up:
                break
            time.sleep(POLL_INTERVAL_S / 5)
        self.flush()


# records copied as opaque 56-byte items: one memcpy each, not field by field
_OPAQUE = np.dtype((np.void, EVENT_DTYPE.itemsize))


def _process_info(pid: int) -> dict | None:
    try:
        from ingero.collect.procnames import process_info
    except ImportError:  # pragma: no cover - discovery module not present
        return None
    return process_info(pid)


def _find_libraries(extra: list[Path], executables: list[tuple[str, str]]) -> tuple[list[Any], Any]:
    from ingero.collect.libs import LibraryWatcher

    watcher = LibraryWatcher(extra=extra, executables=executables)
    return watcher.poll(), watcher


def calibrate_call_cost(program: Any) -> None:
    """What tracing one CUDA launch costs its thread here (Program.call_cost_ns, stored as
    sessions.call_cost_ns), calibrated before any library is attached: the uprobe pair timed on
    libc calls (tens of ms), by the kind of first instruction the probed entries begin with
    (entry_cost.py), plus what the CUDA programs do above an empty one.  Left uncalibrated
    without uprobe_multi links (the calibration links one).  Measured once: the overhead
    budget's calibration, when it ran first, is the same."""
    if program.call_costs.by_kind or program.links is None:
        return
    try:
        entry_cost.calibrate_links(program, program.links)
    except Exception:  # OSError from the link, BCC's plain Exception resolving a symbol: optional
        pass


def _note_runtimes(sess: "TraceSession", new: list[str]) -> None:
    """Programs with a stripped CUDA runtime linked in: said once each, kept in sessions.notes."""
    if new:
        sess.runtime_notes += new
        sess.store.update_session(sess.session_id, notes="\n".join(sess.runtime_notes))


def _attach_line(lib: Any, ok: int, failed: int, program: Any, when: str = "") -> str:
    """One attach line; ``when`` says when it was attached relative to the calls into it."""
    what = f"{ok // 2} functions ({ok} probes)"
    if failed:
        what += f", {failed} failed"
    line = f"attached {what} to {holds.shown(str(lib.path))} ({lib.kind}{', linked in' if lib.linked_in else ''})"
    why = program.link_refusal(lib.path) if ok else None
    if why is not None:  # perf-event uprobes: slower to detach (loader.LinkedProbes)
        line += f"; as perf-event uprobes, not links ({why})"
    return line + when


def _found_when(watcher: Any, lib: Any, at_start: bool) -> str:
    """When a library the scan found was attached, relative to the calls of whoever maps it."""
    pid = watcher.mapped_by(lib)
    if pid is None:
        return ", before any process mapped it" if at_start else ""
    if at_start:
        return f", mapped by pid {pid} before the trace: its calls before now are not recorded"
    return (f", found mapped by pid {pid} (not held: seen by the once-a-second scan): "
            "its calls before now are not recorded")


def _attach_nvtx(program: Any, lib: Path) -> str:
    """Attach the NVTX probes to the injection library before the command can load it; the line saying so."""
    st = lib.stat()
    ok, failed = program.attach_library(lib, probes.NVTX, (st.st_dev, st.st_ino), nvtx_inject.PROBED)
    if failed:
        return f"NVTX: {failed} of {ok + failed} probes on {lib} failed to attach (`ingero query` the probes table)"
    return f"NVTX: the command's ranges become spans (NVTX_INJECTION64_PATH={lib})"


def check_can_trace() -> None:
    if os.geteuid() != 0:
        raise IngeroError("trace needs root (eBPF): run with sudo")


def settings_for(opts: TraceOptions) -> BpfSettings:
    from ingero.collect.loader import holds_supported

    explicit = bool(opts.pids or opts.comm or opts.cmd)
    return BpfSettings(
        ring_bytes=ring_bytes_from_mb(opts.ring_mb),
        trace_all_cuda=not explicit,
        target_comm=opts.comm,
        stack=opts.stack,
        launch_streams=opts.launch_streams,
        holds=opts.hold and holds_supported() is None,
    )


# What names the hold programs (bpf/attach.bpf.c) in a compile or verifier error
_HOLD_PROGRAMS = ("tracepoint__syscalls__", "tracepoint__task__", "attach.bpf.c", "attach.h")


def _load(settings: BpfSettings) -> tuple[Program, BpfSettings, str | None]:
    """The program; without holds, and a line saying so, where only the hold programs fail to load."""
    try:
        return load_program(settings), settings, None
    except IngeroError as exc:
        if not settings.holds or not any(name in exc.message for name in _HOLD_PROGRAMS):
            raise
        without = dataclasses.replace(settings, holds=False)
        return (load_program(without), without,
                f"holds off (a process that maps CUDA after the trace began may lose its first calls): {exc.message}")


def _attach_before_launch(program: Any, watcher: Any, launcher: targets.Launcher, cmd_env: dict | None) -> list[str]:
    """--cmd: what the command will exec and link, attached before it is released (prelaunch.py)."""
    return prelaunch.attach(program, watcher, launcher.argv, cmd_env,
                            lambda lib, ok, failed: _attach_line(lib, ok, failed, program))


def _started_before(pid: int) -> str | None:
    """--pid: the note on what the trace missed of a process that ran before it."""
    from ingero.collect.libs import process_runtimes

    mapped, _ = process_runtimes(pid)
    return targets.started_before(pid, [lib.path for lib in mapped])


def run_trace(
    opts: TraceOptions,
    on_tick: Callable[[TickStats], None] | None = None,
    on_start: Callable[[StartInfo], None] | None = None,
) -> TraceSummary:
    """Trace until --duration, SIGINT/SIGTERM or --cmd's exit; everything decoded is stored."""
    check_can_trace()
    began = time.monotonic()
    spec = targets.TargetSpec(pids=list(opts.pids), comm=opts.comm, cmd=opts.cmd)
    targets.check_pids(spec.pids)
    launcher = None
    if spec.cmd:
        user = invoking_user()
        launcher = targets.Launcher(spec.cmd, run_as=(user.pw_uid, user.pw_gid) if user else None,
                                    stdout_to_stderr=opts.cmd_stdout_to_stderr)
    # built (or found in the cache) before anything is loaded: no compiler is one line, nothing traced
    nvtx_lib = nvtx_inject.library() if launcher is not None and opts.nvtx else None
    settings = settings_for(opts)
    # (--cmd's own programs are examined by prelaunch.attach below, before it starts)
    libs, watcher = _find_libraries(list(opts.cuda_libs), [])
    # --cmd: CUPTI's hook, this trace's only (it leaves opts.hooks again below); its libcupti
    # beside the runtime the user named first, then beside those found
    cupti_hook, cupti_line = (cupti.for_command([*opts.cuda_libs, *(lib.path for lib in libs)])
                              if launcher is not None and opts.cupti else (None, None))
    if cupti_hook is not None:
        opts.hooks.append(cupti_hook)
    store = Store.open(opts.db_path)
    holds_off: str | None = None
    try:
        store.mark_crashed_sessions()
        program, settings, holds_off = _load(settings)
    except BaseException:
        store.close()
        _drop_hook(opts, cupti_hook)
        raise
    stop = _Stop()
    resolver = None
    holder = None
    sess = None
    fault: StorageFault | None = None
    completed = False
    try:
        lines: list[str] = []
        for hook in opts.hooks:
            hook.on_program(program)
        calibrate_call_cost(program)
        for lib in libs:
            ok, failed = program.attach_library(lib.path, lib.kind, lib.identity, lib.symbols, lib.addresses)
            lines.append(_attach_line(lib, ok, failed, program, _found_when(watcher, lib, at_start=True)))
        cmd_env = None
        if nvtx_lib is not None:
            cmd_env, why_not = nvtx_inject.command_env(nvtx_lib)
            lines.append(why_not or _attach_nvtx(program, nvtx_lib))
        if cupti_hook is not None:  # CUDA_INJECTION64_PATH, INGERO_CUPTI_DIR (collect/cupti_inject.py)
            cmd_env, line = cupti_hook.command_env(cmd_env)
            lines.append(line)
        elif cupti_line is not None:
            lines.append(cupti_line)
        if launcher is not None:
            lines += _attach_before_launch(program, watcher, launcher, cmd_env)
        runtime_notes = watcher.take_notes()
        if opts.hold and not settings.holds and holds_off is None:
            from ingero.collect.loader import holds_supported

            holds_off = (f"holds off (a process that maps CUDA after the trace began may lose its first calls): "
                         f"{holds_supported()}")
        if holds_off:
            runtime_notes.append(holds_off)
        lines += runtime_notes
        lines.append(f"attached {len(program.tracepoints)} kernel tracepoints "
                     f"({', '.join(t for t, _ in program.tracepoints)})")
        initial: list[int] = list(spec.pids)
        if spec.comm:
            initial += targets.pids_with_comm(spec.comm)
        if not spec.explicit:
            try:
                from ingero.collect.libs import pids_mapping_cuda

                initial += [p for p in pids_mapping_cuda() if p != os.getpid()]
            except ImportError:
                pass
        program.add_targets(initial)
        before = [line for pid in spec.pids if (line := _started_before(pid))]
        before += targets.exited_while_attaching(spec, launcher is not None, time.monotonic() - began)
        lines += before
        runtime_notes += before
        if settings.holds:  # from here a process that maps CUDA waits for its probes
            from ingero.collect.libs import Examiner

            holder = holds.Holder(program, Examiner(), lambda lib, ok, failed: _attach_line(lib, ok, failed, program),
                                  default_mode=not spec.explicit)
            lines += holder.start()
        launched = None
        if launcher is not None:
            with store.user_umask():  # the job creates its files as its user would, not 0600
                launched = launcher.spawn(cmd_env)
            program.add_targets([launched])
        if not libs and not spec.explicit:
            lines.append("no CUDA runtime found: tracing host events only (block I/O, per-process CPU); "
                         "pass --pid, --cmd or --comm to trace a process")
        described = targets.describe(spec, launched)
        lines.append(f"tracing {described}")
        stop.install()  # from here a signal ends the session cleanly (checked at the loop's first turn)
        session_id = store.begin_session(command=opts.command_line, targets=described)  # StorageFault: no row
        sess = TraceSession(opts, store, program, session_id)
        store.update_session(session_id, switch_holder=True)  # what its switch rows' other_pid means (sched.bpf.c)
        sess.store_call_cost()
        sess.holder = holder
        _note_runtimes(sess, runtime_notes)
        if opts.stack:
            from ingero.collect.stacks import StackResolver

            sess.stacks = resolver = StackResolver(program.bpf, store, session_id=session_id)
            resolver.prepare(initial + ([launched] if launched else []))
        sess.write_probe_rows()
        sess.upsert_names(initial)
        for hook in opts.hooks:  # the query daemon, the samplers, metrics ... (wired by the trace command)
            lines += hook.on_start(sess) or []
        if on_start is not None:
            on_start(StartInfo(session_id, str(store.path), lines))
        if launcher is not None:
            launcher.release()
        try:
            summary = _loop(sess, opts, stop, launcher, watcher, spec, on_tick)
        except StorageFault as exc:
            if launcher is None:
                raise
            fault = exc  # the job is the user's: it runs on, untraced (below, after detaching)
        completed = True
    finally:
        stop.restore()
        if launcher is not None and (stop.reason is not None or not completed):
            launcher.stop()  # signalled or failed: do not leave the command behind
        if resolver is not None:
            resolver.close()
        if holder is not None:
            holder.stop()  # nothing held once the probes go
        if sess is not None:
            for hook in opts.hooks:  # idempotent: a normal end told them already, before the drain
                hook.on_stopping(sess)
        program.close()
        store.close()
        _drop_hook(opts, cupti_hook)
    if fault is not None:
        raise _job_ran_untraced(fault, launcher)
    return summary


def _drop_hook(opts: TraceOptions, hook: Any) -> None:
    """A hook this trace added to opts.hooks (CUPTI's): out again, its resources released."""
    if hook is not None:
        if hook in opts.hooks:
            opts.hooks.remove(hook)
        hook.close()


def _nvtx_note(n: nvtx.NvtxSpans) -> str:
    line = f"nvtx: {n.spans:,} ranges stored as spans (category 'nvtx')"
    if n.ended_at_exit or n.ended_at_stop:
        line += (f"; {n.ended_at_exit + n.ended_at_stop:,} never closed, "
                 "ended at their process's exit or the trace's end")
    if n.unmatched:
        line += f"; {n.unmatched:,} pops / ends without their push / start (dropped)"
    return line


def _job_ran_untraced(fault: StorageFault, launcher: targets.Launcher) -> StorageFault:
    """Wait for the --cmd job the tracer can no longer trace; the fault's one line, with the
    job's exit status as ingero's (a shell signal exit, 128 + signal, for a killed job)."""
    while launcher.poll() is None:
        time.sleep(0.2)
    code = launcher.returncode if launcher.returncode >= 0 else 128 - launcher.returncode
    out = StorageFault(f"{fault.message}; the command ran to its end untraced and exited with code {code}",
                       fault.hint)
    out.exit_code = code
    return out


def _loop(
    sess: TraceSession,
    opts: TraceOptions,
    stop: _Stop,
    launcher: targets.Launcher | None,
    watcher: Any,
    spec: targets.TargetSpec,
    on_tick: Callable[[TickStats], None] | None,
) -> TraceSummary:
    start = time.monotonic()
    deadline = start + opts.duration_s if opts.duration_s else None
    next_second = start + 1.0
    last_events = 0
    last_tick = start
    ended_by = None
    nest_skipped = 0
    drops_kernel = 0
    idle_sleep = POLL_INTERVAL_S / 2  # doubled before use: the first idle wait is POLL_INTERVAL_S
    while True:
        n = sess.poll()
        now = time.monotonic()
        sess.flush_if_due(now)
        if now >= next_second:
            next_second = now + 1.0
            _every_second(sess, watcher, spec)
            counters = sess.counters()
            drops_kernel = int(counters[Counter.RB_DROPS])
            nest_skipped = int(counters[Counter.NEST_SKIPPED])
            sess.pct.roll()
            if on_tick is not None:
                on_tick(
                    TickStats(
                        elapsed_s=now - start,
                        events=sess.events + sess.pending_rows,
                        events_per_s=(sess.events + sess.pending_rows - last_events) / max(now - last_tick, 1e-9),
                        drops_kernel=drops_kernel,
                        drops_user=sess.drops_user,
                        nest_skipped=nest_skipped,
                        ops=sess.pct.stats(),
                        notes=sess.notes,
                        stale_calls=int(counters[Counter.STALE_CALLS]),
                    )
                )
                sess.notes = []
            last_events = sess.events + sess.pending_rows
            last_tick = now
        if stop.reason:
            ended_by = stop.reason
            break
        if deadline is not None and now >= deadline:
            ended_by = "duration"
            break
        if launcher is not None and launcher.poll() is not None:
            ended_by = "command exited"
            break
        if n == 0:
            idle_sleep = min(idle_sleep * 2, IDLE_POLL_MAX_S)
            time.sleep(idle_sleep)
        else:
            idle_sleep = POLL_INTERVAL_S / 2
            if n < READ_BATCH:
                time.sleep(POLL_INTERVAL_S)
    # Stop serving first: queries in flight are interrupted ("tracer stopping") and their
    # read transactions end, so the final CHECKPOINT below has none to wait for.
    for hook in opts.hooks:
        hook.on_stopping(sess)
    sess.drain()
    counters = sess.counters()
    drops_kernel = int(counters[Counter.RB_DROPS])
    nest_skipped = int(counters[Counter.NEST_SKIPPED])
    stale_calls = int(counters[Counter.STALE_CALLS])
    probe_misses = sess.probe_misses
    try:
        # NVTX ranges of processes still running end here, when the trace stopped (those of
        # processes that exited ended at their exit, in the flushes)
        open_spans = sess.nvtx.finish(time.monotonic_ns())
        if open_spans is not None:
            with sess.store.transaction():
                sess.store.append("spans", open_spans)
        if sess.holder is not None:
            _take_hold_lines(sess)
        sess.harvest_process_cpu()
        sess.write_probe_rows()
        for hook in sess.opts.hooks:
            hook.on_end(sess)
        sess.store.end_session(sess.session_id, events=sess.events, drops_kernel=drops_kernel,
                               drops_user=sess.drops_user, stale_calls=stale_calls, probe_misses=probe_misses)
    except duckdb.Error as exc:
        # e.g. the closing CHECKPOINT on a disk that filled up: every event is already committed
        raise write_error(exc, sess.store.path) from None
    notes = list(sess.notes)
    if sess.holder is not None and (held := sess.holder.summary()):
        notes.append(held)
    unseen = int(counters[Counter.UNSEEN_SWITCH_IN])
    if unseen:
        notes.append(f"scheduler: {unseen:,} off-CPU interval(s) whose switch back onto a CPU no probe saw; "
                     "each ends where its thread was woken, or is zero-length where that went unseen too "
                     "(bpf/sched.bpf.c close_unseen)")
    if sess.nvtx.spans or sess.nvtx.unmatched:
        notes.append(_nvtx_note(sess.nvtx))
    if sess.stack_failures:
        notes.append(f"stacks: {sess.stack_failures} flush(es) stored without stacks (resolving failed; see above)")
    if launcher is not None and launcher.returncode is None and ended_by == "duration":
        notes.append(f"the command (pid {launcher.pid}) is still running; it is no longer traced")
    return TraceSummary(
        session_id=sess.session_id,
        db_path=str(sess.store.path),
        elapsed_s=time.monotonic() - start,
        events=sess.events,
        drops_kernel=drops_kernel,
        drops_user=sess.drops_user,
        nest_skipped=nest_skipped,
        ops=sess.pct.stats(),
        ended_by=ended_by or "duration",
        command_exit=launcher.returncode if launcher is not None else None,
        notes=notes,
        stale_calls=stale_calls,
        probe_misses=probe_misses,
    )


def _take_hold_lines(sess: TraceSession) -> None:
    """The holder's lines into the live view's notes; a hold that reached its bound into sessions.notes too."""
    lines, lasting = sess.holder.take_lines()
    sess.notes += lines
    _note_runtimes(sess, lasting)


def _every_second(sess: TraceSession, watcher: Any, spec: targets.TargetSpec) -> None:
    # One transaction for the second's rows (process_cpu, the samplers, probes, names): one
    # commit instead of four; measured on an idle trace, the commits were a third of its CPU.
    try:
        with sess.store.transaction():
            traced = _write_second(sess, watcher, spec)
    except duckdb.Error as exc:
        raise write_error(exc, sess.store.path) from None
    # targets whose process is gone (exit handler missed them, e.g. thread keys)
    for pid in traced:
        if not targets.alive(pid):
            sess.program.remove_targets([pid])
    for hook in sess.opts.hooks:
        hook.every_second(sess)


def _write_second(sess: TraceSession, watcher: Any, spec: targets.TargetSpec) -> set[int]:
    sess.harvest_process_cpu()
    traced = sess.traced = sess.program.targets()
    for hook in sess.opts.hooks:
        hook.write_second(sess)
    found = watcher.poll() if watcher is not None else []
    if sess.holder is not None:
        sess.holder.refresh_shells()
        if found:  # a process's mapping the scan saw may have a hold record still in the ring
            sess.holder.settle()
        _take_hold_lines(sess)
    if watcher is not None:
        for lib in found:
            ok, failed = sess.program.attach_library(lib.path, lib.kind, lib.identity, lib.symbols, lib.addresses)
            if ok or failed:
                sess.notes.append(_attach_line(lib, ok, failed, sess.program,
                                               _found_when(watcher, lib, at_start=False)))
        new = watcher.take_notes()
        sess.notes += new
        _note_runtimes(sess, new)
        sess.write_probe_rows()
    sess.store_call_cost()  # a library linked since (here or by the holder) may begin its launches otherwise
    if spec.comm:
        found = targets.pids_with_comm(spec.comm)
        sess.program.add_targets(found)
        sess.upsert_names(found)
    return traced
