"""The CUDA runtime linked into an executable or shared object (nvcc's default).

``nvcc`` links libcudart_static.a unless told ``-cudart shared``: the program
then has no libcudart.so to probe, and the runtime's functions are symbols of
the program itself, mostly local ones (``nm`` shows ``t cudaLaunchKernel``),
so they are in ``.symtab`` only, never in ``.dynsym``.  A uprobe at such a
function's address behaves exactly as one on libcudart's export: same
arguments, same return codes, same op names.

``examine`` answers, for one file: the runtime's functions and their
addresses, or "compiled in but stripped" (no ``.symtab`` left; the runtime is
still recognisable by its own strings), or nothing.  Answers are cached per
file identity and per GNU build-id, so a fleet of identical binaries costs one
symbol read.

Only ELF64 little-endian files (x86-64, arm64) are read, through mmap: a
file is paged in only where a section is looked at.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ingero.collect import symbols

# Sections nvcc's host compiler emits for device code; a shared-runtime build
# has them too, so they only decide whether the runtime's strings are looked for.
FATBIN_SECTIONS = frozenset({".nv_fatbin", "__nv_relfatbin", ".nvFatBinSegment"})
# Strings of the runtime itself (its error-name table; its shared-memory
# name): in libcudart 12 (NVIDIA's wheel) and 13 (the toolkit), static and
# shared, and in no program that only links against libcudart.so.
RUNTIME_STRINGS = (b"cudaErrorCudartUnloading", b"/cudart.shm.")
# Names whose presence in .strtab makes the symbol table worth parsing.
_SYMBOL_MARKERS = tuple(b"\0" + name + b"\0" for name in (b"cudaLaunchKernel", b"cudaMalloc", b"cudaMemcpy",
                                                         b"cudaGetDeviceCount"))
_RUNTIME_MARKERS = frozenset({"cudaLaunchKernel", "cudaMalloc", "cudaGetDeviceCount", "cudaMemcpy"})
# NVIDIA's own libraries (cuBLAS, cuDNN, NCCL ...) link the runtime in,
# stripped.  Their internal runtime calls are not the program's, and "rebuild
# with -cudart shared" is no fix for a vendor library: they are not reported.
_VENDOR_LIB = re.compile(r"^lib(?:cublas|cudnn|cufft|curand|cusparse|cusolver|nccl|nvrtc|nvJitLink|nvjitlink|cupti"
                         r"|npp|nvjpeg|cufile|nvblas|cudss|cutensor|nvToolsExt|nvperf|checkpoint)")

_SHT_NOTE = 7
_SHT_DYNAMIC = 6
_DT_NEEDED = 1
_DT_RPATH = 15
_DT_RUNPATH = 29
_ET_EXEC, _ET_DYN = 2, 3


@dataclass(frozen=True)
class Embedded:
    """What one file holds of the CUDA runtime."""

    build_id: str | None
    # cuda* function -> its address in the file (st_value); empty: stripped
    addresses: Mapping[str, int] = field(default_factory=dict, repr=False)

    @property
    def stripped(self) -> bool:
        return not self.addresses


_by_file: dict[tuple[int, int, int, int], Embedded | None] = {}
_by_build_id: dict[str, Embedded] = {}  # only answers with symbols
symbol_reads = 0  # symbol tables parsed so far in this process (the build-id cache's test reads it)


def examine(path: Path, st: os.stat_result | None = None) -> Embedded | None:
    """The runtime linked into ``path``, or None (not ELF64-LE, no runtime, or a vendor library)."""
    try:
        st = st or os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _by_file:
        _by_file[key] = _examine(path)
    return _by_file[key]


def _examine(path: Path) -> Embedded | None:
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 64:
                return None
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                return _read(path, mm)
    except (OSError, ValueError, struct.error, IndexError):
        return None


def _read(path: Path, mm: mmap.mmap) -> Embedded | None:
    if mm[:4] != b"\x7fELF" or mm[4] != 2 or mm[5] != 1:
        return None
    e_type = struct.unpack_from("<H", mm, 16)[0]
    if e_type not in (_ET_EXEC, _ET_DYN):
        return None
    sections = _Sections(mm)
    build_id = _build_id(mm, sections)
    if build_id is not None and build_id in _by_build_id:
        # `strip` keeps the build-id and every address: a stripped copy of a
        # binary seen with its symbols is probed at that binary's addresses
        return _by_build_id[build_id]
    found = _from_symbols(path, mm, sections, build_id)
    if found is not None:
        if build_id is not None:
            _by_build_id[build_id] = found
        return found
    # not cached by build-id: a copy with symbols may come later
    return Embedded(build_id) if _is_stripped_runtime(path, mm, sections) else None


class _Sections:
    """Section headers: by name (the first of each name) and by index (what sh_link names)."""

    def __init__(self, mm: mmap.mmap):
        (_, _, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx) = symbols._EHDR.unpack_from(mm, 0)
        self.by_name: dict[str, _Section] = {}
        self.by_index: list[_Section] = []
        if not shoff or not shnum or shstrndx >= shnum:
            return
        raw = [symbols._SHDR.unpack_from(mm, shoff + i * shentsize) for i in range(shnum)]
        names = mm[raw[shstrndx][4]:raw[shstrndx][4] + raw[shstrndx][5]]
        for sh in raw:
            name = names[sh[0]:names.find(b"\0", sh[0])].decode("ascii", "replace")
            sec = _Section(name, sh[1], sh[4], sh[5], sh[6])
            self.by_index.append(sec)
            self.by_name.setdefault(name, sec)

    def linked(self, sec: "_Section") -> "_Section":
        return self.by_index[sec.link]


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


def _build_id(mm: mmap.mmap, sections: _Sections) -> str | None:
    note = sections.by_name.get(".note.gnu.build-id")
    if note is None or note.type != _SHT_NOTE:
        return None
    off = note.offset
    namesz, descsz, ntype = struct.unpack_from("<III", mm, off)
    desc = off + 12 + ((namesz + 3) & ~3)
    if ntype != 3 or descsz == 0:  # NT_GNU_BUILD_ID
        return None
    return mm[desc:desc + descsz].hex()


def _strtab_has_markers(mm: mmap.mmap, sections: _Sections) -> bool:
    symtab = sections.by_name.get(".symtab")
    if symtab is None:
        return False
    strtab = sections.linked(symtab)
    start, end = strtab.offset, strtab.offset + strtab.size
    return any(mm.find(m, start, end) >= 0 for m in _SYMBOL_MARKERS)


def _from_symbols(path: Path, mm: mmap.mmap, sections: _Sections, build_id: str | None) -> Embedded | None:
    """The runtime's functions from .symtab (locals included); None if it has none."""
    global symbol_reads
    # a file that needs libcudart.so calls the shared runtime (its cuda* symbols are
    # undefined imports): not worth parsing a symbol table that may be huge (libtorch_cuda)
    if not _strtab_has_markers(mm, sections) or _needs_libcudart(mm, sections):
        return None
    symbol_reads += 1
    elf = symbols.parse_elf(str(path), mm)
    addresses: dict[str, int] = {}
    ambiguous: set[str] = set()
    for sym in elf.symbols:
        if not sym.name.startswith("cuda"):
            continue
        # two local functions of one name (static functions of different
        # objects): which one the program calls is unknown, so neither is probed
        if addresses.setdefault(sym.name, sym.value) != sym.value:
            ambiguous.add(sym.name)
    for name in ambiguous:
        del addresses[name]
    if not _RUNTIME_MARKERS & addresses.keys():
        return None
    return Embedded(build_id, addresses)


def _needed(mm: mmap.mmap, sections: _Sections) -> list[str]:
    return (_dynamic_entries(mm, sections) or {}).get(_DT_NEEDED, [])


@dataclass(frozen=True)
class Dynamic:
    """What the dynamic loader reads of one object: DT_NEEDED, DT_RPATH, DT_RUNPATH (as written)."""

    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]


def dynamic(path: Path | str) -> Dynamic | None:
    """``path``'s dynamic section (None: not an ELF64-LE object, or no dynamic section)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 64:
                return None
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                if mm[:4] != b"\x7fELF" or mm[4] != 2 or mm[5] != 1:
                    return None
                entries = _dynamic_entries(mm, _Sections(mm))
    except (OSError, ValueError, struct.error, IndexError):
        return None
    if entries is None:
        return None

    def paths(tag: int) -> tuple[str, ...]:
        return tuple(p for v in entries.get(tag, []) for p in v.split(":") if p)

    return Dynamic(tuple(entries.get(_DT_NEEDED, [])), paths(_DT_RPATH), paths(_DT_RUNPATH))


def _dynamic_entries(mm: mmap.mmap, sections: _Sections) -> dict[int, list[str]] | None:
    """String-valued entries of .dynamic (DT_NEEDED, DT_RPATH, DT_RUNPATH) by tag, in order."""
    dyn = sections.by_name.get(".dynamic")
    if dyn is None or dyn.type != _SHT_DYNAMIC:
        return None
    strtab = sections.linked(dyn)
    names = mm[strtab.offset:strtab.offset + strtab.size]
    out: dict[int, list[str]] = {}
    for tag, val in struct.iter_unpack("<qQ", mm[dyn.offset:dyn.offset + dyn.size - dyn.size % 16]):
        if tag == 0:
            break
        if tag in (_DT_NEEDED, _DT_RPATH, _DT_RUNPATH):
            out.setdefault(tag, []).append(names[val:names.find(b"\0", val)].decode("utf-8", "replace"))
    return out


def _is_stripped_runtime(path: Path, mm: mmap.mmap, sections: _Sections) -> bool:
    """Device code, no libcudart.so needed, and the runtime's own strings: linked in, symbols gone."""
    if _VENDOR_LIB.match(path.name) or not FATBIN_SECTIONS & sections.by_name.keys():
        return False
    if _needs_libcudart(mm, sections):
        return False
    return all(mm.find(s) >= 0 for s in RUNTIME_STRINGS)


def _needs_libcudart(mm: mmap.mmap, sections: _Sections) -> bool:
    return any(n.startswith("libcudart") for n in _needed(mm, sections))


def stripped_message(path: Path | str, who: str) -> str:
    """The one line `trace` and `check --pid` print for a stripped binary with the runtime linked in."""
    return (f"{path} ({who}) has the CUDA runtime linked in without symbols: its CUDA calls cannot be "
            f"probed and are not recorded; fix: build it with `nvcc -cudart shared`, or keep its symbols "
            f"(do not strip it)")


def reset_caches() -> None:
    """Forget every answer (tests)."""
    global symbol_reads
    _by_file.clear()
    _by_build_id.clear()
    symbol_reads = 0
