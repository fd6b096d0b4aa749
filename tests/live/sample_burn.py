"""Workload for the CPU sampler test: burns CPU in burn() on one known line, then sleeps.

Usage: sample_burn.py CPU_SECONDS.  burn() runs until the thread has used
CPU_SECONDS of CPU (not wall time: a loaded box stretches it), then the
thread sleeps 1 s (no sample may land there: it is off CPU).  Prints the
line numbers as JSON at the end.
"""

import json
import sys
import time


def burn(cpu_seconds):
    n = 0
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end: n += 1  # BURN_LINE  # noqa: E701
    return n


def main():
    burn(float(sys.argv[1]))
    time.sleep(1.0)  # SLEEP_LINE
    with open(__file__) as f:
        text = list(enumerate(f, 1))
    lines = {tag: next(no for no, t in text if f"# {tag}" in t and "no, t" not in t)
             for tag in ("BURN_LINE", "SLEEP_LINE")}
    print(json.dumps(lines), flush=True)


if __name__ == "__main__":
    main()
