"""gpu-idle: NVML says the GPU idles while the traced job runs (only with NVML samples).

The GPU's own utilisation is the ground truth for "the device waits"; this
rule reports the idle windows and points at the host-side chain found in the
same windows (other rules name the cause).
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain
from ingero.analyze.rules import sizing

ID = "gpu-idle"
# Its effect is measured (NVML utilisation), not inferred: a busy point inferred from the
# calls does not overrule it (explain's device gate).
DEVICE_SIDE = True
TITLE = "GPU idle while the job runs"


@dataclass(frozen=True)
class Thresholds:
    # NVML utilisation is the share of time a kernel ran; a fed training job
    # keeps it above 80%.  Under 50% half of the GPU is wasted.
    idle_util_pct: float = 50.0
    # MEDIUM from this share of active windows idle, HIGH from the second.
    min_window_share: float = 0.3
    high_window_share: float = 0.6


T = Thresholds()

GPU_SQL = "SELECT w, avg(util_pct) FROM ing_gpu GROUP BY w"


def evaluate(con, ctx: Context) -> list[Chain]:
    util = {int(w): float(u) for w, u in con.execute(GPU_SQL).fetchall() if u is not None}
    if not util:
        return []
    chains = []
    for pid, rows in baseline.windows_by_pid(ctx).items():
        k = ctx.derived.kinds.get(pid)
        if k is not None and k.wait_share >= sizing.T.min_request_wait_share:
            continue  # a server waiting for its requests: the sizing verdict says it
        seen = [r for r in rows if int(r["w"]) in util]
        idle = [r for r in seen if util[int(r["w"])] < T.idle_util_pct]
        if not seen or len(idle) < T.min_window_share * len(seen):
            continue
        share = len(idle) / len(seen)
        me = procs.lookup(con, [pid])[pid]
        mean_util = sum(util[int(r["w"])] for r in idle) / len(idle)
        busy = [r for r in seen if util[int(r["w"])] >= T.idle_util_pct]
        corr = baseline.evidence_correlation(
            baseline.Split(evidence=idle, clean=busy, all=seen),
            lambda r: util[int(r["w"])], baseline.ops_rate, expect=+1,
        )
        chains.append(
            Chain(
                rule_id=ID,
                severity="HIGH" if share >= T.high_window_share else "MEDIUM",
                title=TITLE,
                root=[f"GPU utilisation {mean_util:.0f}% in {len(idle)} of {len(seen)} windows while {me.label} ran"],
                effect=[f"{units.pct(share)} of the run the GPU mostly waited for the host"],
                fix=["see the host-side chains in the same windows (input, transfer, launch, contention)"],
                pids=[pid],
                evidence_windows=baseline.evidence_windows(ctx, idle),
                windows_total=len(seen),
                correlation=corr,
                correlation_note="GPU utilisation follows the loop's CUDA ops/s" if corr is not None else "",
                # below any host chain of the same severity: it names no cause
                impact=0.0,
                numbers={"idle_window_share": round(share, 4), "util_pct_idle_windows": round(mean_util, 1)},
            )
        )
    return chains
