"""What ``trace --cmd`` will run and map, known before it starts: its probes go in first.

A 0.5 s program with the CUDA runtime linked in (nvcc's default) made every
call before the once-a-second library scan could see it when it was started
through ``env``, ``sh -c`` or a script.  The command is known before it runs,
so this module follows it the way the kernel and the dynamic loader will:

* the programs it execs in turn: the command resolved through PATH, a
  script's ``#!`` interpreter (``#!/usr/bin/env python3`` included), and the
  exec wrappers of launchers.py (``env``, ``nice``, ``taskset``, ``sh -c``
  with one simple command ...);
* every object the last ELF program links (DT_NEEDED, breadth first), found
  as ld.so finds it: DT_RPATH, LD_LIBRARY_PATH of the command's environment,
  DT_RUNPATH (``$ORIGIN`` expanded), the ld.so cache, the system directories.

``attach`` then examines each (libs.LibraryWatcher: a libcudart / libcuda /
libnccl by its exports, any program or library for a runtime linked in) and
attaches what it finds, before the command is released.  What cannot be
known in advance (a dlopen, a program a script runs later) is held when it
is mapped instead (holds.py).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ingero.collect import launchers, static_runtime
from ingero.collect.libs import library_name

MAX_PROGRAMS = 8  # execs followed in a row (the same cap as procnames' launcher chain)
MAX_OBJECTS = 256  # shared objects read per program: far above any real link map (PyTorch's python: ~10)
# glibc's system directories on the multiarch distributions and the others
_SYSTEM_DIRS = {
    "x86_64": ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"),
    "aarch64": ("/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"),
}
_CACHE_TAG = {"x86_64": "x86-64", "aarch64": "AArch64"}


def _which(name: str, env: Mapping[str, str], cwd: str) -> Path | None:
    if "/" in name:
        p = Path(cwd, name) if not os.path.isabs(name) else Path(name)
        return p if os.access(p, os.X_OK) and p.is_file() else None
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    return Path(found) if found else None


def _shebang(path: Path) -> list[str] | None:
    """``#!interpreter [one argument]`` of a script, as the kernel splits it; None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    if not line:
        return None
    interp, _, arg = line.partition(" ")
    arg = arg.strip()
    return [interp, arg] if arg else [interp]


def programs(argv: list[str], env: Mapping[str, str], cwd: str | None = None) -> list[Path]:
    """The programs ``argv`` becomes through exec, in order (the first is what the launcher execs)."""
    cwd = cwd or os.getcwd()
    out: list[Path] = []
    for _ in range(MAX_PROGRAMS):
        if not argv:
            break
        exe = _which(argv[0], env, cwd)
        if exe is None:
            break
        script = _shebang(exe)
        if script is not None:  # the kernel runs the interpreter with the script's path after its argument
            out.append(exe)
            argv = [*script, str(exe), *argv[1:]]
            continue
        out.append(exe)
        nxt = launchers.exec_target(exe.name, argv[1:], str(exe))
        if nxt is None or nxt == argv:
            break
        argv = nxt
    return list(dict.fromkeys(out))


def _ld_cache() -> dict[str, str]:
    """soname -> path from the ld.so cache (``ldconfig -p``), this architecture's entries only."""
    try:
        text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    tag = _CACHE_TAG.get(platform.machine())
    out: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        name, sep, path = line.strip().partition(" => ")
        if not sep:
            continue
        soname, _, flags = name.partition(" ")
        if tag is None or tag in flags or "," not in flags:
            out.setdefault(soname, path)
    return out


def _expand(entry: str, origin: Path) -> str:
    lib = "lib64" if platform.machine() in ("x86_64", "aarch64") else "lib"
    for token, value in (("$ORIGIN", str(origin)), ("${ORIGIN}", str(origin)), ("$LIB", lib), ("${LIB}", lib),
                         ("$PLATFORM", platform.machine()), ("${PLATFORM}", platform.machine())):
        entry = entry.replace(token, value)
    return entry


class _Resolver:
    """ld.so's search for one program's link map."""

    def __init__(self, env: Mapping[str, str], cache: Mapping[str, str] | None):
        self.ld_library_path = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        self._cache = cache
        self.system = _SYSTEM_DIRS.get(platform.machine(), ("/lib64", "/usr/lib64", "/lib", "/usr/lib"))

    def cache(self) -> Mapping[str, str]:
        if self._cache is None:
            self._cache = _ld_cache()
        return self._cache

    def find(self, name: str, obj: Path, dyn: static_runtime.Dynamic, rpaths: list[str]) -> Path | None:
        if "/" in name:
            return Path(name) if os.path.isfile(name) else None
        dirs: list[str] = []
        if not dyn.runpath:
            dirs += rpaths  # DT_RPATH of this object and of those that loaded it (expanded by each)
        dirs += self.ld_library_path
        dirs += [_expand(d, obj.parent) for d in dyn.runpath]
        for d in dirs:
            cand = Path(d, name)
            if cand.is_file():
                return cand
        cached = self.cache().get(name)
        if cached and os.path.isfile(cached):
            return Path(cached)
        for d in self.system:
            cand = Path(d, name)
            if cand.is_file():
                return cand
        return None


def link_map(program: Path, env: Mapping[str, str], cache: Mapping[str, str] | None = None) -> list[Path]:
    """Every shared object the dynamic loader maps for ``program`` (itself excluded), breadth first."""
    dyn = static_runtime.dynamic(program)
    if dyn is None:
        return []
    resolver = _Resolver(env, cache)
    out: list[Path] = []
    seen: set[str] = set()
    # (object, its dynamic section, DT_RPATH inherited from the objects that loaded it)
    todo = deque([(program, dyn, [_expand(r, program.parent) for r in dyn.rpath])])
    while todo and len(out) < MAX_OBJECTS:
        obj, d, rpaths = todo.popleft()
        for name in d.needed:
            if name in seen:
                continue
            seen.add(name)
            path = resolver.find(name, obj, d, rpaths)
            if path is None:
                continue
            out.append(path)
            sub = static_runtime.dynamic(path)
            if sub is not None:
                todo.append((path, sub, rpaths + [_expand(r, path.parent) for r in sub.rpath]))
    return out


def attach(program: Any, watcher: Any, argv: list[str], env: Mapping[str, str] | None,
           line: Callable[[Any, int, int], str]) -> list[str]:
    """Attach everything the command will run and link before it starts; the attach lines."""
    env = os.environ if env is None else env
    lines = []
    chain = programs(argv, env)
    files: list[tuple[Path, str]] = []
    for i, exe in enumerate(chain):
        files.append((exe, "the --cmd program" if i == 0 else "a program the --cmd command execs"))
    if chain:
        files += [(p, "a library of the --cmd program") for p in link_map(chain[-1], env)]
    for path, who in _unique(files):
        try:
            st = os.stat(path)
        except OSError:
            continue
        real = Path(os.path.realpath(path))
        found = watcher.take_file(real, st, who) if library_name(real.name) else watcher.take_program(real, st, who)
        for lib in found:
            ok, failed = program.attach_library(lib.path, lib.kind, lib.identity, lib.symbols, lib.addresses)
            if ok or failed:
                lines.append(line(lib, ok, failed) + " before the command started")
    return lines


def _unique(files: Iterable[tuple[Path, str]]) -> list[tuple[Path, str]]:
    seen: set[str] = set()
    out = []
    for path, who in files:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            out.append((path, who))
    return out
