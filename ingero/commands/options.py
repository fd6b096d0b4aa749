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

# The parsers live in ingero.values (the socket's request decoder uses them too).
parse_duration = values.parse_duration
parse_size = values.parse_size


class Value(click.ParamType):
    """A click type over one parser of ingero.values.  A bad value raises BadValue (an IngeroError:
    one line naming the flag, exit 2 at cli.py), the same words the socket replies with."""

    def __init__(self, name: str, parse: Callable[..., Any], **kwargs: Any) -> None:
        self.name = name
        self._parse = parse
        self._kwargs = kwargs

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        what = param.opts[0] if param is not None and getattr(param, "opts", None) else self.name
        return self._parse(value, what, **self._kwargs)


DURATION = Value("duration", values.parse_duration)
SIZE = Value("size", values.parse_size)
WINDOW = Value("window", values.parse_window)
TIME = Value("time", values.parse_time)
COUNT = Value("count", values.parse_count)
PID = Value("pid", values.parse_count, cap=2**22)  # the kernel's pid_max limit
COMMAND = Value("command", values.parse_command)
TIMEOUT = Value("duration", values.parse_duration, cap_s=300.0)  # = daemon.protocol.MAX_TIMEOUT_S

F = Callable[..., Any]


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
