"""explain --json: the Report as JSON, with a stable documented shape (docs/rules.md).

Top-level keys: format_version, analysed, system, chains, notes, stack.  Each
chain: rule_id, severity, title, root, effect, contributing, fix, pids,
culprits [{pid, name, detail}], evidence_windows [{start_ns, end_ns}],
windows_total, correlation, correlation_note, impact, share, numbers, headline (what a
notice counts instead of a share of wall clock: failed-calls; notices come first).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import IO, Any

from ingero.analyze import model
from ingero.analyze.model import Report

# Bumped when a key is renamed or removed (adding keys keeps the version).
FORMAT_VERSION = 1


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_dict(report: Report) -> dict[str, Any]:
    return _clean({"format_version": FORMAT_VERSION, **report.to_dict()})


def _build(cls: Any, doc: Any, **nested: Any) -> Any:
    """``cls`` from its to_dict form; keys a newer writer added are left out (a key it removed
    is a TypeError, as a value of the wrong shape is)."""
    if not isinstance(doc, dict):
        raise TypeError(f"{cls.__name__}: not an object")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: nested[k](v) if k in nested else v for k, v in doc.items() if k in names})


def _chain(doc: Any) -> model.Chain:
    return _build(model.Chain, doc, culprits=lambda vs: [_build(model.Culprit, v) for v in vs],
                  evidence_windows=lambda vs: [_build(model.Window, v) for v in vs])


def _optional(cls: Any) -> Any:
    return lambda v: None if v is None else _build(cls, v)


def from_dict(doc: dict[str, Any]) -> Report:
    """The Report a to_dict (explain --json, a tracer's reply) was made of, for the terminal view
    to lay out for its own terminal.  Raises TypeError or ValueError on any other shape."""
    if doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"explain JSON format {doc.get('format_version')!r}, not {FORMAT_VERSION}")
    return _build(Report, doc,
                  analysed=lambda v: _build(model.Analysed, v),
                  system=lambda v: _build(model.SystemContext, v),
                  chains=lambda vs: [_chain(v) for v in vs],
                  device=_optional(model.DeviceBusy),
                  steps=_optional(model.StepStats),
                  workloads=lambda vs: [_build(model.Workload, v) for v in vs])


def write(report: Report, out: IO[str]) -> None:
    json.dump(to_dict(report), out, indent=2, default=str)
    out.write("\n")


def explain_payload(report: Report) -> dict[str, Any]:
    """What `explain` shows, both ways: {"json": to_dict(report), "text": the terminal text, every
    line of it}.  The one builder for the command, the tracer's socket reply and MCP; the command
    lays the text out again from "json" for its own terminal (render.terminal.write_reply)."""
    import io

    from ingero.render import terminal

    text = io.StringIO()
    terminal.write(report, text, more=None)  # every line, unwrapped: the client lays it out
    return {"json": to_dict(report), "text": text.getvalue()}
