"""Workload for the CLI test of --stack: libcudart calls from known lines.

Usage: stack_cuda_loop.py LIBCUDART STEPS (a count, not a time: a busy box slows the loop, not the
test).  Prints the line numbers used (JSON).
"""

import ctypes
import json
import sys
import time


def step(cudart, ptr):
    cudart.cudaMalloc(ctypes.byref(ptr), 1 << 20)  # MALLOC_LINE
    cudart.cudaStreamSynchronize(None)  # SYNC_LINE


def main():
    cudart = ctypes.CDLL(sys.argv[1])
    ptr = ctypes.c_void_p()
    for _ in range(int(sys.argv[2])):
        step(cudart, ptr)  # STEP_LINE
        time.sleep(0.002)
    lines = {}
    with open(__file__) as f:
        for no, text in enumerate(f, 1):
            for tag in ("MALLOC_LINE", "SYNC_LINE", "STEP_LINE"):
                if text.rstrip().endswith("# " + tag):
                    lines[tag] = no
    print(json.dumps(lines), flush=True)


if __name__ == "__main__":
    main()
