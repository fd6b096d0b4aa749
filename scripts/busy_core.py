"""Keep one core partly busy, as issue 16's CI condition asks ("another process keeps one core
50% busy"): work for --work-ms, sleep for --sleep-ms, pinned to --cpu, until killed.

    python3 scripts/busy_core.py &    # then: CI=true bash .ci/run; kill %1
"""

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--work-ms", type=float, default=50.0)
    ap.add_argument("--sleep-ms", type=float, default=50.0)
    a = ap.parse_args()
    os.sched_setaffinity(0, {a.cpu})
    while True:
        end = time.monotonic() + a.work_ms / 1000
        while time.monotonic() < end:
            pass
        time.sleep(a.sleep_ms / 1000)


if __name__ == "__main__":
    main()
