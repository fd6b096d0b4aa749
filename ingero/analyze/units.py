"""Numbers as chain text: durations, counts, shares, sizes (one style everywhere)."""

from __future__ import annotations


def ns(value: float | None) -> str:
    """1234 -> '1.2 µs', 7.3e6 -> '7.3 ms', 4.1e10 -> '41.0 s'."""
    if value is None:
        return "n/a"
    v = float(value)
    if v >= 1e9:
        return f"{v / 1e9:.1f} s"
    if v >= 1e6:
        return f"{v / 1e6:.1f} ms"
    if v >= 1e3:
        return f"{v / 1e3:.0f} µs" if v >= 1e5 else f"{v / 1e3:.1f} µs"
    return f"{v:.0f} ns"


def count(value: float | None) -> str:
    return "n/a" if value is None else f"{round(float(value)):,}"


def pct(share: float | None) -> str:
    """0.342 -> '34.2%'."""
    return "n/a" if share is None else f"{100.0 * float(share):.1f}%"


def size(value: float | None) -> str:
    if value is None:
        return "n/a"
    v = float(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


def rate(bytes_: float, ns_: float) -> str:
    """Bytes over nanoseconds as GB/s or MB/s."""
    if ns_ <= 0:
        return "n/a"
    bps = bytes_ / (ns_ / 1e9)
    return f"{bps / 1e9:.1f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.0f} MB/s"


def ratio(a: float, b: float) -> str:
    """How many times a is b: '81x'."""
    if b <= 0:
        return "n/a"
    r = a / b
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"
