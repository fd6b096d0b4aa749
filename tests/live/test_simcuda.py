"""The simulated CUDA runtime (demos/build/libcudart.so.12): timing model and symbol parity.

Timing assertions take the best of a few repetitions, because the machine
is shared (2 cores): a run can only be slowed down by other load, never sped
up, so the minimum is the model's number plus the least noise.
"""

from __future__ import annotations

import glob
import subprocess
import sys
from pathlib import Path

import pytest

from ingero.collect import probes

pytestmark = pytest.mark.live

REPS = 3


def _run(code: str, lib: Path) -> str:
    """Each measurement in a fresh process: the library's device state starts empty."""
    prelude = f"""
import ctypes, time
L = ctypes.CDLL({str(lib)!r})
class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
P = ctypes.c_void_p
L.cudaLaunchKernel.argtypes = [P, Dim3, Dim3, ctypes.POINTER(P), ctypes.c_size_t, P]
L.cudaMemcpy.argtypes = [P, P, ctypes.c_size_t, ctypes.c_int]
L.cudaMemcpyAsync.argtypes = [P, P, ctypes.c_size_t, ctypes.c_int, P]
L.cudaMalloc.argtypes = [ctypes.POINTER(P), ctypes.c_size_t]
L.cudaMallocHost.argtypes = [ctypes.POINTER(P), ctypes.c_size_t]
L.simcudaDeviceBusyNs.restype = ctypes.c_uint64
L.simcudaCopyBusyNs.restype = ctypes.c_uint64
L.simcudaUptimeNs.restype = ctypes.c_uint64
G = Dim3(1, 1, 1)
"""
    out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_library_identity(simcuda):
    soname = subprocess.run(["readelf", "-d", str(simcuda)], capture_output=True, text=True).stdout
    assert "Library soname: [libcudart.so.12]" in soname


def test_sync_blocks_for_the_queued_kernel_time(simcuda):
    # 20 kernels of 2 ms queue 40 ms of device work; launches return at once
    # (5 us of launch overhead each), the sync waits for the rest.
    code = """
L.simcudaSetKernelUs(2000)
t0 = time.perf_counter()
for _ in range(20):
    assert L.cudaLaunchKernel(None, G, G, None, 0, None) == 0
t1 = time.perf_counter()
assert L.cudaDeviceSynchronize() == 0
t2 = time.perf_counter()
print(t1 - t0, t2 - t0, L.simcudaDeviceBusyNs())
"""
    results = [tuple(float(x) for x in _run(code, simcuda).split()) for _ in range(REPS)]
    launch_s = min(r[0] for r in results)
    total_s = min(r[1] for r in results)
    busy_ns = {int(r[2]) for r in results}
    assert launch_s < 0.010  # 20 launches, async: far below the 40 ms of work
    assert 0.040 <= total_s < 0.040 * 1.25
    assert busy_ns == {40_000_000}  # exactly the queued kernel time


def test_timed_kernel_takes_its_duration_from_args(simcuda):
    code = """
us = ctypes.c_uint32(7000)
args = (P * 1)(ctypes.cast(ctypes.pointer(us), P))
fn = ctypes.cast(L.simcudaTimedKernel, P)
t0 = time.perf_counter()
L.cudaLaunchKernel(fn, G, G, args, 0, None)
L.cudaStreamSynchronize(None)
print(time.perf_counter() - t0, L.simcudaDeviceBusyNs())
"""
    results = [tuple(float(x) for x in _run(code, simcuda).split()) for _ in range(REPS)]
    assert 0.007 <= min(r[0] for r in results) < 0.007 * 1.5
    assert {int(r[1]) for r in results} == {7_000_000}


def test_pageable_copy_is_slower_than_pinned_and_synchronous(simcuda):
    code = """
n = 64 << 20
dev = P(); L.cudaMalloc(ctypes.byref(dev), n)
pageable = ctypes.create_string_buffer(n)
pinned = P(); assert L.cudaMallocHost(ctypes.byref(pinned), n) == 0
t = time.perf_counter(); L.cudaMemcpy(dev, pageable, n, 1); pg = time.perf_counter() - t
t = time.perf_counter(); L.cudaMemcpy(dev, pinned, n, 1); pn = time.perf_counter() - t
t = time.perf_counter(); L.cudaMemcpyAsync(dev, pageable, n, 1, None); pg_async = time.perf_counter() - t
t = time.perf_counter(); L.cudaMemcpyAsync(dev, pinned, n, 1, None); pn_async = time.perf_counter() - t
L.cudaDeviceSynchronize()
print(pg, pn, pg_async, pn_async)
"""
    results = [tuple(float(x) for x in _run(code, simcuda).split()) for _ in range(REPS)]
    pageable = min(r[0] for r in results)
    pinned = min(r[1] for r in results)
    pageable_async = min(r[2] for r in results)
    pinned_async = min(r[3] for r in results)
    # pinned: 64 MiB at 12 GB/s = 5.6 ms of DMA
    assert 0.0055 <= pinned < 0.0055 * 1.5
    # pageable: staged on the caller in 32 chunks of 2 MiB, each a host memcpy then its own DMA
    # with its own 8 us set-up, one after another; what the host memcpy adds is this machine's
    # memory bandwidth (1.47-1.88x pinned here: a 1.5x margin failed 3 of 12 runs on a quiet
    # box), so the test holds the model's part: the 31 extra set-ups
    extra_setups = 31 * 8e-6
    assert pageable > pinned + extra_setups
    # pageable cudaMemcpyAsync is staged on the caller: as slow as the sync copy
    assert pageable_async > pinned + extra_setups
    # pinned cudaMemcpyAsync only queues the DMA
    assert pinned_async < 0.001


def test_streams_events_and_errors(simcuda):
    code = """
s = P(); assert L.cudaStreamCreate(ctypes.byref(s)) == 0
e0, e1 = P(), P()
assert L.cudaEventCreate(ctypes.byref(e0)) == 0 and L.cudaEventCreate(ctypes.byref(e1)) == 0
L.cudaEventRecord.argtypes = [P, P]
# a long kernel first: e0, the timed kernel and e1 then follow it back to back on the device's
# timeline, whatever the host was doing (preempted) between the calls
L.simcudaSetKernelUs(200000)
L.cudaLaunchKernel(None, G, G, None, 0, s)
L.simcudaSetKernelUs(3000)
L.cudaEventRecord(e0, s)
L.cudaLaunchKernel(None, G, G, None, 0, s)
L.cudaEventRecord(e1, s)
L.cudaEventSynchronize.argtypes = [P]
assert L.cudaEventSynchronize(e1) == 0
ms = ctypes.c_float()
L.cudaEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), P, P]
assert L.cudaEventElapsedTime(ctypes.byref(ms), e0, e1) == 0
bad = L.cudaSetDevice(3)
print(round(ms.value, 3), bad, L.cudaGetLastError(), L.cudaGetLastError())
n = ctypes.c_int(); L.cudaGetDeviceCount(ctypes.byref(n)); print(n.value)
"""
    first, second = _run(code, simcuda).splitlines()
    elapsed, bad, err1, err2 = first.split()
    # queued behind the long kernel: e0 completes as it ends, the timed kernel runs right after
    assert float(elapsed) == 3.0
    assert (bad, err1, err2) == ("101", "101", "0")  # cudaErrorInvalidDevice, then cleared
    assert second == "1"


def test_busy_time_is_a_utilisation(simcuda):
    # 50% duty cycle: 2 ms kernel, then 2 ms of host sleep, 25 times
    code = """
L.simcudaSetKernelUs(2000)
b0, u0 = L.simcudaDeviceBusyNs(), L.simcudaUptimeNs()
for _ in range(25):
    L.cudaLaunchKernel(None, G, G, None, 0, None)
    L.cudaDeviceSynchronize()
    time.sleep(0.002)
print((L.simcudaDeviceBusyNs() - b0) / (L.simcudaUptimeNs() - u0))
"""
    shares = [float(_run(code, simcuda)) for _ in range(REPS)]
    assert 0.25 < max(shares) <= 0.5


def test_every_probed_runtime_symbol_nvidia_exports_is_exported_by_ours(simcuda):
    """Our library is a drop-in for what the tracer attaches to on NVIDIA's libcudart."""
    from elftools.elf.elffile import ELFFile

    matches = glob.glob(str(Path(sys.prefix) / "lib" / "python3*" / "site-packages" / "nvidia" /
                            "cuda_runtime" / "lib" / "libcudart.so.12"))
    if not matches:
        pytest.fail("NVIDIA's libcudart.so.12 is not installed: pip install nvidia-cuda-runtime-cu12")

    def exported(path: str) -> set[str]:
        with open(path, "rb") as f:
            sym = ELFFile(f).get_section_by_name(".dynsym")
            return {s.name for s in sym.iter_symbols()
                    if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["type"] == "STT_FUNC"}

    nvidia = exported(matches[0])
    ours = exported(str(simcuda))
    wanted = set()
    for probe in probes.CUDA_PROBES:
        if probe.library == probes.RUNTIME:
            wanted.update(probes.variants(probe.symbol, nvidia))
    assert wanted, "no probed runtime symbol found in NVIDIA's library"
    assert sorted(wanted - ours) == []


def test_timeline_holds_each_operation_and_a_staged_copy_as_one(simcuda, tmp_path):
    """SIMCUDA_TIMELINE ("%p": the pid): a line per kernel and per copy, a pageable copy's 2 MiB
    chunks written as one copy from the first chunk's start to the last one's end."""
    code = """
import os
L.simcudaSetKernelUs(100)
for _ in range(3):
    assert L.cudaLaunchKernel(None, G, G, None, 0, None) == 0
dev = P()
assert L.cudaMalloc(ctypes.byref(dev), 5 << 20) == 0
host = ctypes.create_string_buffer(5 << 20)
assert L.cudaMemcpy(dev, host, 5 << 20, 1) == 0
print(os.getpid())
"""
    import os

    os.environ["SIMCUDA_TIMELINE"] = str(tmp_path / "tl-%p.txt")
    try:
        pid = _run(code, simcuda).strip()
    finally:
        del os.environ["SIMCUDA_TIMELINE"]
    rows = [tuple(int(x) for x in ln.split()) for ln in (tmp_path / f"tl-{pid}.txt").read_text().splitlines()]
    assert [r[0] for r in rows] == [0, 0, 0, 1]
    assert all(b - a == 100_000 for _, a, b in rows[:3])
    # 5 MiB at 12 GB/s in three chunks, each with 8 us of DMA set-up: at least 461 us, one line
    assert rows[3][2] - rows[3][1] >= (5 << 20) / 12 + 3 * 8_000
