"""Query results as a text table, JSON or CSV: pure functions of a QueryResult.

Values are whatever the store holds (a traced process's name, an imported op name, a fleet node's
chain text): the text table, and CSV written to a terminal, show them through the sanitiser
(render/safe.py); JSON escapes control characters itself, CSV into a file or pipe keeps the bytes.
"""

from __future__ import annotations

import csv
import json
from typing import IO, Any

from ingero.render import safe
from ingero.store.query import QueryResult

MAX_CELL = 80  # wider cells are cut in the text table (JSON/CSV keep everything)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = safe.text(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def write_text(result: QueryResult, out: IO[str]) -> None:
    """Aligned columns, numbers right-aligned; a footer with the row count."""
    if not result.columns:
        out.write("OK\n")
        return
    cells = [[_cell(v) for v in row] for row in result.rows]
    numeric = [
        all(isinstance(row[i], (int, float)) or row[i] is None for row in result.rows) and bool(result.rows)
        for i in range(len(result.columns))
    ]
    widths = [max([len(safe.text(c))] + [len(r[i]) for r in cells]) for i, c in enumerate(result.columns)]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out.write(line([safe.text(c) for c in result.columns]) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in cells:
        out.write(line(row) + "\n")
    n = len(result.rows)
    more = " (more rows not shown: add LIMIT or use --max-rows)" if result.truncated else ""
    out.write(f"({n} row{'s' if n != 1 else ''}){more}\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def write_json(result: QueryResult, out: IO[str]) -> None:
    """{"columns": [...], "rows": [{col: value}, ...], "truncated": bool}"""
    doc = {
        "columns": result.columns,
        "rows": [dict(zip(result.columns, (_jsonable(v) for v in row))) for row in result.rows],
        "truncated": result.truncated,
    }
    json.dump(doc, out)
    out.write("\n")


def write_csv(result: QueryResult, out: IO[str], terminal: bool | None = None) -> None:
    """CSV; on a terminal (``terminal`` None: whether ``out`` is one) every value goes through the
    sanitiser, elsewhere the values are written as stored."""
    shown = safe.to_terminal(out) if terminal is None else terminal
    clean = safe.text if shown else (lambda v: v)
    w = csv.writer(out, lineterminator="\n")
    w.writerow([clean(c) for c in result.columns])
    for row in result.rows:
        w.writerow(["" if v is None else clean(v) for v in row])


def write_schema(tables: list[Any], out: IO[str]) -> None:
    """The tables and columns of the store, with types and meanings."""
    for t in tables:
        out.write(f"{t.name}" + (f"  -- {t.doc}" if t.doc else "") + "\n")
        width = max(len(c.name) for c in t.columns)
        twidth = max(len(c.type) for c in t.columns)
        for c in t.columns:
            out.write(f"  {c.name.ljust(width)}  {c.type.ljust(twidth)}  {c.doc}".rstrip() + "\n")
        out.write("\n")
