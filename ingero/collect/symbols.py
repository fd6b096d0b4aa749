"""Native symbolisation for --stack: address in a process -> (function, module).

Reads ELF ``.symtab`` (when not stripped) and ``.dynsym`` -- ELF64
little-endian directly with ``struct``, anything else with pyelftools -- and
maps addresses through /proc/PID/maps.  Our own rather than BCC's symbol
cache (``BPF.sym``) because it is testable without root, keeps working from
a snapshot of the maps after the process exited, and caches each ELF file
once for every process that maps it (every PyTorch worker maps the same
libcudart).
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from dataclasses import dataclass
from functools import lru_cache

# Function (and module) name of a frame that no symbol covers: stripped local
# functions, JIT code, garbage return addresses of a frame-pointer-less walk.
# A sized symbol covers [value, value + size); a size-0 one (assembly stubs)
# covers everything up to the next symbol, as perf and gdb report it.
UNKNOWN = "[unknown]"


@dataclass(frozen=True)
class MemoryMap:
    start: int
    end: int
    offset: int
    perms: str
    path: str


def read_maps(pid: int) -> list[MemoryMap]:
    """File-backed mappings of ``pid`` (anonymous and [special] ones are skipped)."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].strip()
                if not path.startswith("/"):
                    continue
                if path.endswith(" (deleted)"):
                    path = path[: -len(" (deleted)")]
                lo, hi = parts[0].split("-")
                out.append(MemoryMap(int(lo, 16), int(hi, 16), int(parts[2], 16), parts[1], path))
    except OSError:
        return []
    return out


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int   # virtual address in the ELF file
    size: int
    code: bool = True  # a function (FUNC/IFUNC); False: a data object, found by name only


@dataclass
class Segment:
    vaddr: int
    offset: int
    filesz: int
    memsz: int


class ElfSymbols:
    """Sorted function symbols and PT_LOAD segments of one ELF file.

    Data objects (_PyRuntime ...) are kept for lookup_name only: an address
    inside one is not a call site, so lookup() never answers with it.
    """

    def __init__(self, path: str, symbols: list[Symbol], segments: list[Segment]):
        self.path = path
        self.symbols = sorted((s for s in symbols if s.code), key=lambda s: s.value)
        self._starts = [s.value for s in self.symbols]
        self.segments = segments
        self._by_name = {s.name: s for s in symbols}

    @staticmethod
    def load(path: str) -> "ElfSymbols | None":
        try:
            st = os.stat(path)
        except OSError:
            return None
        return _load_cached(path, st.st_mtime_ns, st.st_size)

    def lookup_name(self, name: str) -> Symbol | None:
        return self._by_name.get(name)

    def lookup(self, vaddr: int) -> Symbol | None:
        """The function containing ``vaddr`` (an address in the file's own address space)."""
        i = bisect.bisect_right(self._starts, vaddr) - 1
        while i >= 0:
            sym = self.symbols[i]
            if sym.size == 0 or vaddr < sym.value + sym.size:
                return sym
            # A sized symbol that ends before vaddr: vaddr is in a gap (or in a
            # local symbol stripped away); look no further back than one.
            return None
        return None

    def file_offset_to_vaddr(self, off: int) -> int | None:
        for seg in self.segments:
            if seg.offset <= off < seg.offset + max(seg.filesz, 1):
                return seg.vaddr + (off - seg.offset)
        return None

    def vaddr_to_file_offset(self, vaddr: int) -> int | None:
        for seg in self.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.memsz:
                return seg.offset + (vaddr - seg.vaddr)
        return None

    def runtime_address(self, sym: Symbol, maps: list[MemoryMap]) -> int | None:
        """Where ``sym`` lives in a process that maps this file as ``maps``."""
        off = self.vaddr_to_file_offset(sym.value)
        if off is None or not maps:
            return None
        # .bss lies past the file's end: derive the load bias from any mapping
        # of the file and the segment layout.
        for m in maps:
            vaddr = self.file_offset_to_vaddr(m.offset)
            if vaddr is not None:
                bias = m.start - vaddr
                return sym.value + bias
        return None


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_PT_LOAD = 1
_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_STT_OBJECT = 1
_STT_KEPT = (_STT_OBJECT, 2, 10)  # OBJECT, FUNC, GNU_IFUNC


@lru_cache(maxsize=256)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> ElfSymbols | None:
    """ELF64 little-endian files (x86-64, arm64) are read directly with struct:
    ~50x faster than pyelftools, which matters when a process has just exec'd
    and its frames are waiting; anything else goes through pyelftools."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF":
        return None
    if data[4] != 2 or data[5] != 1:
        return _load_pyelftools(path)
    try:
        return _parse_elf64le(path, data)
    except (struct.error, IndexError, ValueError):
        return _load_pyelftools(path)


def parse_elf(path: str, data: bytes | mmap.mmap) -> ElfSymbols:
    """Symbols of an ELF64 little-endian file already read (or mapped), locals included.

    static_runtime.py reads a CUDA runtime linked into a program this way: its
    functions are local symbols of .symtab."""
    return _parse_elf64le(path, data)


def _parse_elf64le(path: str, data: bytes | mmap.mmap) -> ElfSymbols:
    (_, _, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = _EHDR.unpack_from(data, 0)
    segments = []
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = _PHDR.unpack_from(data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            segments.append(Segment(p_vaddr, p_offset, p_filesz, p_memsz))
    sections = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)] if shoff else []
    syms: dict[tuple[str, int], Symbol] = {}
    for kind in (_SHT_SYMTAB, _SHT_DYNSYM):
        for sh in sections:
            if sh[1] != kind or not sh[9]:
                continue
            strtab_sh = sections[sh[6]]
            strtab = data[strtab_sh[4]:strtab_sh[4] + strtab_sh[5]]
            table = data[sh[4]:sh[4] + sh[5]]
            for st_name, st_info, _, st_shndx, st_value, st_size in _SYM.iter_unpack(
                    table[: len(table) - len(table) % 24]):
                if not st_value or not st_name or not st_shndx or (st_info & 0xF) not in _STT_KEPT:
                    continue
                end = strtab.find(b"\0", st_name)
                name = strtab[st_name:end].decode("utf-8", "replace").split("@", 1)[0]
                if name:
                    syms.setdefault((name, st_value), Symbol(name, st_value, st_size, (st_info & 0xF) != _STT_OBJECT))
    return ElfSymbols(path, list(syms.values()), segments)


def _load_pyelftools(path: str) -> ElfSymbols | None:
    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError:  # pragma: no cover - pyelftools is a dependency
        return None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            segments = [
                Segment(seg["p_vaddr"], seg["p_offset"], seg["p_filesz"], seg["p_memsz"])
                for seg in elf.iter_segments()
                if seg["p_type"] == "PT_LOAD"
            ]
            syms: dict[tuple[str, int], Symbol] = {}
            for section_name in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(section_name)
                if sec is None:
                    continue
                for s in sec.iter_symbols():
                    kind = s["st_info"]["type"]
                    if kind not in ("STT_FUNC", "STT_OBJECT", "STT_GNU_IFUNC") or not s["st_value"] or not s.name:
                        continue
                    name = s.name.split("@", 1)[0]
                    syms.setdefault((name, s["st_value"]),
                                    Symbol(name, s["st_value"], s["st_size"], kind != "STT_OBJECT"))
    except (OSError, ELFError, ValueError):
        return None
    return ElfSymbols(path, list(syms.values()), segments)


@dataclass(frozen=True)
class NativeFrame:
    function: str    # symbol name, or UNKNOWN
    module: str      # path of the mapped file, or UNKNOWN
    offset: int      # address - symbol start (or file offset when unknown)


class NativeSymbolizer:
    """Symbolises addresses of one process from a snapshot of its maps.

    ``refresh()`` re-reads the maps (call it when an address falls outside
    every known mapping while the process is alive: a library was dlopen()ed).
    """

    def __init__(self, pid: int):
        self.pid = pid
        self.maps: list[MemoryMap] = []
        self._starts: list[int] = []
        self.cache: dict[int, NativeFrame] = {}
        self.refresh()

    def refresh(self) -> bool:
        maps = read_maps(self.pid)
        if not maps:
            return False
        self.maps = sorted(maps, key=lambda m: m.start)
        self._starts = [m.start for m in self.maps]
        self.cache.clear()
        return True

    def _mapping(self, addr: int) -> MemoryMap | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self.maps[i].end:
            return self.maps[i]
        return None

    def symbolize(self, addr: int) -> NativeFrame:
        hit = self.cache.get(addr)
        if hit is not None:
            return hit
        m = self._mapping(addr)
        if m is None and self.refresh():
            m = self._mapping(addr)
        if m is None:
            frame = NativeFrame(UNKNOWN, UNKNOWN, addr)
        else:
            file_off = addr - m.start + m.offset
            elf = ElfSymbols.load(_host_path(self.pid, m.path))
            vaddr = elf.file_offset_to_vaddr(file_off) if elf else None
            sym = elf.lookup(vaddr) if elf and vaddr is not None else None
            if sym is None:
                frame = NativeFrame(UNKNOWN, m.path, file_off)
            else:
                frame = NativeFrame(sym.name, m.path, vaddr - sym.value)
        self.cache[addr] = frame
        return frame


def _host_path(pid: int, path: str) -> str:
    via_root = f"/proc/{pid}/root{path}"
    return via_root if os.path.exists(via_root) else path
