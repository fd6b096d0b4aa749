"""holds.py: the mirror of bpf/attach.h, which shells count as interactive, and the bound on a hold.

The bound is checked on a real child process stopped with SIGSTOP, with a
stand-in for the BPF maps and ring: the watchdog must resume it when the
bound is reached even while examining the file is still under way, and say
so once, in the lines that go to sessions.notes.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ingero.collect import holds
from ingero.collect.holds import HOLD_EXEC, HOLD_STOPPED, HoldRecord, Holder

ATTACH_H = Path(__file__).resolve().parents[2] / "bpf" / "attach.h"
SLEEP = os.path.realpath(shutil.which("sleep") or "/bin/sleep")


def test_structs_and_constants_match_attach_h(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed for the parity test (make setup installs gcc)")
    lines = ["#include <stdio.h>", "#include <stddef.h>", f'#include "{ATTACH_H}"', "int main(void) {"]
    for cname, mirror in holds.MIRRORS.items():
        lines.append(f'printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for fname, *_ in mirror._fields_:
            lines.append(f'printf("{cname} {fname} %zu\\n", offsetof({cname}, {fname}));')
    for const in holds.CONSTANTS:
        lines.append(f'printf("const {const} %d\\n", (int){const});')
    lines.append("return 0; }")
    (tmp_path / "p.c").write_text("\n".join(lines))
    subprocess.run([cc, "-Wall", "-Werror", "-o", str(tmp_path / "p"), str(tmp_path / "p.c")], check=True)
    out = subprocess.run([str(tmp_path / "p")], check=True, capture_output=True, text=True).stdout
    got = {" ".join(line.split()[:-1]): int(line.split()[-1]) for line in out.splitlines()}
    for cname, mirror in holds.MIRRORS.items():
        assert got[f"{cname} sizeof"] == ctypes.sizeof(mirror), cname
        for fname, *_ in mirror._fields_:
            assert got[f"{cname} {fname}"] == getattr(mirror, fname).offset, (cname, fname)
    assert {k: got[f"const {k}"] for k in holds.CONSTANTS} == holds.CONSTANTS
    # every enum constant of attach.h is mirrored
    declared = set(re.findall(r"^\s*(HOLD_[A-Z]+)\s*=", ATTACH_H.read_text(), re.M))
    assert declared == set(holds.CONSTANTS) - {"HOLD_PATH_MAX"}


# -- interactive shells -----------------------------------------------------------------


def _proc(root: Path, pid: int, comm: str, *, ppid: int = 1, pgrp: int | None = None, tty: int = 34816,
          argv: list[str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    pgrp = pid if pgrp is None else pgrp
    # fields from 3 on: state ppid pgrp session tty_nr ...
    (d / "stat").write_bytes(f"{pid} ({comm}) S {ppid} {pgrp} {pgrp} {tty} 0 0".encode())
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in (argv or [comm])) + b"\0")


def test_interactive_shells_are_job_control_shells_on_a_terminal(tmp_path: Path) -> None:
    _proc(tmp_path, 10, "bash", argv=["-bash"])  # a login shell
    _proc(tmp_path, 11, "zsh", argv=["zsh", "-i"])
    _proc(tmp_path, 12, "bash", argv=["bash", "train.sh"])  # runs a script: no job control
    _proc(tmp_path, 13, "sh", ppid=99, pgrp=99, argv=["sh", "-c", "./k 700"])  # under `ingero trace --cmd`
    _proc(tmp_path, 14, "bash", ppid=10, pgrp=10)  # a subshell: not its group's leader
    _proc(tmp_path, 15, "bash", tty=0)  # no terminal (a service's shell)
    _proc(tmp_path, 16, "python3", argv=["python3"])  # an interactive REPL does no job control
    _proc(tmp_path, 17, "bash", argv=["bash", "-lc", "make"])
    _proc(tmp_path, 20, "python3", ppid=10, pgrp=20, argv=["python3", "train.py"])
    _proc(tmp_path, 21, "sort", ppid=10, pgrp=20)
    _proc(tmp_path, 22, "python3", ppid=20, pgrp=20)
    assert holds.interactive_shells(tmp_path) == {10: "bash", 11: "zsh"}
    assert sorted(holds.children_of({10, 11}, tmp_path)) == [14, 20, 21]


def test_shown_escapes_control_characters() -> None:
    assert holds.shown("/opt/lib/libnccl.so.2") == "/opt/lib/libnccl.so.2"
    assert holds.shown("/tmp/\x1b[2Jlibcudart.so") == "/tmp/\\x1b[2Jlibcudart.so"


# -- the bound ------------------------------------------------------------------------------


class _Table(dict):
    map_fd = -1

    class Key(ctypes.c_uint32):
        pass

    class Leaf(ctypes.c_uint8):
        pass

    def __setitem__(self, k, v):
        super().__setitem__(bytes(k), v)

    def __delitem__(self, k):
        super().__delitem__(bytes(k))

    def keys(self):
        return [self.Key.from_buffer_copy(k) for k in super().keys()]


class _KnownTable(_Table):
    Key = holds.HoldKey


class _Bpf:
    """The maps and the ring the holder touches; ``feed`` queues records for the next poll."""

    def __init__(self) -> None:
        self.tables = {name: _Table() for name in ("hold_cfg", "held", "hold_shells", "hold_nostop")}
        self.tables["hold_known"] = _KnownTable()
        self._records: list[HoldRecord] = []
        self._cb = None

    def __getitem__(self, name):
        if name == "hold_ring":
            bpf = self

            class Ring:
                def open_ring_buffer(self, cb):
                    bpf._cb = cb
            return Ring()
        return self.tables[name]

    def feed(self, rec: HoldRecord) -> None:
        self._records.append(rec)

    def ring_buffer_poll(self, timeout_ms: int) -> None:
        if not self._records:
            time.sleep(timeout_ms / 1000 / 10)
            return
        rec = self._records.pop(0)
        buf = ctypes.create_string_buffer(bytes(rec))
        self._cb(None, ctypes.addressof(buf), ctypes.sizeof(rec))


class _Program:
    def __init__(self) -> None:
        self.bpf = _Bpf()
        self.attached: list[str] = []

    def attach_library(self, path, kind, identity, symbols, addresses):
        self.attached.append(str(path))
        return 2, 0


class _Lib:
    def __init__(self, path: Path) -> None:
        self.path, self.kind, self.identity, self.symbols, self.addresses = path, "runtime", (1, 2), frozenset(), None


class _SlowWatcher:
    """Examining the program takes ``delay_s`` (past the bound when the test says so), watching
    whether the held process runs again meanwhile."""

    def __init__(self, delay_s: float, pid: int) -> None:
        self.delay_s = delay_s
        self.pid = pid
        self.resumed_while_examining = False
        self.examined = threading.Event()

    def take_file(self, path, st, who):
        return []

    def take_program(self, path, st, who):
        end = time.monotonic() + self.delay_s
        while time.monotonic() < end:
            self.resumed_while_examining |= _state(self.pid) != "T"
            time.sleep(0.005)
        self.examined.set()
        return [_Lib(path)]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, want: str, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _state(pid) == want:
            return True
        time.sleep(0.005)
    return False


@pytest.fixture
def stopped_child():
    child = subprocess.Popen([SLEEP, "30"])
    os.kill(child.pid, signal.SIGSTOP)
    assert _wait_state(child.pid, "T")
    yield child
    child.kill()
    child.wait()


def _holder(delay_s: float, bound_s: float, pid: int, monkeypatch) -> tuple[Holder, _Program, _SlowWatcher]:
    program, watcher = _Program(), _SlowWatcher(delay_s, pid)
    holder = Holder(program, watcher, lambda lib, ok, failed: f"attached {ok} probes to {lib.path}",
                    bound_s=bound_s, default_mode=False, proc=Path("/nonexistent"))
    monkeypatch.setattr(holder, "_start_guard", lambda: None)
    return holder, program, watcher


def _exec_record(pid: int) -> HoldRecord:
    rec = HoldRecord(ts_ns=time.monotonic_ns(), tgid=pid, tid=pid, fd=-1, kind=HOLD_EXEC, flags=HOLD_STOPPED)
    rec.key.path = b"/usr/bin/sleep"  # as the exec named it
    return rec


def test_a_hold_that_outlasts_its_bound_is_resumed_at_the_bound_and_said_once(stopped_child, monkeypatch) -> None:
    holder, program, watcher = _holder(delay_s=2.0, bound_s=0.1, pid=stopped_child.pid, monkeypatch=monkeypatch)
    holder.start()
    try:
        holder.program.bpf.feed(_exec_record(stopped_child.pid))
        assert watcher.examined.wait(10)
        end = time.monotonic() + 5
        while not holder.holds and time.monotonic() < end:
            time.sleep(0.01)
    finally:
        holder.stop()
    # resumed by the watchdog while the examination (2 s, the bound 0.1 s) was still under way
    assert watcher.resumed_while_examining
    lines, lasting = holder.take_lines()
    assert len(lines) == 1 and lasting == lines, lines
    assert lines[0].startswith(f"attached 2 probes to {SLEEP}, ")
    assert "it was held for the 100.0 ms bound and resumed before these probes were in" in lines[0]
    (hold,) = holder.holds
    assert hold.bound_hit and hold.held_ns == holder.bound_ns
    assert holder.summary() == ("holds: 1 mappings / execs of CUDA candidates looked at; 1 held 100.0-100.0 ms "
                                "(median 100.0), 1 reached the 100 ms bound")


def test_a_hold_within_its_bound_is_resumed_once_attached(stopped_child, monkeypatch) -> None:
    holder, program, watcher = _holder(delay_s=0.0, bound_s=30.0, pid=stopped_child.pid, monkeypatch=monkeypatch)
    holder.start()
    try:
        holder.program.bpf.feed(_exec_record(stopped_child.pid))
        end = time.monotonic() + 20
        while not holder.holds and time.monotonic() < end:
            time.sleep(0.01)
    finally:
        holder.stop()
    lines, lasting = holder.take_lines()
    assert lasting == [] and len(lines) == 1
    assert re.fullmatch(rf"attached 2 probes to {SLEEP} while pid {stopped_child.pid} was "
                        r"held at its exec of /usr/bin/sleep \(\d+\.\d ms\), before its first call", lines[0]), lines
    (hold,) = holder.holds
    assert not hold.bound_hit and 0 < hold.held_ns < holder.bound_ns
    assert program.attached == [SLEEP]
    assert _state(stopped_child.pid) != "T"
    # the path is looked at once: never held again
    assert list(holder.program.bpf.tables["hold_known"]) == [bytes(_exec_record(stopped_child.pid).key)]
    assert holder.program.bpf.tables["hold_cfg"][bytes(ctypes.c_int(0))].enabled == 0  # off after stop


def test_a_kernel_that_refuses_the_hold_programs_traces_without_them(monkeypatch) -> None:
    from ingero.collect import session
    from ingero.collect.loader import BpfSettings
    from ingero.errors import IngeroError

    loaded = []

    def load(settings):
        loaded.append(settings.holds)
        if settings.holds:
            raise IngeroError("BPF load failed: the kernel verifier refused tracepoint__syscalls__sys_enter_mmap: "
                              "invalid argument")
        return "program"

    monkeypatch.setattr(session, "load_program", load)
    program, settings, note = session._load(BpfSettings(holds=True))
    assert (program, settings.holds, loaded) == ("program", False, [True, False])
    assert note == ("holds off (a process that maps CUDA after the trace began may lose its first calls): BPF load "
                    "failed: the kernel verifier refused tracepoint__syscalls__sys_enter_mmap: invalid argument")

    def broken(settings):
        loaded.append(settings.holds)
        raise IngeroError("BPF compile failed (bpf/ingero.bpf.c, kernel headers x): error: no such file")

    loaded.clear()
    monkeypatch.setattr(session, "load_program", broken)
    with pytest.raises(IngeroError, match="BPF compile failed"):  # not the holds' fault: no second try
        session._load(BpfSettings(holds=True))
    assert loaded == [True]


def test_settle_returns_once_a_record_written_before_it_is_handled(stopped_child, monkeypatch) -> None:
    """The trace's scan settles the holder before attaching what it found: a record already in the
    ring (here examined for 0.3 s) is handled, and its line taken, before settle returns."""
    holder, program, watcher = _holder(delay_s=0.3, bound_s=30.0, pid=stopped_child.pid, monkeypatch=monkeypatch)
    holder.start()
    try:
        time.sleep(0.05)  # the holder's thread is mid-wait on an empty ring
        holder.program.bpf.feed(_exec_record(stopped_child.pid))
        begun = time.monotonic()
        holder.settle(timeout_s=10)
        waited = time.monotonic() - begun
        lines, _ = holder.take_lines()
        assert watcher.examined.is_set() and len(lines) == 1 and program.attached == [SLEEP], lines
        assert waited >= 0.25  # it waited for the examination, not only for a poll
    finally:
        holder.stop()
    holder.settle(timeout_s=10)  # stopped: returns at once
