"""Device activity inferred from the CUDA call stream: when the GPU surely was busy, when it could be.

The package is what the device did: inferred here from the host's calls, measured in
``measured.py`` (CUPTI under ``trace --cmd``, laid over this inference) and in ``imported.py``
(an imported profiler trace's timeline and its ProfilerStep marks); ``analyze/activity.py``
picks one per explain.

No GPU timeline is needed here: the host's calls bound the device's work.

* A **drain** (cudaDeviceSync / cuCtxSynchronize, a synchronous copy, and a
  stream sync when the process uses one stream) returns only once the device
  has finished everything the process queued.  From its return until the next
  **submission** (kernel launch, graph launch, async copy, the start of a
  synchronous copy) nothing of the process was queued: the device surely idled.
  cudaEventSync is never a drain: it waits for one point of one stream, and
  work queued after the event record may still run.
* The time between a segment's first submission and the drain that closes it
  is when the device *could* have been busy: the upper bound.
* A sync that waited (took longer than its no-wait cost) kept the host until
  the device was done: the device surely was busy for the wait.  A run of long
  launches is back-pressure from a full launch queue (real V100 traces: 60 µs
  launches against a 5 µs median on a device 97% busy): the device surely was
  busy while the host sat in them.  These make the lower bound.  Spinning,
  yielding and sleeping syncs all show as call duration, so the wait policy
  does not matter.
* The point estimate models the device as one queue running kernels of equal
  length k.  When the closing drain waited, the last kernel ended at r (the
  drain's return, or where the device most likely finished when the host got
  its CPU back just before returning), and kernel i started no earlier than
  its launch returned (e_i), so the n - i + 1 kernels from i on fit in
  r - e_i: k = min over i of (r - e_i) / (n - i + 1), busy = n * k.  Where the host did not
  wait, the per-submission device time learned from the process' waited
  segments (busy / n) scales the segment's submissions, at most what fits
  before the drain started (a drain that did not wait found the work done:
  k <= min over i of (t_drain - t_i) / (n - i + 1)) and before it returned
  (the formula above); with nothing learned, those caps, at most the middle of
  the bounds (behind host work a cap is only the launch interval: the device
  could have kept pace); with neither, the middle of the bounds.  A segment with back-pressure ran full: busy is its
  upper bound.

Segments are cut at window boundaries (a window's first segment starts at the
window or the process' first call, since work queued before it is unknown:
the upper bound stays an upper bound).  Over more than ``MAX_EXACT_CALLS``
calls, each window is analysed on its first ``slice`` (the same share of
every window, so the sorted pass stays bounded; shares are of the slices).

On a trace under `--overhead-budget` (the ``sampling`` table), only the
attached slices of each window are analysed: in the detached parts a step's
launches are missing and its segment would count the copy alone.  Steps are
still cut from every drain (syncs and copies are never sampled): the
``ing_dev_steps`` table, read by analyze/traced_steps.py.

The calls are selected by SQL over the events table; their sequence
(ing_dev_seq: sorted per process and window, numbered by segment) is built in
numpy from the analysed calls (at most ``max_exact_calls`` and their CPU
waits), and so are the segments and windows (reductions over its runs).
``infer(ctx)`` needs ``windows.build(ctx)`` first (it reads ing_cuda for the
call count).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ingero.analyze import launch_sampling, windows
from ingero.analyze.context import Context, Options, resolve
from ingero.events.ops import (ASYNC_COPY_OPS, DEVICE_SYNC_OPS, EVENT_SYNC_OPS, LAUNCH_OPS, STREAM_SYNC_OPS,
                               SYNC_COPY_OPS)
from ingero.store.db import named_params
from ingero.store.derive import events_relation
from ingero.store.selection import Selection

# The device calls analysed, by role (events/ops.py: the categories say what each waits for).
DEVICE_OPS = [*LAUNCH_OPS, *ASYNC_COPY_OPS, *SYNC_COPY_OPS, *DEVICE_SYNC_OPS, *STREAM_SYNC_OPS, *EVENT_SYNC_OPS]


@dataclass(frozen=True)
class Thresholds:
    # The cost of a sync with nothing to wait for: the shortest call of that op
    # in the range, but at most this (when every sync waited, the shortest one
    # waited too).  Real syncs on an idle stream take 2-10 µs (the shared A100
    # traces: cudaEventSynchronize 2-9 µs, cudaStreamSynchronize 9-11 µs), a
    # traced one a few µs more.
    nowait_cap_ns: int = 50_000
    # A drain waited when it took this much longer than its no-wait cost, CPU
    # waits inside it taken out (a traced sync's own jitter is 1-3 µs here; a
    # spinning sync behind 20 µs kernels waits 12-15 µs).
    wait_min_ns: int = 5_000
    # A launch is long at this many times the process' quickest launch and at
    # least long_launch_min_ns: real V100 back-pressure 60-2000 µs against a
    # 5 µs median; the A100 traces' isolated slow launches (lazy module load,
    # a preemption) are single, so a long launch counts only when the launches
    # before and after it are long too (a run of three: the queue was full).
    long_launch_factor: float = 4.0
    long_launch_min_ns: int = 20_000
    # A sync that returned within this of getting its CPU back found the device
    # done just then: the device ended during that last off-CPU interval.
    tail_ns: int = 20_000
    # Above this many CUDA calls in the range, windows are analysed on a slice:
    # the pass sorts the calls (1 M cost 0.3 s CPU here, 7 M 1.5-1.9 s), and
    # explain must stay near 1 s over 10 M events (bench/bench_explain.py:
    # infer took 0.31-0.33 s CPU there with 100 k, 0.46-0.47 s with 250 k, for
    # the same shares within 0.1 point).
    max_exact_calls: int = 100_000


T = Thresholds()


@dataclass(frozen=True)
class WindowBusy:
    """One window of one process: the device's busy time inferred, in ns of ``span_ns``."""

    w: int
    start_ns: int
    span_ns: int  # analysed time in the window: the process' call span, within the slice
    low_ns: int
    point_ns: int
    high_ns: int
    # of the idle inside segments (high - point), what fell after their last submission, while
    # the host did something else before draining (host-bound's, not launch pacing's)
    tail_ns: int = 0

    @property
    def share(self) -> tuple[float, float, float]:
        """(low, point, high) as shares of the span."""
        s = self.span_ns or 1
        return self.low_ns / s, self.point_ns / s, self.high_ns / s


@dataclass(frozen=True)
class DeviceActivity:
    """A CUDA process' device activity over the analysed range (shares 0..1)."""

    pid: int
    busy_share: float  # point estimate
    low: float  # surely busy
    high: float  # could have been busy
    start_ns: int  # the analysed span: the given one, or the process' first device call ...
    end_ns: int  # ... to the last one's return
    span_ns: int  # time analysed in it (less than end - start when the calls were sampled)
    windows: tuple[WindowBusy, ...]
    submissions: int  # launches and copies analysed
    drains: int  # calls after which nothing was queued
    waited_drains: int  # of them, the ones that waited for the device
    backpressure_launches: int  # launches in runs of long launches (full launch queue)
    sampled: float = 1.0  # share of each window analysed (1.0: every call)
    source: str = "inferred"

    def to_dict(self) -> dict:
        """The `device` object of explain --json."""
        return {"busy_share": round(self.busy_share, 4), "low": round(self.low, 4),
                "high": round(self.high, 4), "source": self.source}


# The device calls analysed, one row each; op_i: the op's place in DEVICE_OPS (from 1).
CALLS_SQL = f"""
SELECT pid, tid, list_position($device_ops, op)::UTINYINT AS op_i, timestamp AS t,
       timestamp + duration_ns AS e, duration_ns AS d, stream, coalesce(kind = 'H2D', false) AS h2d, {{w}} AS w
FROM events {{iv_join}}
WHERE {Selection.where()} AND list_contains($device_ops, op)
  AND coalesce(ret, 0) = 0 AND (timestamp - $t0) % $wns < $slice_ns {{iv_where}}
"""

# Time a thread inside a sync spent waiting for a CPU (preempted, yielded, or runnable after
# its wake-up): the device may have finished at any moment of it.
CPU_SQL = f"""
SELECT pid, tid, {{w}} AS w, timestamp AS pos, timestamp AS t,
       timestamp + duration_ns AS e, duration_ns AS d,
       CASE WHEN kind = 'preempted' THEN duration_ns ELSE least(duration_ns, coalesce(runq_ns, 0)) END AS cpu,
       -- when the device most likely finished, if the sync returned right after this row:
       -- a sleep ends when the device is done (then waits in the run queue); a spinning
       -- thread preempted may have missed the end anywhere in the interval
       CASE WHEN kind = 'preempted' THEN timestamp + duration_ns // 2
            ELSE timestamp + duration_ns - least(duration_ns, coalesce(runq_ns, 0)) END AS guess
FROM {{events}} {{iv_join}}
WHERE {Selection.where(pids=False)} AND op = 'sched_switch'
  AND ($all_pids OR list_contains($pids, pid)) AND list_contains($wait_ops, in_call)
  AND (timestamp - $t0) % $wns < $slice_ns {{iv_where}}
"""

# ing_dev_seq: one row per boundary, in the order of each process and window's calls (pid,
# w, pos, dr):
#   submit  a launch or async copy, at its start (pos = t), dr 0
#   copy    a synchronous copy: at its start (dr 0) and at its return (pos = e, dr 1)
#   drain   a device sync, or a stream sync of a process using one stream, at its return, dr 1
#   wait    any other sync (an event sync; a stream sync among several streams), at its return, dr 0
#   cpu     a CPU wait inside a sync (CPU_SQL), at its start
# wait: a sync's time beyond its op's no-wait cost; seg: the drains before the row in its
# process and window (the segment it belongs to); csub: the submissions so far, numbering
# them within the segment; bp: a long launch between two long launches (back-pressure).
# Built in numpy from the two queries above: as SQL (joins back to per-process and per-op
# minima, a UNION and window functions over the rows) it cost ~0.2 CPU-s for 100,000 calls,
# most of `explain --since 120s` on a day's store; the sort and running sums here ~0.02.
SEQ_COLUMNS = ("pid", "tid", "w", "op", "pos", "t", "e", "d", "wait", "cpu", "guess", "role", "dr", "seg",
               "csub", "bp")
ROLES = ("submit", "copy", "drain", "wait", "cpu")
_SUBMIT, _COPY, _DRAIN, _WAIT, _CPU = range(len(ROLES))
# By op_i (CALLS_SQL): the op's name, and its role (a stream sync's is _DRAIN or _WAIT: it
# depends on the process' streams); a CPU wait's op is sched_switch (CPU_SQL).
_OP_NAMES = np.array(["", *DEVICE_OPS, "sched_switch"], dtype=object)
_SCHED_SWITCH = len(_OP_NAMES) - 1
_OP_ROLE = np.array([_WAIT] + [_SUBMIT if op in LAUNCH_OPS + ASYNC_COPY_OPS else _COPY if op in SYNC_COPY_OPS
                               else _DRAIN if op in DEVICE_SYNC_OPS else _WAIT for op in DEVICE_OPS])
_OP_STREAM_SYNC = np.array([False] + [op in STREAM_SYNC_OPS for op in DEVICE_OPS])
_OP_LAUNCH = np.array([False] + [op in LAUNCH_OPS for op in DEVICE_OPS])
# ing_dev_seq, ing_dev_steps (the segments closed by a drain) and ing_dev_iv are Arrow tables
# registered on the connection (views), not copies: their readers after infer (analyze/traced_steps.py,
# rules/host_bound.py) read a few thousand rows, and copying 100,000 sequence rows into a temp
# table cost ~0.045 CPU-s (DuckDB appends ~20 ns a value here), a sixth of `explain --since
# 120s` on a day's store.  The segments and windows are numpy over the sorted sequence.
SEQ_VIEW, STEPS_VIEW, IV_VIEW = "ing_dev_seq", "ing_dev_steps", "ing_dev_iv"


@dataclass
class _Sequence:
    """ing_dev_seq's rows as numpy (sorted: each process and window's rows in time order), for
    the segments; ``table``: the same rows as the Arrow table registered as ing_dev_seq."""

    pid: np.ndarray
    w: np.ndarray
    seg: np.ndarray
    dr: np.ndarray
    role: np.ndarray  # index in ROLES
    pos: np.ndarray
    has_pos: np.ndarray
    t: np.ndarray
    e: np.ndarray
    has_e: np.ndarray
    d: np.ndarray  # (NULL only where bp is not true: bp reads d)
    wait: np.ndarray
    cpu: np.ndarray  # (0 where NULL: only summed)
    guess: np.ndarray
    has_guess: np.ndarray
    csub: np.ndarray
    bp: np.ndarray  # true (NULL counted as false, as FILTER (bp) does)
    h2d: np.ndarray  # a host-to-device copy's row (async or synchronous): a step's input, a mark of its rhythm
    table: pa.Table | None = None


@dataclass
class _Segments:
    """One row per segment of the analysed calls (see _segment_table), in (pid, w, seg) order; NULL
    doubles are NaN, NULL integers have a has_ mask."""

    pid: np.ndarray
    w: np.ndarray
    seg: np.ndarray
    n: np.ndarray
    copies: np.ndarray  # of n, host-to-device copies
    s1: np.ndarray
    en: np.ndarray  # the last submission's return (valid where has_en)
    has_en: np.ndarray
    drain_t: np.ndarray  # the closing drain's start (valid where has_r_call)
    has_s1: np.ndarray
    r_call: np.ndarray
    has_r_call: np.ndarray
    raw_wait: np.ndarray
    r: np.ndarray
    has_r: np.ndarray
    k: np.ndarray
    k_done: np.ndarray
    bp_n: np.ndarray
    low: np.ndarray
    high: np.ndarray
    point: np.ndarray
    pstart: np.ndarray  # the process' span (the same on each of its segments) ...
    pend: np.ndarray
    subs: np.ndarray  # ... its submissions, and its back-pressure launches
    pid_bp_n: np.ndarray
    # [span_a, span_z): when the device could have run the segment's work (high's interval;
    # valid where has_span): a measured timeline's idle is split by it (analyze/device/measured.py)
    span_a: np.ndarray | None = None
    span_z: np.ndarray | None = None
    has_span: np.ndarray | None = None

    def steps(self) -> pa.Table:
        """ing_dev_steps (analyze/traced_steps.py): the segments closed by a drain."""
        m = self.has_r_call
        return pa.table({"pid": pa.array(self.pid[m], pa.int32()), "w": self.w[m], "seg": self.seg[m],
                         "n": self.n[m], "copies": self.copies[m], "r_call": self.r_call[m],
                         "s1": pa.array(self.s1[m], mask=~self.has_s1[m])})


# The segments: one row per (pid, w, seg), the columns their readers use (_window_rows, analyze/traced_steps.py
# through ing_dev_steps):
#   n        submissions in it (launches, async copies, synchronous copies' starts)
#   copies   of them, host-to-device copies (analyze/traced_steps.py: the input copy marks where a step starts)
#   s1       the first one's start
#   r_call   the return of the drain that closed it (NULL: no drain closed it in the window)
#   raw_wait that drain's wait (0 without one)
#   r        the likely end of the device's work (below)
#   k, k_done the per-kernel time that fits before r, before the drain's start (below)
#   bp_n     back-pressure launches in it
#   low, high, point: the device's busy time in it, surely / at most / most likely
#                    (point NULL: the host did not wait, _window_rows fills it in)
# The segments are contiguous runs of the sorted sequence (seg counts the drains before a row
# in its process and window; a drain's return row is the last of its segment), so each column
# is one reduction over the runs.  As SQL (a GROUP BY, a join back for k, a temp table) it cost
# ~0.05 CPU-s over 100,000 rows; ~0.005 here.  Integer columns stay exact; k and point are the
# same double operations the SQL did (integer `/` is double division in DuckDB).
def _segment_table(seq: _Sequence, ivs: pa.Table, p: dict) -> _Segments:
    n_rows = len(seq.pid)
    first = np.ones(n_rows, bool)
    first[1:] = (seq.pid[1:] != seq.pid[:-1]) | (seq.w[1:] != seq.w[:-1]) | (seq.seg[1:] != seq.seg[:-1])
    starts = np.flatnonzero(first)
    group = np.cumsum(first) - 1
    big = np.iinfo(np.int64).max

    def count(mask: np.ndarray) -> np.ndarray:
        return np.add.reduceat(mask.astype(np.int64), starts) if n_rows else np.zeros(0, np.int64)

    def total(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.where(mask, values, 0), starts) if n_rows else np.zeros(0, np.int64)

    def last(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per segment: the index of its last row in ``mask`` (the latest: rows are in time
        order, as arg_max(x, pos) picks), and whether there is one."""
        at = np.maximum.reduceat(np.where(mask, np.arange(n_rows), -1), starts) if n_rows else np.zeros(0, np.int64)
        return np.maximum(at, 0), at >= 0

    sub = (seq.dr == 0) & ((seq.role == _SUBMIT) | (seq.role == _COPY))
    n = count(sub)
    copies = count(sub & seq.h2d)
    has_sub = n > 0
    cmax = np.maximum.reduceat(np.where(sub, seq.csub, -1), starts) if n_rows else n
    s1 = np.minimum.reduceat(np.where(sub, seq.t, big), starts) if n_rows else n
    sub_e = sub & seq.has_e
    en = np.maximum.reduceat(np.where(sub_e, seq.e, -big), starts) if n_rows else n
    has_en = count(sub_e) > 0
    # the drain that closed the segment (at most one: its return row ends the segment)
    di, has_drain = last(seq.dr == 1)
    has_r_call = has_drain & seq.has_pos[di]
    r_call = seq.pos[di]
    drain_t = seq.t[di]
    raw_wait = np.where(has_drain, seq.wait[di], 0)
    # surely busy: the drain's wait less every CPU wait inside the segment's syncs
    drain_wait = np.maximum(0, raw_wait - total(seq.cpu, seq.role == _CPU))
    cpu_rows = seq.role == _CPU
    ce, has_cpu_end = last(cpu_rows & seq.has_e)
    cg, has_cpu_guess = last(cpu_rows & seq.has_guess)
    cpu_end, cpu_guess = seq.e[ce], seq.guess[cg]
    other_wait = total(seq.wait, seq.role == _WAIT)
    bp_n = count(seq.bp)
    # the host sat in these launches beyond a normal launch: the queue was full
    bp_ns = total(seq.d, seq.bp)
    # the likely end of the device's work: the drain's return, or, when the host got the CPU
    # back only just before returning, the guess of the last off-CPU row inside it
    near = has_r_call & has_cpu_end & has_drain & (cpu_end > drain_t) & (r_call - cpu_end <= p["tail"])
    r = np.where(near & has_cpu_guess, np.minimum(r_call, cpu_guess), r_call)
    has_r = has_r_call
    # one queue of equal kernels k that ended at r: each submission i of n started no earlier
    # than its call returned (e_i), so the n - i + 1 from it on fit in r - e_i:
    # k = min over i of (r - e_i) / (n - i + 1); i = 1 is r - s1 spread evenly, i = n the last
    # kernel alone, a middle i the run after the host stalled (preempted, blocked).  A drain
    # that did not wait found the work done when it started: the kernels from i on ran between
    # submission i's call and the drain's start (k_done).
    left = np.where(sub, cmax[group] - seq.csub + 1, 1).astype(np.float64)  # (1 on rows not divided)
    k_rows = sub & has_r[group]
    k = _min_or_nan(np.where(k_rows & seq.has_e, (r[group] - seq.e) / left, np.inf), starts)
    k_done = _min_or_nan(np.where(k_rows, (drain_t[group] - seq.t) / left, np.inf), starts)
    # the process' span: its device calls' first start and last return, or the span asked for
    pid, w, seg = seq.pid[starts], seq.w[starts], seq.seg[starts]
    calls = ~cpu_rows
    pids, first_of_pid = np.unique(seq.pid, return_index=True)
    pid_i = np.searchsorted(pids, pid)
    has_calls = np.add.reduceat(calls.astype(np.int64), first_of_pid) > 0 if n_rows else np.zeros(0, bool)
    p_min_t = np.minimum.reduceat(np.where(calls, seq.t, big), first_of_pid) if n_rows else n
    ends = calls & seq.has_e
    p_max_e = np.maximum.reduceat(np.where(ends, seq.e, -big), first_of_pid) if n_rows else n
    p_has_e = np.add.reduceat(ends.astype(np.int64), first_of_pid) > 0 if n_rows else np.zeros(0, bool)
    pstart = p_min_t[pid_i] if p["span_a"] is None else np.full(len(pid), p["span_a"])
    pend = p_max_e[pid_i] if p["span_b"] is None else np.full(len(pid), p["span_b"])
    has_pend = p_has_e[pid_i] if p["span_b"] is None else np.ones(len(pid), bool)
    # each segment's interval (ivs: w numbered from 0); a process without device calls has no span
    iv_w = ivs.column("w").to_numpy()
    iv_i = np.minimum(np.searchsorted(iv_w, w), max(len(iv_w) - 1, 0))
    keep = has_calls[pid_i] & (iv_w[iv_i] == w) if len(iv_w) else np.zeros(len(w), bool)
    iv_a, iv_b = ivs.column("a").to_numpy()[iv_i], ivs.column("b").to_numpy()[iv_i]
    # the first segment of an interval may hold work queued before it
    a = np.where(seg == 0, np.maximum(iv_a, pstart), s1)
    has_a = (seg == 0) | has_sub
    z = np.where(has_r_call, r_call, np.minimum(np.minimum(iv_b, p["t1"]), np.where(has_pend, pend, big)))
    no_span = (~has_sub & (seg > 0)) | ~has_a
    high = np.where(no_span, 0, np.maximum(0, z - a))
    low = np.minimum(high, drain_wait + other_wait + bp_ns)
    # least() skips NULLs: a segment without submissions has no a, and n * k is 0 there
    fit = np.minimum(np.where(has_a, r - a, np.inf), n * np.maximum(0.0, np.nan_to_num(k, nan=0.0)))
    waited = has_r & (raw_wait - (r_call - r) > p["wait_min"])
    point = np.where(bp_n > 0, high.astype(np.float64),
                     np.minimum(high, np.maximum(low, fit)))
    has_point = (bp_n > 0) | waited
    p_subs = np.add.reduceat(sub.astype(np.int64), first_of_pid) if n_rows else n
    p_bp_n = np.add.reduceat(seq.bp.astype(np.int64), first_of_pid) if n_rows else n
    return _Segments(
        pid=pid[keep], w=w[keep], seg=seg[keep], n=n[keep], copies=copies[keep], s1=s1[keep], has_s1=has_sub[keep],
        en=en[keep], has_en=has_en[keep], drain_t=drain_t[keep],
        r_call=r_call[keep], has_r_call=has_r_call[keep], raw_wait=raw_wait[keep], r=r[keep], has_r=has_r[keep],
        k=k[keep], k_done=k_done[keep], bp_n=bp_n[keep], low=low[keep], high=high[keep],
        point=np.where(has_point, point, np.nan)[keep],
        pstart=pstart[keep], pend=pend[keep], subs=p_subs[pid_i][keep], pid_bp_n=p_bp_n[pid_i][keep],
        span_a=a[keep], span_z=z[keep], has_span=~no_span[keep])


def _min_or_nan(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per run from each of ``starts``: the least value, NaN where every value is inf (none)."""
    if not len(values):
        return np.zeros(0)
    least = np.minimum.reduceat(values, starts)
    return np.where(np.isinf(least), np.nan, least)


def _window_rows(sg: _Segments, wait_min: int) -> list[tuple]:
    """Per process and window (in that order): (pid, w, low, point, high, drains, waited drains,
    pstart, pend, submissions, back-pressure launches of the process, whether the window's last
    segment was left open, tail), the busy times in ns summed over the window's segments; tail:
    of their idle, what fell after the last submission (WindowBusy.tail_ns).

    Segments the host did not wait on (point NaN) take the per-submission device time of the
    process' waited segments, capped by what fits before their drain's start and return (k,
    k_done); with none learned, the caps, at most the middle of their bounds; without caps, the
    middle.  (Was SQL over the segment table, ~0.016
    CPU-s for 14,000 segments; the same double operations here, summed in the segments' order.)"""
    if not len(sg.pid):
        return []
    pid_first = np.ones(len(sg.pid), bool)
    pid_first[1:] = sg.pid[1:] != sg.pid[:-1]
    pid_starts = np.flatnonzero(pid_first)
    pid_group = np.cumsum(pid_first) - 1
    learn = ~np.isnan(sg.point) & (sg.n > 0) & (sg.bp_n == 0)
    learned_n = np.add.reduceat(np.where(learn, sg.n, 0), pid_starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        kk = np.where(learned_n > 0, np.add.reduceat(np.where(learn, sg.point, 0.0), pid_starts) / learned_n, np.nan)
    # least() skips NULLs (fmin skips NaN): the learned k, capped by k and k_done
    learned = kk[pid_group]
    k = np.fmin(np.fmin(learned, sg.k), sg.k_done)
    mid = (sg.low + sg.high) / 2
    # with nothing learned, the caps say how long the kernels could have run, not how long they
    # ran: behind a drain entered right after the last launch the cap is that kernel's few µs
    # (the launch-bound demo: 4.9 µs for 5), but behind host work it is the launch interval (the
    # device could have kept pace), which counts at most the middle of the bounds
    fill = np.where(np.isnan(learned), np.fmin(sg.n * k, mid), sg.n * k)
    point = np.where(~np.isnan(sg.point), sg.point,
                     np.where(~np.isnan(k), np.minimum(sg.high, np.maximum(sg.low, fill)), mid))
    first = np.ones(len(sg.pid), bool)
    first[1:] = pid_first[1:] | (sg.w[1:] != sg.w[:-1])
    starts = np.flatnonzero(first)
    last = np.append(starts[1:], len(sg.pid)) - 1  # (segments in seg order: the last is the latest)
    waited = sg.has_r & (sg.raw_wait - (sg.r_call - sg.r) > wait_min)
    # where the idle inside a drained segment fell: the device ran its point's worth from the
    # first submission on, so what the launches' span (s1 to the last one's return) could not
    # hold of it spills into the tail (the host elsewhere until the drain); the rest of the
    # tail was idle, left by host work, not by launch pacing
    tail_host = np.where(sg.has_r_call & sg.has_s1 & sg.has_en, np.maximum(0, sg.drain_t - sg.en), 0)
    spill = np.maximum(0.0, point - np.where(sg.has_en, sg.en - sg.s1, 0))
    tail = np.minimum(np.maximum(0.0, tail_host - spill), np.maximum(0.0, sg.high - point))
    cols = (sg.pid[starts], sg.w[starts], np.add.reduceat(sg.low, starts),
            np.rint(np.add.reduceat(point, starts)).astype(np.int64),  # (::BIGINT rounds half to even)
            np.add.reduceat(sg.high, starts), np.add.reduceat(sg.has_r.astype(np.int64), starts),
            np.add.reduceat(waited.astype(np.int64), starts), sg.pstart[starts], sg.pend[starts],
            sg.subs[starts], sg.pid_bp_n[starts], ~sg.has_r[last],
            np.rint(np.add.reduceat(tail, starts)).astype(np.int64))
    return list(zip(*(c.tolist() for c in cols)))


COUNT_SQL = "SELECT coalesce(sum(n), 0) FROM ing_cuda WHERE cat IN ('launch', 'sync', 'copy')"


def infer(ctx: Context, t: Thresholds = T, span: tuple[int, int] | None = None) -> dict[int, DeviceActivity]:
    """Device activity of every CUDA process in ``ctx``'s range, by pid (none: no device calls).

    Shares are of ``span`` (e.g. the steps' span) when given, else of each process'
    span of device calls (first submission or sync to the last one's return).
    """
    span_a, span_b = span if span else (None, None)
    con = ctx.con
    calls = int(con.execute(COUNT_SQL).fetchone()[0] or 0)
    sampled = min(1.0, t.max_exact_calls / calls) if calls else 1.0
    slice_ns = ctx.window_ns if sampled >= 1.0 else max(1, int(ctx.window_ns * sampled))
    p = ctx.params(
        slice_ns=slice_ns, device_ops=DEVICE_OPS,
        wait_ops=[*DEVICE_SYNC_OPS, *STREAM_SYNC_OPS, *EVENT_SYNC_OPS, *SYNC_COPY_OPS],
    )
    seg_params = {"t1": ctx.end_ns, "wait_min": t.wait_min_ns, "span_a": span_a, "span_b": span_b, "tail": t.tail_ns}
    events = events_relation(con, ctx.session_id)
    windows_iv = window_intervals(ctx, slice_ns)
    ivs = attached_intervals(ctx, windows_iv)
    # steps are timed on every drain: syncs and copies are never sampled, and a step in a
    # sampled slice is slowed by the launch probes' traps (bench_budget: ~0.6 ms a step there)
    seg = _segments(con, windows_iv, _queries(events, w="(timestamp - $t0) // $wns", iv_join="", iv_where=""),
                    p, seg_params, t)
    con.register(STEPS_VIEW, seg.steps())
    if ivs is not None:
        # a sampled trace: the device only where every submission was seen (the attached slices);
        # each call belongs to the slice it falls in (an ASOF join on the slices' starts)
        seg = _segments(con, ivs, _queries(events, w="iv.w", iv_join=f"ASOF JOIN {IV_VIEW} iv ON timestamp >= iv.a",
                                           iv_where="AND timestamp < iv.b"), p, seg_params, t)
    else:
        ivs = windows_iv
    ctx.derived.device_segments = (seg, ivs)  # (a measured timeline's idle is split by them)
    rows = _window_rows(seg, t.wait_min_ns)
    by_pid: dict[int, list[tuple]] = {}
    for row in rows:
        by_pid.setdefault(int(row[0]), []).append(row)
    out = {}
    for pid, prow in by_pid.items():
        pstart, pend, subs, bp_n = prow[0][7], prow[0][8], prow[0][9], prow[0][10]
        wins = _windows(ivs, prow, ctx.end_ns, pstart, pend)
        total = sum(x.span_ns for x in wins) or 1
        out[pid] = DeviceActivity(
            pid=pid,
            busy_share=sum(x.point_ns for x in wins) / total,
            low=sum(x.low_ns for x in wins) / total,
            high=sum(x.high_ns for x in wins) / total,
            start_ns=int(pstart),
            end_ns=int(pend),
            span_ns=sum(x.span_ns for x in wins),
            windows=tuple(wins),
            submissions=int(subs),
            drains=sum(int(r[5]) for r in prow),
            waited_drains=sum(int(r[6]) for r in prow),
            backpressure_launches=int(bp_n),
            sampled=sampled,
        )
    return out


def _queries(events: str, **where: str) -> tuple[str, str]:
    """CALLS_SQL and CPU_SQL over ``events``, windows numbered and calls selected by ``where``."""
    return CALLS_SQL.format(**where), CPU_SQL.format(events=events, **where)


def _segments(con, ivs: pa.Table, queries: tuple[str, str], p: dict, seg_params: dict, t: Thresholds) -> _Segments:
    """ing_dev_seq (registered) and the segments over the intervals ``ivs`` (ing_dev_iv, read by
    the ASOF join of a sampled trace's queries)."""
    con.register(IV_VIEW, ivs)  # (intervals come in time order, one per w from 0)
    seq = _sequence(con, *queries, p, t)
    con.register(SEQ_VIEW, seq.table)
    return _segment_table(seq, ivs, seg_params)


def _sequence(con, calls_sql: str, cpu_sql: str, p: dict, t: Thresholds) -> _Sequence:
    """ing_dev_seq (SEQ_COLUMNS above) from the calls (CALLS_SQL) and the CPU waits (CPU_SQL).

    NULLs as the SQL had them: a call without a duration has no return (e, and pos of its
    return row, NULL, sorted last), no wait, and is no long launch (NULL for a launch)."""
    calls = _arrow(con, calls_sql, p)
    waits = _arrow(con, cpu_sql, p)
    pid = calls["pid"].to_numpy()
    op_i = calls["op_i"].to_numpy().astype(np.int64)
    d, has_d = _ints(calls["d"])
    launch = _OP_LAUNCH[op_i]
    h2d = calls["h2d"].to_numpy(zero_copy_only=False).astype(bool)  # (only copies carry a direction)
    # per process: the streams in use, the quickest launch (a loop always in back-pressure has
    # a long median); per process and op: the no-wait cost, the shortest call up to the cap
    pids, p_i = np.unique(pid, return_inverse=True)
    stream, has_stream = _ints(calls["stream"])
    streams = _distinct_per(p_i[has_stream], stream[has_stream], len(pids))
    big = np.iinfo(np.int64).max
    launch_min = np.full(len(pids), big)
    np.minimum.at(launch_min, p_i[launch & has_d], d[launch & has_d])
    key = p_i * len(_OP_NAMES) + op_i
    nowait = np.full(len(pids) * len(_OP_NAMES), big)
    np.minimum.at(nowait, key[has_d], d[has_d])
    wait = np.where(has_d, np.maximum(0, d - np.minimum(nowait[key], t.nowait_cap_ns)), 0)
    # a stream sync drains when the process uses one stream (or none is recorded)
    role = np.where(_OP_STREAM_SYNC[op_i] & (streams[p_i] <= 1), _DRAIN, _OP_ROLE[op_i])
    # d >= greatest(long_min, long_factor * launch_min), compared as doubles as in SQL
    fastest = launch_min[p_i]
    threshold = np.where(fastest == big, float(t.long_launch_min_ns),
                         np.maximum(float(t.long_launch_min_ns), t.long_launch_factor * fastest.astype(np.float64)))
    long_launch = launch & has_d & (d.astype(np.float64) >= threshold)
    long_null = launch & ~has_d  # unknown: neither long nor short

    # the rows: a submission (or a synchronous copy's start) at its start, a drain (or a
    # synchronous copy's return) and any other sync at its return, then the CPU waits
    starts = np.flatnonzero((role == _SUBMIT) | (role == _COPY))
    returns = np.flatnonzero((role == _DRAIN) | (role == _COPY))
    others = np.flatnonzero(role == _WAIT)
    at = np.concatenate([starts, returns, others])
    n_starts, n_waits = len(starts), waits.num_rows
    e, has_e = _ints(calls["e"])
    t_call = calls["t"].to_numpy()
    tid, has_tid = _ints(calls["tid"])
    waits_tid, waits_has_tid = _ints(waits["tid"])
    n_ends = len(at) - n_starts

    def rows(call_values: np.ndarray, wait_values: np.ndarray) -> np.ndarray:
        return np.concatenate([call_values[at], wait_values])

    pos = np.concatenate([t_call[starts], e[at[n_starts:]], waits["pos"].to_numpy()])
    has_pos = np.concatenate([np.ones(n_starts, bool), has_e[at[n_starts:]], np.ones(n_waits, bool)])
    dr = np.concatenate([np.zeros(n_starts, np.int32), np.ones(len(returns), np.int32),
                         np.zeros(len(others) + n_waits, np.int32)])
    row_role = np.concatenate([role[at], np.full(n_waits, _CPU)])
    w = rows(calls["w"].to_numpy(), waits["w"].to_numpy())
    row_pid = rows(pid, waits["pid"].to_numpy())
    t_row = rows(t_call, waits["t"].to_numpy())
    tid_row = rows(tid, waits_tid)
    # each process and window's rows in time order (NULL last); at one instant, by the call's
    # start: a drain returning as a call starts (the thread's next call, on a clock of whole µs
    # as in an imported trace) began earlier, so that call is the next segment's, never covered
    # by the drain; a zero-length synchronous copy's start before its return; then by thread
    order = np.lexsort((tid_row, dr, t_row, np.where(has_pos, pos, 0), ~has_pos, w, row_pid))
    row_pid, w, pos, has_pos, dr, row_role = (x[order] for x in (row_pid, w, pos, has_pos, dr, row_role))
    first = np.ones(len(order), bool)  # the first row of its process and window
    first[1:] = (row_pid[1:] != row_pid[:-1]) | (w[1:] != w[:-1])
    last = np.ones(len(order), bool)
    last[:-1] = first[1:]
    seg = _running_sum(dr.astype(np.int64), first) - dr
    csub = _running_sum((((row_role == _SUBMIT) | (row_role == _COPY)) & (dr == 0)).astype(np.int64), first)
    # back-pressure: a long launch between two long launches of its process and window
    # (long_launch AND coalesce(lag(long_launch), false) AND coalesce(lead(...), false))
    row_long = np.concatenate([long_launch[starts], np.zeros(n_ends + n_waits, bool)])[order]
    row_long_null = np.concatenate([long_null[starts], np.zeros(n_ends + n_waits, bool)])[order]
    around = np.zeros(len(order), bool)
    around[1:-1] = row_long[:-2] & row_long[2:]
    around &= ~first & ~last
    wait_row = np.concatenate([np.zeros(n_starts, np.int64), wait[at[n_starts:]], np.zeros(n_waits, np.int64)])
    w_cpu, w_has_cpu = _ints(waits["cpu"])
    w_guess, w_has_guess = _ints(waits["guess"])

    def column(call_values: np.ndarray, call_valid: np.ndarray, wait_values: np.ndarray,
               wait_valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows' values and where they are not NULL, sorted."""
        return rows(call_values, wait_values)[order], rows(call_valid, wait_valid)[order]

    e_row, has_e_row = column(e, has_e, *_ints(waits["e"]))
    d_row, has_d_row = column(d, has_d, *_ints(waits["d"]))
    no_call = np.zeros(len(at), np.int64)
    cpu, has_cpu = column(no_call, np.ones(len(at), bool), w_cpu, w_has_cpu)  # 0 on call rows, as the SQL had it
    guess, has_guess = column(no_call, np.zeros(len(at), bool), w_guess, w_has_guess)
    seq = _Sequence(pid=row_pid, w=w, seg=seg, dr=dr, role=row_role, pos=pos, has_pos=has_pos, t=t_row[order],
                    e=e_row, has_e=has_e_row, d=d_row, wait=wait_row[order], cpu=cpu, guess=guess,
                    has_guess=has_guess, csub=csub, bp=row_long & around,
                    h2d=rows(h2d, np.zeros(n_waits, bool))[order])
    seq.table = pa.table({
        "pid": pa.array(row_pid, pa.int32()),
        "tid": pa.array(tid_row[order].astype(np.int32), mask=~rows(has_tid, waits_has_tid)[order]),
        "w": pa.array(w, pa.int64()),
        "op": _names(rows(op_i, np.full(n_waits, _SCHED_SWITCH))[order], _OP_NAMES),
        "pos": pa.array(pos, mask=~has_pos),
        "t": pa.array(seq.t),
        "e": pa.array(e_row, mask=~has_e_row),
        "d": pa.array(d_row, mask=~has_d_row),
        "wait": pa.array(seq.wait),
        "cpu": pa.array(cpu, mask=~has_cpu),
        "guess": pa.array(guess, mask=~has_guess),
        "role": _names(row_role, ROLES),
        "dr": pa.array(dr, pa.int32()),
        "seg": pa.array(seg, pa.int64()),
        "csub": pa.array(csub, pa.int64()),
        "bp": pa.array(seq.bp, mask=row_long_null & around),  # NULL AND true is NULL
    })
    return seq


def _names(index: np.ndarray, names) -> pa.DictionaryArray:
    """Strings by their index in ``names``, dictionary-encoded: DuckDB reads them as VARCHAR, and
    building 100,000 Python strings into an Arrow string column took ~6 ms a column."""
    return pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int8)), pa.array(list(names), pa.string()))


def _arrow(con, sql: str, p: dict) -> pa.Table:
    """The query's rows as Arrow (only the parameters it names: DuckDB refuses unused ones)."""
    return con.sql(sql, params=named_params(sql, p)).to_arrow_table()


def _ints(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as int64 values (0 where NULL) and where it is not NULL."""
    valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else np.ones(len(column), bool)
    values = column.fill_null(0).to_numpy() if column.null_count else column.to_numpy()
    return values.astype(np.int64, copy=False), valid


def _distinct_per(group: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """The number of distinct values in each group (0..groups-1).  (np.unique over the pairs,
    axis=1, took ~80 ms for 100,000 calls on several streams.)"""
    order = np.lexsort((values, group))
    g, v = group[order], values[order]
    new = np.ones(len(order), bool)
    new[1:] = (g[1:] != g[:-1]) | (v[1:] != v[:-1])
    return np.bincount(g[new], minlength=groups)


def _running_sum(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sum of x restarting at every ``first`` row (x in sorted partitions)."""
    total = np.cumsum(x)
    if not len(x):
        return total
    starts = np.flatnonzero(first)
    before = total[starts] - x[starts]  # the running total just before each partition
    return total - np.repeat(before, np.diff(np.append(starts, len(x))))


def window_intervals(ctx: Context, slice_ns: int) -> pa.Table:
    """The time analysed, one interval per window: w (numbered as the window), win, [a, b): the
    window's first ``slice_ns``."""
    w = np.arange(ctx.n_windows, dtype=np.int64)
    starts = ctx.start_ns + w * ctx.window_ns
    return pa.table({"w": w, "win": w, "a": starts, "b": np.minimum(starts + slice_ns, ctx.end_ns)})


def attached_intervals(ctx: Context, windows_iv: pa.Table) -> pa.Table | None:
    """``windows_iv`` less the parts of the sampling table's periods in which the launch probes
    were detached (`--overhead-budget`): there submissions are missing, so a segment's count
    would be short.  None: nothing was sampled."""
    rows = launch_sampling.periods(ctx)
    if not len(rows):
        return None
    detached = launch_sampling.detached_parts(rows)
    win, a, b = [], [], []
    first = 0  # the first detached part that can still reach the window (windows come in time order)
    for i, ws, we in zip(*(windows_iv.column(c).to_pylist() for c in ("win", "a", "b"))):
        while first < len(detached) and detached[first][1] <= ws:
            first += 1
        cur, k = ws, first
        while k < len(detached) and detached[k][0] < we:  # the parts overlapping the window (periods are disjoint)
            lo, hi = detached[k]
            if lo > cur:
                win.append(i), a.append(cur), b.append(lo)
            cur = max(cur, hi)
            k += 1
        if cur < we:
            win.append(i), a.append(cur), b.append(we)
    return pa.table({"w": np.arange(len(win), dtype=np.int64), "win": np.array(win, dtype=np.int64),
                     "a": np.array(a, dtype=np.int64), "b": np.array(b, dtype=np.int64)})


def _windows(ivs: pa.Table, prow: list[tuple], end_ns: int, pstart: int, pend: int) -> list[WindowBusy]:
    """Every window of the process' call span, summed over its intervals; an interval without
    calls may still run work queued before it."""
    have = {int(r[1]): r for r in prow}
    by_win: dict[int, list[int]] = {}
    open_before = False  # the previous interval ended with work possibly queued
    for w, win, a, b in zip(*(ivs.column(c).to_pylist() for c in ("w", "win", "a", "b"))):
        if b <= pstart or a >= pend:
            continue
        span = max(0, min(b, end_ns, pend) - max(a, pstart))
        cap = max(span, 1)  # a segment can end past the interval (its drain returned later)
        row = have.get(w)
        if row is None:
            # no call at all: nothing is known but what was queued before
            high = span if open_before else 0
            low, point = 0, high // 2
        else:
            low, point, high, open_before = (min(int(row[2]), cap), min(int(row[3]), cap), min(int(row[4]), cap),
                                             bool(row[11]))
        tail = 0 if row is None else min(int(row[12]), max(0, high - point))
        acc = by_win.setdefault(win, [a, 0, 0, 0, 0, 0])
        acc[1] += span
        acc[2] += low
        acc[3] += point
        acc[4] += high
        acc[5] += tail
    return [WindowBusy(win, *acc) for win, acc in sorted(by_win.items())]


def main_process(ctx: Context, activity: dict[int, DeviceActivity]) -> DeviceActivity | None:
    """The activity of the process with most CUDA calls (ing_loop), the one explain reports."""
    row = ctx.con.execute("SELECT pid FROM ing_loop ORDER BY cuda_n DESC, pid LIMIT 1").fetchone()
    if row is None:
        return None
    return activity.get(int(row[0]))


def analyse(con, opts: Options, span: tuple[int, int] | None = None) -> tuple[Context, DeviceActivity | None]:
    """Resolve ``opts``, build the window tables, infer: the context and the main process' activity."""
    ctx = resolve(con, opts)
    windows.build(ctx)
    return ctx, main_process(ctx, infer(ctx, span=span))
