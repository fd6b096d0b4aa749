"""The schema as documentation: tables, columns, types and meanings.

Read from the comments in schema.sql, the single source, so that
`ingero query --schema` and docs/schema.md can never disagree with the DDL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ingero.store.db import schema_sql

_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \(")
_COLUMN = re.compile(r"^\s{4}(\w+) ([A-Z_]+(?:\[\])?)[^-]*?(?:--\s*(.*))?$")


@dataclass
class Column:
    name: str
    type: str
    doc: str


@dataclass
class Table:
    name: str
    doc: str
    columns: list[Column] = field(default_factory=list)


def tables() -> list[Table]:
    """Every table of schema.sql with its columns, in file order."""
    out: list[Table] = []
    pending_doc: list[str] = []
    current: Table | None = None
    for line in schema_sql().splitlines():
        m = _TABLE.search(line)
        if m:
            current = Table(m.group(1), " ".join(pending_doc))
            out.append(current)
            pending_doc = []
            continue
        if current is not None:
            if line.startswith(")"):
                current = None
                continue
            c = _COLUMN.match(line)
            if c and c.group(1) != "PRIMARY":
                current.columns.append(Column(c.group(1), c.group(2), (c.group(3) or "").strip()))
            continue
        if line.startswith("-- ") and not line.startswith("-- ingero store schema"):
            pending_doc.append(line[3:].strip())
        elif not line.strip():
            pending_doc = []
    return out


def markdown() -> str:
    """docs/schema.md, generated (tests/unit/test_docs.py checks it is current)."""
    lines = [
        "# ingero store schema",
        "",
        "Generated from `ingero/store/schema.sql` by `make docs`; do not edit by hand.",
        "Timestamps are nanoseconds since the Unix epoch; units are in column names",
        "(`_ns` nanoseconds, `_bytes` bytes, `_pct` percent). Columns are only ever added.",
        "`ingero query --schema` prints the same.",
        "",
    ]
    for t in tables():
        lines.append(f"## {t.name}")
        lines.append("")
        if t.doc:
            lines.append(t.doc)
            lines.append("")
        lines.append("| column | type | meaning |")
        lines.append("| --- | --- | --- |")
        for c in t.columns:
            lines.append(f"| `{c.name}` | {c.type} | {c.doc.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)
