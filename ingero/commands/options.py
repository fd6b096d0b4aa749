"""Options shared by several commands, written once.

Every value goes through ingero.values, so every command reads ``--since
1h30m`` and ``--max-db 10GB`` the same way, and refuses NaN the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from ingero import values
from ingero.store.db import default_db_path

F = Callable[..., Any]

# The parsers live in ingero.values (the socket's request decoder uses them too).
parse_duration = values.parse_duration
parse_size = values.parse_size


class Value(click.ParamType):
    """A click type over one parser of ingero.values.  A bad value raises BadValue (an IngeroError:
    one line naming the flag, exit 2 at cli.py), the same words the socket replies with.

    ``metavar`` is the placeholder --help shows: what to type (DURATION, N, PCT|off), never the
    parser's name."""

    def __init__(self, name: str, parse: Callable[..., Any], *, metavar: str | None = None, **kwargs: Any) -> None:
        self.name = name
        self.metavar = metavar or name.upper()
        self._parse = parse
        self._kwargs = kwargs

    def get_metavar(self, param: Any, ctx: Any = None) -> str:  # (click 8.1 passes no ctx)
        return self.metavar

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        what = _flag(param, self.name)
        return self._parse(value, what, **self._kwargs)


def _flag(param: Any, default: str) -> str:
    """The option's long name (--pid, not -p) for messages: what the user finds in --help."""
    opts = getattr(param, "opts", None) or []
    return next((o for o in opts if o.startswith("--")), opts[0] if opts else default)


DURATION = Value("duration", values.parse_duration)
SIZE = Value("size", values.parse_size)
WINDOW = Value("window", values.parse_window, metavar="DURATION")
TIME = Value("time", values.parse_time)
COUNT = Value("count", values.parse_count, metavar="N")
COMMAND = Value("command", values.parse_command)
TIMEOUT = Value("duration", values.parse_duration, cap_s=300.0)  # = daemon.protocol.MAX_TIMEOUT_S
SESSION = Value("session", values.parse_count, metavar="ID")

PID_MAX = 2**22  # the kernel's pid_max limit
PIDS_METAVAR = "PID[,PID...]"
PIDS_HINT = "pass process ids, comma-separated or repeated: --pid 123,456 or -p 123 -p 456"


class Pids(click.ParamType):
    """One --pid value: a process id or a comma-separated list of them ('123', '123,456').

    Every command taking processes reads them this way, repeated or comma-separated (pid_option).
    A bad entry, or a value naming no process at all (--pid '' would otherwise mean every
    process), is one line and exit 2."""

    name = "pids"

    def get_metavar(self, param: Any, ctx: Any = None) -> str:
        return PIDS_METAVAR

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, ...]:
        if isinstance(value, tuple):  # a default, already converted
            return value
        what = _flag(param, "--pid")
        text = value if isinstance(value, str) else str(value)
        parts = [part.strip() for part in text.split(",")]
        if not any(parts):
            raise values.BadValue(f"bad {what}: {text!r} names no process", PIDS_HINT)
        out = []
        for part in parts:
            if not part:
                continue  # "12,34," : a trailing comma is harmless
            if not (part.isascii() and part.isdigit()):  # (str.isdigit and int() take '٣' too)
                raise values.BadValue(f"bad {what}: {part!r} is not a process id", PIDS_HINT)
            try:
                out.append(values.parse_count(part, what, cap=PID_MAX))  # (0, past pid_max: says which)
            except values.BadValue as exc:
                raise values.BadValue(exc.message, PIDS_HINT) from None
        return tuple(out)


PIDS = Pids()


def _flatten_pids(ctx: Any, param: Any, value: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(pid for group in value for pid in group))  # in order, each once


def pid_option(help: str) -> Callable[[F], F]:
    """-p/--pid, repeatable and comma-separated (-p 1 -p 2, --pid 1,2): the one syntax of every
    command that takes processes.  The parameter is ``pids``, a tuple of distinct ids."""

    def decorate(f: F) -> F:
        return click.option("-p", "--pid", "pids", type=PIDS, multiple=True, callback=_flatten_pids,
                            help=f"{help} Repeat it or separate ids with commas: -p 12 -p 34, --pid 12,34.")(f)

    return decorate

def db_option(f: F) -> F:
    return click.option(
        "--db",
        "db_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="DuckDB file (default: $INGERO_DB, else ~/.ingero/ingero.duckdb of the invoking user).",
    )(f)


def resolve_db(db_path: Path | None) -> Path:
    return db_path if db_path is not None else default_db_path()


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")(f)


def since_option(f: F) -> F:
    return click.option(
        "--since",
        type=DURATION,
        default=None,
        help="Only the last DURATION of data (30s, 2m, 1h30m).",
    )(f)
