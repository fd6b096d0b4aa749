"""Live: CUDA programs as nvcc builds them, with the runtime shared, linked in, and linked in + stripped.

workloads/cuda_loop.cu is built at test time with the toolkit's nvcc (CUDA
13, /usr/local/cuda*/bin/nvcc) against CUDA 13's runtime and against CUDA 12's
from NVIDIA's nvidia-cuda-runtime-cu12 wheel (which ships libcudart_static.a
too).  Without a driver every call returns 35, but the probes fire: counts,
sizes, copy kinds, streams and return codes are checked exactly.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import workloads
from workloads import HERE, INGERO, REPO, Tracer, libcudart, query, wait_for

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

N = 200
BYTES = 1024  # cuda_loop.cu: 256 floats each way
CUDA_INSUFFICIENT_DRIVER = 35


def find_nvcc() -> str | None:
    """$NVCC, nvcc on PATH, else the newest /usr/local/cuda*/bin/nvcc (as scripts/setup.sh looks)."""
    found = os.environ.get("NVCC") or shutil.which("nvcc")
    if found:
        return found
    versions = sorted(glob.glob("/usr/local/cuda*/bin/nvcc"),
                      key=lambda p: [int(x) for x in re.findall(r"\d+", p)] or [0])
    return versions[-1] if versions else None


def _missing(what: str) -> None:
    """Under CI a machine without the toolkit fails these tests, saying what is missing; locally they skip."""
    if os.environ.get("CI"):
        pytest.fail(f"CI requires {what}", pytrace=False)
    pytest.skip(what)


@pytest.fixture(scope="session")
def builds(tmp_path_factory) -> dict[str, Path]:
    """cuda_loop.cu built every way, once per test session."""
    nvcc = find_nvcc()
    if nvcc is None:
        _missing("the CUDA toolkit's nvcc (not on PATH nor in /usr/local/cuda*/bin): install the CUDA toolkit")
    cu12 = libcudart()
    if cu12 is None or not (cu12.parent / "libcudart_static.a").exists():
        _missing("CUDA 12's runtime (pip install nvidia-cuda-runtime-cu12: libcudart.so.12, libcudart_static.a)")
    out = tmp_path_factory.mktemp("cuda_loop")
    src = str(HERE / "cuda_loop.cu")
    lib12 = str(cu12.parent)
    recipes = {
        "shared13": ["-cudart", "shared"],
        "static13": [],  # nvcc's default: -cudart static
        "shared12": ["-cudart", "none", f"-L{lib12}", "-l:libcudart.so.12", f"-Xlinker=-rpath={lib12}"],
        "static12": ["-cudart", "none", f"{lib12}/libcudart_static.a", "-ldl", "-lrt", "-lpthread"],
    }
    bins = {}
    for name, flags in recipes.items():
        bins[name] = out / f"cuda_loop_{name}"
        proc = subprocess.run([nvcc, "-o", str(bins[name]), src, *flags], capture_output=True, text=True)
        assert proc.returncode == 0, f"nvcc {name}: {proc.stderr}"
    bins["stripped13"] = out / "cuda_loop_stripped13"
    shutil.copy(bins["static13"], bins["stripped13"])
    subprocess.run(["strip", str(bins["stripped13"])], check=True)
    return bins


def _ran(stderr: str) -> int:
    """The pid a cuda_loop run printed ("ok PID RET"), checking its cudaMalloc got 35."""
    m = re.search(r"^ok (\d+) (\d+)$", stderr, re.M)
    assert m, stderr
    assert int(m.group(2)) == CUDA_INSUFFICIENT_DRIVER
    return int(m.group(1))


def _cuda_rows(db: Path, pid: int) -> dict[str, tuple]:
    rows = query(db, """SELECT op, count(*), min(ret), max(ret), min(bytes), max(bytes), count(DISTINCT kind),
                               any_value(kind), min(stream), max(stream)
                        FROM events WHERE pid = $pid AND op LIKE 'cuda%' GROUP BY op""", {"pid": pid})
    return {r[0]: r[1:] for r in rows}


def _assert_exact(got: dict[str, tuple], label: str = "") -> None:
    """N rows per op of the loop, one cudaMalloc; sizes, kinds, streams; every call returned 35."""
    ret = (CUDA_INSUFFICIENT_DRIVER, CUDA_INSUFFICIENT_DRIVER)
    assert (label, got) == (label, {
        "cudaMalloc": (1, *ret, BYTES, BYTES, 0, None, None, None),
        "cudaMemcpy": (N, *ret, BYTES, BYTES, 1, "H2D", None, None),
        "cudaLaunchKernel": (N, *ret, None, None, 0, None, None, None),  # the stream only with --streams
        "cudaStreamSync": (N, *ret, None, None, 0, None, 0, 0),
    })


def _trace_cmd(tmp_path: Path, exe: Path) -> tuple[Tracer, dict, dict, int]:
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--duration", "90s", "--cmd", f"{exe} {N}")
    start = tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert summary["ended_by"] == "command exited"
    return tracer, start, summary, _ran(tracer.stderr)


@pytest.mark.parametrize("build", ["shared13", "static13"])
def test_shared_and_linked_in_runtime_give_exact_rows(tmp_path, builds, build):
    tracer, start, _, pid = _trace_cmd(tmp_path, builds[build])
    _assert_exact(_cuda_rows(tmp_path / "t.duckdb", pid))
    if build == "static13":
        exe = str(builds[build].resolve())
        assert any(line.startswith("attached ")
                   and line.endswith(f"{exe} (runtime, linked in) before the command started")
                   for line in start["lines"]), start["lines"]
        attached = query(tmp_path / "t.duckdb", "SELECT symbol, probe_kind FROM probes WHERE target = $t AND attached",
                         {"t": exe})
        assert ("cudaLaunchKernel", "uprobe") in attached and ("cudaStreamSynchronize", "uretprobe") in attached
    assert query(tmp_path / "t.duckdb", "SELECT notes FROM sessions") == [(None,)]


def test_stripped_linked_in_runtime_gives_no_rows_and_says_why_once(tmp_path, builds):
    tracer, start, summary, pid = _trace_cmd(tmp_path, builds["stripped13"])
    assert _cuda_rows(tmp_path / "t.duckdb", pid) == {}
    exe = str(builds["stripped13"].resolve())
    said = [line for line in start["lines"] if "linked in without symbols" in line]
    assert len(said) == 1, start["lines"]
    assert said[0].startswith(f"{exe} (the --cmd program) has the CUDA runtime linked in without symbols")
    assert "nvcc -cudart shared" in said[0]
    later = [n for t in tracer.ticks() for n in t.get("notes", [])] + summary.get("notes", [])
    assert not [n for n in later if "without symbols" in n], later  # once
    assert query(tmp_path / "t.duckdb", "SELECT notes FROM sessions") == [(said[0],)]


def test_linked_in_runtime_started_after_the_trace_and_cuda_12_beside_13(tmp_path, builds):
    """Default mode (every process calling CUDA): programs started after the trace began are picked up,
    CUDA 12 and 13, shared and linked in, side by side in one trace."""
    db, go = tmp_path / "t.duckdb", tmp_path / "go"
    tracer = Tracer(db, "--duration", "120s")
    tracer.wait_started()
    names = ("static13", "static12", "shared12", "shared13")
    procs = {n: subprocess.Popen([str(builds[n]), str(N), str(go)], stdout=subprocess.PIPE, text=True)
             for n in names}
    try:
        linked = {f"{builds[n].resolve()} (runtime, linked in)" for n in ("static13", "static12")}

        def attached() -> bool:
            notes = {n for t in tracer.ticks() for n in t.get("notes", [])}
            return all(any(f" to {want}" in n for n in notes) for want in linked)

        assert wait_for(attached, timeout=workloads.START_TIMEOUT_S), [t.get("notes") for t in tracer.ticks()]
        go.touch()
        pids = {}
        for n, p in procs.items():
            out, _ = p.communicate(timeout=60)
            pids[n] = _ran(out)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    tracer.finish()
    for n in names:
        _assert_exact(_cuda_rows(db, pids[n]), n)


def test_check_pid_says_what_a_process_has_linked_in(tmp_path, builds):
    go = tmp_path / "go"
    procs = {n: subprocess.Popen([str(builds[n]), "1", str(go)], stdout=subprocess.PIPE, text=True)
             for n in ("stripped13", "static13")}
    try:
        out = {}
        for n, p in procs.items():
            run = subprocess.run([*INGERO, "check", "--json", "--pid", str(p.pid)], capture_output=True, text=True,
                                 cwd=REPO, timeout=workloads.TRACED_RUN_TIMEOUT_S)
            checks = {c["name"]: c for c in json.loads(run.stdout)["checks"]}
            out[n] = checks[f"process {p.pid}"]
    finally:
        go.touch()
        for p in procs.values():
            p.communicate(timeout=30)
    exe = builds["stripped13"].resolve()
    stripped = out["stripped13"]
    assert not stripped["ok"] and not stripped["required"]
    assert stripped["detail"] == (f"{exe} (pid {procs['stripped13'].pid}, cuda_loop_strip) has the CUDA runtime "
                                  "linked in without symbols: its CUDA calls cannot be probed and are not recorded; "
                                  "fix: build "
                                  "it with `nvcc -cudart shared`, or keep its symbols (do not strip it)")
    static = out["static13"]
    assert static["ok"]
    assert static["detail"].startswith(f"{builds['static13'].resolve()}  runtime linked in (probed by address)  ")
