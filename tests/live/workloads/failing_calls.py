"""Exact numbers of CUDA runtime calls through ctypes, some or all of them failing.

    python3 failing_calls.py LIBCUDART LAUNCHES SYNC_EVERY BAD_PER_LAUNCH [KERNEL_US]

Makes LAUNCHES cudaLaunchKernel calls on the default stream and one
cudaStreamSynchronize(0) after every SYNC_EVERY of them; after each launch, BAD_PER_LAUNCH
more launches pass a stream handle no runtime knows (the simulated runtime returns
cudaErrorInvalidResourceHandle, 400).  NVIDIA's libcudart without a driver fails every
call with cudaErrorInsufficientDriver (35).  On the simulated runtime KERNEL_US sets the
kernels' length (simcudaSetKernelUs).  Prints one JSON line on stdout: pid, tid and the
calls made per (op, return code), so a test compares what the trace counted with what was
called.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from collections import Counter


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


BAD_STREAM = 0x7777  # no stream of the simulated runtime has this handle


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    launches, sync_every, bad_per_launch = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    p = ctypes.c_void_p
    lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(p), ctypes.c_size_t, p]
    lib.cudaLaunchKernel.restype = ctypes.c_int
    lib.cudaStreamSynchronize.argtypes = [p]
    lib.cudaStreamSynchronize.restype = ctypes.c_int
    if len(sys.argv) > 5 and hasattr(lib, "simcudaSetKernelUs"):
        lib.simcudaSetKernelUs(int(sys.argv[5]))
    one = Dim3(1, 1, 1)
    launch, sync = lib.cudaLaunchKernel, lib.cudaStreamSynchronize
    func, good, bad = p(0x1000), p(0), p(BAD_STREAM)
    rets: Counter = Counter()
    for i in range(1, launches + 1):
        rets["cudaLaunchKernel", launch(func, one, one, None, 0, good)] += 1
        for _ in range(bad_per_launch):
            rets["cudaLaunchKernel", launch(func, one, one, None, 0, bad)] += 1
        if i % sync_every == 0:
            rets["cudaStreamSync", sync(good)] += 1
    print(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id(),
                      "calls": [[op, rc, n] for (op, rc), n in sorted(rets.items())]}), flush=True)


if __name__ == "__main__":
    main()
