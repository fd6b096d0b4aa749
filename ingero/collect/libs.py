"""Find every distinct copy of the CUDA runtime (libcudart), driver (libcuda) and NCCL (libnccl).

A uprobe is attached to a file (an inode), not to a name, so a job that
loads PyTorch's wheel-bundled ``libcudart-<hash>.so.12`` is invisible to a
probe on /usr/local/cuda's copy.  This module lists every copy a process on
this host could be using, one entry per inode:

* static places, cheap to look at: ``ldconfig -p``, the standard library
  directories, site-packages of the interpreters we can find without running
  them (nvidia wheels, torch/lib, ``*.libs`` dirs of auditwheel-repaired
  wheels), conda prefixes and their envs;
* what running processes actually mapped (/proc/PID/maps), opened through
  /proc/PID/root so a copy inside a container is reachable from the host.

Nothing walks the whole filesystem: every place searched is a fixed list of
directories scanned one level deep.  ``LibraryWatcher`` keeps looking while a
trace runs, reading the maps only of processes that are new or that mapped
something since the last look.
"""

from __future__ import annotations

import glob
import mmap
import os
import platform
import re
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ingero.collect import static_runtime
from ingero.collect.procnames import stat_fields
from ingero.errors import IngeroError

PROC = Path("/proc")

RUNTIME = "runtime"
DRIVER = "driver"
NCCL = "nccl"

# libcudart.so, libcudart.so.12, libcudart.so.12.4.127, torch's libcudart-d0da41ae.so.11.0;
# libcuda.so.1, libcuda.so.550.54.14.  Not libcudart_static.a, libcudadebugger.so.
_LIB_NAME = re.compile(r"^libcuda(?P<rt>rt)?(?:-[0-9a-f]{6,})?\.so(?:\.[0-9]+)*$")
# libnccl.so.2, libnccl.so.2.21.5, an auditwheel copy libnccl-<hash>.so.2.  Kept apart from
# _LIB_NAME: NVIDIA's libnccl also has the CUDA runtime linked in, which _mapped_code examines.
_NCCL_NAME = re.compile(r"^libnccl(?:-[0-9a-f]{6,})?\.so(?:\.[0-9]+)*$")


def _wanted(name: str) -> bool:
    return bool(_LIB_NAME.match(name) or _NCCL_NAME.match(name))


def library_name(name: str) -> bool:
    """A file name a libcudart / libcuda / libnccl copy has (its exports decide what it is)."""
    return _wanted(name)


# A library counts as the runtime / the driver when it exports one of these
# (present in every CUDA 10-13 release); the file name alone is not trusted.
_RUNTIME_MARKERS = frozenset({"cudaLaunchKernel", "cudaMalloc", "cudaGetDeviceCount", "cudaMemcpy"})
_DRIVER_MARKERS = frozenset({"cuInit", "cuLaunchKernel", "cuDriverGetVersion"})
_NCCL_MARKERS = frozenset({"ncclAllReduce", "ncclCommInitRank", "ncclGetVersion"})

# _ptds / _ptsz: per-thread-default-stream builds of the same call (same
# arguments).  Driver ABI revisions (_v2, _v3) are different entry points with
# possibly different arguments, so a probe table names them explicitly.  The
# same rule as probes.variants, so describe() counts what the loader attaches.
_VARIANT_SUFFIX = re.compile(r"^(?:_ptds|_ptsz)?$")

_FIX_CUDA_LIB = ("pass the path of a libcudart.so*, libcuda.so* or libnccl.so* "
                 "(list them with: ldconfig -p | grep -e libcuda -e libnccl)")


@dataclass(frozen=True)
class CudaLib:
    path: Path
    kind: str  # RUNTIME ('runtime', libcudart) | DRIVER ('driver', libcuda) | NCCL ('nccl', libnccl)
    identity: tuple[int, int]  # (st_dev, st_ino) of the file
    symbols: frozenset[str] = field(repr=False)  # exported dynamic function names, no @version
    # The runtime linked into a program (static_runtime.py): function -> address
    # in the file, probed by address.  None for libcudart.so / libcuda.so.
    addresses: Mapping[str, int] | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[int, int, str]:
        """One file can be two things to probe: NVIDIA's libnccl exports NCCL and has a runtime linked in."""
        return (*self.identity, self.kind)

    @property
    def linked_in(self) -> bool:
        return self.addresses is not None

    def variants(self, base: str) -> list[str]:
        """``base`` and its exported variants (``base_ptsz``, ``base_v2_ptds`` ...), base first."""
        found = [s for s in self.symbols if s.startswith(base) and _VARIANT_SUFFIX.match(s[len(base) :])]
        return sorted(found, key=lambda s: (s != base, len(s), s))

    def api_functions(self) -> list[str]:
        """Exported public API functions: cuda* for the runtime, cu* for the driver, nccl* for NCCL."""
        prefix = {RUNTIME: "cuda", NCCL: "nccl"}.get(self.kind, "cu")
        return sorted(s for s in self.symbols if s.startswith(prefix))


def describe(lib: CudaLib, bases: Iterable[str] | None = None) -> str:
    """One line for ``ingero check``: path, kind, how many functions can be probed.

    ``bases`` are the probe table's base names for this kind of library
    (default: ingero.collect.probes.CUDA_PROBES); variants are counted too.
    """
    if bases is None:
        from ingero.collect.probes import CUDA_PROBES  # only here: libs must not need the BPF side

        bases = [p.symbol for p in CUDA_PROBES if p.library == lib.kind]
    bases = list(dict.fromkeys(bases))
    present = sum(1 for b in bases if lib.variants(b))
    symbols = sum(len(lib.variants(b)) for b in bases)
    kind = f"{lib.kind} linked in (probed by address)" if lib.linked_in else lib.kind
    return (
        f"{lib.path}  {kind}  {present}/{len(bases)} probed functions {'found' if lib.linked_in else 'exported'}, "
        f"{symbols} symbols with variants ({len(lib.api_functions())} API functions)"
    )


# ---------------------------------------------------------------- ELF reading

_elf_cache: dict[tuple[int, int, int, int], frozenset[str] | None] = {}


# ELF e_machine of this host.  A 32-bit or foreign-architecture copy (NVIDIA's
# driver installs an i386 libcuda next to the 64-bit one, and ldconfig -p
# lists both) cannot be what a process here runs, and the BPF argument
# readers assume the host's calling convention.
_HOST_MACHINE = {"x86_64": 62, "aarch64": 183, "ppc64le": 21, "s390x": 22}.get(platform.machine())


def _foreign_elf(header: bytes) -> str | None:
    """Why this ELF header is not loadable here (e.g. 'ELF32, machine 3'), or None if it is."""
    if len(header) < 20:
        return "truncated ELF header"
    elf_class, data = header[4], header[5]
    machine = int.from_bytes(header[18:20], "little" if data == 1 else "big")
    if elf_class != 2 or (_HOST_MACHINE is not None and machine != _HOST_MACHINE):
        return f"ELF{32 if elf_class == 1 else 64} for machine {machine}, this host is {platform.machine()}"
    return None


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_SHT_DYNSYM = 11
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_STB_GLOBAL, _STB_WEAK = 1, 2


def _dynsym_exports(f: Any) -> frozenset[str] | None:
    """The exports of an ELF64 little-endian shared object with section headers, read with struct
    (10x faster than pyelftools: libcudart.so.12's 500 took 12 ms, a held process waits on it);
    None where pyelftools must read it (no .dynsym section, another layout)."""
    with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        if mm[4] != 2 or mm[5] != 1:
            return None
        (_, e_type, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = _EHDR.unpack_from(mm, 0)
        if e_type != 3 or not shoff or shentsize != _SHDR.size:
            return None
        sections = [_SHDR.unpack_from(mm, shoff + i * shentsize) for i in range(shnum)]
        dynsym = next((sh for sh in sections if sh[1] == _SHT_DYNSYM), None)
        if dynsym is None or dynsym[6] >= shnum:
            return None
        strtab = sections[dynsym[6]]
        names = mm[strtab[4]:strtab[4] + strtab[5]]
        table = mm[dynsym[4]:dynsym[4] + dynsym[5]]
        out = set()
        for st_name, st_info, _, st_shndx, _, _ in _SYM.iter_unpack(table[: len(table) - len(table) % _SYM.size]):
            if st_shndx == 0 or (st_info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC):
                continue
            if (st_info >> 4) not in (_STB_GLOBAL, _STB_WEAK):
                continue
            out.add(names[st_name:names.find(b"\0", st_name)].decode("utf-8", "replace").split("@", 1)[0])
        return frozenset(out)


def _read_exports(path: Path) -> frozenset[str] | None:
    """Exported function names of an ELF shared object for this host; None if it is not one."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
            if header[:4] != b"\x7fELF" or _foreign_elf(header):
                return None
            fast = _dynsym_exports(f)
            if fast is not None:
                return fast
            f.seek(0)
            elf = ELFFile(f)
            if elf["e_type"] != "ET_DYN":
                return None
            table = elf.get_section_by_name(".dynsym")
            if table is None:  # section headers stripped: use the dynamic segment
                table = next((s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC"), None)
                if table is None:
                    return None
            names = set()
            for sym in table.iter_symbols():
                if sym["st_shndx"] == "SHN_UNDEF":
                    continue
                if sym["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC", "STT_LOOS"):  # pyelftools: IFUNC is LOOS
                    continue
                if sym["st_info"]["bind"] not in ("STB_GLOBAL", "STB_WEAK"):
                    continue
                names.add(sym.name.split("@", 1)[0])
            return frozenset(names)
    except (OSError, ELFError, ValueError, KeyError, struct.error, IndexError):
        return None


def _exports(path: Path, st: os.stat_result) -> frozenset[str] | None:
    # Parsing a 100 MB libcuda takes a while; the same inode, size and mtime
    # means the same symbols, so each file is read once per process.
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _elf_cache:
        _elf_cache[key] = _read_exports(path)
    return _elf_cache[key]


def _kind(symbols: frozenset[str]) -> str | None:
    if symbols & _RUNTIME_MARKERS:
        return RUNTIME
    if symbols & _DRIVER_MARKERS:
        return DRIVER
    if symbols & _NCCL_MARKERS:
        return NCCL
    return None


def _load(path: Path, st: os.stat_result | None = None) -> CudaLib | None:
    """A CudaLib for this file, or None if it is not a CUDA runtime/driver library."""
    try:
        st = st or os.stat(path)
    except OSError:
        return None
    symbols = _exports(path, st)
    if not symbols:
        return None
    kind = _kind(symbols)
    if kind is None:
        return None
    return CudaLib(path=path, kind=kind, identity=(st.st_dev, st.st_ino), symbols=symbols)


# ---------------------------------------------------------------- static places


@dataclass(frozen=True)
class SearchPlaces:
    """Directories searched without looking at processes (one level deep each)."""

    lib_dirs: tuple[Path, ...]
    site_packages: tuple[Path, ...]
    use_ldconfig: bool = True
    # places this user may not look into (another user's home, as anyone but root): not searched
    unreadable: tuple[Path, ...] = ()


# Where distributions, the CUDA toolkit, NVIDIA's container toolkit and WSL put them.
_STANDARD_LIB_GLOBS = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",  # Debian's nvidia-driver packages
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/cuda*/lib64",
    "/usr/local/cuda*/lib",  # CUDA 13 moved the libraries here
    "/usr/local/cuda*/targets/*-linux/lib",
    "/opt/cuda*/lib64",
    "/usr/local/nvidia/lib64",  # nvidia-container-toolkit mounts
    "/usr/lib/wsl/lib",  # WSL's libcuda
)

# Inside a site-packages directory.
_SITE_LIB_GLOBS = (
    "nvidia/cuda_runtime/lib",  # nvidia-cuda-runtime-cu11/cu12
    "nvidia/*/lib",  # cu13 wheels (nvidia/cu13/lib) and anything alike
    "torch/lib",
    "*.libs",  # auditwheel-repaired wheels: torch.libs/libcudart-<hash>.so.12
)


def _homes() -> list[Path]:
    homes = {Path.home(), Path("/root")}
    if os.environ.get("SUDO_USER"):  # `sudo ingero trace`: the user's own conda and ~/.local
        homes.add(Path("~" + os.environ["SUDO_USER"]).expanduser())
    homes.update(Path(p) for p in glob.glob("/home/*"))
    return sorted(homes)


def _unreadable_dirs(dirs: Iterable[Path]) -> list[Path]:
    """Those of ``dirs`` that exist but this user may not list (/root as anyone but root)."""
    return [d for d in dirs if os.path.isdir(d) and not os.access(d, os.R_OK | os.X_OK)]


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except PermissionError:  # inside a directory this user may not enter: not searched
        return False


def _conda_prefixes() -> list[Path]:
    roots = []
    if os.environ.get("CONDA_PREFIX"):
        roots.append(Path(os.environ["CONDA_PREFIX"]))
    bases = [Path("/opt/conda"), Path("/opt/miniconda3"), Path("/opt/anaconda3")]
    for home in _homes():
        for name in ("miniconda3", "anaconda3", "miniforge3", "mambaforge", ".conda"):
            bases.append(home / name)
    for base in bases:
        if _is_dir(base):
            roots.append(base)
            roots.extend(Path(p) for p in glob.glob(str(base / "envs" / "*")))
    return roots


def _running_python_prefixes(proc: Path) -> set[Path]:
    """Venv / conda prefixes of running Python processes, before they load CUDA.

    Cheap: one readlink per process, and argv[0] plus the environment only for
    Pythons.  PyTorch renames the main thread (pt_main_thread), so the
    executable, not comm, says whether it is Python.
    """
    prefixes = set()
    for pid in _pids(proc):
        try:
            if not os.path.basename(os.readlink(proc / str(pid) / "exe")).startswith("python"):
                continue
            argv0 = (proc / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0].decode("utf-8", "replace")
            environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv0.startswith("/"):
            prefix = Path(argv0).parent.parent
            if (prefix / "pyvenv.cfg").is_file():
                prefixes.add(prefix)
        for var in (b"VIRTUAL_ENV=", b"CONDA_PREFIX="):
            for item in environ:
                if item.startswith(var) and len(item) > len(var):
                    prefixes.add(Path(item[len(var) :].decode("utf-8", "replace")))
    return prefixes


def _python_prefixes(proc: Path | None) -> list[Path]:
    """Prefixes of interpreters found without running them: ours, system ones, running venvs."""
    prefixes = {Path(sys.prefix), Path(sys.base_prefix), Path("/usr"), Path("/usr/local")}
    if os.environ.get("VIRTUAL_ENV"):
        prefixes.add(Path(os.environ["VIRTUAL_ENV"]))
    for home in _homes():
        prefixes.add(home / ".local")
        # interpreter managers and venv homes: pyenv, virtualenvwrapper, uv-managed Pythons
        for pattern in (".pyenv/versions/*", ".virtualenvs/*", ".local/share/uv/python/*"):
            prefixes.update(Path(p) for p in glob.glob(str(home / pattern)))
    if proc is not None:
        prefixes |= _running_python_prefixes(proc)
    return sorted(prefixes)


def _site_packages_of(prefix: Path) -> list[Path]:
    out = []
    for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib64/python3*/site-packages"):
        out.extend(Path(p) for p in glob.glob(str(prefix / pattern)))
    return out


def default_places(proc: Path | None = PROC) -> SearchPlaces:
    lib_dirs = []
    for pattern in _STANDARD_LIB_GLOBS:
        lib_dirs.extend(Path(p) for p in sorted(glob.glob(pattern)))
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if entry:
            lib_dirs.append(Path(entry))
    conda = _conda_prefixes()
    lib_dirs.extend(p / "lib" for p in conda)
    sites = [sp for prefix in _python_prefixes(proc) + conda for sp in _site_packages_of(prefix)]
    sites.extend(Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return SearchPlaces(tuple(dict.fromkeys(lib_dirs)), tuple(dict.fromkeys(sites)),
                        unreadable=tuple(_unreadable_dirs(dict.fromkeys([*_homes(), *lib_dirs]))))


def _ldconfig_paths() -> list[Path]:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    paths = []
    for line in out.splitlines():
        name, sep, target = line.strip().partition(" => ")
        if sep and _wanted(os.path.basename(target)):  # not libcudadebugger, libcudnn...
            paths.append(Path(target))
    return paths


def _scan_dir(directory: Path) -> Iterator[Path]:
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if _wanted(entry.name):
                    yield Path(entry.path)
    except OSError:
        return


def static_candidates(places: SearchPlaces) -> Iterator[Path]:
    if places.use_ldconfig:
        yield from _ldconfig_paths()
    for d in places.lib_dirs:
        yield from _scan_dir(d)
    for site in places.site_packages:
        for pattern in _SITE_LIB_GLOBS:
            for d in glob.glob(str(site / pattern)):
                yield from _scan_dir(Path(d))


# ---------------------------------------------------------------- processes

@dataclass(frozen=True)
class _Mapped:
    pid: int
    path: str  # as the process sees it (its own mount namespace)
    deleted: bool
    addr: str  # "start-end" of one mapping, for /proc/PID/map_files
    node: str = ""  # "dev inode" as the maps line gives them: one file, without a stat


def _pids(proc: Path) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []


def _read_maps(proc: Path, pid: int) -> bytes:
    try:
        with open(proc / str(pid) / "maps", "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return b""


def _mapped_cuda(proc: Path, pid: int, data: bytes | None = None) -> list[_Mapped]:
    if data is None:
        data = _read_maps(proc, pid)
    if b"/libcuda" not in data and b"/libnccl" not in data:
        return []
    seen, out = set(), []
    for raw in data.splitlines():
        if b"/libcuda" not in raw and b"/libnccl" not in raw:
            continue
        parts = raw.decode("utf-8", "replace").split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5]
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[: -len(" (deleted)")]
        if path in seen or not _wanted(os.path.basename(path)):
            continue
        seen.add(path)
        out.append(_Mapped(pid, path, deleted, parts[0]))
    return out


def _mapped_code(data: bytes, pid: int, skip: set[str]) -> list[_Mapped]:
    """Executable mappings of files other than libcudart/libcuda: where a runtime may be linked in.

    ``skip``: "dev inode" of files already examined (read from the line, no stat)."""
    out = []
    for raw in data.splitlines():
        if b"xp " not in raw and b"xs " not in raw:
            continue
        parts = raw.decode("utf-8", "replace").split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        node = f"{parts[3]} {parts[4]}"
        if node in skip:
            continue
        skip.add(node)
        path = parts[5]
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[: -len(" (deleted)")]
        if _LIB_NAME.match(os.path.basename(path)):
            continue
        out.append(_Mapped(pid, path, deleted, parts[0], node))
    return out


def _who(proc: Path, pid: int) -> str:
    try:
        return f"pid {pid}, {(proc / str(pid) / 'comm').read_text().strip()}"
    except OSError:
        return f"pid {pid}"


def _resolve_mapped(proc: Path, m: _Mapped) -> tuple[Path, os.stat_result] | None:
    """A host path that opens the file the process mapped, and its stat."""
    candidates = []
    if m.deleted:  # replaced on disk (an upgrade): only the mapping still reaches it
        candidates.append(proc / str(m.pid) / "map_files" / m.addr)
    candidates.append(proc / str(m.pid) / "root" / m.path.lstrip("/"))
    for via in candidates:
        try:
            st = os.stat(via)
        except OSError:
            continue
        # Prefer the plain path when it is the same file in our namespace: it
        # outlives the process and reads better.
        try:
            st_host = os.stat(m.path)
            if (st_host.st_dev, st_host.st_ino) == (st.st_dev, st.st_ino):
                return Path(os.path.realpath(m.path)), st
        except OSError:
            pass
        return via, st
    return None


class _Registry:
    """CudaLibs by key; remembers files that turned out not to be CUDA libraries."""

    def __init__(self) -> None:
        self.libs: dict[tuple[int, int, str], CudaLib] = {}  # CudaLib.key -> lib
        self.by_exports: dict[tuple[int, int], CudaLib] = {}  # identity -> the lib its exports make it
        self.rejected: set[tuple[int, int]] = set()
        self.code_seen: set[str] = set()  # maps "dev inode" of every executable mapping examined
        self.stripped: dict[tuple[int, int], str] = {}  # identity -> the one line saying so
        self.mapped_by: dict[tuple[int, int, str], int] = {}  # CudaLib.key -> the first pid seen mapping it

    def add_linked_in(self, path: Path, st: os.stat_result, who: str) -> CudaLib | None:
        """A program or library with the runtime linked in; a stripped one is noted in ``stripped``."""
        ident = (st.st_dev, st.st_ino)
        key = (*ident, RUNTIME)
        if key in self.libs or ident in self.stripped:
            return self.libs.get(key)
        found = static_runtime.examine(path, st)
        if found is None:
            return None
        if found.stripped:
            self.stripped[ident] = static_runtime.stripped_message(path, who)
            return None
        lib = CudaLib(path=path, kind=RUNTIME, identity=ident, symbols=frozenset(found.addresses),
                      addresses=found.addresses)
        self.libs[lib.key] = lib
        return lib

    def add_code(self, proc: Path, data: bytes, pid: int) -> None:
        """Every file ``pid`` maps executable (its maps are ``data``), examined once per file."""
        who = None
        for m in _mapped_code(data, pid, self.code_seen):
            found = _resolve_mapped(proc, m)
            if found is not None:
                who = who or _who(proc, pid)
                lib = self.add_linked_in(found[0], found[1], who)
                if lib is not None:
                    self.mapped_by.setdefault(lib.key, pid)

    def add_path(self, path: Path, st: os.stat_result | None = None, resolve: bool = True) -> CudaLib | None:
        try:
            st = st or os.stat(path)
        except OSError:
            return None
        ident = (st.st_dev, st.st_ino)
        if ident in self.by_exports:
            return self.by_exports[ident]
        if ident in self.rejected:
            return None
        if resolve:
            path = Path(os.path.realpath(path))
        lib = _load(path, st)
        if lib is None:
            self.rejected.add(ident)
            return None
        self.libs[lib.key] = self.by_exports[ident] = lib
        return lib

    def add_mapped(self, proc: Path, m: _Mapped) -> CudaLib | None:
        found = _resolve_mapped(proc, m)
        if found is None:
            return None
        path, st = found
        lib = self.add_path(path, st, resolve=False)
        if lib is not None:
            self.mapped_by.setdefault(lib.key, m.pid)
        return lib


def _check_extra(path: Path) -> list[Path]:
    """User-given --cuda-lib: a library file, or a directory holding some."""
    path = Path(path)
    if not path.exists():
        raise IngeroError(f"--cuda-lib {path}: no such file or directory", _FIX_CUDA_LIB)
    if path.is_dir():
        found = list(_scan_dir(path))
        if not found:
            raise IngeroError(f"--cuda-lib {path}: directory holds no libcudart.so*/libcuda.so*/libnccl.so*",
                              _FIX_CUDA_LIB)
        return found
    st = os.stat(path)
    symbols = _exports(path, st)
    if symbols is None:
        try:
            with open(path, "rb") as f:
                header = f.read(20)
        except OSError as e:
            raise IngeroError(f"--cuda-lib {path}: cannot read it ({e.strerror})",
                              "run as root, or check its permissions")
        if header[:4] == b"\x7fELF" and (why := _foreign_elf(header)):
            raise IngeroError(f"--cuda-lib {path}: built for another architecture ({why})", _FIX_CUDA_LIB)
        raise IngeroError(f"--cuda-lib {path}: not an ELF shared library", _FIX_CUDA_LIB)
    if _kind(symbols) is None:
        raise IngeroError(
            f"--cuda-lib {path}: exports no CUDA runtime or driver functions (nor NCCL ones)",
            "point it at the real libcudart.so*/libcuda.so*/libnccl.so*, not a stub or another library",
        )
    return [path]


def _gather(registry: _Registry, extra: list[Path], places: SearchPlaces, proc: Path | None) -> None:
    for path in extra:
        registry.add_path(path)
    for path in static_candidates(places):
        if "/stubs/" in str(path):  # link-time stubs; never what a process runs
            continue
        registry.add_path(path)
    if proc is not None:
        for pid in _pids(proc):
            data = _read_maps(proc, pid)
            for m in _mapped_cuda(proc, pid, data):
                registry.add_mapped(proc, m)
            registry.add_code(proc, data, pid)


def find_cuda_libraries(
    extra: Iterable[Path] = (), *, places: SearchPlaces | None = None, proc: Path | None = PROC
) -> list[CudaLib]:
    """Every distinct libcudart / libcuda on this host (one per inode), runtime first.

    ``extra`` are user-given paths (--cuda-lib); a bad one raises IngeroError.
    ``places`` and ``proc`` exist for tests (proc=None skips processes).
    """
    registry = _Registry()
    extra_files = [f for p in extra for f in _check_extra(Path(p))]
    _gather(registry, extra_files, places or default_places(proc), proc)
    return sorted(registry.libs.values(), key=lambda lib: (lib.kind != RUNTIME, str(lib.path)))


def process_runtimes(pid: int, proc: Path = PROC) -> tuple[list[CudaLib], list[str]]:
    """What ``pid`` maps of CUDA right now: libraries and linked-in runtimes, and a line per stripped one."""
    registry = _Registry()
    data = _read_maps(proc, pid)
    for m in _mapped_cuda(proc, pid, data):
        registry.add_mapped(proc, m)
    registry.add_code(proc, data, pid)
    libs = sorted(registry.libs.values(), key=lambda lib: (lib.kind != RUNTIME, str(lib.path)))
    return libs, list(registry.stripped.values())


def pids_mapping_cuda(proc: Path = PROC) -> dict[int, list[CudaLib]]:
    """pid -> the CUDA libraries it has mapped right now."""
    registry = _Registry()
    out: dict[int, list[CudaLib]] = {}
    for pid in _pids(proc):
        libs = [lib for m in _mapped_cuda(proc, pid) if (lib := registry.add_mapped(proc, m))]
        if libs:
            out[pid] = list({lib.key: lib for lib in libs}.values())
    return out


def _stat_fields(proc_dir: str, pid: int) -> tuple[int, int] | None:
    """(start time, virtual size) of a pid; None if gone.

    Called for every process on every poll, so it uses os.open/os.read on a
    string path: half the cost of open() and pathlib (measured, ~6 us a pid).
    """
    try:
        fd = os.open(f"{proc_dir}/{pid}/stat", os.O_RDONLY)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    fields = stat_fields(data)
    try:
        return int(fields[19]), int(fields[20])  # stat fields 22 (starttime) and 23 (vsize)
    except (IndexError, ValueError):
        return None


def _examine_file(registry: _Registry, path: Path, st: os.stat_result, who: str) -> None:
    lib = registry.add_path(path, st, resolve=False)
    if lib is None or lib.kind == NCCL:  # NVIDIA's libnccl has a runtime linked in (with its symbols)
        registry.add_linked_in(path, st, who)


class Examiner:
    """Files looked at one at a time, each once: holds.py's, on the holder's thread.

    Its own registry, not the watcher's: a held process must not wait for the
    trace's once-a-second scan of every process's maps to finish.  A library
    both find is attached once all the same (Program.attach_library)."""

    def __init__(self) -> None:
        self._registry = _Registry()
        self._reported: set[tuple[int, int, str]] = set()

    def take_file(self, path: Path, st: os.stat_result, who: str) -> list[CudaLib]:
        """A library a process maps: the library its exports make it and a runtime linked into it, if new."""
        _examine_file(self._registry, path, st, who)
        return self._new()

    def take_program(self, path: Path, st: os.stat_result, who: str) -> list[CudaLib]:
        """A program a process runs: the runtime linked into it, if new."""
        self._registry.add_linked_in(path, st, who)
        return self._new()

    def _new(self) -> list[CudaLib]:
        new = [lib for key, lib in self._registry.libs.items() if key not in self._reported]
        self._reported.update(lib.key for lib in new)
        return sorted(new, key=lambda lib: (lib.kind != RUNTIME, str(lib.path)))


class LibraryWatcher:
    """Finds CUDA library copies as processes appear while a trace runs.

    ``poll()`` (meant to be called about once a second): the first call
    returns everything ``find_cuda_libraries`` finds; later calls only copies
    not returned before.  A process's maps are read again only when its
    virtual size changed since the last read (a dlopen adds mappings, so it
    changes the size; reading /proc/PID/stat is far cheaper than the maps).
    Kernel threads (virtual size 0) are never read.
    """

    def __init__(self, extra: Iterable[Path] = (), *, places: SearchPlaces | None = None, proc: Path = PROC,
                 executables: Iterable[tuple[Path, str]] = ()):
        self._extra = [f for p in extra for f in _check_extra(Path(p))]  # a bad --cuda-lib fails here, early
        # (program, who): examined at the first poll, before it runs (--cmd's program: its
        # first CUDA call may come before any poll could see it in a process's maps)
        self._executables = list(executables)
        self._noted: set[tuple[int, int]] = set()
        self._places = places
        self._proc = proc
        self._registry = _Registry()
        self._reported: set[tuple[int, int, str]] = set()
        self._vsize: dict[tuple[int, int], int] = {}  # (pid, starttime) -> vsize at the last maps read
        self._started = False
        self.maps_read = 0  # how many maps files the last poll read (for benchmarks)
        # poll() on the trace's thread, take_*() on the holder's (holds.py)
        self._lock = threading.Lock()

    def poll(self) -> list[CudaLib]:
        with self._lock:
            return self._poll()

    def take_file(self, path: Path, st: os.stat_result, who: str) -> list[CudaLib]:
        """A library the --cmd command will map (prelaunch.py): what it is, if not returned before."""
        with self._lock:
            _examine_file(self._registry, path, st, who)
            return self._new()

    def take_program(self, path: Path, st: os.stat_result, who: str) -> list[CudaLib]:
        """A program the --cmd command will run (prelaunch.py): the runtime linked into it, if new."""
        with self._lock:
            self._registry.add_linked_in(path, st, who)
            return self._new()

    def mapped_by(self, lib: CudaLib) -> int | None:
        """The first process seen mapping ``lib`` (None: found in a library directory, or by a hold)."""
        return self._registry.mapped_by.get(lib.key)

    def _new(self) -> list[CudaLib]:
        new = [lib for key, lib in self._registry.libs.items() if key not in self._reported]
        self._reported.update(lib.key for lib in new)
        return sorted(new, key=lambda lib: (lib.kind != RUNTIME, str(lib.path)))

    def _poll(self) -> list[CudaLib]:
        if not self._started:
            _gather(self._registry, self._extra, self._places or default_places(self._proc), None)
            for exe, who in self._executables:
                try:
                    self._registry.add_linked_in(Path(os.path.realpath(exe)), os.stat(exe), who)
                except OSError:
                    pass
            self._started = True
        self._scan_processes()
        return self._new()

    def take_notes(self) -> list[str]:
        """Lines about programs with a stripped runtime linked in, each once, new since the last call."""
        with self._lock:
            new = [ident for ident in self._registry.stripped if ident not in self._noted]
            self._noted.update(new)
            return [self._registry.stripped[ident] for ident in new]

    def _scan_processes(self) -> None:
        alive: dict[tuple[int, int], int] = {}
        self.maps_read = 0
        proc_dir = str(self._proc)
        for pid in _pids(self._proc):
            fields = _stat_fields(proc_dir, pid)
            if fields is None:
                continue
            start, vsize = fields
            key = (pid, start)
            alive[key] = vsize
            if vsize == 0 or self._vsize.get(key) == vsize:
                continue
            self.maps_read += 1
            data = _read_maps(self._proc, pid)
            for m in _mapped_cuda(self._proc, pid, data):
                self._registry.add_mapped(self._proc, m)
            self._registry.add_code(self._proc, data, pid)
        self._vsize = alive
