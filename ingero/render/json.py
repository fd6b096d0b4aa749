"""explain --json: the Report as JSON, with a stable documented shape (docs/rules.md).

Top-level keys: format_version, analysed, system, chains, notes, stack.  Each
chain: rule_id, severity, title, root, effect, contributing, fix, pids,
culprits [{pid, name, detail}], evidence_windows [{start_ns, end_ns}],
windows_total, correlation, correlation_note, impact, share, numbers, headline (what a
notice counts instead of a share of wall clock: failed-calls; notices come first).
"""

from __future__ import annotations

import json
import math
from typing import IO, Any

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


def write(report: Report, out: IO[str]) -> None:
    json.dump(to_dict(report), out, indent=2, default=str)
    out.write("\n")


def explain_payload(report: Report) -> dict[str, Any]:
    """What `explain` shows, both ways: {"json": to_dict(report), "text": the terminal text}.
    The one builder for the command, the tracer's socket reply and the demo."""
    import io

    from ingero.render import terminal

    text = io.StringIO()
    terminal.write(report, text)
    return {"json": to_dict(report), "text": text.getvalue()}
