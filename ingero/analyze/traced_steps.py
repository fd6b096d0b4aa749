"""Training steps from the rhythm of the loop's CUDA calls, and where a step's wall clock goes.

A training loop repeats one pattern per step: a copy, launches, one or more
syncs.  analyze/device/__init__.py cuts the process' call stream into segments at its drains
(syncs and synchronous copies); the pattern shows as the segments' submission
counts repeating with a period of p segments (p drains per step).  The
smallest p under which the counts repeat (within a tolerance, for the
occasional extra call) is the step; steps run from drain return to drain
return, starting at the drain followed by the longest host gap (data loading
and optimizer work come between steps).  A loop with many drains a step (a
sync after every kernel) repeats too finely for the counts: there the input
copy, in every p-th segment, marks the step, which ends at the drain before
it.  With p > 1 drains a step, where the host gap after a step's last drain
stands apart from the others (the next batch, bookkeeping), each drain
followed by such a gap ends a step: an extra sync on an odd step (a read-back
every tenth step) then moves no boundary.  No repeating pattern (or no
drains, as in loops that never sync): no steps, and the reason says why.

An explicit marker comes first: NVTX ranges (``spans`` rows of category
'nvtx', recorded by ``ingero trace --cmd`` through its NVTX injection library)
whose name says step (``MARKER_NAME``: "step 12", "train_iter", "batch"; not
an operator's, ``NOT_A_STEP``), repeating and not parts of other steps, are
the steps (``marked``); each runs from one range's start to the next one's
(the data loading between two ranges belongs to the step it feeds) unless the
host was away far longer than usual between them (``marked_durations``).
Ranges named otherwise (``forward``, or one per operator under
``torch.autograd.profiler.emit_nvtx``) mark no step: the rhythm decides.

The breakdown splits the loop thread's wall clock, over the windows that hold
steps, into parts that add up to it, from the window tables (ing_win,
ing_sched, ing_cuda: no further pass over the events), and scales them to the
mean step:

  data_wait     asleep outside CUDA calls (DataLoader queue, input), less:
  lock_wait     asleep for a lock or the GIL a sibling thread held (waits.py)
  sleep         asleep on its own timer (time.sleep: nobody else made it wait)
  output_wait   blocked writing into a pipe or socket (a log piped into a slow reader)
  host          on CPU outside CUDA calls (Python, inline loading, optimizer)
  launch        inside kernel launches
  copy          inside H2D / D2H copy calls
  device_wait   inside syncs (spinning or sleeping alike)
  other_cuda    inside other CUDA calls (cudaMalloc, cudaFree, ...)
  cpu_wait      runnable but off CPU (preempted, or after a wake-up), inside
                calls or not: taken out of the call it happened in
  faults_io     page faults and block I/O (D state) outside CUDA calls

``host`` is the remainder, so the parts always sum to the step.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from ingero.analyze import procs, waits
from ingero.analyze.context import Context
from ingero.analyze.device import DeviceActivity
from ingero.analyze.windows import COPY_NS_SQL, DEVICE_WAIT_NS_SQL
from ingero.events.ops import DEVICE_SYNC_OPS, SYNC_COPY_OPS


@dataclass(frozen=True)
class Thresholds:
    # Periods tried: up to 8 drains per step (PyTorch loops: 1-4 syncs per step
    # from .item() / .cpu() / a loss print).
    max_period: int = 8
    # Two segments match when their submission counts differ by at most this
    # share (an extra launch now and then: a logging step, an allocator call).
    count_tolerance: float = 0.1
    # The pattern holds when this share of segments matches the one p before.
    min_match: float = 0.8
    # Fewer segments than this are no rhythm.
    min_segments: int = 6
    # A loop that syncs after every few kernels (an .item() per kernel: 32 drains a step in the
    # sync-heavy demo) repeats every segment, yet copies its input to the device once a step:
    # host-to-device copies in every p-th segment (p > 1, min_match of the spacings within a
    # window) make p the step, up to this many drains, when the host's gap before a copy's
    # segment is at least marker_gap_factor times the mean gap before the others (the batch
    # is fetched between steps: 200 µs against ~0 in that demo; a D2H read-back for logging
    # every tenth step has no such gap).
    max_marker_period: int = 1024
    marker_gap_factor: float = 2.0
    # With p drains a step, the host gap after the step's last drain (loading the next batch,
    # bookkeeping) is this many times the gaps after the others at least (a new user's loop:
    # 404 µs against 202 µs): then each drain followed by such a gap ends a step, wherever
    # the extra syncs of an odd step fall.
    boundary_gap_factor: float = 1.5
    # NVTX ranges mark the steps when at least this many of one step-named family start in
    # the range (fewer: the rhythm, which needs as many segments, decides).
    min_marked_steps: int = 6
    # A marked step ends at the next one's start, unless the host's gap before it is more than
    # marker_away_factor times the usual gap (at least marker_away_share of a range): then at
    # its range's end plus the usual gap (a validation pass every 100 steps is not a step's).
    marker_away_factor: float = 4.0
    marker_away_share: float = 0.1


T = Thresholds()

# An NVTX range names a step when a word of its name, digits taken out, is one of these
# ("step 12", "train_step", "ProfilerStep#3", "iter", "iteration 7", "batch"); matched
# case-insensitively at word boundaries (underscores and camel case split words).
MARKER_NAME = re.compile(r"(?:^|[^a-z])(?:step|steps|iter|iters|iteration|batch)(?:$|[^a-z])", re.IGNORECASE)
# Names that are an operator's or a framework's own, though a word of them says batch, step or
# iter: torch.autograd.profiler.emit_nvtx's ranges ("aten::batch_norm, seq = 12, op_id = 40"),
# autograd nodes ("CudnnBatchNormBackward0"), modules ("BatchNorm2d"), record_function names
# ("Optimizer.step#SGD.step", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
# "lr_scheduler.step").  A user's "ProfilerStep#3" or "step#3" stays a step.
NOT_A_STEP = re.compile(r"::|, seq = |Backward\d*$|BatchNorm|DataLoader|#[A-Za-z_]|\.step\b", re.IGNORECASE)

PARTS = ("data_wait", "lock_wait", "sleep", "output_wait", "host", "launch", "copy", "device_wait", "other_cuda",
         "cpu_wait", "faults_io")


@dataclass(frozen=True)
class StepBreakdown:
    """Where the mean step's wall clock goes, in ms; the parts sum to ``total_ms``."""

    data_wait_ms: float
    host_ms: float
    launch_ms: float
    copy_ms: float
    device_wait_ms: float
    other_cuda_ms: float
    cpu_wait_ms: float
    faults_io_ms: float
    # asleep outside CUDA calls waiting for a lock (the GIL) another thread of the process held
    # (waits.py: the root of the wait is a sibling on CPU); not in data_wait_ms
    lock_wait_ms: float = 0.0
    # asleep on its own timer, and blocked writing its output (waits.py); not in data_wait_ms
    sleep_ms: float = 0.0
    output_wait_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return sum(getattr(self, f"{p}_ms") for p in PARTS)


@dataclass(frozen=True)
class Steps:
    pid: int
    tid: int
    count: int  # steps in the range (its drains / drains per step, less the one that opens the first)
    median_ms: float
    p99_ms: float
    mean_ms: float
    drains_per_step: int
    breakdown: StepBreakdown | None
    source: str = "rhythm"  # 'rhythm' | 'nvtx' (NVTX ranges named as steps)
    marker: str | None = None  # 'nvtx': the ranges' name, numbers as '#' ("step #")

    def to_dict(self) -> dict:
        """The `steps` object of explain --json."""
        out = {"count": self.count, "median_ms": round(self.median_ms, 3), "p99_ms": round(self.p99_ms, 3)}
        if self.breakdown is not None:
            out["breakdown_ms"] = {k[:-3]: round(v, 3) for k, v in asdict(self.breakdown).items()}
        return out


# The process' NVTX ranges overlapping the range analysed (one that starts before it can still
# enclose one inside it), outermost first at equal starts.
MARKERS_SQL = """
SELECT tid, start_ns, end_ns, name FROM spans
WHERE session_id = $sid AND pid = $pid AND category = 'nvtx' AND end_ns >= $t0 AND start_ns < $t1
  AND end_ns >= start_ns
ORDER BY tid, start_ns, end_ns DESC
"""

SEGMENTS_SQL = """
SELECT w, seg, n, copies, r_call, s1 FROM ing_dev_steps
WHERE pid = $pid
ORDER BY w, seg
"""

# The loop thread's time per window, by what it was doing (ns).
PARTS_SQL = """
WITH c AS (
    -- copies and device wait as ing_win counts them (windows.COPY_NS_SQL, DEVICE_WAIT_NS_SQL)
    SELECT w, sum(dur_ns) FILTER (cat = 'launch') AS launch, {copy_ns} AS copy, {device_wait_ns} AS sync,
           sum(dur_ns) FILTER (cat = 'copy') AS copy_dur,
           sum(dur_ns) FILTER (cat IN ('other', 'pinned')) AS other
    FROM ing_cuda WHERE tid = $tid GROUP BY w
), s AS (
    -- CPU wait, by the call it happened in ('none': outside every call)
    SELECT w,
           sum(CASE WHEN kind = 'preempted' THEN off_ns ELSE least(off_ns, runq_ns) END) AS cpu_wait,
           sum(CASE WHEN kind = 'preempted' THEN off_ns ELSE least(off_ns, runq_ns) END)
               FILTER (inside = 'launch') AS cpu_in_launch,
           sum(CASE WHEN kind = 'preempted' THEN off_ns ELSE least(off_ns, runq_ns) END)
               FILTER (inside = 'copy') AS cpu_in_copy,
           -- inside syncs: the run-queue wait after a sleeping sync's wake-up delays it; a
           -- spinning one's preemptions only in part (ing_late: the part after the device finished)
           sum(least(off_ns, runq_ns)) FILTER (inside = 'sync' AND kind <> 'preempted') AS cpu_in_sync,
           sum(off_ns) FILTER (inside = 'sync' AND kind = 'preempted') AS preempt_in_sync,
           sum(CASE WHEN kind = 'preempted' THEN off_ns ELSE least(off_ns, runq_ns) END)
               FILTER (inside IN ('other', 'pinned')) AS cpu_in_other,
           sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep' AND inside = 'none') AS data_wait,
           sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'io' AND inside = 'none') AS io,
           -- outside every call: CPU wait, and sleeps with nothing queued on the device
           sum(CASE WHEN kind = 'preempted' THEN off_ns ELSE least(off_ns, runq_ns) END)
               FILTER (inside = 'none') AS cpu_out,
           sum(greatest(0, off_ns - runq_ns)) FILTER (kind = 'sleep' AND inside = 'none' AND queued IS NOT TRUE)
               AS data_idle
    FROM ing_sched WHERE tid = $tid GROUP BY w
), f AS (
    SELECT w, sum(dur_ns) AS faults FROM ing_faults WHERE tid = $tid AND inside = 'none' GROUP BY w
), lt AS (
    SELECT w, sum(late_ns) AS late FROM ing_late WHERE tid = $tid GROUP BY w
)
SELECT w.w, w.wall_ns,
       coalesce(s.data_wait, 0), coalesce(c.launch, 0) - coalesce(s.cpu_in_launch, 0),
       -- a copy call's CPU wait comes out of its wait for the device first, then of its transfer
       -- (a measured transfer, CUPTI's, is often a small part of the call: taking the wait from it
       -- alone left a 13 us copy of 64 KiB at nothing)
       greatest(0, least(coalesce(c.copy, 0), coalesce(c.copy_dur, 0) - coalesce(s.cpu_in_copy, 0))),
       coalesce(c.sync, 0) - (coalesce(c.copy_dur, 0) - coalesce(c.copy, 0))
           + greatest(0, coalesce(c.copy_dur, 0) - coalesce(s.cpu_in_copy, 0)
                         - greatest(0, least(coalesce(c.copy, 0),
                                             coalesce(c.copy_dur, 0) - coalesce(s.cpu_in_copy, 0))))
           - coalesce(s.cpu_in_sync, 0) - coalesce(lt.late, 0),
       coalesce(c.other, 0) - coalesce(s.cpu_in_other, 0),
       coalesce(s.cpu_wait, 0) - coalesce(s.preempt_in_sync, 0) + coalesce(lt.late, 0),
       coalesce(s.io, 0) + coalesce(f.faults, 0),
       coalesce(s.cpu_out, 0), coalesce(s.data_idle, 0)
FROM ing_win w LEFT JOIN c USING (w) LEFT JOIN s USING (w) LEFT JOIN f USING (w) LEFT JOIN lt USING (w)
WHERE w.pid = $pid AND list_contains($ws, w.w)
ORDER BY w.w
""".replace("{device_wait_ns}", DEVICE_WAIT_NS_SQL).replace("{copy_ns}", COPY_NS_SQL)


def _matches(a: np.ndarray, b: np.ndarray, tol: float) -> np.ndarray:
    """Counts that differ by at most ``tol`` of the larger (and always by 1)."""
    return np.abs(a - b) <= np.maximum(1, tol * np.maximum(a, b))


def period(counts: list[int], t: Thresholds = T) -> int | None:
    """The smallest p under which the segments' submission counts repeat, or None."""
    if len(counts) < t.min_segments:
        return None
    # (numpy: a 120 s range has ~14,000 segments, 8 periods tried; ~0.03 CPU-s in Python)
    c = np.asarray(counts, dtype=np.int64)
    for p in range(1, min(t.max_period, len(counts) // 3) + 1):
        pairs = len(counts) - p
        same = int(np.count_nonzero(_matches(c[:-p], c[p:], t.count_tolerance)))
        # a period > 1 must be more than a repeat of a smaller one (which was tried first)
        if same >= t.min_match * pairs:
            return p
    return None


def marker_period(copies: np.ndarray, w: np.ndarray, t: Thresholds = T) -> int | None:
    """The spacing of the segments holding a host-to-device copy (within each window), when it
    is regular and more than 1, or None."""
    at = np.flatnonzero(copies > 0)
    same_w = w[at[1:]] == w[at[:-1]] if len(at) > 1 else np.zeros(0, bool)
    spacing = np.diff(at)[same_w]
    if len(spacing) < t.min_segments:
        return None
    values, times = np.unique(spacing, return_counts=True)
    p = int(values[np.argmax(times)])
    if p <= 1 or p > t.max_marker_period or times.max() < t.min_match * len(spacing):
        return None
    return p


def _gap_before_copies_dominates(copies: np.ndarray, gap: np.ndarray, has_gap: np.ndarray,
                                 t: Thresholds = T) -> bool:
    """The host's gap before a copy's segment (previous drain's return to its first submission)
    is at least marker_gap_factor times the mean gap before the other segments."""
    marked = has_gap & (copies > 0)
    other = has_gap & (copies == 0)
    if not marked.any() or not other.any():
        return bool(marked.any())
    return float(gap[marked].mean()) >= t.marker_gap_factor * max(1.0, float(gap[other].mean()))


def _boundary_gaps(p: int, follows: np.ndarray, gap: np.ndarray, t: Thresholds = T) -> np.ndarray | None:
    """Per drain followed by a host gap in its window (``follows``): whether that gap is a step
    boundary's, or None when the gaps do not say.  About one drain in p ends a step, so the
    boundary is the widest ratio between consecutive sorted gaps around that quantile (from
    1 - 1.5/p to 1 - 0.5/p of them), at least boundary_gap_factor; the threshold is the
    geometric middle of that step.  (Not per phase: an extra sync on an odd step shifts the
    phase of every drain after it in its window.)"""
    g = np.sort(gap[1:][follows]).astype(np.float64)
    if len(g) < t.min_segments:
        return None
    lo, hi = max(0, int(len(g) * (1 - 1.5 / p))), min(len(g) - 1, int(len(g) * (1 - 0.5 / p)))
    if hi <= lo:
        return None
    logs = np.log(np.maximum(g[lo:hi + 1], 1.0))
    j = int(np.argmax(np.diff(logs)))
    if logs[j + 1] - logs[j] < np.log(t.boundary_gap_factor):
        return None
    return gap[1:] >= np.sqrt(max(g[lo + j], 1.0) * g[lo + j + 1])


def _step_shaped(counts: np.ndarray, r: np.ndarray, s1: np.ma.MaskedArray, first: np.ndarray,
                 t: Thresholds = T) -> np.ndarray | None:
    """With one drain a step: the drains that close a step, when some do not.  A validation
    pass every N steps (a sync copy per batch: thousands of tiny segments) repeats with period
    1 as well, and each of its drains would count as a step (a new user's loop: 15,997 for
    636).  The steps are the segments whose submission count matches the count holding most of
    the time, and any segment at least half as long as their median (an odd step with extra
    launches still is one); None when every segment is one."""
    # each segment's time: from the previous drain's return (the first of a window: from its
    # first submission; none: 0)
    no_s1 = np.ma.getmaskarray(s1)
    dur = np.where(first, np.where(no_s1, 0, r - s1.filled(0)), np.diff(r, prepend=r[0])).astype(np.float64)
    dur = np.maximum(dur, 0.0)
    values, inverse = np.unique(counts, return_inverse=True)
    if len(values) < 2:
        return None
    held = np.bincount(inverse, weights=dur)
    best, best_held = None, -1.0
    for v in values[np.argsort(held)[::-1][:16]]:  # the counts holding most time
        like = _matches(counts, np.full(len(counts), v), t.count_tolerance)
        if dur[like].sum() > best_held:
            best, best_held = like, float(dur[like].sum())
    if best is None or best.all() or best_held < t.min_match * dur.sum():
        return None
    # (a window's first segment holds only what fell in the window: its count is no evidence;
    # a drain with nothing submitted since the last, such as the final cudaDeviceSynchronize,
    # closes what was left)
    shaped = best | first | (counts == 0) | (dur >= 0.5 * float(np.median(dur[best])))
    return None if shaped.all() else shaped


def _percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (q in 0..100)."""
    k = max(0, min(len(sorted_vals) - 1, -(-len(sorted_vals) * q // 100) - 1))
    return sorted_vals[int(k)]


def is_step_name(name: str) -> bool:
    """Whether an NVTX range's name says it is a training step (MARKER_NAME), and is not an
    operator's or a framework's own (NOT_A_STEP)."""
    if NOT_A_STEP.search(name):
        return False
    return bool(MARKER_NAME.search(re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name)))


def _family(name: str) -> str:
    """A range's name with its numbers taken out: "step 12" and "step 13" are one family."""
    return re.sub(r"\d+", "#", name).strip()


def outermost(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per range of one thread (sorted by start, the longer first at equal starts): whether no
    earlier range encloses it: every earlier one starts no later, so it is enclosed when one
    of them ends no earlier.  (Push/pop ranges nest; a start/end range overlapping an
    outermost one without being inside it is outermost too.)"""
    out = np.ones(len(starts), bool)
    out[1:] = ends[1:] > np.maximum.accumulate(ends)[:-1]
    return out


@dataclass(frozen=True)
class Marked:
    """The NVTX ranges that mark ``pid``'s steps: one family (of any of its threads), by start."""

    tid: int  # the thread holding most of them (the breakdown's)
    name: str  # the family: "step #"
    starts: np.ndarray
    ends: np.ndarray


def marked(ctx: Context, pid: int, t: Thresholds = T) -> Marked | None:
    """The NVTX ranges marking ``pid``'s steps, or None.

    The candidates are the step-named families with at least min_marked_steps ranges starting
    in the range, a family's ranges taken from every thread of the process (steps handed
    between threads are one sequence), mostly not inside another step-named range of their
    thread (a "step" holding four "micro_batch" ranges, a "train_step" holding an "optimizer
    step"; any such range of a family that repeats counts, however few start in the range, so
    a narrow --since does not promote micro-batches; one "batch loop" around all is none).
    The steps are the family least often inside one, then the one covering the most of its own
    span (a validation pass of many short "val_batch" ranges between "train_step" ranges
    covers little of it), then the most numerous.  Ranges named otherwise ("epoch 3" around
    the steps, operators) neither count nor hide any."""
    if not procs.has_table(ctx.con, "spans"):
        return None
    t0 = max(ctx.start_ns, ctx.derived.calls_from_ns or ctx.start_ns)
    rows = ctx.con.execute(MARKERS_SQL, {"sid": ctx.session_id, "pid": pid, "t0": t0,
                                         "t1": ctx.end_ns}).fetchnumpy()
    tids = np.asarray(rows["tid"], dtype=np.int64)
    starts, ends = np.asarray(rows["start_ns"], dtype=np.int64), np.asarray(rows["end_ns"], dtype=np.int64)
    names = [str(n) for n in rows["name"]]
    stepped = np.array([is_step_name(n) for n in names], dtype=bool)
    fams = [_family(n) for n in names]
    # enclosers: step-named ranges of a family that repeats (one "batch loop" around
    # everything holds no step); per range, inside one on its thread (rows: by thread, start)
    seen = Counter(f for f, st in zip(fams, stepped) if st)
    encloser = stepped & np.array([seen[f] >= 2 for f in fams], dtype=bool)
    enclosed = np.zeros(len(tids), bool)
    cut = np.flatnonzero(np.diff(tids)) + 1
    for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(tids)]):
        idx = lo + np.flatnonzero(encloser[lo:hi])
        enclosed[idx] = ~outermost(starts[idx], ends[idx])
    families: dict[str, list[int]] = {}
    for i in np.flatnonzero(encloser & (starts >= t0)).tolist():
        families.setdefault(fams[i], []).append(i)
    best, best_key = None, None
    for fam, idx_list in families.items():
        idx = np.asarray(idx_list)
        # (mostly inside other step-named ranges: parts of steps, never the steps themselves)
        if len(idx) < t.min_marked_steps or enclosed[idx].mean() > 0.5:
            continue
        idx = idx[np.argsort(starts[idx], kind="stable")]
        s, e = starts[idx], ends[idx]
        span = max(1, int(e.max() - s.min()))
        key = (-float(enclosed[idx].mean()), float(np.sum(e - s)) / span, len(idx))
        if best_key is None or key > best_key:
            values, counts = np.unique(tids[idx], return_counts=True)
            best, best_key = Marked(int(values[np.argmax(counts)]), fam, s, e), key
    return best


def marked_durations(m: Marked, t: Thresholds = T) -> np.ndarray:
    """Each marked step's time (ns, the last one's not known): from its range's start to the
    next one's, except where the host was away far longer than between most steps (a
    validation pass, a checkpoint): then its range and the usual gap."""
    if len(m.starts) < 2:
        return np.zeros(0, np.int64)
    to_next = np.diff(m.starts)
    gap = np.maximum(m.starts[1:] - m.ends[:-1], 0)
    usual = float(np.median(gap))
    length = m.ends[:-1] - m.starts[:-1]
    away = gap > t.marker_away_factor * max(usual, t.marker_away_share * float(np.median(length)))
    return np.where(away, np.minimum(to_next, length + int(usual)), to_next)


def _from_markers(ctx: Context, pid: int, m: Marked, t: Thresholds = T) -> Steps:
    """Steps from NVTX ranges (marked_durations); the breakdown over every window they span."""
    durations = sorted((marked_durations(m, t) / 1e6).tolist())
    first, last = ((int(m.starts[0]) - ctx.start_ns) // ctx.window_ns,
                   (int(m.starts[-1]) - ctx.start_ns) // ctx.window_ns)
    mean = sum(durations) / len(durations)
    return Steps(
        pid=pid,
        tid=m.tid,
        count=len(m.starts),
        median_ms=_percentile(durations, 50),
        p99_ms=_percentile(durations, 99),
        mean_ms=mean,
        drains_per_step=max(1, round(_drains(ctx, pid) / len(m.starts))),
        breakdown=breakdown(ctx, pid, m.tid, list(range(first, last + 1)), mean),
        source="nvtx",
        marker=m.name,
    )


def detect(ctx: Context, act: DeviceActivity, t: Thresholds = T) -> Steps | None:
    """Steps of ``act``'s process (device.infer must have run on ``ctx``): from its step-named
    NVTX ranges when it has them, else from the rhythm of its calls; None without either."""
    m = marked(ctx, act.pid, t)
    if m is not None:
        return _from_markers(ctx, act.pid, m, t)
    con = ctx.con
    # (numpy over the segments: ~14,000 in a 120 s range, ~0.02 CPU-s as Python tuples)
    rows = con.execute(SEGMENTS_SQL, {"pid": act.pid}).fetchnumpy()
    w, counts, copies, r = (np.asarray(rows[c], dtype=np.int64) for c in ("w", "n", "copies", "r_call"))
    s1 = np.ma.asarray(rows["s1"])
    first = np.ones(len(w), bool)
    first[1:] = w[1:] != w[:-1]
    # each segment's host gap before it: the previous drain's return to its first submission
    gap = np.zeros(len(w), np.int64)
    has_gap = np.zeros(len(w), bool)
    has_gap[1:] = ~first[1:] & ~np.ma.getmaskarray(s1)[1:]
    gap[1:] = np.where(has_gap[1:], s1.filled(0)[1:] - r[:-1], 0)
    p = period(counts, t)
    one_by_one = False  # the step ends found drain by drain, not every p-th (count: from them)
    marker = marker_period(copies, w, t) if p in (None, 1) else None
    if marker is not None and _gap_before_copies_dominates(copies, gap, has_gap, t):
        # the drain before each input copy closes a step
        p = marker
        ends = np.zeros(len(w), bool)
        ends[:-1] = (copies[1:] > 0) & ~first[1:]
    else:
        if p is None:
            return None
        # each segment's place in its window
        starts = np.flatnonzero(first)
        place = np.arange(len(w)) - np.repeat(starts, np.diff(np.append(starts, len(w))))
        # phase: the boundary drain is the one followed by the longest host gap
        follows = has_gap[1:]
        gaps = np.zeros(p, np.int64)
        np.add.at(gaps, place[:-1][follows] % p, gap[1:][follows])
        phase = int(np.argmax(gaps))  # (the first of equal gaps)
        # every p-th drain from the phase on closes a step; steps within a window are timed
        ends = (place >= phase) & ((place - phase) % p == 0)
        if p == 1:
            shaped = _step_shaped(counts, r, s1, first, t)
            if shaped is not None:
                ends, one_by_one = shaped, True
        elif p > 1:
            # where the boundary's gap stands apart, each drain followed by such a gap ends a
            # step: an extra sync now and then (a read-back on every tenth step) shifts no
            # boundary, as counting every p-th drain would; a drain with no gap after it in its
            # window ends one when most segments of its submission count do
            long_gap = _boundary_gaps(p, follows, gap, t)
            if long_gap is not None:
                seen = counts[:-1][follows]
                values, inverse = np.unique(seen, return_inverse=True)
                closing = values[np.bincount(inverse, weights=long_gap[follows]) * 2 >= np.bincount(inverse)]
                like = np.isin(counts, closing)
                ends = like.copy()
                ends[:-1] = np.where(follows, long_gap, like[:-1])
                one_by_one = True
    end_w, end_r = w[ends], r[ends]
    same = end_w[1:] == end_w[:-1]
    durations = ((end_r[1:] - end_r[:-1])[same] / 1e6).tolist()
    step_windows = set(end_w[1:][same].tolist())
    if not durations:
        return None
    durations.sort()
    mean = sum(durations) / len(durations)
    drains = _drains(ctx, act.pid)
    tid_row = con.execute("SELECT tid FROM ing_loop WHERE pid = $pid", {"pid": act.pid}).fetchone()
    tid = int(tid_row[0]) if tid_row else act.pid
    return Steps(
        pid=act.pid,
        tid=tid,
        # p drains a step; the first only opens one (steps crossing a window boundary are not
        # timed, but counted; so are the steps outside the slices)
        count=max(0, (round(drains * np.count_nonzero(ends) / len(w)) if one_by_one else drains // p) - 1),
        median_ms=_percentile(durations, 50),
        p99_ms=_percentile(durations, 99),
        mean_ms=mean,
        drains_per_step=p,
        breakdown=breakdown(ctx, act.pid, tid, sorted(step_windows), mean),
    )


def _drains(ctx: Context, pid: int) -> int:
    """Every drain of ``pid`` in the range, sampled or not: the window tables count them all."""
    # device syncs and synchronous copies always drain; stream syncs when the slices saw them drain
    row = ctx.con.execute(
        "SELECT coalesce(sum(n), 0) FROM ing_cuda WHERE pid = $pid AND cat <> 'failed' AND (list_contains($always, op) "
        "OR op IN (SELECT DISTINCT op FROM ing_dev_seq WHERE pid = $pid AND dr = 1))",
        {"pid": pid, "always": [*DEVICE_SYNC_OPS, *SYNC_COPY_OPS]}).fetchone()
    return int(row[0])


@dataclass(frozen=True)
class WindowParts:
    """The loop thread's time in one window by part (ns); the parts sum to ``wall_ns``."""

    w: int
    wall_ns: float
    data_wait_ns: float
    host_ns: float  # on CPU outside CUDA calls: the remainder
    launch_ns: float
    copy_ns: float
    device_wait_ns: float
    other_cuda_ns: float
    cpu_wait_ns: float
    faults_io_ns: float
    cpu_wait_out_ns: float  # of cpu_wait: outside every CUDA call
    data_wait_idle_ns: float  # of the sleeps (data and lock wait): with nothing of the thread's queued
    lock_wait_ns: float = 0.0  # asleep for a lock a sibling thread held (not in data_wait_ns)
    sleep_ns: float = 0.0  # asleep on its own timer (not in data_wait_ns)
    output_wait_ns: float = 0.0  # blocked writing its output (not in data_wait_ns)

    @property
    def asleep_ns(self) -> float:
        """Every sleep outside CUDA calls: for data, a lock, its own timer, its output."""
        return self.data_wait_ns + self.lock_wait_ns + self.sleep_ns + self.output_wait_ns


def _own_waits(ctx: Context, pid: int, tid: int) -> list[dict[int, float]]:
    """Per window: the loop's lock wait, its own sleeps and its output wait, the parts of its
    sleeps outside calls that are no wait for data (waits.py; none where waits.build has not run)."""
    if not ctx.con.execute(procs.HAS_TABLE_SQL, {"table": "ing_block"}).fetchone()[0]:
        return [{}, {}, {}]
    return [waits.lock_wait_by_window(ctx.con, pid, tid), waits.own_sleep_by_window(ctx.con, pid),
            waits.output_wait_by_window(ctx.con, pid)]


def _split_sleep(asleep: float, w: int, own: list[dict[int, float]]) -> list[float]:
    """A window's sleeps outside calls as [data wait, lock wait, sleep, output wait]."""
    left, parts = asleep, []
    for by_w in own:
        part = min(left, by_w.get(w, 0.0))
        parts.append(part)
        left -= part
    return [left, *parts]


def window_parts(ctx: Context, pid: int, tid: int, ws: list[int]) -> dict[int, WindowParts]:
    """The loop thread's time per window of ``ws`` by part (the parts of the breakdown, unscaled)."""
    out = {}
    own = _own_waits(ctx, pid, tid)
    for r in ctx.con.execute(PARTS_SQL, {"pid": pid, "tid": tid, "ws": ws}).fetchall():
        wall = float(r[1])
        v = [max(0.0, float(x)) for x in r[2:9]]
        # parts can exceed the wall only through rounding at window edges
        host = max(0.0, wall - sum(v))
        data, lock, sleep, output = _split_sleep(v[0], int(r[0]), own)
        out[int(r[0])] = WindowParts(int(r[0]), wall, data, host, v[1], v[2], v[3], v[4], v[5], v[6],
                                     max(0.0, float(r[9])), max(0.0, float(r[10])), lock, sleep, output)
    return out


def breakdown(ctx: Context, pid: int, tid: int, step_windows: list[int], step_ms: float) -> StepBreakdown | None:
    """The loop thread's time in ``step_windows`` by part, scaled to a step of ``step_ms``."""
    # windows the loop only partly covers (its first and last) would count idle time as host work
    ws = step_windows[1:-1] if len(step_windows) > 2 else step_windows
    rows = ctx.con.execute(PARTS_SQL, {"pid": pid, "tid": tid, "ws": ws}).fetchall()
    # a window with no CUDA call of the loop has no ing_win row: all of it was outside calls (a
    # step's host phase longer than a window); whole, as only the first and last can be partial
    wall = sum(float(r[1]) for r in rows) + float(ctx.window_ns) * (len(set(ws)) - len(rows))
    if not wall:
        return None
    sums = [sum(max(0.0, float(r[i])) for r in rows) for i in range(2, 9)]
    data_wait, launch, copy, sync, other, cpu_wait, faults_io = sums
    known = sum(sums)
    own = _own_waits(ctx, pid, tid)
    split = [_split_sleep(max(0.0, float(r[2])), int(r[0]), own) for r in rows]
    data_wait, lock, sleep, output = (sum(x[i] for x in split) for i in range(4))
    # host work is the remainder; the parts can only exceed the wall through rounding at
    # window edges (an interval split across windows): then they are scaled to it
    host = max(0.0, wall - known)
    scale = step_ms / max(wall, known)
    return StepBreakdown(
        data_wait_ms=data_wait * scale,
        host_ms=host * scale,
        launch_ms=launch * scale,
        copy_ms=copy * scale,
        device_wait_ms=sync * scale,
        other_cuda_ms=other * scale,
        cpu_wait_ms=cpu_wait * scale,
        faults_io_ms=faults_io * scale,
        lock_wait_ms=lock * scale,
        sleep_ms=sleep * scale,
        output_wait_ms=output * scale,
    )
