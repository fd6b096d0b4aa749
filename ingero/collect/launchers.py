"""Launchers: programs that start the job instead of being it.

A process is named after the job it runs, so two kinds of launcher are
recognised from their argv:

* exec wrappers become the command through exec (``env``, ``nice``,
  ``taskset``, ``numactl``, ``chrt``, ``ionice``, ``nohup``, ``setsid``,
  ``stdbuf``, ``sh -c`` with one simple command, a pyenv/rbenv/asdf shim and
  ``pyenv exec``).  Until they exec, they are named after that command: it is
  the same process, and the exec is a few milliseconds away.
* spawning launchers keep running as the job's parent (``conda run``,
  ``uv run``, ``torchrun`` / ``python -m torch.distributed.run``).  They are
  named ``conda run (train.py)``, so the parent is never mistaken for the job.

``timeout``, ``time``, ``strace`` and the like fork a child and stay its
parent under their own name: they are not listed.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class _Wrapper:
    """How an exec wrapper's argv reads: options, then ``positionals`` arguments, then the command."""

    with_value: frozenset[str] = frozenset()  # options that take the next argument (or an attached one)
    positionals: int = 0  # arguments between the options and the command (taskset's mask, chrt's priority)
    pid_letters: str = ""  # short options that act on a running process: no command follows
    pid_long: frozenset[str] = frozenset()
    assignments: bool = False  # env: NAME=value arguments before the command


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


EXEC_WRAPPERS: dict[str, _Wrapper] = {
    "env": _Wrapper(_f("-u", "--unset", "-C", "--chdir"), assignments=True),
    "nice": _Wrapper(_f("-n", "--adjustment")),
    "taskset": _Wrapper(positionals=1, pid_letters="p", pid_long=_f("--pid")),
    "numactl": _Wrapper(_f("-C", "--physcpubind", "-N", "--cpunodebind", "-m", "--membind", "-i", "--interleave",
                           "-p", "--preferred", "-P", "--preferred-many", "-w", "--weighted-interleave",
                           "-f", "--file", "-L", "--length", "-M", "--mode", "-S", "--shm", "-o", "--offset",
                           "-T", "--shmid")),
    "chrt": _Wrapper(_f("-T", "--sched-runtime", "-P", "--sched-period", "-D", "--sched-deadline"), positionals=1,
                     pid_letters="p", pid_long=_f("--pid")),
    "ionice": _Wrapper(_f("-c", "--class", "-n", "--classdata"), pid_letters="pPu",
                       pid_long=_f("--pid", "--pgid", "--uid")),
    "nohup": _Wrapper(),
    "setsid": _Wrapper(),
    "stdbuf": _Wrapper(_f("-i", "--input", "-o", "--output", "-e", "--error")),
}

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})
# Version managers whose shims exec `<manager> exec <command>`, which execs the real program.
SHIM_MANAGERS = frozenset({"pyenv", "rbenv", "nodenv", "goenv", "asdf"})
# Tokens after which a `sh -c` string is not one simple command (the shell then forks, or runs more).
_SHELL_OPERATORS = frozenset(";&|<>()")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _wrapped_command(spec: _Wrapper, args: list[str]) -> list[str] | None:
    """The command an exec wrapper runs, or None (it acts on a pid, or runs nothing)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if a.startswith("--"):
            name = a.split("=", 1)[0]
            if name in spec.pid_long:
                return None
            i += 2 if (a in spec.with_value) else 1
            continue
        if a.startswith("-") and len(a) > 1:
            takes_next = False
            for j, letter in enumerate(a[1:]):
                if letter in spec.pid_letters:
                    return None
                if "-" + letter in spec.with_value:
                    takes_next = j == len(a) - 2  # the value is the next argument unless attached
                    break
            i += 2 if takes_next else 1
            continue
        if spec.assignments and "=" in a:
            i += 1
            continue
        break
    while spec.assignments and i < len(args) and "=" in args[i] and not args[i].startswith("-"):
        i += 1  # `env -- NAME=value cmd`
    i += spec.positionals
    return args[i:] if i < len(args) else None


def _env_split_string(args: list[str]) -> list[str] | None:
    """``env -S 'python3 -u'`` (a shebang's one argument): the string split, then the rest."""
    for i, a in enumerate(args):
        if not a.startswith("-"):
            return None
        for prefix in ("--split-string=", "-S"):
            if a.startswith(prefix) and len(a) > len(prefix):
                return _split(a[len(prefix):]) + args[i + 1:]
        if a in ("-S", "--split-string") and i + 1 < len(args):
            return _split(args[i + 1]) + args[i + 2:]
    return None


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # unbalanced quotes
        return text.split()


def simple_command(text: str) -> list[str] | None:
    """argv of ``sh -c TEXT`` when TEXT is one simple command (the shell execs it), else None.

    Leading NAME=value assignments and ``exec`` are dropped."""
    if "\n" in text.strip():
        return None
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        return None
    if any(t and set(t) <= _SHELL_OPERATORS for t in tokens):
        return None
    while tokens and _ASSIGNMENT.match(tokens[0]):
        tokens.pop(0)
    if tokens[:1] == ["exec"]:
        tokens.pop(0)
    return tokens or None


def _shell_command(args: list[str]) -> list[str] | None:
    """``sh [-e -l ...] -c CMD``: CMD's argv when it is one simple command."""
    dash_c = False
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "+o", "-O", "+O"):  # set -o NAME / shopt: the next argument is the option's name
            skip = True
            continue
        if a.startswith("-") and not a.startswith("--") and len(a) > 1:
            dash_c = dash_c or "c" in a[1:]
            continue
        if a.startswith("--"):
            continue
        return simple_command(a) if dash_c else None
    return None


def exec_target(program: str, args: list[str], path: str = "") -> list[str] | None:
    """The argv ``program args`` will exec into, when it is an exec wrapper; else None.

    ``path`` is the script's path when ``program`` is a script an interpreter
    runs (a shim is recognised by its directory)."""
    if "/shims/" in path:
        return [program, *args]
    if program == "env":
        split = _env_split_string(args)
        if split is not None:
            return split or None
    spec = EXEC_WRAPPERS.get(program)
    if spec is not None:
        return _wrapped_command(spec, args)
    if program in SHELLS:
        return _shell_command(args)
    if program in SHIM_MANAGERS and args[:1] == ["exec"]:
        return args[1:] or None
    if program.endswith("-exec") and program[: -len("-exec")] in SHIM_MANAGERS:
        return args or None
    return None


# Spawning launchers: (program, its subcommand or None) -> options that take a value.
_CONDA_OPTS = _f("-n", "--name", "-p", "--prefix", "--cwd")
_UV_RUN_OPTS = _f("--python", "-p", "--with", "-w", "--with-requirements", "--with-editable", "--package",
                  "--extra", "--group", "--no-group", "--only-group", "--env-file", "--directory", "--project",
                  "--index", "--default-index", "--index-url", "-i", "--extra-index-url", "--find-links", "-f",
                  "--config-file", "--cache-dir", "--color", "--python-preference", "--resolution", "--prerelease",
                  "--exclude-newer", "--link-mode", "--index-strategy", "--keyring-provider", "-C",
                  "--config-setting", "--refresh-package", "-P", "--upgrade-package", "--reinstall-package",
                  "--no-build-isolation-package", "--no-binary-package", "--only-binary-package", "--script")
# torchrun: every option takes a value (--nproc-per-node 2) except these flags.
_TORCHRUN_FLAGS = _f("--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module",
                     "--use-env", "--use_env")
TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})


def _command_index(args: list[str], takes_value: Callable[[str], bool]) -> int:
    """Index of the first argument after a launcher's options (and past a ``--``)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return i + 1
        if not a.startswith("-") or a == "-":
            return i
        i += 2 if takes_value(a) else 1
    return len(args)


def _options_then_command(args: list[str], with_value: frozenset[str]) -> list[str]:
    return args[_command_index(args, with_value.__contains__):]


def _torchrun_command(args: list[str]) -> list[str]:
    """A worker's argv as torchrun builds it: ``python script args`` (-m: a module; --no-python: a program)."""
    i = _command_index(args, lambda a: "=" not in a and a not in _TORCHRUN_FLAGS)
    options, rest = args[:i], args[i:]
    if not rest or {"--no-python", "--no_python"} & set(options):
        return rest
    return ["python", "-m", *rest] if {"-m", "--module"} & set(options) else ["python", *rest]


def spawned_command(program: str, args: list[str]) -> tuple[str, list[str]] | None:
    """(launcher label, the command it spawns) for a spawning launcher, else None.

    ``program`` is a program's base name, or for ``python -m X``, the module X."""
    if program in ("conda", "mamba", "micromamba") and args[:1] == ["run"]:
        return f"{program} run", _options_then_command(args[1:], _CONDA_OPTS)
    if program in ("uv", "uvx") and (program == "uvx" or args[:1] == ["run"]):
        rest = args if program == "uvx" else args[1:]
        return f"{program} run" if program == "uv" else program, _options_then_command(rest, _UV_RUN_OPTS)
    if program == "torchrun" or program in TORCHRUN_MODULES:
        return "torchrun", _torchrun_command(args)
    return None


def script_path_name(arg: str) -> str:
    """A script's base name; a script fed through a descriptor (bash /dev/fd/3) keeps its path."""
    if arg.startswith(("/dev/fd/", "/proc/")):
        return arg
    return os.path.basename(arg)
