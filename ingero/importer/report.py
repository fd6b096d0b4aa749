"""What ``ingero import`` says about each input: lines of text (the command prints them).

Every line goes through ``terminal_safe``: the names in it (the file's, the
devices', the kinds of unused events quoting op and kernel names) come from the
trace, i.e. from whoever wrote it, and must not drive the terminal.
"""

from __future__ import annotations

import re
from typing import Any

UNUSED_SHOWN = 8  # kinds listed by name; the rest are summed on one line
SHOWN_CHARS = 160  # a name from the trace shown in a summary line is cut to this

# C0 controls (ESC, BEL, CR, backspace ...), DEL, C1 controls (CSI 0x9b, OSC 0x9d ...), and the
# line/paragraph separators and bidirectional overrides that reorder what a terminal shows
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown escaped ('\\x1b', '\\x07', '\\u202e'), so a
    string from a trace prints as itself and cannot move the cursor, retitle or clear the terminal."""
    return _UNSAFE.sub(_escape, text)


def _cut(name: str) -> str:
    return name if len(name) <= SHOWN_CHARS else name[:SHOWN_CHARS] + "…"


def summary_lines(result: Any) -> list[str]:
    """A few lines per imported input: session, rows stored, devices, what was not used."""
    return [terminal_safe(line) for line in _lines(result)]


def _lines(r: Any) -> list[str]:
    span = ""
    if r.started_ns is not None and r.ended_ns is not None:
        span = f", {(r.ended_ns - r.started_ns) / 1e9:.3f} s"
    name = _cut(getattr(r, "name", "") or r.path.name)
    lines = []
    if r.joined is not None:
        a = r.joined
        lines.append(f"{name}: attached to traced session {r.session_id} (pid {a.pid}): "
                     f"{a.matched}/{a.trace_calls} calls matched, clock offset {a.offset_ns / 1e3:+.1f} µs, "
                     f"residual median {a.residual_median_ns / 1e3:.1f} µs")
    else:
        lines.append(f"{name}: imported as session {r.session_id}{span}")
    dist = []
    if r.rank is not None:
        dist.append(f"rank {r.rank}")
    if r.world_size is not None:
        dist.append(f"of {r.world_size}")
    devices = ", ".join(_cut(d) for d in sorted(set(r.devices))[:UNUSED_SHOWN]) if r.devices else "no device properties"
    lines.append(f"  {' '.join(dist) or 'no rank'}; {devices}")
    lines.append(f"  {r.calls:,} CUDA calls -> events, {r.device:,} kernels/copies/memsets -> device_activity, "
                 f"{r.spans:,} CPU ops/annotations -> spans")
    live = getattr(r, "device_measured_live", 0)
    if live:
        lines.append(f"  device timeline: kept the one CUPTI measured live in the traced process; "
                     f"the trace's {live:,} kernels/copies/memsets were not stored again")
    if r.calls == 0 and r.device == 0 and not live:
        lines.append("  CPU-only trace: no CUDA calls and no device activity (explain has no GPU side to measure)")
    skipped = getattr(r, "skipped", None)
    if skipped:
        parts = ", ".join(f"{k} {n:,}" for k, n in sorted(skipped.items()))
        n = sum(skipped.values())
        lines.append(f"  bad numbers skipped: {n:,} value{'' if n == 1 else 's'} ({parts})")
    if r.unused:
        total = sum(r.unused.values())
        lines.append(f"  not used: {total:,} events")
        items = list(r.unused.items())
        for kind, n in items[:UNUSED_SHOWN]:
            lines.append(f"    {n:>9,}  {_cut(kind)}")
        rest = items[UNUSED_SHOWN:]
        if rest:
            lines.append(f"    {sum(n for _, n in rest):>9,}  {len(rest)} other kinds "
                         "(all in sessions.import_unused)")
    return lines
