"""Time units: every timestamp and duration ingero stores is an integer count of nanoseconds.

The constants are nanoseconds per unit, so ``2 * MS`` is two milliseconds in ns
and ``duration_ns / NS`` is seconds.
"""

from __future__ import annotations

NS = 1_000_000_000  # ns per second (the name every module used for it)
MS = 1_000_000  # ns per millisecond
US = 1_000  # ns per microsecond
