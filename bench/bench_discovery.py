"""Cost of finding CUDA libraries: the static search and the once-a-second /proc watcher.

The tracer polls LibraryWatcher every second for the whole run, so its steady
cost is paid continuously; this measures it with ~300 processes on the host.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

from ingero.collect import libs

EXTRA_PROCESSES = 250  # plus what the machine runs: ~300 processes in all


def main() -> None:
    t = time.perf_counter()
    found = libs.find_cuda_libraries()
    cold = time.perf_counter() - t
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        libs.find_cuda_libraries()
        warm.append(time.perf_counter() - t)
    kids = [subprocess.Popen(["sleep", "300"]) for _ in range(EXTRA_PROCESSES)]
    try:
        time.sleep(0.5)
        nproc = sum(1 for p in os.listdir("/proc") if p.isdigit())
        w = libs.LibraryWatcher()
        t = time.perf_counter()
        w.poll()
        first = time.perf_counter() - t
        steady = []
        for _ in range(20):
            t = time.perf_counter()
            w.poll()
            steady.append(time.perf_counter() - t)
    finally:
        for k in kids:
            k.kill()
        for k in kids:
            k.wait()
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| find_cuda_libraries, first call | {cold * 1e3:.1f} ms ({len(found)} copies) |")
    print(f"| find_cuda_libraries, later calls (median of 5) | {statistics.median(warm) * 1e3:.1f} ms |")
    print(f"| LibraryWatcher.poll, first ({nproc} processes) | {first * 1e3:.1f} ms |")
    print(f"| LibraryWatcher.poll, steady (median / max of 20) | {statistics.median(steady) * 1e3:.2f} / "
          f"{max(steady) * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
