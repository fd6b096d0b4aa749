"""Docs that can drift are generated and checked here."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from ingero.store.db import Store
from ingero.store.schema_doc import markdown, tables

ROOT = Path(__file__).resolve().parents[2]


def test_schema_md_is_current() -> None:
    assert (ROOT / "docs" / "schema.md").read_text() == markdown(), "run `make docs`"


def test_schema_doc_lists_every_real_column() -> None:
    con = Store.memory().con
    real = {
        (t, c)
        for t, c in con.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'main'"
        ).fetchall()
    }
    documented = {(t.name, c.name) for t in tables() for c in t.columns}
    assert documented == real


def test_every_event_column_has_a_meaning() -> None:
    events = next(t for t in tables() if t.name == "events")
    undocumented = [c.name for c in events.columns if not c.doc]
    assert undocumented == []


def test_design_contract_columns_exist() -> None:
    """The minimum public contract of shared/DESIGN.md: never renamed."""
    con: duckdb.DuckDBPyConnection = Store.memory().con
    cols = {r[0]: r[1] for r in con.execute("DESCRIBE events").fetchall()}
    for name, typ in {"timestamp": "BIGINT", "duration_ns": "BIGINT", "pid": "INTEGER",
                      "tid": "INTEGER"}.items():
        assert cols[name] == typ
    # op: VARCHAR until schema 11, an ENUM of the op names since (issue 22), read as text
    # (tests/unit/test_op_enum.py runs every documented query on both)
    assert cols["op"] == "VARCHAR" or cols["op"].startswith("ENUM('bench', 'block_io', ")
    assert con.execute("SELECT typeof('sched_switch'::OP_NAME::VARCHAR)").fetchall() == [("VARCHAR",)]
    for table in ("process_names", "sessions", "stacks", "system_metrics", "gpu_metrics"):
        con.execute(f"SELECT * FROM {table} LIMIT 0")


def test_the_readme_is_read_in_a_minute_and_its_links_resolve() -> None:
    """A newcomer's page: at most ~150 lines, the install, the quick start and the requirements in it,
    everything else in docs/ behind links that exist."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert {"Install", "Quick start", "Requirements"} <= set(headings), headings
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert links and all((ROOT / link).exists() for link in links), [ln for ln in links if not (ROOT / ln).exists()]
    for doc in (ROOT / "docs").glob("*.md"):  # the docs' own relative links
        for link in re.findall(r"\]\(([^)#:]+)\)", doc.read_text()):
            assert (doc.parent / link).exists(), (doc.name, link)
