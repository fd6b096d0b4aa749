"""explain's reply (render.json.explain_payload, made here or by a tracer behind its socket), shown.

The reply carries the Report as JSON and its text; the text is laid out for no terminal in
particular (every line, unwrapped), so the command lays the JSON out again for its own: the
width it has, colour when it is a terminal, short or -v.
"""

from __future__ import annotations

from typing import IO, Any

from ingero.render import json as json_view
from ingero.render import layout, safe, terminal


def write(reply: dict[str, Any], out: IO[str], verbose: bool) -> None:
    """``reply`` laid out for ``out``; a reply whose JSON has another shape (another version's
    tracer) prints its own text, sanitised, its line breaks kept."""
    try:
        report = json_view.from_dict(reply["json"])
    except (KeyError, TypeError, ValueError, AttributeError):
        out.write(safe.lines(reply["text"]))
        return
    terminal.write(report, out, layout.for_stream(out, verbose))
