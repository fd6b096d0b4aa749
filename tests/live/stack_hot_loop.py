"""Workload for the preemption test: spins on one known line for SECONDS.

Usage: stack_hot_loop.py SECONDS.  Prints the line number of the hot loop
(as JSON) at the end.
"""

import json
import sys
import time


def spin(seconds):
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end: n += 1  # HOT_LINE  # noqa: E701
    return n


def main():
    spin(float(sys.argv[1]))
    with open(__file__) as f:
        hot = next(no for no, text in enumerate(f, 1) if "# HOT_LINE" in text and "while" in text)
    print(json.dumps({"HOT_LINE": hot}), flush=True)


if __name__ == "__main__":
    main()
