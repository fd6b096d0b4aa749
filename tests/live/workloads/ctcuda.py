"""The CUDA runtime calls the wait-shape workloads make, bound with ctypes.

What a user without PyTorch writes to drive libcudart.so.12: a kernel
launch, copies, stream syncs.  With the simulated runtime
(demos/build/libcudart.so.12) a kernel's duration is its first argument,
in microseconds (`simcudaTimedKernel`); with any other libcudart the
launch is made all the same (and fails without a GPU, which the caller
sees as a non-zero return).

ctypes.CDLL releases the GIL around every foreign call, as PyTorch's
bindings do around a CUDA call that can block: a thread waiting in a sync
leaves the interpreter to the process' other threads, and takes the GIL
back when the call returns.

Used by the workloads in this directory as a top-level module (each runs as
a script: its directory is on sys.path).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_LIB = REPO / "demos" / "build" / "libcudart.so.12"

H2D, D2H = 1, 2
SCHEDULE_SPIN, SCHEDULE_YIELD, SCHEDULE_BLOCKING_SYNC = 1, 2, 4
PR_SET_NAME = 15


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class CudaError(RuntimeError):
    pass


class Cuda:
    """One process' handle on libcudart: launches, copies, syncs."""

    def __init__(self, path: str | os.PathLike = DEFAULT_LIB):
        lib = self.lib = ctypes.CDLL(str(path))
        p, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.cudaLaunchKernel.argtypes = [p, Dim3, Dim3, ctypes.POINTER(ctypes.c_void_p), sz, p]
        lib.cudaMemcpy.argtypes = [p, p, sz, i]
        lib.cudaMemcpyAsync.argtypes = [p, p, sz, i, p]
        lib.cudaStreamSynchronize.argtypes = [p]
        lib.cudaStreamCreate.argtypes = [ctypes.POINTER(p)]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(p), sz]
        lib.cudaMallocHost.argtypes = [ctypes.POINTER(p), sz]
        lib.cudaSetDeviceFlags.argtypes = [ctypes.c_uint]
        for name in ("simcudaDeviceBusyNs", "simcudaUptimeNs"):
            if hasattr(lib, name):
                getattr(lib, name).restype = ctypes.c_uint64
        kernel = getattr(lib, "simcudaTimedKernel", None)
        self._kernel = ctypes.cast(kernel, p) if kernel is not None else p()
        self._grid, self._block = Dim3(128, 1, 1), Dim3(256, 1, 1)
        # per thread: its kernel argument (its launches are its own) and its call counts
        self._here = threading.local()

    def _check(self, rc: int, op: str) -> None:
        counts = self.counts()
        counts[op] = counts.get(op, 0) + 1
        if rc != 0:
            raise CudaError(f"{op} returned {rc}")

    def counts(self) -> dict[str, int]:
        """The calling thread's calls so far, by ingero's op name (events.op); a call ingero
        does not trace (cudaStreamCreate, cudaSetDeviceFlags) by its symbol."""
        c = getattr(self._here, "counts", None)
        if c is None:
            c = self._here.counts = {}
        return c

    def set_device_flags(self, flags: int) -> None:
        self._check(self.lib.cudaSetDeviceFlags(flags), "cudaSetDeviceFlags")

    def stream(self) -> ctypes.c_void_p:
        s = ctypes.c_void_p()
        self._check(self.lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        return s

    def malloc(self, nbytes: int) -> ctypes.c_void_p:
        d = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(d), nbytes), "cudaMalloc")
        return d

    def malloc_host(self, nbytes: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        self._check(self.lib.cudaMallocHost(ctypes.byref(h), nbytes), "cudaMallocHost")
        return h

    def launch(self, us: int, stream=None) -> None:
        """One kernel of ``us`` microseconds on ``stream`` (None: the legacy default stream)."""
        slot = getattr(self._here, "arg", None)
        if slot is None:
            value = ctypes.c_uint32(0)
            slot = self._here.arg = (value, (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(value), ctypes.c_void_p)))
        slot[0].value = us
        self._check(self.lib.cudaLaunchKernel(self._kernel, self._grid, self._block, slot[1], 0, stream),
                    "cudaLaunchKernel")

    def copy(self, dst, src, nbytes: int, kind: int) -> None:
        self._check(self.lib.cudaMemcpy(dst, src, nbytes, kind), "cudaMemcpy")

    def copy_async(self, dst, src, nbytes: int, kind: int, stream=None) -> None:
        self._check(self.lib.cudaMemcpyAsync(dst, src, nbytes, kind, stream), "cudaMemcpyAsync")

    def sync(self, stream=None) -> None:
        self._check(self.lib.cudaStreamSynchronize(stream), "cudaStreamSync")

    def device_sync(self) -> None:
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSync")

    def device_busy_ns(self) -> int | None:
        """The simulated device's compute-engine busy time so far (None: not the simulated runtime)."""
        f = getattr(self.lib, "simcudaDeviceBusyNs", None)
        return int(f()) if f is not None else None


def name_this_thread(name: str) -> None:
    """Set the calling thread's kernel name (/proc/PID/task/TID/comm, 15 bytes).

    Python 3.11's threading.Thread(name=...) does not: the OS thread stays
    'python3' (3.14 sets it).  A tool that names threads reads comm.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME)")


def thread_comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
