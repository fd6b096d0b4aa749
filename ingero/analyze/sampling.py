"""Launch counts from a sampled trace (`ingero trace --overhead-budget`): scaled, and said so.

The ``sampling`` table (schema 12) lists the periods in which the launch
probes were attached for a slice only.  A window's launches then stand for
window / attached time as many: ``scale_launches`` multiplies the launch
rows of ``ing_cuda`` (count and host time) by it, right after they are built
and before anything reads them, so every rule and the evidence see the
estimate.  A window whose launches were never attached keeps its (zero) rows:
no estimate is made from nothing.  Syncs, copies and the tracepoints are
never sampled: their counts and percentiles stay exact; a launch's duration
percentiles come from the attached slices alone (the rows there are whole).
"""

from __future__ import annotations

import numpy as np

from ingero.analyze.context import Context

SAMPLING_SQL = """
SELECT from_ns, to_ns, attached_from_ns, attached_to_ns
FROM sampling
WHERE session_id = $sid AND to_ns > $t0 AND from_ns < $t1
ORDER BY from_ns
"""


def _rows(ctx: Context) -> np.ndarray:
    try:
        rows = ctx.con.execute(SAMPLING_SQL, {"sid": ctx.session_id, "t0": ctx.start_ns, "t1": ctx.end_ns}).fetchall()
    except Exception:  # duckdb.CatalogException: a store older than schema 12 has no sampling table
        return np.empty((0, 4), dtype=np.int64)
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def detached_ns_per_window(rows: np.ndarray, start_ns: int, window_ns: int, n_windows: int) -> np.ndarray:
    """Per window, how long the sampled probes were detached in it (ns)."""
    out = np.zeros(n_windows, dtype=np.float64)
    for f, t, a0, a1 in rows:
        for lo, hi in ((f, a0), (a1, t)):  # the detached parts of the period
            if hi <= lo:
                continue
            w0 = max(0, (lo - start_ns) // window_ns)
            w1 = min(n_windows - 1, (hi - 1 - start_ns) // window_ns)
            for w in range(int(w0), int(w1) + 1):
                ws = start_ns + w * window_ns
                out[w] += max(0, min(hi, ws + window_ns) - max(lo, ws))
    return out


def scale_factors(ctx: Context) -> dict[int, float]:
    """window -> factor (window / attached time) for the windows that were sampled."""
    rows = _rows(ctx)
    if not len(rows):
        return {}
    detached = detached_ns_per_window(rows, ctx.start_ns, ctx.window_ns, ctx.n_windows)
    out = {}
    for w, d in enumerate(detached):
        attached = ctx.window_ns - d
        if d > 0 and attached > 0:
            out[w] = ctx.window_ns / attached
    return out


def scale_launches(ctx: Context) -> None:
    """Scale ing_cuda's launch rows of sampled windows (count and host time) to the whole window."""
    factors = scale_factors(ctx)
    if not factors:
        return
    ctx.con.execute("CREATE OR REPLACE TEMP TABLE ing_sample_f AS SELECT unnest($w) AS w, unnest($f) AS f",
                    {"w": list(factors), "f": list(factors.values())})
    ctx.con.execute("""
        UPDATE ing_cuda SET n = round(ing_cuda.n * s.f)::BIGINT, dur_ns = ing_cuda.dur_ns * s.f
        FROM ing_sample_f s WHERE ing_cuda.cat = 'launch' AND ing_cuda.w = s.w
    """)


def note(ctx: Context) -> str | None:
    """'launch rate estimated from a 12% sample (...)' when any of the analysed span was sampled."""
    rows = _rows(ctx)
    if not len(rows):
        return None
    lo = np.maximum(rows[:, 0], ctx.start_ns)
    hi = np.minimum(rows[:, 1], ctx.end_ns)
    span = float(np.clip(hi - lo, 0, None).sum())
    att = float(np.clip(np.minimum(rows[:, 3], hi) - np.maximum(rows[:, 2], lo), 0, None).sum())
    if span <= 0:
        return None
    pct = 100.0 * att / span
    return (f"launch counts and rates estimated from a {pct:.0f}% sample over {span / 1e9:.0f} s "
            f"(`--overhead-budget`: launch probes attached for a slice of each second); "
            f"syncs, copies and host events were traced in full")
