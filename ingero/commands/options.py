"""Options shared by several commands, written once.

Also the parsers for durations and sizes, so every command reads
``--since 1h30m`` and ``--max-db 10GB`` the same way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import click

from ingero.store.db import default_db_path

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s|d)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'90s', '2m', '1h30m', '1.5h', '250ms' -> seconds.  A bare number means seconds."""
    s = text.strip().lower()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pos = 0
        value = 0.0
        for m in _DURATION_PART.finditer(s):
            if m.start() != pos:
                break
            value += float(m.group(1)) * _UNIT_S[m.group(2)]
            pos = m.end()
        if pos != len(s) or pos == 0:
            raise ValueError(f"{text!r} is not a duration (try 30s, 2m, 1h30m)") from None
    if value <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return value


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)$")
_SIZE_MULT = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
              "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def parse_size(text: str) -> int:
    """'10GB', '512MiB', '1000' -> bytes."""
    m = _SIZE.match(text.strip().lower())
    if not m or m.group(2) not in _SIZE_MULT:
        raise ValueError(f"{text!r} is not a size (try 500MB, 10GB)")
    return int(float(m.group(1)) * _SIZE_MULT[m.group(2)])


class Duration(click.ParamType):
    """A click type for durations; bad values become click's usage error (exit 2)."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Size(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()
SIZE = Size()

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
