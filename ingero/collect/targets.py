"""Who is traced: --pid, --comm, --cmd, and the processes that use CUDA.

The BPF hash ``targets`` (keyed by tgid) is the filter every probe checks.
User space fills it from here; the kernel side adds children of targets
(fork), processes exec'ing with --comm's name, and, in the default mode,
any process that calls a probed CUDA function.

``Launcher`` starts --cmd so that it cannot run a single instruction before
its pid is a target: the child waits on a pipe between fork and exec until
the tracer has added it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

from ingero.errors import IngeroError

PROC = Path("/proc")


@dataclass
class TargetSpec:
    pids: list[int] = field(default_factory=list)
    comm: str | None = None
    cmd: str | None = None

    @property
    def explicit(self) -> bool:
        """True when the user named what to trace (else: every CUDA process)."""
        return bool(self.pids or self.comm or self.cmd)


def check_pids(pids: list[int], proc: Path = PROC) -> None:
    for pid in pids:
        if not (proc / str(pid)).is_dir():
            raise IngeroError(f"no process with pid {pid}",
                              "check the pid with `ps -p PID` (the process may have exited)")


def pids_with_comm(comm: str, proc: Path = PROC) -> list[int]:
    """Processes whose kernel name (/proc/PID/comm, 15 chars) is ``comm``."""
    want = comm[:15]
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().rstrip("\n") == want:
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def alive(pid: int, proc: Path = PROC) -> bool:
    return (proc / str(pid)).is_dir()


def started_before(pid: int, mapped: list[Path], proc: Path = PROC) -> str | None:
    """--pid: what the trace cannot have seen of a process that ran before it (None: gone).

    ``mapped``: the CUDA / NCCL libraries (or programs with the runtime linked
    in) it maps as the probes go in."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
        uptime_s = float((proc / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    comm = raw[raw.find(b"(") + 1 : raw.rfind(b")")].decode("utf-8", "replace")
    try:
        started_s = int(raw[raw.rfind(b")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None
    age = max(0.0, uptime_s - started_s)
    who = f"pid {pid} ({comm!r}) had been running {age:.1f} s when the trace attached"
    if not mapped:
        return f"{who}, with no CUDA library mapped yet: every CUDA call it makes is recorded"
    names = ", ".join(sorted({p.name for p in mapped}))
    return (f"{who}, with {names} already mapped: its CUDA calls before the attach are not recorded "
            f"(from the attach on, every call is)")


def exited_while_attaching(spec: TargetSpec, launching: bool, after_s: float, proc: Path = PROC) -> list[str]:
    """--pid targets that exited between the check of the command line and the attach (the BPF
    compile takes seconds): a line for each, and IngeroError when they were all there was to trace."""
    gone = [pid for pid in spec.pids if not alive(pid, proc)]
    if not gone:
        return []
    listed = ", ".join(str(p) for p in gone)
    if len(gone) == len(spec.pids) and not spec.comm and not launching:
        raise IngeroError(
            f"every --pid target exited while the probes went in ({after_s:.1f} s after the start): pid {listed}; "
            f"nothing was traced",
            "trace the job from its start instead: ingero trace -- COMMAND (or --comm NAME for its next run)")
    return [f"pid {pid} exited while the probes went in ({after_s:.1f} s after the start): nothing of it is recorded"
            for pid in gone]


def describe(spec: TargetSpec, launched_pid: int | None = None) -> str:
    """Human-readable 'what was traced' for the sessions row."""
    parts = []
    if spec.pids:
        parts.append("pid " + ",".join(map(str, spec.pids)))
    if spec.comm:
        parts.append(f"comm {spec.comm}")
    if spec.cmd:
        parts.append(f"cmd {spec.cmd!r}" + (f" (pid {launched_pid})" if launched_pid else ""))
    if not parts:
        parts.append("every process calling CUDA")
    return "; ".join(parts) + " (and their children)"


class Launcher:
    """--cmd: fork, hold the child before exec until released, then exec the command."""

    def __init__(self, cmd: str, *, run_as: tuple[int, int] | None = None, stdout_to_stderr: bool = False):
        argv = shlex.split(cmd)
        if not argv:
            raise IngeroError("--cmd is empty", 'pass a command line, e.g. --cmd "python3 train.py"')
        exe = argv[0] if "/" in argv[0] else shutil.which(argv[0])
        if exe is None or not os.access(exe, os.X_OK):
            # (the words after `--` or --cmd's: said the same either way)
            raise IngeroError(f"the command {argv[0]!r} is not found or not executable",
                              "check the command (it runs without a shell)")
        self.argv = argv
        self._exe = exe
        self._run_as = run_as
        self._stdout_to_stderr = stdout_to_stderr  # keeps --json's stdout pure NDJSON
        self.pid: int | None = None
        self.returncode: int | None = None
        self._gate_w: int | None = None

    @property
    def executable(self) -> str:
        """The program the command runs (its path, resolved through PATH)."""
        return self._exe

    def spawn(self, env: dict[str, str] | None = None) -> int:
        """Fork the child; it waits until ``release()``.  Returns its pid.

        ``env``: the command's environment (default: ingero's own)."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: only async-signal-safe work until exec
            try:
                os.close(w)
                os.read(r, 1)  # wait for the tracer
                os.close(r)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if self._stdout_to_stderr:
                    os.dup2(2, 1)
                if self._run_as is not None:
                    uid, gid = self._run_as
                    os.setgid(gid)
                    os.setuid(uid)
                if env is None:
                    os.execv(self._exe, self.argv)
                else:
                    os.execve(self._exe, self.argv, env)
            finally:
                os._exit(127)
        os.close(r)
        self._gate_w = w
        self.pid = pid
        return pid

    def release(self) -> None:
        if self._gate_w is not None:
            os.write(self._gate_w, b"x")
            os.close(self._gate_w)
            self._gate_w = None

    def poll(self) -> int | None:
        """The exit code once the command has exited (negative: killed by that signal)."""
        if self.pid is None or self.returncode is not None:
            return self.returncode
        done, status = os.waitpid(self.pid, os.WNOHANG)
        if done:
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def stop(self) -> None:
        """End the command if it still runs (the trace is ending)."""
        self.release()
        if self.pid is None or self.poll() is not None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        for _ in range(50):
            if self.poll() is not None:
                return
            import time

            time.sleep(0.02)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
