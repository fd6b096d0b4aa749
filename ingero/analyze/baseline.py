"""Baselines and time alignment, from the same run (never a fixed constant).

Rules split a process' active windows into *evidence* windows (the cause is
present) and *clean* windows (it is not); the effect is the change of a
metric between the two, and the correlation of cause and effect across all
windows says how strongly they move together.  When no window is clean the
cause was present throughout: rules then state the time it cost directly
(e.g. seconds spent waiting for a CPU) instead of a before/after ratio.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Culprit, Window

Row = dict[str, Any]

WIN_ROWS_SQL = "SELECT * FROM ing_win ORDER BY pid, w"
LOOP_SQL = "SELECT pid, tid, cuda_n FROM ing_loop ORDER BY cuda_n DESC"

# A window is "clean" for a cause when the cause's share of wall clock is
# below this fraction of the rule's firing threshold: half-way windows are
# neither evidence nor baseline, so a noisy boundary does not blur both sides.
CLEAN_FRACTION_OF_THRESHOLD = 0.5

# Windows before a process' first launch or sync are start-up and are left
# out (skip_startup).  The first and last remaining active window hold the
# rest of its start-up (first batch, warm-up) and teardown, and only part of a window of
# work: with at least this many active windows they are left out, so rates
# and shares describe the steady state.
TRIM_EDGES_FROM_WINDOWS = 5

# Fewest clean windows for a before/after comparison to mean anything.
MIN_CLEAN_WINDOWS = 2

# Fewest evidence windows for a chain: one odd window (start-up, a GC pause)
# is not a pattern.  At least 2, and at least this share of active windows.
MIN_EVIDENCE_WINDOWS = 2
MIN_EVIDENCE_SHARE = 0.1


@dataclass
class Split:
    evidence: list[Row]
    clean: list[Row]
    all: list[Row]

    @property
    def has_baseline(self) -> bool:
        return len(self.clean) >= MIN_CLEAN_WINDOWS


def windows_by_pid(ctx: Context) -> dict[int, list[Row]]:
    """ing_win rows grouped per CUDA process, in window order (cached on ctx)."""
    cached = ctx.derived.win_rows
    if cached is not None:
        return cached
    cur = ctx.con.execute(WIN_ROWS_SQL)
    cols = [d[0] for d in cur.description]
    out: dict[int, list[Row]] = {}
    for values in cur.fetchall():
        row = dict(zip(cols, values))
        for k, v in row.items():
            if v is None and k not in ("pid", "w"):
                row[k] = 0.0
        out.setdefault(int(row["pid"]), []).append(row)
    for pid, rows in out.items():
        rows = skip_startup(rows)
        if len(rows) >= TRIM_EDGES_FROM_WINDOWS:
            rows = rows[1:-1]
        out[pid] = rows
    ctx.derived.win_rows = out
    return out


def skip_startup(rows: list[Row]) -> list[Row]:
    """The rows from the process' first window with a kernel launch or a sync on.

    Before it the process only initialises (imports, cudaMalloc, loading
    data, first-touch page faults): no training loop runs yet, so its faults
    and waits are no slowdown.  A process that never launches nor syncs
    keeps all its rows (there is no loop to tell apart).
    """
    for i, r in enumerate(rows):
        if r["launch_n"] or r["sync_n"]:
            return rows[i:]
    return rows


def loop_threads(ctx: Context) -> dict[int, int]:
    """pid -> tid of its loop thread (the one making most CUDA calls)."""
    return {int(p): int(t) for p, t, _ in ctx.con.execute(LOOP_SQL).fetchall()}


def split(rows: list[Row], share: Callable[[Row], float], threshold: float,
          also: Callable[[Row], bool] | None = None) -> Split:
    """Evidence: share >= threshold (and ``also``).  Clean: the other windows whose share is
    under half the threshold, or no higher than the run's quietest quarter (a run whose
    baseline carries a little of the cause still has a baseline)."""
    ev = [r for r in rows if share(r) >= threshold and (also is None or also(r))]
    if len(ev) < max(MIN_EVIDENCE_WINDOWS, MIN_EVIDENCE_SHARE * len(rows)):
        ev = []
    shares = sorted(share(r) for r in rows)
    quiet = shares[len(shares) // 4] if shares else 0.0
    limit = max(threshold * CLEAN_FRACTION_OF_THRESHOLD, quiet)
    in_ev = {id(r) for r in ev}
    clean = [r for r in rows if id(r) not in in_ev and share(r) <= limit and share(r) < threshold]
    return Split(ev, clean, rows)


def median(values: Sequence[float]) -> float:
    vals = [float(v) for v in values if v is not None]
    return float(statistics.median(vals)) if vals else 0.0


def mean_share(rows: list[Row], key: str) -> float:
    """Sum of ``key`` over the rows' wall clock: the share of time over those windows."""
    wall = sum(r["wall_ns"] for r in rows)
    return sum(r[key] for r in rows) / wall if wall else 0.0


def ops_rate(row: Row) -> float:
    """CUDA calls per second of the loop thread: the loop's throughput proxy."""
    return row["ops_n"] / (row["wall_ns"] / 1e9) if row["wall_ns"] else 0.0


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation; None when fewer than 3 points or a side is constant."""
    if len(xs) < 3:
        return None
    # statistics, not numpy: explain imports no numpy (~0.09 s of every run)
    x = [float(v) for v in xs]
    y = [float(v) for v in ys]
    if min(x) == max(x) or min(y) == max(y):
        return None
    try:
        r = statistics.correlation(x, y)
    except statistics.StatisticsError:
        return None
    return None if math.isnan(r) else round(r, 2)


def evidence_correlation(s: Split, cause: Callable[[Row], float], effect: Callable[[Row], float],
                         expect: int = -1) -> float | None:
    """Correlation of cause and effect across the split's windows, kept only when it is evidence.

    Without clean windows the cause is present throughout: its share then
    varies only by noise, and a correlation over it is no evidence of
    anything (None).  A correlation of the wrong sign (``expect``: -1 when the
    effect metric falls as the cause grows, +1 when it rises) contradicts the
    chain and is not printed as support either (None).
    """
    if not s.has_baseline:
        return None
    r = correlation([cause(r) for r in s.all], [effect(r) for r in s.all])
    if r is None or r * expect <= 0:
        return None
    return r


def least_affected(rows: list[Row], share: Callable[[Row], float]) -> tuple[list[Row], list[Row]]:
    """(least, most): the quarter of windows where the cause's share is lowest and the quarter
    where it is highest (at least one window each; empty lists with fewer than 4 windows)."""
    if len(rows) < 4:
        return [], []
    ranked = sorted(rows, key=share)
    q = len(ranked) // 4
    return ranked[:q], ranked[-q:]


# In a run without clean windows, the least- and most-affected quarters are
# compared only when the cause's share differs between them by at least this
# much of wall clock (a smaller spread is window-to-window noise) ...
MIN_QUARTILE_SHARE_GAP = 0.10
# ... and the call rate falls by at least this much (a healthy run's rate
# varies ~5-10% between windows).
MIN_QUARTILE_DROP = 0.15


def quartile_contrast(rows: list[Row], share: Callable[[Row], float], what: str) -> str | None:
    """Without clean windows: the call rate in the least- vs the most-affected quarter of windows,
    as one effect line ("CUDA ops/s 231 in the quarter of windows with the least <what> (41.2%) vs
    13 in the most (60.8%): down 94.2%"), or None when the quarters do not differ enough."""
    least, most = least_affected(rows, share)
    if not least or not most:
        return None
    lo_share = sum(share(r) * r["wall_ns"] for r in least) / (sum(r["wall_ns"] for r in least) or 1)
    hi_share = sum(share(r) * r["wall_ns"] for r in most) / (sum(r["wall_ns"] for r in most) or 1)
    lo_rate = median([ops_rate(r) for r in least])
    hi_rate = median([ops_rate(r) for r in most])
    if hi_share - lo_share < MIN_QUARTILE_SHARE_GAP or lo_rate <= 0 or 1 - hi_rate / lo_rate < MIN_QUARTILE_DROP:
        return None
    return (
        f"CUDA ops/s {hi_rate:,.0f} in the quarter of windows with the most {what} ({hi_share * 100:.1f}%) "
        f"vs {lo_rate:,.0f} in the quarter with the least ({lo_share * 100:.1f}%): "
        f"down {(1 - hi_rate / lo_rate) * 100:.1f}%"
    )


def throughput(s: Split) -> tuple[float, float, float]:
    """(clean ops/s, evidence ops/s, drop 0-1) using window medians; drop 0 without baseline."""
    ev = median([ops_rate(r) for r in s.evidence])
    if not s.has_baseline:
        return 0.0, ev, 0.0
    base = median([ops_rate(r) for r in s.clean])
    drop = 1.0 - ev / base if base > 0 else 0.0
    return base, ev, drop


def evidence_windows(ctx: Context, rows: list[Row]) -> list[Window]:
    return [Window(*ctx.window_bounds(int(r["w"]))) for r in rows]


def chain(rule_id: str, title: str, ctx: Context, pid: int, s: Split, *, severity: str, root: list[str],
          effect: list[str], fix: list[str], impact: float, numbers: dict[str, float],
          contributing: Sequence[str] = (), culprits: Sequence[Culprit] = (),
          corr: float | None = None, corr_note: str = "") -> Chain:
    """The chain of rule ``rule_id`` for process ``pid`` from its split windows: the tail every
    rule that splits its windows (cpu-contention, input-bound, io-stall, memory-pressure,
    transfer-bound) shares.

    ``impact`` is the share of the evidence windows' wall clock the cause took:
    explain turns it into the share of the whole run every chain is ranked by.
    ``corr_note`` says what was correlated; it is kept only with a correlation.
    """
    return Chain(
        rule_id=rule_id,
        severity=severity,
        title=title,
        root=root,
        effect=effect,
        contributing=list(contributing),
        fix=fix,
        pids=[pid],
        culprits=list(culprits),
        evidence_windows=evidence_windows(ctx, s.evidence),
        windows_total=len(s.all),
        correlation=corr,
        correlation_note=corr_note if corr is not None else "",
        impact=impact,
        numbers=numbers,
    )


# Per-window p99 of each op (from ing_cuda), summarised over evidence and
# clean windows by their median: "the typical window's p99", with no
# second pass over the events.
OP_P99_SQL = """
SELECT op,
       median(p99_ns) FILTER (list_contains($ev, w)) AS ev_p99,
       median(p99_ns) FILTER (list_contains($clean, w)) AS clean_p99,
       sum(n) FILTER (list_contains($ev, w)) AS ev_n
FROM ing_cuda
WHERE pid = $pid AND tid = $tid AND list_contains($ops, op) AND p99_ns IS NOT NULL
GROUP BY op ORDER BY ev_n DESC NULLS LAST
"""


def op_p99(ctx: Context, pid: int, tid: int, ops: Sequence[str], s: Split) -> list[tuple[str, float, float]]:
    """(op, clean p99 ns, evidence p99 ns) of the loop thread's calls (median of window p99s), busiest first."""
    if not s.evidence:
        return []
    p = {
        "pid": pid,
        "tid": tid,
        "ops": list(ops),
        "ev": [int(r["w"]) for r in s.evidence],
        "clean": [int(r["w"]) for r in s.clean] or [-1],
    }
    rows = ctx.con.execute(OP_P99_SQL, p).fetchall()
    return [(op, float(c or 0.0), float(e or 0.0)) for op, e, c, n in rows if n]
