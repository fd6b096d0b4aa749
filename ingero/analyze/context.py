"""Which data explain looks at: session, time range, processes, window size.

``resolve`` turns user options into a ``Context`` every rule receives: the
connection plus the parameters its SQL needs (always passed as parameters,
never formatted into the text).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import duckdb

from ingero.errors import IngeroError
from ingero.events.units import NS
from ingero.store.selection import Selection
from ingero.store.sessions import latest_session

# Adaptive window: about this many windows over the span, so baselines and
# correlations have enough points, within bounds that keep one window long
# enough to hold several training steps (1 s) and short enough to keep a
# burst visible in a long trace (60 s).
TARGET_WINDOWS = 30
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 60.0


@dataclass(frozen=True)
class Options:
    session: int | None = None
    since_s: float | None = None
    from_ns: int | None = None
    to_ns: int | None = None
    pids: tuple[int, ...] = ()
    window_s: float | None = None
    stack: bool = False


@dataclass
class Derived:
    """What one explain computes once and several readers share, each field filled by its owner
    (named beside it) the first time it is asked for.  Typed loosely where the value's class
    lives above this module: context imports nothing of analyze."""

    win_rows: dict[int, list[dict[str, Any]]] | None = None  # baseline.windows_by_pid
    device_activity: dict[int, Any] | None = None  # activity.device_activity: device.DeviceActivity per pid
    device_segments: Any = None  # device.infer: (its segments, the intervals analysed), for analyze/device/measured.py
    rhythm_steps: dict[int, Any] = field(default_factory=dict)  # activity.rhythm_steps: steps.Steps | None
    # activity: device activity and steps read the raw calls from here on (a long range)
    calls_from_ns: int | None = None
    nccl_jobs: list[Any] | None = None  # collectives.jobs: collectives.Job
    host_idle_split: dict[int, dict[int, Any]] = field(default_factory=dict)  # host_bound.idle_split
    # straggler: (its chain, rule id, pid) of the late rank's own chain it explains; explain
    # lists the straggler chain first
    explains: list[tuple[Any, str, int]] = field(default_factory=list)
    kinds: dict[int, Any] = field(default_factory=dict)  # kind.classify: pid -> kind.Kind (servers only)


@dataclass
class Context:
    con: duckdb.DuckDBPyConnection
    session_id: int
    start_ns: int
    end_ns: int
    window_ns: int
    pids: tuple[int, ...] = ()
    ncpu: int = 1
    drops_kernel: int = 0
    drops_user: int = 0
    stale_calls: int = 0  # CUDA calls that never returned (no row): sessions.stale_calls
    probe_misses: int = 0  # BPF program runs the kernel skipped (rows may be missing): sessions.probe_misses
    # the traced host grouped CPU time per session (renice does not reach across sessions);
    # None: not recorded (a database older than schema 4)
    sched_autogroup: bool | None = None
    # the session was imported from a profiler trace (sessions.imported_from): it has no
    # scheduler, fault or block-I/O rows, so rules that need them cannot judge it
    imported_from: str | None = None
    # device-busy share per CUDA process over the analysed span (measured or inferred),
    # filled by explain before the rules run; a process missing here is unknown
    device_busy: dict[int, float] = field(default_factory=dict)
    # the steps a profiler trace marked (ProfilerStep#N), filled by explain; None: unmarked
    marked_steps: Any = None  # timeline.Steps | None (typed loosely: context stays import-free)
    # the range is the whole session (no --since / --from / --to): spans that end after the
    # last event (a step, a kernel) are whole
    whole_session: bool = True
    derived: Derived = field(default_factory=Derived)
    # What the data can cover inside [start_ns, end_ns) (whole seconds): from the first row
    # (or the requested start, when later) to the last; a window's wall clock is its part of it.
    covered_start_ns: int | None = None
    covered_end_ns: int | None = None
    # start_ns and end_ns are whole seconds (windows are sets of per-second summaries); False
    # for an explicit --from / --to off whole seconds, an exact range only raw rows can give
    aligned: bool = True
    # the tracer stored the session's per-second summaries (summaries.has_summaries, asked once
    # by resolve; None: not asked)
    summarised: bool | None = None
    # with it: the first second whose summaries the tracer had not written at its last flush
    # (sessions.summaries_pending_ns; read from the events), None when none
    summaries_pending_ns: int | None = None
    # what tracing one CUDA call cost its thread (sessions.call_cost_ns, calibrated at the
    # trace's start; None: not calibrated, or before schema 14)
    call_cost_ns: float | None = None

    def __post_init__(self) -> None:
        if self.covered_start_ns is None:
            self.covered_start_ns = self.start_ns
        if self.covered_end_ns is None:
            self.covered_end_ns = self.end_ns

    @property
    def n_windows(self) -> int:
        return max(1, -(-(self.end_ns - self.start_ns) // self.window_ns))

    @property
    def window_s(self) -> float:
        return self.window_ns / NS

    @property
    def selection(self) -> Selection:
        """The rows explain looks at (the windows cover them)."""
        return Selection(self.session_id, self.start_ns, self.end_ns, self.pids)

    def params(self, **more: Any) -> dict[str, Any]:
        """The parameters every window query takes (the selection's and $wns), plus ``more``."""
        return {**self.selection.params(), "wns": self.window_ns, **more}

    def window_bounds(self, w: int) -> tuple[int, int]:
        """Window ``w`` as far as the data covers it (the first and last of an aligned range
        start at the first row and end after the last, as before windows were whole seconds)."""
        start = self.start_ns + w * self.window_ns
        return max(start, self.covered_start_ns), min(start + self.window_ns, self.end_ns, self.covered_end_ns)


def adaptive_window_ns(span_ns: int) -> int:
    seconds = min(MAX_WINDOW_S, max(MIN_WINDOW_S, span_ns / NS / TARGET_WINDOWS))
    # whole seconds: a window is a set of whole per-second summaries (analyze/summaries/__init__.py)
    return whole_seconds_ns(seconds)


def whole_seconds_ns(seconds: float) -> int:
    """``seconds`` rounded to a whole number of seconds, at least one, in ns."""
    return max(1, round(seconds)) * NS


def resolve(con: duckdb.DuckDBPyConnection, opts: Options, *, align: bool = False) -> Context:
    """Pick the session and time range; raise IngeroError when there is nothing to explain.

    ``align``: grow the range to whole seconds (explain: its windows are then sets of
    per-second summaries); else it is exactly what was asked (exports, device.analyse)."""
    if opts.session is None:
        row = con.execute("SELECT max(session_id) FROM sessions").fetchone()
        if row is None or row[0] is None:
            raise IngeroError(
                "the database has no sessions", "record one with `sudo ingero trace` or `ingero demo`"
            )
        sid = int(row[0])
    else:
        sid = opts.session
    srow = latest_session(con, "session_id = $sid", {"sid": sid})
    if srow is None:
        raise IngeroError(f"no session {sid} in the database", "list sessions with `ingero status`")
    started, ended, heartbeat, ncpu = srow["started_ns"], srow["ended_ns"], srow["heartbeat_ns"], srow["ncpu"]
    from ingero.analyze import summaries  # (it imports nothing of analyze back)

    # the range's first and last rows (the seconds the tracer had not written summaries of yet:
    # from the events)
    summarised = summaries.has_summaries(con, sid)
    pending = srow.get("summaries_pending_ns")  # (no such column before schema 13)
    data = summaries.session_span(con, sid, summarised=summarised, pending=pending)
    first = data[0] if data and data[0] is not None else started
    last = data[1] if data and data[1] is not None else (ended or heartbeat or time.time_ns())
    end = int(opts.to_ns) if opts.to_ns is not None else int(last) + 1
    # Windows are whole seconds aligned to epoch seconds, so each is a set of whole
    # per-second summaries: the range grows to the seconds around it (the wall clock
    # of its first and last window is what the data can cover of them).
    # An explicit --from / --to between whole seconds is taken as given: only the raw rows
    # can answer it (windows.build reads them then).
    aligned = align and not ((opts.to_ns is not None and opts.to_ns % NS)
                             or (opts.from_ns is not None and opts.from_ns % NS))
    covered_end = end
    if aligned:
        end = -(-end // NS) * NS
    if opts.from_ns is not None:
        start = int(opts.from_ns)
    elif opts.since_s is not None:
        start = end - int(opts.since_s * NS)
    else:
        start = int(first)
    start = max(start, int(min(first, started)))
    covered_start = start
    if end <= start:
        raise IngeroError(
            "the time range holds no data of session %d" % sid,
            "widen --since / --from / --to, or pick another --session",
        )
    if ncpu is None:
        nrow = con.execute(
            "SELECT max(ncpu) FROM system_metrics WHERE session_id = $sid", {"sid": sid}
        ).fetchone()
        ncpu = nrow[0] if nrow and nrow[0] else 1
    if aligned:
        start = start // NS * NS
    window_ns = whole_seconds_ns(opts.window_s) if opts.window_s else adaptive_window_ns(end - start)
    return Context(
        con=con,
        session_id=sid,
        start_ns=start,
        end_ns=end,
        window_ns=max(window_ns, 1),
        pids=tuple(opts.pids),
        ncpu=int(ncpu),
        drops_kernel=int(srow["drops_kernel"] or 0),
        drops_user=int(srow["drops_user"] or 0),
        # stale_calls (schema 2), sched_autogroup (4), probe_misses (6) are missing in an older file read-only
        stale_calls=int(srow.get("stale_calls") or 0),
        probe_misses=int(srow.get("probe_misses") or 0),
        sched_autogroup=None if srow.get("sched_autogroup") is None else bool(srow["sched_autogroup"]),
        imported_from=srow.get("imported_from"),  # schema 7
        whole_session=opts.since_s is None and opts.from_ns is None and opts.to_ns is None,
        covered_start_ns=covered_start,
        covered_end_ns=covered_end,
        aligned=aligned,
        summarised=summarised,
        summaries_pending_ns=None if pending is None else int(pending),
        call_cost_ns=None if srow.get("call_cost_ns") is None else float(srow["call_cost_ns"]),
    )


def parse_time(text: str) -> int:
    """'2026-11-22T21:05:00' (local time unless it has an offset/Z), or epoch seconds -> ns."""
    from datetime import datetime

    s = text.strip()
    try:
        return int(float(s) * NS)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time (try 2026-01-31T14:05:00 or epoch seconds)") from None
    return int(dt.timestamp() * NS)
