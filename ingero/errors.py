"""The one exception type users can cause.

The library raises ``IngeroError(message, hint)`` anywhere; ``cli.py`` turns
it into one line on stderr and exit code 2 in exactly one place.  Anything
else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class IngeroError(Exception):
    """A problem the user can fix: what went wrong, and how to fix it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} — {self.hint}"
        return self.message


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text (DuckDB and BCC append pages of
    context), or its type name when it has no text: what a one-line error quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
