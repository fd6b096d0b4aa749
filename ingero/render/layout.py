"""How a terminal view is laid out: the width it wraps to, whether it is coloured, how much it shows.

Lines are sanitised first (render/safe.py: a traced process's name may hold escapes), then
wrapped, then coloured, so the only escapes in the output are the severity colours added here.

Wrapping breaks only at spaces, and never inside a number with its unit (``12.4 s``), a
``PID 4242``, a process name the report knows (``python3 (train.py)``) or a command of a fix
(it must paste as one line): such a unit longer than the line is left whole and runs past it.
Continuation lines are indented two columns deeper than the line they continue.
"""

from __future__ import annotations

import os
import re
import shutil
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

from ingero.render import safe

# The width of a view that is not shown on a terminal (a pipe, a file, a test) or whose
# terminal does not say: wide enough for a fix's command line, narrow enough for a review.
DEFAULT_WIDTH = 100
# The narrowest width wrapped to (a terminal reporting 10 columns would put a word on each line).
MIN_WIDTH = 40
CONTINUATION = "  "  # continuation lines: this much deeper than their first line

# SGR colours of the severity tags (https://en.wikipedia.org/wiki/ANSI_escape_code#SGR)
SEVERITY_SGR = {"HIGH": "1;31", "MEDIUM": "1;33", "LOW": "2"}  # bold red, bold yellow, dim
RESET = "\x1b[0m"

# Sanitised text holds only printable characters, so NUL cannot occur in it: it stands for a
# space that must not break (textwrap breaks at whitespace only, and NUL is none).
_GLUE = "\x00"
_UNIT = re.compile(r"(?<=\d) (?=(?:ns|µs|us|ms|s|min|h|B|KB|MB|GB|TB|KiB|MiB|GiB|GB/s|MB/s|%|x|×|points|cores?|CPUs?)"
                   r"(?![\w/]))")
_PID = re.compile(r" ?\(?[PT]ID \d")  # '... (PID 4242)', 'PID 4242', '(TID 4243)'


@dataclass(frozen=True)
class View:
    """How much a view shows and how: ``verbose`` every line (explain -v) or the short form;
    ``width`` the columns to wrap to (None: one line per item, as JSON consumers and the HTML
    report take it); ``colour`` severity colours (only ever on a terminal); ``names`` the
    process names the report knows, kept whole on a line."""

    verbose: bool = True
    width: int | None = None
    colour: bool = False
    names: tuple[str, ...] = field(default=())

    def with_names(self, names: Iterable[str]) -> View:
        # longest first: 'python3 (train.py worker)' before 'python3 (train.py)'
        clean = sorted({safe.text(n) for n in names if n and " " in n}, key=len, reverse=True)
        return View(self.verbose, self.width, self.colour, tuple(clean))


def colour_wanted(out: IO[str], env: dict[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything but ''
    (https://no-color.org) or the terminal is 'dumb'."""
    env = os.environ if env is None else env
    if env.get("NO_COLOR", "") != "" or env.get("TERM") == "dumb":
        return False
    return safe.to_terminal(out)


def width_of(out: IO[str]) -> int:
    """The terminal's width (its COLUMNS first, as shutil reads it); DEFAULT_WIDTH when ``out``
    is no terminal or its size is unknown."""
    if not safe.to_terminal(out):
        return DEFAULT_WIDTH
    cols = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return max(MIN_WIDTH, cols) if cols > 0 else DEFAULT_WIDTH


def for_stream(out: IO[str], verbose: bool) -> View:
    """The view for ``out``: wrapped to its width, coloured when it is a terminal."""
    return View(verbose=verbose, width=width_of(out), colour=colour_wanted(out))


def glue_command(text: str) -> str:
    """A fix line's command (what comes before its '   (why)' comment) as one unbreakable word.
    A fix in words ('this host has 2 CPUs: ...', 'or allocate pinned: ...') wraps as prose."""
    cmd, sep, why = text.partition("   (")
    if ": " in cmd:
        return text
    return cmd.replace(" ", _GLUE) + sep + why


def _glue(text: str, view: View, keep: Iterable[str] = ()) -> str:
    for phrase in keep:
        phrase = safe.text(phrase)
        text = text.replace(phrase, phrase.replace(" ", _GLUE))
    for name in view.names:
        if name in text:
            text = text.replace(name, name.replace(" ", _GLUE))
    text = _UNIT.sub(_GLUE, text)
    return _PID.sub(lambda m: m.group(0).replace(" ", _GLUE), text)


def lines(text: str, view: View, first: str = "", rest: str | None = None, *,
          command: bool = False, keep: Iterable[str] = ()) -> list[str]:
    """``text`` (untrusted: sanitised here) after ``first`` (the renderer's own prefix), wrapped
    to the view's width; continuation lines start with ``rest`` (default: ``first``'s leading
    spaces plus CONTINUATION).  ``command``: a fix line, whose command never breaks; ``keep``:
    phrases of the text kept whole (the parts of a step: 'other CUDA 0.0%')."""
    shown = safe.text(text)
    if view.width is None:
        return [first + shown]
    if rest is None:
        lead = first or shown
        rest = " " * (len(lead) - len(lead.lstrip(" "))) + CONTINUATION
    glued = _glue(glue_command(shown) if command else shown, view, keep)
    wrapper = textwrap.TextWrapper(width=view.width, initial_indent=first, subsequent_indent=rest,
                                   break_long_words=False, break_on_hyphens=False)
    out = wrapper.wrap(glued) or [first.rstrip()]
    return [line.replace(_GLUE, " ") for line in out]


def coloured(line: str, severity: str, view: View) -> str:
    """``line`` with its leading '[SEVERITY]' tag in the severity's colour, when the view is coloured
    (after wrapping: the escapes take no columns)."""
    tag = f"[{severity}]"
    sgr = SEVERITY_SGR.get(severity)
    if not (view.colour and sgr and line.startswith(tag)):
        return line
    return f"\x1b[{sgr}m{tag}{RESET}" + line[len(tag):]
