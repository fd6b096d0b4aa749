"""Workload for the counted-switches live test: a CUDA thread and a helper thread that makes none.

Usage: counted_helper.py LIBCUDART SLEEPS

Waits for a line on stdin (the tracer is attached by then), makes a few CUDA
calls on the main thread, starts the helper, which sleeps SLEEPS x 1 ms and
then blocks reading a pipe nobody writes (parked: its last switch-out is an
interval that never ends), prints the helper's tid, sleeps 20 x 10 ms on the
main thread and waits on stdin again.
"""

import ctypes
import os
import sys
import threading
import time


def main():
    cudart = ctypes.CDLL(sys.argv[1])
    sleeps = int(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    ptr = ctypes.c_void_p()
    for _ in range(3):
        cudart.cudaMalloc(ctypes.byref(ptr), 1 << 20)
        cudart.cudaStreamSynchronize(None)
    r, _w = os.pipe()
    tid = []
    started = threading.Event()

    def helper():
        tid.append(threading.get_native_id())
        started.set()
        for _ in range(sleeps):
            time.sleep(0.001)
        os.read(r, 1)  # parked until the process exits

    threading.Thread(target=helper, daemon=True).start()
    started.wait()
    print(tid[0], flush=True)
    for _ in range(20):  # switches of a thread that has made CUDA calls: rows
        time.sleep(0.01)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
