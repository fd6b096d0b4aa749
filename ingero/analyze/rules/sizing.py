"""sizing: a server whose GPU waits for requests, not for the host: traffic sets the pace.

Physics: a server's loop blocks on its sockets between requests (analyze/kind.py).
When that wait holds most of its wall clock and the device is busy a small share
of it, nothing on the host delays the GPU: no work arrives.  Tuning the host
cannot help; the card is larger than the traffic ("if the GPU is idle because
the workload is too small, right-size the hardware or consolidate traffic").
The verdict is LOW (a fact to size by, never a host chain), with the numbers to
size with: requests/s, GPU time per request, the share of the card used.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analyze import baseline, kind, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain
from ingero.store.selection import Selection

ID = "sizing"
TITLE = "The GPU waits for requests, not for the host: the traffic is smaller than the card"


@dataclass(frozen=True)
class Thresholds:
    # The loop waits for requests at least this share of its wall clock...
    min_request_wait_share: float = 0.5
    # ... and the device is busy at most this share: a served model using under a third of
    # its GPU fits a smaller one, or shares this one.
    max_device_busy_share: float = 0.3


T = Thresholds()

MEM_SQL = f"""
SELECT max(mem_used_bytes), max(mem_total_bytes) FROM gpu_metrics
WHERE {Selection.where(pids=False)}
"""


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    rows_by_pid = baseline.windows_by_pid(ctx)
    for pid, k in ctx.derived.kinds.items():
        if k.kind != kind.SERVER or pid not in rows_by_pid:
            continue
        busy = ctx.device_busy.get(pid)
        if busy is None or k.wait_share < T.min_request_wait_share or busy > T.max_device_busy_share:
            continue
        rows = rows_by_pid[pid]
        wall_s = sum(r["wall_ns"] for r in rows) / 1e9
        rate = k.requests_per_s or 0.0
        gpu_ms = busy * 1e3 / rate if rate else 0.0
        me = procs.lookup(con, [pid])[pid]
        root = [f"{me.label} waited for requests {units.pct(k.wait_share)} of wall clock: {rate:,.1f} requests/s "
                f"over {wall_s:.0f} s",
                f"each request keeps the GPU busy ~{gpu_ms:.2f} ms: the device was busy {units.pct(busy)} "
                f"(the share of the card used)"]
        try:
            used, total = con.execute(MEM_SQL, {"sid": ctx.session_id, "t0": ctx.start_ns,
                                                "t1": ctx.end_ns}).fetchone()
        except Exception:  # an older store without gpu_metrics columns: no memory line
            used, total = None, None
        if used and total:
            root.append(f"GPU memory {units.size(used)} of {units.size(total)} used: "
                        f"{units.size(total - used)} free for another model or replica")
        fix = [f"right-size: at {rate:,.1f} requests/s a GPU (or a MIG slice) about {max(busy, 0.01) * 100:.0f}% "
               "of this one's throughput would keep up",
               "or consolidate: serve more models or replicas on this GPU (MPS, MIG), route more traffic to it",
               "batch requests that arrive together (dynamic batching) to use the card per request better"]
        chains.append(Chain(
            rule_id=ID, severity="LOW", title=TITLE, root=root,
            effect=["nothing on the host delays the GPU: no host chain applies while no work arrives"],
            fix=fix, pids=[pid], evidence_windows=baseline.evidence_windows(ctx, rows), windows_total=len(rows),
            impact=k.wait_share,
            numbers={"requests_per_s": round(rate, 3), "request_wait_share": round(k.wait_share, 4),
                     "device_busy_share": round(busy, 4), "gpu_ms_per_request": round(gpu_ms, 4)},
        ))
    return chains
