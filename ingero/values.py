"""The one set of parsers for every value a user or a socket client passes.

Durations, sizes, times, counts and windows arrive as command-line text or as
JSON numbers in a socket request; both go through the functions here, so a
value that the CLI refuses is refused by the tracer's socket with the same
words.  Each returns a value or raises ``BadValue`` (an IngeroError, and a
ValueError for callers that only know that): never another exception.

Refused everywhere: NaN and infinities (NaN compares false with every limit,
so one slipping through lifts it), negatives, zero where it means nothing,
booleans posing as numbers, and values below a physical floor.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from ingero.errors import IngeroError
from ingero.events.units import NS


class BadValue(IngeroError, ValueError):
    """A value that cannot be used: says which and why."""


# Explain's window: the host samples (per-process CPU, memory, GPU and system
# metrics) are taken once a second, so a shorter window holds no sample and a
# share of its wall clock is noise (0.000001 s gave "1812.1% of wall clock").
WINDOW_FLOOR_S = 1.0
# Longer than any trace anyone keeps: 100 years.  Stops 1e308 s overflowing to inf or ns ints.
DURATION_CAP_S = 100 * 365 * 86400.0
# Times: epoch seconds from 1970 to the year 9999 (what datetime can represent).
TIME_CAP_NS = 253402300799 * NS
SIZE_CAP = 1 << 60  # an exabyte: bigger is a typo

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s|d)", re.ASCII)
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)$", re.ASCII)
_SIZE_MULT = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
              "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def _number(value: Any, what: str) -> float | None:
    """A JSON/Python number as float (None when ``value`` is text to parse); bools and other types refused."""
    if isinstance(value, bool):
        raise BadValue(f"bad {what}: {value!r} is not a number")
    if isinstance(value, int):
        return float(value) if abs(value) < 1e300 else math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        # int(), float() and \d take other scripts' digits ('٣' is 3): every value here is ASCII
        if not value.isascii():
            raise BadValue(f"bad {what}: {value!r} holds characters other than ASCII")
        return None
    raise BadValue(f"bad {what}: expected a number or text, got {type(value).__name__}")


def _finite(v: float, text: Any, what: str) -> float:
    if math.isnan(v) or math.isinf(v):
        raise BadValue(f"bad {what}: {text!r} is not a finite number")
    return v


def parse_duration(value: Any, what: str = "duration", *, floor_s: float | None = None,
                   floor_why: str = "", cap_s: float = DURATION_CAP_S) -> float:
    """'90s', '2m', '1h30m', '1.5h', '250ms', a bare number (seconds) or a JSON number -> seconds > 0."""
    v = _number(value, what)
    if v is None:
        s = value.strip().lower()
        if not s:
            raise BadValue(f"bad {what}: empty")
        try:
            v = float(s)
        except ValueError:
            v = 0.0
            pos = 0
            for m in _DURATION_PART.finditer(s):
                if m.start() != pos:
                    break
                v += float(m.group(1)) * _UNIT_S[m.group(2)]
                pos = m.end()
            if pos != len(s) or pos == 0:
                raise BadValue(f"bad {what}: {value!r} is not a duration (try 30s, 2m, 1h30m)") from None
    _finite(v, value, what)
    if v <= 0:
        raise BadValue(f"bad {what}: {value!r} must be positive")
    if floor_s is not None and v < floor_s:
        raise BadValue(f"bad {what}: {value!r} is below the floor of {floor_s:g} s"
                       + (f" ({floor_why})" if floor_why else ""))
    if v > cap_s:
        raise BadValue(f"bad {what}: {value!r} is more than the limit of {cap_s:g} s")
    return v


def parse_window(value: Any, what: str = "window") -> float:
    """An explain window: a duration of at least WINDOW_FLOOR_S."""
    return parse_duration(value, what, floor_s=WINDOW_FLOOR_S,
                          floor_why="host samples are taken once a second; a shorter window holds none")


def parse_size(value: Any, what: str = "size", *, floor: int = 1) -> int:
    """'10GB', '512MiB', '1000' or a JSON integer -> bytes (at least ``floor``)."""
    v = _number(value, what)
    if v is None:
        m = _SIZE.match(value.strip().lower())
        if not m or m.group(2) not in _SIZE_MULT:
            raise BadValue(f"bad {what}: {value!r} is not a size (try 500MB, 10GB)")
        v = float(m.group(1)) * _SIZE_MULT[m.group(2)]
    _finite(v, value, what)
    if v < floor:
        raise BadValue(f"bad {what}: {value!r} is below the minimum of {floor} bytes")
    if v > SIZE_CAP:
        raise BadValue(f"bad {what}: {value!r} is more than {SIZE_CAP} bytes")
    return int(v)


def parse_count(value: Any, what: str = "count", *, minimum: int = 1, cap: int | None = None) -> int:
    """A whole number >= ``minimum`` (and <= ``cap``): an int, an integral float, or decimal text."""
    v = _number(value, what)
    if v is None:
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d{1,19}", text, re.ASCII):
            raise BadValue(f"bad {what}: {value!r} is not a whole number")
        n = int(text)
    else:
        _finite(v, value, what)
        if isinstance(value, float) and not v.is_integer():
            raise BadValue(f"bad {what}: {value!r} is not a whole number")
        n = int(value)
    if n < minimum:
        raise BadValue(f"bad {what}: {value!r} is below the minimum of {minimum}")
    if cap is not None and n > cap:
        raise BadValue(f"bad {what}: {value!r} is more than the limit of {cap}")
    return n


# Epoch seconds as text, up to nanoseconds: read exactly (what `ingero demo --keep-db` prints).
_EPOCH = re.compile(r"\+?(\d{1,12})(?:\.(\d{1,9}))?", re.ASCII)


def parse_time(value: Any, what: str = "time") -> int:
    """'2026-11-22T21:05:00' (local unless it has an offset/Z), epoch seconds (text or number) -> epoch ns."""
    v = _number(value, what)
    if v is None:
        s = value.strip()
        exact = _EPOCH.fullmatch(s)
        if exact:  # to the nanosecond (a float would round 1796184393.116334058 by ~100 ns)
            ns = int(exact.group(1)) * NS + int((exact.group(2) or "").ljust(9, "0"))
            if ns > TIME_CAP_NS:
                raise BadValue(f"bad {what}: {value!r} is outside 1970 .. 9999")
            return ns
        try:
            v = float(s)
        except ValueError:
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
                v = dt.timestamp()
            except (ValueError, OverflowError, OSError):
                raise BadValue(f"bad {what}: {value!r} is not a time "
                               "(try 2026-01-31T14:05:00 or epoch seconds)") from None
    _finite(v, value, what)
    if v < 0 or v * NS > TIME_CAP_NS:
        raise BadValue(f"bad {what}: {value!r} is outside 1970 .. 9999")
    return int(v * NS)


def parse_time_ns(value: Any, what: str = "time") -> int:
    """A time already in epoch ns (the socket's from_ns/to_ns): a whole number in 1970 .. 9999."""
    return parse_count(value, what, minimum=0, cap=TIME_CAP_NS)


def parse_command(value: Any, what: str = "--cmd") -> str:
    """A command line to start: not empty (an empty --cmd would trace every process on the host)."""
    if not isinstance(value, str) or not value.strip():
        raise BadValue(f"bad {what}: empty command", 'pass the command to run, e.g. --cmd "python3 train.py"')
    return value


# The smallest overhead budget that means anything: the switched probes then stay
# attached for collect/budget.MIN_RATIO of each period whatever the budget says.
PERCENT_FLOOR = 0.1


def parse_percent(value: Any, what: str = "percentage") -> float:
    """'2', '2%', '0.5%' or a number in [PERCENT_FLOOR, 100]; 'off' or 0: 0.0 (none)."""
    v = _number(value, what)
    text = value
    if v is None:
        text = value.strip().lower()
        if text == "off":
            return 0.0
        try:
            v = float(text.removesuffix("%").strip())
        except ValueError:
            raise BadValue(f"bad {what}: {value!r} is not a percentage (try 2%, or off)") from None
    _finite(v, value, what)
    if v == 0:
        return 0.0
    if v < PERCENT_FLOOR or v > 100:
        raise BadValue(f"bad {what}: {value!r} is outside {PERCENT_FLOOR}-100%")
    return float(v)
