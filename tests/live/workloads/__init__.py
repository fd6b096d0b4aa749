"""Helpers for the live trace tests: build the C workloads, run `ingero trace`.

The workloads are tiny C programs (built once per test session with the
system compiler) so that what a test counts is exactly what it asked for,
without an interpreter's own calls and page faults in the way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb

import prereqs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
INGERO = [sys.executable, "-m", "ingero"]
# compile + attach: ~200 probes at 0.05-0.3 s each, longer while earlier tracers still detach theirs
# (host-wide, serialized): 98 s measured at load 12
START_TIMEOUT_S = 240
# A whole traced run (start, the workload, exit), and a tracer's exit after SIGINT/SIGTERM: its
# uprobes detach one at a time (closing 10 uprobe fds took 9.7 s at load 12).
TRACED_RUN_TIMEOUT_S = 360
EXIT_TIMEOUT_S = 180


def build(name: str, out_dir: Path) -> Path:
    """Compile workloads/<name>.c into out_dir; returns the binary."""
    src = HERE / f"{name}.c"
    out = out_dir / name
    if not out.exists():
        cc = shutil.which("cc") or shutil.which("gcc")
        assert cc, "a C compiler is needed for the live workloads"
        subprocess.run([cc, "-O1", "-o", str(out), str(src), "-ldl", "-lpthread"], check=True)
    return out


def build_shared(name: str, out_dir: Path, filename: str) -> Path:
    """Compile workloads/<name>.c into the shared library out_dir/<filename>; returns it."""
    out = out_dir / filename
    if not out.exists():
        cc = shutil.which("cc") or shutil.which("gcc")
        assert cc, "a C compiler is needed for the live workloads"
        subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(out), str(HERE / f"{name}.c")], check=True)
    return out


def simcuda() -> Path:
    """The simulated CUDA runtime (demos/build/libcudart.so.12), built once per run."""
    return prereqs.needs_simcuda()


def libcudart() -> Path:
    """NVIDIA's libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel (skips locally
    without it, fails under CI: tests/prereqs.py)."""
    return prereqs.needs_nvidia_libcudart()


class Tracer:
    """`ingero trace --json` in the background; lines are collected as they come."""

    def __init__(self, db: Path, *args: str, env: dict | None = None):
        self.db = db
        self.proc = subprocess.Popen(
            [*INGERO, "trace", "--json", "--db", str(db), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[dict] = []
        self.stderr = ""
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            self.lines.append(obj)
            if obj.get("type") == "start":
                self._started.set()

    def wait_started(self) -> dict:
        if not self._started.wait(START_TIMEOUT_S):
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"ingero trace did not start: {err}")
        return next(x for x in self.lines if x["type"] == "start")

    def finish(self, sig: int | None = signal.SIGINT, timeout: float = EXIT_TIMEOUT_S) -> dict:
        """Send ``sig`` (None: wait for it to end by itself) and return the summary line."""
        if sig is not None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(5)
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        assert self.proc.returncode == 0, f"ingero trace exited {self.proc.returncode}: {self.stderr}"
        return next(x for x in self.lines if x["type"] == "summary")

    def ticks(self) -> list[dict]:
        return [x for x in self.lines if x["type"] == "tick"]


def trace_gated(exe: Path, lib: Path, tmp: Path, *args: object, env: dict | None = None) -> tuple[Tracer, dict, Path]:
    """Trace ``EXE LIB GO ARGS...`` (started by `ingero trace --cmd`, probes on LIB) until it exits.

    The gated workloads (call_state.c, stale_calls.c, longjmp_main.c ...) wait for
    the file GO before their first call; it is created once the tracer has
    attached, so no call races the attach.  ``env`` is added to the tracer's
    environment.  Returns the tracer (its stderr holds
    the command's output under --json), the summary line and the database.
    """
    go = tmp / "go"
    db = tmp / "t.duckdb"
    tracer = Tracer(db, "--cuda-lib", str(lib), "--duration", "90s",
                    "--cmd", " ".join(str(a) for a in (exe, lib, go, *args)), env=env)
    tracer.wait_started()
    go.touch()
    return tracer, tracer.finish(sig=None, timeout=120), db


def query(db: Path, sql: str, params: dict | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or {}).fetchall()
    finally:
        con.close()


def wait_until(pred, what: str, timeout: float = START_TIMEOUT_S, step: float = 0.2):
    """``pred()``'s first truthy value, polled every ``step`` s; AssertionError naming ``what`` after
    ``timeout`` (by default a tracer's start, the slowest thing these tests wait for)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_for(pred, timeout: float = 10.0, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()
