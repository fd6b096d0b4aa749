"""CPython internals for --stack: layouts, finding the interpreter, code objects.

What bpf/stack.h needs per process (``PyLayout``): where ``_PyRuntime`` is,
and the offsets that lead from it to the current thread's frame chain.  What
user space needs afterwards (``CodeReader``): for a (code object address,
instruction pointer) pair, the function, the file and the line being
executed -- decoded from the code object's line table, never the function's
first line.

Layouts:
* 3.13+: read from ``_PyRuntime.debug_offsets`` (``_Py_DebugOffsets``, made
  for out-of-process tools) in the target's memory, so patch releases and
  vendor builds are handled without a table;
* 3.10 - 3.12: per-version tables below, derived from the public struct
  layouts (``offsetof`` over each version's headers with Py_BUILD_CORE, x86-64
  / LP64) and verified by tests against live interpreters.

Interpreters linked statically (Debian's /usr/bin/python3.11) and against
libpython (pyenv, most distributions' python3.X-dbg, conda) both work: the
``_PyRuntime`` symbol is looked up in every mapped ELF file whose name says
python.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, replace

from ingero.collect.symbols import ElfSymbols, read_maps

_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")

# Upper bounds that keep a corrupt or hostile target from making us read a lot.
MAX_STRING_BYTES = 4096
MAX_LINETABLE_BYTES = 1 << 20
# glibc's struct pthread keeps the kernel tid within its first few hundred
# bytes (0x2d0 in glibc 2.36 x86-64); scanned only for 3.10.
PTHREAD_TID_SCAN_BYTES = 2048
# x86-64 user addresses are below 2^47 (2^56 with 5-level paging).
USER_ADDR_LIMIT = 1 << 56


@dataclass(frozen=True)
class PyLayout:
    """Offsets for one CPython version (bytes, x86-64)."""

    version: tuple[int, int]
    interp_head: int        # _PyRuntime.interpreters.head
    threads_head: int       # PyInterpreterState.threads.head (tstate_head in 3.10)
    tstate_next: int
    tstate_tid: int         # native_thread_id (3.11+) / thread_id = pthread_t (3.10)
    tid_is_pthread: bool
    tstate_frame: int       # cframe (3.11, 3.12) / current_frame (3.13) / frame (3.10)
    cframe_frame: int       # offset of current_frame in _PyCFrame, -1 without cframe
    frame_code: int         # f_code / f_executable
    frame_previous: int     # previous / f_back
    frame_instr: int        # prev_instr / instr_ptr (pointers) / f_lasti (3.10, int)
    code_filename: int
    code_name: int
    code_qualname: int      # -1 before 3.11
    code_firstlineno: int
    code_linetable: int
    code_adaptive: int      # co_code_adaptive (instructions inline), -1 before 3.11
    unicode_ascii_size: int      # sizeof(PyASCIIObject): data of compact ASCII strings
    unicode_compact_size: int    # sizeof(PyCompactUnicodeObject): other compact strings
    unicode_state: int
    unicode_length: int
    bytes_size: int         # PyBytesObject.ob_size
    bytes_sval: int         # PyBytesObject.ob_sval


# Measured with offsetof() over the installed headers of 3.10.13, 3.11.2
# (Debian), 3.11.7 and 3.12.1 (pyenv), compiled with Py_BUILD_CORE.
LAYOUTS: dict[tuple[int, int], PyLayout] = {
    (3, 10): PyLayout(
        version=(3, 10), interp_head=32, threads_head=8, tstate_next=8,
        tstate_tid=176, tid_is_pthread=True, tstate_frame=24, cframe_frame=-1,
        frame_code=32, frame_previous=24, frame_instr=96,
        code_filename=104, code_name=112, code_qualname=-1, code_firstlineno=40,
        code_linetable=120, code_adaptive=-1,
        unicode_ascii_size=48, unicode_compact_size=72, unicode_state=32, unicode_length=16,
        bytes_size=16, bytes_sval=32,
    ),
    (3, 11): PyLayout(
        version=(3, 11), interp_head=40, threads_head=16, tstate_next=8,
        tstate_tid=160, tid_is_pthread=False, tstate_frame=56, cframe_frame=8,
        frame_code=32, frame_previous=48, frame_instr=56,
        code_filename=112, code_name=120, code_qualname=128, code_firstlineno=72,
        code_linetable=136, code_adaptive=184,
        unicode_ascii_size=48, unicode_compact_size=72, unicode_state=32, unicode_length=16,
        bytes_size=16, bytes_sval=32,
    ),
    (3, 12): PyLayout(
        version=(3, 12), interp_head=40, threads_head=72, tstate_next=8,
        tstate_tid=144, tid_is_pthread=False, tstate_frame=56, cframe_frame=0,
        frame_code=0, frame_previous=8, frame_instr=56,
        code_filename=112, code_name=120, code_qualname=128, code_firstlineno=68,
        code_linetable=136, code_adaptive=192,
        unicode_ascii_size=40, unicode_compact_size=56, unicode_state=32, unicode_length=16,
        bytes_size=16, bytes_sval=32,
    ),
}

# _Py_DebugOffsets (3.13): a cookie, then uint64 fields.  Index of each field
# we use, counted in uint64 words from the start of the struct (the cookie is
# word 0), from Include/internal/pycore_runtime.h of 3.13.
DEBUG_COOKIE = b"xdebugpy"
_DBG_WORDS = {
    "version": 1,
    "interp_head": 3 + 2,            # runtime_state: size, finalizing, interpreters_head
    "threads_head": 6 + 3,           # interpreter_state: size, id, next, threads_head
    "tstate_next": 19 + 2,           # thread_state: size, prev, next, interp, current_frame,
    "tstate_frame": 19 + 4,          #   thread_id, native_thread_id, ...
    "tstate_tid": 19 + 6,
    "frame_previous": 28 + 1,        # interpreter_frame: size, previous, executable, instr_ptr
    "frame_code": 28 + 2,
    "frame_instr": 28 + 3,
    "code_filename": 34 + 1,         # code_object: size, filename, name, qualname, linetable,
    "code_name": 34 + 2,             #   firstlineno, argcount, localsplusnames,
    "code_qualname": 34 + 3,         #   localspluskinds, co_code_adaptive
    "code_linetable": 34 + 4,
    "code_firstlineno": 34 + 5,
    "code_adaptive": 34 + 9,
    # then pyobject (2 words), type_object (4), tuple (3), list (3), dict (3),
    # float (2), long (3):
    "bytes_size": 64 + 1,            # bytes_object: size, ob_size, ob_sval
    "bytes_sval": 64 + 2,
    "unicode_state": 67 + 1,         # unicode_object: size, state, length, asciiobject_size
    "unicode_length": 67 + 2,
    "unicode_ascii_size": 67 + 3,
}                                    # then gc (2): 73 words in all
_DBG_READ_BYTES = 8 * 73


class ProcessMemory:
    """Reads another process's memory through /proc/PID/mem (needs ptrace access: root or parent)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "ProcessMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, addr: int, size: int) -> bytes:
        # Garbage pointers (a frame read while it changed) are common enough:
        # anything outside the x86-64 user half is refused without a syscall.
        if addr <= 0 or size <= 0 or addr + size > USER_ADDR_LIMIT:
            return b""
        try:
            return os.pread(self._fd, size, addr)
        except (OSError, OverflowError):
            return b""

    def u64(self, addr: int) -> int:
        b = self.read(addr, 8)
        return _U64.unpack(b)[0] if len(b) == 8 else 0

    def i32(self, addr: int) -> int:
        b = self.read(addr, 4)
        return _I32.unpack(b)[0] if len(b) == 4 else 0

    def u32(self, addr: int) -> int:
        b = self.read(addr, 4)
        return _U32.unpack(b)[0] if len(b) == 4 else 0


@dataclass(frozen=True)
class Interpreter:
    """A CPython runtime found in a process."""

    pid: int
    version: tuple[int, int]
    runtime_addr: int       # &_PyRuntime
    binary: str             # the ELF file that defines _PyRuntime
    layout: PyLayout
    pthread_tid: int = -1   # 3.10: offset of the tid inside glibc's struct pthread
    # &_Py_NoneStruct where it is found (3.13's entry frames hold None as their executable):
    # libpython's, and the executable's own copy when it embeds Python and uses Py_None (a
    # copy relocation moves the object there, and libpython's goes unused)
    none_addrs: tuple[int, ...] = ()


_VERSION_RE = re.compile(r"python(\d)\.(\d+)")


def _version_from_name(path: str) -> tuple[int, int] | None:
    m = _VERSION_RE.search(os.path.basename(path))
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_interpreter(pid: int, mem: ProcessMemory | None = None) -> Interpreter | None:
    """The CPython runtime of ``pid``, or None when it is not a (supported) CPython process."""
    maps = read_maps(pid)
    exe = _readlink(f"/proc/{pid}/exe")
    candidates: list[str] = []
    for path in dict.fromkeys(m.path for m in maps):
        base = os.path.basename(path)
        if path == exe or base.startswith("libpython"):
            candidates.append(path)
    own = mem is None
    mem = mem or ProcessMemory(pid)
    try:
        for path in candidates:
            elf = ElfSymbols.load(_host_path(pid, path))
            if elf is None:
                continue
            addr = _symbol_address(elf, path, "_PyRuntime", maps)
            if addr is None:
                continue
            version = _version_from_name(path) or _version_from_name(exe or "")
            if version is None:
                continue
            layout = _layout(version, mem, addr)
            if layout is None:
                return None
            nones = (_symbol_address(elf, path, "_Py_NoneStruct", maps),
                     _symbol_address(ElfSymbols.load(_host_path(pid, exe)), exe, "_Py_NoneStruct", maps)
                     if exe and exe != path else None)
            interp = Interpreter(pid, version, addr, path, layout, none_addrs=tuple(a for a in nones if a))
            if layout.tid_is_pthread:
                interp = replace(interp, pthread_tid=_pthread_tid_offset(mem, interp))
            return interp
        return None
    finally:
        if own:
            mem.close()


def _symbol_address(elf: ElfSymbols | None, path: str, name: str, maps) -> int | None:
    """Where ``name``, defined in ``elf`` (the file mapped as ``path``), lives in the process."""
    sym = elf.lookup_name(name) if elf else None
    return elf.runtime_address(sym, [m for m in maps if m.path == path]) if sym else None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _host_path(pid: int, path: str) -> str:
    """The file as seen from here (through the target's root, for containers)."""
    via_root = f"/proc/{pid}/root{path}"
    return via_root if os.path.exists(via_root) else path


def _layout(version: tuple[int, int], mem: ProcessMemory, runtime_addr: int) -> PyLayout | None:
    if version == (3, 13):  # 3.14 reshaped _Py_DebugOffsets: not read until verified
        return layout_from_debug_offsets(mem.read(runtime_addr, _DBG_READ_BYTES), version)
    return LAYOUTS.get(version)


def layout_from_debug_offsets(raw: bytes, version: tuple[int, int]) -> PyLayout | None:
    """A PyLayout from the bytes of ``_Py_DebugOffsets`` (the head of 3.13's _PyRuntime)."""
    if len(raw) < _DBG_READ_BYTES or raw[:8] != DEBUG_COOKIE:
        return None
    words = struct.unpack_from(f"<{_DBG_READ_BYTES // 8 - 1}Q", raw, 8)

    def w(name: str) -> int:
        return words[_DBG_WORDS[name] - 1]

    return PyLayout(
        version=version,
        interp_head=w("interp_head"), threads_head=w("threads_head"),
        tstate_next=w("tstate_next"), tstate_tid=w("tstate_tid"), tid_is_pthread=False,
        tstate_frame=w("tstate_frame"), cframe_frame=-1,
        frame_code=w("frame_code"), frame_previous=w("frame_previous"), frame_instr=w("frame_instr"),
        code_filename=w("code_filename"), code_name=w("code_name"), code_qualname=w("code_qualname"),
        code_firstlineno=w("code_firstlineno"), code_linetable=w("code_linetable"),
        code_adaptive=w("code_adaptive"),
        # sizeof(PyCompactUnicodeObject) = PyASCIIObject + utf8_length + utf8 (3.12+).
        unicode_ascii_size=w("unicode_ascii_size"), unicode_compact_size=w("unicode_ascii_size") + 16,
        unicode_state=w("unicode_state"), unicode_length=w("unicode_length"),
        bytes_size=w("bytes_size"), bytes_sval=w("bytes_sval"),
    )


def thread_states(mem: ProcessMemory, interp: Interpreter, limit: int = 256) -> list[int]:
    """Addresses of the PyThreadStates of the main interpreter."""
    lay = interp.layout
    head = mem.u64(interp.runtime_addr + lay.interp_head)
    ts = mem.u64(head + lay.threads_head) if head else 0
    out: list[int] = []
    while ts and len(out) < limit:
        out.append(ts)
        ts = mem.u64(ts + lay.tstate_next)
    return out


def _pthread_tid_offset(mem: ProcessMemory, interp: Interpreter) -> int:
    """3.10: where glibc keeps the kernel tid in struct pthread (found from the main thread)."""
    for ts in thread_states(mem, interp):
        pthread = mem.u64(ts + interp.layout.tstate_tid)
        blob = mem.read(pthread, PTHREAD_TID_SCAN_BYTES)
        want = _U32.pack(interp.pid)
        for off in range(0, len(blob) - 3, 4):
            if blob[off:off + 4] == want:
                return off
    return -1


def tstate_tid(mem: ProcessMemory, interp: Interpreter, ts: int) -> int:
    lay = interp.layout
    if lay.tid_is_pthread:
        pthread = mem.u64(ts + lay.tstate_tid)
        return mem.u32(pthread + interp.pthread_tid) if pthread and interp.pthread_tid >= 0 else 0
    return mem.u32(ts + lay.tstate_tid)


def walk_thread(mem: ProcessMemory, interp: Interpreter, tid: int, max_frames: int = 256) -> list[tuple[int, int]]:
    """(code address, instr) of each Python frame of thread ``tid``, innermost first.

    The user-space twin of the walk in bpf/stack.h: used by tests and to
    measure what walking at event time from user space would cost.
    """
    lay = interp.layout
    for ts in thread_states(mem, interp):
        if tstate_tid(mem, interp, ts) != tid:
            continue
        frame = mem.u64(ts + lay.tstate_frame)
        if lay.cframe_frame >= 0 and frame:
            frame = mem.u64(frame + lay.cframe_frame)
        out = []
        while frame and len(out) < max_frames:
            out.append((mem.u64(frame + lay.frame_code), mem.u64(frame + lay.frame_instr)))
            frame = mem.u64(frame + lay.frame_previous)
        return out
    return []


# ---------------------------------------------------------------- line tables


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """3.11+ location-table varint: 6-bit chunks, bit 6 = more follow."""
    b = data[i]
    i += 1
    val = b & 63
    shift = 0
    while b & 64:
        b = data[i]
        i += 1
        shift += 6
        val |= (b & 63) << shift
    return val, i


def _svarint(data: bytes, i: int) -> tuple[int, int]:
    val, i = _varint(data, i)
    return (-(val >> 1) if val & 1 else val >> 1), i


def line_ranges_311(linetable: bytes, firstlineno: int) -> list[tuple[int, int, int | None]]:
    """Decode a 3.11+ ``co_linetable`` into (start, end, line) code-unit ranges.

    Entry header byte: 1CCCCLLL (C = code, L = length - 1 in code units).
    Codes 0-9 short form and 10-12 one-line form keep or move the line by
    code - 10; 13 carries a signed line delta; 14 the long form (line delta,
    end line, columns); 15 means no location.
    """
    out: list[tuple[int, int, int | None]] = []
    line = firstlineno
    pos = 0
    i = 0
    n = len(linetable)
    while i < n:
        head = linetable[i]
        i += 1
        code = (head >> 3) & 15
        length = (head & 7) + 1
        this: int | None
        if code == 15:
            this = None
        elif code == 14:
            delta, i = _svarint(linetable, i)
            line += delta
            this = line
            _, i = _varint(linetable, i)  # end line delta
            _, i = _varint(linetable, i)  # column + 1
            _, i = _varint(linetable, i)  # end column + 1
        elif code == 13:
            delta, i = _svarint(linetable, i)
            line += delta
            this = line
        elif code >= 10:
            line += code - 10
            this = line
            i += 2  # start column, end column
        else:
            this = line
            i += 1  # column bits
        out.append((pos, pos + length, this))
        pos += length
    return out


def line_ranges_310(linetable: bytes, firstlineno: int) -> list[tuple[int, int, int | None]]:
    """Decode a 3.10 ``co_linetable``: (byte delta, signed line delta) pairs; -128 = no line.

    Ranges are returned in code units (2 bytes) to match f_lasti.
    """
    out: list[tuple[int, int, int | None]] = []
    line = firstlineno
    addr = 0
    for k in range(0, len(linetable) - 1, 2):
        sdelta = linetable[k]
        ldelta = linetable[k + 1]
        if ldelta >= 128:
            ldelta -= 256
        end = addr + sdelta
        if ldelta == -128:
            this = None
        else:
            line += ldelta
            this = line
        if end > addr:
            out.append((addr // 2, end // 2, this))
        addr = end
    return out


def line_for(ranges: list[tuple[int, int, int | None]], index: int, firstlineno: int) -> int:
    """Line of code unit ``index``; before the first instruction: the def line."""
    if index < 0:
        return firstlineno
    for start, end, line in ranges:
        if start <= index < end:
            return line if line is not None else firstlineno
    return firstlineno


# ------------------------------------------------------------ code objects


@dataclass(frozen=True)
class CodeInfo:
    name: str
    filename: str
    firstlineno: int
    ranges: tuple[tuple[int, int, int | None], ...]


@dataclass(frozen=True)
class PyFrame:
    function: str
    filename: str
    line: int


class CodeReader:
    """Reads code objects of one process, cached per code address.

    An address does not name one code object for the life of a process: a
    module body's code is freed once its import ran, and the next code object
    allocated may land at the same address (measured: a function of the
    script at the address of fnmatch's module code, so every call from that
    function was put on fnmatch.py's lines).  So a cached entry carries its
    *stamp* -- the code object's name, qualname, filename and line-table
    pointers and first line, one read -- and is used only while the stamp
    still matches; after the process exited (nothing readable) the last entry
    read is the best there is.
    """

    def __init__(self, mem: ProcessMemory, interp: Interpreter):
        self.mem = mem
        self.interp = interp
        self.cache: dict[int, tuple[bytes, CodeInfo]] = {}
        lay = interp.layout
        offs = [o for o in (lay.code_filename, lay.code_name, lay.code_qualname, lay.code_linetable,
                            lay.code_firstlineno) if o >= 0]
        self._stamp_at, self._stamp_len = min(offs), max(offs) + 8 - min(offs)

    def stamp(self, addr: int) -> bytes:
        """What identifies the code object at ``addr`` now; b"" when unreadable."""
        b = self.mem.read(addr + self._stamp_at, self._stamp_len)
        return b if len(b) == self._stamp_len else b""

    def code(self, addr: int) -> CodeInfo | None:
        stamp = self.stamp(addr)
        hit = self.cache.get(addr)
        if hit is not None and (not stamp or stamp == hit[0]):
            return hit[1]
        if not stamp:
            return None
        info = self._read_code(addr)
        # Not remembered when the read failed (it may be transient) or the object
        # changed while it was read (the stamp would belong to the old one).
        if info is not None and self.stamp(addr) == stamp:
            self.cache[addr] = (stamp, info)
        return info

    def not_code(self, addr: int) -> bool:
        """True when ``addr`` is None: the executable of an interpreter entry frame (3.13), not
        user code.  Told positively, by address: a freed code object is not code any more
        either (its header is the allocator's then), and it must stay an unreadable frame."""
        return addr in self.interp.none_addrs

    def frame(self, code_addr: int, instr: int) -> PyFrame | None:
        info = self.code(code_addr)
        if info is None:
            return None
        index = self.instr_index(code_addr, instr)
        if info.ranges and index >= info.ranges[-1][1]:
            # past the code's last instruction: the object at this address is not the one the
            # frame ran (replaced between the event and this read)
            return None
        return PyFrame(info.name, info.filename, line_for(list(info.ranges), index, info.firstlineno))

    def instr_index(self, code_addr: int, instr: int) -> int:
        """Code-unit index of the instruction being executed."""
        lay = self.interp.layout
        if lay.code_adaptive < 0:  # 3.10: f_lasti (an int; the upper half of the word is f_lineno)
            lasti = instr & 0xFFFFFFFF
            return lasti - (1 << 32) if lasti >= 1 << 31 else lasti
        return (instr - (code_addr + lay.code_adaptive)) // 2

    def _read_code(self, addr: int) -> CodeInfo | None:
        lay = self.interp.layout
        m = self.mem
        name_off = lay.code_qualname if lay.code_qualname >= 0 else lay.code_name
        name = self.read_str(m.u64(addr + name_off))
        filename = self.read_str(m.u64(addr + lay.code_filename))
        if name is None or filename is None:
            return None
        first = m.i32(addr + lay.code_firstlineno)
        table = self.read_bytes(m.u64(addr + lay.code_linetable))
        if table is None:
            return None
        decode = line_ranges_310 if self.interp.version < (3, 11) else line_ranges_311
        try:
            ranges = tuple(decode(table, first))
        except IndexError:  # torn read of a table being freed
            return None
        return CodeInfo(name, filename, first, ranges)

    def read_str(self, addr: int) -> str | None:
        """A compact str object (every identifier and filename is one)."""
        if not addr:
            return None
        lay = self.interp.layout
        head = self.mem.read(addr, lay.unicode_compact_size)
        if len(head) < lay.unicode_compact_size:
            return None
        length = _U64.unpack_from(head, lay.unicode_length)[0]
        state = _U32.unpack_from(head, lay.unicode_state)[0]
        kind = (state >> 2) & 7
        compact = (state >> 5) & 1
        ascii_ = (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or length > MAX_STRING_BYTES:
            return None
        if ascii_:
            data = self.mem.read(addr + lay.unicode_ascii_size, length)
            return data.decode("ascii", "replace")
        data = self.mem.read(addr + lay.unicode_compact_size, length * kind)
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        return data.decode(codec, "replace")

    def read_bytes(self, addr: int) -> bytes | None:
        if not addr:
            return None
        lay = self.interp.layout
        size = self.mem.u64(addr + lay.bytes_size)
        if size > MAX_LINETABLE_BYTES:
            return None
        return self.mem.read(addr + lay.bytes_sval, size) if size else b""
