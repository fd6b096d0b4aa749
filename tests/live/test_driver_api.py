"""Live: the driver API entry points JIT runtimes (Triton, CuPy, JAX) call, on a stand-in libcuda.

No machine here has a driver, and the CUDA 13 toolkit ships no libcuda stub,
so a stand-in exports the real names and signatures (CUlaunchConfig's hStream
at offset 32).  What this shows: each probed entry point gives exactly one row
per call with its op, bytes, copy kind, stream and return code.  What it
cannot show: that a real libcuda reaches these exported symbols when a
runtime gets its function pointers through cuGetProcAddress (CUDA 12+), and
the calls' real durations.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import workloads
from workloads import Tracer, query

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

N = 50
BYTES = 4096
STREAM = 0x5150
RET = 999  # every stand-in call returns this

FAKE_LIBCUDA = r"""
#include <stddef.h>
#define API __attribute__((visibility("default"), noinline))
typedef unsigned long long dptr;
typedef struct { unsigned grid[3], block[3], shmem; unsigned pad; void *hStream; void *attrs; unsigned n; }
    CUlaunchConfig;
API int cuInit(unsigned f) { (void)f; return 999; }
API int cuDriverGetVersion(int *v) { if (v) *v = 13000; return 999; }
API int cuLaunchKernelEx(const CUlaunchConfig *c, void *f, void **p, void **e) {
    (void)c; (void)f; (void)p; (void)e; return 999; }
API int cuMemcpy(dptr d, dptr s, size_t n) { (void)d; (void)s; (void)n; return 999; }
API int cuMemcpyAsync(dptr d, dptr s, size_t n, void *st) { (void)d; (void)s; (void)n; (void)st; return 999; }
API int cuMemcpyDtoH_v2(void *d, dptr s, size_t n) { (void)d; (void)s; (void)n; return 999; }
API int cuMemcpyDtoD_v2(dptr d, dptr s, size_t n) { (void)d; (void)s; (void)n; return 999; }
API int cuMemcpyHtoDAsync_v2(dptr d, const void *s, size_t n, void *st) {
    (void)d; (void)s; (void)n; (void)st; return 999; }
API int cuMemcpyDtoDAsync_v2(dptr d, dptr s, size_t n, void *st) { (void)d; (void)s; (void)n; (void)st; return 999; }
API int cuGraphLaunch(void *g, void *st) { (void)g; (void)st; return 999; }
"""

CALLER = r"""
import ctypes as C, os, sys
lib = C.CDLL(sys.argv[1])
n, size, stream = int(sys.argv[2]), C.c_size_t(int(sys.argv[3])), C.c_void_p(int(sys.argv[4]))
cfg = (C.c_uint64 * 8)()
cfg[4] = stream.value  # CUlaunchConfig.hStream, offset 32
buf = C.create_string_buffer(int(sys.argv[3]))
d, s = C.c_uint64(0x1000), C.c_uint64(0x2000)
for _ in range(n):
    lib.cuLaunchKernelEx(cfg, None, None, None)
    lib.cuMemcpy(d, s, size)
    lib.cuMemcpyAsync(d, s, size, stream)
    lib.cuMemcpyDtoH_v2(buf, s, size)
    lib.cuMemcpyDtoD_v2(d, s, size)
    lib.cuMemcpyHtoDAsync_v2(d, buf, size, stream)
    lib.cuMemcpyDtoDAsync_v2(d, s, size, stream)
    lib.cuGraphLaunch(C.c_void_p(1), stream)
print("ok", os.getpid(), file=sys.stderr)
"""


def test_jit_driver_entry_points_give_one_row_per_call(tmp_path: Path) -> None:
    (tmp_path / "fake.c").write_text(FAKE_LIBCUDA)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    (tmp_path / "caller.py").write_text(CALLER)
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--cuda-lib", str(lib), "--duration", "90s",
                    "--cmd", f"{sys.executable} {tmp_path / 'caller.py'} {lib} {N} {BYTES} {STREAM}")
    tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert summary["ended_by"] == "command exited", tracer.stderr
    pid = int(next(line.split()[1] for line in tracer.stderr.splitlines() if line.startswith("ok ")))
    rows = query(db, """SELECT op, coalesce(kind, '-'), count(*), min(ret), max(ret), min(bytes), max(bytes),
                               min(stream), max(stream)
                        FROM events WHERE pid = $pid AND op LIKE 'cu%' GROUP BY ALL ORDER BY ALL""", {"pid": pid})
    ret = (RET, RET)
    assert rows == sorted([
        ("cuLaunchKernel", "-", N, *ret, None, None, None, None),  # stream only with --streams
        ("cuMemcpy", "D2D", N, *ret, BYTES, BYTES, None, None),
        ("cuMemcpy", "D2H", N, *ret, BYTES, BYTES, None, None),
        ("cuMemcpy", "default", N, *ret, BYTES, BYTES, None, None),
        ("cuMemcpyAsync", "D2D", N, *ret, BYTES, BYTES, STREAM, STREAM),
        ("cuMemcpyAsync", "H2D", N, *ret, BYTES, BYTES, STREAM, STREAM),
        ("cuMemcpyAsync", "default", N, *ret, BYTES, BYTES, STREAM, STREAM),
        ("cuGraphLaunch", "-", N, *ret, None, None, STREAM, STREAM),  # the stream is passed in a register
    ])
