"""--stack against NVIDIA's real libcudart, through the test harness program.

tests/live/stack_harness.bpf.c includes bpf/stack.h and puts a uprobe on
libcudart functions; a Python workload (stack_workload.py) calls them from
known lines.  The stored stacks must name those exact files and lines.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prereqs import missing, needs_nvidia_libcudart
from workloads import wait_for

from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE
from ingero.store.db import Store

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "stack_workload.py"
PYENV = Path("/root/.pyenv/versions")


def libcudart() -> str:
    return str(needs_nvidia_libcudart())


class Program:
    """The harness BPF program with its uprobes: compiled and attached once per module."""

    def __init__(self, cflags: tuple[str, ...] = ()):
        from bcc import BPF

        from ingero.collect.kheaders import ensure_tracefs, find_kernel_headers
        from ingero.collect.stacks import bpf_text

        ensure_tracefs()
        find_kernel_headers().export()
        self.bpf = BPF(
            text=bpf_text(HERE / "stack_harness.bpf.c"),
            cflags=[f"-I{HERE.parent.parent / 'bpf'}", "-D__BPF__", "-Wno-macro-redefined", *cflags],
        )
        self.events: list[np.ndarray] = []
        self.bpf["harness_events"].open_ring_buffer(self._on_event)

    def _on_event(self, _ctx, data, size):
        self.events.append(np.frombuffer(ctypes.string_at(data, size), dtype=EVENT_DTYPE).copy())

    def attach(self, lib: str, symbols: list[str]) -> None:
        from ingero.collect.loader import attach_uprobe

        # as the tracer attaches (ref_ctr_offset 0): BCC's own attach_uprobe passes stack garbage
        # there, and the kernel refuses it where an earlier test's tracer still holds a probe
        for sym in symbols:
            attach_uprobe(self.bpf, lib, "harness_uprobe", False, sym=sym)


class Harness:
    """One test's view of the program: its own store and StackResolver, the events from now on.

    Tests filter events and stack records by their own process, so what an earlier
    test left in the shared maps does not reach them.
    """

    def __init__(self, program: Program, store: Store):
        from ingero.collect.stacks import StackResolver

        self.program = program
        self.bpf = program.bpf
        self.bpf.ring_buffer_consume()
        program.events.clear()
        self.resolver = StackResolver(self.bpf, store, session_id=1)

    def target(self, pid: int) -> None:
        self.resolver.prepare([pid])
        t = self.bpf["harness_pids"]
        t[t.Key(pid)] = t.Leaf(1)

    def drain(self) -> np.ndarray:
        self.bpf.ring_buffer_consume()
        events = self.program.events
        return np.concatenate(events) if events else np.zeros(0, dtype=EVENT_DTYPE)

    def close(self) -> None:
        # the next test's resolver must be the only one draining the shared stack map
        self.resolver.close()


def run_workload(harness: Harness, python: str, n: int) -> tuple[int, dict]:
    lib = libcudart()
    proc = subprocess.Popen([python, str(WORKLOAD), lib, str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    harness.target(proc.pid)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    lines = json.loads(proc.stdout.readline())
    return proc, lines


def finish(proc: subprocess.Popen) -> None:
    proc.stdin.write("exit\n")
    proc.stdin.flush()
    proc.wait(timeout=30)


def _pending_records(h: Harness, pid: int) -> int:
    """Stack records of ``pid`` still in the BPF map (not yet read by the resolver's watcher);
    -1 when the watcher deleted one while we read (ask again)."""
    try:
        return sum(1 for rec in h.bpf["ingero_stacks"].values() if int(rec.tgid) == pid)
    except KeyError:
        return -1


def stack_rows(store: Store, stack_id: int) -> list[tuple]:
    return store.con.execute(
        "SELECT depth, frame_kind, function, module, file, line, source FROM stacks "
        "WHERE stack_id = $id ORDER BY depth", {"id": stack_id}).fetchall()


@pytest.fixture(scope="module")
def program():
    p = Program()
    p.attach(libcudart(), ["cudaMalloc", "cudaDeviceSynchronize"])
    yield p
    p.bpf.cleanup()


@pytest.fixture
def harness(program):
    store = Store.memory()
    h = Harness(program, store)
    yield h, store
    h.close()


def check_python(harness, store, python: str, n: int = 5):
    h = harness
    proc, lines = run_workload(h, python, n)
    pid = proc.pid
    ev = h.drain()
    ev = ev[(ev["pid"] == pid) & (ev["op"] == Op.CUDA_MALLOC)]
    # cudaMalloc and cudaDeviceSynchronize both land in the one uprobe handler.
    assert len(ev) == n + 1, f"expected {n + 1} calls, got {len(ev)}"
    assert (ev["stack_id"] >= 0).all(), ev["stack_id"]
    try:
        ids = h.resolver.resolve(ev["stack_id"], ev["pid"])
    finally:
        finish(proc)
    assert (ids >= 0).all()
    # Resolved records leave the BPF map (it only buffers unread call sites).
    table = h.bpf["ingero_stacks"]
    assert all(table.get(table.Key(int(i))) is None for i in set(ev["stack_id"].tolist()))
    # The n cudaMalloc calls come from one line: one stack, stored once.
    assert len(set(ids[:n].tolist())) == 1
    malloc = stack_rows(store, int(ids[0]))
    sync = stack_rows(store, int(ids[-1]))
    py_malloc = [r for r in malloc if r[1] == "python"]
    py_sync = [r for r in sync if r[1] == "python"]
    assert py_malloc[0][2:] == ("alloc_loop", str(WORKLOAD), str(WORKLOAD), lines["MALLOC_LINE"],
                                "cudart.cudaMalloc(ctypes.byref(ptr), 1024)  # MALLOC_LINE")
    assert py_malloc[1][2] == "main" and py_malloc[1][5] == lines["LOOP_CALL_LINE"]
    assert py_sync[0][2] == "main" and py_sync[0][5] == lines["SYNC_LINE"]
    assert [r[2] for r in py_malloc[-2:]] == ["main", "<module>"]
    # CPython processes get Python frames only (the native walk ends in
    # garbage after libffi without frame pointers): the call site is depth 0.
    assert malloc[0][0] == 0 and malloc == [r for r in malloc if r[1] == "python"]
    assert sync[0][2] == "main"
    return h.resolver


def test_debian_python311_static_binary_exact_lines(harness):
    h, store = harness
    resolver = check_python(h, store, sys.executable if sys.version_info[:2] == (3, 11) else "/usr/bin/python3")
    assert resolver.stats["python_unreadable"] == 0


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_pyenv_libpython_exact_lines(harness, version):
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        missing(f"python{version} under {PYENV}", f"pyenv install {version}")
    h, store = harness
    check_python(h, store, str(found[-1]))


def test_native_only_process_gets_native_stack(harness, tmp_path):
    """A non-Python caller: the stack is the native one, innermost = the CUDA call."""
    h, store = harness
    src = tmp_path / "caller.c"
    src.write_text(
        '#include <dlfcn.h>\n#include <stdio.h>\n'
        'int main(int c, char **v) { void *h = dlopen(v[1], RTLD_NOW); if (!h) return 1;\n'
        ' int (*f)(void **, unsigned long) = dlsym(h, "cudaMalloc"); void *p;\n'
        ' puts("ready"); fflush(stdout); getchar(); for (int i = 0; i < 3; i++) f(&p, 64); return 0; }\n')
    exe = tmp_path / "caller"
    subprocess.run(["cc", "-O0", "-fno-omit-frame-pointer", "-o", str(exe), str(src), "-ldl"], check=True)
    proc = subprocess.Popen([str(exe), libcudart()], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"  # libcudart is mapped: the resolver can read it
    h.target(proc.pid)
    proc.communicate(b"\n", timeout=30)
    ev = h.drain()
    ev = ev[(ev["pid"] == proc.pid) & (ev["op"] == Op.CUDA_MALLOC)]
    assert len(ev) == 3
    ids = h.resolver.resolve(ev["stack_id"], ev["pid"])
    rows = stack_rows(store, int(ids[0]))
    assert rows[0][1:4] == ("native", "cudaMalloc", libcudart())
    assert "main" in [r[2] for r in rows if r[3] == str(exe)]
    assert all(r[1] == "native" for r in rows)


THREADED = """
import ctypes, sys, threading
cudart = ctypes.CDLL(sys.argv[1])
def worker():
    p = ctypes.c_void_p()
    for _ in range(4):
        cudart.cudaMalloc(ctypes.byref(p), 64)  # WORKER_LINE
print("ready", flush=True)
sys.stdin.readline()
threads = [threading.Thread(target=worker) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print("done", flush=True)
sys.stdin.readline()
"""


def test_threads_are_matched_by_native_thread_id(harness, tmp_path):
    """Calls from three worker threads: each gets its own thread's frames, not the main thread's."""
    h, store = harness
    script = tmp_path / "threaded.py"
    script.write_text(THREADED)
    line = next(n for n, t in enumerate(THREADED.splitlines(), 1) if t.endswith("# WORKER_LINE"))
    proc = subprocess.Popen(["/usr/bin/python3", str(script), libcudart()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        h.target(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        ev = h.drain()
        ev = ev[(ev["pid"] == proc.pid) & (ev["op"] == Op.CUDA_MALLOC)]
        assert len(ev) == 12
        assert len(set(ev["tid"].tolist())) == 3 and proc.pid not in set(ev["tid"].tolist())
        ids = h.resolver.resolve(ev["stack_id"], ev["pid"])
    finally:
        finish(proc)
    assert len(set(ids.tolist())) == 1  # same code, same line: one stored stack for all threads
    rows = stack_rows(store, int(ids[0]))
    assert rows[0][2] == "worker" and rows[0][4] == str(script) and rows[0][5] == line
    assert [r[2] for r in rows][-3:] == ["Thread.run", "Thread._bootstrap_inner", "Thread._bootstrap"]


def test_stacks_survive_the_process_exiting_before_the_flush(harness):
    """The watcher resolves records while the process runs: a decode after its exit still gets lines."""
    h, store = harness
    proc, lines = run_workload(h, "/usr/bin/python3", 3)
    # the watcher resolves each record while the process lives and deletes it from the map
    assert wait_for(lambda: _pending_records(h, proc.pid) == 0, timeout=30)
    finish(proc)     # the process and its memory are gone before resolve()
    ev = h.drain()
    ev = ev[(ev["pid"] == proc.pid) & (ev["op"] == Op.CUDA_MALLOC)]
    ids = h.resolver.resolve(ev["stack_id"], ev["pid"])
    assert (ids >= 0).all()
    rows = stack_rows(store, int(ids[0]))
    assert (rows[0][2], rows[0][5]) == ("alloc_loop", lines["MALLOC_LINE"])


WAVES = """
#include <dlfcn.h>
#include <stdio.h>
static int (*cuda_malloc)(void **, unsigned long);
void rec(int n) { void *p; if (n == 0) cuda_malloc(&p, 64); else rec(n - 1); }
void wave0(int n) { rec(n); }
void wave1(int n) { rec(n); }
void wave2(int n) { rec(n); }
int main(int c, char **v) {
    void *h = dlopen(v[1], RTLD_NOW);
    if (!h) return 1;
    cuda_malloc = dlsym(h, "cudaMalloc");
    void (*waves[3])(int) = {wave0, wave1, wave2};
    puts("ready"); fflush(stdout);
    for (int w = 0; w < 3; w++) {
        getchar();
        for (int d = 0; d < PER_WAVE; d++) waves[w](d);
        puts("done"); fflush(stdout);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def small_program():
    """The harness with 64 record slots: what a long session's full maps look like, in seconds."""
    p = Program(cflags=("-DINGERO_STACK_ENTRIES=64",))
    p.attach(libcudart(), ["cudaMalloc"])
    yield p
    p.bpf.cleanup()


def test_record_slots_are_given_back_so_a_long_session_keeps_new_native_stacks(small_program, tmp_path):
    """120 distinct native stacks through 64 slots, 40 at a time with a resolve between: every call
    gets its own stack.  (With a BPF stack-trace map, whose slots are never given back and whose
    hash buckets collide, calls lost their stacks once 64 had been seen, and before.)"""
    per_wave = 40
    src = tmp_path / "waves.c"
    src.write_text(WAVES)
    exe = tmp_path / "waves"
    subprocess.run(["cc", "-O0", "-fno-omit-frame-pointer", f"-DPER_WAVE={per_wave}", "-o", str(exe), str(src),
                    "-ldl"], check=True)
    store = Store.memory()
    h = Harness(small_program, store)
    proc = subprocess.Popen([str(exe), libcudart()], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        h.target(proc.pid)
        ids = []
        for _ in range(3):
            proc.stdin.write(b"\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == b"done"
            ev = h.drain()
            h.program.events.clear()
            ev = ev[(ev["pid"] == proc.pid) & (ev["op"] == Op.CUDA_MALLOC)]
            assert len(ev) == per_wave
            assert (ev["stack_id"] >= 0).all(), ev["stack_id"]
            ids += h.resolver.resolve(ev["stack_id"], ev["pid"]).tolist()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        h.close()
    assert len(set(ids)) == 3 * per_wave
    depth = {}  # stored stack -> (wave function, rec frames)
    for sid in ids:
        rows = stack_rows(store, sid)
        assert rows[0][1:4] == ("native", "cudaMalloc", libcudart())
        names = [r[2] for r in rows]
        depth[sid] = (next(n for n in names if n.startswith("wave")), names.count("rec"))
    assert sorted(depth.values()) == [(f"wave{w}", d + 1) for w in range(3) for d in range(per_wave)]


def test_a_record_that_cannot_be_resolved_gives_its_slot_back(harness):
    """A Python process gone before its records were read (no watcher here to read them while it
    ran): its frames are unreadable, the calls get no stack -- and the records leave the map, or a
    daemon seeing many short-lived processes would fill every slot and lose all later stacks."""
    h, store = harness
    h.resolver._stop_watcher()  # nothing reads the records while the process lives
    proc, _lines = run_workload(h, "/usr/bin/python3", 3)
    finish(proc)
    ev = h.drain()
    ev = ev[ev["pid"] == proc.pid]  # the calls, and any preemption the harness saw
    calls = ev[ev["op"] == Op.CUDA_MALLOC]
    assert len(calls) == 4 and (calls["stack_id"] >= 0).all()
    assert _pending_records(h, proc.pid) >= 2  # the loop's call site and the sync's, at least
    ids = h.resolver.resolve(ev["stack_id"], ev["pid"])
    assert (ids == -1).all()
    assert _pending_records(h, proc.pid) == 0
