"""What ``ingero import`` says about each file: lines of text (the command prints them)."""

from __future__ import annotations

from typing import Any

UNUSED_SHOWN = 8  # kinds listed by name; the rest are summed on one line


def summary_lines(result: Any) -> list[str]:
    """A few lines per imported file: session, rows stored, devices, what was not used."""
    r = result
    span = ""
    if r.started_ns is not None and r.ended_ns is not None:
        span = f", {(r.ended_ns - r.started_ns) / 1e9:.3f} s"
    where = f"session {r.session_id}"
    lines = []
    if r.joined is not None:
        a = r.joined
        lines.append(f"{r.path.name}: attached to traced session {r.session_id} (pid {a.pid}): "
                     f"{a.matched}/{a.trace_calls} calls matched, clock offset {a.offset_ns / 1e3:+.1f} µs, "
                     f"residual median {a.residual_median_ns / 1e3:.1f} µs")
    else:
        lines.append(f"{r.path.name}: imported as {where}{span}")
    dist = []
    if r.rank is not None:
        dist.append(f"rank {r.rank}")
    if r.world_size is not None:
        dist.append(f"of {r.world_size}")
    devices = ", ".join(sorted(set(r.devices))) if r.devices else "no device properties"
    lines.append(f"  {' '.join(dist) or 'no rank'}; {devices}")
    lines.append(f"  {r.calls:,} CUDA calls -> events, {r.device:,} kernels/copies/memsets -> device_activity, "
                 f"{r.spans:,} CPU ops/annotations -> spans")
    if r.calls == 0 and r.device == 0:
        lines.append("  CPU-only trace: no CUDA calls and no device activity (explain has no GPU side to measure)")
    if r.unused:
        total = sum(r.unused.values())
        lines.append(f"  not used: {total:,} events")
        items = list(r.unused.items())
        for kind, n in items[:UNUSED_SHOWN]:
            lines.append(f"    {n:>9,}  {kind}")
        rest = items[UNUSED_SHOWN:]
        if rest:
            lines.append(f"    {sum(n for _, n in rest):>9,}  {len(rest)} other kinds "
                         "(all in sessions.import_unused)")
    return lines
