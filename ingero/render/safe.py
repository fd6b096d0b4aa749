"""Text from traced processes and files, made harmless before it reaches a terminal.

A process name or command line, an NVTX range, an imported trace's op names,
a fleet node's chain text: any of them may hold terminal escapes
(``ESC ] 0 ; title BEL`` retitles the window, ``ESC [ 2 J`` clears it) or
bidi overrides that make a line read differently from its bytes.  Every
terminal renderer passes what it prints through ``text`` (one value, one
line) or ``lines`` (text whose line breaks are the renderer's own, e.g. the
explain text a tracer sends over its socket).  JSON output keeps its own
escaping (``json.dumps`` writes control characters as \\u001b) and HTML its
own (``html.escape``).

What is escaped: every character Python does not call printable (C0 and C1
controls, DEL, tabs and line breaks, Unicode format characters such as the
bidi overrides and isolates, line and paragraph separators, lone surrogates
from undecodable bytes, unassigned code points), written as ``\\x1b``,
``\\u202e`` or ``\\U000e0001``.  Printable text, backslashes included, is
left as it is.
"""

from __future__ import annotations

from typing import IO, Any


def _escape(c: str) -> str:
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    if n < 0x10000:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def text(value: Any) -> str:
    """``value`` as one printable line: every non-printable character shown escaped."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():  # the common case, in C
        return s
    return "".join(c if c.isprintable() else _escape(c) for c in s)


def lines(value: Any) -> str:
    """Like ``text`` but keeping the line breaks (``\\n``) of a text a renderer made."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():
        return s
    return "\n".join(text(part) for part in s.split("\n"))


def to_terminal(out: IO[str]) -> bool:
    """Whether ``out`` is a terminal (a stream without isatty counts as not one)."""
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False
