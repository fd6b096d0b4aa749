"""The export entry point: open the store read-only, resolve the selection, write atomically."""

from __future__ import annotations

from pathlib import Path

from ingero.analyze.context import Options
from ingero.errors import IngeroError
from ingero.export import output
from ingero.export.selection import select
from ingero.store.db import Store


def export(db: Path, fmt: str, path: Path, opts: Options, *, force: bool = False) -> str:
    """Write the export; return the one line to print about it."""
    output.check_target(path, force)  # before the (slow) work: a wrong -o fails at once
    store = Store.open(db, read_only=True)
    try:
        sel = select(store.con, opts)
        if fmt == "perfetto":
            from ingero.export import perfetto

            with output.atomic_file(path, force) as tmp, open(tmp, "wb") as f:
                s = perfetto.export(store.con, sel, f, path)
            device = f"{s.device_slices:,} device slices, " if s.device_slices else ""
            return (f"wrote {path}: {s.events:,} events, {device}{s.chains} chains with {s.flows} arrows, "
                    f"{s.bytes / 1e6:.1f} MB — open it in https://ui.perfetto.dev")
        if fmt == "parquet":
            from ingero.export import parquet

            with output.atomic_dir(path, force) as tmp:
                rows = parquet.export(store.con, sel, tmp)
            return f"wrote {path}: " + ", ".join(f"{k} ({v:,} rows)" for k, v in rows.items())
        raise IngeroError(f"unknown format {fmt!r}", "use perfetto or parquet")
    finally:
        store.close()


def report(db: Path, path: Path, opts: Options, *, force: bool = False) -> str:
    """Write the one-file HTML report; return the line to print about it."""
    from ingero.analyze.explain import explain
    from ingero.export import report_data, report_html

    output.check_target(path, force)
    store = Store.open(db, read_only=True)
    try:
        sel = select(store.con, opts)
        rep = explain(store.con, opts)
        charts = report_data.collect(store.con, sel)
        with output.atomic_file(path, force) as tmp, open(tmp, "w", encoding="utf-8") as f:
            n = report_html.write(rep, charts, f)
            size = f.tell()
    finally:
        store.close()
    return f"wrote {path}: {len(rep.chains)} chains, {n} processes charted, {size / 1e6:.1f} MB"
