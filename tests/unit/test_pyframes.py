"""CPython layouts and line tables, checked against live interpreters.

The running interpreter (the venv's, 3.11) is checked in-process; every other
CPython found under pyenv is checked by running it as a child that dumps its
own code objects' line tables and expected lines, so each version's decoder
and layout is proven on that version's real data.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import threading
import types
from pathlib import Path

import prereqs
import pytest

from ingero.collect import pyframes, stacks
from ingero.collect.pyframes import (
    CodeReader, ProcessMemory, find_interpreter, line_ranges_310, line_ranges_311, walk_thread,
)

ROOT = Path(__file__).resolve().parents[2]
PYENV = Path("/root/.pyenv/versions")


def _code_objects(limit=4000):
    """Code objects of many stdlib modules, nested ones included."""
    import asyncio  # noqa: F401  (big, varied code)
    import email.parser  # noqa: F401
    import json as _json  # noqa: F401

    seen, out = set(), []
    stack = []
    for mod in list(sys.modules.values()):
        for obj in list(vars(mod).values()):
            code = getattr(obj, "__code__", None)
            if isinstance(code, types.CodeType):
                stack.append(code)
    while stack and len(out) < limit:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out


@pytest.mark.skipif(sys.version_info[:2] < (3, 11), reason="3.11+ location table")
def test_linetable_311_matches_co_positions_for_every_instruction():
    codes = _code_objects()
    assert len(codes) > 500
    checked = 0
    for code in codes:
        ranges = line_ranges_311(code.co_linetable, code.co_firstlineno)
        for index, pos in enumerate(code.co_positions()):
            want = pos[0] if pos[0] is not None else code.co_firstlineno
            assert pyframes.line_for(ranges, index, code.co_firstlineno) == want, (code, index)
            checked += 1
    assert checked > 50_000


def test_linetable_310_decoder_on_handmade_table():
    # firstlineno 10: bytes 0-5 -> line 11, 6-9 -> no line, 10-13 -> line 13 (+2 from 11)
    table = bytes([6, 1, 4, 0x80, 4, 2])
    ranges = line_ranges_310(table, 10)
    assert ranges == [(0, 3, 11), (3, 5, None), (5, 7, 13)]
    assert pyframes.line_for(ranges, 1, 10) == 11
    assert pyframes.line_for(ranges, 4, 10) == 10  # no line: reported at the def line
    assert pyframes.line_for(ranges, 6, 10) == 13
    assert pyframes.line_for(ranges, -1, 10) == 10  # not started yet


def test_linetable_311_long_and_negative_forms():
    # long form (code 14): line +300, end line, cols; then code 13: line -5
    def varint(v):
        out = bytearray()
        while True:
            chunk = v & 63
            v >>= 6
            out.append(chunk | (64 if v else 0))
            if not v:
                return bytes(out)

    def svarint(v):
        return varint((-v << 1) | 1 if v < 0 else v << 1)

    table = (bytes([0x80 | (14 << 3) | 1]) + svarint(300) + varint(0) + varint(5) + varint(9)
             + bytes([0x80 | (13 << 3) | 0]) + svarint(-5)
             + bytes([0x80 | (15 << 3) | 2]))
    assert line_ranges_311(table, 1) == [(0, 2, 301), (2, 3, 296), (3, 6, None)]


def test_layout_311_fields_point_at_the_right_objects():
    if sys.version_info[:2] != (3, 11):
        prereqs.missing("a Python 3.11 interpreter running the tests",
                        "the venv is built on Debian 12's python3.11 by make setup")
    lay = pyframes.LAYOUTS[(3, 11)]
    code = test_layout_311_fields_point_at_the_right_objects.__code__

    def word(addr):
        return ctypes.c_uint64.from_address(addr).value

    assert word(id(code) + lay.code_filename) == id(code.co_filename)
    assert word(id(code) + lay.code_qualname) == id(code.co_qualname)
    assert word(id(code) + lay.code_linetable) == id(code.co_linetable)
    assert ctypes.c_int32.from_address(id(code) + lay.code_firstlineno).value == code.co_firstlineno
    raw = ctypes.string_at(id(code) + lay.code_adaptive, len(code.co_code))
    assert raw[0] == code.co_code[0]  # first opcode (RESUME) is never specialised


def _line_here():
    return sys._getframe(1).f_lineno


def test_walk_own_thread_reports_the_executing_lines():
    interp = find_interpreter(os.getpid())
    assert interp is not None and interp.version == sys.version_info[:2]

    def inner():
        with ProcessMemory(os.getpid()) as mem:
            frames = walk_thread(mem, interp, threading.get_native_id())  # WALK
            reader = CodeReader(mem, interp)
            return [reader.frame(c, i) for c, i in frames]

    def outer():
        return inner(), _line_here() - 0  # OUTER

    got, outer_line = outer()
    names = [f.function for f in got]
    i = names.index("test_walk_own_thread_reports_the_executing_lines.<locals>.inner")
    src = Path(__file__).read_text().splitlines()
    walk_line = next(n for n, t in enumerate(src, 1) if t.rstrip().endswith("# WALK"))
    assert got[i].line == walk_line
    assert got[i].filename == __file__
    assert got[i + 1].function.endswith("outer") and got[i + 1].line == outer_line


CHILD = r'''
import json, sys, threading, types
def codes():
    seen, out, st = set(), [], []
    for m in list(sys.modules.values()):
        for o in list(vars(m).values()):
            c = getattr(o, "__code__", None)
            if isinstance(c, types.CodeType): st.append(c)
    while st and len(out) < 600:
        c = st.pop()
        if id(c) in seen: continue
        seen.add(id(c)); out.append(c)
        st.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out
rows = []
for c in codes():
    if sys.version_info >= (3, 11):
        want = [p[0] for p in c.co_positions()]
    else:
        want = [None] * (len(c.co_code) // 2)
        for s, e, l in c.co_lines():
            for k in range(s // 2, e // 2): want[k] = l
    rows.append([c.co_linetable.hex(), c.co_firstlineno, want])
print(json.dumps(rows))
def parked():
    ev.wait()  # PARKED
ev = threading.Event()
t = threading.Thread(target=parked); t.start()
print(threading.get_native_id(), t.native_id, flush=True)
sys.stdin.readline(); ev.set()
'''


def _pythons():
    found = {}
    for p in sorted(PYENV.glob("3.*/bin/python3.*")):
        m = re.fullmatch(r"python(3\.\d+)", p.name)
        if m and m.group(1) in ("3.10", "3.11", "3.12", "3.13"):
            found[m.group(1)] = p
    if not found:
        prereqs.missing("other CPython versions under /root/.pyenv", "pyenv install 3.10 3.12 3.13")
    return found


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_other_interpreters_line_tables_and_frames(version, tmp_path):
    py = _pythons().get(version)
    if py is None:
        prereqs.missing(f"python{version} under /root/.pyenv", f"pyenv install {version}")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([str(py), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        rows = json.loads(proc.stdout.readline())
        main_tid, worker_tid = map(int, proc.stdout.readline().split())
        decode = line_ranges_310 if version == "3.10" else line_ranges_311
        for table_hex, first, want in rows:
            ranges = decode(bytes.fromhex(table_hex), first)
            got = [pyframes.line_for(ranges, k, first) for k in range(len(want))]
            assert got == [w if w is not None else first for w in want]
        interp = find_interpreter(proc.pid)
        assert interp is not None and interp.version == tuple(map(int, version.split(".")))
        parked_line = next(n for n, t in enumerate(CHILD.splitlines(), 1) if t.endswith("# PARKED"))
        import time

        with ProcessMemory(proc.pid) as mem:
            reader = CodeReader(mem, interp)
            for _ in range(50):  # the worker may not have reached ev.wait() yet
                frames = [reader.frame(c, i) for c, i in walk_thread(mem, interp, worker_tid)]
                frames = [f for f in frames if f and f.function not in ("<interpreter trampoline>",)]
                if frames and frames[0].function == "Event.wait" or frames and frames[0].function == "wait":
                    break
                time.sleep(0.05)
            names = [f.function.rsplit(".", 1)[-1] for f in frames]
            k = names.index("parked")
            assert frames[k].line == parked_line and frames[k].filename == str(script)
            main = [reader.frame(c, i) for c, i in walk_thread(mem, interp, main_tid)]
            main_names = [f.function for f in main if f and f.function not in stacks._SYNTHETIC_FRAMES]
            assert main_names[-1] == "<module>"
    finally:
        proc.communicate("x\n", timeout=30)


def test_debug_offsets_rejects_bad_cookie():
    assert pyframes.layout_from_debug_offsets(b"\0" * 1024, (3, 13)) is None


def test_stack_header_constants_match_python_mirror():
    text = (ROOT / "bpf" / "stack.h").read_text()
    m = re.search(r"#define INGERO_PY_MAX_FRAMES (\d+)", text)
    assert int(m.group(1)) == stacks.PY_MAX_FRAMES
    m = re.search(r"#define INGERO_NATIVE_MAX_FRAMES (\d+)", text)
    assert int(m.group(1)) == stacks.NATIVE_MAX_FRAMES
    assert ctypes.sizeof(stacks.StackRecord) == 16 + 16 * stacks.PY_MAX_FRAMES + 8 * stacks.NATIVE_MAX_FRAMES
    body = re.search(r"struct ingero_stack \{(.*?)\};", text, re.S).group(1)
    assert re.findall(r"\b[us](?:16|32|64) (\w+)[;\[]", body) == [f[0] for f in stacks.StackRecord._fields_]
    assert ctypes.sizeof(stacks.PyProcConfig) == 64
    # Field order of struct ingero_py_proc as declared in stack.h.
    body = re.search(r"struct ingero_py_proc \{(.*?)\};", text, re.S).group(1)
    names = re.findall(r"\b[us](?:16|32|64) (\w+);", body)
    assert names == [f[0] for f in stacks.PyProcConfig._fields_]


@pytest.mark.parametrize("version", sorted(pyframes.LAYOUTS))
def test_frame_fields_fit_one_bpf_read(version):
    interp = pyframes.Interpreter(1, version, 0x1000, "python", pyframes.LAYOUTS[version])
    cfg = stacks.proc_config(interp, 7)
    assert cfg.generation == 7 and cfg.flags == stacks.PY_NO_NATIVE
    assert 0 < cfg.block_len <= stacks.FRAME_BLOCK
    for off in (cfg.frame_code, cfg.frame_previous, cfg.frame_instr):
        assert cfg.block_start <= off and off + 8 <= cfg.block_start + cfg.block_len
        assert (off - cfg.block_start) % 8 == 0


def test_bpf_text_inlines_stack_header(tmp_path):
    main = tmp_path / "prog.c"
    main.write_text('#include "events.h"\n#include "stack.h"\nint x;\n')
    out = stacks.bpf_text(main)
    assert '#include "events.h"' in out
    assert "ingero_stack_id(void *ctx)" in out
    assert f'#line 3 "{main}"' in out


def test_garbage_addresses_read_as_nothing():
    with ProcessMemory(os.getpid()) as mem:
        assert mem.read(0xFFFF_FFFF_FFFF_FF00, 8) == b""
        assert mem.read(1 << 63, 8) == b""
        assert mem.u64(0x10) == 0
        reader = CodeReader(mem, find_interpreter(os.getpid()))
        assert reader.frame(0xDEAD_BEEF_0000_0000, 0) is None
        assert reader.read_str(1 << 62) is None


class _Code:
    """A CodeReader stand-in: frames for the code addresses it knows, None (unreadable) for others."""

    ENTRY = 99  # the executable of an interpreter entry frame: readable, not a code object

    def __init__(self, known: dict[int, pyframes.PyFrame]):
        self.known = known

    def frame(self, code: int, instr: int):
        return self.known.get(code)

    def not_code(self, addr: int) -> bool:
        return addr == self.ENTRY


def _python_frames(known: dict[int, pyframes.PyFrame], codes: list[int]) -> list[tuple]:
    rec = stacks.StackRecord()
    rec.nframes = len(codes)
    for i, c in enumerate(codes):
        rec.code[i], rec.instr[i] = c, 0
    proc = types.SimpleNamespace(pid=os.getpid(), code=_Code(known))
    resolver = types.SimpleNamespace(stats={"python_frames": 0, "python_unreadable": 0})
    return stacks.StackResolver._python(resolver, proc, rec)


def test_an_unreadable_frame_keeps_its_depth():
    known = {2: pyframes.PyFrame("main", "/x/loop.py", 21), 3: pyframes.PyFrame("<module>", "/x/loop.py", 33)}
    frames = _python_frames(known, [1, 2, 3, _Code.ENTRY])
    assert [(f[1], f[3], f[4]) for f in frames] == [
        (stacks.UNREADABLE, None, None), ("main", "/x/loop.py", 21), ("<module>", "/x/loop.py", 33)]
    # nothing readable at all: no stack, as before
    assert _python_frames(known, [7, 8]) == []


def test_a_code_address_reused_by_another_code_object_is_read_again():
    """A module body's code is freed after its import, and the next code object may take its
    address: the reader must not keep naming the old one (it put a script's calls on fnmatch.py)."""
    interp = find_interpreter(os.getpid())
    with ProcessMemory(os.getpid()) as mem:
        reader = CodeReader(mem, interp)
        for i in range(1000):
            old = compile("x = 1\n", f"/x/old_{i}.py", "exec")
            addr = id(old)
            first = reader.code(addr)
            del old
            new = compile("y = 2\n", f"/x/new_{i}.py", "exec")
            if id(new) == addr:
                break
        else:
            pytest.fail("no freed code object's address was reused in 1000 tries")
        assert first.filename == f"/x/old_{i}.py"
        assert reader.code(addr).filename == f"/x/new_{i}.py"
        # once nothing can be read (the process exited), the last code read there is the answer
        reader.mem = types.SimpleNamespace(read=lambda a, n: b"")
        assert reader.code(addr).filename == f"/x/new_{i}.py"
        assert reader.code(addr + 4096) is None
        del new


def test_none_is_told_apart_from_a_freed_code_object():
    """3.13's entry frames hold None where a code object would be: the interpreter's, skipped.  A
    freed code object (its header the allocator's now) is not None: it stays an unreadable frame."""
    interp = find_interpreter(os.getpid())
    assert id(None) in interp.none_addrs
    with ProcessMemory(os.getpid()) as mem:
        reader = CodeReader(mem, interp)
        big = compile("\n".join(f"x{i} = {i}" for i in range(300)), "/x/big.py", "exec")  # malloc'd, not pymalloc
        addr = id(big)
        del big
        assert reader.not_code(id(None))
        assert not reader.not_code(addr)
        assert not reader.not_code(id("text"))


EMBED = r"""
#include <Python.h>
int main(void)
{
    Py_Initialize();
    PyObject *none = Py_None; /* a use of Py_None in the executable: a copy relocation puts it here */
    (void)none;
    PyRun_SimpleString("import sys, time; print(hex(id(None)), flush=True); sys.stdin.readline()");
    return 0;
}
"""


def test_none_of_a_program_that_embeds_python_is_its_own_copy(tmp_path):
    """A C program that embeds libpython and uses Py_None gets None copied into itself (a copy
    relocation): libpython's symbol is not where None lives there."""
    py = _pythons().get("3.13") or prereqs.missing("python3.13 under /root/.pyenv", "pyenv install 3.13")
    root = py.parent.parent
    src, exe = tmp_path / "embed.c", tmp_path / "embed"
    src.write_text(EMBED)
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src), f"-I{root}/include/python3.13", f"-L{root}/lib",
                    "-lpython3.13", f"-Wl,-rpath,{root}/lib"], check=True)
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        none = int(proc.stdout.readline(), 16)
        interp = find_interpreter(proc.pid)
        assert interp is not None and interp.version == (3, 13)
        assert none in interp.none_addrs
    finally:
        proc.kill()
        proc.wait()
