"""Readable process names from /proc: ``python3 (train.py)``, ``stress-ng``, ``gzip``.

The kernel's comm is 15 characters and often useless for ML jobs (PyTorch
renames its main thread ``pt_main_thread``; every interpreter is just
``python3``), so the name is built from the command line: the program's base
name, plus, for an interpreter, what it runs (script, ``-m module``, ``-c``,
``-jar x.jar``, main class).  Launchers are seen through (collect/launchers.py):
``env taskset -c 0 python3 train.py`` and a pyenv shim are ``python3 (train.py)``
before they exec it, ``conda run -n x python train.py`` is ``conda run (train.py)``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from ingero.collect import launchers

PROC = Path("/proc")

# Exec wrappers followed in a row (env nice taskset python3 ...): naming always ends.
MAX_LAUNCHERS = 8

# A stored command line is capped: some launchers pass megabytes of arguments.
MAX_CMDLINE_CHARS = 4096

_PYTHON = re.compile(r"^(?:python|pypy)(?:[0-9]+(?:\.[0-9]+)*)?[a-z]?$")
# Shells and script interpreters whose first non-option argument is the script.
_SCRIPT_INTERPRETERS = re.compile(
    r"^(?:node|nodejs|deno|bun|ruby|perl|php|Rscript|lua[0-9.]*|bash|sh|dash|zsh|ksh|fish|tclsh)$"
)

# Interpreter options that consume the next argument (so it is not the script).
_PYTHON_OPTS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}
_JAVA_OPTS_WITH_VALUE = {"-cp", "-classpath", "--class-path", "-p", "--module-path", "--add-modules", "-d"}
_SCRIPT_OPTS_WITH_VALUE = {"-r", "--require", "--import", "--loader", "-o", "-O", "-I", "-e", "-E"}


def read_proc_file(path: Path) -> bytes | None:
    """A /proc file's bytes, or None when the process (or file) is gone."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def split_cmdline(raw: bytes) -> list[str]:
    """argv from /proc/PID/cmdline (NUL separated).

    A process that rewrote its title (setproctitle, stress-ng workers,
    postgres) leaves one space-separated string: split that on spaces.
    """
    args = [a.decode("utf-8", "replace") for a in raw.split(b"\0")]
    while args and args[-1] == "":
        args.pop()
    if len(args) == 1 and " " in args[0]:
        args = args[0].split()
    return args


def _python_split(args: list[str]) -> tuple[str, int] | None:
    """What a python argv runs: ('-m', i) module at args[i], ('-c', i), ('-', i) stdin, ('script', i)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            return "-m", i + 1
        if a.startswith("-m") and len(a) > 2:
            return "-m", i
        if a == "-c" or (a.startswith("-c") and len(a) > 2):
            return "-c", i
        if a in _PYTHON_OPTS_WITH_VALUE:
            i += 2
            continue
        if a == "-":
            return "-", i
        if not a.startswith("-"):
            return "script", i
        i += 1
    return None


def _python_target(args: list[str]) -> str | None:
    split = _python_split(args)
    if split is None:
        return None
    kind, i = split
    if kind == "-m":
        return f"-m {args[i][2:] if args[i].startswith('-m') else args[i]}"
    if kind == "-c":
        return "-c"
    return "stdin" if kind == "-" else launchers.script_path_name(args[i])


def _java_target(args: list[str]) -> str | None:
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-jar" and i + 1 < len(args):
            return os.path.basename(args[i + 1])
        if a in _JAVA_OPTS_WITH_VALUE:
            i += 2
            continue
        if not a.startswith("-"):
            return a  # the main class
        i += 1
    return None


def _script_split(args: list[str]) -> tuple[str, int] | None:
    """('-c' / '-e' / '--eval', i) for inline code, ('script', i) for a script file."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-c", "-e", "--eval"):
            return a, i
        if a in _SCRIPT_OPTS_WITH_VALUE:
            i += 2
            continue
        if not a.startswith("-"):
            return "script", i
        i += 1
    return None


def _script_target(args: list[str]) -> str | None:
    split = _script_split(args)
    if split is None:
        return None
    kind, i = split
    return launchers.script_path_name(args[i]) if kind == "script" else kind


def _runs(program: str, args: list[str]) -> tuple[str, str, list[str]] | None:
    """(name, path, its arguments) of the script or module an interpreter runs, else None."""
    if _PYTHON.match(program):
        split = _python_split(args)
        if split is None or split[0] in ("-c", "-"):
            return None
        kind, i = split
        if kind == "-m":
            module = args[i][2:] if args[i].startswith("-m") else args[i]
            return module, "", args[i + 1:]
        return os.path.basename(args[i]), args[i], args[i + 1:]
    if _SCRIPT_INTERPRETERS.match(program):
        split = _script_split(args)
        if split is None or split[0] != "script":
            return None
        i = split[1]
        return os.path.basename(args[i]), args[i], args[i + 1:]
    return None


def _target(program: str, args: list[str]) -> str | None:
    if _PYTHON.match(program):
        return _python_target(args)
    if program == "java":
        return _java_target(args)
    if _SCRIPT_INTERPRETERS.match(program):
        return _script_target(args)
    return None


def identify(argv: list[str], comm: str, depth: int = 0) -> tuple[str, str | None]:
    """(program, what it runs) of the job ``argv`` stands for, launchers seen through.

    An exec wrapper (``env``, ``taskset``, a pyenv shim, ``sh -c CMD``) is
    named after the command it becomes; a spawning launcher (``conda run``,
    ``uv run``, ``torchrun``) is named ``conda run`` with what it runs."""
    if not argv:  # kernel thread, or a zombie whose memory is gone
        return comm, None
    for _ in range(MAX_LAUNCHERS):
        program = os.path.basename(argv[0]) or comm
        rest = argv[1:]
        runs = _runs(program, rest)
        inner = launchers.exec_target(program, rest)
        if inner is None and runs is not None:
            name, path, args = runs
            inner = launchers.exec_target(name, args, path=path)
        if not inner:
            break
        argv = inner
    spawn = launchers.spawned_command(program, rest)
    if spawn is None and runs is not None:
        spawn = launchers.spawned_command(runs[0], runs[2])
    if spawn is not None and depth < MAX_LAUNCHERS:
        label, child = spawn
        child_program, child_target = identify(child, "", depth + 1)
        return label, child_target or child_program or None
    return program, _target(program, rest)


def readable_name(argv: list[str], comm: str) -> str:
    """``python3 (train.py)`` for an interpreter, the program's base name otherwise (launchers seen through)."""
    program, target = identify(argv, comm)
    return f"{program} ({target})" if target else program


def process_info(pid: int, proc: Path = PROC) -> dict | None:
    """{pid, name, comm, cmdline, ppid} of a live process, or None if it is gone."""
    base = proc / str(pid)
    comm_raw = read_proc_file(base / "comm")
    if comm_raw is None:
        return None
    comm = comm_raw.decode("utf-8", "replace").rstrip("\n")
    argv = split_cmdline(read_proc_file(base / "cmdline") or b"")
    return {
        "pid": pid,
        "name": readable_name(argv, comm),
        "comm": comm,
        "cmdline": " ".join(argv)[:MAX_CMDLINE_CHARS],
        "ppid": _ppid(base),
    }


def _ppid(base: Path) -> int | None:
    """Field 4 of /proc/PID/stat (after the parenthesised comm, which may hold spaces)."""
    raw = read_proc_file(base / "stat")
    if not raw:
        return None
    try:
        return int(stat_fields(raw)[1])
    except (ValueError, IndexError):
        return None


def stat_fields(raw: bytes) -> list[bytes]:
    """/proc/PID/stat fields from field 3 (state) on: index i is field i + 3.

    The comm in field 2 is parenthesised and may hold spaces or ')', so the
    split starts after its last ')'.
    """
    return raw[raw.rfind(b")") + 2 :].split()


def describe_pids(pids: Iterable[int], proc: Path = PROC) -> list[dict]:
    """process_info for each pid still alive, in the order given, duplicates dropped."""
    out = []
    for pid in dict.fromkeys(pids):
        info = process_info(pid, proc)
        if info is not None:
            out.append(info)
    return out
