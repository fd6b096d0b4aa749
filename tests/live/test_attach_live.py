"""Live: every call from the first one, whenever and however the CUDA code arrives.

* A real nvcc program (the default static runtime: cudaMalloc, then N x
  {cudaMemcpy, a kernel, cudaStreamSynchronize}; ~0.5 s for N = 700 under
  the trace, ~0.2 s for 200, every call failing fast without a driver) under
  ``trace --cmd``, started directly, through ``env`` (its probes go in
  before the command starts: prelaunch.py) and by a shell that runs two of
  them (each is held at its exec until its probes are in: holds.py).
* A 2-rank data-parallel job on the simulated NCCL whose ranks dlopen their
  libcudart and libnccl (copies nothing on the host had mapped) after the
  trace began, in the default mode: every collective from the first.
* A program started before the trace (``--pid``): every call from the attach
  on, no gap, and a note that says what the trace could not see before.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import prereqs
import workloads
from workloads import HERE, REPO, Tracer, build, libcudart, query, simcuda, wait_for

pytestmark = [pytest.mark.live, pytest.mark.exact]  # counts rows, times nothing

CUDA_INSUFFICIENT_DRIVER = 35
BYTES = 1024  # cuda_loop.cu: 256 floats each way
TRAIN = REPO / "demos" / "workloads" / "train.py"
STEPS = 400


@pytest.fixture(scope="module")
def static_k(tmp_path_factory) -> Path:
    """workloads/cuda_loop.cu as nvcc builds it by default (-cudart static)."""
    from test_static_runtime import find_nvcc

    nvcc = find_nvcc()
    if nvcc is None:
        prereqs.missing("the CUDA toolkit's nvcc", "install the CUDA toolkit (/usr/local/cuda*/bin/nvcc)")
    out = tmp_path_factory.mktemp("static") / "k"
    run = subprocess.run([nvcc, "-o", str(out), str(HERE / "cuda_loop.cu")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return out


def _runs(stderr: str) -> dict[int, int]:
    """pid -> cudaMalloc's return code, from each cuda_loop run's "ok PID RET" line."""
    return {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^ok (\d+) (\d+)$", stderr, re.M)}


def _cuda_rows(db: Path, pid: int) -> dict[str, tuple]:
    rows = query(db, """SELECT op, count(*), min(ret), max(ret), min(bytes), max(bytes)
                        FROM events WHERE pid = $pid AND op LIKE 'cuda%' GROUP BY op""", {"pid": pid})
    return {r[0]: r[1:] for r in rows}


def _exact(n: int) -> dict[str, tuple]:
    ret = (CUDA_INSUFFICIENT_DRIVER, CUDA_INSUFFICIENT_DRIVER)
    return {"cudaMalloc": (1, *ret, BYTES, BYTES), "cudaMemcpy": (n, *ret, BYTES, BYTES),
            "cudaLaunchKernel": (n, *ret, None, None), "cudaStreamSync": (n, *ret, None, None)}


@pytest.mark.parametrize("shape", ["direct", "env", "shell"])
def test_a_short_static_program_gets_every_call_however_it_is_started(tmp_path, static_k, shape) -> None:
    exe = str(static_k)
    cmd, ns, how = {
        "direct": (f"{exe} 700", [700], "before the command started"),
        "env": (f"env K=1 {exe} 200", [200], "before the command started"),
        # not one simple command: the shell forks and execs each, unseen before it runs
        "shell": (f"sh -c '{exe} 700; {exe} 200; true'", [700, 200], "held"),
    }[shape]
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--duration", "120s", "--cmd", cmd)
    start = tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert summary["ended_by"] == "command exited", tracer.stderr
    runs = _runs(tracer.stderr)
    assert list(runs.values()) == [CUDA_INSUFFICIENT_DRIVER] * len(ns), tracer.stderr
    for pid, n in zip(runs, ns):
        assert (pid, _cuda_rows(db, pid)) == (pid, _exact(n))
    attached = f"attached 19 functions (38 probes) to {static_k.resolve()} (runtime, linked in)"
    lines = start["lines"] + [n for t in tracer.ticks() for n in t.get("notes", [])] + summary["notes"]
    said = [line for line in lines if line.startswith(attached)]
    assert len(said) == 1, lines
    if how == "held":
        first = next(iter(runs))
        assert re.fullmatch(rf"{re.escape(attached)} while pid {first} was held at its exec of {re.escape(exe)} "
                            r"\(\d+\.\d ms\), before its first call", said[0]), said
    else:
        assert said[0] == f"{attached} {how}", said
    assert said[0] in start["lines"] or how == "held"


def test_a_two_rank_job_that_dlopens_nccl_after_the_trace_began_gets_every_collective(tmp_path) -> None:
    built = simcuda()
    libdir = tmp_path / "job-libs"  # copies no process had mapped: found only when a rank opens them
    libdir.mkdir()
    cudart = Path(shutil.copy(built, libdir / "libcudart.so.12"))
    nccl = Path(shutil.copy(built.parent / "libnccl.so.2", libdir / "libnccl.so.2"))
    db, summary = tmp_path / "t.duckdb", tmp_path / "job.json"
    tracer = Tracer(db, "--duration", "180s")  # the default mode: every process that maps CUDA
    start = tracer.wait_started()
    assert not any(str(libdir) in line for line in start["lines"]), start["lines"]
    job = subprocess.run([sys.executable, str(TRAIN), "--lib", str(cudart), "--nccl", str(nccl), "--ranks", "2",
                          "--rank-cpus", "0,1", "--workers", "0", "--kernel-us", "200", "--kernels-per-step", "2",
                          "--host-us", "100", "--grad-bytes", "1MiB", "--batch-bytes", "64KiB",
                          "--steps", str(STEPS), "--summary-json", str(summary)],
                         capture_output=True, text=True, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert job.returncode == 0, job.stderr
    done = tracer.finish()
    pids = [r["pid"] for r in json.loads(summary.read_text())["per_rank"]]
    rows = query(db, """SELECT pid, op, count(*) FROM events
                        WHERE list_contains($p, pid) AND op IN ('ncclAllReduce', 'ncclCommInitRank', 'cudaStreamSync')
                        GROUP BY ALL ORDER BY ALL""", {"p": pids})
    assert rows == sorted((p, op, n) for p in pids
                          for op, n in (("ncclAllReduce", STEPS), ("ncclCommInitRank", 1), ("cudaStreamSync", STEPS)))
    notes = [n for t in tracer.ticks() for n in t.get("notes", [])] + done["notes"]
    for lib, kind, probes in ((nccl, "nccl", "16 functions (32 probes)"),
                              (cudart, "runtime", "19 functions (38 probes)")):
        pattern = (rf"attached {re.escape(probes)} to {re.escape(str(lib))} \({kind}\) "
                   rf"while pid ({'|'.join(map(str, pids))}) "
                   rf"was held at its mapping of {re.escape(str(lib))} \(\d+\.\d ms\), before its first call")
        assert sum(bool(re.fullmatch(pattern, n)) for n in notes) == 1, (pattern, "\n".join(notes))


def test_a_process_started_before_the_trace_gets_every_call_from_the_attach_on(tmp_path) -> None:
    lib = libcudart()
    exe = build("counted_calls", tmp_path)
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    proc = subprocess.Popen([str(exe), str(lib), str(ready), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for(ready.exists, timeout=60), "counted_calls never reached its 1000th call"
        db = tmp_path / "t.duckdb"
        tracer = Tracer(db, "--duration", "180s", "--pid", str(proc.pid))
        start = tracer.wait_started()
        assert wait_for(lambda: len(tracer.ticks()) >= 2, timeout=60)  # a couple of seconds traced
        stop.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        stop.touch()
        if proc.poll() is None:
            proc.kill()
    tracer.finish()
    pid, last = (int(x) for x in re.fullmatch(r"ok (\d+) (\d+)\n", out).groups())
    assert pid == proc.pid
    [(count, first, final)] = query(db, """SELECT count(*), min(bytes), max(bytes) FROM events
                                           WHERE pid = $pid AND op = 'cudaMemcpy'""", {"pid": pid})
    # every call from the first one recorded to the last one made: no gap
    assert (final, count) == (last, last - first + 1)
    assert first > 1000  # the calls before the attach are not there, as the note says
    said = [line for line in start["lines"] if line.startswith(f"pid {pid} ('counted_calls') had been running ")]
    assert len(said) == 1, start["lines"]
    assert re.fullmatch(rf"pid {pid} \('counted_calls'\) had been running \d+\.\d s when the trace attached, with "
                        rf"{re.escape(lib.name)} already mapped: its CUDA calls before the attach are not recorded "
                        r"\(from the attach on, every call is\)", said[0]), said
    [(notes,)] = query(db, "SELECT notes FROM sessions")
    assert said[0] in notes.split("\n")
    mapped = [line for line in start["lines"] if line.startswith(f"attached 19 functions (38 probes) to {lib} ")]
    assert mapped == [f"attached 19 functions (38 probes) to {lib} (runtime), mapped by pid {pid} before the trace: "
                      "its calls before now are not recorded"], start["lines"]


def test_a_job_of_an_interactive_shell_is_attached_at_once_and_never_stopped(tmp_path) -> None:
    """A job started at an interactive shell's prompt (here bash -i on a pty) must not be stopped: its
    shell would see the stop, print "Stopped" and take the terminal back.  It is attached at once instead."""
    import os
    import pty
    import select
    import time

    lib = Path(shutil.copy(libcudart(), tmp_path / "libcudart.so.12"))  # a copy no process had mapped
    exe = build("counted_calls", tmp_path)
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--duration", "180s")
    tracer.wait_started()
    pid, fd = pty.fork()
    if pid == 0:  # the child: an interactive shell on the pty, its controlling terminal
        os.execvp("bash", ["bash", "--norc", "--noprofile", "-i"])
    out = b""
    try:
        shown = len(tracer.ticks())
        assert wait_for(lambda: len(tracer.ticks()) >= shown + 2, timeout=60)  # the shells are listed once a second
        os.write(fd, f"{exe} {lib} {ready} {stop}; echo done-$?\n".encode())
        end = time.monotonic() + 120
        while b"done-0" not in out and time.monotonic() < end:
            if ready.exists() and not stop.exists():
                time.sleep(2)  # a second of calls, and the attach line
                stop.touch()
            if select.select([fd], [], [], 1.0)[0]:
                out += os.read(fd, 4096)
        os.write(fd, b"exit\n")
    finally:
        stop.touch()
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    done = tracer.finish()
    text = out.decode("utf-8", "replace")
    assert "done-0" in text and "Stopped" not in text, text
    job = int(re.search(r"ok (\d+) (\d+)", text).group(1))
    notes = [n for t in tracer.ticks() for n in t.get("notes", [])] + done["notes"]
    said = [n for n in notes if f"to {lib} (runtime)" in n]
    assert len(said) == 1, (text, "\n".join(notes))
    assert re.fullmatch(rf"attached 19 functions \(38 probes\) to {re.escape(str(lib))} \(runtime\), \d+\.\d ms after "
                        rf"pid {job}'s mapping of {re.escape(str(lib))}, not held \(a job of an interactive shell, "
                        r"which would see it stop\): its calls in between are not recorded", said[0]), notes
