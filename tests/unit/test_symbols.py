"""Native symbolisation against this very process's mappings."""

from __future__ import annotations

import ctypes
import os


from ingero.collect import symbols
from ingero.collect.symbols import ElfSymbols, NativeSymbolizer, read_maps


def _addr(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def test_libc_function_resolves_to_its_name_and_module():
    libc = ctypes.CDLL("libc.so.6")
    addr = _addr(libc.getpid)
    frame = NativeSymbolizer(os.getpid()).symbolize(addr + 1)  # inside, not only at the entry
    assert frame.function in ("getpid", "__getpid")
    assert os.path.basename(frame.module).startswith("libc.so")
    assert frame.offset == 1


def test_interpreter_function_resolves():
    addr = _addr(ctypes.pythonapi.PyObject_GetAttr)
    frame = NativeSymbolizer(os.getpid()).symbolize(addr)
    assert frame.function == "PyObject_GetAttr"
    assert frame.offset == 0


def test_runtime_address_of_data_symbol_matches_the_loader():
    """_PyRuntime (in .data/.bss) mapped through segments must equal what dlsym says."""
    want = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    maps = read_maps(os.getpid())
    for path in dict.fromkeys(m.path for m in maps):
        elf = ElfSymbols.load(path)
        sym = elf.lookup_name("_PyRuntime") if elf else None
        if sym is not None:
            assert elf.runtime_address(sym, [m for m in maps if m.path == path]) == want
            return
    raise AssertionError("no mapped file defines _PyRuntime")


def test_unmapped_address_is_unknown():
    frame = NativeSymbolizer(os.getpid()).symbolize(0x10)
    assert frame == symbols.NativeFrame(symbols.UNKNOWN, symbols.UNKNOWN, 0x10)


def test_address_in_gap_after_sized_symbol_is_unknown_function():
    sym = symbols.Symbol("f", 0x1000, 0x10)
    elf = ElfSymbols("x", [sym, symbols.Symbol("g", 0x2000, 0x10)], [])
    assert elf.lookup(0x1008) == sym
    assert elf.lookup(0x1800) is None
    assert elf.lookup(0x0fff) is None


def test_maps_skip_anonymous_and_keep_deleted_paths(tmp_path, monkeypatch):
    fake = tmp_path / "maps"
    fake.write_text(
        "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/x\n"
        "7f00-8f00 rw-p 00000000 00:00 0 \n"
        "9000-a000 r-xp 00001000 08:02 1 /tmp/lib.so (deleted)\n"
        "b000-c000 r--p 00000000 00:00 0 [vdso]\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(fake if p == "/proc/1/maps" else p, *a, **k))
    maps = read_maps(1)
    assert [(m.start, m.path, m.offset) for m in maps] == [(0x400000, "/usr/bin/x", 0), (0x9000, "/tmp/lib.so", 0x1000)]


def test_fast_elf_reader_agrees_with_pyelftools():
    """The struct-based reader and pyelftools see the same functions and segments."""
    path = next((m.path for m in read_maps(os.getpid()) if os.path.basename(m.path).startswith("libm.so")), None)
    if path is None:
        path = next(m.path for m in read_maps(os.getpid()) if os.path.basename(m.path).startswith("libc.so"))
    with open(path, "rb") as f:
        fast = symbols._parse_elf64le(path, f.read())
    slow = symbols._load_pyelftools(path)
    funcs = {(s.name, s.value, s.size) for s in slow.symbols}
    mine = {(s.name, s.value, s.size) for s in fast.symbols}
    # pyelftools cannot name STT_GNU_IFUNC (it says STT_LOOS): the fast reader keeps more, never fewer.
    assert funcs <= mine and len(funcs) > 100
    assert ([(g.vaddr, g.offset, g.filesz) for g in fast.segments]
            == [(g.vaddr, g.offset, g.filesz) for g in slow.segments])


def test_an_address_inside_a_data_object_is_not_a_call_site() -> None:
    """_PyRuntime is found by name (the frame walker needs it) but an address
    inside it, as a stale stack word can hold, never symbolises as a frame."""
    import sys

    from ingero.collect.symbols import ElfSymbols

    elf = ElfSymbols.load(os.path.realpath(sys.executable))
    runtime = elf.lookup_name("_PyRuntime") if elf else None
    if runtime is None:
        import pytest

        pytest.skip("this interpreter keeps _PyRuntime in libpython")
    assert not runtime.code
    hit = elf.lookup(runtime.value + 8)
    assert hit is None or hit.code
    assert all(s.code for s in elf.symbols)


def test_parse_elf_reads_a_mapped_file_with_its_local_symbols(tmp_path):
    """static_runtime.py hands parse_elf an mmap: local functions (nm 't') are there, as from bytes."""
    import mmap
    import subprocess

    src = tmp_path / "p.c"
    src.write_text("__attribute__((noinline)) static int cudaMalloc(void) { return 35; }\n"
                   "int main(void) { return cudaMalloc(); }\n")
    exe = tmp_path / "p"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    nm = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    (want,) = [int(line.split()[0], 16) for line in nm.splitlines() if line.endswith(" t cudaMalloc")]
    with open(exe, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        mapped = symbols.parse_elf(str(exe), mm)
    assert mapped.lookup_name("cudaMalloc").value == want
    assert mapped.lookup(want).name == "cudaMalloc"
    assert [s.name for s in mapped.symbols] == [s.name for s in symbols.parse_elf(str(exe), exe.read_bytes()).symbols]
