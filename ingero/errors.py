"""The one exception type users can cause.

The library raises ``IngeroError(message, hint)`` anywhere; ``cli.py`` turns
it into one line on stderr and exit code 2 in exactly one place.  Anything
else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

# The longest message or hint an error carries.  Errors quote what they were given (a bad value,
# DuckDB's text about a column named in the SQL): a 50 MB MCP argument came back whole in the
# error.  Every message a user can see is bounded here, once.
MAX_MESSAGE_CHARS = 2000


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


class IngeroError(Exception):
    """A problem the user can fix: what went wrong, and how to fix it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        message = clip(str(message))
        super().__init__(message)
        self.message = message
        self.hint = None if hint is None else clip(str(hint))

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} — {self.hint}"
        return self.message


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text (DuckDB and BCC append pages of
    context), or its type name when it has no text: what a one-line error quotes."""
    text = str(exc).strip()
    return clip(text.splitlines()[0]) if text else type(exc).__name__
