"""An inference server on the simulated CUDA runtime, and its client in another process.

    python3 server_loop.py LIBCUDART MODE SECONDS

The server listens on 127.0.0.1, accepts one connection and answers each request: it
prepares the request on the CPU, copies it in, runs KERNELS kernels, copies the answer
back and sends it.  The client (a forked process: another program on the host would do
the same) sends requests for SECONDS.  MODE:

- ``low``: a request every 40 ms, 12 kernels of 50 µs: the GPU waits for traffic;
- ``tokenize``: requests back to back, each tokenised in Python for ~6 ms first;
- ``batched``: requests back to back, 12 kernels of 2 ms each (the GPU sets the pace).

At exit the server prints its truth as one JSON line: requests served, CPU seconds
spent preparing them.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import time

MODES = {  # mode -> (kernel µs, prepare seconds of CPU, client pause s)
    "low": (50, 0.0, 0.04),
    "tokenize": (50, 0.006, 0.0),
    "batched": (2000, 0.0, 0.0),
}
KERNELS = 12


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def tokenize(req: bytes, seconds: float) -> int:
    """Pure-Python work for ``seconds`` of CPU, as a slow tokenizer's."""
    end, n = time.thread_time() + seconds, 0
    while time.thread_time() < end:
        n += sum(hash(req[i:i + 4]) & 1 for i in range(0, len(req), 4))
    return n


def client(port: int, seconds: float, pause: float) -> None:
    c = socket.create_connection(("127.0.0.1", port))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        c.sendall(b"q" * 512)
        c.recv(64)
        if pause:
            time.sleep(pause)
    c.close()


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    kernel_us, prepare_s, pause = MODES[sys.argv[2]]
    seconds = float(sys.argv[3])
    p = ctypes.c_void_p
    lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(p), ctypes.c_size_t, p]
    lib.cudaMemcpy.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int]
    lib.cudaMalloc.argtypes = [ctypes.POINTER(p), ctypes.c_size_t]
    lib.simcudaSetKernelUs(kernel_us)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    if os.fork() == 0:
        client(port, seconds, pause)
        os._exit(0)
    conn, _ = srv.accept()
    dev, host, one = p(), ctypes.create_string_buffer(1 << 16), Dim3(1, 1, 1)
    assert lib.cudaMalloc(ctypes.byref(dev), 1 << 20) == 0
    served, cpu = 0, 0.0
    while True:
        req = conn.recv(4096)
        if not req:
            break
        if prepare_s:
            t = time.thread_time()
            tokenize(req, prepare_s)
            cpu += time.thread_time() - t
        assert lib.cudaMemcpy(dev, host, 4096, 1) == 0
        for _ in range(KERNELS):
            assert lib.cudaLaunchKernel(p(0x1000), one, one, None, 0, None) == 0
        assert lib.cudaMemcpy(host, dev, 64, 2) == 0
        conn.sendall(b"a" * 64)
        served += 1
    os.wait()
    print(json.dumps({"requests": served, "prepare_cpu_s": round(cpu, 3)}), flush=True)


if __name__ == "__main__":
    main()
