"""--stack: turn the ids bpf/stack.h puts in events into rows of ``stacks``.

Kernel side (bpf/stack.h): ``ingero_stack_id(ctx)`` stores one record per
distinct call site in the BPF hash ``ingero_stacks`` -- for CPython
processes the (code object, instruction pointer) of every Python frame of
the thread, for other processes the native return addresses -- and returns the
record's 31-bit content hash.  (CPython is built without frame pointers: its
native stacks end in garbage right after libffi -- 87 % of such frames were
unknown when measured -- so they are skipped; that, one user read per frame
and lookup-before-insert took --stack from 16.8 to 7.1 us per CUDA call for
a 24-frame stack, bench/bench_stack.py.)  User space (this module):

* ``StackResolver.prepare(pids)`` finds each process's interpreter
  (pyframes.find_interpreter) and writes its layout into ``ingero_py_procs``;
* ``StackResolver.resolve(stack_ids, pids)`` turns BPF ids into stored stack
  ids: each BPF record is read once, symbolised (symbols.py for native
  frames, pyframes.CodeReader for Python frames: file, line being executed,
  source text), hashed by content into a 63-bit ``stack_id`` and appended to
  ``stacks`` once.

Resolved records are deleted from the BPF map (it only buffers call sites
not read yet).  The watcher thread also resolves new records every
PENDING_POLL_S, while their processes still run.  New processes are examined by a watcher thread within
PENDING_POLL_S of their first event, and re-examined after an exec; records
carry the generation of the image they were walked in.

Limits: code objects are read from /proc/PID/mem up to PENDING_POLL_S after
the event, so frames of code freed within that time (a module body runs
once at import) or of a process that exited first are lost: such a frame is
stored as ``[unreadable]`` at its depth (so its caller is never taken for
the call site), and a stack with no readable frame gets no id.

BCC rewrites map calls (``m.lookup(k)``) only in the main source file, not in
included headers, so a program using stack.h must be compiled from
``bpf_text(path)``, which inlines ``#include "stack.h"``.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import linecache
import os
import re
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ingero.collect import pyframes, symbols
from ingero.collect.bpfmaps import discard

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
STACK_HEADER = "stack.h"
# Must equal INGERO_PY_MAX_FRAMES and INGERO_NATIVE_MAX_FRAMES in bpf/stack.h
# (checked by tests/unit/test_pyframes.py).
PY_MAX_FRAMES = 48
NATIVE_MAX_FRAMES = 64

# New processes are examined, and re-examined for an exec, this often and for
# this long after they are first seen: python startup takes 20-100 ms here, a
# --cmd through a shell or a slow container start a few seconds.
PENDING_POLL_S = 0.02
PENDING_TIMEOUT_S = 10.0
# Exec'd images remembered to resolve their last records (one per exec).
MAX_IMAGES = 4096
# Time the watcher spends resolving records per round (the rest waits one
# round), so noticing new processes and execs is never delayed by much.
DRAIN_BUDGET_S = 0.005
# Records the watcher resolves ahead of the decode path, kept this many at most
# and this long at most: their events may never arrive (dropped from a full
# ring buffer, or a flush whose resolve failed), and the decode path is never
# minutes behind.
MAX_EARLY = 100_000
EARLY_TTL_S = 120.0
# (pid, BPF id) -> stored id entries kept before the cache starts over.
MAX_CACHED_IDS = 1_000_000
# The watcher gives up after this many failed rounds (the BPF program was closed).
MAX_WATCH_ERRORS = 100

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def bpf_text(main: Path | str, *, inline: tuple[str, ...] = (STACK_HEADER,)) -> str:
    """Source of ``main`` with ``#include "stack.h"`` replaced by the header's text.

    BCC only rewrites BPF map method calls found in the main file; the
    ``#line`` markers keep compiler messages pointing at the real files.
    """
    main = Path(main)
    out: list[str] = []
    for lineno, line in enumerate(main.read_text().splitlines(), 1):
        m = _INCLUDE_RE.match(line)
        if m and m.group(1) in inline:
            header = BPF_DIR / m.group(1)
            if not header.exists():
                header = main.parent / m.group(1)
            out.append(f'#line 1 "{header}"')
            out.extend(header.read_text().splitlines())
            out.append(f'#line {lineno + 1} "{main}"')
        else:
            out.append(line)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ records

class PyProcConfig(ctypes.Structure):
    """Mirror of struct ingero_py_proc (bpf/stack.h)."""

    _fields_ = [
        ("runtime_addr", ctypes.c_uint64),
        ("interp_head", ctypes.c_uint32),
        ("threads_head", ctypes.c_uint32),
        ("tstate_next", ctypes.c_uint32),
        ("tstate_tid", ctypes.c_uint32),
        ("pthread_tid", ctypes.c_int32),
        ("tstate_frame", ctypes.c_uint32),
        ("cframe_frame", ctypes.c_int32),
        ("frame_code", ctypes.c_uint32),
        ("frame_previous", ctypes.c_uint32),
        ("frame_instr", ctypes.c_uint32),
        ("generation", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("block_start", ctypes.c_uint32),
        ("block_len", ctypes.c_uint32),
    ]


# struct ingero_py_proc.flags
PY_NO_NATIVE = 1
FRAME_BLOCK = 128  # INGERO_FRAME_BLOCK


class StackRecord(ctypes.Structure):
    """Mirror of struct ingero_stack (bpf/stack.h)."""

    _fields_ = [
        ("tgid", ctypes.c_uint32),
        ("native_n", ctypes.c_int32),
        ("nframes", ctypes.c_uint16),
        ("truncated", ctypes.c_uint16),
        ("generation", ctypes.c_uint32),
        ("code", ctypes.c_uint64 * PY_MAX_FRAMES),
        ("instr", ctypes.c_uint64 * PY_MAX_FRAMES),
        ("native", ctypes.c_uint64 * NATIVE_MAX_FRAMES),
    ]


def proc_config(interp: pyframes.Interpreter, generation: int, *, native: bool = False) -> PyProcConfig:
    """The BPF entry for a CPython process.  ``native``: also take the native
    user stack (off by default: without frame pointers it ends in garbage
    after libffi, and costs several us per event)."""
    lay = interp.layout
    offs = (lay.frame_code, lay.frame_previous, lay.frame_instr)
    start = min(offs)
    length = max(offs) + 8 - start
    if length > FRAME_BLOCK or any((o - start) % 8 for o in offs):
        raise ValueError(f"frame fields of CPython {interp.version} do not fit the BPF frame block")
    return PyProcConfig(
        generation=generation,
        flags=0 if native else PY_NO_NATIVE,
        block_start=start,
        block_len=length,
        runtime_addr=interp.runtime_addr,
        interp_head=lay.interp_head,
        threads_head=lay.threads_head,
        tstate_next=lay.tstate_next,
        tstate_tid=lay.tstate_tid,
        pthread_tid=interp.pthread_tid if lay.tid_is_pthread else -1,
        tstate_frame=lay.tstate_frame,
        cframe_frame=lay.cframe_frame,
        frame_code=lay.frame_code,
        frame_previous=lay.frame_previous,
        frame_instr=lay.frame_instr,
    )


# Frames the interpreter adds that are not user code (3.12's entry shim; 3.13's entry
# frames have no code object at all, see CodeReader.not_code).
_SYNTHETIC_FRAMES = frozenset({"<interpreter trampoline>", "<shim>"})
# A Python frame whose code object could not be read (freed, or its process
# gone, before the resolver got to it).  It keeps its depth: dropping it would
# make the next frame out -- the caller -- look like the call site.
UNREADABLE = "[unreadable]"

STACK_COLUMNS = ("stack_id", "depth", "frame_kind", "function", "module", "file", "line", "source")


def content_id(frames: list[tuple]) -> int:
    """63-bit content hash of a resolved stack: the stored ``stack_id``."""
    h = hashlib.blake2b(repr(frames).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF_FFFF


def source_line(pid: int, filename: str, line: int) -> str | None:
    """Text of ``filename:line`` as the process sees it (through /proc/PID/root)."""
    if not filename or line <= 0 or filename.startswith("<"):
        return None
    for path in (f"/proc/{pid}/root{filename}" if filename.startswith("/") else None, filename):
        if path and os.path.exists(path):
            text = linecache.getline(path, line)
            if text:
                return text.strip()
    return None


def exec_signature(pid: int) -> bytes | None:
    """Changes when ``pid`` execs: its auxv (AT_PHDR, AT_RANDOM... move with every new image)."""
    try:
        with open(f"/proc/{pid}/auxv", "rb") as f:
            return hashlib.blake2b(f.read(), digest_size=8).digest()
    except OSError:
        return None


def unexeced_fork_of_us(pid: int) -> bool:
    """A child of this process that has not exec'd yet (``--cmd`` holds its child
    before exec): it runs our interpreter, not the command's, so it is not
    prepared -- its exec is watched for instead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        if ppid != os.getpid():
            return False
        theirs, ours = os.stat(f"/proc/{pid}/exe"), os.stat("/proc/self/exe")
        with open(f"/proc/{pid}/cmdline", "rb") as a, open("/proc/self/cmdline", "rb") as b:
            same_cmd = a.read() == b.read()
        return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino) and same_cmd
    except (OSError, ValueError, IndexError):
        return False


class _Proc:
    """What we know about one traced process (one exec'd image of it)."""

    def __init__(self, pid: int, generation: int):
        self.pid = pid
        self.generation = generation
        self.signature = exec_signature(pid)
        self.prefork = unexeced_fork_of_us(pid)
        self.native = symbols.NativeSymbolizer(pid)
        self.interp: pyframes.Interpreter | None = None
        self.mem: pyframes.ProcessMemory | None = None
        self.code: pyframes.CodeReader | None = None
        try:
            self.mem = pyframes.ProcessMemory(pid)
            self.interp = None if self.prefork else pyframes.find_interpreter(pid, self.mem)
        except OSError:
            self.interp = None
        if self.interp is not None and self.mem is not None:
            self.code = pyframes.CodeReader(self.mem, self.interp)
        # Native frames from these files are the interpreter's own: a Python
        # stack replaces them.
        self.interp_files = {self.interp.binary} if self.interp else set()

    def close(self) -> None:
        if self.mem is not None:
            self.mem.close()


_LIVE_RESOLVERS: "weakref.WeakSet[StackResolver]" = weakref.WeakSet()


@atexit.register
def _stop_watchers() -> None:
    """Stop watcher threads before interpreter teardown (a thread still alive
    then keeps extension objects, DuckDB's among them, from being freed)."""
    for resolver in list(_LIVE_RESOLVERS):
        resolver._stop_watcher()


def _watch(ref: "weakref.ref[StackResolver]") -> None:
    while True:
        resolver = ref()
        if resolver is None or resolver._closed:
            return
        try:
            resolver._watch_once()
        except Exception as exc:  # keep watching: one bad process must not stop the rest
            resolver.stats["watch_errors"] += 1
            resolver.last_watch_error = f"{type(exc).__name__}: {exc}"
            if resolver.stats["watch_errors"] > MAX_WATCH_ERRORS:  # the program is gone
                return
        del resolver
        time.sleep(PENDING_POLL_S)


class StackResolver:
    """BPF stack ids -> stored ``stacks.stack_id`` (see the module docstring).

    ``bpf`` is the loaded BCC program that includes stack.h; ``store`` an
    ingero Store (``append`` + ``con``).  ``resolve`` is meant for one decode
    thread; a daemon thread of ours examines new processes as the BPF side
    meets them (``close()`` stops it).
    """

    def __init__(self, bpf: Any, store: Any, *, session_id: int | None = None):
        self.bpf = bpf
        self.store = store
        self.session_id = session_id
        self.procs: dict[int, _Proc] = {}
        self._ids: dict[tuple[int, int], int] = {}   # (pid, BPF id) -> stored id
        self._retry: set[tuple[int, int]] = set()     # of them, stacks with an unreadable frame
        self._stored: set[int] = set()
        self.images: dict[int, _Proc] = {}     # generation -> _Proc of that image
        self._generation = 0
        self._early: dict[int, tuple[float, list[tuple]]] = {}   # BPF id -> (monotonic s, frames) by the watcher
        self._watched: dict[int, float] = {}   # pid -> stop watching for exec (monotonic s)
        self._lock = threading.RLock()
        self._watcher: threading.Thread | None = None
        self._closed = False
        self.stats = {"stacks": 0, "frames": 0, "native_frames": 0, "native_unknown": 0,
                      "python_frames": 0, "python_unreadable": 0, "missing": 0, "watch_errors": 0}
        self.last_watch_error: str | None = None
        _LIVE_RESOLVERS.add(self)
        self._start_watcher()

    def forget_stacks(self, stack_ids) -> None:
        """Retention deleted these stored stacks (no event referred to them any more): a call
        site that recurs must be written again, not handed an id with no rows."""
        gone = {int(x) for x in stack_ids}
        with self._lock:
            self._stored.difference_update(gone)
            for key in [k for k, v in self._ids.items() if v in gone]:
                del self._ids[key]
                self._retry.discard(key)

    # -- targets -----------------------------------------------------------

    def prepare(self, pids) -> list[int]:
        """Register processes as targets; returns the pids found to run CPython.

        Every process is then watched for PENDING_TIMEOUT_S: one that is not
        running CPython yet (a ``--cmd`` child between fork and exec, libpython
        not mapped yet) or that execs is re-examined within PENDING_POLL_S.
        Processes the BPF side meets without an entry are prepared the same
        way by the watcher, so calling this early is an optimisation.
        """
        python = []
        with self._lock:
            for pid in pids:
                pid = int(pid)
                proc = self._ensure(pid)
                if proc.interp is not None:
                    python.append(pid)
                if proc.signature is not None and pid not in self._watched:
                    self._watched[pid] = time.monotonic() + PENDING_TIMEOUT_S
        return python

    def _ensure(self, pid: int) -> _Proc:
        """The _Proc of ``pid``'s current image (re-examined after an exec). Holds _lock."""
        proc = self.procs.get(pid)
        if proc is not None and (proc.signature is None or exec_signature(pid) in (proc.signature, None)):
            return proc
        if proc is not None:
            # The old image's memory is gone; its _Proc stays in self.images
            # to symbolise records it made (from caches and its maps snapshot).
            for key in [k for k in self._ids if k[0] == pid]:
                del self._ids[key]
                self._retry.discard(key)
        self._generation += 1
        proc = _Proc(pid, self._generation)
        self.procs[pid] = proc
        self.images[proc.generation] = proc
        while len(self.images) > MAX_IMAGES:
            old = self.images.pop(next(iter(self.images)))
            if self.procs.get(old.pid) is not old:
                old.close()
        table = self.bpf.get_table("ingero_py_procs")
        if proc.prefork:
            # No entry: BPF keeps noticing it, and its exec is caught at once.
            discard(table, table.Key(pid))
            self._watched[pid] = time.monotonic() + PENDING_TIMEOUT_S
        else:
            # runtime_addr 0 tells the BPF side "known, not CPython": no walk, no notice.
            table[table.Key(pid)] = (proc_config(proc.interp, proc.generation) if proc.interp is not None
                                     else PyProcConfig(generation=proc.generation))
        return proc

    def _start_watcher(self) -> None:
        if self._closed or (self._watcher is not None and self._watcher.is_alive()):
            return
        # The thread holds only a weak reference: a session that drops its
        # resolver without close() does not keep it (and the store) alive.
        self._watcher = threading.Thread(target=_watch, args=(weakref.ref(self),),
                                         name="ingero-stack-watch", daemon=True)
        self._watcher.start()

    def _watch_once(self) -> None:
        fresh = self.bpf.get_table("ingero_stack_new_tgids")
        new = [k.value for k in fresh.keys()]
        if new:
            self.prepare(new)
            for pid in new:
                discard(fresh, fresh.Key(pid))
        with self._lock:
            now = time.monotonic()
            for pid, deadline in list(self._watched.items()):
                if now > deadline or exec_signature(pid) is None:
                    del self._watched[pid]
                else:
                    self._ensure(pid)
        self._drain_early()

    def _stop_watcher(self) -> None:
        self._closed = True
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=1.0)

    def close(self) -> None:
        self._stop_watcher()
        with self._lock:
            for proc in self.procs.values():
                proc.close()

    def forget(self, pid: int) -> None:
        with self._lock:
            proc = self.procs.pop(int(pid), None)
            if proc:
                proc.close()
            self._watched.pop(int(pid), None)
        table = self.bpf.get_table("ingero_py_procs")
        discard(table, table.Key(int(pid)))

    def counters(self) -> dict[str, int]:
        """The BPF side's counters (stored, stackid errors, thread not found, map full, truncated)."""
        table = self.bpf.get_table("ingero_stack_counters")
        names = ("stored", "native_errors", "thread_not_found", "map_full", "truncated")
        return {n: int(table[table.Key(i)].value) for i, n in enumerate(names)}

    # -- resolving ---------------------------------------------------------

    def resolve(self, stack_ids: np.ndarray, pids: np.ndarray) -> np.ndarray:
        """Stored stack ids (int64, -1 where none) for BPF ids; new stacks are written once."""
        stack_ids = np.asarray(stack_ids, dtype=np.int64)
        out = np.full(stack_ids.shape, -1, dtype=np.int64)
        if stack_ids.size == 0:
            return out
        pids = np.asarray(pids)
        rows: list[tuple] = []
        uniq, inverse = np.unique(stack_ids, return_inverse=True)
        mapped = np.full(uniq.shape, -1, dtype=np.int64)
        first_pid = {}
        for i, pid in zip(inverse.tolist(), pids.tolist()):
            first_pid.setdefault(i, pid)
        # New pids are examined, known ones re-examined if they exec'd.
        self.prepare(sorted(set(first_pid.values())))
        done: list[int] = []
        with self._lock:
            for k, bpf_id in enumerate(uniq.tolist()):
                if bpf_id < 0:
                    continue
                key = (int(first_pid[k]), bpf_id)
                hit = self._ids.get(key)
                if hit is None or key in self._retry:
                    # A stack with a frame that could not be read while its process ran (a
                    # read racing a change) is read again while the record is there (the
                    # call site recurred); the stack read before stays the answer otherwise.
                    again, partial = self._resolve_one(bpf_id, key[0], rows, count_missing=hit is None)
                    done.append(bpf_id)
                    if again is not None:
                        if len(self._ids) >= MAX_CACHED_IDS:
                            self._ids.clear()
                            self._retry.clear()
                        self._ids[key] = hit = again
                        if partial and exec_signature(key[0]) is not None:
                            self._retry.add(key)
                        else:
                            self._retry.discard(key)
                    if hit is None:
                        # Never will be (its image or its code is gone): the slot goes back
                        # all the same, or a daemon's map would fill with such records.
                        continue
                mapped[k] = hit
        out[:] = mapped[inverse]
        if rows:
            self._write(rows)
        # Records read leave the BPF map: it holds only call sites not read
        # yet, so a long session never fills it (a site seen again is
        # re-inserted once and found in self._ids).
        table = self.bpf.get_table("ingero_stacks")
        for bpf_id in done:
            discard(table, table.Key(bpf_id))
        return out

    def frames(self, bpf_id: int, pid: int) -> list[tuple]:
        """Resolved frames of one BPF id, innermost first:
        (frame_kind, function, module, file, line, source)."""
        with self._lock:
            early = self._early.pop(bpf_id, None)
        if early is not None:
            return early[1]
        table = self.bpf.get_table("ingero_stacks")
        try:
            rec = table[table.Key(bpf_id)]
        except KeyError:
            return []
        return self._frames_of(rec, pid)

    def _drain_early(self) -> None:
        """Resolve the records BPF stored since the last round, while their
        processes are alive (a flush comes ~1 s later, maybe after the exit)."""
        table = self.bpf.get_table("ingero_stacks")
        now = time.monotonic()
        with self._lock:
            while self._early:  # oldest first (insertion order): drop what nobody asked for
                oldest = next(iter(self._early))
                if now - self._early[oldest][0] < EARLY_TTL_S and len(self._early) < MAX_EARLY:
                    break
                del self._early[oldest]
        deadline = now + DRAIN_BUDGET_S
        for key in list(table.keys()):
            if time.monotonic() > deadline:  # exec checks must not wait behind a burst of new stacks
                return
            bpf_id = key.value
            with self._lock:
                if bpf_id in self._early:
                    continue
                full = len(self._early) >= MAX_EARLY  # then resolve() reads it, as it comes
            try:
                rec = table[key]
            except KeyError:
                continue
            tgid = int(rec.tgid)
            known = (tgid, bpf_id) in self._ids
            frames = [] if known or full else self._frames_of(rec, tgid)
            with self._lock:
                # resolve() may have read and deleted it meanwhile: then nobody would pop this
                if frames and (tgid, bpf_id) not in self._ids:
                    self._early[bpf_id] = (time.monotonic(), frames)
            # A record of a process gone, that nothing resolves, goes too: its events may
            # never reach resolve() (dropped), and it would hold its slot for the session.
            if known or frames or exec_signature(tgid) is None:
                discard(table, key)

    def _frames_of(self, rec: StackRecord, pid: int) -> list[tuple]:
        pid = int(rec.tgid) or pid
        with self._lock:
            proc = self.procs.get(pid) or self._ensure(pid)
            if rec.generation:
                # Code addresses (and native ones) belong to the image the
                # walk was made in; a record from before an exec must not be
                # read in the new image.
                proc = self.images.get(int(rec.generation))
                if proc is None:
                    return []
        native = self._native(proc, rec)
        python = self._python(proc, rec)
        if not python:
            return native
        # Native frames above the interpreter (the library called from
        # Python: libcudart, ctypes, ...), then the Python frames.
        merged = []
        for f in native:
            if f[2] in proc.interp_files or f[1] == symbols.UNKNOWN:
                break
            merged.append(f)
        return merged + python

    def _resolve_one(self, bpf_id: int, pid: int, rows: list[tuple],
                     count_missing: bool = True) -> tuple[int | None, bool]:
        """(stored id or None, whether a frame of it was unreadable)."""
        frames = self.frames(bpf_id, pid)
        if not frames:
            self.stats["missing"] += count_missing
            return None, False
        sid = content_id(frames)
        if sid not in self._stored:
            self._stored.add(sid)
            for depth, f in enumerate(frames):
                rows.append((sid, depth) + f)
            self.stats["stacks"] += 1
            self.stats["frames"] += len(frames)
        return sid, any(f[1] == UNREADABLE for f in frames)

    def _native(self, proc: _Proc, rec: StackRecord) -> list[tuple]:
        out = []
        for addr in rec.native[:max(0, min(int(rec.native_n), NATIVE_MAX_FRAMES))]:
            nf = proc.native.symbolize(addr)
            self.stats["native_frames"] += 1
            if nf.function == symbols.UNKNOWN:
                self.stats["native_unknown"] += 1
            out.append(("native", nf.function, nf.module, None, None, None))
        return out

    def _python(self, proc: _Proc, rec: StackRecord) -> list[tuple]:
        if proc.code is None:
            return []
        out = []
        for i in range(min(int(rec.nframes), PY_MAX_FRAMES)):
            fr = proc.code.frame(int(rec.code[i]), int(rec.instr[i]))
            self.stats["python_frames"] += 1
            if fr is None:
                if proc.code.not_code(int(rec.code[i])):
                    continue  # an entry frame (3.13's executable is None): the interpreter's, not user code
                self.stats["python_unreadable"] += 1
                out.append(("python", UNREADABLE, None, None, None, None))
                continue
            if fr.function in _SYNTHETIC_FRAMES:
                continue
            out.append(("python", fr.function, fr.filename, fr.filename, fr.line,
                        source_line(proc.pid, fr.filename, fr.line)))
        if all(f[1] == UNREADABLE for f in out):
            return []
        return out

    def _write(self, rows: list[tuple]) -> None:
        import pyarrow as pa

        ids = sorted({r[0] for r in rows})
        existing = {
            r[0]
            for r in self.store.con.execute(
                "SELECT DISTINCT stack_id FROM stacks WHERE list_contains($ids, stack_id)", {"ids": ids}
            ).fetchall()
        }
        rows = [r for r in rows if r[0] not in existing]
        if not rows:
            return
        cols = list(zip(*rows))
        batch = pa.table({
            "stack_id": pa.array(cols[0], pa.int64()),
            "depth": pa.array(cols[1], pa.int32()),
            "frame_kind": pa.array(cols[2], pa.string()),
            "function": pa.array(cols[3], pa.string()),
            "module": pa.array(cols[4], pa.string()),
            "file": pa.array(cols[5], pa.string()),
            "line": pa.array(cols[6], pa.int32()),
            "source": pa.array(cols[7], pa.string()),
        })
        self.store.append("stacks", batch)
