"""A training loop marked with NVIDIA's Python nvtx package, on the simulated CUDA runtime.

    python3 nvtx_steps.py LIBCUDART STEPS LAUNCHES [HOLD_FILE]

Per step: an ``nvtx.annotate("step")`` around a ``forward`` range
(nvtx.push_range / pop_range) and a ``backward`` one (annotate), each making
LAUNCHES cudaLaunchKernel calls, then a cudaDeviceSynchronize inside the
step.  Around all steps an ``epoch`` range (start_range / end_range, ended on
another thread), and one long-named range
(``NAME_LONG``, longer than ingero keeps).  Last, ``unclosed`` is pushed and
never popped: the process exits inside it; or, given HOLD_FILE, creates that
file and sleeps inside it until killed (the tracer is stopped meanwhile).
Prints ``ok <pid>`` on stderr.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import nvtx

NAME_LONG = "x" * 30 + "_a_very_long_range_name_past_sixty_four_bytes_" + "y" * 20


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    steps, launches = int(sys.argv[2]), int(sys.argv[3])
    p = ctypes.c_void_p
    lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(p), ctypes.c_size_t, p]
    lib.simcudaSetKernelUs(10)
    one = Dim3(1, 1, 1)

    def launch(n: int) -> None:
        for _ in range(n):
            rc = lib.cudaLaunchKernel(p(0x1000), one, one, None, 0, None)
            assert rc == 0, rc

    epoch = nvtx.start_range("epoch")
    for _ in range(steps):
        with nvtx.annotate("step"):
            nvtx.push_range("forward")
            launch(launches)
            nvtx.pop_range()
            with nvtx.annotate("backward"):
                launch(launches)
            assert lib.cudaDeviceSynchronize() == 0
    ender = threading.Thread(target=nvtx.end_range, args=(epoch,))  # a range may end on another thread
    ender.start()
    ender.join()
    with nvtx.annotate(NAME_LONG):
        pass
    print(f"ok {os.getpid()}", file=sys.stderr, flush=True)
    nvtx.push_range("unclosed")
    if len(sys.argv) > 4:
        open(sys.argv[4], "w").close()
        while True:  # inside 'unclosed' until killed: its span ends where the trace stopped
            time.sleep(1)
    os._exit(0)  # inside 'unclosed': its span ends at this exit


if __name__ == "__main__":
    main()
