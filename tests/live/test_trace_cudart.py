"""Live: NVIDIA's real libcudart under `ingero trace` -> exact rows per op.

Without a driver every runtime call returns cudaErrorInsufficientDriver (35)
quickly, but the uprobes fire, so counts, sizes, copy kinds, streams and
return codes can be checked exactly.  Launch streams are read only with
--streams: the first test traces without it, the other two with it.
"""

from __future__ import annotations

import subprocess

import pytest

from workloads import Tracer, build, build_shared, libcudart, query

pytestmark = pytest.mark.live

N = 40
BYTES = 12345
STREAM = 0x5150  # the stream handle cudart_calls passes
CUDA_INSUFFICIENT_DRIVER = 35


@pytest.fixture(scope="module")
def cudart():
    lib = libcudart()
    if lib is None:
        pytest.fail("nvidia-cuda-runtime-cu12 is not installed in this venv (pip install nvidia-cuda-runtime-cu12)")
    return lib


@pytest.fixture(scope="module")
def calls_bin(tmp_path_factory):
    return build("cudart_calls", tmp_path_factory.mktemp("bin"))


def run_calls(calls_bin, cudart, *extra: str) -> tuple[int, int]:
    out = subprocess.run([str(calls_bin), str(cudart), str(N), str(BYTES), *extra],
                         capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert out[0] == "ok" and int(out[4]) == CUDA_INSUFFICIENT_DRIVER
    return int(out[1]), int(out[2])


def test_exactly_n_rows_per_op_with_args_and_return_codes(tmp_path, calls_bin, cudart):
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db)  # daemon mode: the overhead budget is on, and a burst of calls is never sampled
    start = tracer.wait_started()
    assert any(line.startswith("overhead budget 2%: ") for line in start["lines"]), start["lines"]
    pid, _ = run_calls(calls_bin, cudart)  # started after the trace began
    summary = tracer.finish()
    assert query(db, "SELECT count(*) FROM sampling") == [(0,)]

    rows = query(db, """SELECT op, count(*), min(ret), max(ret), count(DISTINCT kind), any_value(kind),
                               min(bytes), max(bytes), min(stream), max(stream)
                        FROM events WHERE pid = $pid AND op LIKE 'cuda%' GROUP BY op ORDER BY op""",
                 {"pid": pid})
    got = {r[0]: r[1:] for r in rows}
    assert {op: v[0] for op, v in got.items()} == {
        "cudaLaunchKernel": N, "cudaMemcpy": N, "cudaMemcpyAsync": N, "cudaStreamSync": N,
        "cudaDeviceSync": N, "cudaMalloc": N, "cudaFree": N,
        "cudaMallocHost": 2 * N,  # cudaMallocHost + cudaHostAlloc: both pinned allocations
    }
    for op, (count, rmin, rmax, *_rest) in got.items():
        assert (rmin, rmax) == (CUDA_INSUFFICIENT_DRIVER, CUDA_INSUFFICIENT_DRIVER), op
    assert got["cudaMemcpy"][3:8] == (1, "H2D", BYTES, BYTES, None)
    assert got["cudaMemcpyAsync"][3:9] == (1, "D2H", BYTES, BYTES, STREAM, STREAM)
    assert got["cudaMalloc"][5:7] == (BYTES, BYTES)
    assert got["cudaMallocHost"][5:7] == (BYTES, BYTES)
    # without --streams a launch's stream is not read (it is in memory): NULL, never 0
    # (min and max are NULL only when every row's stream is)
    assert got["cudaLaunchKernel"][7:9] == (None, None)
    # register arguments are always read
    assert got["cudaStreamSync"][7:9] == (STREAM, STREAM)

    sess = query(db, "SELECT status, events FROM sessions WHERE session_id = $s", {"s": summary["session_id"]})
    stored = query(db, "SELECT count(*) FROM events WHERE session_id = $s", {"s": summary["session_id"]})
    assert sess == [("closed", stored[0][0])] and summary["events"] == stored[0][0]
    # every exported variant was attached, and recorded
    attached = {r[0] for r in query(db, "SELECT symbol FROM probes WHERE attached AND target = $t", {"t": str(cudart)})}
    assert {"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMemcpy_ptds", "cudaMemcpyAsync_ptsz",
            "cudaStreamSynchronize_ptsz"} <= attached
    name = query(db, "SELECT name FROM process_names WHERE pid = $pid", {"pid": pid})
    assert name and "cudart_calls" in name[0][0]


def test_streams_and_calls_from_a_second_thread(tmp_path, calls_bin, cudart):
    """--streams reads each launch's stream; the calls of a second thread carry its tid."""
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--streams")
    tracer.wait_started()
    pid, tid = run_calls(calls_bin, cudart, "thread")
    tracer.finish()
    assert tid != pid
    rows = query(db, "SELECT pid, tid, count(*) FROM events WHERE op = 'cudaMalloc' AND pid = $pid GROUP BY ALL",
                 {"pid": pid})
    assert rows == [(pid, tid, N)]
    # the launch's stream comes from the stack (SysV: the dim3s fill the registers)
    streams = query(db, """SELECT op, count(*), count(stream), min(stream), max(stream) FROM events
                           WHERE pid = $pid AND op IN ('cudaLaunchKernel', 'cudaMemcpyAsync', 'cudaStreamSync')
                           GROUP BY op ORDER BY op""", {"pid": pid})
    assert streams == [(op, N, N, STREAM, STREAM) for op in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSync")]


def test_driver_api_of_an_already_running_pid(tmp_path):
    """--pid on a process started before the trace, driver API (a stand-in libcuda.so.1 via --cuda-lib)."""
    libdir = tmp_path / "lib"
    libdir.mkdir()
    libcuda = build_shared("fake_libcuda", libdir, "libcuda.so.1")
    calls = build("driver_calls", tmp_path)
    work = subprocess.Popen([str(calls), str(libcuda), str(N), str(BYTES)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert work.stdout is not None and work.stdin is not None
        ready = work.stdout.readline().split()
        assert ready[0] == "ready"
        db = tmp_path / "t.duckdb"
        # --streams: cuLaunchKernel's stream is read from stack slot 3
        tracer = Tracer(db, "--pid", str(work.pid), "--cuda-lib", str(libcuda), "--streams")
        tracer.wait_started()
        work.stdin.write("go\n")
        work.stdin.flush()
        assert work.stdout.readline().strip() == "ok"
        work.wait(timeout=30)
        summary = tracer.finish()
    finally:
        if work.poll() is None:
            work.kill()
            work.wait()
    rows = query(db, """SELECT op, count(*), min(ret), max(ret), any_value(kind), min(bytes), max(bytes),
                               min(stream), max(stream)
                        FROM events WHERE pid = $p AND op LIKE 'cu%' GROUP BY op""", {"p": work.pid})
    got = {r[0]: r[1:] for r in rows}
    s = 0x7E57
    assert got == {
        # direct + through _ptsz (whose inner call is nested: no second row); stream from stack slot 3
        "cuLaunchKernel": (2 * N, 100, 100, None, None, None, s, s),
        "cuMemcpy": (N, 100, 100, "H2D", BYTES, BYTES, None, None),
        "cuMemcpyAsync": (N, 100, 100, "D2H", BYTES, BYTES, s, s),
        "cuStreamSynchronize": (N, 100, 100, None, None, None, s, s),
        "cuCtxSynchronize": (N, 100, 100, None, None, None, None, None),
        "cuMemAlloc": (N, 100, 100, None, BYTES, BYTES, None, None),
        "cuMemFree": (N, 100, 100, None, None, None, None, None),
    }
    assert summary["nest_skipped"] >= N
    kinds = query(db, "SELECT DISTINCT probe_kind FROM probes WHERE target = $t AND attached", {"t": str(libcuda)})
    assert {k[0] for k in kinds} == {"uprobe", "uretprobe"}
