"""Workload for the --stack live tests: calls NVIDIA's libcudart from known lines.

Usage: stack_workload.py LIBCUDART N
Prints "ready" once libcudart is loaded, waits for a line on stdin, then makes
N cudaMalloc calls from alloc_loop() and one cudaDeviceSynchronize from
main(), prints the line numbers it used (as JSON) so the test never
hard-codes them, and exits on the next line of stdin.
"""

import ctypes
import json
import sys


def alloc_loop(cudart, n):
    ptr = ctypes.c_void_p()
    for _ in range(n):
        cudart.cudaMalloc(ctypes.byref(ptr), 1024)  # MALLOC_LINE
    return n


def main():
    cudart = ctypes.CDLL(sys.argv[1])
    n = int(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    alloc_loop(cudart, n)  # LOOP_CALL_LINE
    cudart.cudaDeviceSynchronize()  # SYNC_LINE
    lines = {}
    with open(__file__) as f:
        for no, text in enumerate(f, 1):
            for tag in ("MALLOC_LINE", "LOOP_CALL_LINE", "SYNC_LINE"):
                if text.rstrip().endswith("# " + tag):
                    lines[tag] = no
    print(json.dumps(lines), flush=True)
    # Stay alive until the test has resolved the stacks: code objects are
    # read from this process's memory.
    sys.stdin.readline()


if __name__ == "__main__":
    main()
