"""Hold a process that is about to map CUDA until its probes are in (bpf/attach.bpf.c).

A uprobe lives on a file, so a CUDA / NCCL library that no process had mapped
when the trace began (a dlopen'd libnccl, a venv's libcudart, a program with
the runtime linked in) is probed only once ingero has seen it; until now the
once-a-second library scan found it, and a job lost its first second of calls
(2-4% of a short run's collectives, every call of a 0.5 s program).

The kernel side stops the thread that maps such a file's code (ld.so's
PROT_EXEC mmap of a library it opened by that name: a dlopen, a program's
link map) or, traced, execs a program, as the syscall returns, and says so
in a ``struct ingero_hold``.  A process that only reads the file (a copy,
another tracer) is never stopped.
``Holder`` reads those on a thread of its own (the trace's loop can be busy
storing for a second), examines the file (libs.Examiner: exports, or a
runtime linked in), attaches what is new, marks the path as looked at (never
held again) and sends SIGCONT.  A hold never lasts longer than ``bound_s``:
a watchdog resumes the process then, and a note says that its first calls
may be missing.  What a hold costs the held thread is measured by
bench/bench_attach.py (docs/benchmarks.md, "Every call from the first one: holds").

Never stopped, only attached at once: a child of an interactive shell (it
would see the stop and suspend the job: "[1]+ Stopped"); the tracer itself.
If the tracer dies while a process is held, a guard process (holdguard.py)
resumes it: the BPF ``held`` map lists every stopped process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ingero.collect.launchers import SHELLS
from ingero.collect.procnames import read_proc_file, split_cmdline, stat_fields

PROC = Path("/proc")

# The longest a held thread waits (from its stop).  Measured (bench/bench_attach.py, docs/benchmarks.md
# "Every call from the first one: holds"), on a 2-core VM at load ~20: a library new to the trace held
# its thread 7-23 ms (medians per library, NVIDIA's 250 MB libnccl included), 155 ms at worst in 50;
# an nvcc program at its exec 35 ms median, 104 ms at worst.
HOLD_BOUND_S = 0.2
POLL_MS = 50  # the holder's ring wait: how late a stop request is seen (the ring wakes it at once)
# The holder's and the watchdog's threads run at this nice value: a hold is a few ms of CPU, but on a
# box with 10 runnable threads per core a thread at nice 0 waited ~10x that for its turn (a 200 ms
# bound reached: docs/benchmarks.md, "... holds").  Per thread (Linux nice is per task), so the trace's
# own loop and the job keep theirs.
HOLD_NICE = -20
# While a process is held, the interpreter hands the GIL between threads this often (its default
# is 5 ms): the holder releases it at each of its ~50 system calls, and the trace's loop, busy in
# Python, could keep it a whole interval each time (a convoy of 50 x 5 ms).  The loop's thread
# is also raised to HOLD_NICE meanwhile: preempted by a busy box while it holds the GIL, it kept
# the holder waiting for its next turn on a CPU (priority inheritance, by hand).
HOLD_SWITCH_INTERVAL_S = 0.0005

HOLD_PATH_MAX = 256
HOLD_OPEN, HOLD_EXEC = 1, 2
HOLD_STOPPED, HOLD_NOSTOP = 1, 2

# Shells that do job control when interactive (launchers.SHELLS plus those it need not follow).
INTERACTIVE_SHELLS = SHELLS | frozenset({"fish", "tcsh", "csh", "mksh"})


class HoldKey(ctypes.Structure):
    """struct ingero_hold_key (bpf/attach.h)."""

    _fields_ = [("cgroup", ctypes.c_uint64), ("path", ctypes.c_char * HOLD_PATH_MAX)]


class HoldRecord(ctypes.Structure):
    """struct ingero_hold (bpf/attach.h)."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("fd", ctypes.c_int32),
        ("kind", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
        ("key", HoldKey),
    ]


class HoldCfg(ctypes.Structure):
    """struct ingero_hold_cfg (bpf/attach.h)."""

    _fields_ = [("enabled", ctypes.c_uint32), ("tracer_tgid", ctypes.c_uint32)]


# bpf/attach.h's structs and enum prefixes, for the parity test
MIRRORS = {"struct ingero_hold_key": HoldKey, "struct ingero_hold": HoldRecord, "struct ingero_hold_cfg": HoldCfg}
CONSTANTS = {"HOLD_PATH_MAX": HOLD_PATH_MAX, "HOLD_OPEN": HOLD_OPEN, "HOLD_EXEC": HOLD_EXEC,
             "HOLD_STOPPED": HOLD_STOPPED, "HOLD_NOSTOP": HOLD_NOSTOP}


@dataclass
class Hold:
    """One hold as handled: who, what, how long."""

    pid: int
    tid: int
    kind: int
    path: str  # as the process named it
    ts_ns: int  # CLOCK_MONOTONIC of the stop (bpf_ktime_get_ns)
    stopped: bool
    nostop: bool
    released_ns: int | None = None  # when SIGCONT was sent (None: not stopped)
    bound_hit: bool = False
    seen_ns: int = 0  # when the holder read it
    examined_ns: int = 0  # when the file (and the program) had been looked at
    attached_ns: int | None = None  # when the last new library's probes were in
    attached: list[str] = field(default_factory=list)  # attach lines

    @property
    def held_ns(self) -> int | None:
        return None if self.released_ns is None else self.released_ns - self.ts_ns

    @property
    def verb(self) -> str:
        return "exec of" if self.kind == HOLD_EXEC else "mapping of"


def _median(vals: list[float]) -> float:
    return sorted(vals)[len(vals) // 2] if vals else 0.0


def shown(text: str) -> str:
    """``text`` (a path or name a traced process chose) with control characters escaped, for a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def interactive_shells(proc: Path = PROC) -> dict[int, str]:
    """pid -> comm of every interactive shell: one that does job control, so sees its jobs stop.

    A shell with a terminal that leads its own process group (a job-control
    shell puts itself in one) and runs no script nor ``-c`` command."""
    out: dict[int, str] = {}
    for entry in _pids(proc):
        raw = read_proc_file(proc / str(entry) / "stat")
        if raw is None:
            continue
        comm = raw[raw.find(b"(") + 1 : raw.rfind(b")")].decode("utf-8", "replace")
        if comm not in INTERACTIVE_SHELLS:
            continue
        f = stat_fields(raw)
        try:
            pgrp, tty = int(f[2]), int(f[4])
        except (IndexError, ValueError):
            continue
        if tty == 0 or pgrp != entry:
            continue
        argv = split_cmdline(read_proc_file(proc / str(entry) / "cmdline") or b"")
        if _interactive_argv(argv):
            out[entry] = comm
    return out


def _interactive_argv(argv: list[str]) -> bool:
    if not argv:
        return False
    if argv[0].startswith("-"):
        return True  # a login shell
    for a in argv[1:]:
        if a == "--":
            return False
        if a.startswith("--"):
            continue
        if a.startswith("-"):
            if "c" in a[1:]:
                return False
            continue
        return False  # a script
    return True


def children_of(parents: set[int], proc: Path = PROC) -> list[int]:
    """Processes whose parent is one of ``parents``."""
    out = []
    for pid in _pids(proc):
        raw = read_proc_file(proc / str(pid) / "stat")
        if raw is None:
            continue
        try:
            if int(stat_fields(raw)[1]) in parents:
                out.append(pid)
        except (IndexError, ValueError):
            continue
    return out


def _pids(proc: Path) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []


def _comm(pid: int) -> str:
    raw = read_proc_file(PROC / str(pid) / "comm")
    return raw.decode("utf-8", "replace").strip() if raw else "?"


def _readlink(path: str) -> str | None:
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return target[: -len(" (deleted)")] if target.endswith(" (deleted)") else target


def _host_path(pid: int, named: str, via: str) -> tuple[Path, os.stat_result] | None:
    """A path here to the file ``via`` (/proc/TID/fd/N or /proc/PID/exe) reaches, and its stat.

    ``named`` is the path as the process named it: resolved through the process's root (relative:
    its working directory), shown as the plain path when that is the same file here.  A process
    that was not stopped may have closed the descriptor already (ld.so does, right after mapping):
    then the file ``named`` reaches."""
    through = f"/proc/{pid}/root/{named.lstrip('/')}" if named.startswith("/") else f"/proc/{pid}/cwd/{named}"
    try:
        st = os.stat(via)
    except OSError:
        try:
            st = os.stat(through)
        except OSError:
            return None
        via = through
    for cand in (os.path.realpath(through), named if named.startswith("/") else None, through):
        if cand is None:
            continue
        try:
            c = os.stat(cand)
        except OSError:
            continue
        if (c.st_dev, c.st_ino) == (st.st_dev, st.st_ino):
            return Path(cand), st
    return Path(via), st


class Holder:
    """Reads the holds, attaches, resumes; a watchdog keeps every hold under ``bound_s``.

    ``examiner`` looks at each file once (libs.Examiner; its take_* methods);
    ``line(lib, ok, failed)`` is the trace's attach line."""

    def __init__(self, program: Any, examiner: Any, line: Callable[[Any, int, int], str], *,
                 bound_s: float = HOLD_BOUND_S, default_mode: bool = True, proc: Path = PROC):
        self.program = program
        self.examiner = examiner
        self._line = line
        self.bound_ns = int(bound_s * 1e9)
        self.default_mode = default_mode
        self._proc = proc
        self._bpf = program.bpf
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # pid -> deadline (monotonic ns) while stopped
        self._cut: set[int] = set()  # pids the watchdog resumed before their holds were done
        self._wake = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lines: list[str] = []
        self._lasting: list[str] = []  # lines for sessions.notes too: a bound reached (calls may be missing)
        self._batch: list[HoldRecord] = []
        self._cycles = 0  # the holder thread's ring waits done (settle)
        self._cycled = threading.Condition()
        # holds that stopped a process or attached something (bench_attach reads them); the newest kept
        self.holds: deque[Hold] = deque(maxlen=10_000)
        self.count = 0  # every hold record handled
        self.nostop = 0  # of them, jobs of interactive shells (not stopped)
        self.shells: dict[int, str] = {}
        self._loop_tid = threading.get_native_id()  # the trace's loop: Holder is made on its thread
        self._guard: subprocess.Popen | None = None
        self._guard_w: int | None = None
        self.running = False

    # -- start / stop ------------------------------------------------------

    def start(self) -> list[str]:
        """Start the guard, the threads, then let the kernel stop processes; the start lines."""
        self._bpf["hold_ring"].open_ring_buffer(self._on_record)
        self._start_guard()
        self.refresh_shells()
        for target in (self._run, self._watchdog):
            t = threading.Thread(target=target, name=f"ingero-hold-{target.__name__.strip('_')}", daemon=True)
            t.start()
            self._threads.append(t)
        self._set_cfg(enabled=True)
        self.running = True
        return [f"holding processes that map a CUDA / NCCL library{'' if self.default_mode else ' or exec a program'} "
                f"until its probes are in (at most {self.bound_ns / 1e6:.0f} ms; --no-hold: never)"]

    def stop(self) -> None:
        """No new holds; every process still held resumed; the threads and the guard ended."""
        if not self.running:
            return
        self.running = False
        self._set_cfg(enabled=False)
        time.sleep(0.01)  # a program past its enabled check when it went to 0 inserts within microseconds
        self._stop.set()
        with self._lock:
            self._wake.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        self.release_all()
        if self._guard_w is not None:
            os.close(self._guard_w)  # EOF: the guard finds nothing held and exits
            self._guard_w = None
        if self._guard is not None:
            try:
                self._guard.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._guard.kill()

    def release_all(self) -> None:
        held = self._bpf["held"]
        for k in list(held.keys()):
            self._cont(int(k.value))
            try:
                del held[k]
            except KeyError:
                pass
        with self._lock:
            self._held.clear()

    def _set_cfg(self, enabled: bool) -> None:
        t = self._bpf["hold_cfg"]
        t[ctypes.c_int(0)] = HoldCfg(enabled=int(enabled), tracer_tgid=os.getpid())

    def _start_guard(self) -> None:
        r, w = os.pipe()
        cfg_fd = int(self._bpf["hold_cfg"].map_fd)
        held_fd = int(self._bpf["held"].map_fd)
        try:
            self._guard = subprocess.Popen(
                [sys.executable, "-m", "ingero.collect.holdguard", str(r), str(cfg_fd), str(held_fd)],
                pass_fds=(r, cfg_fd, held_fd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C at the terminal is the tracer's to handle, not the guard's
            )
        finally:
            os.close(r)
        self._guard_w = w

    # -- shells ------------------------------------------------------------

    def refresh_shells(self) -> None:
        """List the interactive shells for the kernel (their new children are never stopped), and
        mark the children they have now.  At the start, then once a second (the trace's loop)."""
        shells = interactive_shells(self._proc)
        new = {p: c for p, c in shells.items() if p not in self.shells}
        table = self._bpf["hold_shells"]
        for pid in new:
            table[table.Key(pid)] = table.Leaf(1)
        for pid in set(self.shells) - set(shells):
            try:
                del table[table.Key(pid)]
            except KeyError:
                pass
        self.shells = shells
        if new:
            nostop = self._bpf["hold_nostop"]
            for child in children_of(set(new), self._proc):
                nostop[nostop.Key(child)] = nostop.Leaf(1)

    # -- notes ---------------------------------------------------------------

    def take_lines(self) -> tuple[list[str], list[str]]:
        """(lines for the live view since the last call, those of them that belong in sessions.notes)."""
        with self._lock:
            out, self._lines = self._lines, []
            lasting, self._lasting = self._lasting, []
        return out, lasting

    def summary(self) -> str | None:
        """One line about every hold of the trace, for the end."""
        stopped = [h for h in self.holds if h.held_ns is not None]
        if not self.count:
            return None
        parts = []
        if stopped:
            ms = sorted(h.held_ns / 1e6 for h in stopped)
            phases = ", ".join(f"{what} {_median(vals):.1f}" for what, vals in self.phases().items() if vals)
            parts.append(f"{len(stopped)} held {ms[0]:.1f}-{ms[-1]:.1f} ms (median {ms[len(ms) // 2]:.1f}"
                         + (f"; medians of its parts: {phases})" if phases else ")"))
        hit = sum(h.bound_hit for h in self.holds)
        if hit:
            parts.append(f"{hit} reached the {self.bound_ns / 1e6:.0f} ms bound")
        if self.nostop:
            parts.append(f"{self.nostop} not stopped (jobs of an interactive shell)")
        return (f"holds: {self.count:,} mappings / execs of CUDA candidates looked at; "
                + ", ".join(parts or ["none stopped"]))

    def phases(self) -> dict[str, list[float]]:
        """Where the stopped holds' time went, ms each: until the holder read the record, looking at
        the file, attaching its probes, resuming."""
        out: dict[str, list[float]] = {"to be read": [], "examining": [], "attaching": [], "resuming": []}
        for h in self.holds:
            if h.released_ns is None or h.bound_hit:
                continue
            attached = h.attached_ns or h.examined_ns
            for what, a, b in (("to be read", h.ts_ns, h.seen_ns), ("examining", h.seen_ns, h.examined_ns),
                               ("attaching", h.examined_ns, attached), ("resuming", attached, h.released_ns)):
                out[what].append(max(0, b - a) / 1e6)
        return out

    # -- the threads ---------------------------------------------------------

    def _on_record(self, ctx: Any, data: Any, size: int) -> int:
        self._batch.append(HoldRecord.from_buffer_copy(ctypes.string_at(data, ctypes.sizeof(HoldRecord))))
        return 0

    @staticmethod
    def _favour_this_thread() -> None:
        Holder._set_nice(threading.get_native_id(), HOLD_NICE)

    @staticmethod
    def _set_nice(tid: int, nice: int) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # not root (tests): the bound still holds, holds may only last longer
            pass

    @staticmethod
    def _raise(tid: int) -> int | None:
        """Raise ``tid`` to HOLD_NICE; its nice value before (None: unchanged)."""
        try:
            before = os.getpriority(os.PRIO_PROCESS, tid)
            if before > HOLD_NICE:
                os.setpriority(os.PRIO_PROCESS, tid, HOLD_NICE)
                return before
        except OSError:
            pass
        return None

    def _run(self) -> None:
        self._favour_this_thread()
        while not self._stop.is_set():
            try:
                self._cycle()
            finally:
                with self._cycled:
                    self._cycles += 1
                    self._cycled.notify_all()

    def settle(self, timeout_s: float = 1.0) -> None:
        """Return once every record the kernel wrote before the call is handled (at most ``timeout_s``):
        one whole cycle of the holder's thread begun after it.  The trace's scan calls it before it
        attaches what it found, so a library a hold record names is the holder's to say (its line
        says when, relative to the process's mapping), never the scan's."""
        if not self.running:
            return
        with self._cycled:
            target = self._cycles + 2  # the cycle under way may have polled before the record came
            self._cycled.wait_for(lambda: self._cycles >= target or self._stop.is_set(), timeout=timeout_s)

    def _cycle(self) -> None:
        """One wait on the ring, and every record it gave handled."""
        try:
            self._bpf.ring_buffer_poll(POLL_MS)
        except Exception:  # noqa: BLE001 - an interrupted poll: try again (the bound still holds)
            return
        batch, self._batch = self._batch, []
        seen = time.monotonic_ns()
        with self._lock:
            for rec in batch:
                if rec.flags & HOLD_STOPPED:
                    self._held.setdefault(rec.tgid, rec.ts_ns + self.bound_ns)
            self._wake.notify_all()
        if not batch:
            return
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, HOLD_SWITCH_INTERVAL_S))
        loop_nice = self._raise(self._loop_tid)
        try:
            done: dict[int, list[Hold]] = {}
            for rec in batch:  # every hold of a process handled before it is resumed
                try:
                    hold = self._handle(rec, seen)
                except Exception as exc:  # noqa: BLE001 - never leave a process stopped over a bug
                    hold = Hold(rec.tgid, rec.tid, rec.kind, "?", rec.ts_ns, bool(rec.flags & HOLD_STOPPED),
                                False)
                    self._note(f"hold of pid {rec.tgid}: {type(exc).__name__}: {shown(str(exc))}; resumed")
                done.setdefault(rec.tgid, []).append(hold)
            for pid, pid_holds in done.items():
                self._resume(pid, pid_holds)
        finally:
            sys.setswitchinterval(interval)
            if loop_nice is not None:
                self._set_nice(self._loop_tid, loop_nice)

    def _handle(self, rec: HoldRecord, seen_ns: int) -> Hold:
        """Examine what the held process maps / runs, attach what is new, remember the path."""
        named = rec.key.path.decode("utf-8", "replace")
        hold = Hold(rec.tgid, rec.tid, rec.kind, named, rec.ts_ns, bool(rec.flags & HOLD_STOPPED),
                    bool(rec.flags & HOLD_NOSTOP), seen_ns=seen_ns)
        who = f"pid {rec.tgid}, {shown(_comm(rec.tgid))}"
        libs = []
        looked = False  # at the file the key names: only then is its path never held again
        if rec.kind == HOLD_OPEN:
            fd = f"/proc/{rec.tid}/fd/{rec.fd}"
            found = _host_path(rec.tgid, _readlink(fd) or named, fd)
            if found is not None:
                libs += self.examiner.take_file(found[0], found[1], who)
                looked = True
        # the program itself (an exec; in an open, a program with the runtime linked in that maps libcuda)
        exe = f"/proc/{rec.tgid}/exe"
        found = _host_path(rec.tgid, _readlink(exe) or named, exe)
        if found is not None:
            libs += self.examiner.take_program(found[0], found[1], who)
            looked = looked or rec.kind == HOLD_EXEC
        hold.examined_ns = time.monotonic_ns()
        for lib in libs:
            ok, failed = self.program.attach_library(lib.path, lib.kind, lib.identity, lib.symbols, lib.addresses)
            if ok or failed:
                hold.attached.append(self._line(lib, ok, failed))
                hold.attached_ns = time.monotonic_ns()
        if looked:  # (a process gone before it was read: the next one to map the path is looked at)
            known = self._bpf["hold_known"]
            key = known.Key()
            ctypes.memmove(ctypes.addressof(key), ctypes.addressof(rec.key), ctypes.sizeof(HoldKey))
            known[key] = known.Leaf(1)
        return hold

    def _resume(self, pid: int, pid_holds: list[Hold]) -> None:
        now = time.monotonic_ns()
        with self._lock:
            was_held = self._held.pop(pid, None) is not None
            cut = pid in self._cut
            self._cut.discard(pid)
        if was_held:
            self._cont(pid)
            self._discard_held(pid)
        for hold in pid_holds:
            if hold.stopped:
                hold.released_ns = now if was_held else hold.ts_ns + self.bound_ns
                hold.bound_hit = cut
            self.count += 1
            self.nostop += hold.nostop
            if hold.stopped or hold.attached:
                self.holds.append(hold)
            self._describe(hold)

    def _describe(self, hold: Hold) -> None:
        """The attach lines, saying when each library was attached relative to the process's calls."""
        def ms(ns: int) -> str:
            return f"{ns / 1e6:.1f} ms"

        path = shown(hold.path)
        for line in hold.attached:
            after = (hold.attached_ns or hold.ts_ns) - hold.ts_ns
            if hold.bound_hit:
                self._note(f"{line}, {ms(after)} after pid {hold.pid}'s {hold.verb} {path}: it was held for the "
                           f"{ms(self.bound_ns)} bound and resumed before these probes were in, so its first calls "
                           f"may be missing", lasting=True)
            elif hold.stopped:
                self._note(f"{line} while pid {hold.pid} was held at its {hold.verb} {path} "
                           f"({ms(hold.held_ns or 0)}), before its first call")
            elif hold.nostop:
                self._note(f"{line}, {ms(after)} after pid {hold.pid}'s {hold.verb} {path}, not held (a job of an "
                           f"interactive shell, which would see it stop): its calls in between are not recorded")
            else:
                self._note(f"{line}, {ms(after)} after pid {hold.pid}'s {hold.verb} {path} (a new program on the "
                           f"host: looked at, not held)")
        if hold.bound_hit and not hold.attached:
            self._note(f"pid {hold.pid} was held at its {hold.verb} {path} for the {ms(self.bound_ns)} bound and "
                       f"resumed before it was looked at: its first CUDA calls may be missing", lasting=True)

    def _watchdog(self) -> None:
        """Resume a process whose hold reached the bound (the holder thread may be stuck attaching)."""
        self._favour_this_thread()
        with self._lock:
            while not self._stop.is_set():
                now = time.monotonic_ns()
                due = [p for p, d in self._held.items() if d <= now]
                for pid in due:
                    del self._held[pid]
                    self._cut.add(pid)
                    self._cont(pid)
                    self._discard_held(pid)
                nearest = min(self._held.values(), default=None)
                self._wake.wait(timeout=None if nearest is None else max(0.0, (nearest - now) / 1e9))

    def _discard_held(self, pid: int) -> None:
        held = self._bpf["held"]
        try:
            del held[held.Key(pid)]
        except KeyError:
            pass

    @staticmethod
    def _cont(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _note(self, line: str, lasting: bool = False) -> None:
        with self._lock:
            self._lines.append(line)
            if lasting:
                self._lasting.append(line)
